"""The automatic-placement rule lowered for the kernel: the candidate placements a runtime's own fitting
chooses among, in its order of preference, and the rule code (``SWEEP_*``) the C ``choose()`` applies.

llama.cpp ``--fit``: everything on the GPU if it fits, else the fewest layers' routed experts in host
RAM (``--n-cpu-moe``), else fewer whole layers on the GPU, then CPU only; ktransformers: as many
experts per layer on the GPU as fit; served runtimes: all on the GPU or nothing.
"""
from __future__ import annotations

import functools

import numpy as np

from ... import _lowering_cache
from ...spec.hardware import Machine
from ...spec.placement import Placement, parse as parse_placement
from ..codes import (CLASS_BUFFERS, CLASS_MTP, CLASS_ROUTED, SWEEP_AUTO_KT, SWEEP_AUTO_LLAMA, SWEEP_FIXED, TIER_GPU,
                     TIER_HOST, placement_code)


def placement_candidates(m, mach: Machine, rt, spec: str) -> tuple:
    """(candidate placements, rule) the group's configurations choose from (moesim.fit.auto_placement
    resolved per configuration in C for llama.cpp and ktransformers)."""
    if spec != "auto":
        return _one(parse_placement(spec, m, mach)), SWEEP_FIXED
    if mach.unified:
        return _one(Placement("unified")), SWEEP_FIXED
    if mach.n_gpus == 0:
        return _one(Placement("cpu-only")), SWEEP_FIXED
    L, E = m.n_layers, m.n_experts
    if rt.family == "ktransformers" and E:
        return _auto_candidates("ktransformers", L, E), SWEEP_AUTO_KT
    if not rt.llama_cpp_family:
        return _one(Placement("all-gpu")), SWEEP_FIXED
    return _auto_candidates("llama.cpp", L, E), SWEEP_AUTO_LLAMA


@functools.lru_cache(maxsize=1024)
def _one(p: Placement) -> tuple:
    """A fixed placement as its one-candidate tuple, one object per placement value: the tables keyed on a
    candidate tuple's identity (:func:`_by_identity`) find it for every group, machine and sweep naming it
    (a list built per call missed them every time)."""
    return (p,)


@functools.lru_cache(maxsize=256)
def _auto_candidates(family: str, L: int, E: int) -> tuple:
    """An automatic rule's candidates for L layers of E experts, one tuple per shape: the groups of every
    model of that shape share one object, so the tables keyed on it (:func:`_placed`) find it by identity."""
    if family == "ktransformers":
        return tuple([Placement("gpu-experts", k) for k in range(E + 1)] + [Placement("experts-cpu")])
    cands = [Placement("all-gpu")]
    if E:
        cands += [Placement("n-cpu-moe", n) for n in range(L + 1)]
    cands += [Placement("layers-gpu", k) for k in range(L + 1)] + [Placement("cpu-only")]
    if E:
        cands.append(Placement("experts-cpu"))
    return tuple(cands)


# =============================================================================== the C choose()'s tables
# The ms_sweep_mem_t fields of one configuration (csrc/moesim.h) that do not vary with context or batch.
MEM_CFG_KEYS = ("kv_bytes_per_elem", "mtp", "n_gpus", "gpu_capacity", "host_capacity", "storage_capacity",
                "storage_spill", "embed_on_gpu", "head_copy", "kv_granularity", "gpu_fixed", "gpu_buf0", "gpu_buf_ctx",
                "host_fixed", "host_buf0", "host_buf_ctx", "gpu_ways")
_WEIGHT_ROWS = tuple(range(CLASS_MTP + 1))   # the weight classes, as ms_memory.c sums them


# the configuration keys candidate_weights sets itself; the others are part of its cache key
_PROBE_KEYS = frozenset(("context", "batch", "mtp", "placement", "placement_arg", "n_gpus", "gpu_fixed", "gpu_buf0",
                         "gpu_buf_ctx", "gpu_capacity", "host_capacity", "storage_spill"))


def candidate_weights(low, cands, cfg: dict, mtp: int = 0, engine: str = "c") -> dict:
    """Weight bytes per tier of each candidate placement (:func:`_candidate_weights`), cached on
    everything they depend on: a sweep's groups of one model and quant on many machines share them."""
    return {k: v.tolist() for k, v in _weights(low, tuple(cands), cfg, mtp, engine).items()}


def _weights(low, cands: tuple, cfg: dict, mtp: int, engine: str = "c") -> dict:
    """:func:`_candidate_weights`' read-only arrays for candidates *cands* under configuration *cfg*."""
    rest = tuple(sorted((k, tuple(v) if k == "gpu_ways" else v) for k, v in cfg.items() if k not in _PROBE_KEYS))
    return _candidate_weights(low, _placed(cands), rest, 1 if mtp else 0, engine)


def _placed(cands: tuple) -> tuple:
    """((placement code, argument) of each candidate)."""
    return _by_identity(cands, (), lambda: tuple((placement_code(p), max(0, p.arg)) for p in cands))


def _by_identity(cands: tuple, extra: tuple, build):
    """A table of the candidate tuple *cands* (and the hashable *extra*), cached on the tuple's identity:
    hashing and comparing a hundred placements costs more than the tables keyed on them (automatic
    rules share one tuple per model shape, placement_candidates)."""
    key = (id(cands),) + extra
    hit = _BY_CANDS.get(key)
    if hit is not None and hit[0] is cands:
        return hit[1]
    value = build()
    if len(_BY_CANDS) > 4096:
        _BY_CANDS.clear()
    _BY_CANDS[key] = (cands, value)             # holds the tuple, so its id stays its own
    return value


_BY_CANDS: dict = {}


@functools.lru_cache(maxsize=4096)
def _candidate_weights(low, placed: tuple, rest: tuple, mtp: int, engine: str) -> dict:
    """Weight bytes per tier of each candidate placement, from the memory kernel (ms_memory.c account(),
    through :func:`moesim.engine.memory.evaluate`), cached (read-only arrays of the C dtypes): the configuration items
    ``rest`` (the all-GPU one's: its embeddings rule) with each candidate's (placement code, argument) of
    ``placed``, at context 1 and batch 1, MTP modules loaded when
    *mtp* (on the output head's tier, as the kernel counts them).

    ``w_gpu`` / ``w_host``: the weight classes summed per tier in the kernel's class order; ``w_gpu_one``:
    the busiest GPU's share of them (each class over its ``gpu_ways``, ms_gpu_one's order);
    ``routed_host``: routed experts in host RAM; ``any_gpu``: whether the kernel places anything on the
    GPU, which is exactly when it reserves GPU compute buffers -- read from a probe of one GPU with one
    byte of fixed buffer (weights do not depend on GPU count, buffers or capacities; capacities of 0
    make the kernel's max-context/max-batch searches stop at once)."""
    pkey = _tier_weights_key(low, placed, dict(rest), mtp) if engine == "c" else None
    if pkey is not None:
        packed = _lowering_cache.get("tier_weights", pkey)
        if packed is not None:
            return _unpack_weights(packed)
    out = _kernel_weights(low, placed, rest, mtp, engine)
    if pkey is not None:
        _lowering_cache.put("tier_weights", pkey, (np.stack([out["w_gpu"], out["w_host"], out["routed_host"]]),
                                                   out["any_gpu"]))
    return out


def _tier_weights_key(low, placed: tuple, rest: dict, mtp: int) -> "tuple | None":
    """The persistent lowering cache's key of :func:`_candidate_weights`' value, or None where it is not
    kept: the weights per tier depend on the lowered model, the candidates, whether embeddings may sit on
    the GPU and whether MTP modules load -- nothing of a machine (context, batch, capacities and buffers
    are the probe's own). The busiest GPU's share depends on the split (gpu_ways): kept only for one
    way per class, where it is w_gpu itself (each class divided by 1.0, summed in the same order)."""
    from .memory import lowering_key_of
    key = lowering_key_of(low)
    if key is None or any(float(w) != 1.0 for w in rest["gpu_ways"]):
        return None
    return key + (_placed_digest(placed), int(rest["embed_on_gpu"]), float(rest["head_copy"]), int(mtp))


def _placed_digest(placed: tuple) -> str:
    """A short exact name of a candidate list (the automatic rules' lists run to hundreds of entries)."""
    hit = _DIGESTS.get(placed)
    if hit is None:
        import hashlib
        hit = _DIGESTS[placed] = hashlib.sha256(repr(placed).encode()).hexdigest()[:32]
    return hit


_DIGESTS: dict = {}


def _unpack_weights(packed: tuple) -> dict:
    sums, any_gpu = packed
    sums.flags.writeable = False
    any_gpu.flags.writeable = False
    return {"w_gpu": sums[0], "w_host": sums[1], "w_gpu_one": sums[0], "routed_host": sums[2], "any_gpu": any_gpu}


def _kernel_weights(low, placed: tuple, rest: tuple, mtp: int, engine: str) -> dict:
    """:func:`_candidate_weights` from the memory kernel (or its twin)."""
    from ..memory import evaluate
    from .memory import config_columns
    n = len(placed)
    cols = config_columns(dict(rest), n)
    cols.update(context=np.ones(n, dtype=np.int64), batch=np.ones(n, dtype=np.int64),
                mtp=np.full(n, 1 if mtp else 0, dtype=np.int64),
                placement=np.array([c for c, _ in placed], dtype=np.int64),
                placement_arg=np.array([a for _, a in placed], dtype=np.int64),
                n_gpus=np.ones(n, dtype=np.int64), gpu_fixed=np.ones(n), gpu_buf0=np.zeros(n), gpu_buf_ctx=np.zeros(n),
                gpu_capacity=np.zeros(n), host_capacity=np.zeros(n), storage_spill=np.zeros(n, dtype=np.int64))
    bc = np.asarray(evaluate(low, cols, engine=engine)["by_class"], dtype=np.float64)
    ways = cols["gpu_ways"]
    w_gpu, w_host, w_one = np.zeros(n), np.zeros(n), np.zeros(n)
    for k in _WEIGHT_ROWS:                       # class by class, in the kernel's order (the same sums)
        w_gpu += bc[:, k, TIER_GPU]
        w_host += bc[:, k, TIER_HOST]
        w_one += bc[:, k, TIER_GPU] / ways[:, k]
    return {"w_gpu": _frozen(w_gpu), "w_host": _frozen(w_host), "w_gpu_one": _frozen(w_one),
            "routed_host": _frozen(np.array(bc[:, CLASS_ROUTED, TIER_HOST], dtype=np.float64)),
            "any_gpu": _frozen((bc[:, CLASS_BUFFERS, TIER_GPU] > 0.0).astype(np.int32))}


def _frozen(a: np.ndarray) -> np.ndarray:
    """A cached table shared by every group that reads it: read-only."""
    a.flags.writeable = False
    return a


def _kv_kinds(low, kvb: float, L: int) -> tuple:
    """Layers grouped by their cache bytes rule: (kind rows, kind of each layer)."""
    kinds, kind_of = {}, np.empty(L, dtype=np.int64)
    for l in range(L):
        key = (float(low.kv_elems[l] * kvb + low.kv_fixed[l]), int(low.kv_cap[l]), int(low.kv_ratio[l]),
               float(low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]), float(low.kv_state[l]))
        kind_of[l] = kinds.setdefault(key, len(kinds))
    return list(kinds), kind_of


def _layer_counts(kind_of: np.ndarray, K: int, L: int, n_mtp: int) -> tuple:
    """Layers of each kind (count) and, per KV layout, those on the GPU: layout 0 every layer, 1 none
    (cpu-only), 2 + k layers-gpu = k. MTP modules cache like the last layer, on the output head's tier
    (host for cpu-only and layers-gpu = 0), as ms_memory.c counts them."""
    count = np.bincount(kind_of, minlength=K).astype(np.int32)
    gpu_count = np.zeros((L + 3, K), dtype=np.int32)
    gpu_count[0] = count
    for k in range(1, L + 1):
        gpu_count[2 + k] = np.bincount(kind_of[L - k:], minlength=K)
    if n_mtp:
        last = kind_of[L - 1]
        count[last] += n_mtp
        gpu_count[0, last] += n_mtp
        gpu_count[3:, last] += n_mtp
    return count, gpu_count


@functools.lru_cache(maxsize=1024)
def _kv_layout(low, kvb: float, n_mtp: int) -> tuple:
    """(cache-rule rows, layers per rule, per-layout GPU layer counts) of a lowered model at one KV
    dtype's bytes per element (shared by every machine and placement of a sweep). They read the
    lowered model's cache columns alone, which every quant of a model shares (lower.memory._kv_columns):
    built once per distinct set of columns, so a model's quants share one layout."""
    from .memory import kv_columns_key
    key = (kv_columns_key(low), kvb, n_mtp)
    hit = _KV_LAYOUTS.get(key)
    if hit is None:
        hit = _KV_LAYOUTS[key] = _build_kv_layout(low, kvb, n_mtp)   # a race builds equal tables twice
    return hit


_KV_LAYOUTS: dict = {}                      # (cache columns, KV bytes per element, MTP layers) -> layout


def _build_kv_layout(low, kvb: float, n_mtp: int) -> tuple:
    L = low.n_layers
    rows, kind_of = _kv_kinds(low, kvb, L)
    count, gpu_count = _layer_counts(kind_of, len(rows), L, n_mtp)
    cols = {name: _frozen(np.array([r[i] for r in rows], dtype=dt)) for i, (name, dt) in enumerate(_KV_ROW_COLUMNS)}
    return cols, _frozen(count), _frozen(gpu_count)


# the cache-rule rows of _kv_kinds, as ms_sweep_mem_t's columns
_KV_ROW_COLUMNS = (("per_token", np.float64), ("cap", np.int64), ("ratio", np.int64), ("ratio_bytes", np.float64),
                   ("state", np.float64))


def _candidate_columns(cands: tuple, labels: "tuple | None", cpu_machine: bool) -> tuple:
    """The machine-independent columns of the candidate placements (code, argument, KV layout, memory
    configuration row, output label) and the first index of each placement kind."""
    pl = {k: [] for k in ("code", "arg", "layout", "cfg", "label")}
    first = {"all-gpu": -1, "n-cpu-moe": -1, "layers-gpu": -1, "cpu-only": -1, "experts-cpu": -1, "gpu-experts": -1}
    for j, p in enumerate(cands):
        if first.get(p.kind, 0) == -1:
            first[p.kind] = j
        pl["code"].append(placement_code(p))
        pl["arg"].append(max(0, p.arg))
        pl["layout"].append(1 if p.kind == "cpu-only" else (2 + p.arg if p.kind == "layers-gpu" else 0))
        pl["cfg"].append(1 if p.kind == "cpu-only" or cpu_machine else 0)
        pl["label"].append(labels[j] if labels is not None else j)
    dtypes = {"code": np.int32, "arg": np.int64, "layout": np.int32, "cfg": np.int32, "label": np.int32}
    return {k: _frozen(np.array(v, dtype=dtypes[k])) for k, v in pl.items()}, first


def memory_tables(m, low, machine: Machine, rt, kv: str, cands: list, rule: int, mtp: int = 0,
                  labels=None, fits_label=None, configs=None) -> dict:
    """The group table of ms_sweep_mem_t (what the C ``choose()`` and the sweep memory loop read) for one
    model, quant, machine, runtime and KV dtype over candidate placements, MTP modules loaded when
    *mtp*. *labels*: each candidate's output code (default its index); *fits_label*: the fits-bits ->
    output code map (default all 0); *configs*: :func:`memory_configs` of these arguments where the caller
    keeps them (a sweep's quants of one model share them). Used by sweeps (analysis.sweep.group) and fit's
    auto placement."""
    from ...spec import quants as Q
    L = m.n_layers
    n_mtp = int(low.mtp_layers) if mtp else 0
    kv_rows, count, gpu_count = _kv_layout(low, Q.kv_dtype_bytes(kv), n_mtp)
    full, cfgs = configs if configs is not None else memory_configs(m, low, machine, rt, kv, n_mtp)
    cands = tuple(cands)
    w = _weights(low, cands, full[0], n_mtp)
    key = (None if labels is None else _labels(labels), machine.n_gpus == 0)
    skeleton, first = _by_identity(cands, key, lambda: _candidate_columns(cands, *key))
    pl = dict(skeleton)
    pl.update((k, w[k]) for k in ("any_gpu", "w_gpu", "w_host", "w_gpu_one", "routed_host"))
    fits = np.array(fits_label if fits_label is not None else [0] * 8, dtype=np.int32)
    return dict(kv_rows, count=count, gpu_count=gpu_count,
                max_context=int(low.max_context), cfg=cfgs, places=pl, rule=rule, n_layers=L, n_experts=m.n_experts,
                i_all_gpu=first["all-gpu"], i_n_cpu_moe=first["n-cpu-moe"], i_layers_gpu=first["layers-gpu"],
                i_cpu_only=first["cpu-only"], i_experts_cpu=first["experts-cpu"], i_gpu_experts=first["gpu-experts"],
                fits_label=fits)


def memory_configs(m, low, machine: Machine, rt, kv: str, n_mtp: int) -> tuple:
    """(the all-GPU and CPU-only configurations at context 1 and batch 1, their MEM_CFG_KEYS items
    checked and sealed, engine.glue.seal): ms_sweep_mem_t's two memory configurations, which do not
    depend on the quant."""
    from ..glue import seal
    from .memory import configure
    full = [configure(m, low, machine, rt, p, 1, 1, kv, 1 if n_mtp else 0) for p in (_ALL_GPU, _CPU_ONLY)]
    return full, [seal("ms_mem_config_t", {k: c[k] for k in MEM_CFG_KEYS}) for c in full]


_ALL_GPU, _CPU_ONLY = Placement("all-gpu"), Placement("cpu-only")


def _labels(labels) -> tuple:
    """Output codes as a hashable key."""
    if isinstance(labels, np.ndarray):
        return tuple(labels.tolist())
    return tuple(int(x) for x in labels)
