"""Attention's context dependence written out directly, per attention kind: the independent twin of
the context table in ``engine/lower/attention.py`` (tests hold the table to these at many contexts)."""
from __future__ import annotations


def score_flops(layer, context: int) -> float:
    """Attention-score FLOPs per token (QK^T and AV) at KV depth ``context``."""
    a = layer.attention
    if a.kind == "gqa":
        span = min(context, a.window or a.chunk or context)
        return 4.0 * a.n_heads * a.head_dim * span
    if a.kind == "mla":
        span = min(context, 2048) if a.index_heads else context   # DSA attends to the indexer's top 2048 (RT §2.2)
        flops = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * span
        if a.index_heads:
            flops += 2.0 * a.index_heads * a.index_head_dim * context
        return flops
    if a.kind == "dsv4":
        topk = {4: 512, 128: 8192}.get(a.compress_ratio, 0)        # c4a / c128a top-k (RT §2.2)
        span = min(context, a.window) + (min(context // a.compress_ratio, topk) if a.compress_ratio else 0)
        return 4.0 * a.n_heads * a.head_dim * span
    # kda / gdn: read and update a fixed state per head
    return 4.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim


def kv_read_bytes(model, low, l: int, context: int, kvb: float) -> float:
    """KV / state bytes one sequence reads in layer l per step."""
    a = model.layers[l].attention
    cap = int(low.kv_cap[l])
    tokens = min(context, cap) if cap > 0 else context
    if a.kind == "mla" and a.index_heads:
        # DSA: indexer keys for every token, latents only for the selected 2048
        return low.kv_fixed[l] * context + low.kv_elems[l] * kvb * min(context, 2048)
    read = (low.kv_elems[l] * kvb + low.kv_fixed[l]) * tokens
    ratio = int(low.kv_ratio[l])
    if ratio > 0:
        entries = context // ratio
        topk = {4: 512, 128: 8192}.get(ratio, entries)
        read += min(entries, topk) * low.kv_ratio_elems[l] * kvb + entries * low.kv_ratio_fixed[l]
    return read + float(low.kv_state[l])
