"""``moesim plan``: the trade-off between quantization, placement, KV cache dtype and context on one machine,
and decode speed, as its Pareto front, each point with the runtime settings that realise it.

The grid is evaluated by the sweep engine (``moesim.sweep(..., mode="analytic")``, in memory), so every
number on the front is the sweep's (and so ``simulate(mode="analytic")``'s) for that configuration. A
configuration is on the front when no other that fits decodes at least as fast at at least as long a
context with at least as many bits per weight and per KV element, and is better in one of them:
faster and longer are what a user wants; more bits per weight / KV element is the quality side of the
trade (the model as trained, less quantization error).
"""
from __future__ import annotations

import math

from ..errors import MoesimError
from ..ingest import model as get_model
from ..spec import quants as Q
from ..spec.hardware import as_machine
from ..spec.limits import MAX_BATCH, check_count
from ..spec.models import model_ids
from ..spec.placement import parse as parse_placement
from ..spec.runtimes import runtime as get_runtime
from .advice import launch
from .fit import default_quant_names

OBJECTIVES = ("decode_tok_s", "context", "bits_per_weight", "kv_bits")
LLAMA_KV = ("f16", "q8_0", "q4_0")
SERVED_KV = ("bf16", "fp8")
# n-cpu-moe counts sampled between 0 and the layer count (with all-gpu / experts-cpu at the two ends,
# and the runtime's own choice, which finds the fewest that fit, for each context)
N_CPU_MOE_STEPS = 8
MAX_PLAN_CONTEXTS = 24
_POINT_COLUMNS = ("quant", "kv_dtype", "placement", "runtime", "context", "fits", "decode_tok_s", "aggregate_tok_s",
                  "prefill_tok_s", "weights_bytes", "kv_bytes", "gpu_bytes", "host_bytes", "storage_bytes",
                  "max_context", "max_batch", "bottleneck")


def _model_arg(model) -> tuple:
    """(the model, its catalog id): the sweep engine plan runs on names catalog models only."""
    m = get_model(model)
    if m.id not in model_ids() or m.stored is not None:
        raise MoesimError(f"plan runs the sweep engine, which takes catalog models, and {m.id} was read from "
                          "files: `moesim fit PATH` gives its memory, speed and runtime settings", "model")
    return m, m.id


def default_kv_dtypes(runtime) -> list:
    if runtime is None or runtime.llama_cpp_family:
        return list(LLAMA_KV)
    if runtime.family == "served":
        return list(SERVED_KV)
    return ["auto"]


def default_placements(m, machine, runtime) -> list:
    """The runtime's own choice per context, and for llama.cpp on a discrete GPU the layouts around it:
    all on the GPU, every / the first N layers' routed experts in host RAM, CPU only."""
    if not (runtime is None or runtime.llama_cpp_family) or machine.unified or machine.n_gpus == 0:
        return ["auto"]
    out = ["auto", "all-gpu", "cpu-only"]
    if m.n_experts:
        L = m.n_layers
        steps = sorted({max(1, round(L * i / N_CPU_MOE_STEPS)) for i in range(1, N_CPU_MOE_STEPS)} - {L})
        out += ["experts-cpu"] + [f"n-cpu-moe={n}" for n in steps]
    return out


def default_contexts(m) -> list:
    """Powers of two from 4096 up to the trained maximum, and the maximum itself."""
    top = m.max_context
    out = [c for c in (2 ** k for k in range(12, 31)) if c < top]
    return out + [top] if top >= 1 else [4096]


def _check_contexts(contexts, m) -> list:
    if contexts is None:
        return default_contexts(m)
    if isinstance(contexts, int):
        contexts = [contexts]
    out = sorted({check_count(c, "context", maximum=m.max_context) for c in contexts})
    if len(out) > MAX_PLAN_CONTEXTS:
        raise MoesimError(f"{len(out)} contexts; a plan takes at most {MAX_PLAN_CONTEXTS}", "context")
    return out


def _rows(table) -> list:
    cols = {k: table[k] for k in _POINT_COLUMNS}
    out = []
    for i in range(len(table)):
        row = {}
        for k, col in cols.items():
            v = col[i]
            row[k] = v.item() if hasattr(v, "item") else v
        out.append(row)
    return out


def _placement_rank(p: str) -> int:
    """Simpler layouts first when two configurations tie exactly."""
    order = ("all-gpu", "unified", "n-cpu-moe", "experts-cpu", "gpu-experts", "layers-gpu", "cpu-only")
    kind = p.split("=")[0]
    return order.index(kind) if kind in order else len(order)


def pareto(points: list, keys=OBJECTIVES) -> list:
    """The points no other point dominates (>= in every key, > in one); of exact ties, the first."""
    front = []
    for i, p in enumerate(points):
        dominated = False
        for j, q in enumerate(points):
            if i == j:
                continue
            ge = all(q[k] >= p[k] for k in keys)
            if ge and (any(q[k] > p[k] for k in keys) or j < i):
                dominated = True
                break
        if not dominated:
            front.append(p)
    return front


def _best_per_configuration(rows: list) -> list:
    """Of the rows with one quant, KV dtype and context, the fastest (placement is the free choice there:
    the others at that point are dominated); ties go to the simpler layout."""
    best: dict = {}
    for r in rows:
        key = (r["quant"], r["kv_dtype"], r["context"], r["runtime"])
        rank = (-r["decode_tok_s"], _placement_rank(r["placement"]), r["placement"])
        if key not in best or rank < best[key][0]:
            best[key] = (rank, r)
    return [r for _, r in best.values()]


def plan(model, machine, quants=None, kv_dtypes=None, contexts=None, placements=None, runtime=None,
         batch: int = 1, threads: int | None = None) -> dict:
    """The Pareto front of decode tok/s, context, bits per weight and KV bits over quant x placement x KV
    dtype x context for *model* on *machine* (configurations that fit), each point with ``advice``: the
    runtime's settings that realise it (analysis.advice.launch).

    Defaults follow the runtime: llama.cpp (also when *runtime* is None, with GGUF quants) sweeps the GGUF
    ladder, f16 / q8_0 / q4_0 KV and the layouts of :func:`default_placements`; vLLM / SGLang the
    checkpoint's own format (and fp8 at load) with bf16 / fp8 KV, all on the GPU. *contexts* default to
    powers of two up to the trained maximum. Returns {model, machine, runtime, batch, objectives,
    evaluated, fitting, points}, the points fastest first."""
    from .sweep import sweep
    m, model_name = _model_arg(model)
    machine = as_machine(machine)
    batch = check_count(batch, "batch", maximum=MAX_BATCH)
    rt = get_runtime(runtime, model=m.id) if runtime is not None else None
    quants = list(quants) if quants else default_quant_names(m, machine, rt)
    kv_dtypes = list(kv_dtypes) if kv_dtypes else default_kv_dtypes(rt)
    placements = list(placements) if placements else default_placements(m, machine, rt)
    contexts = _check_contexts(contexts, m)
    table = sweep(models=[model_name], quants=quants, machines=[machine], runtimes=[runtime or "auto"],
                  kv_dtypes=kv_dtypes, placements=placements, contexts=contexts, batches=[batch],
                  filter={"fits": True, "skip_inapplicable": True}, mode="analytic", threads=threads)
    rows = _rows(table)
    params = m.param_counts()[0]
    for r in rows:
        r["bits_per_weight"] = 8.0 * r["weights_bytes"] / params
        r["kv_bits"] = 8.0 * Q.kv_dtype_bytes(r["kv_dtype"])
    cands = sorted(_best_per_configuration(rows), key=lambda r: (-r["decode_tok_s"], -r["context"],
                                                                  -r["bits_per_weight"], -r["kv_bits"]))
    points = pareto(cands)
    for p in points:
        _attach_advice(p, m, machine, batch)
    return {"model": m.id, "machine": machine.describe(), "runtime": runtime or "auto", "batch": batch,
            "objectives": list(OBJECTIVES), "grid": {"quants": quants, "kv_dtypes": kv_dtypes,
                                                     "placements": placements, "contexts": contexts},
            "evaluated": _grid_size(quants, kv_dtypes, placements, contexts), "fitting": len(rows),
            "points": points}


def _grid_size(*axes) -> int:
    return math.prod(len(a) for a in axes)


def _attach_advice(point: dict, m, machine, batch: int) -> None:
    rt = get_runtime(point["runtime"], model=m.id)
    q = Q.resolve(point["quant"], m)
    p = parse_placement(point["placement"], m, machine)
    adv = launch(p, rt, m, machine, q, point["context"], point["kv_dtype"], batch)
    point["flags"] = adv["flags"]
    point["advice"] = adv
