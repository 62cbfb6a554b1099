"""A pooled routing profile's spread across its workloads, carried into a sweep's intervals (issue 15), as
``simulate`` carries it into one configuration's (analysis.simulate.widened_for_workloads): per row, each
workload's analytic decode and prefill tok/s over the pooled profile's, the run otherwise the same, and each
interval bound moved out by its side's extreme ratio (analysis.intervals.widen_columns).

A group whose routing pools workloads (today gpt-oss:pooled, the gpt-oss family default) gets one *shadow* per
workload: the same group with that workload's routing tables and analytic decode variants of its own. The rows'
variant keys (the memory kernel's choice of placement candidate and page-cache slots) do not read the routing, so
the shadows evaluate the very keys the group's rows hold. A Monte Carlo sweep's base is an analytic shadow of the
pooled profile, as simulate's is."""
from __future__ import annotations

import copy

import numpy as np

from ...engine import _kernel
from ...engine.glue import handle_library_error
from ..intervals import METRICS
from ..simulate import pooled_profile
from .table import decode_columns


def workload_ids(grp) -> tuple:
    """The workloads the group's routing profile pools (empty: no widening)."""
    routing = grp.opts["routing"]
    prof = pooled_profile(grp.m, None if routing in (None, "auto") else routing)
    return () if prof is None else prof.workloads


def _shadow(grp, routing: "str | None"):
    """The group under routing profile ``routing`` (None: its own tables) with analytic decode variants of its own."""
    from .variants import DecodeVariants
    sh = copy.copy(grp)
    sh.workload_shadows = None
    if routing is not None:
        sh.routing, sh.prefetch = grp.routing_tables(routing)
    sh.direct = sh.mtp > 0 or sh.prefetch
    sh.variants = DecodeVariants(sh, analytic=True)
    return sh


def shadows(grp) -> tuple:
    """(the pooled base or None where the group's own run is analytic, the workloads' shadows), built once a group."""
    if grp.workload_shadows is None:
        ids = grp.plan.shared(("workloads", grp.ix["models"], grp.opts["routing"]), lambda: workload_ids(grp))
        base = _shadow(grp, None) if ids and grp.plan.mode == "montecarlo" else None
        grp.workload_shadows = (base, tuple(_shadow(grp, w) for w in ids))
    return grp.workload_shadows


def _speeds(sh, keys: np.ndarray, ctx: np.ndarray, bat: np.ndarray, threads: int) -> tuple:
    """(decode tok/s per sequence, prefill tok/s) of these rows on shadow ``sh``, analytic."""
    n = len(keys)
    out = {k: np.empty(n, dtype=np.int32 if k == "bottleneck" else np.float64) for k in decode_columns("analytic")}
    if sh.direct:
        from .direct import evaluate
        evaluate(sh, keys, ctx, bat, out)
    else:
        var = np.empty(n, dtype=np.int32)
        table = sh.resolve_variants(keys, var)
        code, bad = _kernel.sweep_analytic(table.dec, ctx, bat, var, threads, out, 0)
        handle_library_error(code, "ms_sweep_analytic (routing workload)", max(bad, 0))
    return out["decode_tok_s"], out["prefill_tok_s"]


def workload_ratios(grp, cols: dict, keys: np.ndarray, s0: int, s1: int, threads: int) -> "dict | None":
    """{metric: (min ratios, max ratios)} over the group's rows [s0, s1) of ``cols`` (its decode columns filled
    already): each workload's analytic tok/s over the pooled profile's, for analysis.intervals.widen_columns once
    the chunk's intervals are filled; None where the group's routing profile pools no workloads."""
    base, ws = shadows(grp)
    if not ws:
        return None
    keys, ctx, bat = keys[s0:s1], cols["context"][s0:s1], cols["batch"][s0:s1]
    points = (_speeds(base, keys, ctx, bat, threads) if base is not None
              else (cols["decode_tok_s"][s0:s1], cols["prefill_tok_s"][s0:s1]))
    speeds = [_speeds(sh, keys, ctx, bat, threads) for sh in ws]
    ratios = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, metric in enumerate(METRICS):
            # a speed that is not a positive number takes no part (simulate's): a ratio of 1 moves no bound
            r = np.stack([np.where((s[k] > 0) & (points[k] > 0) & np.isfinite(s[k]) & np.isfinite(points[k]),
                                   s[k] / points[k], 1.0) for s in speeds])
            ratios[metric] = (r.min(axis=0), r.max(axis=0))
    return ratios
