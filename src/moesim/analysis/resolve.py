"""Resolving a configuration the way the runtime would: placement (``--fit``), runtime and parallelism."""
from __future__ import annotations

import dataclasses
import functools
import re

from ..spec import quants as Q
from ..errors import MoesimError
from ..spec.hardware import Machine
from ..spec.models import Model
from ..engine.memory import MemoryResult, evaluate, _result_from_arrays
from ..engine.codes import SWEEP_FIXED
from ..engine.glue import handle_library_error
from ..engine.lower.memory import configure, default_kv_dtype, lower
from ..engine.lower.placement import memory_tables, placement_candidates
from ..spec.placement import Placement, parse as parse_placement
from ..spec.runtimes import Runtime, check_runtime_applies, default_runtime, runtime as get_runtime


_PARALLEL_RE = re.compile(r"^(?:(tp|ep|pp)(\d+)(?:-ep(\d+))?(?:-attn-dp)?|layer-split|row-split|pipeline)$")


def with_parallel(rt: Runtime, parallel: str | None, machine: Machine, redundant_experts: int = 0) -> Runtime:
    """The runtime with its multi-GPU layout set by ``--parallel`` (tp8, tp4-ep4, ep8, tp8-ep8-attn-dp,
    layer-split, row-split, pipeline): tensor/expert parallel layouts read every GPU's memory at
    once (bandwidth adds); tpN all-reduces per layer; tpN-epM shards the routed experts over M ranks under
    attention TP N (vLLM "TP8+EP": --tensor-parallel-size 8 --enable-expert-parallel; TensorRT-LLM's MoE
    TP N/M x EP M); epN is vLLM's "DP8+EP" (--data-parallel-size N --enable-expert-parallel: attention data
    parallel, experts over N; docs.vllm.ai DeepSeek-V3 recipe), as is any -attn-dp layout: each rank attends
    its own sequences with its own copy of the attention weights, and a dispatch and a combine all-to-all per
    MoE layer move the tokens to their experts. Layer split and pipelines walk the GPUs in turn.
    *redundant_experts* (EPLB) applies to expert-parallel layouts only."""
    from ..spec.limits import check_count
    redundant_experts = check_count(redundant_experts, "redundant_experts", minimum=0)
    if parallel is None:
        if redundant_experts:
            raise MoesimError("redundant experts replicate experts over expert-parallel ranks: give --parallel epN",
                              "redundant_experts")
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
    dp = degree if (spec.endswith("-attn-dp") or m.group(1) == "ep") else 1
    ep = int(m.group(3)) if m.group(3) else (degree if m.group(1) == "ep" else 1)
    if ep < 1 or degree % ep:
        raise MoesimError(f"{parallel}: the expert-parallel degree {ep} must divide the {degree} GPUs", "parallel")
    if redundant_experts and ep <= 1:
        raise MoesimError(f"redundant experts need an expert-parallel layout (epN, tpN-epM), not {parallel}",
                          "redundant_experts")
    return dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, tensor_parallel=not split, data_parallel=dp,
                                                              expert_parallel=ep,
                                                              redundant_experts=redundant_experts))


def memory_of(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
              mtp: int, auto: bool = False, cfg: dict | None = None) -> MemoryResult:
    """The memory kernel's view of one configuration (*cfg*: its ``configure`` when the caller has it).
    With *auto* (p is the runtime's own choice) its max_context is the largest context that fits under
    the placement the runtime would choose for *that* context (:func:`auto_max_context`, as sweeps
    report it), not only under p."""
    if cfg is None:
        cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    r = _result_from_arrays(evaluate(low, cfg), 0)
    if auto:
        r = dataclasses.replace(r, max_context=auto_max_context(m, low, machine, rt, batch, kv, mtp, r.max_context))
    return r


@functools.lru_cache(maxsize=64)
def _placement_kernel(m: Model, low, machine: Machine, rt: Runtime, kv: str, mtp: int) -> tuple:
    from ..engine import _kernel
    cands, rule = placement_candidates(m, machine, rt, "auto")
    if rule == SWEEP_FIXED:
        return cands, None
    return cands, _kernel.SweepMemory(memory_tables(m, low, machine, rt, kv, cands, rule, mtp=mtp))


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


def auto_max_context(m: Model, low, machine: Machine, rt: Runtime, batch: int, kv: str, mtp: int,
                     fixed_answer: int) -> int:
    """The largest context that fits at *batch* when the runtime chooses the placement for each context
    (the C ``ms_auto_max_context``); *fixed_answer* where the runtime has a single candidate."""
    _, mem = _placement_kernel(m, low, machine, rt, kv, 1 if mtp else 0)
    if mem is None:
        return fixed_answer
    from ..engine import _kernel
    code, out = _kernel.auto_max_context(mem, int(batch))
    handle_library_error(code, "ms_auto_max_context")
    return int(out)


def checkpoint_quant(m: Model):
    """``native`` as the published checkpoint: a bf16/fp16 checkpoint is a safetensors format that a
    serving runtime loads, not llama.cpp's GGUF BF16 file type that the bare name resolves to."""
    q = Q.resolve("native", m)
    if q.is_gguf and str(m.native_quant).lower() in Q.format_ids():
        return Q.Quant(str(m.native_quant).lower(), "format")
    return q


def with_ubatch(rt: Runtime, ubatch) -> Runtime:
    """The runtime with the prompt's physical batch set (llama.cpp ``-ub`` / ``--ubatch-size``): the tokens
    one prefill pass multiplies, whose expert union each pass reads, and its compute buffers. None keeps
    the runtime's default (512 for the llama.cpp family); runtimes without the setting (serving engines
    chunk prompts by their own rules) refuse it."""
    if ubatch is None:
        return rt
    from ..spec.limits import MAX_UBATCH, check_count
    ub = check_count(ubatch, "ubatch", maximum=MAX_UBATCH)
    if not rt.ubatch:
        raise MoesimError(f"{rt.id} has no physical batch setting: ubatch applies to the llama.cpp family (-ub)",
                          "ubatch")
    return rt if ub == rt.ubatch else dataclasses.replace(rt, ubatch=ub)


def resolve(m: Model, quant, machine: Machine, runtime=None, placement=None, context: int = 4096, batch: int = 1,
            kv_dtype: str | None = None, mtp: int = 0, parallel: str | None = None, redundant_experts: int = 0,
            ubatch: int | None = None) -> tuple:
    """(quant, runtime, KV dtype, lowered model, placement) of one configuration: the runtime the
    format implies unless given (its physical batch set by *ubatch*, :func:`with_ubatch`), its default KV
    dtype, and the placement its own fitting would pick for ``placement`` None / "auto". Shared by fit,
    simulate and validate. On several datacenter GPUs with no runtime asked, ``native`` is the checkpoint a
    serving runtime loads (:func:`checkpoint_quant`)."""
    if runtime is None and machine.datacenter and isinstance(quant, str) and quant.strip().lower() == "native":
        quant = checkpoint_quant(m)
    q = Q.resolve(quant, m)
    rt = get_runtime(runtime, model=m.id) if runtime is not None else default_runtime(q, machine)
    rt = with_ubatch(with_parallel(rt, parallel, machine, redundant_experts), ubatch)
    _check_expert_parallel(m, rt)
    kv = Q.canonical_kv_dtype(kv_dtype or default_kv_dtype(q, rt, m))
    low = lower(m, q, kv)
    if placement in (None, "auto"):
        p = auto_placement(m, low, machine, rt, context, batch, kv, mtp)
    else:
        p = parse_placement(placement, m, machine)
    check_runtime_applies(rt, machine, p.kind)
    return q, rt, kv, low, p


def _check_expert_parallel(m: Model, rt: Runtime) -> None:
    """Expert parallelism needs routed experts, and their slots (experts + redundant) split evenly over the
    EP ranks (vLLM: num_redundant_experts with (experts + redundant) % ep_size == 0)."""
    ep, red = rt.decode.expert_parallel, rt.decode.redundant_experts
    if ep <= 1:
        return
    if not m.n_experts:
        raise MoesimError(f"{m.id} is dense: expert parallelism needs routed experts", "parallel")
    if red > m.n_experts * (ep - 1):
        raise MoesimError(f"{red} redundant experts: at most {m.n_experts * (ep - 1)} (every expert on all {ep} "
                          "EP ranks)", "redundant_experts")
    if (m.n_experts + red) % ep:
        raise MoesimError(f"{m.n_experts} experts + {red} redundant do not split evenly over {ep} EP ranks",
                          "redundant_experts" if red else "parallel")


def placement_from_overrides(m: Model, overrides, quant="native", n_gpu_layers: int | None = None) -> Placement:
    """The placement llama.cpp ``-ot PATTERN=DEVICE`` overrides (and ``-ngl``, default all layers) realise,
    when moesim's memory view can express it (all-gpu, experts-cpu, n-cpu-moe=N, layers-gpu=N, cpu-only;
    spec.overrides.equivalent_placement); otherwise a MoesimError pointing at ``inspect``."""
    from ..spec.overrides import as_overrides, assign_devices, equivalent_placement
    ovs = as_overrides(overrides)
    p = equivalent_placement(m, assign_devices(m, ovs, n_gpu_layers=n_gpu_layers, quant=quant))
    if p is None:
        raise MoesimError("these overrides move tensors in a way the memory view cannot express (it knows "
                          "all-gpu, experts-cpu and n-cpu-moe=N: routed experts of the first N layers on the CPU; "
                          "layers-gpu=N: the last N layers and the output layer on the GPU; cpu-only); "
                          "`moesim inspect MODEL -ot ...` shows the bytes per device", "--override-tensor")
    return p


@dataclasses.dataclass(frozen=True)
class Configured:
    """One resolved configuration with its memory view: what ``fit`` and ``simulate`` both start from, so
    the same options give the same memory, fit and limits in either (one function, not two copies)."""

    quant: object
    runtime: Runtime
    kv: str
    low: object
    placement: Placement
    cfg: dict
    mem: MemoryResult
    auto: bool


def configure_run(m: Model, quant, machine: Machine, runtime=None, placement=None, context: int = 4096,
                  batch: int = 1, kv_dtype: str | None = None, mtp: int = 0, parallel: str | None = None,
                  cache_experts: int | None = None, redundant_experts: int = 0,
                  ubatch: int | None = None) -> Configured:
    """Resolve (:func:`resolve`) and evaluate one configuration. *cache_experts* (GPU expert-cache slots
    per MoE layer) turns the placement into ``offload-cache=N``; given with another fixed placement it is
    refused. The placement counts as the runtime's own choice (``auto``) only when neither was given."""
    from ..spec.limits import check_count
    q, rt, kv, low, p = resolve(m, quant, machine, runtime, placement, context, batch, kv_dtype, mtp, parallel,
                                redundant_experts, ubatch)
    if cache_experts is not None:
        cache_experts = check_count(cache_experts, "cache_experts", minimum=0)
        if p.kind != "offload-cache" and placement not in (None, "auto"):
            raise MoesimError(f"cache_experts applies to the offload-cache placement, not {p}", "cache_experts")
        p = Placement("offload-cache", min(cache_experts, m.n_experts))
    auto = placement in (None, "auto") and cache_experts is None
    cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    mem = memory_of(m, low, machine, rt, p, context, batch, kv, mtp, auto=auto, cfg=cfg)
    return Configured(q, rt, kv, low, p, cfg, mem, auto)


def memory_record(m: Model, c: Configured, machine: Machine, quant, context: int, batch: int, mtp: int,
                  notes=(), runtime=None, kv_dtype=None, placement=None, options: dict | None = None) -> dict:
    """The fit record of a :class:`Configured` (records.record) with the assumptions the call implied:
    *notes* from the entry point, the quant alias, and a line for each setting left to its default; and
    its ``advice`` (analysis.advice.advise: the runtime's settings, what overflows, the speed *options*)."""
    from .advice import advise
    from .consistency import capacities
    from .records import default_notes, record
    alias = Q.alias_note(quant, c.quant)
    chosen = placement if c.auto or placement not in (None, "auto") else c.placement
    parallel = (options or {}).get("parallel")
    rec = record(m, c.quant, c.kv, context, batch, c.placement, c.runtime, machine, c.mem, mtp,
                 list(notes) + ([alias] if alias else []) + default_notes(c.runtime, c.kv, runtime, kv_dtype, chosen),
                 parallel=parallel)
    _add_per_gpu(rec, m, c, machine)
    rec["advice"] = advise(m, machine, rec, capacities(c.cfg), c.quant, c.placement, c.runtime, mtp, options,
                           auto=c.auto)
    return rec


def _add_per_gpu(rec: dict, m: Model, c: Configured, machine: Machine) -> None:
    """``gpu_bytes_per_gpu`` (the busiest GPU's bytes under the layout: split tensors a share, replicated ones
    whole; analysis.per_gpu, the memory kernel's fit criterion) and its classes."""
    from .per_gpu import gpu_bytes_per_gpu
    n = int(c.cfg["n_gpus"])
    if n < 1 or machine.unified:
        rec["gpu_bytes_per_gpu"], rec["gpu_bytes_per_gpu_by_class"] = None, None
        return
    per = gpu_bytes_per_gpu(m, c.runtime, n, c.mem.by_class)
    rec["gpu_bytes_per_gpu"], rec["gpu_bytes_per_gpu_by_class"] = per["total"], per["by_class"]