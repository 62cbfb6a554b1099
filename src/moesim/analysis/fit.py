"""``moesim fit``: for each quantization, where the model goes on a machine, whether it fits, and limits.

Placement is chosen the way the runtime would (llama.cpp ``--fit``: everything on the GPU if it fits,
else the fewest layers' routed experts in host RAM via ``--n-cpu-moe``, else fewer whole layers on the
GPU; ktransformers: as many experts per layer on the GPU as fit; served runtimes: all on GPU or nothing).
"""
from __future__ import annotations

from ..errors import MoesimError
from ..spec.hardware import Machine
from ..spec.hardware import as_machine
from ..spec.limits import MAX_BATCH, MAX_DRAFTS, check_context, check_count
from ..ingest import model as get_model
from ..spec import quants as Q
from ..spec.runtimes import runtime as get_runtime
from .resolve import checkpoint_quant, configure_run, memory_record, placement_from_overrides
from .consistency import capacities, check_record
from .intervals import fields as interval_fields, regime


DEFAULT_FIT_QUANTS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16")


def default_quants(m, machine: Machine, runtime=None) -> tuple:
    """(quantizations, assumption lines) fit and plan try when none are given: a model read from a file
    as stored; under vLLM / SGLang / TensorRT-LLM the checkpoint's own format, and fp8 quantized as it
    loads where the checkpoint is 16-bit (they serve checkpoint formats, not GGUF); MLX its formats; with
    no runtime asked on several datacenter GPUs, the published checkpoint as a serving runtime (vLLM)
    loads it; otherwise llama.cpp's GGUF ladder. *runtime*: a Runtime, or None."""
    if m.stored is not None:
        return ["native"], []
    if runtime is not None and runtime.family == "served":
        native = Q.native_quant(m)
        return ["native"] + (["fp8"] if native.id.lower() in ("bf16", "f16", "fp16") else []), []
    if runtime is not None and runtime.id == "mlx":
        return [f for f in Q.format_ids() if f.startswith("mlx")], []
    if runtime is None and machine.datacenter:
        return [checkpoint_quant(m)], [f"quant native ({m.id}'s published checkpoint): the default on "
                                       f"{machine.n_gpus}x {machine.gpu}, served by a serving runtime (--quant "
                                       "for GGUF on llama.cpp)"]
    return [q for q in DEFAULT_FIT_QUANTS if q != "MXFP4_MOE" or m.n_experts], []


def default_quant_names(m, machine: Machine, runtime=None) -> list:
    """:func:`default_quants` as the names a sweep takes: the published checkpoint as ``native``."""
    return [q if isinstance(q, str) else "native" for q in default_quants(m, machine, runtime)[0]]


def fit(model, machine: Machine, quants=None, context: int = 4096, batch: int = 1, kv_dtype: str | None = None,
        placement: str | None = None, runtime: str | None = None, mtp: int = 0, overrides=None,
        allow_beyond_max_context: bool = False, parallel: str | None = None, cache_experts: int | None = None,
        policy: str = "lru", prefetch_recall: float | None = None, routing=None, mtp_acceptance: float | None = None,
        mtp_dataset: str | None = None, redundant_experts: int = 0, ubatch: int | None = None) -> list:
    """One dict per quantization with the memory view (JSON field names of DESIGN §4).

    *model* may be a catalog id, a :class:`Model` or a path (GGUF, config.json, safetensors); a model
    read from a weights file is fitted as stored (exact per-tensor bytes) unless *quants* asks otherwise.
    *overrides*: llama.cpp ``-ot PATTERN=DEVICE`` strings, mapped to the equivalent placement.
    *machine*: a :func:`moesim.machine`, a catalog machine id or a dict of its keywords. A context above
    the model's trained maximum is refused unless *allow_beyond_max_context*.
    The options of :func:`moesim.simulate` that change memory or speed mean the same here: *parallel*
    (multi-GPU layout) and *redundant_experts* (EPLB replicas per MoE layer under EP), *mtp* / *mtp_acceptance* /
    *mtp_dataset*, *cache_experts* (offload-cache slots per MoE layer),
    *policy*, *prefetch_recall* and *routing* (the analytic decode estimate's cache policy, next-layer
    prefetch and routing profile), *ubatch* (llama.cpp -ub: compute buffers and prefill passes); memory,
    fit and limits equal simulate's for the same options."""
    from .simulate import _check_fraction, _policy_and_mode
    from .speculation import resolve_acceptance
    m = get_model(model)
    machine = as_machine(machine)
    context, notes = check_context(context, m, allow_beyond_max_context)
    batch = check_count(batch, "batch", maximum=MAX_BATCH)
    mtp = check_count(mtp, "mtp", minimum=0, maximum=MAX_DRAFTS)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    acc = resolve_acceptance(m.family, mtp, mtp_acceptance, mtp_dataset)
    policy, _ = _policy_and_mode(policy, "analytic")
    if prefetch_recall is not None:
        prefetch_recall = _check_fraction(prefetch_recall, "prefetch_recall")
    if overrides:
        if placement not in (None, "auto"):
            raise MoesimError("give either --placement or --override-tensor, not both", "placement")
        placement = placement_from_overrides(m, overrides)
    if quants is None or len(quants) == 0:
        quants, served = default_quants(m, machine, get_runtime(runtime, model=m.id) if runtime is not None else None)
        notes = notes + served
    elif isinstance(quants, str):
        quants = [quants]
    options = dict(parallel=parallel, redundant_experts=redundant_experts, mtp_acceptance=acc.rate,
                   cache_experts=cache_experts, policy=policy,
                   prefetch_recall=prefetch_recall, routing=routing)
    out = []
    for qname in quants:
        c = configure_run(m, qname, machine, runtime, placement, context, batch, kv_dtype, mtp, parallel,
                          cache_experts, redundant_experts, ubatch)
        rec = memory_record(m, c, machine, qname, context, batch, mtp, notes, runtime, kv_dtype, placement, options)
        rec["decode_tok_s"] = rec["prefill_tok_s"] = None
        if c.mem.fits_bits:
            from .simulate import estimate, speculation_fields
            rec["decode_tok_s"], rec["prefill_tok_s"] = estimate(
                m, c.low, machine, c.runtime, c.placement, context, batch, c.kv, c.mem, mtp, acc.rate,
                routing=routing, policy=policy, prefetch_recall=prefetch_recall)
            rec.update(speculation_fields(m, c.low, machine, c.runtime, c.placement, context, batch, c.kv, c.mem,
                                          mtp, acc, routing, policy, prefetch_recall))
        rec.update(interval_fields(rec["decode_tok_s"], rec["prefill_tok_s"], regime(machine, c.placement, c.runtime)))
        if rec["decode_tok_s"] is not None:
            rec.update(_workload_spread(m, c, machine, context, batch, mtp, acc.rate, rec, routing, policy,
                                        prefetch_recall))
        out.append(check_record(rec, capacities(c.cfg), m.max_context, allow_beyond_max_context))
    return out


def _workload_spread(m, c, machine, context: int, batch: int, mtp: int, acceptance: float, rec: dict, routing,
                     policy: str, prefetch_recall) -> dict:
    """The record's interval fields widened by its routing profile's workloads, as simulate's (issue 15); {} where
    the profile pools none (or the model routes nothing)."""
    from .intervals import FIELDS
    from .simulate import estimate, pooled_profile, widened_for_workloads
    prof = pooled_profile(m, routing)
    if prof is None:
        return {}
    fields_ = {k: rec[k] for k in FIELDS + ("interval_regime", "interval_basis")}
    return widened_for_workloads(fields_, (rec["decode_tok_s"], rec["prefill_tok_s"]), prof, lambda r: estimate(
        m, c.low, machine, c.runtime, c.placement, context, batch, c.kv, c.mem, mtp, acceptance, routing=r,
        policy=policy, prefetch_recall=prefetch_recall))
