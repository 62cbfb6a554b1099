"""GGUF files of a checkpoint whose routed experts are already MXFP4 (gpt-oss) keep them MXFP4 under every
file type; the file type sets only the other tensors (quants.toml gguf_native_experts). Held against the
published file sizes the catalog cites."""
from __future__ import annotations

import pytest

import moesim
from moesim.spec import quants as Q

GIB = 2 ** 30


def _gib(mid: str, quant: str) -> float:
    return float(Q.weight_table(moesim.model(mid), quant).nbytes.sum()) / GIB


# unsloth/gpt-oss-120b-GGUF, GiB per file (quants.toml gguf_native_experts' source); the files add a few
# MiB of metadata and of tensors moesim does not list (biases, sinks)
UNSLOTH_120B = {"Q2_K": 58.27, "Q4_K_M": 58.46, "Q8_0": 59.03, "F16": 60.88}


@pytest.mark.parametrize("quant,published", sorted(UNSLOTH_120B.items()))
def test_gpt_oss_120b_file_sizes_match_the_published_files(quant, published):
    assert _gib("gpt-oss-120b", quant) == pytest.approx(published, abs=0.05)


def test_gpt_oss_20b_q6_k_is_the_size_of_the_mxfp4_file():
    # bartowski/openai_gpt-oss-20b-GGUF: MXFP4 12.1 GB, Q6_K 12.04 GB ("all FFN kept at MXFP4_MOE")
    assert _gib("gpt-oss-20b", "MXFP4") * GIB / 1e9 == pytest.approx(12.1, abs=0.05)
    assert _gib("gpt-oss-20b", "Q6_K") * GIB / 1e9 == pytest.approx(12.04, abs=0.05)


@pytest.mark.parametrize("quant", ["F16", "BF16", "Q8_0", "Q4_K_M", "Q2_K", "IQ2_XXS", "Q4_0"])
def test_routed_experts_stay_mxfp4_and_the_rest_follows_the_file_type(quant):
    m = moesim.model("gpt-oss-120b")
    rows = Q.assign(m, quant)
    experts = {typ for t, typ, _ in rows if t.cls == "routed_experts" and t.name.endswith("weight")}
    assert experts == {"MXFP4"}
    attention = {typ for t, typ, _ in rows if t.cls == "attention" and len(t.shape) >= 2}
    assert "MXFP4" not in attention
    if quant in ("F16", "BF16", "Q8_0"):
        assert attention == {quant}


def test_only_checkpoints_with_mxfp4_experts_keep_them():
    assert Q.native_expert_type(moesim.model("gpt-oss-20b")) == "MXFP4"
    for mid in ("qwen3-30b-a3b", "kimi-k2", "deepseek-r1", "mixtral-8x7b"):
        m = moesim.model(mid)
        assert Q.native_expert_type(m) is None, mid
        assert {typ for t, typ, _ in Q.assign(m, "F16")
                if t.cls == "routed_experts" and t.name.endswith("weight")} == {"F16"}, mid


def test_fit_table_of_gpt_oss_120b_no_longer_doubles_with_the_quant():
    # the GGUF ladder of one model spans 58-61 GiB, not 62-218 GiB
    sizes = [_gib("gpt-oss-120b", q) for q in ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16")]
    assert max(sizes) - min(sizes) < 3.0
