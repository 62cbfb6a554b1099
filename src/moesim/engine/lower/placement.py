"""The automatic-placement rule lowered for the kernel: the candidate placements a runtime's own fitting
chooses among, in its order of preference, and the rule code (``SWEEP_*``) the C ``choose()`` applies.

llama.cpp ``--fit``: everything on the GPU if it fits, else the fewest layers' routed experts in host
RAM (``--n-cpu-moe``), else fewer whole layers on the GPU, then CPU only; ktransformers: as many
experts per layer on the GPU as fit; served runtimes: all on the GPU or nothing.
"""
from __future__ import annotations

from ...spec.hardware import Machine
from ...spec.placement import Placement, parse as parse_placement
from ..codes import SWEEP_AUTO_KT, SWEEP_AUTO_LLAMA, SWEEP_FIXED


def placement_candidates(m, mach: Machine, rt, spec: str) -> tuple:
    """(candidate placements, rule) the group's configurations choose from (moesim.fit.auto_placement
    resolved per configuration in C for llama.cpp and ktransformers)."""
    if spec != "auto":
        return [parse_placement(spec, m, mach)], SWEEP_FIXED
    if mach.unified:
        return [Placement("unified")], SWEEP_FIXED
    if mach.n_gpus == 0:
        return [Placement("cpu-only")], SWEEP_FIXED
    L, E = m.n_layers, m.n_experts
    if rt.family == "ktransformers" and E:
        return [Placement("gpu-experts", k) for k in range(E + 1)] + [Placement("experts-cpu")], SWEEP_AUTO_KT
    if not rt.llama_cpp_family:
        return [Placement("all-gpu")], SWEEP_FIXED
    cands = [Placement("all-gpu")]
    if E:
        cands += [Placement("n-cpu-moe", n) for n in range(L + 1)]
    cands += [Placement("layers-gpu", k) for k in range(L + 1)] + [Placement("cpu-only")]
    if E:
        cands.append(Placement("experts-cpu"))
    return cands, SWEEP_AUTO_LLAMA
