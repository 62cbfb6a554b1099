"""Routing statistics of a trace, and fitting a routing profile to it (``moesim routing``)."""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np

from ..errors import MoesimError
from ..engine.lower.routing import RoutingDims
from ..spec.routing import RoutingProfile, _check
from ..engine.routing import cache_hit_rates, reuse, sample_requests


def trace_stats(requests, n_experts: int, top_k: int) -> dict:
    """The statistics a profile is fitted to: reuse R and mean per-layer LRU hit rate at C = 2k, 3k."""
    return {"reuse": reuse(requests),
            "lru_2k": float(np.mean(cache_hit_rates(requests, n_experts, 2 * top_k))),
            "lru_3k": float(np.mean(cache_hit_rates(requests, n_experts, min(n_experts, 3 * top_k))))}


FIT_GRID = dict(zipf_s=(0.2, 0.4, 0.6, 0.8), concentration=(0.5, 1.0, 2.0, 4.0, 8.0),
                stickiness=(0.0, 0.1, 0.2, 0.3, 0.4))
_FIT_KEYS = ("zipf_s", "concentration", "stickiness")


def fit_profile(trace, n_requests: int = 24, seed: int = 0, grid=None, refine: int = 2) -> tuple:
    """Grid-search (s, concentration, stickiness) so sampled requests match the trace's reuse and
    LRU hit rates at 2k and 3k, then ``refine`` rounds of bisection around the best point (each
    round tries the midpoints between the best value and its neighbours on every axis). Every
    candidate is sampled with the same ``seed`` (common random numbers), ``n_requests`` requests
    of the trace's median request length (clipped to 64..512 tokens) over min(layers, 8) layers.
    Returns (profile, model stats, trace stats, squared error)."""
    E, k = trace.n_experts, trace.top_k
    target = trace_stats(trace.requests, E, k)
    lengths = [len(r) for r in trace.requests]
    tokens = int(np.clip(np.median(lengths), 64, 512))
    L = min(len(trace.layers), 8)
    dims = RoutingDims(L, E, k)
    grid = {**FIT_GRID, **(grid or {})}
    axes = {key: sorted({float(v) for v in grid[key]}) for key in _FIT_KEYS}
    if any(not a for a in axes.values()):
        raise MoesimError(f"fit grid needs values for each of {', '.join(_FIT_KEYS)}", "grid")
    seen = {}

    def evaluate(point):
        if point not in seen:
            s, beta, p = point
            prof = RoutingProfile(id="fit", zipf_s=s, jitter=0.2, concentration=beta, stickiness=p,
                                  first_stickiness=p, last_stickiness=p, request_tokens=tokens, recall=0.8,
                                  source="fit")
            _check(prof)
            st = trace_stats(sample_requests(dims, prof, n_requests, tokens, seed), E, k)
            seen[point] = (prof, st, target, sum((st[key] - target[key]) ** 2 for key in target))
        return seen[point]

    def search(candidates):
        for point in candidates:
            evaluate(point)
        return min(seen.values(), key=lambda b: (b[3], [getattr(b[0], key) for key in _FIT_KEYS]))

    best = search(itertools.product(*(axes[key] for key in _FIT_KEYS)))
    for _ in range(max(0, int(refine))):
        local = []
        for key in _FIT_KEYS:
            a, v = axes[key], getattr(best[0], key)
            i = a.index(v)
            mids = [round(0.5 * (v + a[j]), 6) for j in (i - 1, i + 1) if 0 <= j < len(a)]
            axes[key] = sorted(set(a) | set(mids))
            local.append([v] + mids)
        best = search(itertools.product(*local))
    return best


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moesim.routing", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit a routing profile to a recorded trace")
    f.add_argument("trace")
    f.add_argument("--requests", type=int, default=24)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--refine", type=int, default=2, help="bisection rounds after the grid (default 2)")
    args = ap.parse_args(argv)
    from ..ingest import traces
    try:
        tr = traces.load(args.trace)
        prof, st, target, err = fit_profile(tr, args.requests, args.seed, refine=args.refine)
    except MoesimError as exc:
        print(f"moesim: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"profile": {k: getattr(prof, k) for k in ("zipf_s", "concentration", "stickiness",
                                                                  "request_tokens")},
                      "model": st, "trace": target, "squared_error": err}, indent=2))
    return 0

