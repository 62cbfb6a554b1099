"""The analytic path's window tables (engine/lower/routing_window.py): CPU seconds per memory profile,
split into the sampler (ms_route_sample) and the counting (ms_window_count), with its share.

    python bench/bench_window.py [--profiles gpt-oss:pooled,deepseek-v2:v2,olmoe:v2]

Each profile is lowered at the shape of the catalog model its family names (first model of the family).
"""
from __future__ import annotations

import argparse
import time

from moesim.engine import _kernel
from moesim.engine.lower import routing as LRT
from moesim.engine.lower import routing_window as W
from moesim.spec import routing as R

SHAPES = {"gpt-oss:pooled": (24, 32, 4), "deepseek-v2:v2": (26, 64, 6), "olmoe:v2": (16, 64, 8)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default=",".join(SHAPES))
    args = ap.parse_args()
    for pid in args.profiles.split(","):
        rt = LRT._lower_cached(LRT.RoutingDims(*SHAPES[pid]), R.profile(pid), 0, False, 8)
        cols = dict(batch=[1], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[W.WINDOW_TOKENS],
                    warmup=[0], policy=[0], mode=[0], seed=[0], index=[W.WINDOW_INDEX])
        t0 = time.process_time()
        _, picks = _kernel.route_sample(rt, cols)
        t1 = time.process_time()
        _kernel.window_count(picks[:, 0, 0], rt["n_experts"], W.WINDOW_NODES)
        t2 = time.process_time()
        W.window_tables(rt, 0)
        t3 = time.process_time()
        print(f"{pid:16s} tables {t3 - t2:.3f} CPU s ({W.WINDOW_STREAMS} streams); per stream: sampler "
              f"{t1 - t0:.3f} s, counting {t2 - t1:.4f} s")


if __name__ == "__main__":
    main()
