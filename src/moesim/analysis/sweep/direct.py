"""Whole-step analytic decode for sweep groups whose step does not split into (attention zeroed) +
context terms (:func:`.variants.check_separable`): MTP drafts (a verify step of 1 + mtp tokens per
sequence) and next-layer prefetch (prefetch_recall > 0). Each distinct (variant, context) of a group's
rows runs the way ``simulate(mode="analytic")`` runs one configuration: one analytic kernel step and the
prefill, at that context. The rows that share a lowered model (candidate, page-cache slots, context and
lowering key, :meth:`.variants.DecodeVariants.lowering_key`) run in one kernel call and share one prefill
sum; the batch enters those only through its own column and :func:`~moesim.engine.prefill.rate_ttft`."""
from __future__ import annotations

import numpy as np

from .che import sealed_routing
from .kept import kept, routing_key
from .variants import sealed_decode_cols


def _many(grp, j: int, ps: int, context: int, batches: list) -> np.ndarray:
    """Rows (decode tok/s per sequence, prefill tok/s, expert hit rate or NaN, bottleneck index) of
    candidate j at page-cache slots ps and this context, one per batch (all of one lowering key)."""
    from ...engine.decode import run
    from ...engine.glue import seal
    from ...engine.lower.decode_model import lower_model
    from ...engine.lower.machine import lower_machine
    from ...engine.prefill import prefill_seconds, rate_ttft
    m, plan = grp.m, grp.plan
    p = grp.cands[j]
    tps = 1 + grp.mtp

    def lowered() -> tuple:
        dm = lower_model(m, grp.low, p, grp.machine, grp.rt, context, grp.kv, batches[0] * tps, routing=grp.routing)
        dm["page_slots"] = np.full(m.n_layers, ps, dtype=np.int32)
        hw = lower_machine(grp.machine, grp.rt, p, grp.kernel_mix)
        seconds = prefill_seconds(m, dm, hw, grp.routing, grp.rt, grp.prompt)
        # checked once and read-only (engine.glue.seal): the groups that share them skip the glue's checks
        return seal("ms_decode_model_t", dm), seal("ms_machine_t", hw), seconds

    # the lowered model, machine and prefill read neither the cache policy nor the prefetch recall (the routing's
    # recall column): the plan's groups that differ only in those share them, and a later sweep's group that reads
    # the same objects finds them kept for the process (.kept; the routing by its tables' ids, recall included)
    lk = grp.variants.lowering_key(j, batches[0] * tps)
    key = (("direct", j, ps, context, lk)
           + tuple(sorted((a, i) for a, i in grp.ix.items() if a not in ("policies", "prefetch_recall"))))
    dm, hw, seconds = plan.shared(key, lambda: kept(
        ("direct", id(grp.low), grp.kv, id(grp.rt), id(grp.machine), p, lk, ps, context, grp.mtp, grp.kernel_mix,
         grp.prompt, routing_key(plan, grp.routing)), lowered, grp.low, grp.rt, grp.machine, grp.routing))
    n = len(batches)
    # sealed once for the plan's groups that share them (the prefetch recalls of one cache size and policy)
    cols = sealed_decode_cols(plan, grp.routing, dm, grp.policy, tuple(batches), grp.mtp, grp.accepted)
    res = run(dm, hw, sealed_routing(plan, grp.routing), cols)
    out = np.empty((n, 4))
    out[:, 0] = np.asarray(res["accepted"], dtype=np.float64) / np.asarray(res["step_mean"], dtype=np.float64)
    out[:, 1] = [rate_ttft(grp.prompt, seconds, b)[0] for b in batches]
    hit = np.asarray(res["hit_rate"], dtype=np.float64)
    out[:, 2] = np.where(hit < 0, np.nan, hit)
    out[:, 3] = np.argmax(np.asarray(res["by_resource"]), axis=1)
    return out


def evaluate(grp, keys: np.ndarray, context: np.ndarray, batch: np.ndarray, out: dict) -> None:
    """Fill the decode columns ``out`` (views of one group's rows) from the rows' variant keys (the
    memory kernel's choice of candidate and page-cache slots) and contexts."""
    # the distinct (key, context) pairs in first-seen order (a dict: np.unique(axis=0) sorts a structured view,
    # slower than the kernel call on a group's few rows)
    index: dict = {}
    inverse = np.fromiter((index.setdefault(p, len(index)) for p in zip(keys.tolist(), context.tolist())),
                          dtype=np.int64, count=len(keys))
    vals = np.empty((len(index), 4))
    todo: dict = {}
    for u, (key, ctx) in enumerate(index):
        j, ps, bi = grp.decode_key(key)
        b = int(grp.plan.batches[bi])
        todo.setdefault((j, ps, ctx, grp.variants.lowering_key(j, b * (1 + grp.mtp))), []).append((u, b))
    for (j, ps, ctx, _), items in todo.items():
        vals[[u for u, _ in items]] = _many(grp, j, ps, ctx, [b for _, b in items])
    tok = vals[inverse, 0]
    out["decode_tok_s"][:] = tok
    out["aggregate_tok_s"][:] = tok * batch
    out["tpot_ms"][:] = 1e3 / tok
    out["prefill_tok_s"][:] = vals[inverse, 1]
    out["expert_hit_rate"][:] = vals[inverse, 2]
    out["bottleneck"][:] = vals[inverse, 3].astype(np.int32)
