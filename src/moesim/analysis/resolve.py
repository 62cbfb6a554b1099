"""Resolving a configuration the way the runtime would: placement (``--fit``), runtime and parallelism."""
from __future__ import annotations

import dataclasses
import functools
import re
import types

import numpy as np

from ..spec import quants as Q
from ..errors import MoesimError
from ..spec.hardware import Machine
from ..spec.models import Model
from ..engine.memory import MemoryResult, evaluate, _result_from_arrays
from ..engine.codes import SWEEP_FIXED, placement_code
from ..engine.glue import handle_library_error
from ..engine.lower.memory import configure, default_kv_dtype, lower
from ..engine.lower.placement import placement_candidates
from ..spec.placement import Placement, parse as parse_placement
from ..spec.runtimes import Runtime, default_runtime, runtime as get_runtime


_PARALLEL_RE = re.compile(r"^(?:(tp|ep|pp)(\d+)(?:-ep(\d+))?(?:-attn-dp)?|layer-split|row-split|pipeline)$")


def with_parallel(rt: Runtime, parallel: str | None, machine: Machine) -> Runtime:
    """The runtime with its multi-GPU layout set by ``--parallel`` (tp8, tp4-ep4, ep8, tp8-ep8-attn-dp,
    layer-split, row-split, pipeline): tensor/expert parallel layouts read every GPU's memory at
    once (bandwidth adds, all-reduce per layer); layer split and pipelines walk the GPUs in turn."""
    if parallel is None:
        return rt
    if not isinstance(parallel, str):
        raise MoesimError(f"expected a layout such as tp8 or layer-split, got {parallel!r}", "parallel")
    spec = parallel.strip().lower()
    m = _PARALLEL_RE.match(spec)
    if not m:
        raise MoesimError(f"unknown layout {parallel!r}: use tpN, epN, tpN-epM[-attn-dp], layer-split, "
                          "row-split or pipeline", "parallel")
    degree = int(m.group(2)) if m.group(2) else machine.n_gpus
    if degree > max(1, machine.n_gpus):
        raise MoesimError(f"{parallel} spans {degree} GPUs and the machine has {machine.n_gpus} "
                          "(multi-node layouts are not modelled)", "parallel")
    split = spec in ("layer-split", "pipeline") or (m.group(1) == "pp")
    # attention data parallelism: each rank schedules, samples and attends its own share of the batch
    dp = degree if spec.endswith("-attn-dp") else 1
    return dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, tensor_parallel=not split, data_parallel=dp))


def _eval(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
          mtp: int) -> MemoryResult:
    cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    return _result_from_arrays(evaluate(low, cfg), 0)


def placement_tables(m: Model, low, machine: Machine, rt: Runtime, kv: str, mtp: int, cands: list,
                     rule: int) -> dict:
    """The group table of ms_sweep_mem_t (the form the C ``ms_sweep_choose`` reads) for one model, quant,
    machine, runtime, KV dtype and MTP setting, over the candidates of ``placement_candidates``.

    Built as ``analysis.sweep.Group`` builds its memory tables (layer kinds with identical caches, one KV
    layout per whole-layer split, the weights per tier of every candidate), plus the MTP modules when
    *mtp* is on: their weights with the output head, their caches as copies of the last layer's kind
    on the head's tier, as ``ms_memory.c`` counts them."""
    from .sweep import place_weights
    L, kvb = m.n_layers, Q.kv_dtype_bytes(kv)
    kinds: dict = {}
    kind_of = np.empty(L, dtype=np.int64)
    for l in range(L):
        key = (float(low.kv_elems[l] * kvb + low.kv_fixed[l]), int(low.kv_cap[l]), int(low.kv_ratio[l]),
               float(low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]), float(low.kv_state[l]))
        kind_of[l] = kinds.setdefault(key, len(kinds))
    K = len(kinds)
    rows = list(kinds)
    n_mtp = int(low.mtp_layers) if mtp else 0
    count = np.bincount(kind_of, minlength=K).astype(np.int32)
    gpu_count = np.zeros((L + 3, K), dtype=np.int32)
    gpu_count[0] = count                                   # layout 0: every layer on the GPU
    for k in range(1, L + 1):                              # layout 2 + k: layers-gpu = k (head on the GPU)
        gpu_count[2 + k] = np.bincount(kind_of[L - k:], minlength=K)
    if n_mtp:
        last = kind_of[L - 1]
        count[last] += n_mtp
        gpu_count[0, last] += n_mtp
        gpu_count[3:, last] += n_mtp                       # cpu-only (1) and layers-gpu=0 (2): head on the host
    cfgs = []
    for p in (Placement("all-gpu"), Placement("cpu-only")):
        c = configure(m, low, machine, rt, p, 1, 1, kv, mtp)
        cfgs.append(c)
    pl: dict = {k: [] for k in ("code", "arg", "layout", "cfg", "any_gpu", "label", "w_gpu", "w_host",
                                "routed_host")}
    idx = {"all-gpu": -1, "n-cpu-moe": -1, "layers-gpu": -1, "cpu-only": -1, "experts-cpu": -1, "gpu-experts": -1}
    # the same float64 values as Python floats and lists: place_weights indexes them per layer and
    # candidate, where numpy scalars would cost 10x (the sums are the same numbers either way)
    plain = types.SimpleNamespace(**{k: getattr(low, k).tolist() for k in ("attn", "router", "shared", "dense",
                                                                           "n_experts", "expert_one")},
                                  head=float(low.head), embed=float(low.embed))
    for j, p in enumerate(cands):
        if idx.get(p.kind, 0) == -1:
            idx[p.kind] = j
        w = place_weights(m, plain, p, bool(cfgs[0]["embed_on_gpu"]))
        if n_mtp:
            head_gpu = not (p.kind == "cpu-only" or (p.kind == "layers-gpu" and p.arg == 0))
            w["w_gpu" if head_gpu else "w_host"] += float(low.mtp)
        pl["code"].append(placement_code(p))
        pl["arg"].append(max(0, p.arg))
        pl["layout"].append(1 if p.kind == "cpu-only" else (2 + p.arg if p.kind == "layers-gpu" else 0))
        pl["cfg"].append(1 if p.kind == "cpu-only" or machine.n_gpus == 0 else 0)
        pl["label"].append(j)
        for k in ("any_gpu", "w_gpu", "w_host", "routed_host"):
            pl[k].append(w[k])
    return dict(per_token=[r[0] for r in rows], cap=[r[1] for r in rows], ratio=[r[2] for r in rows],
                ratio_bytes=[r[3] for r in rows], state=[r[4] for r in rows], count=count, gpu_count=gpu_count,
                max_context=int(low.max_context), cfg=cfgs, places=pl, rule=rule, n_layers=L, n_experts=m.n_experts,
                i_all_gpu=idx["all-gpu"], i_n_cpu_moe=idx["n-cpu-moe"], i_layers_gpu=idx["layers-gpu"],
                i_cpu_only=idx["cpu-only"], i_experts_cpu=idx["experts-cpu"], i_gpu_experts=idx["gpu-experts"],
                fits_label=[0] * 8)


@functools.lru_cache(maxsize=64)
def _placement_kernel(m: Model, low, machine: Machine, rt: Runtime, kv: str, mtp: int) -> tuple:
    from ..engine import _kernel
    cands, rule = placement_candidates(m, machine, rt, "auto")
    if rule == SWEEP_FIXED:
        return cands, None
    return cands, _kernel.SweepMemory(placement_tables(m, low, machine, rt, kv, mtp, cands, rule))


def auto_placement(m: Model, low, machine: Machine, rt: Runtime, context: int, batch: int, kv: str,
                   mtp: int = 0) -> Placement:
    """The placement the runtime's own fitting would choose: the C ``ms_sweep_choose`` (through
    ``ms_auto_placement``) over the candidates of ``engine.lower.placement.placement_candidates``.

    llama.cpp ``--fit``: everything on the GPU if it fits, else the fewest layers' routed experts in host
    RAM (``--n-cpu-moe``), else the most whole layers on the GPU that fit (``layers-gpu``), else CPU only,
    else (nothing fits) the usual hybrid layout so the shortfall shows; ktransformers: as many experts
    per layer on the GPU as fit (else experts-cpu); served runtimes: all on the GPU or nothing; a
    unified-memory machine: unified; a machine without GPUs: cpu-only."""
    cands, mem = _placement_kernel(m, low, machine, rt, kv, 1 if mtp else 0)
    if mem is None:
        return cands[0]
    from ..engine import _kernel
    code, j = _kernel.auto_placement(mem, int(context), int(batch))
    handle_library_error(code, "ms_auto_placement")
    return cands[j]


def resolve(m: Model, quant, machine: Machine, runtime=None, placement=None, context: int = 4096, batch: int = 1,
            kv_dtype: str | None = None, mtp: int = 0, parallel: str | None = None) -> tuple:
    """(quant, runtime, KV dtype, lowered model, placement) of one configuration: the runtime the
    format implies unless given, its default KV dtype, and the placement its own fitting would pick
    for ``placement`` None / "auto". Shared by fit, simulate and validate."""
    q = Q.resolve(quant, m)
    rt = get_runtime(runtime, model=m.id) if runtime is not None else default_runtime(q, machine)
    rt = with_parallel(rt, parallel, machine)
    kv = Q.canonical_kv_dtype(kv_dtype or default_kv_dtype(q, rt, m))
    low = lower(m, q)
    if placement in (None, "auto"):
        p = auto_placement(m, low, machine, rt, context, batch, kv, mtp)
    else:
        p = parse_placement(placement, m, machine)
    return q, rt, kv, low, p


def placement_from_overrides(m: Model, overrides, quant="native") -> Placement:
    """The placement llama.cpp ``-ot PATTERN=DEVICE`` overrides realise, when moesim's memory view can
    express it (all-gpu, experts-cpu, n-cpu-moe=N); otherwise a MoesimError pointing at ``inspect``."""
    from ..spec.overrides import as_overrides, assign_devices, equivalent_placement
    ovs = as_overrides(overrides)
    p = equivalent_placement(m, assign_devices(m, ovs, quant=quant))
    if p is None:
        raise MoesimError("these overrides move tensors in a way the memory view cannot express (it knows "
                          "all-gpu, experts-cpu and n-cpu-moe=N: routed experts of the first N layers on the CPU); "
                          "`moesim inspect MODEL -ot ...` shows the bytes per device", "--override-tensor")
    return p
