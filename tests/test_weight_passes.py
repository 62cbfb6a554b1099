"""runtimes.toml [backends.*] weight_pass_tokens: llama.cpp's tiled prompt GEMMs read their weights once per tile of
tokens (CUDA MMQ: mmq_x, 128 with int8 MMA, 64 with dp4a or under HIP on RDNA; Vulkan mul_mm: 128), on GPU layers
and routed experts alike."""
from __future__ import annotations

import math

import numpy as np
import pytest

import moesim
from moesim.engine.lower.machine import lower_machine
from moesim.engine.prefill import _expert_times, weight_passes
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime


def _hw(gpu: str, rid: str, placement: str = "all-gpu", model: str = "qwen3-30b-a3b", quant: str = "Q4_K_M") -> dict:
    m = moesim.model(model)
    mach = moesim.machine(gpu=gpu)
    return lower_machine(mach, runtime(rid), parse_placement(placement, m, mach),
                         Q.kernel_mix(m, Q.resolve(quant, m)))


@pytest.mark.parametrize("gpu, rid, tile", [
    ("rtx-4090", "llama.cpp", 128), ("h100-sxm", "llama.cpp", 128), ("dgx-spark", "llama.cpp", 128),
    ("tesla-p40", "llama.cpp", 64), ("gtx-1080-ti", "llama.cpp", 64),          # Pascal: dp4a MMQ
    ("rx-9070-xt", "llama.cpp-hip", 64), ("ryzen-ai-max-plus-395", "llama.cpp-hip", 64),
    ("rx-9070-xt", "llama.cpp-vulkan", 128), ("arc-b580", "llama.cpp-vulkan", 128),   # mul_mm's 128 x 128 tiles
    ("arc-b580", "llama.cpp", 0),                                             # SYCL: oneDNN's GEMM tiles unknown
    ("m3-max", "llama.cpp", 0), ("rtx-4090", "vllm", 0)])
def test_the_backend_sets_the_tile(gpu, rid, tile):
    assert _hw(gpu, rid)["prefill_weight_pass_tokens"] == tile


def test_cpu_only_has_no_gpu_tiles():
    assert _hw("dgx-spark", "llama.cpp", "cpu-only")["prefill_weight_pass_tokens"] == 0.0


def test_dense_passes_are_whole_tiles():
    hw = {"prefill_weight_pass_tokens": 128.0}
    assert [weight_passes(hw, n) for n in (1, 128, 129, 512, 2048)] == [1, 1, 2, 4, 16]
    assert weight_passes({}, 2048) == 1.0


def test_expert_reads_once_per_tile_of_their_tokens():
    """8 experts, top-2, uniform routing, a 4096-token ubatch: every expert is used, 1024 tokens each, so each is
    read 1024 / 128 + 0.5 = 8.5 times; at 16 tokens (< one tile each) once."""
    q = np.full(8, 2 / 8)
    eb, ef, bw, gemm = 1e8, 2e8, 4e11, 5e12
    layer = dict(layers=np.array([0]), moe_rows=np.array([0]), q=q[None, :], mode=np.array([0]),
                 gpu_share=np.array([1.0]), eb=np.array([eb]), ef=np.array([ef]), layer_experts=np.array([8.0]))
    hw = dict(gpu_bw=bw, host_bw=bw, pcie_bw=bw, pcie_links=1, overlap=0, amx_flops=0.0, sync_s=0.0,
              prefill_weight_pass_tokens=128.0)
    dm = dict(amx_flops_per_cycle=0.0)
    distinct = 8 * (1 - (6 / 8) ** 4096)
    t = _expert_times(layer, dm, hw, 4096, 2, gemm, 1e12, None, layerwise=False, offload=False)
    per = 8192 / distinct
    assert t[0] == pytest.approx(distinct * (per / 128 + 0.5) * eb / bw + 8192 * ef / gemm)
    distinct16 = 8 * (1 - (6 / 8) ** 16)
    t16 = _expert_times(layer, dm, hw, 16, 2, gemm, 1e12, None, layerwise=False, offload=False)
    assert t16[0] == pytest.approx(distinct16 * eb / bw + 32 * ef / gemm)


def test_bytes_per_weight_matter_where_bandwidth_is_scarce():
    """The passes cost bytes, not FLOPs: on a GB10 (273 GB/s) a Q8_0 7B's pp2048 slows by more than a Q4_0's,
    and on an H100 (3.35 TB/s) the same passes cost far less (llama.cpp benches/dgx-spark.md: Qwen2.5-Coder-7B
    Q8_0 runs at 29.6 TFLOPS, Gemma-3-4B Q4_0 at 36.6)."""
    from moesim.engine.lower import machine as LM
    original = LM.backend_terms

    def rate(gpu, quant, tiles):
        def terms(rt, g):
            t = original(rt, g)
            return dict(t, weight_pass_tokens=0.0) if (t and not tiles) else t
        LM.backend_terms = terms
        try:
            return moesim.simulate("qwen2.5-7b", machine=moesim.machine(gpu=gpu), quant=quant, context=2048,
                                   prompt=2048, ubatch=2048, mode="analytic").prefill_tok_s
        finally:
            LM.backend_terms = original
    slow = {q: rate("dgx-spark", q, True) / rate("dgx-spark", q, False) for q in ("Q8_0", "Q4_0")}
    assert slow["Q8_0"] < slow["Q4_0"] < 1.0
    h100 = rate("h100-sxm", "Q8_0", True) / rate("h100-sxm", "Q8_0", False)
    assert 1.0 > h100 > slow["Q8_0"]
    assert not math.isnan(h100)
