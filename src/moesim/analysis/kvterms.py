"""The KV cache of one sequence, itemised by layer kind: what each cache holds, in which dtype, how many
layers hold it and what it weighs at a context. The same :meth:`Model.kv_terms` the memory kernel is
lowered from, so the items sum to the kernel's ``kv + state`` for one sequence."""
from __future__ import annotations

from ..spec import quants as Q
from ..spec.models import Model

# Where each kind of cache and its formula come from (the dtypes' sources are the catalog's).
_FORMULA = {
    "full attention K/V": "K and V of every KV head per token (models.md, GQA)",
    "sliding window K/V": "K and V of the last window (or chunk) tokens only (models.md, sliding / chunked layers)",
    "MLA latent": "compressed latent (kv_lora_rank) + rope key per token; V is a view of it (models.md, MLA)",
    "indexer keys": "sparse-attention indexer key per token, index_head_dim wide (VBLOG "
                    "2025-09-29-deepseek-v3-2.md; runtimes.md §2.2)",
    "linear state": "recurrent state heads x d_k x d_v in fp32 + the short-conv tail in bf16, fixed per "
                    "sequence (models.md §5, §8)",
    "sliding window": "the last 128 uncompressed shared-KV entries of head_dim (VBLOG 2026-04-24-deepseek-v4.md; "
                      "models.md DeepSeek-V4)",
    "compressed entries": "one shared-KV entry of head_dim per ratio tokens (AIC-sdk get_kvcache_bytes_per_sequence; "
                          "VBLOG 2026-04-24-deepseek-v4.md appendix)",
    "compressed indexer keys": "one indexer key of index_head_dim per 4 tokens on the ratio-4 (c4a) layers "
                               "(VBLOG 2026-04-24-deepseek-v4.md appendix; runtimes.md §2.2)",
    "compressor state": "fp32 compressor state, fixed per sequence (AIC-sdk get_kvcache_bytes_per_sequence; "
                        "models.md DeepSeek-V4)",
}
_NOTE_FP8_DS_MLA = ("vLLM's fp8_ds_mla entry keeps the 64 rope values in bf16 and adds scales: 584 B per "
                    "entry at head_dim 512 (runtimes.md §2.2), more than head_dim x the KV dtype counted here")


def _items(a, t, kv: str, kvb: float, indexer: str) -> list:
    """(kind, dtype, bytes per entry, tokens per entry, window, fixed bytes) of one layer's caches."""
    out = []
    if a.kind == "gqa":
        out.append(("sliding window K/V" if t.cap else "full attention K/V", kv, t.elems * kvb, 1, t.cap, 0.0))
    elif a.kind == "mla":
        out.append(("MLA latent", kv, t.elems * kvb, 1, 0, 0.0))
        if t.fixed_bytes:
            out.append(("indexer keys", indexer, t.fixed_bytes, 1, 0, 0.0))
    elif a.kind in ("kda", "gdn"):
        out.append(("linear state", "fp32+bf16", 0.0, 1, 0, t.state_bytes))
    elif a.kind == "dsv4":
        out.append(("sliding window", kv, t.elems * kvb, 1, t.cap, 0.0))
        if t.ratio:
            out.append(("compressed entries", kv, t.ratio_elems * kvb, t.ratio, 0, 0.0))
            if t.ratio_fixed_bytes:
                out.append(("compressed indexer keys", indexer, t.ratio_fixed_bytes, t.ratio, 0, 0.0))
            out.append(("compressor state", "fp32", 0.0, t.ratio, 0, t.state_bytes))
    else:
        raise AssertionError(a.kind)
    return out


def _entries(per: int, window: int, context: int) -> int:
    if per > 1:
        return context // per
    return min(context, window) if window else context


def kv_terms(m: Model, kv_dtype: str, context: int, mtp: int = 0, granularity: int = 1) -> list:
    """One row per (layer kind, dtype, entry size): ``kind, layers, mtp, dtype, bytes_per_entry,
    tokens_per_entry, window, entries, bytes_per_token, fixed_bytes, bytes_at_context, source``.

    ``bytes_per_token`` is what one layer adds per cached token (an entry per ``tokens_per_entry``
    tokens; up to ``window`` for a sliding one), ``fixed_bytes`` a state's size per layer, and
    ``bytes_at_context`` the row's bytes for one sequence at *context* (padded to *granularity*, as
    the runtime allocates), all of the row's layers together."""
    kv = Q.canonical_kv_dtype(kv_dtype)
    attn, _ = Q.kv_dtype_parts(kv)
    kvb, indexer = Q.kv_dtype_bytes(kv), Q.indexer_dtype(kv)
    gran = max(1, int(granularity))
    c = -(-int(context) // gran) * gran
    caches = [(layer, 1, False) for layer in m.layers]
    if mtp and m.mtp_layers:
        caches.append((m.mtp_layer or m.layers[-1], m.mtp_layers, True))
    rows: dict = {}
    for layer, copies, is_mtp in caches:
        t = m.kv_terms(layer, Q.indexer_dtype_bytes(kv))
        for kind, dtype, entry, per, window, fixed in _items(layer.attention, t, attn, kvb, indexer):
            key = (kind, dtype, entry, per, window, fixed, is_mtp)
            rows[key] = rows.get(key, 0) + copies
    return [_row(key, n, c, kv) for key, n in rows.items()]


def _row(key: tuple, layers: int, c: int, kv: str) -> dict:
    kind, dtype, entry, per, window, fixed, is_mtp = key
    entries = 0 if fixed else _entries(per, window, c)
    dsource = Q.dtype_source("indexer" if "indexer" in kind else "kv", dtype) if not fixed else "fp32 state"
    source = f"{_FORMULA[kind]}; {dtype}: {dsource}"
    if kind in ("sliding window", "compressed entries") and dtype == "fp8":
        source += "; " + _NOTE_FP8_DS_MLA
    return {"kind": kind, "layers": layers, "mtp": is_mtp, "dtype": dtype, "bytes_per_entry": entry,
            "tokens_per_entry": per if not fixed else None, "window": window or None, "entries": entries,
            "bytes_per_token": (entry / per) if not fixed else 0.0, "fixed_bytes": fixed,
            "bytes_at_context": layers * (entry * entries + fixed), "source": source}


def kv_terms_total(rows: list) -> float:
    """The bytes of one sequence's caches: the sum of the rows (= the kernel's kv + state at batch 1)."""
    return float(sum(r["bytes_at_context"] for r in rows))
