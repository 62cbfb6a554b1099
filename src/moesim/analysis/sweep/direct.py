"""Whole-step analytic decode for sweep groups whose step does not split into (attention zeroed) +
context terms (:func:`.variants.check_separable`): MTP drafts (a verify step of 1 + mtp tokens per
sequence) and next-layer prefetch (prefetch_recall > 0). Each distinct (variant, context) of a group's
rows runs the way ``simulate(mode="analytic")`` runs one configuration: one analytic kernel step and the
prefill, at that context. The rows that share a lowered model (candidate, page-cache slots, context and
lowering key, :meth:`.variants.DecodeVariants.lowering_key`) are one job and share one prefill sum; the batch
enters those only through its own column and :func:`~moesim.engine.prefill.rate_ttft`. A group's jobs run in
one kernel call."""
from __future__ import annotations

import numpy as np

from .kept import kept, routing_key
from .variants import _prepared_routing, sealed_decode_cols


def _unit(grp, j: int, ps: int, context: int, lk: tuple, batches: tuple) -> tuple:
    """(prepared decode job, prefill seconds of one prompt) of candidate j at page-cache slots ps and this
    context, at these batches (all of lowering key lk): engine.decode.run_prepared's (model, machine, columns)."""
    from ...engine.decode import prepare
    from ...engine.glue import seal
    from ...engine.lower.decode_model import lower_model
    from ...engine.lower.machine import lower_machine
    from ...engine.prefill import prefill_seconds
    m, plan = grp.m, grp.plan
    p = grp.cands[j]
    tps = 1 + grp.mtp

    def lowered() -> tuple:
        dm = lower_model(m, grp.low, p, grp.machine, grp.rt, context, grp.kv, batches[0] * tps, routing=grp.routing)
        dm["page_slots"] = np.full(m.n_layers, ps, dtype=np.int32)
        hw = lower_machine(grp.machine, grp.rt, p, grp.kernel_mix)
        seconds = prefill_seconds(m, dm, hw, grp.routing, grp.rt, grp.prompt)
        # checked once and read-only (engine.glue.seal) and filled into the kernel's structs once (prepare): the
        # groups that share them skip the glue's checks and the filling
        dm, hw = seal("ms_decode_model_t", dm), seal("ms_machine_t", hw)
        return dm, prepare(dm=dm), prepare(hw=hw), seconds

    # the lowered model, machine and prefill read neither the cache policy nor the prefetch recall (the routing's
    # recall column): the plan's groups that differ only in those share them, and a later sweep's group that reads
    # the same objects finds them kept for the process (.kept; the routing by its tables' ids, recall included)
    key = (("direct", j, ps, context, lk, id(grp.routing))     # the routing: a workload's shadow (.workloads) too
           + tuple(sorted((a, i) for a, i in grp.ix.items() if a not in ("policies", "prefetch_recall"))))
    dm, pdm, phw, seconds = plan.shared(key, lambda: kept(
        ("direct", id(grp.low), grp.kv, id(grp.rt), id(grp.machine), p, lk, ps, context, grp.mtp, grp.kernel_mix,
         grp.prompt, routing_key(plan, grp.routing)), lowered, grp.low, grp.rt, grp.machine, grp.routing))
    # sealed once for the plan's groups that share them (the prefetch recalls of one cache size and policy), and
    # filled into the kernel's structs once for the process's sweeps that seal the same columns
    cols = sealed_decode_cols(plan, grp.routing, dm, grp.policy, batches, grp.mtp, grp.accepted)
    return (pdm, phw, kept(("prepared_cols", id(cols)), lambda: prepare(cols=cols), cols)), seconds


def evaluate(grp, keys: np.ndarray, context: np.ndarray, batch: np.ndarray, out: dict) -> None:
    """Fill the decode columns ``out`` (views of one group's rows) from the rows' variant keys (the memory
    kernel's choice of candidate and page-cache slots) and contexts: every distinct (candidate, page-cache
    slots, context, lowering key) of the rows is one job of one kernel call (engine.decode.run_prepared)."""
    from ...engine.decode import run_prepared
    from ...engine.prefill import rate_ttft
    # the distinct (key, context) pairs in first-seen order (a dict: np.unique(axis=0) sorts a structured view,
    # slower than the kernel call on a group's few rows)
    index: dict = {}
    inverse = np.fromiter((index.setdefault(p, len(index)) for p in zip(keys.tolist(), context.tolist())),
                          dtype=np.int64, count=len(keys))
    todo: dict = {}
    batches = grp.plan.batches
    for u, (key, ctx) in enumerate(index):
        j, ps, bi = grp.decode_key(key)
        b = int(batches[bi])
        todo.setdefault((j, ps, ctx, grp.variants.lowering_key(j, b * (1 + grp.mtp))), []).append((u, b))
    jobs, order, seconds, row_batch = [], [], [], []
    for (j, ps, ctx, lk), items in todo.items():
        bs = tuple(b for _, b in items)
        job, sec = _unit(grp, j, ps, ctx, lk, bs)
        jobs.append(job)
        order += [u for u, _ in items]
        seconds += [sec] * len(bs)
        row_batch += bs
    # ms_sweep_variant_t's layout, a row per configuration in job order: step_mean, by_resource (8), accepted, 0,
    # hit_rate, 0
    rows = run_prepared(_prepared_routing(grp.plan, grp.routing), jobs)
    at = np.array(order, dtype=np.int64)
    b = np.array(row_batch, dtype=np.int64)
    vals = np.empty((len(index), 4))
    vals[at, 0] = rows[:, 9] / rows[:, 0]
    vals[at, 1] = rate_ttft(grp.prompt, np.array(seconds, dtype=np.float64), b)[0]
    vals[at, 2] = np.where(rows[:, 11] < 0, np.nan, rows[:, 11])
    vals[at, 3] = np.argmax(rows[:, 1:9], axis=1)
    tok = vals[inverse, 0]
    out["decode_tok_s"][:] = tok
    out["aggregate_tok_s"][:] = tok * batch
    out["tpot_ms"][:] = 1e3 / tok
    out["prefill_tok_s"][:] = vals[inverse, 1]
    out["expert_hit_rate"][:] = vals[inverse, 2]
    out["bottleneck"][:] = vals[inverse, 3].astype(np.int32)
