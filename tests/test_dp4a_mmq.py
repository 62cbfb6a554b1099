"""runtimes.toml [backends.cuda] moe_padded_tiles and int8_share: on Pascal's dp4a path ggml-cuda's routed-expert
MMQ computes whole ubatch-wide tiles for every used expert (mmq_x from ncols_max, PR #26977's description), and
its prompt GEMMs reach a third of the dp4a rate (PR #4766's P40 table)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import moesim
from moesim._catalog import load as _load_catalog
from moesim.analysis.validate import evaluate_rows, load_rows
from moesim.ingest.packaged import measurements_csv
from moesim.engine.lower.machine import backend_terms, lower_machine
from moesim.engine.prefill import _expert_times
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime


def catalog_gpu(gpu: str) -> dict:
    return _load_catalog("hardware")["gpu"][gpu]


def _hw(gpu: str, rid: str = "llama.cpp", model: str = "deepseek-v2-lite", quant: str = "Q4_0") -> dict:
    m = moesim.model(model)
    mach = moesim.machine(gpu=gpu)
    return lower_machine(mach, runtime(rid), parse_placement("all-gpu", m, mach), Q.kernel_mix(m, Q.resolve(quant, m)))


@pytest.mark.parametrize("gpu, tile, share", [
    ("tesla-p40", 64.0, 0.33), ("gtx-1080-ti", 64.0, 0.33),      # dp4a MMQ
    ("tesla-p100", 0.0, 0.0),                                    # no dp4a: cuBLAS per expert, the runtime's share
    ("rtx-4090", 0.0, 0.0), ("h100-sxm", 0.0, 0.0)])             # int8 MMA: padding rides on the tensor cores
def test_only_the_dp4a_path_pads_and_takes_its_share(gpu, tile, share):
    terms = backend_terms(runtime("llama.cpp"), catalog_gpu(gpu))
    assert terms["int8_share"] == share
    assert _hw(gpu)["prefill_moe_tile_tokens"] == tile


def test_hip_unified_and_served_runtimes_do_not_pad():
    assert _hw("rx-9070-xt", "llama.cpp-hip")["prefill_moe_tile_tokens"] == 0.0
    assert _hw("dgx-spark")["prefill_moe_tile_tokens"] == 0.0
    assert backend_terms(runtime("vllm"), catalog_gpu("tesla-p40")) == {}


def test_the_dp4a_share_sets_the_pascal_prompt_rate():
    """P40's prompt GEMMs at 0.33 of its 47 dp4a TOPS, whatever the fitted MMA share."""
    hw = _hw("tesla-p40", model="llama-2-7b")
    assert hw["prefill_gemm_flops"] == pytest.approx(0.33 * 47.0e12)


def _one_layer(experts: int, k: int):
    q = np.full(experts, k / experts)
    return dict(layers=np.array([0]), moe_rows=np.array([0]), q=q[None, :], mode=np.array([0]),
                gpu_share=np.array([1.0]), eb=np.array([1e6]), ef=np.array([2e7]),
                layer_experts=np.array([float(experts)]))


def _compute_s(n_tok: int, width_max: float, experts: int = 64, k: int = 6) -> float:
    """The compute part of one ubatch's expert GEMMs (bandwidth made free)."""
    hw = dict(gpu_bw=1e30, host_bw=1e30, pcie_bw=1e30, pcie_links=1, overlap=0, amx_flops=0.0, sync_s=0.0,
              prefill_weight_pass_tokens=64.0, prefill_moe_tile_tokens=width_max)
    return float(_expert_times(_one_layer(experts, k), dict(amx_flops_per_cycle=0.0), hw, n_tok, k, 1e12, 1e12,
                               None, layerwise=False, offload=False)[0])


def test_each_used_expert_computes_the_ubatch_wide_tile():
    """64 experts, top-6: at 16 tokens each used expert computes 16 columns (one tile of width 16), not its 1.5
    tokens; at 4096 tokens the width is 64 and an expert's 384 tokens take 384 / 64 + 0.5 tiles."""
    distinct16 = 64 * (1 - (58 / 64) ** 16)
    assert _compute_s(16, 64.0) == pytest.approx(distinct16 * 16 * 2e7 / 1e12)
    assert _compute_s(16, 0.0) == pytest.approx(16 * 6 * 2e7 / 1e12)
    assert _compute_s(13, 64.0) == pytest.approx(64 * (1 - (58 / 64) ** 13) * 16 * 2e7 / 1e12)   # width: 8s
    distinct = 64 * (1 - (58 / 64) ** 4096)
    per = 4096 * 6 / distinct
    assert _compute_s(4096, 64.0) == pytest.approx(distinct * (per / 64 + 0.5) * 64 * 2e7 / 1e12)


@pytest.mark.parametrize("n_tok", [9, 16, 33, 64, 65, 200, 512, 2048])
def test_padding_never_computes_fewer_columns_than_the_tokens_nor_more_than_every_expert_every_tile(n_tok):
    unpadded = _compute_s(n_tok, 0.0)
    assert unpadded * (1 - 1e-12) <= _compute_s(n_tok, 64.0)
    assert _compute_s(n_tok, 64.0) <= unpadded * 64 * math.ceil(n_tok / 8) * 8 / (n_tok * 6) * (1 + 1e-12)


@pytest.mark.parametrize("n_tok", [1, 2, 5, 8])
def test_eight_tokens_or_fewer_take_the_mat_vec_kernel_unpadded(n_tok):
    assert _compute_s(n_tok, 64.0) == _compute_s(n_tok, 0.0)


def test_the_p40_deepseek_lite_rows_follow_the_tiles():
    """PR #15525's P40 rows of the PR build at microbatch 16 and 64 (LC-n344 / n342 of the collected corpus):
    within 50 % with the tiles and the dp4a share (+126 / +346 % without either)."""
    rows = [r for r in load_rows(measurements_csv()) if r["id"] in ("LC-n342", "LC-n344")]
    _, records, _ = evaluate_rows(rows)
    assert len(records) == 2
    for rec in records:
        assert abs(rec["prefill_err"]) < 0.5, rec["id"]
