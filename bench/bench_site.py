"""`moesim export-site` at the website grid's size, as the whole process a site build runs.

    python bench/bench_site.py                    # default processes, then --processes 1; 2 runs each
    python bench/bench_site.py --runs 3 --processes 1 --processes 2

The spec is bench_grids.py's website grid as a site: every catalog model x Q4_K_M, Q8_0 x its 59 machines (49
discrete GPUs with 128 GB of DDR5-6000 x2, 10 unified-memory chips) x 4 contexts x 3 batches, automatic placement,
configurations that fit. Each run is `python -m moesim export-site SPEC --out DIR` in a fresh process (start-up and
import included) into a new temporary folder, using the user's lowering cache (a first run fills it: run twice and
read the later runs). Prints the command's own summary line and the wall seconds of each run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grids import website_machines  # noqa: E402

from moesim.spec import models as M  # noqa: E402


def site_spec() -> str:
    """The website grid as a site spec (TOML)."""
    machines = ", ".join("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in m.items()) + "}"
                         for m in website_machines())
    return "\n".join([
        "[site]", 'title = "moesim website grid (bench/bench_site.py)"', "[axes]",
        "models = " + json.dumps(M.model_ids()), 'quants = ["Q4_K_M", "Q8_0"]', f"machines = [{machines}]",
        "contexts = [4096, 16384, 32768, 131072]", "batches = [1, 4, 16]", 'placements = ["auto"]',
        "[filter]", "fits = true", "skip_inapplicable = true", "allow_beyond_max_context = true",
        "[run]", 'mode = "analytic"', ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--processes", type=int, action="append",
                    help="export-site --processes (repeatable; default: the command's own default, then 1)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "website.toml"
        spec.write_text(site_spec(), encoding="utf-8")
        for procs in args.processes or [None, 1]:
            for run in range(args.runs):
                out = Path(tmp) / f"site-{procs}-{run}"
                cmd = [sys.executable, "-m", "moesim", "export-site", str(spec), "--out", str(out)]
                cmd += [] if procs is None else ["--processes", str(procs)]
                t0 = time.perf_counter()
                res = subprocess.run(cmd, capture_output=True, text=True, check=True)
                wall = time.perf_counter() - t0
                line = next(x for x in res.stdout.splitlines() if x.startswith("site:"))
                print(f"processes {procs or 'default'}: {wall:6.1f} s whole process | {line}", flush=True)


if __name__ == "__main__":
    main()
