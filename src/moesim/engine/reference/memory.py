"""Pure-Python twin of ``csrc/ms_memory.c``: bytes per tier, fits, max context and batch."""
from __future__ import annotations

import math

import numpy as np

from ..._search import largest_true
from ..codes import (CLASS_ATTENTION, CLASS_BUFFERS, CLASS_DENSE, CLASS_EMBED, CLASS_HEAD, CLASS_KV, CLASS_MTP,
    CLASS_ROUTED, CLASS_ROUTER, CLASS_SHARED, CLASS_STATE, N_CLASSES, N_TIERS, PLACE_ALL_GPU, PLACE_CPU_ONLY,
    PLACE_EXPERTS_CPU, PLACE_GPU_EXPERTS, PLACE_LAYERS_GPU, PLACE_N_CPU_MOE, PLACE_OFFLOAD_CACHE, PLACE_UNIFIED,
    TIER_GPU, TIER_HOST, FITS_GPU, FITS_HOST, FITS_STORAGE)


def _layer_on_gpu(L, cfg, l):
    if cfg["placement"] == PLACE_CPU_ONLY:
        return False
    if cfg["placement"] == PLACE_LAYERS_GPU:
        return l >= L - cfg["placement_arg"]
    return True


def _experts_split(low, cfg, l):
    """(routed experts on GPU, routed experts in host RAM) for layer l."""
    e = int(low.n_experts[l])
    p, a = cfg["placement"], cfg["placement_arg"]
    if e == 0:
        return 0, 0
    if p in (PLACE_ALL_GPU, PLACE_UNIFIED):
        return e, 0
    if p in (PLACE_EXPERTS_CPU, PLACE_CPU_ONLY):
        return 0, e
    if p == PLACE_N_CPU_MOE:
        return (0, e) if l < a else (e, 0)
    if p == PLACE_GPU_EXPERTS:
        g = min(a, e)
        return g, e - g
    if p == PLACE_LAYERS_GPU:
        return (e, 0) if _layer_on_gpu(low.n_layers, cfg, l) else (0, e)
    if p == PLACE_OFFLOAD_CACHE:
        return min(a, e), e
    raise ValueError(p)


def _cache(low, l, c, kvb):
    cap = int(low.kv_cap[l])
    tokens = min(c, cap) if cap > 0 else c
    kv = (low.kv_elems[l] * kvb + low.kv_fixed[l]) * tokens
    ratio = int(low.kv_ratio[l])
    if ratio > 0:
        kv += (c // ratio) * (low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l])
    return kv, float(low.kv_state[l])


def gpu_one(cfg, bc) -> float:
    """ms_gpu_one (csrc/ms_internal.h): the busiest GPU's bytes, each class's GPU bytes over its gpu_ways."""
    one = 0.0
    for k in range(N_CLASSES):
        one += bc[k][TIER_GPU] / float(cfg["gpu_ways"][k])
    return one


def fits_rule(cfg, gpu: float, one: float, host: float, host_weights: float, host_buffers: float) -> tuple:
    """ms_fits_rule (csrc/ms_internal.h), the one fits rule of both twins: (spill, fits bits) from the bytes
    each tier needs (*one*: the busiest GPU's, held to one GPU's capacity). Weights beyond host RAM page in
    from storage when the runtime mmaps them (caches and buffers cannot); fits is 0 when something does not
    fit."""
    spill = 0.0
    if host > cfg["host_capacity"] and cfg["storage_spill"]:
        spill = host - cfg["host_capacity"]
        while host - spill > cfg["host_capacity"]:      # the subtraction can round one ulp above the capacity
            spill = math.nextafter(spill, math.inf)
        spill = min(spill, host_weights, cfg["storage_capacity"])
    fits = 0
    if one <= cfg["gpu_capacity"] and host - spill <= cfg["host_capacity"]:
        if gpu > 0.0 and cfg["n_gpus"] > 0:
            fits |= FITS_GPU
        if host - spill - host_buffers > 0.0:
            fits |= FITS_HOST
        if spill > 0.0:
            fits |= FITS_STORAGE
        if fits == 0:
            fits = FITS_HOST          # nothing placed anywhere but buffers
    if gpu > 0.0 and cfg["n_gpus"] == 0:
        fits = 0
    return spill, fits


def account(low, cfg, context, batch):
    """Return (by_class, tier, weights, kv, state, kv_slope, fits_bits, gpu_per_gpu) for one context and batch."""
    L = low.n_layers
    gran = cfg["kv_granularity"]
    c = context if gran <= 1 else -(-context // gran) * gran
    kvb = cfg["kv_bytes_per_elem"]
    bc = [[0.0] * N_TIERS for _ in range(N_CLASSES)]
    any_gpu = False
    kv_total = state_total = slope = 0.0
    for l in range(L):
        t = TIER_GPU if _layer_on_gpu(L, cfg, l) else TIER_HOST
        any_gpu = any_gpu or t == TIER_GPU
        bc[CLASS_ATTENTION][t] += low.attn[l]
        bc[CLASS_ROUTER][t] += low.router[l]
        bc[CLASS_SHARED][t] += low.shared[l]
        bc[CLASS_DENSE][t] += low.dense[l]
        g, h = _experts_split(low, cfg, l)
        any_gpu = any_gpu or g > 0
        bc[CLASS_ROUTED][TIER_GPU] += g * low.expert_one[l]
        bc[CLASS_ROUTED][TIER_HOST] += h * low.expert_one[l]
        kv, st = _cache(low, l, c, kvb)
        bc[CLASS_KV][t] += kv * batch
        bc[CLASS_STATE][t] += st * batch
        kv_total += kv * batch
        state_total += st * batch
        if low.kv_cap[l] == 0:
            slope += low.kv_elems[l] * kvb + low.kv_fixed[l]
        if low.kv_ratio[l] > 0:
            slope += (low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]) / low.kv_ratio[l]
    head_t = TIER_HOST if (cfg["placement"] == PLACE_CPU_ONLY or (cfg["placement"] == PLACE_LAYERS_GPU and cfg["placement_arg"] == 0)) else TIER_GPU
    emb_t = TIER_GPU if (cfg["embed_on_gpu"] and head_t == TIER_GPU) else TIER_HOST
    bc[CLASS_EMBED][emb_t] += low.embed
    bc[CLASS_HEAD][head_t] += low.head + (cfg["head_copy"] if emb_t != head_t else 0.0)
    if cfg["mtp"] and low.mtp_layers > 0:
        bc[CLASS_MTP][head_t] += low.mtp
        kv, st = _cache(low, L - 1, c, kvb)
        bc[CLASS_KV][head_t] += kv * batch * low.mtp_layers
        bc[CLASS_STATE][head_t] += st * batch * low.mtp_layers
        kv_total += kv * batch * low.mtp_layers
        state_total += st * batch * low.mtp_layers
        last = L - 1      # each MTP module's cache grows per token like the last layer's
        if low.kv_cap[last] == 0:
            slope += (low.kv_elems[last] * kvb + low.kv_fixed[last]) * low.mtp_layers
        if low.kv_ratio[last] > 0:
            slope += (low.kv_ratio_elems[last] * kvb + low.kv_ratio_fixed[last]) / low.kv_ratio[last] * low.mtp_layers
    any_gpu = any_gpu or head_t == TIER_GPU
    if cfg["n_gpus"] > 0 and any_gpu:
        bc[CLASS_BUFFERS][TIER_GPU] = cfg["n_gpus"] * (cfg["gpu_fixed"] + cfg["gpu_buf0"] + cfg["gpu_buf_ctx"] * c)
    host_buffers = cfg["host_fixed"] + cfg["host_buf0"] + cfg["host_buf_ctx"] * c
    bc[CLASS_BUFFERS][TIER_HOST] = host_buffers

    gpu = sum(bc[k][TIER_GPU] for k in range(N_CLASSES))
    host = sum(bc[k][TIER_HOST] for k in range(N_CLASSES))
    host_weights = sum(bc[k][TIER_HOST] for k in range(CLASS_MTP + 1))
    one = gpu_one(cfg, bc)
    spill, fits = fits_rule(cfg, gpu, one, host, host_weights, bc[CLASS_BUFFERS][TIER_HOST])
    tier = [gpu, host - spill, spill]
    weights = sum(bc[k][TIER_GPU] + bc[k][TIER_HOST] for k in range(CLASS_MTP + 1))
    return bc, tier, weights, kv_total, state_total, slope, fits, one


def memory_one(low, cfg):
    ctx, b = cfg["context"], cfg["batch"]
    max_ctx = largest_true(lambda x: account(low, cfg, x, b)[6] != 0, 1, low.max_context) or 0
    hi = 1
    while hi < 2**30 and account(low, cfg, ctx, hi)[6]:
        hi *= 2
    max_b = largest_true(lambda x: account(low, cfg, ctx, x)[6] != 0, 1, min(hi, 2**30)) or 0
    bc, tier, weights, kv, state, slope, fits, one = account(low, cfg, ctx, b)
    return dict(by_class=bc, tier=tier, gpu_per_gpu=one, weights=weights, kv=kv, state=state, kv_bytes_per_token=slope, fits=fits,
                max_context=max(0, max_ctx), max_batch=max(0, max_b))


def memory_many(low, cols):
    n = len(cols["context"])
    out = {k: [] for k in ("by_class", "tier", "gpu_per_gpu", "weights", "kv", "state", "kv_bytes_per_token", "fits",
                           "max_context", "max_batch")}
    for i in range(n):
        cfg = {k: (int(v[i]) if v.dtype.kind == "i" else float(v[i]) if v.ndim == 1 else [float(x) for x in v[i]])
               for k, v in cols.items()}
        r = memory_one(low, cfg)
        for k in out:
            out[k].append(r[k])
    return {
        "by_class": np.array(out["by_class"], dtype=np.float64).reshape(n, N_CLASSES, N_TIERS),
        "tier": np.array(out["tier"], dtype=np.float64).reshape(n, N_TIERS),
        "gpu_per_gpu": np.array(out["gpu_per_gpu"], dtype=np.float64),
        "weights": np.array(out["weights"], dtype=np.float64),
        "kv": np.array(out["kv"], dtype=np.float64),
        "state": np.array(out["state"], dtype=np.float64),
        "kv_bytes_per_token": np.array(out["kv_bytes_per_token"], dtype=np.float64),
        "fits": np.array(out["fits"], dtype=np.int32),
        "max_context": np.array(out["max_context"], dtype=np.int64),
        "max_batch": np.array(out["max_batch"], dtype=np.int64),
    }
