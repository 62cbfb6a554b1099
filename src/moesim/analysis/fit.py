"""``moesim fit``: for each quantization, where the model goes on a machine, whether it fits, and limits.

Placement is chosen the way the runtime would (llama.cpp ``--fit``: everything on the GPU if it fits,
else the fewest layers' routed experts in host RAM via ``--n-cpu-moe``, else fewer whole layers on the
GPU; ktransformers: as many experts per layer on the GPU as fit; served runtimes: all on GPU or nothing).
"""
from __future__ import annotations

from ..errors import MoesimError
from ..spec import quants as Q
from ..spec.hardware import Machine
from ..spec.hardware import as_machine
from ..spec.models import Model
from ..spec.runtimes import runtime as get_runtime
from ..spec.limits import MAX_BATCH, MAX_DRAFTS, check_context, check_count
from ..ingest import model as get_model
from .resolve import memory_of, placement_from_overrides, resolve
from .consistency import capacities, check_record
from .records import default_notes, record
from ..engine.lower.memory import configure


DEFAULT_FIT_QUANTS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16")
# Runtime families that load GGUF files (ktransformers runs its CPU experts from GGUF weights); the
# others serve a model's own checkpoint.
_GGUF_FAMILIES = ("llama.cpp", "ktransformers")


def default_quants(m: Model, runtime=None) -> list:
    """The quantizations fit (and rank) try when none is given: a model read from a weights file as
    stored; else the GGUF ladder for a runtime that loads GGUF files (the default runtime of a GGUF
    quant, llama.cpp, when *runtime* is None); else the native checkpoint a serving runtime loads."""
    if m.stored is not None:
        return ["native"]
    if runtime is not None and get_runtime(runtime, model=m.id).family not in _GGUF_FAMILIES:
        return ["native"]
    return list(DEFAULT_FIT_QUANTS)


def fit(model, machine: Machine, quants=None, context: int = 4096, batch: int = 1, kv_dtype: str | None = None,
        placement: str | None = None, runtime: str | None = None, mtp: int = 0, overrides=None,
        allow_beyond_max_context: bool = False) -> list:
    """One dict per quantization with the memory view (JSON field names of DESIGN §4).

    *model* may be a catalog id, a :class:`Model` or a path (GGUF, config.json, safetensors); a model
    read from a weights file is fitted as stored (exact per-tensor bytes) unless *quants* asks otherwise.
    *overrides*: llama.cpp ``-ot PATTERN=DEVICE`` strings, mapped to the equivalent placement.
    *machine*: a :func:`moesim.machine`, a catalog machine id or a dict of its keywords. A context above
    the model's trained maximum is refused unless *allow_beyond_max_context*."""
    m = get_model(model)
    machine = as_machine(machine)
    context, notes = check_context(context, m, allow_beyond_max_context)
    batch = check_count(batch, "batch", maximum=MAX_BATCH)
    mtp = check_count(mtp, "mtp", minimum=0, maximum=MAX_DRAFTS)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    if overrides:
        if placement not in (None, "auto"):
            raise MoesimError("give either --placement or --override-tensor, not both", "placement")
        placement = placement_from_overrides(m, overrides)
    if quants is None or len(quants) == 0:
        quants = default_quants(m, runtime)
    elif isinstance(quants, str):
        quants = [quants]
    out = []
    for qname in quants:
        q, rt, kv, low, p = resolve(m, qname, machine, runtime, placement, context, batch, kv_dtype, mtp)
        cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
        r = memory_of(m, low, machine, rt, p, context, batch, kv, mtp, auto=placement in (None, "auto"), cfg=cfg)
        alias = Q.alias_note(qname, q)
        rec = record(m, q, kv, context, batch, p, rt, machine, r, mtp, notes + ([alias] if alias else []))
        rec["decode_tok_s"] = rec["prefill_tok_s"] = None
        if r.fits_bits:
            from .simulate import estimate
            rec["decode_tok_s"], rec["prefill_tok_s"] = estimate(m, low, machine, rt, p, context, batch, kv, r, mtp)
        rec["assumptions"] += default_notes(rt, kv, runtime, kv_dtype, placement)
        out.append(check_record(rec, capacities(cfg), m.max_context, allow_beyond_max_context))
    return out
