"""Catalog checks: architectures against published parameter counts, KV-cache sizes, GGUF file sizes,
llama.cpp type-selection rules and the HF-config round trip.

Reference figures come from /work/shared/reference/models.md and quants.md (cited per test). They are
written out here on purpose rather than read from the catalog, so a catalog edit cannot make a test
agree with itself.
"""
from __future__ import annotations

import re

import pytest

from moesim.spec import hardware
from moesim.engine import memory as mem
from moesim import ingest as INGEST
from moesim.spec import models
from moesim.spec import gguf_types as GT
from moesim.spec import quants
from moesim.spec.models import Model

GIB = 2**30
MIB = 2**20

ALL_IDS = models.model_ids()


@pytest.fixture(scope="module")
def big_machine():
    return hardware.machine("dgx-h200")


# ------------------------------------------------------------------------------------ loading
def test_catalog_is_not_empty():
    assert len(ALL_IDS) >= 25, ALL_IDS
    for must in ("deepseek-v3", "gpt-oss-120b", "qwen3-next-80b-a3b", "llama-2-7b", "inkling"):
        assert must in ALL_IDS


@pytest.mark.parametrize("mid", ALL_IDS)
def test_every_model_loads(mid):
    m = INGEST.model(mid)
    assert m.id == mid
    assert m.n_layers > 0 and m.hidden > 0 and m.vocab > 0 and m.max_context > 0
    names = [t.name for t in m.tensors()]
    assert len(names) == len(set(names)), f"{mid}: duplicate tensor names"
    total, active = m.param_counts()
    assert 0 < active <= total


# ------------------------------------------------------------------------------------ parameters
@pytest.mark.parametrize("mid", [i for i in ALL_IDS if INGEST.model(i).published_total_params])
def test_total_params_match_published(mid):
    m = INGEST.model(mid)
    total, _ = m.param_counts()
    pub = m.published_total_params
    assert total == pytest.approx(pub, rel=0.03), f"{mid}: derived total {total / 1e9:.2f}B vs published {pub / 1e9:.2f}B"


def _active(m: Model, convention: str) -> float:
    """Active parameters under a counting convention.

    all            everything param_counts() counts (embedding table and head included)
    no_embed       minus the token-embedding table (a lookup, not compute); the head stays
    no_embed_head  minus the embedding table and the untied lm_head
    """
    _, active = m.param_counts()
    table = m.hidden * m.vocab
    if convention == "all":
        return active
    if convention == "no_embed":
        return active - table
    if convention == "no_embed_head":
        return active - table * (1 if m.tie_embeddings else 2)
    raise AssertionError(convention)


# Models whose published active count is a precise figure: (figure, convention that the vendor uses).
# The convention was chosen per vendor as the one that matches; deviations noted are for that convention.
PRECISE_ACTIVE = {
    # TTM README_WEIGHTS: "36.6B incl. 0.9B head" -> no token table, head counted (derived 36.63B).
    "deepseek-v3": (36.6e9, "no_embed"),
    "deepseek-r1": (36.6e9, "no_embed"),
    # DeepSeek-V2 README 2.4B activated (derived 2.45B without the table).
    "deepseek-v2-lite": (2.4e9, "no_embed"),
    "kimi-k2": (32e9, "no_embed"),                 # -1.0 %
    # gpt-oss README: active excludes embeddings (the unembedding is compute and counted): +0.6 %, +0.2 %.
    "gpt-oss-120b": (5.1e9, "no_embed"),
    "gpt-oss-20b": (3.6e9, "no_embed"),
    # GLM counts neither the table nor the head: 4.5 +0.3 % (no_embed would be +2.7 %).
    "glm-4.5": (32e9, "no_embed_head"),
    "glm-4.6": (32e9, "no_embed_head"),
    "mixtral-8x22b": (39e9, "no_embed"),           # -0.1 %
    # Meta's model card counts everything (17.17B derived; no_embed would be -5 %).
    "llama-4-scout": (17e9, "all"),
    "llama-4-maverick": (17e9, "all"),
    "dbrx": (36e9, "no_embed"),                    # -0.4 %
    # ERNIE ties embeddings: the single table is also the output projection, counted (+0.2 %).
    "ernie-4.5-300b-a47b": (47e9, "all"),
    "inkling": (41e9, "all"),                      # +0.4 % (no_embed -2.6 %)
    "qwen3-235b-a22b": (22e9, "all"),              # +0.9 %
    # Dense calibration models: active == total.
    "llama-2-7b": (6.74e9, "all"),
    "llama-3-8b": (8.03e9, "all"),
    "llama-3-70b": (70.6e9, "all"),
}

# Headline / name-only counts ("A3B", "~40B", "10B"). Deviations (no_embed convention):
# qwen3-30b-a3b -7.8 % vs 3.3B; qwen3-next-80b-a3b +18.8 % vs 3B (name rounds 3.56B down);
# kimi-linear-48b-a3b +3.6 %; minimax-m2 +4.2 % vs 10B; glm-4.5-air +6.7 % vs 12B;
# deepseek-v4-flash +2.1 %, deepseek-v4-pro -0.3 %, glm-5.2 +0.7 %, mixtral-8x7b -1.2 %,
# deepseek-v3.2 +1.3 % (indexer not in the headline). A bound of 35 % still catches a wrong top-k,
# a missing shared expert or an expert counted as always active.
LOOSE_ACTIVE = {
    "qwen3-30b-a3b", "qwen3-coder-30b-a3b", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "minimax-m2",
    "glm-4.5-air", "deepseek-v4-flash", "deepseek-v4-pro", "glm-5.2", "mixtral-8x7b", "deepseek-v3.2",
    "deepseek-coder-v2-lite",
}


# The breadth entries keep their active-count tables beside their own tests.
from test_catalog_dense import NEW_LOOSE_ACTIVE, NEW_PRECISE_ACTIVE  # noqa: E402
PRECISE_ACTIVE.update(NEW_PRECISE_ACTIVE)
LOOSE_ACTIVE |= NEW_LOOSE_ACTIVE
PRECISE_ACTIVE.update({mid: (INGEST.model(mid).published_active_params, "all")
                       for mid in ALL_IDS if INGEST.model(mid).n_experts == 0 and mid not in PRECISE_ACTIVE
                       and INGEST.model(mid).published_active_params})
# The MoE families of spec/architectures_more.py check their active counts in their own module.
from test_catalog_moe_families import ACTIVE_CHECKS as MOE_FAMILY_ACTIVE  # noqa: E402


def test_every_published_active_count_is_checked():
    with_active = {i for i in ALL_IDS if INGEST.model(i).published_active_params}
    unchecked = with_active - set(PRECISE_ACTIVE) - LOOSE_ACTIVE - set(MOE_FAMILY_ACTIVE)
    assert not unchecked, f"add these models to PRECISE_ACTIVE or LOOSE_ACTIVE: {sorted(unchecked)}"


@pytest.mark.parametrize("mid", sorted(PRECISE_ACTIVE))
def test_active_params_precise(mid):
    figure, convention = PRECISE_ACTIVE[mid]
    m = INGEST.model(mid)
    got = _active(m, convention)
    assert got == pytest.approx(figure, rel=0.03), (
        f"{mid}: derived active ({convention}) {got / 1e9:.3f}B vs published {figure / 1e9:.2f}B")


@pytest.mark.parametrize("mid", sorted(LOOSE_ACTIVE))
def test_active_params_name_only(mid):
    m = INGEST.model(mid)
    figure = m.published_active_params
    assert figure, mid
    got = _active(m, "no_embed")
    assert 0.65 * figure <= got <= 1.35 * figure, (
        f"{mid}: derived active {got / 1e9:.3f}B vs headline {figure / 1e9:.2f}B")


def test_dense_models_active_equals_total():
    for mid in ("llama-2-7b", "llama-3-8b", "llama-3-70b"):
        total, active = INGEST.model(mid).param_counts()
        assert active == total, mid


def test_moe_active_fraction_follows_top_k():
    # Mixtral-8x7B: 2 of 8 experts -> routed experts contribute exactly a quarter of their weight.
    m = INGEST.model("mixtral-8x7b")
    routed = sum(t.n_elements for t in m.tensors(include_mtp=False) if t.cls == "routed_experts")
    total, active = m.param_counts()
    assert total - active == pytest.approx(routed * (1 - 2 / 8), rel=1e-12)
    assert routed == 32 * 8 * 3 * 4096 * 14336


# ------------------------------------------------------------------------------------ KV cache
# (model, kv dtype, bytes per token) from models.md "Derived per-token KV-cache size".
KV_PER_TOKEN = [
    ("llama-2-7b", "f16", 524_288),
    ("qwen3-30b-a3b", "bf16", 98_304),
    ("deepseek-v3", "bf16", 70_272),
    ("gpt-oss-120b", "bf16", 36_864),
    ("gpt-oss-20b", "bf16", 24_576),
    ("qwen3-next-80b-a3b", "bf16", 24_576),
    ("mixtral-8x7b", "f16", 131_072),
    ("mixtral-8x22b", "bf16", 229_376),
    ("glm-4.5", "bf16", 376_832),
    ("deepseek-v2-lite", "bf16", 31_104),
    ("kimi-k2", "bf16", 70_272),
    ("kimi-linear-48b-a3b", "bf16", 8_064),
    ("qwen3-235b-a22b", "bf16", 192_512),
    ("dbrx", "bf16", 163_840),
    ("minimax-m2", "bf16", 253_952),
    ("ernie-4.5-300b-a47b", "bf16", 221_184),
]


@pytest.mark.parametrize("mid,kv_dtype,per_token", KV_PER_TOKEN)
def test_kv_bytes_per_token(mid, kv_dtype, per_token, big_machine):
    r = mem.memory(mid, big_machine, "bf16", context=4096, kv_dtype=kv_dtype)
    assert r.kv_bytes_per_token == per_token, f"{mid}: {r.kv_bytes_per_token} B/token"
    # The slope is also what the cache actually grows by between two contexts (both multiples of
    # every runtime's granularity, above every window in these models).
    r2 = mem.memory(mid, big_machine, "bf16", context=8192, kv_dtype=kv_dtype)
    assert r2.kv - r.kv == per_token * 4096, mid


def test_kv_bytes_per_token_scales_with_dtype(big_machine):
    f16 = mem.memory("llama-2-7b", big_machine, "Q4_K_M", context=4096, kv_dtype="f16")
    q8 = mem.memory("llama-2-7b", big_machine, "Q4_K_M", context=4096, kv_dtype="q8_0")
    q4 = mem.memory("llama-2-7b", big_machine, "Q4_K_M", context=4096, kv_dtype="q4_0")
    assert q8.kv_bytes_per_token == 524_288 / 2 * 1.0625
    assert q4.kv_bytes_per_token == 524_288 / 2 * 0.5625
    assert f16.kv == 524_288 * 4096


def test_deepseek_v3_mla_terms():
    m = INGEST.model("deepseek-v3")
    terms = [m.kv_terms(l) for l in m.layers]
    assert len(terms) == 61
    assert all(t.elems == 512 + 64 and t.cap == 0 and t.state_bytes == 0 and t.fixed_bytes == 0 for t in terms)


def test_deepseek_v32_indexer_cache(big_machine):
    # models.md: V3.2 adds an fp8 indexer cache of 132 B per token per layer = 8,052 B/token.
    r = mem.memory("deepseek-v3.2", big_machine, "bf16", context=4096, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 70_272 + 61 * 132


def test_gpt_oss_120b_sliding_window_state(big_machine):
    # 18 full layers at 36,864 B/token; the 18 sliding layers hold a 128-token window:
    # 18 x 128 tokens x (2 x 8 heads x 64 x 2 B) = 4.5 MiB, whatever the context.
    window_bytes = 18 * 128 * 2048
    assert window_bytes == 4.5 * MIB
    for ctx in (1024, 4096, 65536):
        r = mem.memory("gpt-oss-120b", big_machine, "bf16", context=ctx, kv_dtype="bf16")
        assert r.kv == 36_864 * ctx + window_bytes, ctx
        assert r.state == 0
    # Below the window the sliding layers grow with the context too.
    small = mem.memory("gpt-oss-120b", big_machine, "bf16", context=64, kv_dtype="bf16", runtime="sglang")
    assert small.kv == 36 * 2048 * 64


def test_qwen3_next_linear_attention_state_is_context_independent(big_machine):
    m = INGEST.model("qwen3-next-80b-a3b")
    kinds = [l.attention.kind for l in m.layers]
    assert kinds.count("gdn") == 36 and kinds.count("gqa") == 12
    # GDN state: 32 value heads x 128 x 128 fp32 + conv tail 3 x (2 x 16 x 128 + 32 x 128) bf16.
    per_layer = 32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2
    r1 = mem.memory(m.id, big_machine, "bf16", context=1024, kv_dtype="bf16")
    r2 = mem.memory(m.id, big_machine, "bf16", context=100 * 1024, kv_dtype="bf16")
    assert r1.state == r2.state == 36 * per_layer
    assert r2.kv - r1.kv == 12 * 2 * 2 * 256 * 2 * (100 * 1024 - 1024)
    # The state scales with the number of sequences.
    r3 = mem.memory(m.id, big_machine, "bf16", context=1024, batch=3, kv_dtype="bf16")
    assert r3.state == 3 * r1.state


def test_kimi_linear_state(big_machine):
    r1 = mem.memory("kimi-linear-48b-a3b", big_machine, "bf16", context=1024, kv_dtype="bf16")
    r2 = mem.memory("kimi-linear-48b-a3b", big_machine, "bf16", context=65536, kv_dtype="bf16")
    per_layer = 32 * 128 * 128 * 4 + 3 * (2 * 32 * 128 + 32 * 128) * 2
    assert r1.state == r2.state == 20 * per_layer
    assert r2.kv - r1.kv == 8_064 * (65536 - 1024)


def test_llama4_chunked_layers_cap(big_machine):
    # models.md: 12 global layers = 49,152 B/token; 36 chunked layers capped at 8192 tokens = 1.125 GiB.
    r = mem.memory("llama-4-scout", big_machine, "bf16", context=65536, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 49_152
    assert r.kv == 49_152 * 65536 + 1.125 * GIB


# ------------------------------------------------------------------------------------ GGUF sizes
def _gguf_bytes(mid: str, quant: str) -> int:
    return sum(nb for _t, _typ, nb in quants.assign(INGEST.model(mid), quant))


# quants.md §2.5: QZ QUANT_OPTIONS sizes "@ Llama-3-8B", G = GiB.
QZ_LLAMA3_8B = {
    "Q2_K": 2.96, "Q3_K_S": 3.41, "Q3_K_M": 3.74, "Q3_K_L": 4.03, "Q4_0": 4.34, "Q4_1": 4.78,
    "Q4_K_S": 4.37, "Q4_K_M": 4.58, "Q5_0": 5.21, "Q5_1": 5.65, "Q5_K_S": 5.21, "Q5_K_M": 5.33,
    "Q6_K": 6.14, "Q8_0": 7.96,
}


def test_llama3_8b_q4_k_m_size():
    assert _gguf_bytes("llama-3-8b", "Q4_K_M") / GIB == pytest.approx(4.58, rel=0.01)


@pytest.mark.parametrize("quant", sorted(QZ_LLAMA3_8B))
def test_llama3_8b_qz_table(quant):
    got = _gguf_bytes("llama-3-8b", quant) / GIB
    assert got == pytest.approx(QZ_LLAMA3_8B[quant], rel=0.015), f"{quant}: {got:.3f} GiB"


def test_llama3_8b_q2_k_s_is_smaller_than_q2_k():
    # QZ prints "2.96G" for Q2_K_S as well, but that string is a copy of Q2_K's: by the LQ rules
    # Q2_K_S keeps ffn_down at Q2_K outside the first n/8 layers (Q4_K there) and attn_output at the
    # base Q2_K, where Q2_K upgrades all ffn_down and attn_output to Q3_K. The difference is exact:
    ffn_down = 14336 * 4096
    attn_out = 4096 * 4096
    q2, q3, q4 = 84 / 256, 110 / 256, 144 / 256          # bytes per element
    diff = 28 * ffn_down * (q3 - q2) - 4 * ffn_down * (q4 - q3) + 32 * attn_out * (q3 - q2)
    assert _gguf_bytes("llama-3-8b", "Q2_K") - _gguf_bytes("llama-3-8b", "Q2_K_S") == diff


def test_qwen3_coder_30b_q8_0_size():
    assert _gguf_bytes("qwen3-coder-30b-a3b", "Q8_0") / GIB == pytest.approx(30.25, rel=0.01)


def test_inkling_gguf_sizes():
    # dylantirandaz/inkling-quant exports (quants.md §2.5).
    assert _gguf_bytes("inkling", "Q3_K_M") == pytest.approx(451_035_400_288, rel=0.01)
    assert _gguf_bytes("inkling", "BF16") == pytest.approx(1_894_278_547_552, rel=0.01)


def test_ggml_bytes_exact():
    assert quants.ggml_bytes((4096, 4096), "Q4_K") == 4096 * 4096 // 256 * 144
    assert quants.ggml_bytes((2880, 2880, 32), "MXFP4") == 2880 * 2880 * 32 // 32 * 17
    assert quants.ggml_bytes((10,), "F32") == 40


# ------------------------------------------------------------------------------------ type rules
def _use_more_bits(i: int, n: int) -> bool:
    # quants.md §2.4, written out independently of moesim.quants.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _types(mid: str, quant: str) -> dict:
    return {t.name: typ for t, typ, _nb in quants.assign(INGEST.model(mid), quant)}


def _layer_of(name: str) -> int:
    return int(re.match(r"blk\.(\d+)\.", name).group(1))


def test_use_more_bits_reference_layers():
    sel = [i for i in range(32) if _use_more_bits(i, 32)]
    assert sel == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_q4_k_m_llama3_8b_rules():
    types = _types("llama-3-8b", "Q4_K_M")
    n = 32
    downs = {_layer_of(k): v for k, v in types.items() if k.endswith("ffn_down.weight")}
    assert len(downs) == n
    for i, typ in downs.items():
        assert typ == ("Q6_K" if _use_more_bits(i, n) else "Q4_K"), f"ffn_down layer {i}: {typ}"
    vs = {_layer_of(k): v for k, v in types.items() if k.endswith("attn_v.weight")}
    for i, typ in vs.items():
        assert typ == ("Q6_K" if _use_more_bits(i, n) else "Q4_K"), f"attn_v layer {i}: {typ}"
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    assert types["blk.5.attn_q.weight"] == "Q4_K"
    assert types["blk.5.ffn_gate.weight"] == "Q4_K"
    assert types["blk.5.attn_norm.weight"] == "F32"
    assert types["output_norm.weight"] == "F32"


def test_q4_k_m_moe_ffn_down_exps_follow_layer_index():
    # Qwen3-30B-A3B: 48 MoE layers; ffn_down_exps upgraded on use_more_bits layers, gate/up never.
    types = _types("qwen3-30b-a3b", "Q4_K_M")
    for name, typ in types.items():
        if name.endswith("ffn_down_exps.weight"):
            assert typ == ("Q6_K" if _use_more_bits(_layer_of(name), 48) else "Q4_K"), name
        elif name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            assert typ == "Q4_K", name


@pytest.mark.parametrize("mid,quant", [("qwen3-30b-a3b", "Q4_K_M"), ("deepseek-v3", "Q2_K"),
                                       ("gpt-oss-20b", "MXFP4_MOE"), ("mixtral-8x7b", "IQ2_XXS"),
                                       ("glm-4.5-air", "Q8_0")])
def test_router_never_quantized(mid, quant):
    routers = {k: v for k, v in _types(mid, quant).items() if "ffn_gate_inp" in k}
    assert routers, mid
    assert set(routers.values()) == {"F32"}, (mid, quant, set(routers.values()))


def test_mixtral_eight_expert_rules():
    types = _types("mixtral-8x7b", "Q4_K_M")
    for i in range(32):
        assert types[f"blk.{i}.attn_v.weight"] == "Q8_0", i
        assert types[f"blk.{i}.attn_k.weight"] == "Q8_0", i
        assert types[f"blk.{i}.attn_output.weight"] == "Q5_K", i


def test_mxfp4_moe_rules():
    for mid in ("gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v2-lite"):
        seen_exps = seen_other = 0
        for t, typ, nb in quants.assign(INGEST.model(mid), "MXFP4_MOE"):
            quantizable = (t.name.endswith("weight") and len(t.shape) >= 2 and "_norm" not in t.name
                           and "ffn_gate_inp" not in t.name)
            if not quantizable:
                assert typ == "F32", (mid, t.name, typ)
            elif len(t.shape) > 2 and t.shape[2] > 1:
                # LQ: "ne[2] > 1" (stacked experts; also DeepSeek's per-head 3-D attn_k_b/attn_v_b)
                assert typ == "MXFP4", (mid, t.name, typ)
                assert nb == t.n_elements // 32 * 17
                seen_exps += "_exps" in t.name
            else:
                assert typ == "Q8_0", (mid, t.name, typ)
                seen_other += 1
        assert seen_exps and seen_other, mid


def test_fp8_format_keeps_embeddings_and_head_bf16():
    m = INGEST.model("deepseek-v3")
    by_name = {t.name: (t, typ, nb) for t, typ, nb in quants.assign(m, "fp8")}
    for name in ("token_embd.weight", "output.weight", "blk.5.ffn_gate_inp.weight"):
        t, typ, nb = by_name[name]
        assert typ == "bf16", name
        assert nb == 2 * t.n_elements, name
    t, typ, nb = by_name["blk.5.attn_q_a.weight"]          # (7168, 1536): 56 x 12 blocks of 128x128
    assert typ == "fp8"
    assert nb == 7168 * 1536 + 56 * 12 * 4
    t, typ, nb = by_name["blk.5.ffn_down_exps.weight"]
    assert typ == "fp8"
    assert nb == t.n_elements + 16 * 56 * 256 * 4


def test_fallback_for_rows_not_divisible_by_block():
    # gpt-oss rows are 2880 long (not a multiple of 256): K-quants fall back (LQ).
    types = _types("gpt-oss-20b", "Q4_K_M")
    assert types["blk.0.attn_q.weight"] == "Q5_0"
    assert types["blk.0.ffn_down_exps.weight"] == "MXFP4"       # the checkpoint's experts stay (gguf_native_experts)
    # llama.cpp's own rule for those experts, as it quantizes a bf16 copy of them
    m = INGEST.model("gpt-oss-20b")
    walk = {t.name: typ for t, typ, _ in GT.gguf_assign(m, "Q4_K_M", "Q4_K", quants.ggml_types(), False)}
    assert walk["blk.0.ffn_down_exps.weight"] == "Q8_0"         # Q6_K (use_more_bits) -> Q8_0
    assert walk["blk.4.ffn_down_exps.weight"] == "Q5_0"         # Q4_K -> Q5_0


# ------------------------------------------------------------------------------------ HF round trip
@pytest.mark.parametrize("mid", ALL_IDS)
def test_hf_config_round_trip(mid):
    cat = INGEST.model(mid)
    parsed = Model.from_hf_config(models.hf_config(mid), id=mid)
    assert parsed == cat, mid
    assert parsed.param_counts() == cat.param_counts()


def test_hf_config_round_trip_detects_changes():
    cfg = models.hf_config("qwen3-30b-a3b")
    cfg["num_experts_per_tok"] = 4
    parsed = Model.from_hf_config(cfg, id="qwen3-30b-a3b", name=INGEST.model("qwen3-30b-a3b").name)
    assert parsed != INGEST.model("qwen3-30b-a3b")


def test_hf_config_from_file(tmp_path):
    import json
    cfg = models.hf_config("mixtral-8x7b")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    parsed = Model.from_hf_config(tmp_path, id="mixtral-8x7b", name="Mixtral-8x7B")
    assert parsed == INGEST.model("mixtral-8x7b")
    assert parsed.source.startswith("config.json at")
