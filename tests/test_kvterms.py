"""The KV cache itemised by layer kind (analysis.kvterms): DeepSeek-V4-Pro against a hand computation
from its config, the seed's 9.62 GiB, the items summing to the memory kernel's bytes for every catalog
model, and fp8 never above bf16."""
import pytest
from hypothesis import given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.analysis.kvterms import kv_terms, kv_terms_total
from moesim.engine import memory as EM
from moesim.spec import models as M
from moesim.spec import quants as Q

GIB = 2**30

# DeepSeek-V4-Pro (models.md, HF config): 61 layers, compress_ratios 31 x 128 and 30 x 4, head_dim 512,
# sliding_window 128, index_head_dim 128. Every layer keeps the window; ratio-4 (c4a) layers add an
# indexer key per compressed entry. Compressor state (fp32, AIC-sdk): 2 * r * coff * head_dim * 4 B,
# coff 2 at ratio 4 (plus 2 * 4 * 2 * 128 * 4 B for the indexer's compressor), 1 at ratio 128.
N_C4, N_C128, HEAD, WINDOW, IDX = 30, 31, 512, 128, 128
STATE_C4 = 2 * 4 * 2 * HEAD * 4 + 2 * 4 * 2 * IDX * 4
STATE_C128 = 2 * 128 * 1 * HEAD * 4


def hand_v4_pro(context: int, attn_bytes: float, indexer_entry: float) -> float:
    window = (N_C4 + N_C128) * min(context, WINDOW) * HEAD * attn_bytes
    c4 = N_C4 * (context // 4) * (HEAD * attn_bytes + indexer_entry)
    c128 = N_C128 * (context // 128) * HEAD * attn_bytes
    return window + c4 + c128 + N_C4 * STATE_C4 + N_C128 * STATE_C128


# (KV dtype, attention bytes per element, indexer bytes per entry): bf16 throughout (the seed's
# accounting: 128 x 2 B indexer), the plain bf16 / fp8 KV dtypes with vLLM's default fp8 indexer
# (128 B + one fp32 scale), and vLLM's recipe fp8 + MXFP4 indexer (64 B + 4 ue8m0 scale bytes).
SETTINGS = [("bf16+bf16", 2.0, 256.0), ("bf16", 2.0, 132.0), ("fp8", 1.0, 132.0), ("fp8+fp4", 1.0, 68.0)]


@pytest.mark.parametrize("context", [4096, 131072, 1048576])
@pytest.mark.parametrize("kv,attn_bytes,indexer_entry", SETTINGS)
def test_v4_pro_terms_match_hand_computation(context, kv, attn_bytes, indexer_entry):
    m = M.catalog_model("deepseek-v4-pro")
    rows = kv_terms(m, kv, context)
    assert kv_terms_total(rows) == pytest.approx(hand_v4_pro(context, attn_bytes, indexer_entry), rel=1e-12)
    idx = [r for r in rows if r["kind"] == "compressed indexer keys"]
    assert len(idx) == 1 and idx[0]["layers"] == N_C4 and idx[0]["bytes_per_entry"] == indexer_entry
    assert idx[0]["dtype"] == Q.indexer_dtype(kv)
    comp = {r["tokens_per_entry"]: r for r in rows if r["kind"] == "compressed entries"}
    assert comp[4]["layers"] == N_C4 and comp[128]["layers"] == N_C128
    assert comp[4]["bytes_per_entry"] == HEAD * attn_bytes and comp[4]["entries"] == context // 4
    assert all(r["source"] for r in rows)


def test_seed_figure_is_the_all_bf16_accounting():
    """The seed's 'about 9.62 GiB per sequence at 1M in bf16': 30 x (128 + N/4) shared-KV + N/4 bf16
    indexer entries + 31 x (128 + N/128) entries; the compressor state adds 16.8 MB on top."""
    n = 1048576
    seed = (30 * ((128 + n // 4) * 1024 + (n // 4) * 256) + 31 * (128 + n // 128) * 1024) / GIB
    assert round(seed, 2) == 9.62
    rows = kv_terms(M.catalog_model("deepseek-v4-pro"), "bf16+bf16", n)
    caches = sum(r["bytes_at_context"] for r in rows if not r["fixed_bytes"]) / GIB
    assert caches == pytest.approx(seed, rel=1e-12)
    runtime = kv_terms_total(kv_terms(M.catalog_model("deepseek-v4-pro"), "fp8+fp4", n)) / GIB
    assert runtime < 0.5 * kv_terms_total(rows) / GIB        # "halves again with fp4 or fp8"


@pytest.fixture(scope="module")
def big_machine():
    return moesim.machine(id="dgx-b200")


@pytest.mark.parametrize("kv", ["bf16", "fp8+fp4"])
def test_terms_sum_to_the_kernel_for_every_catalog_model(big_machine, kv):
    context = 5000                                 # vLLM pages 16 tokens: 5008 cached
    for mid in M.model_ids():
        m = M.catalog_model(mid)
        mtp = 1 if m.mtp_layers else 0
        r = EM.memory(mid, big_machine, "native", context=context, batch=3, kv_dtype=kv, runtime="vllm", mtp=mtp)
        rows = kv_terms(m, kv, context, mtp=mtp, granularity=16)
        assert 3 * kv_terms_total(rows) == pytest.approx(r.kv + r.state, rel=1e-12), mid


def test_fit_json_lists_the_terms(big_machine):
    rec = moesim.fit("deepseek-v4-pro", big_machine, runtime="vllm", context=131072, kv_dtype="fp8+fp4")[0]
    assert rec["kv_dtype"] == "fp8+fp4"
    assert kv_terms_total(rec["kv_terms"]) == pytest.approx(rec["kv_bytes"] + rec["state_bytes"], rel=1e-12)
    assert "--attention_config.use_fp4_indexer_cache=True" in rec["flags"]


@pytest.mark.parametrize("bad", ["fp8+q4_0", "fp9", "bf16+"])
def test_bad_indexer_dtype_names_kv_dtype(bad):
    with pytest.raises(MoesimError) as e:
        Q.canonical_kv_dtype(bad)
    assert e.value.field == "kv_dtype"


_MODELS = [mid for mid in M.model_ids()]


@settings(max_examples=60, deadline=None)
@given(mid=st.sampled_from(_MODELS), context=st.integers(1, 1 << 20),
       indexer=st.sampled_from(["", "+bf16", "+fp8", "+fp4"]))
def test_fp8_never_above_bf16(mid, context, indexer):
    m = M.catalog_model(mid)
    fp8 = kv_terms_total(kv_terms(m, "fp8" + indexer, context))
    bf16 = kv_terms_total(kv_terms(m, "bf16" + indexer, context))
    assert fp8 <= bf16
    # and the runtime's fp8 attention + fp4 indexer is never above the all-bf16 accounting
    assert kv_terms_total(kv_terms(m, "fp8+fp4", context)) <= kv_terms_total(kv_terms(m, "bf16+bf16", context))


@settings(max_examples=30, deadline=None)
@given(mid=st.sampled_from(_MODELS), context=st.integers(1, 1 << 20), batch=st.integers(1, 8),
       runtime=st.sampled_from(["vllm", "sglang"]))
def test_fp8_kernel_memory_never_above_bf16(mid, context, batch, runtime):
    """The same invariant on what the memory kernel allocates (padding, batch, the runtime's layout)."""
    mach = moesim.machine(id="dgx-b200")
    context = min(context, M.catalog_model(mid).max_context)
    got = {kv: EM.memory(mid, mach, "native", context=context, batch=batch, kv_dtype=kv, runtime=runtime)
           for kv in ("bf16", "fp8", "bf16+bf16", "fp8+fp4")}
    assert got["fp8"].kv + got["fp8"].state <= got["bf16"].kv + got["bf16"].state
    assert got["fp8+fp4"].kv + got["fp8+fp4"].state <= got["bf16+bf16"].kv + got["bf16+bf16"].state
    assert got["fp8"].kv_bytes_per_token <= got["bf16"].kv_bytes_per_token
