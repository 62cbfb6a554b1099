"""llama.cpp GPU backends per device family (runtimes.toml [backends.*], engine/lower/machine.py backend_terms):
which peak each backend's prompt GEMMs run at, the measured Vulkan MUL_MAT_ID and decode shares on Intel, the
token-by-token MUL_MAT_ID of 2023 builds, and how validate reads the backend from a row's notes. Each term is
checked against a hand computation from the catalog numbers."""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest

import moesim
from moesim import _catalog
from moesim.analysis.validate import build
from moesim.engine.lower.machine import backend_source_errors, lower_machine
from moesim.engine.prefill import _expert_times
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime

GB = 1e9


def _hw(gpu: str, rid: str, model: str = "qwen3-30b-a3b", quant: str = "Q4_K_M", gpus: int = 1) -> dict:
    m = moesim.model(model)
    mach = moesim.machine(gpu=gpu, gpus=gpus)
    p = parse_placement("unified" if mach.unified else "all-gpu", m, mach)
    return lower_machine(mach, runtime(rid), p, Q.kernel_mix(m, Q.resolve(quant, m)))


def _eff(rid: str) -> float:
    return runtime(rid).decode.prefill_flops_eff


def test_every_backend_term_cites_a_source():
    tables = _catalog.load("runtimes")["backends"]
    assert backend_source_errors(tables) == []
    assert {"cuda", "hip", "sycl", "vulkan", "vulkan-2024h1", "vulkan-2025", "metal"} <= set(tables)


@pytest.mark.parametrize("drop", ["source", "bw_source", "moe_source", "acc_source"])
def test_a_backend_term_without_a_source_fails(drop):
    tables = copy.deepcopy(_catalog.load("runtimes")["backends"])
    del tables["vulkan"][drop]
    assert backend_source_errors(tables), drop


def test_vulkan_on_alchemist_runs_the_scalar_fp16_shaders():
    """ggml-vulkan enables cooperative matrices on Intel Xe2 only: an A770 multiplies on its shader ALUs, packed
    fp16 at 2 x 17.2 TFLOPS, at llama.cpp's prefill share."""
    hw = _hw("arc-a770-16gb", "llama.cpp-vulkan")
    assert hw["prefill_gemm_flops"] == pytest.approx(2 * 17.2e12 * _eff("llama.cpp-vulkan"))


def test_vulkan_on_battlemage_runs_fp16_on_the_xmx_engines():
    hw = _hw("arc-b580", "llama.cpp-vulkan", model="qwen2.5-7b")
    assert hw["prefill_gemm_flops"] == pytest.approx(109.4e12 * _eff("llama.cpp-vulkan"))


def test_sycl_is_intels_default_and_multiplies_fp16_on_xmx():
    """Without a backend named an Intel card runs SYCL: fp16 oneDNN GEMMs (137.6 TFLOPS on the A770), not the
    int8 rate (275.3) the CUDA MMQ path would use."""
    for rid in ("llama.cpp", "llama.cpp-sycl"):
        hw = _hw("arc-a770-16gb", rid)
        assert hw["prefill_gemm_flops"] == pytest.approx(137.6e12 * _eff(rid)), rid


def test_vulkan_coopmat2_on_geforce_accumulates_in_fp16():
    """NV_cooperative_matrix2 takes the f16acc pipelines: a GeForce RTX 3090 at twice its fp32-accumulate
    71 TFLOPS; the MXFP4 MMQ factor is not applied to this dequantize-to-fp16 path."""
    hw = _hw("rtx-3090", "llama.cpp-vulkan", model="gpt-oss-20b", quant="MXFP4")
    assert hw["prefill_gemm_flops"] == pytest.approx(2 * 71.0e12 * _eff("llama.cpp-vulkan"))


def test_vulkan_on_rdna4_takes_the_rdna3_coopmat_path_in_fp16():
    hw = _hw("rx-9070-xt", "llama.cpp-vulkan", model="qwen3-8b")
    assert hw["prefill_gemm_flops"] == pytest.approx(194.7e12 * _eff("llama.cpp-vulkan"))
    # HIP's MMQ on the same card: the WMMA int8 rate
    hip = _hw("rx-9070-xt", "llama.cpp-hip", model="qwen3-8b")
    assert hip["prefill_gemm_flops"] == pytest.approx(389.5e12 * _eff("llama.cpp-hip"))


def test_hip_mmq_on_rdna2_uses_the_dot4_rate_and_early_vulkan_the_shader_alus():
    """RX 6700 XT: HIP MMQ's sdot4 at 4 x 13.215 = 52.86 TOPS; the March 2024 Vulkan backend (no cooperative
    matrices before PR #10597) at packed fp16, 26.43 TFLOPS."""
    hip = _hw("rx-6700-xt", "llama.cpp-2024h1", model="mistral-7b-v0.3", quant="Q4_0")
    assert hip["prefill_gemm_flops"] == pytest.approx(52.86e12 * _eff("llama.cpp-2024h1"))
    vk = _hw("rx-6700-xt", "llama.cpp-2024h1-vulkan", model="mistral-7b-v0.3", quant="Q4_0")
    assert vk["prefill_gemm_flops"] == pytest.approx(2 * 13.215e12 * _eff("llama.cpp-2024h1-vulkan"))


def test_cuda_path_is_unchanged_int8_mmq():
    m = moesim.model("qwen3-30b-a3b")
    mix = Q.kernel_mix(m, Q.resolve("Q4_K_M", m))
    hw = _hw("rtx-4090", "llama.cpp")
    d = runtime("llama.cpp").decode
    rel = 1.0 / (mix.mmq_kquant / d.gpu_kquant_mmq_rel + 1 - mix.mmq_kquant)
    rel /= (mix.mmq_mxfp4 / d.gpu_mxfp4_mmq_rel + 1 - mix.mmq_mxfp4)
    tf = moesim.machine(gpu="rtx-4090").gpu_tflops
    assert hw["prefill_gemm_flops"] == pytest.approx(tf["int8"] * 1e12 * d.prefill_flops_eff * rel)
    assert hw["prefill_expert_flops"] == hw["prefill_gemm_flops"]
    assert hw["gpu_bw"] == pytest.approx(moesim.machine(gpu="rtx-4090").gpu_bw_gbs * GB * d.gddr_bw_eff)


def test_vulkan_mul_mat_id_on_intel_runs_at_the_measured_share_of_fp32():
    """B580's MUL_MAT_ID measured 1.26-1.70 TFLOPS (median 1.51 of 13.67 fp32 = 0.11): on an A770 the routed
    experts multiply at 0.11 x 17.2 TFLOPS while the dense GEMMs keep the shader-ALU rate."""
    hw = _hw("arc-a770-16gb", "llama.cpp-vulkan")
    assert hw["prefill_expert_flops"] == pytest.approx(0.11 * 17.2e12)
    assert hw["prefill_expert_flops"] < hw["prefill_gemm_flops"]
    # not under SYCL, not on AMD under Vulkan
    assert _hw("arc-a770-16gb", "llama.cpp-sycl")["prefill_expert_flops"] == \
        _hw("arc-a770-16gb", "llama.cpp-sycl")["prefill_gemm_flops"]
    amd = _hw("rx-9070-xt", "llama.cpp-vulkan")
    assert amd["prefill_expert_flops"] == amd["prefill_gemm_flops"]


def test_vulkan_decode_on_alchemist_reads_at_the_measured_share():
    """issue #17628: Llama-3.1-8B Q4_K_M (4.918 GB) at 42 t/s on an A770 = 0.37 of 560 GB/s."""
    hw = _hw("arc-a770-16gb", "llama.cpp-vulkan")
    assert hw["gpu_bw"] == pytest.approx(560.0 * GB * 0.37)
    assert math.isclose(42 * 4.918 / 560.0, 0.37, abs_tol=0.005)
    # Battlemage under Vulkan and the A770 under SYCL keep the runtime's GDDR share
    d = runtime("llama.cpp").decode
    assert _hw("arc-b580", "llama.cpp-vulkan")["gpu_bw"] == pytest.approx(456.0 * GB * d.gddr_bw_eff)
    assert _hw("arc-a770-16gb", "llama.cpp")["gpu_bw"] == pytest.approx(560.0 * GB * d.gddr_bw_eff)


def _one_layer(eb: float, ef: float, q: np.ndarray) -> dict:
    return dict(layers=np.array([0]), moe_rows=np.array([0]), q=q[None, :], mode=np.array([0]),
                gpu_share=np.array([1.0]), eb=np.array([eb]), ef=np.array([ef]), layer_experts=np.array([len(q)]))


def test_token_by_token_mul_mat_id_streams_the_expert_per_pair():
    """A 2023 build reads an expert's weights once per token-expert pair (PR #4406); later builds once per
    distinct expert per ubatch. 8 experts, top-2, uniform routing, a 16-token ubatch: 32 pairs, and
    8 x (1 - (6/8)^16) = 7.920 distinct experts."""
    q = np.full(8, 2 / 8)
    eb, ef, bw, gemm = 1e8, 2e8, 4e11, 5e12
    hw = dict(gpu_bw=bw, host_bw=bw, pcie_bw=bw, pcie_links=1, overlap=0, amx_flops=0.0, sync_s=0.0)
    dm = dict(amx_flops_per_cycle=0.0)
    grouped = _expert_times(_one_layer(eb, ef, q), dm, hw, 16, 2, gemm, 1e12, None, layerwise=False, offload=False)
    rowwise = _expert_times(_one_layer(eb, ef, q), dm, hw, 16, 2, gemm, 1e12, None, layerwise=False, offload=False,
                            rowwise=True)
    distinct = 8 * (1 - (6 / 8) ** 16)
    assert grouped[0] == pytest.approx(distinct * eb / bw + 32 * ef / gemm)
    assert rowwise[0] == pytest.approx(32 * eb / bw + 32 * ef / gemm)


def test_the_2023_profile_reads_per_pair_on_the_gpu_only():
    assert runtime("llama.cpp-2023").decode.moe_rowwise_prefill
    assert not runtime("llama.cpp-2024h1").decode.moe_rowwise_prefill
    assert _hw("m2-max", "llama.cpp-2023", model="mixtral-8x7b")["gpu_moe_rowwise"] == 1
    assert _hw("m2-max", "llama.cpp", model="mixtral-8x7b")["gpu_moe_rowwise"] == 0
    m = moesim.model("mixtral-8x7b")
    mach = moesim.machine(gpu="m2-max")
    cpu = lower_machine(mach, runtime("llama.cpp-2023"), parse_placement("cpu-only", m, mach),
                        Q.kernel_mix(m, Q.resolve("Q4_0", m)))
    assert cpu["gpu_moe_rowwise"] == 0       # the CPU grouped rows by expert from PR #4480 (Dec 2023)


def _row(notes: str, gpu: str = "arc-a770-16gb", model: str = "qwen3-30b-a3b", quant: str = "Q4_K_M") -> dict:
    return dict(id="T-1", quality="A", model=model, quant=quant, runtime="llama.cpp", gpu=gpu, gpus="1",
                placement="all-gpu", batch="1", prompt_tokens="512", decode_tok_s="10", notes=notes)


@pytest.mark.parametrize("notes,rid", [
    ("Vulkan backend; ngl 99", "llama.cpp-vulkan"),
    ("backend llama.cpp-vulkan_amdvlk; ngl 99", "llama.cpp-vulkan"),
    ("backend llama.cpp-hip", "llama.cpp-hip"),
    ("a SHIP model; worship", "llama.cpp"),
    ("IPEX-LLM portable llama.cpp build (SYCL)", "llama.cpp-sycl"),
    ("HIP (ROCm) backend", "llama.cpp-hip"),
    ("an AMD card, no backend named", "llama.cpp"),
    ("Vulkan backend with the PR; Mar 2024 build", "llama.cpp-2024h1-vulkan"),
    ("llama.cpp build 9fb13f9 (Dec 2023, Metal, all layers)", "llama.cpp-2023"),
])
def test_validate_reads_the_backend_and_era_from_the_notes(notes, rid):
    assert build(_row(notes)).runtime == rid


@pytest.mark.parametrize("date,rid", [("2025-08", "llama.cpp-2025-vulkan"), ("2024-07-02", "llama.cpp-2025-vulkan"),
                                      ("2025-12-31", "llama.cpp-2025-vulkan"), ("2026-01-11", "llama.cpp-vulkan"),
                                      ("2024-03", "llama.cpp-2024h1-vulkan")])
def test_a_dated_vulkan_row_takes_its_builds_era(date, rid):
    """PR #18749 (January 2026) gave AMD coopmat cards their large dense GEMM tiles: a Vulkan row dated before
    it is modelled by llama.cpp-2025-vulkan (back to June 2024, where the 2024h1 profile takes over)."""
    assert build(dict(_row("Vulkan backend; ngl 99"), date=date)).runtime == rid


@pytest.mark.parametrize("gpu", ["rx-9070-xt", "ryzen-ai-max-plus-395"])
def test_vulkan_before_the_amd_coopmat_tiles_runs_dense_gemms_slower_and_experts_alike(gpu):
    """[backends."vulkan-2025"]: an AMD coopmat card's dense prompt GEMMs at 0.56 of the current build's rate
    (PR #18749's before / after on a Radeon 8060S), its routed experts (MUL_MAT_ID, whose large tile stays off)
    and its attention at the current rate; everything else as [backends.vulkan]."""
    now, then = _hw(gpu, "llama.cpp-vulkan"), _hw(gpu, "llama.cpp-2025-vulkan")
    assert then["prefill_gemm_flops"] == pytest.approx(0.56 * now["prefill_gemm_flops"])
    for key in ("prefill_expert_flops", "prefill_attn_flops", "prefill_flops", "gpu_bw", "launch_s",
                "prefill_moe_half_tokens", "prefill_weight_pass_tokens"):
        assert then[key] == pytest.approx(now[key]), key


@pytest.mark.parametrize("gpu", ["rtx-4090", "arc-b580", "rx-6700-xt"])
def test_the_2025_vulkan_tiles_touch_amd_coopmat_cards_alone(gpu):
    """NVIDIA and Intel cards, and an RDNA2 card without matrix units, prefill alike under both eras."""
    assert _hw(gpu, "llama.cpp-2025-vulkan", model="qwen2.5-7b") == \
        pytest.approx(_hw(gpu, "llama.cpp-vulkan", model="qwen2.5-7b"))


def test_a_backend_era_inherits_its_base_and_cites_its_own_terms():
    tables = copy.deepcopy(_catalog.load("runtimes")["backends"])
    assert tables["vulkan-2025"]["base"] == "vulkan"
    del tables["vulkan-2025"]["dense_rel_source"]
    assert backend_source_errors(tables) == ["backend vulkan-2025: dense_gemm_rel.amd has no source line "
                                             "(dense_rel_source)"]


# ---------------------------------------------------------------- AMD: MXFP4 under HIP, unified chips, MoE tiles
def test_the_mxfp4_mmq_factor_is_cudas_alone():
    """gpu_mxfp4_mmq_rel was measured on CUDA cards: a CUDA card's gpt-oss prefill pays it, the same model under
    HIP on an RDNA4 card does not (its rate is the card's int8 rate at the plain prefill share)."""
    d = runtime("llama.cpp").decode
    assert d.gpu_mxfp4_mmq_rel < 1.0
    cuda = _hw("rtx-4090", "llama.cpp", model="gpt-oss-20b", quant="MXFP4")
    tf = moesim.machine(gpu="rtx-4090").gpu_tflops
    assert cuda["prefill_gemm_flops"] < tf["int8"] * 1e12 * d.prefill_flops_eff * 0.99
    hip = _hw("rx-9070-xt", "llama.cpp-hip", model="gpt-oss-20b", quant="MXFP4")
    tf = moesim.machine(gpu="rx-9070-xt").gpu_tflops
    assert hip["prefill_gemm_flops"] == pytest.approx(tf["int8"] * 1e12 * d.prefill_flops_eff)


def test_a_unified_amd_chip_prefills_through_its_backend():
    """Strix Halo: under HIP the int8 MMQ path and under Vulkan the fp16 coopmat path, both capped by the
    chip's measured 36.9 TFLOPS GEMM rate; neither applies the CUDA MXFP4 factor, so gpt-oss and a K-quant
    model get one rate. GB10 (CUDA) keeps the factor."""
    d = runtime("llama.cpp").decode
    for rid in ("llama.cpp-hip", "llama.cpp-vulkan"):
        oss = _hw("ryzen-ai-max-plus-395", rid, model="gpt-oss-20b", quant="MXFP4")
        qwen = _hw("ryzen-ai-max-plus-395", rid)
        assert oss["prefill_gemm_flops"] == pytest.approx(36.9e12 * d.prefill_flops_eff), rid
        assert qwen["prefill_gemm_flops"] == pytest.approx(oss["prefill_gemm_flops"]), rid
    spark_oss = _hw("dgx-spark", "llama.cpp", model="gpt-oss-20b", quant="MXFP4")
    spark_q8 = _hw("dgx-spark", "llama.cpp", model="qwen3-30b-a3b", quant="Q8_0")   # gpt-oss Q8_0 keeps MXFP4 experts
    assert spark_oss["prefill_gemm_flops"] < 0.99 * spark_q8["prefill_gemm_flops"]


def test_a_cpu_only_run_on_a_unified_chip_prefills_on_the_cpu():
    m = moesim.model("gpt-oss-120b")
    mach = moesim.machine(gpu="ryzen-ai-max-plus-395")
    hw = lower_machine(mach, runtime("ik_llama.cpp"), parse_placement("cpu-only", m, mach),
                       Q.kernel_mix(m, Q.resolve("MXFP4", m)))
    for k in ("prefill_flops", "prefill_gemm_flops", "prefill_attn_flops", "prefill_expert_flops"):
        assert hw[k] == hw["cpu_flops"], k
    assert hw["prefill_moe_half_tokens"] == 0.0


def test_amd_expert_gemms_lose_rate_on_few_tokens_per_expert():
    """runtimes.toml moe_half_tokens: AMD GPUs under HIP or Vulkan run a ubatch's routed-expert GEMMs at
    n / (n + 32) of the dense rate, n the tokens per used expert; CUDA has no such term. 8 experts, top-2,
    uniform routing, a 16-token ubatch: n = 32 / 7.920 pairs per distinct expert."""
    for gpu, rid in (("rx-9070-xt", "llama.cpp-hip"), ("rx-9070-xt", "llama.cpp-vulkan"),
                     ("ryzen-ai-max-plus-395", "llama.cpp-vulkan"), ("ryzen-ai-max-plus-395", "llama.cpp-hip")):
        assert _hw(gpu, rid)["prefill_moe_half_tokens"] == 32.0, (gpu, rid)
    assert _hw("rtx-4090", "llama.cpp")["prefill_moe_half_tokens"] == 0.0
    assert _hw("arc-b580", "llama.cpp-vulkan", model="qwen2.5-7b")["prefill_moe_half_tokens"] == 0.0
    q = np.full(8, 2 / 8)
    eb, ef, bw, gemm = 1e8, 2e8, 4e11, 5e12
    hw = dict(gpu_bw=bw, host_bw=bw, pcie_bw=bw, pcie_links=1, overlap=0, amx_flops=0.0, sync_s=0.0)
    dm = dict(amx_flops_per_cycle=0.0)
    distinct = 8 * (1 - (6 / 8) ** 16)
    n = 32 / distinct
    slow = _expert_times(_one_layer(eb, ef, q), dm, dict(hw, prefill_moe_half_tokens=32.0), 16, 2, gemm, 1e12,
                         None, layerwise=False, offload=False)
    assert slow[0] == pytest.approx(distinct * eb / bw + 32 * ef / (gemm * n / (n + 32)))
    plain = _expert_times(_one_layer(eb, ef, q), dm, hw, 16, 2, gemm, 1e12, None, layerwise=False, offload=False)
    assert plain[0] == pytest.approx(distinct * eb / bw + 32 * ef / gemm)


def test_the_moe_tile_loss_slows_moe_prefill_not_dense_prefill():
    """On Strix Halo under Vulkan: a dense model's prefill is the same with or without the term; Qwen3-30B-A3B's
    (128 experts, top-8: ~32 tokens per used expert in a 512-token ubatch) is slower with it, by a fifth of its prompt
    time (the term halves the expert GEMMs' rate; the weight reads and the activation traffic stay)."""
    from moesim.engine.lower import machine as LM
    kw = dict(machine=moesim.machine(gpu="ryzen-ai-max-plus-395"), runtime="llama.cpp-vulkan", quant="Q4_K_M",
              context=512, prompt=512, mode="analytic")
    dense = moesim.simulate("llama-3.1-8b", **kw).prefill_tok_s
    moe = moesim.simulate("qwen3-30b-a3b", **kw).prefill_tok_s
    original = LM.backend_terms

    def without(rt, g):
        return dict(original(rt, g), moe_half_tokens=0.0) if original(rt, g) else {}
    LM.backend_terms = without
    try:
        dense0 = moesim.simulate("llama-3.1-8b", **kw).prefill_tok_s
        moe0 = moesim.simulate("qwen3-30b-a3b", **kw).prefill_tok_s
    finally:
        LM.backend_terms = original
    assert dense == pytest.approx(dense0)
    assert moe < 0.85 * moe0


def test_m5_neural_accelerators_multiply_the_prompt_gemms():
    """hardware.toml gpu_tflops_matrix: the M5 GPU's Neural Accelerators (Apple: 4x+ peak GPU compute for AI
    against M4), reached through Metal 4's tensor API by MLX and llama.cpp since PR #16634; earlier llama.cpp
    profiles and every pre-M5 chip keep the ALU rate, and decode's GEMV rate does not change (llama.cpp's decode steps
    past its mat-vec kernels run the prompt's mat-mat kernel, at its rate)."""
    for chip in ("m5", "m5-pro", "m5-max"):
        tf = moesim.machine(gpu=chip).gpu_tflops
        assert tf["matrix"] == pytest.approx(4 * tf["fp16"], rel=1e-3), chip
    for rid in ("mlx", "llama.cpp"):
        eff = runtime(rid).decode.prefill_flops_eff_unified
        hw = _hw("m5-max", rid)
        assert hw["prefill_gemm_flops"] == pytest.approx(4 * 15.04e12 * eff, rel=1e-3), rid
        if rid == "mlx":
            assert hw["gpu_flops"] == pytest.approx(15.04e12 * runtime(rid).decode.gpu_flops_eff), rid
        else:
            assert hw["gpu_flops"] == hw["prefill_gemm_flops"]
            d = runtime(rid).decode
            assert hw["gemv_weight_s"] == pytest.approx(2.0 / (15.04e12 * d.metal_gemv_eff), rel=1e-3)
    old = _hw("m5-max", "llama.cpp-2024h1")
    old_d = runtime("llama.cpp-2024h1").decode
    assert old["prefill_gemm_flops"] == pytest.approx(15.04e12 * old_d.prefill_flops_eff_unified * old_d.metal_prefill_rel)
    m4 = _hw("m4-max", "mlx")
    assert m4["prefill_gemm_flops"] == pytest.approx(17.18e12 * runtime("mlx").decode.prefill_flops_eff_unified)


def test_mlx_prompts_pay_bf16_emulation_on_m1_and_m2_only():
    """hardware.toml gpu_bf16 = false on the M1 / M2 GPUs, runtimes.toml [runtimes.mlx.decode] bf16_emulated_rel
    (Rapid-MLX issue #3154, omlx issue #604): MLX's bf16 forward prefills at 0.79 of its rate there; llama.cpp's
    Metal GEMMs (fp16) and every M3-and-later chip keep theirs, and decode's GEMV rate does not move."""
    chips = _catalog.load("hardware")["unified"]
    emulated = {c for c, u in chips.items() if u.get("gpu_bf16", True) is False}
    assert emulated == {"m1", "m1-pro", "m1-max", "m1-ultra", "m2", "m2-pro", "m2-max", "m2-ultra"}
    mlx = runtime("mlx").decode
    assert mlx.bf16_emulated_rel == pytest.approx(math.sqrt(133 / 178 / 1.2), abs=0.005)
    assert runtime("llama.cpp").decode.bf16_emulated_rel == 1.0
    for chip, rel in (("m2-max", mlx.bf16_emulated_rel), ("m1-ultra", mlx.bf16_emulated_rel), ("m3-max", 1.0),
                      ("m4-max", 1.0)):
        peak = moesim.machine(gpu=chip).gpu_tflops["fp16"] * 1e12
        hw = _hw(chip, "mlx")
        assert hw["prefill_gemm_flops"] == pytest.approx(peak * mlx.prefill_flops_eff_unified * rel), chip
        assert hw["gpu_flops"] == pytest.approx(peak * mlx.gpu_flops_eff), chip
    cpp = _hw("m2-max", "llama.cpp")
    assert cpp["prefill_gemm_flops"] == pytest.approx(13.6e12 * runtime("llama.cpp").decode.prefill_flops_eff_unified)
    # a CPU-only run never touches the GPU's bf16 path
    m = moesim.model("qwen3-30b-a3b")
    mach = moesim.machine(gpu="m2-max")
    cpu = lower_machine(mach, runtime("mlx"), parse_placement("cpu-only", m, mach),
                        Q.kernel_mix(m, Q.resolve("Q4_K_M", m)))
    assert cpu["prefill_gemm_flops"] == cpu["cpu_flops"]


def test_mlx_expert_prompts_lose_rate_at_few_rows_per_expert():
    """runtimes.toml [runtimes.mlx.decode] moe_half_tokens (the 16-row tile of MLX's sorted gather_qmm, mlx PR #3918 /
    issue #4246) and moe_half_tokens_matrix (the M5 Neural Accelerator kernel's 32-row blocks, PR #4023; 64 before,
    issue #3925): MLX's routed-expert prompt GEMMs run at r / (r + half) of the dense rate at r rows per expert, so
    a 256-expert top-8 model's 512-token prompt (16 rows) pays more than its 4096-token one (128 rows); dense models
    and CPU-only runs keep the dense rate, llama.cpp's Metal path takes its backend's half-tile of 16 ([backends.metal]:
    ggml-metal's 32-token expert tiles; none for a 2023 build's token-by-token MUL_MAT_ID), and a run dated before
    PR #4023 on an M5 takes 64."""
    mlx = runtime("mlx").decode
    assert (mlx.moe_half_tokens, mlx.moe_half_tokens_matrix) == (16.0, 32.0)
    assert _hw("m3-max", "mlx")["prefill_moe_half_tokens"] == 16.0
    assert _hw("m5-max", "mlx")["prefill_moe_half_tokens"] == 32.0
    assert _hw("m3-max", "llama.cpp")["prefill_moe_half_tokens"] == 16.0
    assert _hw("m3-max", "llama.cpp-2023")["prefill_moe_half_tokens"] == 0.0
    mach = moesim.machine(gpu="m3-max")
    m = moesim.model("qwen3-30b-a3b")
    assert lower_machine(mach, runtime("mlx"), parse_placement("cpu-only", m, mach),
                         Q.kernel_mix(m, Q.resolve("Q4_K_M", m)))["prefill_moe_half_tokens"] == 0.0

    def prompt_rate(model, prompt, **decode):
        rt = runtime("mlx")
        if decode:
            rt = dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, **decode))
        return moesim.simulate(model, mach, quant="Q4_K_M", runtime=rt, mode="analytic", prompt=prompt).prefill_tok_s

    # 128 experts, top 8: 32 rows per expert at 512 tokens, 256 at 4096 (MLX's 2048-token chunks)
    short = prompt_rate("qwen3-30b-a3b", 512) / prompt_rate("qwen3-30b-a3b", 512, moe_half_tokens=0.0)
    long_ = prompt_rate("qwen3-30b-a3b", 4096) / prompt_rate("qwen3-30b-a3b", 4096, moe_half_tokens=0.0)
    assert short < long_ < 1.0
    assert prompt_rate("llama-3.1-8b", 512) == prompt_rate("llama-3.1-8b", 512, moe_half_tokens=0.0)
    rows = {"runtime": "mlx", "gpu": "m5-max", "date": "2026-04-17"}
    assumed: list = []
    from moesim.analysis.row_notes import nax_gather_block
    assert nax_gather_block(rows, "", "mlx", assumed) == 64.0 and "PR #4023" in assumed[0]
    assert nax_gather_block({**rows, "date": "2026-09-01"}, "", "mlx", []) is None
    assert nax_gather_block({**rows, "gpu": "m3-max"}, "", "mlx", []) is None


def test_moe_layers_on_a_gpu_pay_the_routing_and_combining_kernels():
    """llama.cpp's build_moe_ffn adds 8 + (k - 1) small kernels beside the expert GEMMs of every MoE layer
    (runtimes.toml moe_layer_us): the step of a MoE model on a GPU grows by that latency per MoE layer, a dense
    model's does not, nor does a CPU-only run; Apple's Metal path pays launch_us_metal per MoE layer instead (on top
    of every layer's layer_kernels x kernel_us), and MLX none (its launch_us_metal is charged to every layer)."""
    d = runtime("llama.cpp").decode
    assert d.moe_layer_us > 0
    # at the 4090's 2520 MHz boost against the 1980 MHz reference (runtimes.toml kernel_ref_mhz)
    assert _hw("rtx-4090", "llama.cpp")["moe_s"] == pytest.approx(d.moe_layer_us * 1980 / 2520 * 1e-6)
    metal = _hw("m3-max", "llama.cpp")
    assert metal["moe_s"] == pytest.approx(d.launch_us_metal * 1e-6)
    assert metal["launch_s"] == pytest.approx(d.layer_kernels * d.kernel_us * 1e-6)
    assert _hw("m3-max", "mlx")["moe_s"] == 0.0
    assert runtime("vllm").decode.moe_layer_us == 0.0
    mach = moesim.machine(gpu="rtx-4090")
    base = moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", mode="analytic")
    zero = _llama_cpp_with(moe_layer_us=0.0)
    off = moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", runtime=zero, mode="analytic")
    n_moe = sum(1 for layer in moesim.model("qwen3-30b-a3b").layers if layer.ffn.kind == "moe")
    assert base.tpot_ms["mean"] - off.tpot_ms["mean"] == pytest.approx(n_moe * d.moe_layer_us * 1980 / 2520 * 1e-3,
                                                                      rel=1e-6)
    dense = [moesim.simulate("llama-3-8b", mach, quant="Q4_K_M", runtime=r, mode="analytic").tpot_ms["mean"]
             for r in ("llama.cpp", zero)]
    assert dense[0] == pytest.approx(dense[1], rel=1e-12)
    cpu = [moesim.simulate("qwen3-30b-a3b", moesim.machine(host="ddr5-6000x2"), quant="Q4_K_M", runtime=r,
                           mode="analytic").tpot_ms["mean"] for r in ("llama.cpp", zero)]
    assert cpu[0] == pytest.approx(cpu[1], rel=1e-12)


def _llama_cpp_with(**decode):
    """llama.cpp's runtime with these decode terms replaced."""
    import dataclasses
    rt = runtime("llama.cpp")
    return dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, **decode))


def test_amd_flash_attention_runs_at_its_sourced_share_of_the_fp32_rate():
    """runtimes.toml fa_fp32_share: llama.cpp's prompt attention on RDNA3 / RDNA4 runs at the sourced share of
    the fp32 vector rate (HIP 0.21, Vulkan on RDNA3 0.11), below the GEMM rate; CDNA and RDNA2 keep attention
    at the GEMM rate (NVIDIA: the next test); a long prompt slows more than a short one."""
    for gpu, rid, share, fp32 in (("ryzen-ai-max-plus-395", "llama.cpp-hip", 0.21, 29.7),
                                  ("ryzen-ai-max-plus-395", "llama.cpp-vulkan", 0.11, 29.7),
                                  ("rx-7900-xtx", "llama.cpp-hip", 0.21, 61.44),
                                  ("radeon-ai-pro-r9700", "llama.cpp-hip", 0.21, 47.8)):
        hw = _hw(gpu, rid, model="llama-3.1-8b", quant="Q4_0")
        assert hw["prefill_attn_flops"] == pytest.approx(share * fp32 * 1e12), (gpu, rid)
        assert hw["prefill_attn_flops"] < hw["prefill_gemm_flops"], (gpu, rid)
    for gpu, rid in (("mi300x", "llama.cpp-hip"), ("rx-6800-xt", "llama.cpp-hip"),
                     ("radeon-ai-pro-r9700", "llama.cpp-vulkan")):
        hw = _hw(gpu, rid, model="llama-3.1-8b", quant="Q4_0")
        assert hw["prefill_attn_flops"] == hw["prefill_gemm_flops"], (gpu, rid)
    kw = dict(machine=moesim.machine(gpu="ryzen-ai-max-plus-395"), runtime="llama.cpp-hip", quant="Q4_0",
              context=8192, mode="analytic")
    short = moesim.simulate("llama-3.1-8b", prompt=512, **kw).prefill_tok_s
    long = moesim.simulate("llama-3.1-8b", prompt=8192, **kw).prefill_tok_s
    # 512-token ubatches alike but for the keys: a mean of 4096 instead of 256 for each prompt token, over
    # 32 layers x 16384 FLOPs per key, at 0.21 x 29.7 TFLOPS
    assert 1 / long - 1 / short == pytest.approx((4096 - 256) * 32 * 16384 / (0.21 * 29.7e12), rel=0.02)


def test_cuda_flash_attention_runs_at_its_share_of_the_fp16_tensor_rate_whatever_the_weights():
    """runtimes.toml [backends.cuda] fa_fp16_share: a prompt's flash attention on NVIDIA cards with tensor cores
    runs at 0.52 of the fp16 tensor rate (ik_llama.cpp discussion #758's RTX 4080 depth sweep), not at the
    weights' MMQ rate: the same for an MXFP4 and a Q4_K model (the MXFP4 MMQ factor is the weights' alone);
    Pascal (no tensor cores) keeps its GEMM rate."""
    for gpu, fp16 in (("rtx-4080", 97.4), ("rtx-4090", 165.2), ("rtx-3090", 71.0)):
        mx = _hw(gpu, "llama.cpp", model="gpt-oss-20b", quant="MXFP4")
        k = _hw(gpu, "llama.cpp", model="qwen3-30b-a3b", quant="Q4_K_M")
        tf = moesim.machine(gpu=gpu).gpu_tflops["fp16"]
        assert mx["prefill_attn_flops"] == k["prefill_attn_flops"] == pytest.approx(0.52 * tf * 1e12), gpu
        assert tf == pytest.approx(fp16, rel=0.02), gpu
        assert mx["prefill_attn_flops"] != mx["prefill_gemm_flops"]
    p40 = _hw("tesla-p40", "llama.cpp", model="qwen3-30b-a3b", quant="Q4_K_M")
    assert p40["prefill_attn_flops"] == p40["prefill_gemm_flops"]
    # the source rows' pp2048 slope between 8192 and 28672 tokens of depth (6111.65 -> 4109.87 t/s): 3.89 ns per
    # key, at the priors as after calibration (the slope is attention's alone)
    from pathlib import Path

    from moesim.analysis import validate as V
    rows = {r["id"]: r for r in V.load_rows(Path(moesim.__file__).parent / "data" / "measurements_collected.csv")}
    t = [1 / V.prepare(V.build(rows[i]), calibrated=False).predict()[1] for i in ("LC-n205", "LC-n207")]
    assert t[1] - t[0] == pytest.approx(1 / 4109.87 - 1 / 6111.65, rel=0.05)


def test_a_cpu_layer_pays_the_cpu_graphs_barriers():
    """runtimes.toml cpu_layer_us: under llama.cpp each layer computed on the CPU (CPU-only, or below -ngl) adds
    its graph's barrier latency to the step; GPU layers and runtimes without the term (vLLM) do not."""
    d = runtime("llama.cpp").decode
    assert d.cpu_layer_us > 0 and runtime("vllm").decode.cpu_layer_us == 0.0
    m = moesim.model("qwen3-30b-a3b")
    kw = dict(machine=moesim.machine(gpu="none", host="ddr5-6000x2"), quant="Q4_K_M", placement="cpu-only",
              context=512, mode="analytic")
    base = moesim.simulate(m, runtime="llama.cpp", **kw)
    off = moesim.simulate(m, runtime=_llama_cpp_with(cpu_layer_us=0.0), **kw)
    assert base.tpot_ms["mean"] - off.tpot_ms["mean"] == pytest.approx(m.n_layers * d.cpu_layer_us * 1e-3, rel=1e-6)
    gpu = dict(machine=moesim.machine(gpu="rtx-4090"), quant="Q4_K_M", placement="all-gpu", context=512,
               mode="analytic")
    assert moesim.simulate(m, runtime="llama.cpp", **gpu).tpot_ms["mean"] == pytest.approx(
        moesim.simulate(m, runtime=_llama_cpp_with(cpu_layer_us=0.0), **gpu).tpot_ms["mean"])


@pytest.mark.parametrize("gpu", ["rx-9070-xt", "ryzen-ai-max-plus-395"])
def test_hip_pays_its_per_layer_cost_where_vulkan_pays_none(gpu):
    """runtimes.toml [backends.*] launch_us_nograph: ggml-vulkan records command buffers while the GPU runs (no
    host launch per kernel), the HIP backend pays 51 us per decoder layer more on the same AMD card (llama.cpp
    issue #26663's RX 9070 XT pairs, #24438's Radeon 8060S pair), whether or not the catalog lists CUDA graphs
    for the chip (the RX 9070 XT does, the 8060S does not). A dense model at batch 1 reads the same bytes under
    both backends, so the time per token differs by exactly n_layers x 51 us."""
    vk, hip = _hw(gpu, "llama.cpp-vulkan", model="qwen3-8b"), _hw(gpu, "llama.cpp-hip", model="qwen3-8b")
    d = runtime("llama.cpp").decode
    kernels = d.layer_kernels * d.kernel_us
    clock = 1980.0 / float((_catalog.load("hardware")["gpu"].get(gpu) or
                            _catalog.load("hardware")["unified"][gpu])["boost_mhz"])
    assert vk["launch_s"] == pytest.approx(kernels * clock * 1e-6)
    assert hip["launch_s"] == pytest.approx((kernels * clock + 51.0) * 1e-6)
    assert vk["nograph_s"] == hip["nograph_s"] == 0.0        # no graph to fall out of at larger batches
    m = moesim.machine(gpu=gpu)
    t = {rid: 1.0 / moesim.simulate("qwen3-8b", machine=m, quant="Q4_K_M", context=512, runtime=rid,
                                    mode="analytic").decode_tok_s for rid in ("llama.cpp-vulkan", "llama.cpp-hip")}
    layers = moesim.model("qwen3-8b").n_layers
    assert t["llama.cpp-hip"] - t["llama.cpp-vulkan"] == pytest.approx(layers * 51e-6, rel=1e-6)


def test_cuda_keeps_the_runtimes_launch_and_graphs():
    """The CUDA backend names no launch cost of its own: an RTX 4090 replays graphs (kernels only), a GTX 1080
    Ti (no graphs in the catalog) pays the runtime's launch_us_nograph on top."""
    d = runtime("llama.cpp").decode
    for gpu, nograph in (("rtx-4090", 0.0), ("gtx-1080-ti", d.launch_us_nograph)):
        hw = _hw(gpu, "llama.cpp", model="qwen3-8b")
        clock = 1980.0 / float(_catalog.load("hardware")["gpu"][gpu]["boost_mhz"])
        assert hw["launch_s"] == pytest.approx((d.layer_kernels * d.kernel_us * clock + nograph) * 1e-6), gpu


def test_cdna_keeps_the_runtimes_launch_under_hip():
    """The HIP per-layer cost was measured on RDNA 3.5 / 4 (gfx1151, gfx1201) and is keyed by arch prefix: an
    MI300X (gfx942, no pair measured) keeps the runtime's launch and its catalog graphs (kernels only)."""
    d = runtime("llama.cpp").decode
    hw = _hw("mi300x", "llama.cpp-hip", model="qwen3-8b")
    clock = 1980.0 / float(_catalog.load("hardware")["gpu"]["mi300x"]["boost_mhz"])
    assert hw["launch_s"] == pytest.approx(d.layer_kernels * d.kernel_us * clock * 1e-6)


def test_metal_prompt_rates_by_build_era():
    """llama.cpp on an Apple GPU: current builds multiply the prompt at prefill_flops_eff_unified of the fp16 rate,
    builds before mid-2024 (llama.cpp-2024h1, and 2023 by its base) at metal_prefill_rel of that, and ggml-metal's
    flash attention runs at [backends.metal]'s share of the fp16 rate; MLX's attention keeps its GEMM rate."""
    peak = moesim.machine(gpu="m2-ultra").gpu_tflops["fp16"] * 1e12
    new, old, older = (_hw("m2-ultra", rid, "qwen2.5-7b", "Q8_0")
                       for rid in ("llama.cpp", "llama.cpp-2024h1", "llama.cpp-2023"))
    eff = runtime("llama.cpp").decode.prefill_flops_eff_unified
    rel = runtime("llama.cpp-2024h1").decode.metal_prefill_rel
    assert rel < 1.0 and runtime("llama.cpp").decode.metal_prefill_rel == 1.0
    assert new["prefill_gemm_flops"] == pytest.approx(peak * eff)
    assert old["prefill_gemm_flops"] == pytest.approx(peak * eff * rel)
    assert older["prefill_gemm_flops"] == pytest.approx(old["prefill_gemm_flops"])
    share = _catalog.load("runtimes")["backends"]["metal"]["fa_fp16_share"]["apple"]
    assert new["prefill_attn_flops"] == pytest.approx(peak * min(eff, share))
    mlx = _hw("m2-ultra", "mlx", "qwen3-30b-a3b", "mlx-4bit")
    assert mlx["prefill_attn_flops"] == pytest.approx(mlx["prefill_gemm_flops"])


def test_metal_flash_attention_share_is_what_its_source_measures():
    """[backends.metal] fa_fp16_share from its source's two depth pairs (llama.cpp PR #15616, M2 Ultra, fa 1): the
    extra time per prompt token from pp2048 to pp16384 over the score FLOPs of the extra keys."""
    share = _catalog.load("runtimes")["backends"]["metal"]["fa_fp16_share"]["apple"]
    fp16 = moesim.machine(gpu="m2-ultra").gpu_tflops["fp16"] * 1e12
    implied = []
    for (layers, heads, dim), short, long in (((28, 28, 128), 1470.14, 1037.44), ((48, 32, 128), 2272.56, 1022.81)):
        per_key = layers * heads * dim * 4                  # QK^T and PV, 2 FLOPs per multiply-add
        extra_keys = (16384 - 2048) / 2                      # mean keys per prompt token, causal
        implied.append(per_key * extra_keys / (1 / long - 1 / short) / fp16)
    assert min(implied) > 0.35 and max(implied) < 0.41
    assert share == pytest.approx(math.sqrt(implied[0] * implied[1]), abs=0.01)
