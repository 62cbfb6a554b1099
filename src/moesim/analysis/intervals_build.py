"""Rebuild catalog/calibration.toml ``[intervals]`` from a held-out corpus (``python -m
moesim.analysis.intervals_build``): each row predicted with the shipped calibration, its regime and
source group, turned into the quantile table by :mod:`.intervals`. It sits above validate and calibrate
so that intervals, which simulate and fit import, depends on neither."""
from __future__ import annotations

import argparse
import json

from ..ingest.packaged import collected_measurements_csv
from . import intervals as I
from . import validate as V
from .calibrate import source_group


def held_out_rows(path) -> list:
    """Rows for :func:`report` from a corpus the shipped calibration never saw (the collected
    measurements): each A/B row predicted with calibration.toml, its regime and source group."""
    rows = [r for r in V.load_rows(path) if r["quality"] in ("A", "B")]
    prepared, records, _ = V.evaluate_rows(rows, calibrated=True)
    out = []
    for pr, rec in zip(prepared, records):
        r = {"id": rec["id"], "group": source_group(pr.cfg.row["source"]),
             "regime": I.regime(pr.cfg.machine, pr.p, pr.rt)}
        for metric in I.METRICS:
            if rec[f"{metric}_err"] is not None:
                r[f"{metric}_err"] = rec[f"{metric}_err"]
        out.append(r)
    return out


def replace_toml_section(text: str, lines: list) -> str:
    """calibration.toml *text* with its [intervals] tables (and their comment) replaced by *lines*."""
    keep, skipping = [], False
    for line in text.splitlines():
        if line.startswith("# 80 % prediction intervals") or line.startswith("[intervals"):
            skipping = True
        elif skipping and line.startswith("[") and not line.startswith("[intervals"):
            skipping = False
        if not skipping:
            keep.append(line)
    while keep and not keep[-1].strip():
        keep.pop()
    return "\n".join(keep + lines) + "\n"


def main(argv=None) -> int:
    """``python -m moesim.analysis.intervals_build [CSV] [--out TOML] [--rows JSON]``: rebuild [intervals]."""
    ap = argparse.ArgumentParser(prog="python -m moesim.analysis.intervals_build", description=main.__doc__)
    ap.add_argument("csv", nargs="?", help="held-out corpus (default: the packaged collected measurements)")
    ap.add_argument("--out", help="calibration.toml to rewrite the [intervals] of")
    ap.add_argument("--rows", help="also write the held-out rows (JSON) here")
    a = ap.parse_args(argv)
    csv_path = a.csv or collected_measurements_csv()
    rep = I.report(held_out_rows(csv_path))
    command = ("python -m moesim.analysis.intervals_build --out src/moesim/catalog/calibration.toml "
               "--rows tests/data/loso_residuals.json")
    if a.out:
        with open(a.out, encoding="utf-8") as fh:
            text = fh.read()
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(replace_toml_section(text, I.toml_lines(rep, command)))
    if a.rows:
        with open(a.rows, "w", encoding="utf-8") as fh:
            json.dump({"command": command, "rows": rep["rows"]}, fh, indent=1)
    print(json.dumps({k: rep[k] for k in ("coverage", "coverage_nested")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
