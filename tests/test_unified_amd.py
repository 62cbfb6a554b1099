"""Strix Halo (Ryzen AI Max) lowers from its own measured physics: the catalog's measured GPU bandwidth
(rocm_bandwidth_test), measured WMMA GEMM rate (mamf-finder with hipBLASLt) and the absence of CUDA graphs,
each with a source; Apple's and GB10's unified lowering do not move."""
from __future__ import annotations

import math

import pytest

import moesim
from moesim import _catalog
from moesim.engine.lower.machine import _mmq_rel, lower_machine
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime

STRIX = ["ryzen-ai-max-plus-395", "ryzen-ai-max-390", "ryzen-ai-max-385"]
MODEL, QUANT = "qwen3-30b-a3b", "Q4_K_M"


def _chip(uid):
    return _catalog.load("hardware")["unified"][uid]


def _lower(uid, placement="unified", rt_name="llama.cpp"):
    m = moesim.model(MODEL)
    mach = moesim.machine(gpu=uid)
    rt = runtime(rt_name)
    return lower_machine(mach, rt, parse_placement(placement, m, mach), Q.kernel_mix(m, Q.resolve(QUANT, m))), mach, rt


@pytest.mark.parametrize("uid", STRIX)
def test_strix_halo_fields_exist_with_sources(uid):
    chip = _chip(uid)
    assert 0 < chip["gpu_measured_bw_gbs"] < chip["mem_bw_gbs"]
    assert 0 < chip["gpu_measured_gemm_tflops"] < chip["gpu_tflops_fp16"]
    assert chip["cuda_graphs"] is False
    for key in ("gpu_measured_bw_source", "gpu_measured_gemm_source", "cuda_graphs_source"):
        assert "http" in chip[key], (uid, key)


@pytest.mark.parametrize("uid", STRIX)
def test_strix_halo_lowering_uses_the_measured_figures(uid):
    chip = _chip(uid)
    hw, mach, rt = _lower(uid)
    d = rt.decode
    assert math.isclose(hw["gpu_bw"], chip["gpu_measured_bw_gbs"] * 1e9 * d.gddr_bw_eff)
    # no HIP graphs: the graph-replayed kernels' latency, counted in the iGPU's cycles (x kernel_ref_mhz /
    # boost_mhz), plus the HIP backend's own per-layer cost on RDNA (runtimes.toml [backends.hip]
    # launch_us_nograph: host-side, not scaled); llama.cpp's default backend on an AMD chip is HIP
    clock = d.kernel_ref_mhz / chip["boost_mhz"]
    hip = _catalog.load("runtimes")["backends"]["hip"]["launch_us_nograph"]["gfx11"]
    assert math.isclose(hw["launch_s"], (d.layer_kernels * d.kernel_us * clock + hip) * 1e-6)
    m = moesim.model(MODEL)
    mix = Q.kernel_mix(m, Q.resolve(QUANT, m))
    want = chip["gpu_measured_gemm_tflops"] * 1e12 * d.prefill_flops_eff * _mmq_rel(mix, d)
    assert math.isclose(hw["prefill_flops"], max(want, hw["cpu_flops"]))
    # the CPU cores keep the spec pool: a GPU measurement does not bound them
    assert hw["host_bw"] <= mach.gpu_bw_gbs * 1e9 * d.gddr_bw_eff * (1 + 1e-12)


@pytest.mark.parametrize("uid", STRIX)
def test_cpu_only_runs_on_strix_halo_ignore_the_gpu_measurements(uid):
    hw, mach, rt = _lower(uid, "cpu-only")
    assert math.isclose(hw["gpu_bw"], mach.gpu_bw_gbs * 1e9 * rt.decode.gddr_bw_eff)
    assert hw["launch_s"] == 0.0


def test_apple_lowering_is_unchanged():
    """Pinned from the lowering before the Strix Halo fields (commit f249a59, calibration.toml of then);
    a calibration refit moves these, the formula check below does not."""
    hw, mach, rt = _lower("m4-max-32c")
    d = rt.decode
    assert math.isclose(hw["gpu_bw"], mach.gpu_bw_gbs * 1e9 * d.metal_bw_eff)
    # ggml-metal: every layer's kernels at kernel_us, each MoE layer launch_us_metal on top
    assert math.isclose(hw["launch_s"], d.layer_kernels * d.kernel_us * 1e-6)
    assert math.isclose(hw["moe_s"], d.launch_us_metal * 1e-6)
    if math.isclose(d.metal_bw_eff, 0.798127) and math.isclose(d.launch_us_metal, 186.785):
        assert math.isclose(hw["gpu_bw"], 327232070000.0)
        assert math.isclose(hw["host_bw"], 186282444800.0)
        assert math.isclose(hw["prefill_flops"], 7525617840000.0)
        assert math.isclose(hw["gpu_flops"], 12203593200000.0)


def test_gb10_keeps_cuda_graphs_and_its_spec_bandwidth():
    hw, mach, rt = _lower("dgx-spark")
    assert math.isclose(hw["gpu_bw"], mach.gpu_bw_gbs * 1e9 * rt.decode.gddr_bw_eff)
    clock = rt.decode.kernel_ref_mhz / _chip("dgx-spark")["boost_mhz"]          # GB10 at its derived 2523 MHz
    assert math.isclose(hw["launch_s"], rt.decode.layer_kernels * rt.decode.kernel_us * clock * 1e-6)
