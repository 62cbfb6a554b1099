"""The non-NVIDIA GPUs and the further unified-memory chips of the hardware catalog: each builds a machine and
fits a small model, its bandwidth follows from its memory bus, unified pools list their sizes, and runtimes
without a back end for a chip (MLX off Apple/NVIDIA, TensorRT-LLM off NVIDIA) are refused."""
from __future__ import annotations

import math
import re

import pytest

import moesim
from moesim import _catalog
from moesim.errors import MoesimError
from moesim.engine.lower.machine import lower_machine
from moesim.engine.lower.memory import configure, lower
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime


AMD_RDNA2 = ["rx-6600", "rx-6600-xt", "rx-6650-xt", "rx-6700-xt", "rx-6750-xt", "rx-6800", "rx-6800-xt",
             "rx-6900-xt", "rx-6950-xt"]
AMD_RDNA3 = ["rx-7600", "rx-7600-xt", "rx-7700-xt", "rx-7800-xt", "rx-7900-gre", "rx-7900-xtx",
             "radeon-pro-w7800", "radeon-pro-w7900"]
AMD_RDNA4 = ["rx-9060-xt-8gb", "rx-9060-xt-16gb", "rx-9070", "rx-9070-xt", "radeon-ai-pro-r9700"]
AMD_INSTINCT = ["mi210", "mi250", "mi250x", "mi325x", "mi350x", "mi355x"]
INTEL = ["arc-a580", "arc-a750", "arc-a770-8gb", "arc-a770-16gb", "arc-b570", "arc-b580", "arc-pro-b50",
         "arc-pro-b60"]
NEW_GPUS = AMD_RDNA2 + AMD_RDNA3 + AMD_RDNA4 + AMD_INSTINCT + INTEL

APPLE = ["m3-max-30c", "m4-max-32c", "m5", "m5-pro", "m5-max"]
NO_MLX = ["mi300a", "ryzen-ai-max-plus-395", "ryzen-ai-max-390", "ryzen-ai-max-385", "ryzen-ai-9-hx-370",
          "snapdragon-x-elite", "snapdragon-x-plus", "snapdragon-x2-elite-extreme", "core-ultra-7-258v"]
JETSON = ["jetson-agx-orin-64gb", "jetson-agx-thor"]
NEW_UNIFIED = APPLE + NO_MLX + JETSON

SMALL_MODEL, SMALL_QUANT = "llama-3-8b", "Q4_K_M"      # 4.9 GB of weights: fits the smallest (8 GiB) card
SOURCE_MARK = re.compile(r"https?://|\b(?:HW|RT) §|\bAIC\b|\bMLE\b|\bCC\b|code-search|assumed")


def _hw() -> dict:
    return _catalog.load("hardware")


def test_the_lists_name_catalog_entries_of_the_right_vendor():
    hw = _hw()
    assert len(NEW_GPUS) + len(NEW_UNIFIED) >= 40
    for gid in NEW_GPUS:
        assert hw["gpu"][gid]["vendor"] == ("intel" if gid in INTEL else "amd"), gid
    for uid in NEW_UNIFIED:
        want = "apple" if uid in APPLE else "nvidia" if uid in JETSON else None
        assert uid in hw["unified"], uid
        if want:
            assert hw["unified"][uid]["vendor"] == want, uid
        else:
            assert hw["unified"][uid]["vendor"] in ("amd", "qualcomm", "intel"), uid


@pytest.mark.parametrize("section,ids", [("gpu", NEW_GPUS), ("unified", NEW_UNIFIED)])
def test_every_entry_names_its_source(section, ids):
    for cid in ids:
        source = _hw()[section][cid]["source"]
        assert SOURCE_MARK.search(source), f"{section}.{cid}: source names no URL, tag or assumption"


@pytest.mark.parametrize("gid", NEW_GPUS)
def test_gpu_builds_a_machine_and_fits_a_small_model(gid):
    g = _hw()["gpu"][gid]
    mach = moesim.machine(gpu=gid)
    assert mach.gpu_mem_bytes == g["memory_bytes"] and mach.gpu_bw_gbs == g["mem_bw_gbs"]
    assert mach.pcie == g["host_link"]
    (row,) = moesim.fit(SMALL_MODEL, mach, quants=[SMALL_QUANT])
    assert row["placement"] == "all-gpu" and row["fits"].startswith("gpu"), (gid, row["fits"])
    # decode reads every weight once per token: the card's bandwidth bounds it, and the model uses most of it
    roofline = g["mem_bw_gbs"] * 1e9 / row["weights_bytes"]
    assert 0.2 * roofline < row["decode_tok_s"] <= roofline, (gid, row["decode_tok_s"], roofline)


@pytest.mark.parametrize("gid", NEW_GPUS)
def test_gpu_bandwidth_follows_from_its_bus(gid):
    g = _hw()["gpu"][gid]
    if "bus_width_bits" not in g:
        # HBM3E parts whose per-pin rate no source gave: only the vendor's aggregate figure is listed
        assert g["memory_type"].startswith("hbm") and "data_rate_gbps" not in g, gid
        return
    derived = g["bus_width_bits"] / 8 * g["data_rate_gbps"]
    assert math.isclose(derived, g["mem_bw_gbs"], rel_tol=0.03), (gid, derived, g["mem_bw_gbs"])
    assert g["memory_type"] in ("gddr6", "hbm2e"), gid


@pytest.mark.parametrize("gid", NEW_GPUS)
def test_gpu_capacity_is_whole_gib_and_matrix_units_follow_the_architecture(gid):
    g = _hw()["gpu"][gid]
    assert g["memory_bytes"] % 2**30 == 0, gid
    rdna2 = gid in AMD_RDNA2
    assert g["tensor_cores"] is (not rdna2), gid
    assert g["flash_attention"] == ("tile" if rdna2 else True), gid
    tf = g["tflops"]
    if rdna2:          # no WMMA: plain ALU rates, packed FP16 at twice FP32, int8 dot4 (sdot4) at four times
        assert set(tf) == {"fp16", "fp32", "int8"} and math.isclose(tf["fp16"], 2 * tf["fp32"], rel_tol=0.01), gid
        assert math.isclose(tf["int8"], 4 * tf["fp32"], rel_tol=0.01), gid
    else:
        assert tf["bf16"] == tf["fp16"] > g.get("fp32_tflops", 0.0), gid
    if g["vendor"] == "amd":
        assert g["arch"].startswith("gfx"), gid


def test_a_dual_die_instinct_is_two_gpus():
    one = moesim.machine(gpu="mi250x", gpus=1)
    module = moesim.machine(gpu="mi250x", gpus=2)
    assert module.n_gpus == 2 and one.gpu_mem_bytes == 64 * 2**30       # per GCD: what software sees


@pytest.mark.parametrize("uid", NEW_UNIFIED)
def test_unified_chip_builds_a_machine_and_fits_a_small_model(uid):
    chip = _hw()["unified"][uid]
    mach = moesim.machine(gpu=uid)
    assert mach.unified and mach.gpu_bw_gbs == chip["mem_bw_gbs"]
    assert mach.gpu_mem_bytes == chip["default_memory_gb"] * 1e9 and mach.cores == chip["cpu_cores"]
    (row,) = moesim.fit(SMALL_MODEL, mach, quants=[SMALL_QUANT], runtime="llama.cpp")
    assert row["placement"] == "unified" and row["fits"].startswith("unified"), (uid, row["fits"])
    roofline = chip["mem_bw_gbs"] * 1e9 / row["weights_bytes"]
    assert 0.2 * roofline < row["decode_tok_s"] <= roofline, (uid, row["decode_tok_s"], roofline)


@pytest.mark.parametrize("uid", NEW_UNIFIED)
def test_unified_bandwidth_follows_from_its_memory_bus(uid):
    chip = _hw()["unified"][uid]
    if "memory" not in chip:
        assert uid == "mi300a"          # HBM3: the vendor's aggregate figure only
        return
    part = _hw()["host_memory"][chip["memory"]]
    derived = part["mt_s"] * chip["bus_width_bits"] / 8 / 1000
    assert math.isclose(derived, chip["mem_bw_gbs"], rel_tol=0.03), (uid, derived, chip["mem_bw_gbs"])
    assert math.isclose(part["channel_gbs"], part["mt_s"] * 8 / 1000, rel_tol=1e-3)
    assert part["kind"].startswith("lpddr5")


@pytest.mark.parametrize("uid", NEW_UNIFIED)
def test_unified_pool_sizes_are_the_listed_options(uid):
    chip = _hw()["unified"][uid]
    options = chip["memory_options_gb"]
    assert options == sorted(options) and chip["default_memory_gb"] == max(options)
    assert 0.0 < chip["gpu_working_set_fraction"] <= 1.0
    for size in options:
        mach = moesim.machine(gpu=uid, gpu_mem_gb=size)
        assert mach.gpu_mem_bytes == mach.host_mem_bytes == size * 1e9 and not mach.assumptions, (uid, size)
    odd = moesim.machine(gpu=uid, host_mem_gb=options[0] + 1)
    assert len(odd.assumptions) == 1 and "not a listed" in odd.assumptions[0]
    assert all(str(size) in odd.assumptions[0] for size in options)


@pytest.mark.parametrize("uid", ["ryzen-ai-max-plus-395", "snapdragon-x-elite", "core-ultra-7-258v", "m5-max"])
def test_the_gpu_share_of_a_unified_pool_is_its_working_set_fraction(uid):
    chip = _hw()["unified"][uid]
    m = moesim.model(SMALL_MODEL)
    mach = moesim.machine(gpu=uid)
    cfg = configure(m, lower(m, Q.resolve(SMALL_QUANT, m)), mach, runtime("llama.cpp"),
                    parse_placement("unified", m, mach), 4096, 1, "f16", 0)
    pool = chip["default_memory_gb"] * 1e9
    assert math.isclose(cfg["gpu_capacity"], pool * chip["gpu_working_set_fraction"])
    assert math.isclose(cfg["host_capacity"], pool - cfg["gpu_capacity"])


@pytest.mark.parametrize("uid", NO_MLX + JETSON + APPLE)
def test_only_apple_chips_take_metal_rates(uid):
    """Metal efficiencies and launch latency are Apple's; a Strix Halo or a Snapdragon lowers like GB10."""
    m = moesim.model(SMALL_MODEL)
    q = Q.resolve(SMALL_QUANT, m)
    mach = moesim.machine(gpu=uid)
    rt = runtime("llama.cpp")
    hw = lower_machine(mach, rt, parse_placement("unified", m, mach), Q.kernel_mix(m, q))
    chip = _hw()["unified"][uid]
    eff = rt.decode.metal_bw_eff if uid in APPLE else rt.decode.gddr_bw_eff
    graphs = chip.get("cuda_graphs", True)          # Strix Halo: none (tests/test_unified_amd.py)
    d = rt.decode
    # the kernels' latency in the chip's GPU cycles (kernel_ref_mhz / boost_mhz); host launches unscaled
    clock = d.kernel_ref_mhz / chip["boost_mhz"] if chip.get("boost_mhz") else 1.0
    # AMD chips run llama.cpp's HIP backend by default, which names its own per-layer cost on RDNA (gfx1*)
    hip_rdna = str(chip.get("arch", "")).startswith("gfx1")
    nograph = (_catalog.load("runtimes")["backends"]["hip"]["launch_us_nograph"]["gfx11"] if hip_rdna else
               0.0 if graphs else d.launch_us_nograph)
    launch = d.layer_kernels * d.kernel_us * clock + nograph
    # ggml-metal: every layer its kernels at kernel_us (no clock scaling), each MoE layer launch_us_metal on top
    launch = d.layer_kernels * d.kernel_us if uid in APPLE else launch
    bw = chip.get("gpu_measured_bw_gbs", mach.gpu_bw_gbs)
    assert math.isclose(hw["gpu_bw"], bw * 1e9 * eff)
    assert math.isclose(hw["launch_s"], launch * 1e-6)
    assert math.isclose(hw["moe_s"], (d.launch_us_metal if uid in APPLE else d.moe_layer_us * clock) * 1e-6)
    # Apple chips are Arm; the others list their CPU cores' ISA in the catalog (AMD's Zen 4 / 5) or none
    assert mach.cpu_isa == (("neon",) if uid in APPLE else tuple(chip.get("cpu_isa", ())))


@pytest.mark.parametrize("uid", NO_MLX)
def test_mlx_is_refused_on_chips_without_metal_or_cuda(uid):
    mach = moesim.machine(gpu=uid)
    with pytest.raises(MoesimError) as err:
        moesim.fit("qwen3-30b-a3b", mach, quants=["mlx-4bit"], runtime="mlx")
    assert err.value.field == "runtime" and "no back end" in str(err.value) and uid in str(err.value)
    with pytest.raises(MoesimError) as err:          # the MLX format implies the MLX runtime
        moesim.simulate("qwen3-30b-a3b", mach, quant="mlx-4bit", tokens=4)
    assert err.value.field == "runtime"
    # MLX's CPU back end needs no GPU
    (row,) = moesim.fit("qwen3-30b-a3b", mach, quants=["mlx-4bit"], runtime="mlx", placement="cpu-only")
    assert row["placement"] == "cpu-only"


@pytest.mark.parametrize("gid", ["rx-7900-xtx", "arc-b580", "mi355x"])
def test_mlx_and_tensorrt_llm_are_refused_on_discrete_non_nvidia_cards(gid):
    for rid in ("mlx", "trtllm"):
        with pytest.raises(MoesimError) as err:
            moesim.fit(SMALL_MODEL, moesim.machine(gpu=gid), quants=["bf16"], runtime=rid)
        assert err.value.field == "runtime" and rid in str(err.value)


def test_mlx_runs_where_it_has_a_back_end():
    for uid in APPLE + JETSON + ["dgx-spark"]:
        (row,) = moesim.fit("qwen3-30b-a3b", moesim.machine(gpu=uid), quants=["mlx-4bit"], runtime="mlx")
        assert row["runtime"] == "mlx" and row["decode_tok_s"] > 0, uid
    with pytest.raises(MoesimError, match="compute capability >= 7.5"):     # MLX's CUDA floor (SM 7.5)
        moesim.fit(SMALL_MODEL, moesim.machine(gpu="tesla-p40"), quants=["bf16"], runtime="mlx")
    with pytest.raises(MoesimError, match="no back end for m5"):
        moesim.fit(SMALL_MODEL, moesim.machine(gpu="m5"), quants=["bf16"], runtime="trtllm")


def test_sweep_drops_or_refuses_runtimes_without_a_back_end():
    machines = [dict(gpu="ryzen-ai-max-plus-395"), dict(gpu="m5-max")]
    tab = moesim.sweep(models=[SMALL_MODEL], quants=[SMALL_QUANT], machines=machines, runtimes=["llama.cpp", "mlx"],
                       contexts=[4096], batches=[1], filter={"skip_inapplicable": True})
    assert len(tab) == 3          # every combination but MLX on the Strix Halo
    with pytest.raises(MoesimError, match="axes.runtimes"):
        moesim.sweep(models=[SMALL_MODEL], quants=[SMALL_QUANT], machines=machines[:1], runtimes=["mlx"],
                     contexts=[4096], batches=[1])
