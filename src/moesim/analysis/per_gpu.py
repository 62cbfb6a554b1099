"""Memory per GPU of a multi-GPU layout: the memory kernel's GPU-tier bytes of each class (each tensor counted
once over the GPUs) divided by the ways the layout splits it, the split rule of
:func:`moesim.engine.lower.memory.memory_split_ways` (the kernel's fit criterion: ms_mem_config_t.gpu_ways).
Split tensors cost a share on each GPU, replicated ones (the router, attention under attention DP, MLA's
latent KV under TP) their whole size on every GPU; the total is the kernel's ``gpu_per_gpu``.
"""
from __future__ import annotations

from ..engine.lower.memory import CLASSES, TIERS, memory_split_ways


def gpu_bytes_per_gpu(m, rt, n_gpus: int, by_class) -> dict:
    """{total, by_class, split_ways}: bytes one GPU holds under the runtime's layout, from the memory
    kernel's [class, tier] bytes (GPU tier), in the kernel's class order (the same sum as ms_gpu_one)."""
    ways = memory_split_ways(m, rt, n_gpus)
    g = TIERS.index("gpu")
    per = {c: float(by_class[i][g]) / ways[c] for i, c in enumerate(CLASSES)}
    total = 0.0
    for c in CLASSES:
        total += per[c]
    return {"total": total, "by_class": per, "split_ways": ways}
