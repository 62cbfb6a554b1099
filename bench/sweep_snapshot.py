"""Save or compare sweep output tables for a few grids (issue 19: speed work must keep outputs identical).

    python bench/sweep_snapshot.py save DIR        # before a change
    python bench/sweep_snapshot.py compare DIR     # after: same rows, max relative difference <= 1e-12

Grids: rank's (one 4090 + 64 GB), the website grid of bench_grids.py, an experts-cpu / n-cpu-moe grid with
batches 1..64, a multi-GPU (h200 x 8, vllm) grid, and bench_grids.py's offload-research and
datacenter grids (cache sizes x policies x prefetch recall; parallel layouts x MTP), and bench_grids.py's
issue-19 grid at three contexts (models paged from NVMe through host page caches, with and without windowed
routing; n-cpu-moe layouts). Tables are stored as .npz, one array per column.
"""
from __future__ import annotations

import os
import sys

import numpy as np

import moesim
from moesim.spec import models as M

sys.path.insert(0, os.path.dirname(__file__))
from bench_grids import grids as web_grids  # noqa: E402

COMMON = dict(filter={"skip_inapplicable": True, "allow_beyond_max_context": True}, progress=False)


def grids() -> dict:
    ids = M.model_ids()
    return {
        "website": web_grids()["website"],
        "one_machine": web_grids()["one machine"],
        "offload_research": web_grids()["offload research"],
        "datacenter": web_grids()["datacenter"],
        "offload": dict(models=ids[:12], quants=["Q4_K_M"], placements=["experts-cpu", "n-cpu-moe=8"],
                        machines=[dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)],
                        contexts=[4096, 32768], batches=[1, 2, 4, 8, 16, 32, 64], **COMMON),
        "issue19": dict(web_grids()["issue 19"], contexts=[1024, 65536, 262144]),
        "multi_gpu": dict(models=ids[:12], quants=["Q4_K_M", "Q8_0"], runtimes=["vllm"],
                          machines=[dict(gpu="h200", gpus=8)], contexts=[8192], batches=[1, 16], **COMMON),
    }


def table(kw: dict) -> dict:
    cols = moesim.sweep(**kw).columns
    return {k: np.asarray(v) for k, v in cols.items()}


def compare(a: dict, b: dict) -> list:
    bad = []
    if sorted(a) != sorted(b):
        return [f"columns differ: {sorted(set(a) ^ set(b))}"]
    for k in a:
        x, y = a[k], b[k]
        if x.shape != y.shape:
            bad.append(f"{k}: rows {x.shape} vs {y.shape}")
        elif x.dtype.kind in "fc":
            d = np.abs(x - y) / np.maximum(np.abs(x), 1e-300)
            d = d[~(np.isnan(x) & np.isnan(y))]
            if d.size and np.nanmax(d) > 1e-12:
                bad.append(f"{k}: max rel diff {np.nanmax(d):.3g}")
        elif not np.array_equal(x, y):
            bad.append(f"{k}: values differ")
    return bad


def main() -> int:
    mode, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    failed = 0
    for name, kw in grids().items():
        try:
            t = table(kw)
        except moesim.MoesimError as e:
            print(f"{name}: skipped ({e})")
            continue
        path = os.path.join(out, name + ".npz")
        if mode == "save":
            np.savez(path, **t)
            print(f"{name}: saved {len(next(iter(t.values())))} rows")
        else:
            bad = compare(dict(np.load(path, allow_pickle=True)), t)
            failed += bool(bad)
            print(f"{name}: {'OK' if not bad else '; '.join(bad)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
