"""The numbers behind ``moesim plot``: each function returns a plain dict (series, labels, title) that
:mod:`moesim.report.plots` draws. Grids come from the sweep engine (``sweep(..., mode="analytic")`` held
in memory), so a figure shows the same numbers a sweep file would; the time breakdown, which the sweep
does not tabulate, comes from ``simulate(..., mode="analytic")``.

A configuration that does not fit is a gap (NaN) in its series, never a number.
"""
from __future__ import annotations

import numpy as np

from ..errors import MoesimError
from ..ingest import model as get_model
from ..spec.hardware import Machine, as_machine
from ..spec.limits import MAX_MONTECARLO_WORK
from .fit import DEFAULT_FIT_QUANTS
from .simulate import simulate
from .sweep import sweep


HEATMAP_METRICS = {"max_context": "max context (tokens)", "decode_tok_s": "decode tok/s per sequence"}
CACHE_POLICIES = {"analytic": ("lru", "lfu", "static"), "montecarlo": ("lru", "lfu", "static", "belady")}


def _model(model):
    return get_model(model) if isinstance(model, str) else model


def _machine(machine) -> Machine:
    """A Machine from a Machine, a catalog id or a dict of machine() keywords; the sweep labels it by id."""
    return machine if isinstance(machine, Machine) else as_machine(machine)


def _masked(table, column: str) -> np.ndarray:
    """A sweep column with configurations that do not fit set to NaN."""
    y = np.asarray(table[column], dtype=float).copy()
    y[np.asarray(table["fits"]) == "no"] = np.nan
    return y


def _doublings(lo: int, hi: int) -> list:
    """lo, 2 lo, 4 lo, ... below hi, then hi: round tick labels (512, 1k, 2k, ...) up to the end point."""
    out, x = [], max(1, int(lo))
    while x < hi:
        out.append(x)
        x *= 2
    return out + [int(hi)]


def _describe(m: Machine) -> str:
    return f"{m.id}: {m.describe()}"


def _check_list(values, field: str, minimum: int = 1) -> list:
    values = list(values)
    if len(values) < minimum:
        raise MoesimError(f"give at least {minimum} value(s)", field)
    return values


# -------------------------------------------------------------------------------------- context
def context_data(model, machine, quants=None, contexts=None, runtime: str = "auto", batch: int = 1) -> dict:
    """Decode tok/s per sequence vs context depth, one series per quantization (the runtime's own
    placement per point)."""
    m = _model(model)
    quants = _check_list(quants or [q for q in DEFAULT_FIT_QUANTS if q != "BF16"], "quant")
    if contexts is None:
        contexts = _doublings(min(512, int(m.max_context or 32768)), int(m.max_context or 32768))
    contexts = _check_list(contexts, "contexts")
    mach = _machine(machine)
    t = sweep(models=[m.id], quants=quants, machines=[mach], contexts=contexts, batches=[batch], runtimes=[runtime],
              mode="analytic")
    series = []
    for q in quants:
        sel = np.asarray(t["quant"]) == q
        order = np.argsort(np.asarray(t["context"])[sel])
        series.append({"label": q, "x": np.asarray(t["context"])[sel][order].tolist(),
                       "y": _masked(t, "decode_tok_s")[sel][order].tolist()})
    return {"kind": "context", "title": f"{m.id} on {mach.id}: decode speed vs context",
            "subtitle": _describe(mach) + f"; batch {batch}; placement: what the runtime would fit, per point",
            "xlabel": "context (tokens in the KV cache)",
            "ylabel": "decode tok/s per sequence", "xscale": "log", "series": series}


# -------------------------------------------------------------------------------------- heatmap
def heatmap_data(models, machines, metric: str = "max_context", quant: str = "Q4_K_M", context: int = 4096,
                 runtime: str = "auto") -> dict:
    """models x machines: the largest context that fits, or decode tok/s at *context* (NaN: no fit)."""
    if metric not in HEATMAP_METRICS:
        raise MoesimError(f"unknown metric {metric!r}; known: {', '.join(HEATMAP_METRICS)}", "metric")
    models = _check_list(models, "models")
    machines = _check_list(machines, "machines")
    machs = [_machine(x) for x in machines]
    ids = [x.id for x in machs]
    if len(set(ids)) != len(ids):
        raise MoesimError(f"machines must differ: {', '.join(ids)}", "machines")
    t = sweep(models=models, quants=[quant], machines=machs, contexts=[context], runtimes=[runtime],
              mode="analytic")
    values = np.full((len(models), len(machines)), np.nan)
    mids = [_model(x).id for x in models]
    col = _masked(t, metric)
    if metric == "max_context":         # max_context is a capacity: it exists even when *context* does not fit
        col = np.asarray(t["max_context"], dtype=float)
        col[col <= 0] = np.nan
    fits = [["" for _ in ids] for _ in mids]
    for i, mid in enumerate(mids):
        for j, lab in enumerate(ids):
            sel = (np.asarray(t["model"]) == mid) & (np.asarray(t["machine"]) == lab)
            if sel.any():
                values[i, j] = col[sel][0]
                fits[i][j] = str(np.asarray(t["fits"])[sel][0])
    return {"kind": "heatmap", "metric": metric, "rows": mids, "cols": ids,
            "values": values.tolist(), "fits": fits, "title": f"{HEATMAP_METRICS[metric]}, {quant}"
            + (f" at context {context}" if metric != "max_context" else ""),
            "xlabel": "machine", "ylabel": "model", "colorbar": HEATMAP_METRICS[metric]}


# ------------------------------------------------------------------------------------ breakdown
def default_placements(model, machine=None) -> list:
    """The bars of a breakdown: on a discrete GPU all on it, half / all the experts in host RAM, an expert
    cache and CPU only; on a unified pool the pool and its CPU; without a GPU the CPU alone."""
    m = _model(model)
    if machine is not None and machine.unified:
        return ["unified", "cpu-only"]
    if machine is not None and machine.n_gpus == 0:
        return ["cpu-only"]
    n = len(m.moe_layers)
    out = ["all-gpu"]
    if n:
        out += [f"n-cpu-moe={n // 2}", "experts-cpu", "offload-cache"]
    return out + ["cpu-only"]


def breakdown_data(model, machine, placements=None, quant: str = "Q4_K_M", context: int = 4096,
                   runtime: str | None = None) -> dict:
    """Milliseconds per decoded token by phase (attention, experts, transfer, ...), one bar per placement."""
    m = _model(model)
    mach = _machine(machine)
    placements = _check_list(placements or default_placements(m, mach), "placement")
    bars, phases, tok_s = [], {}, []
    for i, p in enumerate(placements):
        d = simulate(m, mach, quant=quant, context=context, placement=p, runtime=runtime, mode="analytic").to_dict()
        fits = d["fits"] != "no"
        bars.append(d["placement"] + ("" if fits else " (no fit)"))
        tok_s.append(d["decode_tok_s"] if fits else float("nan"))
        for phase, sec in d["breakdown"]["by_phase"].items():
            phases.setdefault(phase, [0.0] * len(placements))[i] = 1e3 * sec if fits else 0.0
    phases = {k: v for k, v in phases.items() if any(x > 0 for x in v)}
    return {"kind": "breakdown", "title": f"{m.id} {quant} on {mach.id}: where a decode step's time goes",
            "subtitle": _describe(mach) + f"; context {context}", "bars": bars, "stacks": phases,
            "tok_s": tok_s, "xlabel": "placement", "ylabel": "ms per decoded token"}


# ---------------------------------------------------------------------------------------- cache
def cache_data(model, machine, sizes=None, policies=None, quant: str = "Q4_K_M", context: int = 4096,
               mode: str = "analytic", tokens: int = 128) -> dict:
    """GPU expert-cache hit rate vs cache slots per MoE layer (placement offload-cache=N), per policy."""
    m = _model(model)
    if not m.moe_layers:
        raise MoesimError(f"{m.id} is dense: it has no experts to cache", "model")
    if mode not in CACHE_POLICIES:
        raise MoesimError(f"unknown mode {mode!r}; known: {', '.join(CACHE_POLICIES)}", "mode")
    ffn = m.moe_layers[0].ffn
    if sizes is None:
        sizes = _doublings(ffn.top_k, ffn.n_experts)
    sizes = _check_list(sizes, "cache_sizes")
    bad = [n for n in sizes if not isinstance(n, (int, np.integer)) or not 0 <= n <= ffn.n_experts]
    if bad:
        raise MoesimError(f"cache sizes must be in [0, {ffn.n_experts}] slots per layer ({m.id} has "
                          f"{ffn.n_experts} experts per MoE layer), got {bad[0]!r}", "cache_sizes")
    policies = _check_list(policies or CACHE_POLICIES[mode], "policy")
    if mode == "montecarlo":
        _check_figure_work(len(sizes) * len(policies), tokens, len(m.moe_layers), ffn.top_k)
    mach = _discrete_gpu(machine, "cache")
    t = sweep(models=[m.id], quants=[quant], machines=[mach], contexts=[context], mode=mode, tokens=tokens,
              placements=[f"offload-cache={n}" for n in sizes], policies=policies)
    series = _series(t, _masked(t, "expert_hit_rate"), "policy", policies, sizes, "offload-cache={}")
    return {"kind": "cache", "title": f"{m.id}: expert-cache hit rate vs cache size ({mode})",
            "subtitle": f"{ffn.n_experts} experts, top-{ffn.top_k}; {mach.id}, {quant}",
            "xlabel": "GPU cache slots per MoE layer (experts)", "ylabel": "expert hit rate", "xscale": "log",
            "ylim": [0.0, 1.0], "series": series}


def _series(t, values: np.ndarray, label_col: str, labels, xs, placement: str) -> list:
    """One line per label of column *label_col*: *values* at the placement each x names (a format
    string), NaN where the sweep has no such row."""
    lab, pl = np.asarray(t[label_col]), np.asarray(t["placement"])
    out = []
    for label in labels:
        ys = []
        for x in xs:
            sel = (lab == label) & (pl == placement.format(x))
            ys.append(float(values[sel][0]) if sel.any() else float("nan"))
        out.append({"label": label, "x": list(xs), "y": ys})
    return out


def _discrete_gpu(machine, figure: str) -> Machine:
    """The machine of a figure whose points move experts between a GPU and host RAM."""
    mach = _machine(machine)
    if mach.unified or mach.n_gpus == 0:
        where = f"{mach.id} has one unified pool" if mach.unified else f"{mach.id} has no GPU"
        raise MoesimError(f"the {figure} figure moves experts between a GPU and host RAM, and {where}: give a "
                          "machine with a discrete GPU (--gpu ID)", "machine")
    return mach


def _check_figure_work(points: int, tokens: int, layers: int, top_k: int) -> None:
    """A Monte Carlo figure is one call: its points together stay within simulate's bound on one call's
    work (steps x layers x expert choices), refused before the sweep runs."""
    work = points * tokens * layers * max(1, top_k)
    if work > MAX_MONTECARLO_WORK:
        raise MoesimError(f"{points} points x {tokens:,} steps x {layers} MoE layers x top-{top_k} is {work:,} "
                          f"expert choices, over the {MAX_MONTECARLO_WORK:,} one call may take; use fewer "
                          "--tokens, sizes or policies, or --mode analytic", "tokens")


# -------------------------------------------------------------------------------- offload cliff
def offload_cliff_data(model, machine, quants=None, counts=None, context: int = 4096, runtime: str = "auto") -> dict:
    """Decode tok/s vs llama.cpp's --n-cpu-moe N (the experts of the first N MoE layers in host RAM)."""
    m = _model(model)
    n = len(m.moe_layers)
    if not n:
        raise MoesimError(f"{m.id} is dense: --n-cpu-moe moves no experts", "model")
    if counts is None:
        counts = sorted({int(round(x)) for x in np.linspace(0, n, min(n + 1, 13))})
    counts = _check_list(counts, "n_cpu_moe")
    bad = [c for c in counts if not isinstance(c, (int, np.integer)) or not 0 <= c <= n]
    if bad:
        raise MoesimError(f"--n-cpu-moe counts must be in [0, {n}] ({m.id} has {n} MoE layers), got {bad[0]!r}",
                          "n_cpu_moe")
    quants = _check_list(quants or ["Q4_K_M"], "quant")
    mach = _discrete_gpu(machine, "offload-cliff")
    t = sweep(models=[m.id], quants=quants, machines=[mach], contexts=[context], runtimes=[runtime],
              placements=[f"n-cpu-moe={c}" for c in counts], mode="analytic")
    series = _series(t, _masked(t, "decode_tok_s"), "quant", quants, counts, "n-cpu-moe={}")
    return {"kind": "offload-cliff", "title": f"{m.id} on {mach.id}: the offload cliff",
            "subtitle": _describe(mach) + f"; context {context}",
            "xlabel": f"--n-cpu-moe N (MoE layers of {n} with experts in host RAM)",
            "ylabel": "decode tok/s per sequence", "xscale": "linear", "series": series}


def serving_data(model, machine, levels, **kw) -> dict:
    """``plot serving``: serve-sim's concurrency sweep (analysis.serve.sweep_concurrency) as a curve of
    tok/s per GPU against tok/s per user, its Pareto points marked."""
    from .serve import sweep_concurrency
    curve = sweep_concurrency(model, machine, levels, **kw)
    w = curve["workload"]
    return dict(kind="serving", points=curve["points"],
                title=f"{getattr(model, 'id', model)}: throughput vs interactivity, {w.get('isl', 1024)} in / "
                      f"{w.get('osl', 256)} out", subtitle=f"{getattr(machine, 'id', machine)}; closed loop at each concurrency (moesim serve-sim)",
                xlabel="tok/s per user (1 / TPOT)", ylabel="output tok/s per GPU")

