"""Attention's context dependence, in one place: KV bytes read and score FLOPs per layer at a context."""
from __future__ import annotations

import functools

import numpy as np

from ...spec.layers import compressed_topk
from ...spec.models import Model
from .memory import kv_columns_key


def _score_flops(layer, context: int) -> float:
    """Attention-score FLOPs per token (QK^T and AV) at KV depth ``context``: the layer's row of the
    context table (:func:`score_fn`), the one definition simulate, prefill and sweeps share."""
    return ctx_eval(score_fn(layer), context)


def _kv_read_bytes(model: Model, low, l: int, context: int, kvb: float) -> float:
    """KV / state bytes one sequence reads in layer l per step, from the context table (:func:`kv_read_fn`)."""
    return ctx_eval(kv_read_fn(model, low, l, kvb), context)


def decode_context_rows(model: Model, low, context: int, kvb: float) -> tuple:
    """(KV bytes read, score FLOPs) per layer and token at KV depth ``context``: fresh arrays, from a
    cache shared by every machine and placement of a model, quant and KV dtype."""
    kv, score = _decode_context_rows(model, low, int(context), float(kvb))
    return kv.copy(), score.copy()


@functools.lru_cache(maxsize=4096)
def _decode_context_rows(model: Model, low, context: int, kvb: float) -> tuple:
    return _kv_read_row(model, low, context, kvb), _score_row(model, context)


def _kv_read_row(model: Model, low, context: int, kvb: float) -> np.ndarray:
    """Each layer's KV read bytes (read-only): they read the lowered model's cache columns alone, which
    every quant of a model shares, so the row is built once per model, context and KV dtype."""
    key = (model, kv_columns_key(low), context, kvb)
    hit = _KV_READ_ROWS.get(key)
    if hit is None:                          # a race builds equal rows twice
        hit = np.array([ctx_eval(fn, context) for fn in kv_read_fns(model, low, kvb)])
        hit.flags.writeable = False
        _KV_READ_ROWS[key] = hit
    return hit


_KV_READ_ROWS: dict = {}                     # (model, cache columns, context, KV bytes per element) -> row


# ------------------------------------------------------------------------------- prefill
def prefill_score_flops(m: Model, prompt: int, depth: int = 0, absorbed: bool = False) -> np.ndarray:
    """Attention-score FLOPs per prompt token and layer: a prompt of ``prompt`` tokens appended to
    ``depth`` cached ones attends, on average, over depth + prompt / 2 keys (:func:`prefill_score_fn`;
    ``absorbed``: MLA in its absorbed form, the runtime's ``mla_prefill_absorbed``)."""
    return _prefill_score_row(m, depth + max(1, prompt // 2), absorbed).copy()


@functools.lru_cache(maxsize=4096)
def _score_row(m: Model, context: int) -> np.ndarray:
    return np.array([ctx_eval(fn, context) for fn in score_fns(m)])


@functools.lru_cache(maxsize=4096)
def _prefill_score_row(m: Model, context: int, absorbed: bool = False) -> np.ndarray:
    return np.array([ctx_eval(prefill_score_fn(layer, absorbed), context) for layer in m.layers])


def prefill_score_fn(layer, absorbed: bool = False) -> tuple:
    """Attention FLOPs per prompt token of a layer, as a context function: :func:`score_fn`, except that
    dense MLA prefills in its multi-head form. Runtimes decompress the cached latent into per-head keys and
    values for a prompt's attention (vLLM's MLA backend, "compute-friendly" prefill: k_nope = kv_c @ W_UK,
    vllm/attention/backends/mla/common.py; mlx-lm deepseek_v3.py: embed_q / unembed_out of the latent cache
    when more than one token runs), so a key costs 2 H (d_nope + d_rope + d_v) FLOPs, not the absorbed
    decode form's 2 H (2 r + d_rope), 3.4x more for DeepSeek-V3. The decompression itself is
    :func:`mla_decompress_flops`. DSA layers (an indexer) keep the decode form: their sparse attention runs
    on the latent, and so does every MLA layer of a runtime that prefills ``absorbed`` (llama.cpp: MQA over
    the latent, runtimes.toml mla_prefill_absorbed)."""
    a = layer.attention
    if a.kind != "mla" or a.index_heads or absorbed:
        return score_fn(layer)
    (_, a2, b1, b2, s), caps = score_fn(layer)
    return (2.0 * a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim), a2, b1, b2, s), caps


@functools.lru_cache(maxsize=1024)
def mla_decompress_flops(m: Model) -> np.ndarray:
    """Per layer, the FLOPs of decompressing one cached key's latent into every head's key and value
    (2 r H (d_nope + d_v)), which MLA's multi-head prefill (:func:`prefill_score_fn`) pays for every key of
    the context once per ubatch (vLLM: per chunk of context; read-only); 0 for other layers."""
    out = np.zeros(m.n_layers)
    for l, layer in enumerate(m.layers):
        a = layer.attention
        if a.kind == "mla" and not a.index_heads:
            out[l] = 2.0 * a.kv_lora_rank * a.n_heads * (a.qk_nope_head_dim + a.v_head_dim)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=1024)
def score_fns(m: Model) -> tuple:
    """:func:`score_fn` of every layer of *m*."""
    return tuple(score_fn(layer) for layer in m.layers)


@functools.lru_cache(maxsize=1024)
def prefill_kv_read(m: Model, low, kvb: float) -> tuple:
    """(per-layer context functions of the KV bytes one sequence reads, :func:`query_heads_per_kv`).
    They read the lowered model's cache columns alone, which every quant of a model shares: built once
    per distinct set of columns (lower.memory.kv_columns_key), not once per quant."""
    from .memory import kv_columns_key
    key = (m, kv_columns_key(low), kvb)
    hit = _KV_READ.get(key)
    if hit is None:
        if len(_KV_READ) > 1024:
            _KV_READ.clear()
        hit = _KV_READ[key] = (kv_read_fns(m, low, kvb), query_heads_per_kv(m))
    return hit


_KV_READ: dict = {}             # (model, cache columns, KV bytes per element) -> prefill_kv_read's value


@functools.lru_cache(maxsize=1024)
def query_heads_per_kv(m: Model) -> np.ndarray:
    """Per layer, the query heads that each read their KV head's share of the cache (read-only): a kernel
    that walks the cache once per query row and head reads ``heads x`` the layer's cache per row (GQA:
    n_heads / n_kv_heads; MLA and DeepSeek-V4 share one latent cache across all heads); recurrent layers
    (0) carry a state, not a cache to walk. Computed once per model (every decode lowering reads it)."""
    return m.cached_view("_cache_query_heads_per_kv", lambda: _query_heads_per_kv(m))


def _query_heads_per_kv(m: Model) -> np.ndarray:
    heads = np.zeros(m.n_layers)
    for l, layer in enumerate(m.layers):
        a = layer.attention
        if a.kind == "gqa":
            heads[l] = a.n_heads / max(1, a.n_kv_heads or a.n_heads)
        elif a.kind in ("mla", "dsv4"):
            heads[l] = float(a.n_heads)
    heads.flags.writeable = False
    return heads


# =============================================================================== context functions
# A layer's context dependence as coefficients and caps ((a1, a2, b1, b2, s), (c1, c2, r, k1)):
#   a1*min(C, c1) + a2*min(C, c2) + b1*min(C // r, k1) + b2*(C // r) + s      (a cap of -1: none)
# evaluated by ms_ctx_eval in C and ctx_eval here. engine/reference/attention.py writes the same physics
# out directly, as the independent twin the tests hold this table to.
# The top-k values come from the layer spec (its config's index_topk; spec.layers.compressed_topk).
_NOCAP = -1


def _cap(value) -> int:
    return _NOCAP if value is None else int(value)


def kv_read_fn(m, low, l: int, kvb: float) -> tuple:
    """KV / state bytes one sequence reads per step in layer l, as a context function."""
    return kv_read_fns(m, low, kvb)[l]


def kv_read_fns(m, low, kvb: float) -> tuple:
    """:func:`kv_read_fn` of every layer. They read the lowered model's cache columns alone, which every
    quant of a model shares: built once per model, set of columns and KV bytes per element."""
    key = (m, kv_columns_key(low), kvb)
    hit = _KV_FNS.get(key)
    if hit is None:                          # a race builds equal tuples twice
        cols = [getattr(low, f).tolist() for f in ("kv_elems", "kv_fixed", "kv_cap", "kv_ratio", "kv_ratio_elems",
                                                    "kv_ratio_fixed", "kv_state")]
        hit = tuple(_kv_read_fn(layer.attention, kvb, *(c[l] for c in cols)) for l, layer in enumerate(m.layers))
        if len(_KV_FNS) > 4096:
            _KV_FNS.clear()
        _KV_FNS[key] = hit
    return hit


_KV_FNS: dict = {}                       # (model, cache columns, KV bytes per element) -> kv_read_fns


def _kv_read_fn(a, kvb: float, elems: float, fixed: float, cap: int, ratio: int, ratio_elems: float,
                ratio_fixed: float, state: float) -> tuple:
    """One layer's KV read function from its cache columns (Python numbers: the same doubles)."""
    if a.kind == "mla" and a.index_heads:
        return (float(fixed), float(elems * kvb), 0.0, 0.0, 0.0), (_NOCAP, a.index_topk, 0, _NOCAP)
    cap, ratio = int(cap), int(ratio)
    a1 = float(elems * kvb + fixed)
    b1 = b2 = 0.0
    k1 = _NOCAP
    if ratio > 0:
        b1, b2 = float(ratio_elems * kvb), float(ratio_fixed)
        k1 = _cap(compressed_topk(a, ratio))
    return (a1, 0.0, b1, b2, float(state)), (cap if cap > 0 else _NOCAP, _NOCAP, ratio if ratio > 0 else 0, k1)


def score_fn(layer) -> tuple:
    """Attention-score FLOPs per token of a layer, as a context function."""
    a = layer.attention
    if a.kind == "gqa":
        cap = a.window or a.chunk
        return (4.0 * a.n_heads * a.head_dim, 0.0, 0.0, 0.0, 0.0), (cap if cap else _NOCAP, _NOCAP, 0, _NOCAP)
    if a.kind == "mla":
        a1 = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
        if a.index_heads:
            return (a1, 2.0 * a.index_heads * a.index_head_dim, 0.0, 0.0, 0.0), (a.index_topk, _NOCAP, 0, _NOCAP)
        return (a1, 0.0, 0.0, 0.0, 0.0), (_NOCAP, _NOCAP, 0, _NOCAP)
    if a.kind == "dsv4":
        a1 = 4.0 * a.n_heads * a.head_dim
        r = a.compress_ratio
        return (a1, 0.0, a1 if r else 0.0, 0.0, 0.0), (a.window, _NOCAP, r if r else 0, _cap(compressed_topk(a, r)))
    return (0.0, 0.0, 0.0, 0.0, 4.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim), (_NOCAP, _NOCAP, 0, _NOCAP)


def full_window_fn(fn: tuple, layer) -> tuple:
    """Context function *fn* of a sliding-window layer with the window lifted: a runtime that keeps such a
    layer's whole cache and walks all of it, the mask hiding the rest (llama.cpp --swa-full on a GPU: its
    flash-attention kernels skip only masked tiles past the last visible key). Other layers' *fn* as is."""
    a = layer.attention
    if a.kind != "gqa" or not a.window:
        return fn
    coef, caps = fn
    return coef, (_NOCAP,) + tuple(caps[1:])


def full_window_rows(m: Model, low, context: int, kvb: float, on_gpu, kv: np.ndarray, score: np.ndarray) -> tuple:
    """(KV bytes, score FLOPs) per layer at depth ``context`` as :func:`decode_context_rows` gives them, with the
    sliding-window layers whose attention runs on the GPU walking the whole cache (:func:`full_window_fn`);
    on the CPU ggml's per-row kernel skips masked keys (its one_chunk loop: `if (mv == -INFINITY) continue`)."""
    kv, score = kv.copy(), score.copy()
    kv_fns = kv_read_fns(m, low, kvb)
    for l, layer in enumerate(m.layers):
        if on_gpu[l] and layer.attention.kind == "gqa" and layer.attention.window:
            kv[l] = ctx_eval(full_window_fn(kv_fns[l], layer), context)
            score[l] = ctx_eval(full_window_fn(score_fn(layer), layer), context)
    return kv, score


def ctx_eval(fn: tuple, c: int) -> float:
    """Pure-Python twin of ms_ctx_eval."""
    (a1, a2, b1, b2, s), (c1, c2, r, k1) = fn
    v = a1 * float(c1 if 0 <= c1 < c else c)
    if a2 != 0.0:
        v += a2 * float(c2 if 0 <= c2 < c else c)
    if r > 0:
        e = c // r
        if b1 != 0.0:
            v += b1 * float(k1 if 0 <= k1 < e else e)
        if b2 != 0.0:
            v += b2 * float(e)
    return v + s
