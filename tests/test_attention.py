"""Attention's context dependence takes each model's own indexer top-k from its config (index_topk),
not one constant: DeepSeek-V4-Pro's c4a layers select 1024 compressed entries, V4-Flash's 512,
V3.2's DSA 2048 tokens; c128a layers 8192 (the V4 post)."""
from __future__ import annotations

import dataclasses

import pytest

import moesim
from moesim.engine.lower.attention import ctx_eval, score_fn
from moesim.engine.reference import attention as REF


def _layer(mid: str, ratio: int):
    return next(l for l in moesim.model(mid).layers if l.attention.compress_ratio == ratio)


@pytest.mark.parametrize("mid, topk", [("deepseek-v4-pro", 1024), ("deepseek-v4-flash", 512)])
def test_c4a_layers_attend_their_config_top_k(mid, topk):
    layer = _layer(mid, 4)
    a = layer.attention
    c = 1 << 20
    want = 4.0 * a.n_heads * a.head_dim * (a.window + topk)
    assert a.index_topk == topk
    assert ctx_eval(score_fn(layer), c) == pytest.approx(want, rel=1e-12)
    assert REF.score_flops(layer, c) == pytest.approx(want, rel=1e-12)
    c128 = _layer(mid, 128)
    assert REF.score_flops(c128, c) == pytest.approx(4.0 * a.n_heads * a.head_dim * (a.window + 8192), rel=1e-12)


def test_dsa_span_follows_index_topk(tmp_path):
    layer = moesim.model("deepseek-v3.2").layers[0]
    a = layer.attention
    per = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
    idx = 2.0 * a.index_heads * a.index_head_dim
    assert ctx_eval(score_fn(layer), 100_000) == pytest.approx(per * 2048 + idx * 100_000, rel=1e-12)
    wider = dataclasses.replace(layer, attention=dataclasses.replace(a, index_topk=4096))
    assert ctx_eval(score_fn(wider), 100_000) == pytest.approx(per * 4096 + idx * 100_000, rel=1e-12)
    assert REF.score_flops(wider, 100_000) == pytest.approx(per * 4096 + idx * 100_000, rel=1e-12)


def test_mla_prefills_in_multi_head_form_and_decodes_on_the_latent():
    """Dense MLA prefills with per-head keys and values decompressed from the cached latent (vLLM's MLA
    backend; mlx-lm deepseek_v3.py): 2 H (d_nope + d_rope + d_v) FLOPs per key, plus the decompression,
    2 r H (d_nope + d_v) per cached key and ubatch; decode stays absorbed, 2 H (2 r + d_rope). DSA layers
    (an indexer) keep the latent form in prefill too."""
    from moesim.engine.lower.attention import mla_decompress_flops, prefill_score_fn
    m = moesim.model("deepseek-v3")
    layer = m.layers[0]
    a = layer.attention
    H, r = a.n_heads, a.kv_lora_rank
    assert ctx_eval(prefill_score_fn(layer), 1000) == 1000 * 2.0 * H * (a.qk_nope_head_dim + a.qk_rope_head_dim
                                                                        + a.v_head_dim)
    assert ctx_eval(score_fn(layer), 1000) == 1000 * 2.0 * H * (2 * r + a.qk_rope_head_dim)
    assert mla_decompress_flops(m)[0] == 2.0 * r * H * (a.qk_nope_head_dim + a.v_head_dim)
    dsa = moesim.model("deepseek-v3.2")
    lay = next(x for x in dsa.layers if x.attention.kind == "mla")
    assert lay.attention.index_heads > 0
    assert prefill_score_fn(lay) == score_fn(lay) and mla_decompress_flops(dsa).max() == 0.0
    gqa = moesim.model("qwen3-30b-a3b").layers[0]
    assert prefill_score_fn(gqa) == score_fn(gqa) and mla_decompress_flops(moesim.model("qwen3-30b-a3b")).max() == 0.0


@pytest.mark.parametrize("rid, absorbed", [("llama.cpp", True), ("ollama", True), ("llama.cpp-hip", True),
                                           ("ik_llama.cpp", False), ("llama.cpp-2024h1", False), ("vllm", False),
                                           ("mlx", False)])
def test_llama_cpp_prefills_mla_on_the_latent(rid, absorbed):
    """llama.cpp's deepseek2 graph takes the absorbed MLA branch for any batch (runtimes.toml
    mla_prefill_absorbed): a prompt token costs the decode form per key and decompresses nothing; ik's -mla 3,
    pre-MLA builds and the served runtimes prefill in the multi-head form."""
    from moesim.engine.lower.attention import prefill_score_fn
    from moesim.engine.prefill import prefill_terms
    from moesim.spec.runtimes import runtime
    m = moesim.model("deepseek-v3")
    layer = m.layers[0]
    rt = runtime(rid)
    assert rt.decode.mla_prefill_absorbed is absorbed
    assert (prefill_score_fn(layer, rt.decode.mla_prefill_absorbed) == score_fn(layer)) is absorbed
    n_l = m.n_layers
    dm = {"attn_on_gpu": [1] * n_l, "expert_mode": [0] * n_l, "moe_index": [-1] * n_l, "attn_bytes": [0.0] * n_l,
          "shared_bytes": [0.0] * n_l, "attn_flops": [0.0] * n_l, "shared_flops": [0.0] * n_l}
    x = prefill_terms(m, dm, {}, rt, 8192)
    keys = max(1, 8192 // 2)
    assert x["score_flops"][0] == pytest.approx(ctx_eval(prefill_score_fn(layer, absorbed), keys), rel=1e-12)
    assert bool(x["decompress_flops"].max() == 0.0) is absorbed
