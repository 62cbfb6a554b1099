"""An independent memory oracle: bytes per tier and tensor class, summed tensor by tensor.

The C kernel (``csrc/ms_memory.c``) and its transliteration (``reference/memory.py``) both work on the
per-layer byte arrays of ``engine/lower/memory.py``. This oracle does not: it walks the model's tensor
inventory (``Model.tensors`` with each tensor's bytes from the quant rules, ``spec.quants.assign``) and
puts every tensor, or for routed experts every expert's share of it, on a tier by the placement
rules written out below; it adds the KV cache / recurrent state from the spec's per-layer cache terms
(``Model.kv_terms``), the compute buffers of the configuration, and applies the fits rule.

It takes the placement as a :class:`~moesim.spec.placement.Placement` (names, not kernel codes) and
the scalar part of the kernel's configuration (capacities, buffers, KV dtype width, granularity:
the dict that ``engine.lower.memory.configure`` builds), so a test can give both sides one
configuration. Slow on purpose (a Python loop over tensors); for tests only.

The placement rules (DESIGN §4, ``--placement``):

- ``all-gpu`` / ``unified``: everything on the GPU tier (one pool on a unified machine);
- ``experts-cpu``: routed experts in host RAM, the rest on the GPU;
- ``n-cpu-moe=N``: the routed experts of layers 0..N-1 in host RAM (llama.cpp ``--n-cpu-moe``);
- ``gpu-experts=N``: N routed experts of every MoE layer on the GPU, the others in host RAM;
- ``layers-gpu=N``: the last N layers (all their tensors and caches) on the GPU, the others on the
  host; the output head stays on the GPU unless N = 0;
- ``cpu-only``: everything in host RAM, no GPU buffers;
- ``offload-cache=N``: every routed expert in host RAM, plus N cache slots per MoE layer on the GPU.

Embeddings sit with the output head when the runtime keeps them on the GPU, else in host RAM. MTP
modules (counted only when the configuration uses MTP) sit with the output head, with the KV /
state of their own attention per module.
"""
from __future__ import annotations

import math

from ...spec import quants as Q
from ...spec.models import Model
from ...spec.placement import Placement

TIERS = ("gpu", "host", "storage")
WEIGHT_CLASSES = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn", "embeddings",
                  "lm_head", "mtp")
CLASSES = WEIGHT_CLASSES + ("kv_cache", "state", "buffers")
_PER_LAYER = {"attention", "router", "shared_experts", "dense_ffn", "routed_experts"}


def _gpu_layers(model: Model, p: Placement) -> set:
    """Indices of the layers whose attention, dense parts and caches live on the GPU tier."""
    L = model.n_layers
    if p.kind == "cpu-only":
        return set()
    if p.kind == "layers-gpu":
        return {i for i in range(L) if i >= L - p.arg}
    return set(range(L))


def _routed_fractions(model: Model, p: Placement, layer: int, gpu_layers: set) -> tuple:
    """(fraction of the layer's routed-expert bytes on the GPU, fraction in host RAM)."""
    e = model.layers[layer].ffn.n_experts
    if p.kind in ("all-gpu", "unified"):
        return 1.0, 0.0
    if p.kind in ("experts-cpu", "cpu-only"):
        return 0.0, 1.0
    if p.kind == "n-cpu-moe":
        return (0.0, 1.0) if layer < p.arg else (1.0, 0.0)
    if p.kind == "gpu-experts":
        on = min(p.arg, e)
        return on / e, (e - on) / e
    if p.kind == "layers-gpu":
        return (1.0, 0.0) if layer in gpu_layers else (0.0, 1.0)
    if p.kind == "offload-cache":
        return min(p.arg, e) / e, 1.0
    raise ValueError(f"unknown placement {p.kind!r}")


def _cache_bytes(terms, context: int, kv_bytes: float) -> tuple:
    """(KV bytes, fixed state bytes) of one layer for one sequence at context C (KVTerms's formula)."""
    tokens = min(context, terms.cap) if terms.cap else context
    kv = (terms.elems * kv_bytes + terms.fixed_bytes) * tokens
    if terms.ratio:
        kv += (context // terms.ratio) * (terms.ratio_elems * kv_bytes + terms.ratio_fixed_bytes)
    return kv, terms.state_bytes


def _per_token(terms, kv_bytes: float) -> float:
    """d(KV bytes)/dC for large C: uncapped layers grow per token, compressed ones per ratio tokens."""
    v = 0.0
    if not terms.cap:
        v += terms.elems * kv_bytes + terms.fixed_bytes
    if terms.ratio:
        v += (terms.ratio_elems * kv_bytes + terms.ratio_fixed_bytes) / terms.ratio
    return v


def weight_placement(model: Model, quant, p: Placement, cfg: dict) -> dict:
    """{(class, tier): bytes} of the weights (context- and batch-independent)."""
    q = Q.resolve(quant, model)
    gpu_layers = _gpu_layers(model, p)
    head_tier = "host" if p.kind == "cpu-only" or (p.kind == "layers-gpu" and p.arg == 0) else "gpu"
    embed_tier = "gpu" if cfg["embed_on_gpu"] and head_tier == "gpu" else "host"
    out = {}

    def put(cls, tier, nb):
        out[(cls, tier)] = out.get((cls, tier), 0.0) + nb

    for t, _typ, nb in Q.assign(model, q, include_mtp=True):
        if t.cls == "mtp":
            if cfg["mtp"] and model.mtp_layers:
                put("mtp", head_tier, nb)
        elif t.cls == "embeddings":
            put("embeddings", embed_tier, nb)
            if model.tie_embeddings and cfg["head_copy"] > 0.0 and embed_tier != head_tier:
                put("lm_head", head_tier, nb)      # the tied head's second copy (TENSOR_DUPLICATED)
        elif t.cls == "lm_head":
            put("lm_head", head_tier, nb)
        elif t.cls in _PER_LAYER:
            if not 0 <= t.layer < model.n_layers:
                raise ValueError(f"tensor {t.name} of class {t.cls} has no layer")
            layer_tier = "gpu" if t.layer in gpu_layers else "host"
            if t.cls == "routed_experts":
                g, h = _routed_fractions(model, p, t.layer, gpu_layers)
                if g:
                    put(t.cls, "gpu", nb * g)
                if h:
                    put(t.cls, "host", nb * h)
            else:
                put(t.cls, layer_tier, nb)
        else:
            raise ValueError(f"tensor {t.name}: unknown class {t.cls!r}")
    return out


def memory(model: Model, quant, p: Placement, cfg: dict, context: int | None = None,
           batch: int | None = None) -> dict:
    """Bytes per (class, tier), tier totals, KV / state totals, KV bytes per token and the fits verdict.

    *cfg* is the scalar configuration (``engine.lower.memory.configure``); *context* and *batch*
    default to its own. Returns ``{"by_class": {(cls, tier): bytes}, "tier": {tier: bytes},
    "weights", "kv", "state", "kv_bytes_per_token", "fits": set of tiers ("" set = does not fit)}``.
    """
    context = cfg["context"] if context is None else context
    batch = cfg["batch"] if batch is None else batch
    gran = max(1, int(cfg["kv_granularity"]))
    c = -(-context // gran) * gran                       # the runtime allocates whole pages
    kvb = float(cfg["kv_bytes_per_elem"])
    n_gpus = int(cfg["n_gpus"])

    bc = {(k, t): 0.0 for k in CLASSES for t in TIERS}
    bc.update(weight_placement(model, quant, p, cfg))
    weights_on_gpu = sum(bc[(k, "gpu")] for k in WEIGHT_CLASSES) > 0

    gpu_layers = _gpu_layers(model, p)
    head_tier = "host" if p.kind == "cpu-only" or (p.kind == "layers-gpu" and p.arg == 0) else "gpu"
    kv_total = state_total = per_token = 0.0
    caches = [(layer, "gpu" if layer.index in gpu_layers else "host", 1) for layer in model.layers]
    if cfg["mtp"] and model.mtp_layers:
        caches.append((model.mtp_layer, head_tier, model.mtp_layers))
    for layer, tier, copies in caches:
        terms = model.kv_terms(layer)
        kv, st = _cache_bytes(terms, c, kvb)
        bc[("kv_cache", tier)] += kv * batch * copies
        bc[("state", tier)] += st * batch * copies
        kv_total += kv * batch * copies
        state_total += st * batch * copies
        per_token += _per_token(terms, kvb) * copies

    if n_gpus > 0 and weights_on_gpu:
        bc[("buffers", "gpu")] = n_gpus * (cfg["gpu_fixed"] + cfg["gpu_buf0"] + cfg["gpu_buf_ctx"] * c)
    bc[("buffers", "host")] = cfg["host_fixed"] + cfg["host_buf0"] + cfg["host_buf_ctx"] * c

    gpu = sum(bc[(k, "gpu")] for k in CLASSES)
    host = sum(bc[(k, "host")] for k in CLASSES)
    host_weights = sum(bc[(k, "host")] for k in WEIGHT_CLASSES)
    # mmap'd weights beyond host RAM page in from storage; caches and buffers cannot
    spill = 0.0
    if cfg["storage_spill"] and host > cfg["host_capacity"]:
        spill = host - cfg["host_capacity"]
        while host - spill > cfg["host_capacity"]:      # the subtraction can round one ulp above the capacity
            spill = math.nextafter(spill, math.inf)
        spill = min(spill, host_weights, cfg["storage_capacity"])
    tier = {"gpu": gpu, "host": host - spill, "storage": spill}
    return dict(by_class=bc, tier=tier, weights=sum(bc[(k, t)] for k in WEIGHT_CLASSES for t in ("gpu", "host")),
                kv=kv_total, state=state_total, kv_bytes_per_token=per_token,
                gpu_per_gpu=(one := sum(bc[(k, "gpu")] / float(w) for k, w in zip(CLASSES, cfg["gpu_ways"]))),
                fits=fits(tier, bc[("buffers", "host")], n_gpus, cfg["gpu_capacity"], cfg["host_capacity"], one))


def fits(tier: dict, host_buffers: float, n_gpus: int, gpu_capacity: float, host_capacity: float,
         gpu_one: float) -> set:
    """The fits rule: the tiers that hold the model, or the empty set when it does not fit.

    It fits when the busiest GPU's bytes (*gpu_one*: each class's GPU bytes over the ways the layout splits it,
    ``cfg["gpu_ways"]``) are within one GPU's capacity and what stays in host RAM within
    host RAM (the spill to storage is bounded by the storage size already). A GPU tier with bytes on a
    machine without GPUs never fits. The verdict names every tier holding something: the GPU when it
    holds bytes, the host when it holds more than its buffers, storage when weights spilled there; a
    configuration with nothing anywhere but host buffers counts as host.
    """
    if tier["gpu"] > 0 and n_gpus == 0:
        return set()
    if gpu_one > gpu_capacity or tier["host"] > host_capacity:
        return set()
    out = set()
    if tier["gpu"] > 0:
        out.add("gpu")
    if tier["host"] - host_buffers > 0:
        out.add("host")
    if tier["storage"] > 0:
        out.add("storage")
    return out or {"host"}
