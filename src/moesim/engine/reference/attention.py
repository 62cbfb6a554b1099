"""Attention's context dependence written out directly, per attention kind: the independent twin of
the context table in ``engine/lower/attention.py`` (tests hold the table to these at many contexts)."""
from __future__ import annotations

from ...spec.layers import compressed_topk


def score_flops(layer, context: int) -> float:
    """Attention-score FLOPs per token (QK^T and AV) at KV depth ``context``."""
    a = layer.attention
    if a.kind == "gqa":
        span = min(context, a.window or a.chunk or context)
        return 4.0 * a.n_heads * a.head_dim * span
    if a.kind == "mla":
        span = min(context, a.index_topk) if a.index_heads else context   # DSA: the indexer's top-k tokens
        flops = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * span
        if a.index_heads:
            flops += 2.0 * a.index_heads * a.index_head_dim * context
        return flops
    if a.kind == "dsv4":
        span = min(context, a.window)
        if a.compress_ratio:
            entries = context // a.compress_ratio
            topk = compressed_topk(a, a.compress_ratio)
            span += entries if topk is None else min(entries, topk)
        return 4.0 * a.n_heads * a.head_dim * span
    # kda / gdn: read and update a fixed state per head
    return 4.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim


def kv_read_bytes(model, low, l: int, context: int, kvb: float) -> float:
    """KV / state bytes one sequence reads in layer l per step."""
    a = model.layers[l].attention
    cap = int(low.kv_cap[l])
    tokens = min(context, cap) if cap > 0 else context
    if a.kind == "mla" and a.index_heads:
        # DSA: indexer keys for every token, latents only for the indexer's top-k
        return low.kv_fixed[l] * context + low.kv_elems[l] * kvb * min(context, a.index_topk)
    read = (low.kv_elems[l] * kvb + low.kv_fixed[l]) * tokens
    ratio = int(low.kv_ratio[l])
    if ratio > 0:
        entries = context // ratio
        topk = compressed_topk(a, ratio)
        topk = entries if topk is None else topk
        read += min(entries, topk) * low.kv_ratio_elems[l] * kvb + entries * low.kv_ratio_fixed[l]
    return read + float(low.kv_state[l])
