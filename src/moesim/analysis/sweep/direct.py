"""Whole-step analytic decode for sweep groups whose step does not split into (attention zeroed) +
context terms (:func:`.variants.check_separable`): MTP drafts (a verify step of 1 + mtp tokens per
sequence) and next-layer prefetch (prefetch_recall > 0). Each distinct (variant, context) of a group's
rows is lowered and run the way ``simulate(mode="analytic")`` runs one configuration: one analytic
kernel step and the prefill, at that context. Slower than the variant path, and only these groups take it."""
from __future__ import annotations

import numpy as np

from ...engine.codes import MODES


def _one(grp, j: int, ps: int, batch: int, context: int) -> tuple:
    """(decode tok/s per sequence, prefill tok/s, expert hit rate or NaN, bottleneck index) of one
    (candidate j, page-cache slots ps, batch, context) of group grp."""
    from ...engine.decode import run
    from ...engine.lower.decode_model import lower_model
    from ...engine.lower.machine import lower_machine
    from ...engine.prefill import prefill
    m, plan = grp.m, grp.plan
    p = grp.cands[j]
    tps = 1 + grp.mtp
    dm = lower_model(m, grp.low, p, grp.machine, grp.rt, context, grp.kv, batch * tps, routing=grp.routing)
    dm["page_slots"] = np.full(m.n_layers, ps, dtype=np.int32)
    hw = grp.direct_hw.get(j)
    if hw is None:
        hw = grp.direct_hw[j] = lower_machine(grp.machine, grp.rt, p, grp.kernel_mix)
    run_cfg = plan.run
    cols = dict(batch=[batch], tokens_per_step=[tps], drafts=[grp.mtp], accepted=[grp.accepted],
                steps=[run_cfg["tokens"]], warmup=[run_cfg["warmup"]], policy=[grp.policy],
                mode=[MODES["analytic"]], seed=[int(run_cfg["seed"])], index=[0])
    res = run(dm, hw, grp.routing, cols)
    pf, _ = prefill(m, dm, hw, grp.routing, grp.rt, run_cfg["prompt"], batch)
    hit = float(res["hit_rate"][0])
    return (float(res["accepted"][0] / res["step_mean"][0]), float(pf), np.nan if hit < 0 else hit,
            int(np.argmax(res["by_resource"][0])))


def evaluate(grp, keys: np.ndarray, context: np.ndarray, batch: np.ndarray, out: dict) -> None:
    """Fill the decode columns ``out`` (views of one group's rows) from the rows' variant keys (the
    memory kernel's choice of candidate and page-cache slots) and contexts."""
    pairs = np.stack([keys.astype(np.int64), context.astype(np.int64)], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    vals = np.empty((len(uniq), 4))
    for u, (key, ctx) in enumerate(uniq.tolist()):
        j, ps, bi = grp.decode_key(key)
        vals[u] = _one(grp, j, ps, int(grp.plan.batches[bi]), int(ctx))
    tok = vals[inverse, 0]
    out["decode_tok_s"][:] = tok
    out["aggregate_tok_s"][:] = tok * batch
    out["tpot_ms"][:] = 1e3 / tok
    out["prefill_tok_s"][:] = vals[inverse, 1]
    out["expert_hit_rate"][:] = vals[inverse, 2]
    out["bottleneck"][:] = vals[inverse, 3].astype(np.int32)
