"""Regenerate the data files shipped in ``src/moesim/data/`` (run from the repository root):

    PYTHONPATH=src python tools/make_package_data.py [--validation ../shared/validation/calibration.csv]

* ``measurements.csv``: the rows of the validation corpus, its columns unchanged, plus ``source_url``
  (the first web address the ``source`` column names, with https://) and ``date`` (a date the source or
  the notes state: YYYY-MM-DD, or YYYY-MM from "May 2024"; empty where they state none); then the rows of
  the project's own collection, ``measurements_collected.csv`` (the same columns, its ``source_url`` and
  ``date`` given on every row), unchanged.
* ``sample_trace_gpt-oss-20b.jsonl``: a routing trace drawn by moesim's own sampler from the catalog's
  ``gpt-oss`` routing profile (itself fitted to a public gpt-oss-20b trace; see catalog/routing.toml), in
  the vLLM route-log JSONL format :mod:`moesim.traces` reads. No recorded trace is copied.

tests/test_packaging.py re-derives both and checks the shipped files equal them.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "moesim" / "data"
COLLECTED = DATA / "measurements_collected.csv"     # project-owned rows, kept in the repository
# ../shared next to the checkout, or next to the folder of worktrees the checkout sits in
VALIDATION_CANDIDATES = [p / "shared" / "validation" / "calibration.csv" for p in (ROOT.parent, ROOT.parent.parent)]
DEFAULT_VALIDATION = next((p for p in VALIDATION_CANDIDATES if p.exists()), VALIDATION_CANDIDATES[0])

SAMPLE = {"model": "gpt-oss-20b", "profile": "gpt-oss", "requests": 3, "tokens": 32, "seed": 0}

# Hosts end in a real top-level domain; "llama.cpp" or "ik_llama.cpp" in a source is a project name.
_TLDS = ("com", "org", "net", "ai", "io", "dev", "co", "name", "cn", "to", "eu", "de", "uk", "me", "app")
_URL = re.compile(r"(?<![\w/.-])((?:[a-z0-9-]+\.)+(?:" + "|".join(_TLDS) + r"))(/[^\s()]*)?(?=[\s(),;]|$)", re.I)
_ISO_DATE = re.compile(r"\b(20[12]\d)[-/](0[1-9]|1[0-2])[-/](0[1-9]|[12]\d|3[01])\b")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_YEAR = re.compile(r"\b(" + "|".join(_MONTHS) + r")[a-z]*\.? (20[12]\d)\b", re.I)


def source_url(source: str) -> str:
    m = _URL.search(source or "")
    return f"https://{m.group(1)}{(m.group(2) or '').rstrip('.,;:')}" if m else ""


def stated_date(source: str, notes: str) -> str:
    for text in (source or "", notes or ""):
        m = _ISO_DATE.search(text)
        if m:
            return "-".join(m.groups())
    m = _MONTH_YEAR.search(notes or "")
    if m:
        return f"{m.group(2)}-{_MONTHS.index(m.group(1)[:3].lower()) + 1:02d}"
    return ""


def collected_rows(collected_csv=COLLECTED) -> list:
    """The project's own rows (empty when the file is absent); their columns must be the corpus's."""
    if not Path(collected_csv).exists():
        return []
    with open(collected_csv, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def measurements_text(validation_csv, collected_csv=COLLECTED) -> str:
    with open(validation_csv, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        columns = list(reader.fieldnames) + ["source_url", "date"]
        rows = [dict(r, source_url=source_url(r["source"]), date=stated_date(r["source"], r["notes"])) for r in reader]
    extra = collected_rows(collected_csv)
    if extra and list(extra[0]) != columns:
        raise SystemExit(f"{collected_csv}: columns differ from the corpus's {columns}")
    clash = {r["id"] for r in rows} & {r["id"] for r in extra}
    if clash:
        raise SystemExit(f"{collected_csv}: ids already in the corpus: {', '.join(sorted(clash))}")
    rows += extra
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def sample_trace_text() -> str:
    from moesim import model
    from moesim.engine.lower.routing import RoutingDims
    from moesim.engine.routing import sample_requests
    from moesim.spec.routing import profile
    m = model(SAMPLE["model"])
    dims = RoutingDims.of(m)
    reqs = sample_requests(dims, profile(SAMPLE["profile"]), SAMPLE["requests"], SAMPLE["tokens"], SAMPLE["seed"])
    meta = {"type": "meta", "model": m.id, "num_experts": dims.n_experts, "top_k": dims.top_k,
            "num_layers": dims.n_layers, "synthetic": True,
            "note": (f"drawn by moesim.engine.routing.sample_requests from the catalog routing profile "
                     f"'{SAMPLE['profile']}' (fitted to a public gpt-oss-20b trace; catalog/routing.toml), "
                     f"{SAMPLE['requests']} requests x {SAMPLE['tokens']} decode tokens, seed {SAMPLE['seed']}; "
                     "regenerate with tools/make_package_data.py; not a recording")}
    lines = [json.dumps(meta, sort_keys=True)]
    for r, arr in enumerate(reqs):
        for t in range(arr.shape[0]):
            for layer in range(arr.shape[1]):
                lines.append(json.dumps({"type": "route", "req_id": r, "token_idx": t, "layer": layer,
                                         "topk_ids": [int(x) for x in arr[t, layer]]}, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--validation", default=str(DEFAULT_VALIDATION), help="the validation corpus CSV")
    args = ap.parse_args(argv)
    (DATA / "measurements.csv").write_text(measurements_text(args.validation), encoding="utf-8")
    (DATA / "sample_trace_gpt-oss-20b.jsonl").write_text(sample_trace_text(), encoding="utf-8")
    print(f"written: {DATA / 'measurements.csv'}, {DATA / 'sample_trace_gpt-oss-20b.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
