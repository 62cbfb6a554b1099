"""``moesim fit``: for each quantization, where the model goes on a machine, whether it fits, and limits.

Placement is chosen the way the runtime would (llama.cpp ``--fit``: everything on the GPU if it fits,
else the fewest layers' routed experts in host RAM via ``--n-cpu-moe``, else fewer whole layers on the
GPU; ktransformers: as many experts per layer on the GPU as fit; served runtimes: all on GPU or nothing).
"""
from __future__ import annotations

from . import quants as Q
from ._search import largest_true
from .errors import MoesimError
from .hardware import Machine
from .memory import MemoryResult, check_count, configure, default_kv_dtype, evaluate, lower, _result_from_arrays
from .models import Model, model as get_model
from .placement import Placement, parse as parse_placement, runtime_flags
from .runtimes import Runtime, default_runtime, runtime as get_runtime

DEFAULT_FIT_QUANTS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16")


def _eval(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
          mtp: int) -> MemoryResult:
    cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    return _result_from_arrays(evaluate(low, cfg), 0)


def auto_placement(m: Model, low, machine: Machine, rt: Runtime, context: int, batch: int, kv: str,
                   mtp: int = 0) -> Placement:
    """The placement the runtime's own fitting would choose (see module docstring)."""
    if machine.unified:
        return Placement("unified")
    if machine.n_gpus == 0:
        return Placement("cpu-only")

    def fits(p: Placement) -> bool:
        return _eval(m, low, machine, rt, p, context, batch, kv, mtp).fits_bits != 0

    if rt.family == "ktransformers" and m.n_experts:
        n = largest_true(lambda k: fits(Placement("gpu-experts", k)), 0, m.n_experts)
        return Placement("gpu-experts", n) if n else Placement("experts-cpu")
    if fits(Placement("all-gpu")):
        return Placement("all-gpu")
    if not rt.llama_cpp_family:
        return Placement("all-gpu")  # served runtimes do not offload: report that it does not fit
    L = m.n_layers
    if m.n_experts:
        # fewest layers whose experts go to host RAM: largest k with experts of layers >= L-k... on GPU
        n_gpu_layers = largest_true(lambda k: fits(Placement("n-cpu-moe", L - k)), 0, L)
        if n_gpu_layers is not None:
            return Placement("n-cpu-moe", L - n_gpu_layers) if n_gpu_layers < L else Placement("all-gpu")
    k = largest_true(lambda k: fits(Placement("layers-gpu", k)), 0, L)
    if k:
        return Placement("layers-gpu", k)
    if fits(Placement("cpu-only")):
        return Placement("cpu-only")
    # Nothing fits: report the usual hybrid layout so the shortfall is visible where it matters.
    return Placement("experts-cpu") if m.n_experts else Placement("all-gpu")


def resolve(m: Model, quant, machine: Machine, runtime=None, placement=None, context: int = 4096, batch: int = 1,
            kv_dtype: str | None = None, mtp: int = 0, parallel: str | None = None) -> tuple:
    """(quant, runtime, KV dtype, lowered model, placement) of one configuration: the runtime the
    format implies unless given, its default KV dtype, and the placement its own fitting would pick
    for ``placement`` None / "auto". Shared by fit, simulate and validate."""
    from .decode import with_parallel
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
    from .overrides import as_overrides, assign_devices, equivalent_placement
    ovs = as_overrides(overrides)
    p = equivalent_placement(m, assign_devices(m, ovs, quant=quant))
    if p is None:
        raise MoesimError("these overrides move tensors in a way the memory view cannot express (it knows "
                          "all-gpu, experts-cpu and n-cpu-moe=N: routed experts of the first N layers on the CPU); "
                          "`moesim inspect MODEL -ot ...` shows the bytes per device", "--override-tensor")
    return p


def fit(model, machine: Machine, quants=None, context: int = 4096, batch: int = 1, kv_dtype: str | None = None,
        placement: str | None = None, runtime: str | None = None, mtp: int = 0, overrides=None) -> list:
    """One dict per quantization with the memory view (JSON field names of DESIGN §4).

    *model* may be a catalog id, a :class:`Model` or a path (GGUF, config.json, safetensors); a model
    read from a weights file is fitted as stored (exact per-tensor bytes) unless *quants* asks otherwise.
    *overrides*: llama.cpp ``-ot PATTERN=DEVICE`` strings, mapped to the equivalent placement."""
    m = get_model(model)
    context = check_count(context, "context")
    batch = check_count(batch, "batch")
    mtp = check_count(mtp, "mtp", minimum=0)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    if overrides:
        if placement not in (None, "auto"):
            raise MoesimError("give either --placement or --override-tensor, not both", "placement")
        placement = placement_from_overrides(m, overrides)
    if quants is None or len(quants) == 0:
        quants = (["native"] if m.stored is not None
                  else [q for q in DEFAULT_FIT_QUANTS if q != "MXFP4_MOE" or m.n_experts])
    elif isinstance(quants, str):
        quants = [quants]
    out = []
    for qname in quants:
        q, rt, kv, low, p = resolve(m, qname, machine, runtime, placement, context, batch, kv_dtype, mtp)
        r = _eval(m, low, machine, rt, p, context, batch, kv, mtp)
        rec = record(m, q, kv, context, batch, p, rt, machine, r, mtp)
        rec["decode_tok_s"] = rec["prefill_tok_s"] = None
        if r.fits_bits:
            from .decode import estimate
            rec["decode_tok_s"], rec["prefill_tok_s"] = estimate(m, low, machine, rt, p, context, batch, kv, r, mtp)
        out.append(rec)
    return out


def record(m: Model, q, kv: str, context: int, batch: int, p: Placement, rt: Runtime, machine: Machine,
           r: MemoryResult, mtp: int) -> dict:
    tiers = r.memory_by_tier()
    fits = r.fits
    if machine.unified:
        # one physical pool: the GPU tier is the wired (GPU-visible) share of it
        tiers = {("unified" if k == "gpu" else k): v for k, v in tiers.items()}
        fits = "+".join("unified" if t == "gpu" else t for t in fits.split("+")) if fits != "no" else fits
    return {
        "model": m.id,
        "quant": q.id,
        "quant_source": "file" if q.is_stored else ("checkpoint" if q.scheme is not None else "rules"),
        "kv_dtype": kv,
        "context": context,
        "batch": batch,
        "placement": str(p),
        "runtime": rt.id,
        "machine": machine.describe(),
        "weights_bytes": r.weights,
        "weights_bytes_by_class": r.weights_by_class(),
        "kv_bytes_per_token": r.kv_bytes_per_token,
        "kv_bytes": r.kv,
        "state_bytes": r.state,
        "memory_by_tier": tiers,
        "fits": fits,
        "max_context": r.max_context,
        "max_batch": r.max_batch,
        "flags": runtime_flags(p, rt, m, machine, context, kv, batch),
        "assumptions": list(machine.assumptions) + ([rt.launch] if rt.launch else []),
    }
