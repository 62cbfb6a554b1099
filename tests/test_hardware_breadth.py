"""The NVIDIA breadth of the hardware catalog, the defaults that fit the machine (several datacenter GPUs
get a server host and a serving runtime on the native checkpoint) and an unlisted GPU described by flags.

The id lists and generation orders are written out here rather than read from the catalog, so removing
or reordering an entry makes a test fail instead of agreeing with itself."""
from __future__ import annotations

import json
import math

import pytest

import moesim
from moesim import _catalog
from moesim.analysis.fit import DEFAULT_FIT_QUANTS
from moesim.cli import main
from moesim.errors import MoesimError
from moesim.spec import hardware

PASCAL = ["gtx-1060-6gb", "gtx-1070", "gtx-1070-ti", "gtx-1080", "gtx-1080-ti", "titan-xp"]
TURING = ["rtx-2060", "rtx-2060-super", "rtx-2070", "rtx-2070-super", "rtx-2080", "rtx-2080-super", "rtx-2080-ti",
          "titan-rtx"]
AMPERE = ["rtx-3060", "rtx-3060-ti", "rtx-3070", "rtx-3070-ti", "rtx-3080", "rtx-3080-12gb", "rtx-3080-ti", "rtx-3090",
          "rtx-3090-ti"]
ADA = ["rtx-4060", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "rtx-4070", "rtx-4070-super", "rtx-4070-ti",
       "rtx-4070-ti-super", "rtx-4080", "rtx-4080-super", "rtx-4090"]
BLACKWELL = ["rtx-5060", "rtx-5060-ti-8gb", "rtx-5060-ti-16gb", "rtx-5070", "rtx-5070-ti", "rtx-5080", "rtx-5090"]
WORKSTATION = ["quadro-p6000", "rtx-a4000", "rtx-a4500", "rtx-a6000", "rtx-4000-ada", "rtx-4500-ada", "rtx-5000-ada",
               "rtx-pro-4000", "rtx-pro-4500", "rtx-pro-5000", "rtx-pro-5000-72gb"]
DATACENTER = ["v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-32gb", "v100s-pcie-32gb", "t4", "a2", "a10", "a30", "a40",
              "l40", "a100-pcie-40gb", "a800-pcie-80gb", "h800", "h20", "gh200", "b100", "h100-nvl"]
ALREADY_THERE = {"gtx-1080", "rtx-2080", "rtx-3060", "rtx-3090", "rtx-4090", "rtx-5090"}
NEW_IDS = [g for g in PASCAL + TURING + AMPERE + ADA + BLACKWELL + WORKSTATION + DATACENTER if g not in ALREADY_THERE]
NEW_MACHINES = ["dgx-a100", "hgx-a100", "hgx-h100", "hgx-h200", "hgx-h800", "hgx-h20", "hgx-b100", "hgx-b200",
                "dgx-b300", "hgx-b300", "gh200-superchip"]

# Peak bandwidth a memory technology allows on the widest bus NVIDIA ships with it (GB/s): per-pin rate x bus
# width / 8, with the fastest rates of each generation - GDDR5 9 Gbps x 384, GDDR5X 11.4 x 384, GDDR6 20 x 384,
# GDDR6X 24 x 384, GDDR7 32 x 512, HBM2 2.43 x 5120 (A100 40GB), HBM2e 3.2 x 5120, HBM3 6.4 x 8192 (MI300X: 5.2 x 8192), HBM3e 9.6 x 8192; lower
# ends: a 64-bit GDDR bus at its slowest rate, one HBM stack.
BW_RANGE = {"gddr5": (40, 432), "gddr5x": (150, 548), "gddr6": (60, 960), "gddr6x": (300, 1152),
            "gddr7": (200, 2048), "hbm2": (250, 1556), "hbm2e": (400, 2048), "hbm3": (800, 6554),
            "hbm3e": (1000, 9831)}


def _gpu(gid: str) -> dict:
    return _catalog.load("hardware")["gpu"][gid]


def test_at_least_55_new_nvidia_cards_and_every_one_is_in_the_catalog():
    assert len(NEW_IDS) >= 55
    missing = [g for g in NEW_IDS + sorted(ALREADY_THERE) if g not in hardware.gpu_ids()]
    assert not missing


@pytest.mark.parametrize("gid", NEW_IDS)
def test_every_new_gpu_builds_a_machine_and_fits_a_small_model(gid):
    mach = moesim.machine(gpu=gid, host="ddr5-6000x2", host_mem_gb=64)
    g = _gpu(gid)
    assert mach.gpu == gid and mach.gpu_bw_gbs == g["mem_bw_gbs"] and mach.gpu_mem_bytes == g["memory_bytes"]
    (rec,) = moesim.fit("llama-3-8b", mach, quants=["Q4_K_M"], context=2048)
    assert rec["fits"] != "no" and rec["decode_tok_s"] > 0 and rec["prefill_tok_s"] > 0


@pytest.mark.parametrize("gid", NEW_IDS)
def test_every_new_entry_is_complete_and_says_where_its_numbers_come_from(gid):
    g = _gpu(gid)
    for key in ("name", "memory_bytes", "mem_bw_gbs", "memory_type", "tflops", "compute_capability", "tensor_cores",
                "flash_attention", "cuda_graphs", "host_link", "power_w", "segment", "source"):
        assert key in g, f"{gid}: no {key}"
    assert g["vendor"] == "nvidia" and g["segment"] in ("consumer", "workstation", "datacenter")
    assert g["host_link"] in _catalog.load("hardware")["link"]
    src = g["source"]
    assert "http" in src or "/" in src or "assumed" in src, f"{gid}: source names no page, repository or assumption"
    assert all(v > 0 and math.isfinite(v) for v in g["tflops"].values())


@pytest.mark.parametrize("gid", [g for g in hardware.gpu_ids() if _catalog.load("hardware")["gpu"][g].get("memory_type")
                                 in BW_RANGE])
def test_bandwidth_is_within_what_its_memory_type_allows(gid):
    g = _gpu(gid)
    low, high = BW_RANGE[g["memory_type"]]
    assert low <= g["mem_bw_gbs"] <= high, f"{gid}: {g['mem_bw_gbs']} GB/s of {g['memory_type']}"


@pytest.mark.parametrize("tiers", [PASCAL, TURING, AMPERE, ADA, BLACKWELL], ids=["pascal", "turing", "ampere", "ada",
                                                                                "blackwell"])
def test_compute_and_bandwidth_rise_with_the_consumer_tier(tiers):
    """NVIDIA's own ordering within one generation: a higher tier never has less FP32, 16-bit tensor rate
    or memory bandwidth (the 8 GB / 16 GB twins are equal)."""
    for lower, upper in zip(tiers, tiers[1:]):
        a, b = _gpu(lower), _gpu(upper)
        assert a["fp32_tflops"] <= b["fp32_tflops"], (lower, upper)
        assert a["tflops"]["fp16"] <= b["tflops"]["fp16"], (lower, upper)
        assert a["mem_bw_gbs"] <= b["mem_bw_gbs"], (lower, upper)


@pytest.mark.parametrize("tiers, cc, tensor", [(PASCAL, "6.1", False), (TURING, "7.5", True), (AMPERE, "8.6", True),
                                               (ADA, "8.9", True), (BLACKWELL, "12.0", True)])
def test_generation_flags(tiers, cc, tensor):
    for gid in tiers:
        g = _gpu(gid)
        assert g["compute_capability"] == cc and g["tensor_cores"] is tensor, gid
        # below Volta llama.cpp runs the tile/vec FA kernels and no CUDA graphs (RT §1.8)
        assert g["cuda_graphs"] is tensor and (g["flash_attention"] is True) is tensor, gid


def test_the_eight_lane_cards_are_x8():
    for gid in ("rtx-4060", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "a2"):
        assert _gpu(gid)["host_link"] == "gen4x8", gid
    for gid in ("rtx-5060", "rtx-5060-ti-8gb", "rtx-5060-ti-16gb"):
        assert _gpu(gid)["host_link"] == "gen5x8", gid
    assert hardware.machine(gpu="rtx-4060").pcie_gbs == pytest.approx(15.75)


@pytest.mark.parametrize("mid", NEW_MACHINES)
def test_every_new_server_machine_builds_with_its_gpus(mid):
    m = hardware.machine(mid)
    assert m.n_gpus >= 1 and m.host_bw_gbs > 0 and m.host_mem_bytes > 0
    assert m.datacenter is (m.n_gpus > 1)
    assert not any("assumed" in a for a in m.assumptions)   # the catalog entry gives every part


# ------------------------------------------------------------------------------------ defaults
def test_several_datacenter_gpus_get_the_matching_server_host():
    m = moesim.machine(gpu="b200", gpus=8)
    assert (m.cpu, m.sockets, m.channels, m.host_memory) == ("xeon-platinum-8570", 2, 8, "ddr5-5600")
    assert m.host_mem_bytes == 2048e9 and m.datacenter
    assert any("dgx-b200 host" in a for a in m.assumptions)
    assert not any("desktop" in a or "channels not given" in a for a in m.assumptions)


def test_a_datacenter_gpu_without_a_catalog_server_gets_the_default_server_host():
    m = moesim.machine(gpu="a10", gpus=4)
    assert m.cpu == hardware.machine(hardware.SERVER_DEFAULT_MACHINE).cpu and m.sockets == 2
    assert m.pcie == "gen4x16"            # its own link, not the default server's PCIe 5.0
    assert any("no catalog server carries a10" in a for a in m.assumptions)


def test_a_given_host_or_a_single_gpu_keeps_the_old_composition():
    m = moesim.machine(gpu="b200", gpus=8, host="ddr5-4800x8", sockets=2)
    assert m.cpu is None and m.channels == 8 and not any("dgx" in a for a in m.assumptions)
    one = moesim.machine(gpu="h100-sxm")
    assert not one.datacenter and one.channels == 2
    assert not moesim.machine(gpu="rtx-4090", gpus=4).datacenter


def test_kimi_k3_on_eight_b200_is_served_natively_on_a_server_host():
    recs = moesim.fit("kimi-k3", moesim.machine(gpu="b200", gpus=8))
    assert len(recs) == 1
    (rec,) = recs
    assert rec["runtime"] == "vllm" and rec["quant"] == moesim.model("kimi-k3").native_quant
    assert "xeon" not in rec["machine"] and "x2 sockets" in rec["machine"]
    said = " ".join(rec["assumptions"])
    assert "quant native" in said and "dgx-b200 host" in said and "runtime vllm" in said


def test_a_single_rtx_4090_stays_on_llama_cpp_and_the_gguf_ladder():
    recs = moesim.fit("qwen3-30b-a3b", moesim.machine(gpu="rtx-4090"))
    assert [r["quant"] for r in recs] == list(DEFAULT_FIT_QUANTS)
    assert {r["runtime"] for r in recs} == {"llama.cpp"}
    assert not any("quant native" in a for r in recs for a in r["assumptions"])


def test_asking_for_llama_cpp_on_a_datacenter_machine_keeps_the_gguf_ladder():
    recs = moesim.fit("qwen3-30b-a3b", "dgx-h100", runtime="llama.cpp")
    assert [r["quant"] for r in recs] == list(DEFAULT_FIT_QUANTS)
    served = moesim.fit("qwen3-30b-a3b", "dgx-h100", runtime="sglang")
    # an explicit serving runtime takes "native" as the sweep does (and fp8 at load for a 16-bit checkpoint)
    native = moesim.simulate("qwen3-30b-a3b", "dgx-h100", quant="native", runtime="sglang", mode="analytic")
    assert [r["quant"] for r in served] == [native.memory["quant"], "fp8"]
    assert {r["runtime"] for r in served} == {"sglang"}


def test_a_bf16_native_model_is_served_as_its_checkpoint_not_as_a_gguf_file():
    """qwen3-30b-a3b publishes bf16 safetensors: on 8x H100 the default is vLLM on that checkpoint, where
    the bare name would resolve to llama.cpp's GGUF BF16 type."""
    (rec,) = moesim.fit("qwen3-30b-a3b", moesim.machine(gpu="h100-sxm", gpus=8))
    assert rec["quant"] == "bf16" and rec["runtime"] == "vllm"       # the GGUF type would read "BF16", llama.cpp


def test_simulate_native_on_a_datacenter_machine_is_served_too():
    r = moesim.simulate("qwen3-30b-a3b", moesim.machine(gpu="h100-sxm", gpus=8), tokens=8, mode="analytic")
    assert r.memory["runtime"] == "vllm" and r.memory["quant"] == "bf16"
    single = moesim.simulate("qwen3-30b-a3b", moesim.machine(gpu="rtx-4090", host_mem_gb=64), tokens=8, mode="analytic")
    assert single.memory["runtime"] == "llama.cpp"


def test_an_explicit_quant_on_a_datacenter_machine_is_kept():
    (rec,) = moesim.fit("qwen3-30b-a3b", "dgx-h100", quants=["Q4_K_M"])
    assert rec["quant"] == "Q4_K_M" and rec["runtime"] == "llama.cpp"


# ------------------------------------------------------------------------------------ custom GPU
def test_an_unlisted_gpu_from_three_numbers():
    m = moesim.machine(gpu_mem_gb=20, gpu_bw_gbs=800, gpu_tflops=120)
    assert m.gpu == hardware.CUSTOM_GPU and m.n_gpus == 1
    assert m.gpu_mem_bytes == 20e9 and m.gpu_bw_gbs == 800.0 and m.gpu_tflops["fp16"] == 120.0
    assert any("custom GPU" in a for a in m.assumptions)
    recs = moesim.fit("qwen3-30b-a3b", m, quants=["Q4_K_M"])      # ~18.6 GB of weights: 20 GB spills a little
    assert recs[0]["placement"].startswith("n-cpu-moe=") and recs[0]["decode_tok_s"] > 0
    (roomy,) = moesim.fit("qwen3-30b-a3b", moesim.machine(gpu_mem_gb=32, gpu_bw_gbs=800, gpu_tflops=120),
                          quants=["Q4_K_M"])
    assert roomy["placement"] == "all-gpu" and roomy["decode_tok_s"] > recs[0]["decode_tok_s"]


def test_flags_override_a_catalog_cards_numbers():
    stock = moesim.machine(gpu="rtx-4090")
    fast = moesim.machine(gpu="rtx-4090", gpu_bw_gbs=2016, gpu_tflops=330.4)
    assert fast.gpu_bw_gbs == 2016.0
    for dtype, rate in stock.gpu_tflops.items():       # every dtype scaled by 330.4 / 165.2 = 2
        assert fast.gpu_tflops[dtype] == pytest.approx(2 * rate)
    kw = dict(quants=["Q4_K_M"], context=2048)
    slow_rec, fast_rec = moesim.fit("llama-3-8b", stock, **kw)[0], moesim.fit("llama-3-8b", fast, **kw)[0]
    assert fast_rec["decode_tok_s"] > 1.5 * slow_rec["decode_tok_s"]
    assert fast_rec["prefill_tok_s"] > 1.5 * slow_rec["prefill_tok_s"]


@pytest.mark.parametrize("kw, field, words", [
    (dict(gpu_mem_gb=20, gpu_bw_gbs=800), "gpu_tflops", "gpu-tflops is missing"),
    (dict(gpu_bw_gbs=800, gpu_tflops=120), "gpu_mem_gb", "gpu-mem-gb is missing"),
    (dict(gpu_mem_gb=20, gpu_tflops=120), "gpu_bw_gbs", "gpu-bw-gbs is missing"),
    (dict(gpu="custom", gpu_mem_gb=20), "gpu_bw_gbs", "gpu-bw-gbs is missing"),
    (dict(gpu="rtx-4090", gpu_bw_gbs=-5), "gpu_bw_gbs", "positive"),
    (dict(gpu="rtx-4090", gpu_bw_gbs=0), "gpu_bw_gbs", "positive"),
    (dict(gpu="rtx-4090", gpu_tflops=float("nan")), "gpu_tflops", "finite"),
    (dict(gpu="rtx-4090", gpu_tflops=float("inf")), "gpu_tflops", "finite"),
    (dict(gpu="rtx-4090", gpu_bw_gbs=1e9), "gpu_bw_gbs", "plausible maximum"),
    (dict(gpu="rtx-4090", gpu_tflops="fast"), "gpu_tflops", "number"),
    (dict(gpu="m3-ultra", gpu_bw_gbs=900), "gpu_bw_gbs", "unified-memory"),
    (dict(host="ddr5-6000x2", gpus=0, gpu_bw_gbs=800), "gpu_bw_gbs", "without GPUs"),
])
def test_custom_gpu_errors_name_the_field(kw, field, words):
    with pytest.raises(MoesimError) as exc:
        moesim.machine(**kw)
    assert exc.value.field == field and words in str(exc.value)


def test_custom_gpu_through_the_cli(capsys):
    code = main(["fit", "qwen3-30b-a3b", "--gpu-mem-gb", "20", "--gpu-bw-gbs", "800", "--gpu-tflops", "120",
                 "--quant", "Q4_K_M", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (rec,) = json.loads(out)
    assert rec["machine"].startswith("1x custom") and rec["decode_tok_s"] > 0


@pytest.mark.parametrize("argv, words", [
    (["--gpu-mem-gb", "20", "--gpu-bw-gbs", "800"], "gpu-tflops is missing"),
    (["--gpu", "rtx-4090", "--gpu-bw-gbs", "-1"], "gpu_bw_gbs"),
    (["--gpu", "rtx-4090", "--gpu-tflops", "nan"], "finite"),
    (["--gpu", "rtx-4090", "--gpu-tflops", "lots"], "expected a number"),
])
def test_custom_gpu_cli_errors_are_one_line(capsys, argv, words):
    code = main(["fit", "qwen3-30b-a3b", *argv, "--quant", "Q4_K_M"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("moesim: error:") and err.count("\n") == 1 and words in err
