"""The step-cost table the serving scheduler interpolates (csrc/ms_serve.c), filled from the existing
step-cost model: the analytic decode kernel (``engine.decode.run``, mode analytic) and the prefill model
(``engine.prefill``).

Approximation (docs/cost-model.md, "Serving under load"):

- a decode step of b sequences at mean context c costs what the analytic kernel gives for batch b at
  context c (attention reads grow linearly in context, so b sequences at their own contexts read what
  b at the mean would, exactly for full attention, approximately for sliding / compressed layers);
- the prompt tokens of a step (chunks of one or more requests) cost one prefill forward of that many
  tokens at their token-weighted mean depth (``engine.prefill(prompt=p, depth=d)``);
- a step with both pays the two less one shared forward's fixed cost (weights read, launches: the
  one-token forward), since decode and prefill tokens ride the same forward;
- between grid points the table is interpolated bilinearly. The grids contain the workload's own
  points (the prompt, its chunks, the contexts at the ends of decode), so at concurrency 1 the
  scheduler reproduces ``simulate(mode="analytic")``: TTFT = prefill of the prompt, TPOT = decode at
  the mean context.
"""
from __future__ import annotations

import numpy as np

from ..engine.codes import MODES, POLICIES
from ..engine.decode import run
from ..engine.lower.decode_model import lower_model
from ..engine.lower.machine import lower_machine
from ..engine.prefill import prefill
from ..spec import quants as Q


def batch_grid(max_batch: int) -> list:
    """Decode batch sizes 1 .. max_batch: every size to 8, then about a third apart (interpolated)."""
    grid, b = [], 1
    while b < max_batch:
        grid.append(b)
        b = b + 1 if b < 8 else int(b * 4 // 3)
    return grid + [max_batch]


def token_grid(budget: int, points=()) -> list:
    """Prompt tokens per step: powers of two to the budget, plus the workload's own chunk sizes."""
    grid = {budget, *[p for p in points if 1 <= p <= budget]}
    p = 1
    while p < budget:
        grid.add(p)
        p *= 2
    return sorted(grid)


def depth_grid(isl: int, osl: int, budget: int, prefix: int) -> list:
    """Depths a prompt chunk starts at: 0, each chunk boundary of the prompt, the prefix, the longest
    recomputation (prompt + output) and points between."""
    grid = {0, isl, isl + osl, prefix, *range(budget, isl, budget)}
    grid.update(int(x) for x in np.linspace(0, isl + osl, 9))
    return sorted(g for g in grid if 0 <= g <= isl + osl)


def context_grid(isl: int, osl: int, points: int) -> list:
    """Mean decode contexts: a decode token sits at depth isl + 1 .. isl + osl - 1 (plus one for its own)."""
    lo, hi = isl + 1, max(isl + 1, isl + osl - 1)
    return sorted({int(round(x)) for x in np.linspace(lo, hi, max(2, points))}) if hi > lo else [lo]


def step_table(m, c, machine, isl: int, osl: int, budget: int, max_batch: int, rtab: dict, skip: int,
               context_points: int) -> dict:
    """The table for ``engine.serve.run``: decode seconds over (batch, mean context), prefill seconds over
    (prompt tokens, mean depth), and the shared forward cost. *c* is a ``resolve.Configured``; *skip* the
    prompt tokens a prefix-cache hit skips."""
    rt, p = c.runtime, c.placement
    hw = lower_machine(machine, rt, p, Q.kernel_mix(m, c.quant))
    gb, gc = batch_grid(max_batch), context_grid(isl, osl, context_points)
    decode_s = np.empty((len(gb), len(gc)))
    for j, ctx in enumerate(gc):
        for i, b in enumerate(gb):
            dm = lower_model(m, c.low, p, machine, rt, ctx, c.kv, b, c.mem.by_class, c.mem.tier)
            cols = dict(batch=[b], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[1], warmup=[0],
                        policy=[POLICIES["lru"]], mode=[MODES["analytic"]], seed=[0], index=[0])
            decode_s[i, j] = float(run(dm, hw, rtab, cols)["step_mean"][0])
    chunks = [isl % budget, isl - skip, (isl - skip) % budget, min(isl + osl, budget)]
    gp, gd = token_grid(budget, chunks), depth_grid(isl, osl, budget, skip)
    dm = lower_model(m, c.low, p, machine, rt, isl, c.kv, 1, c.mem.by_class, c.mem.tier)
    prefill_s = np.array([[prefill(m, dm, hw, rtab, rt, n, 1, depth=d)[1] for d in gd] for n in gp])
    return dict(grid_b=np.asarray(gb, float), grid_c=np.asarray(gc, float), decode_s=decode_s,
                grid_p=np.asarray(gp, float), grid_d=np.asarray(gd, float), prefill_s=prefill_s,
                forward_s=float(prefill_s[0, 0]))
