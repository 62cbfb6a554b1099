"""The MoE families read by spec/architectures_more.py (Hunyuan, dots.llm1, Ling/Ring, Granite MoE and
Granite-4.0-H, OLMoE, Phi-3.5-MoE, MiniMax-Text-01/M1, Qwen3.5 and Qwen3-VL MoE text, Grok-1, Arcee
Trinity, SmallThinker) and the catalog entries added
with them: active parameters against the vendors' figures, hand-computed layer weights and cache bytes,
routing-profile fallback, and the fit / simulate commands on every new id.

Figures are written out here (with the card they come from) rather than read from the catalog, so a
catalog edit cannot make a test agree with itself.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re

import pytest

import moesim
from conftest import bounded, fuzz_count, rewrite

from moesim import ingest as INGEST
from moesim.cli import main
from moesim.engine import memory as mem
from moesim.errors import MoesimError
from moesim.spec import hardware, models
from moesim.spec.models import Model
from moesim.spec.routing import profile

# Active parameters per vendor figure: (figure, counting convention, relative tolerance). Conventions as in
# test_catalog._active: "all" counts everything, "no_embed" drops the token table, "no_embed_head" drops
# the table and an untied head. 3 % for precise figures, 35 % for name-only ones ("A3B").
ACTIVE_CHECKS = {
    # Hunyuan README 13B activated; tied embeddings counted once (derived 12.75B, -1.9 %).
    "hunyuan-a13b": (13e9, "all", 0.03),
    "hunyuan-a13b-pretrain": (13e9, "all", 0.03),
    # dots.llm1 report: 14B activated (derived 14.02B with table and head).
    "dots.llm1.inst": (14e9, "all", 0.03),
    "dots.llm1.base": (14e9, "all", 0.03),
    # Ling README: 2.75B activated (derived 2.753B).
    "ling-lite-1.5": (2.75e9, "all", 0.03),
    "ling-lite": (2.75e9, "all", 0.03),
    "ring-lite": (2.75e9, "all", 0.03),
    "ling-coder-lite": (2.75e9, "all", 0.03),
    # Ling-mini-2.0 card: 1.4B activated (derived 1.433B, +2.4 %), 789M non-embedding (checked below).
    "ling-mini-2.0": (1.4e9, "all", 0.03),
    "ring-mini-2.0": (1.4e9, "all", 0.03),
    # Ling-flash-2.0 card: 6.1B activated, 4.8B non-embedding.
    "ling-flash-2.0": (6.1e9, "all", 0.03),
    "ring-flash-2.0": (6.1e9, "all", 0.03),
    # Granite cards: 800M active excluding the (tied) embedding table (+0.9 %).
    "granite-3.1-3b-a800m": (0.8e9, "no_embed", 0.03),
    "granite-3.0-3b-a800m": (0.8e9, "no_embed", 0.03),
    # "400M active" is a headline: derived 0.378B without the table (-5.4 %), 0.429B with it.
    "granite-3.0-1b-a400m": (0.4e9, "no_embed", 0.35),
    "granite-3.1-1b-a400m": (0.4e9, "no_embed", 0.35),
    # Granite 4.0 card: H-Small 9B active (derived 8.82B, -2.0 %); H-Micro is dense.
    "granite-4.0-h-small": (9e9, "all", 0.03),
    "granite-4.0-h-micro": (3.2e9, "all", 0.03),
    # Phi-3.5-MoE card: 6.6B active parameters (derived 6.64B).
    "phi-3.5-moe": (6.6e9, "all", 0.03),
    # MiniMax: 45.9B activated per token; without table and head +0.2 % (no_embed +2.9 %).
    "minimax-m1-80k": (45.9e9, "no_embed_head", 0.03),
    "minimax-m1-40k": (45.9e9, "no_embed_head", 0.03),
    "minimax-text-01": (45.9e9, "no_embed_head", 0.03),
    # OLMoE paper: 1.3B (1.28B) active of 6.9B.
    "olmoe-1b-7b": (1.28e9, "all", 0.03),
    "olmoe-1b-7b-0125": (1.28e9, "all", 0.03),
    # Kimi-VL card: 2.8B activated (derived 2.92B with the table, +4.1 %; no_embed -7.9 %).
    "kimi-vl-a3b": (2.8e9, "all", 0.35),
    "kimi-vl-a3b-thinking": (2.8e9, "all", 0.35),
    # "A3B" names: derived 2.95B without the table (-1.8 %).
    "qwen3.5-35b-a3b": (3e9, "no_embed", 0.35),
    "qwen3.6-35b-a3b": (3e9, "no_embed", 0.35),
    # Qwen3.5 cards: 17B activated of 397B (derived 17.35B, +2.1 %), 10B of 122B (9.77B, -2.3 %); 27B dense
    "qwen3.5-397b-a17b": (17e9, "all", 0.03),
    "qwen3.5-122b-a10b": (10e9, "all", 0.03),
    # Qwen3-Coder-Next = the Qwen3-Next-80B-A3B architecture ("A3B" rounds 3.56B down, +18.8 %, as in test_catalog)
    "qwen3-coder-next": (3e9, "no_embed", 0.35),
    # MiniMax-M2.5 / M2.1 = the MiniMax-M2 geometry (10B activated, as minimax-m2 in test_catalog: +4.2 %);
    # Kimi-K2.5's text backbone = Kimi-K2-Thinking's (32B activated without the table)
    "minimax-m2.5": (10e9, "no_embed", 0.35),
    "minimax-m2.1": (10e9, "no_embed", 0.35),
    "kimi-k2.5": (32e9, "no_embed", 0.03),
    # gpt-oss-safeguard = gpt-oss weights: active excludes the embedding table (+0.6 %, +0.2 %).
    "gpt-oss-safeguard-120b": (5.1e9, "no_embed", 0.03),
    "gpt-oss-safeguard-20b": (3.6e9, "no_embed", 0.03),
    # Grok-1: 86B active of 314B (OLMoE paper's table); derived 83.8B counting the shared table once (-2.6 %).
    "grok-1": (86e9, "all", 0.03),
    # Granite-4.0-H-Tiny "7B-A1B": derived 1.31B without the table (+31 %; the shared MLP and the Mamba
    # mixers run for every token); H-1B is a dense hybrid of ~1.5B.
    "granite-4.0-h-tiny": (1e9, "no_embed", 0.35),
    "granite-4.0-h-1b": (1.5e9, "all", 0.03),
    # Trinity cards: Mini 3B active (+2.2 % without the table), Large 13B (-1.9 %), Nano "A1B" (-18 %).
    "trinity-nano": (1e9, "no_embed", 0.35),
    "trinity-mini": (3e9, "no_embed", 0.03),
    "trinity-large": (13e9, "no_embed", 0.03),
    # SmallThinker card "0.6B activated": derived 0.631B without the (tied) table (+5.1 %).
    "smallthinker-4b-a0.6b": (0.6e9, "no_embed", 0.35),
    # Qwen counts everything, as for Qwen3-235B-A22B in test_catalog (derived 3.35B, +1.6 %).
    "qwen3-vl-30b-a3b": (3.3e9, "all", 0.03),
    "qwen3-vl-30b-a3b-thinking": (3.3e9, "all", 0.03),
}
NEW_IDS = sorted(ACTIVE_CHECKS)

# The config readers this module adds, one catalog id reading each.
FAMILY_EXAMPLES = {
    "hunyuan_v1_moe": "hunyuan-a13b", "dots1": "dots.llm1.inst", "bailing_moe": "ling-mini-2.0",
    "granitemoe": "granite-3.1-3b-a800m", "granitemoehybrid": "granite-4.0-h-small", "olmoe": "olmoe-1b-7b",
    "phimoe": "phi-3.5-moe", "minimax_m1": "minimax-m1-80k", "minimax_text_01": "minimax-text-01",
    "qwen3_5_moe_text": "qwen3.5-35b-a3b", "grok-1": "grok-1", "afmoe": "trinity-nano",
    "smallthinker": "smallthinker-4b-a0.6b", "qwen3_vl_moe_text": "qwen3-vl-30b-a3b",
}


def _active(m: Model, convention: str) -> float:
    _, active = m.param_counts()
    table = m.hidden * m.vocab
    return {"all": active, "no_embed": active - table,
            "no_embed_head": active - table * (1 if m.tie_embeddings else 2)}[convention]


def _cli_json(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv) + ["--json"])
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def h200():
    return hardware.machine("dgx-h200")


# ------------------------------------------------------------------------------------ catalog
def test_new_ids_are_in_the_catalog_with_sources_and_hf_ids():
    entries = models._catalog.load("models")["models"]
    missing = [i for i in NEW_IDS if i not in entries]
    assert not missing, missing
    seen = {}
    for mid in NEW_IDS:
        e = entries[mid]
        assert e.get("source") and e.get("published_source") and e.get("native_quant"), mid
        hf = e.get("hf_ids")
        assert isinstance(hf, list) and hf, mid
        for repo in hf:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo), (mid, repo)
            assert repo not in seen, f"{repo} listed by {seen.get(repo)} and {mid}"
            seen[repo] = mid


@pytest.mark.parametrize("family,mid", sorted(FAMILY_EXAMPLES.items()))
def test_family_is_read_by_its_own_parser(family, mid):
    assert INGEST.model(mid).family == family


@pytest.mark.parametrize("mid", NEW_IDS)
def test_active_params_match_the_vendor(mid):
    figure, convention, tol = ACTIVE_CHECKS[mid]
    got = _active(INGEST.model(mid), convention)
    assert got == pytest.approx(figure, rel=tol), f"{mid}: {convention} active {got / 1e9:.3f}B vs {figure / 1e9}B"


def test_ling_2_non_embedding_active_counts():
    # Ling-mini-2.0 card: 789M non-embedding activated; Ling-flash-2.0: 4.8B (table and head excluded).
    assert _active(INGEST.model("ling-mini-2.0"), "no_embed_head") == pytest.approx(789e6, rel=0.01)
    assert _active(INGEST.model("ling-flash-2.0"), "no_embed_head") == pytest.approx(4.8e9, rel=0.03)


# ------------------------------------------------------------------------------------ hand counts
def _layer_params(m: Model, index: int) -> dict:
    out: dict = {}
    for t in m.tensors(include_mtp=False):
        if t.layer == index:
            out[t.cls] = out.get(t.cls, 0) + t.n_elements
    return out


def test_hunyuan_layer_weights_and_kv(h200):
    # GQA 32 x 128 query heads, 8 KV heads, per-head QK norm, two block norms; 64 experts of 3 x 4096 x 3072,
    # router 4096 x 64, one always-on MLP of width 3072.
    m = INGEST.model("hunyuan-a13b")
    p = _layer_params(m, 7)
    assert p["attention"] == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 2 * 4096
    assert p["routed_experts"] == 64 * 3 * 4096 * 3072
    assert p["shared_experts"] == 3 * 4096 * 3072
    assert p["router"] == 4096 * 64
    assert [l.ffn.top_k for l in m.layers] == [8] * 32
    r = mem.memory("hunyuan-a13b", h200, "bf16", context=4096, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2


def test_hunyuan_cross_layer_attention_is_refused():
    cfg = models.hf_config("hunyuan-a13b")
    with pytest.raises(MoesimError) as e:
        Model.from_hf_config({**cfg, "use_cla": True})
    assert e.value.field == "use_cla"


def test_dots1_first_layer_dense_then_shared_experts(h200):
    m = INGEST.model("dots.llm1.inst")
    assert m.layers[0].ffn.kind == "dense" and m.layers[0].ffn.intermediate == 10944
    ffn = m.layers[1].ffn
    assert (ffn.n_experts, ffn.top_k, ffn.n_shared, ffn.router_bias) == (128, 6, 2, True)
    assert _layer_params(m, 1)["shared_experts"] == 3 * 4096 * 2 * 1408
    # 62 full-attention layers of 32 KV heads x 128, bf16: 1,015,808 B per token.
    r = mem.memory("dots.llm1.inst", h200, "bf16", context=4096, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 62 * 2 * 32 * 128 * 2 == 1_015_808


def test_minimax_lightning_layers_hold_a_fixed_state(h200):
    m = INGEST.model("minimax-m1-80k")
    kinds = [l.attention.kind for l in m.layers]
    assert kinds.count("gdn") == 70 and kinds.count("gqa") == 10
    assert [i for i, k in enumerate(kinds) if k == "gqa"] == list(range(7, 80, 8))
    # Lightning attention: per head a 128 x 128 fp32 state, no conv tail: 4 MiB per layer per sequence.
    per_layer = 64 * 128 * 128 * 4
    r1 = mem.memory(m.id, h200, "bf16", context=1024, kv_dtype="bf16")
    r2 = mem.memory(m.id, h200, "bf16", context=65536, kv_dtype="bf16")
    assert r1.state == r2.state == 70 * per_layer
    # 10 softmax layers of 8 KV heads x 128: 40,960 B per token.
    assert r1.kv_bytes_per_token == 10 * 2 * 8 * 128 * 2 == 40_960
    # The gdn stand-in's weights, exactly: fused in-projection 6144 x 4 x 8192 (= lightning's q, k, v and
    # output gate), beta/alpha 6144 x 128, a one-column conv over 3 x 8192 channels, dt bias, A, norm, out.
    gdn = 6144 * 4 * 8192 + 6144 * 128 + 3 * 8192 + 64 + 64 + 128 + 8192 * 6144
    assert _layer_params(m, 0)["attention"] == gdn + 2 * 6144          # plus the two block norms
    # Lightning's own block (q/k/v + gate, out projection, a norm over 8192) is within 0.4 % of it.
    lightning = 4 * 6144 * 8192 + 8192 * 6144 + 8192
    assert lightning < gdn < 1.004 * lightning


def test_granite_4_h_mamba_state_and_attention_kv(h200):
    m = INGEST.model("granite-4.0-h-small")
    kinds = [l.attention.kind for l in m.layers]
    assert kinds.count("gdn") == 36 and [i for i, k in enumerate(kinds) if k == "gqa"] == [5, 15, 25, 35]
    # Mamba-2 state: 128 heads x d_state 128 x head_dim 64 fp32, plus a 3-column conv tail over
    # x (128 x 64) and B, C (1 group x 128 each) in bf16.
    per_layer = 128 * 128 * 64 * 4 + 3 * (128 * 64 + 2 * 128) * 2
    r = mem.memory(m.id, h200, "bf16", context=8192, kv_dtype="bf16")
    assert r.state == 36 * per_layer
    # 4 attention layers of 8 KV heads x 128 = 16,384 B per token (the KV-sizing guide's figure).
    assert r.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    ffn = m.layers[0].ffn
    assert (ffn.n_experts, ffn.top_k, ffn.n_shared, ffn.shared_intermediate) == (72, 10, 1, 1536)
    # The gdn stand-in's mixer weights, exactly (in-projection 4096 x (2 x 128 + 2 x 8192), beta/alpha
    # 4096 x 256, conv 4 x (256 + 8192), dt bias, A, norm 64, out 8192 x 4096), against a Mamba-2 block's
    # (in-projection 4096 x (2 x 8192 + 2 x 128 + 128 heads), conv with bias, dt bias, A, D, norm 8192, out).
    gdn = 4096 * (2 * 128 + 2 * 8192) + 4096 * 256 + 4 * (256 + 8192) + 128 + 128 + 64 + 8192 * 4096
    assert _layer_params(m, 0)["attention"] == gdn + 2 * 4096
    mamba2 = 4096 * (2 * 8192 + 2 * 128 + 128) + 5 * (8192 + 256) + 3 * 128 + 8192 + 8192 * 4096
    assert mamba2 < gdn < 1.006 * mamba2


def test_granite_4_h_micro_is_dense():
    m = INGEST.model("granite-4.0-h-micro")
    assert all(l.ffn.kind == "dense" and l.ffn.intermediate == 8192 for l in m.layers)
    total, active = m.param_counts()
    assert total == active


def test_bailing_v1_shared_width_and_v2_grouped_routing():
    lite = INGEST.model("ling-lite-1.5").layers[0].ffn
    # v1: two shared experts of the routed width (1408), no dense layer, no expert bias.
    assert (lite.kind, lite.n_shared, lite.shared_intermediate, lite.router_bias) == ("moe", 2, 1408, False)
    mini = INGEST.model("ling-mini-2.0")
    assert mini.layers[0].ffn.kind == "dense" and mini.layers[0].ffn.intermediate == 5120
    f = mini.layers[1].ffn
    assert (f.n_experts, f.top_k, f.n_group, f.topk_group, f.router_bias) == (256, 8, 8, 4, True)
    assert mini.layers[1].attention.qk_norm and not INGEST.model("ling-lite-1.5").layers[0].attention.qk_norm


def test_qwen3_5_text_pattern_and_cache(h200):
    m = INGEST.model("qwen3.5-35b-a3b")
    kinds = [l.attention.kind for l in m.layers]
    assert kinds.count("gdn") == 30 and [i for i, k in enumerate(kinds) if k == "gqa"] == list(range(3, 40, 4))
    r = mem.memory(m.id, h200, "bf16", context=4096, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2
    assert r.state == 30 * (32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2)


def test_trinity_gated_sliding_attention(h200):
    m = INGEST.model("trinity-nano")
    full = [i for i, l in enumerate(m.layers) if not l.attention.window]
    assert full == list(range(3, 56, 4))
    assert all(l.attention.window == 2048 and l.attention.output_gate for l in m.layers if l.index not in full)
    assert [l.ffn.kind for l in m.layers[:3]] == ["dense", "dense", "moe"]
    # q and its output gate (2 x 8 x 128), K and V (2 x 128 each), O, per-head q/k norms, two block norms.
    assert _layer_params(m, 3)["attention"] == 1024 * 2048 + 2 * 1024 * 256 + 1024 * 1024 + 2 * 128 + 2 * 1024
    # Past the window only the 14 full layers grow: 14 x 2 KV heads x 128 x K,V x 2 B = 14,336 B per token.
    r = mem.memory(m.id, h200, "bf16", context=8192, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 14 * 2 * 2 * 128 * 2 == 14_336
    assert r.kv == 14_336 * 8192 + 42 * 2048 * 2 * 2 * 128 * 2


def test_smallthinker_and_qwen3_vl_layers(h200):
    st = INGEST.model("smallthinker-4b-a0.6b")
    # 32 experts of up/gate/down 1536 x 768, router 1536 x 32; GQA 12 x 128 / 2 KV heads, no window.
    p = _layer_params(st, 0)
    assert p["routed_experts"] == 32 * 3 * 1536 * 768 and p["router"] == 1536 * 32
    assert all(l.attention.window == 0 for l in st.layers)
    r = mem.memory(st.id, h200, "bf16", context=4096, kv_dtype="bf16")
    assert r.kv_bytes_per_token == 32 * 2 * 2 * 128 * 2
    vl = INGEST.model("qwen3-vl-30b-a3b")
    # The Qwen3-VL text model is Qwen3-MoE's: QK norm on, 128 experts top-8 of 768, no shared expert.
    assert all(l.attention.qk_norm and l.ffn.n_shared == 0 for l in vl.layers)
    assert (vl.layers[0].ffn.n_experts, vl.layers[0].ffn.top_k, vl.layers[0].ffn.expert_intermediate) == (128, 8, 768)


def test_minimax_bad_layer_pattern_names_the_field():
    cfg = models.hf_config("minimax-m1-80k")
    for bad in ([0, 1] * 3, [2] * 80):
        with pytest.raises(MoesimError) as e:
            Model.from_hf_config({**cfg, "attn_type_list": bad})
        assert e.value.field == "attn_type_list"


HOSTILE = [-1, 0, 1, 3.5, 2**40, 1e300, float("nan"), "x", None, [], {}, True, [1, 2], ["mamba"]]


@pytest.mark.fuzz
def test_mutated_family_configs_give_a_sane_fit_or_a_named_error(tmp_path, tally):
    # Each new reader's config with one to three fields (any key, lists and flags included) set hostile:
    # a finite fit or a MoesimError naming a field, never a bare exception.
    rng = random.Random("moe-families")
    count = fuzz_count(20, 3_000)
    for _ in range(count):
        mid = rng.choice(sorted(FAMILY_EXAMPLES.values()))
        cfg = models.hf_config(mid)
        muts = [(k, rng.choice(HOSTILE)) for k in rng.sample(sorted(cfg), rng.randint(1, 3))]
        cfg.update(muts)
        rewrite(tmp_path / "config.json", json.dumps(cfg))
        with bounded(20, (mid, muts)):
            try:
                rec = moesim.fit(Model.from_hf_config(tmp_path), "desktop-4090", quants=["Q4_K_M"])[0]
            except MoesimError as exc:
                assert exc.field, (mid, muts, exc)
                tally.refuse()
                continue
        for v in (rec["weights_bytes"], rec["kv_bytes_per_token"], rec["decode_tok_s"] or 1.0):
            assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (mid, muts, rec)
        tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count


# ------------------------------------------------------------------------------------ routing
@pytest.mark.parametrize("family,mid", sorted(FAMILY_EXAMPLES.items()))
def test_routing_profile_falls_back_cleanly(family, mid):
    p = profile(family=INGEST.model(mid).family)
    assert p.id == ("olmoe:v2" if family == "olmoe" else "generic")   # olmoe: the v2 default (issue 15)


# ------------------------------------------------------------------------------------ commands
@pytest.mark.parametrize("mid", NEW_IDS)
def test_fit_and_simulate_run(mid):
    code, rows = _cli_json("fit", mid, "--gpu", "rtx-4090")
    assert code == 0 and rows, mid
    assert all(r["model"] == mid and r["weights_bytes"] > 0 and r["decode_tok_s"] > 0 for r in rows)
    code, r = _cli_json("simulate", mid, "--gpu", "h200", "--mode", "analytic", "--tokens", "32")
    assert code == 0 and r["model"] == mid and r["decode_tok_s"] > 0
