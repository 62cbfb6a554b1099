"""Physics terms that come from sources rather than from the fit: the serving runtimes' per-layer latency
under CUDA graphs (kernels per layer x one kernel's latency), the CPU-cluster bandwidth ceiling of Apple's Max / Ultra chips, and the served GEMM
rate by weight path (fp8 / fp4 tensor cores)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import moesim
from moesim import _catalog
from moesim.analysis.calibrate import PARAMS
from moesim.engine.lower.machine import _served_gemm_rel, graph_launch_us, lower_machine
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import decode_priors, runtime

GB = 1e9
SERVED = ("vllm", "sglang", "trtllm")


# graph-replayed kernels per decoder layer, sourced (runtimes.toml): TensorRT-LLM tech blog 1's 13 fused modules;
# SGLang's DeepSeek-R1-NVFP4 decode path ~20 of its 23 kernels, vLLM assumed the same
LAYER_KERNELS = {"vllm": 20, "sglang": 20, "trtllm": 13}


@pytest.mark.parametrize("rid", SERVED)
def test_served_per_layer_latency_is_kernels_times_one_kernels_latency(rid):
    """Graph-replayed decode: per layer, every replayed kernel pays one kernel's constant latency. The count
    (the runtime's) and the latency (AIC's 3 us) come from sources and are not fitted; the TP collectives'
    per-layer cost (allreduce_us) is what the tensor-parallel rows fit."""
    assert not any(p.field in ("launch_us", "layer_kernels", "kernel_us") and p.family in (None, "served")
                   for p in PARAMS)
    assert any(p.field == "allreduce_us" and p.family == "served" for p in PARAMS)
    pri = decode_priors(rid)
    assert pri["layer_kernels"] == LAYER_KERNELS[rid] and pri["kernel_us"] == pytest.approx(3.0)
    assert pri["allreduce_us"] == pytest.approx(20.0)
    d = runtime(rid).decode
    assert d.layer_kernels == LAYER_KERNELS[rid] and d.kernel_us == pri["kernel_us"]
    assert graph_launch_us(d) == pytest.approx(LAYER_KERNELS[rid] * 3.0)
    # AIC's 0.8 achievable-HBM factor models the serving runtimes; llama.cpp's share is fitted on its own rows
    assert d.gpu_bw_eff == pri["gpu_bw_eff"] == pytest.approx(0.8)
    assert not any(p.field == "gpu_bw_eff" and p.family in (None, "served") for p in PARAMS)


def test_served_per_layer_latency_by_hand():
    """8x B200 under TensorRT-LLM at the priors: 13 kernels x 3 us = 39 us per layer in the graph; two
    all-reduces of tp8 (allreduce_us / 2 each) apart. llama.cpp counts its 15 kernels per layer the same
    way (45 us), and without CUDA graphs (a Pascal card) pays each kernel's launch on top (launch_us_nograph)."""
    m = moesim.model("deepseek-r1")
    mach = moesim.machine(gpu="b200", gpus=8)
    rt = runtime("trtllm", calibrated=False)
    hw = lower_machine(mach, rt, parse_placement("all-gpu", m, mach), Q.kernel_mix(m, Q.resolve("fp4", m)))
    assert hw["launch_s"] == pytest.approx(39e-6)
    assert hw["allreduce_s"] == pytest.approx(20e-6)
    one = moesim.machine(gpu="rtx-4090")
    lc = runtime("llama.cpp", calibrated=False)
    m8 = moesim.model("llama-3-8b")
    hw = lower_machine(one, lc, parse_placement("all-gpu", m8, one), Q.kernel_mix(m8, Q.resolve("Q4_K_M", m8)))
    # the 4090's 2520 MHz boost runs each kernel's constant latency in 1980 / 2520 of the reference time
    assert lc.decode.layer_kernels == 15 and hw["launch_s"] == pytest.approx(45e-6 * 1980 / 2520)
    assert not any(p.field in ("launch_us", "layer_kernels", "kernel_us", "kernel_ref_mhz") for p in PARAMS)
    p40 = moesim.machine(gpu="tesla-p40")
    hw = lower_machine(p40, lc, parse_placement("all-gpu", m8, p40), Q.kernel_mix(m8, Q.resolve("Q4_K_M", m8)))
    assert hw["launch_s"] == pytest.approx((45.0 * 1980 / 1531 + lc.decode.launch_us_nograph) * 1e-6)
    off = runtime("offload", calibrated=False).decode         # eager PyTorch: no graph, no kernel count
    assert off.layer_kernels == 0 and graph_launch_us(off) == off.launch_us and off.launch_us_nograph == 0


def test_served_kernel_terms_cite_their_sources():
    """Each new per-layer term in runtimes.toml carries its sources on the line that sets it (a term without
    one fails here): the kernel count per runtime and the per-kernel latency."""
    text = (Path(moesim.__file__).parent / "catalog" / "runtimes.toml").read_text(encoding="utf-8")
    blocks = {}
    for key in ("kernel_us = ", "layer_kernels = ", "kernel_ref_mhz = "):
        for i, line in enumerate(text.splitlines()):
            if line.startswith(key):
                # the comment continues on the indented lines that follow
                rest = text.splitlines()[i + 1:i + 12]
                body = line.split("#", 1)[1] if "#" in line else ""
                for nxt in rest:
                    if not nxt.lstrip().startswith("#") or not nxt.startswith(" "):
                        break
                    body += " " + nxt.strip().lstrip("#")
                blocks.setdefault(key, []).append(body)
    assert len(blocks["layer_kernels = "]) >= 4 and blocks["kernel_us = "]
    srcs = ("AIC", "lpc0220/mini-sglang-deepseek-only", "tech blog 1")
    assert "AIC" in blocks["kernel_us = "][0] and "lpc0220" in blocks["kernel_us = "][0]
    counted = [b for b in blocks["layer_kernels = "] if not b.strip().startswith(("0", "graph-replayed", "eager"))]
    for body in counted:
        assert any(s in body for s in srcs), body


def test_single_gpu_serving_at_batch_1_pays_every_graph_kernel():
    """qwen3-235b-a22b fp4 on one GB200 under TensorRT-LLM: 94 layers, CUDA graphs; the fixed cost is 94 layers
    x 13 kernels x 3 us (at the GB200's 2112 MHz boost, x 1980 / 2112) plus one step's host and per-sequence
    cost (no TP collectives): ~3.9 ms against 2.6 ms of weight reads (the latency share was 72 % with a fitted
    120 us per layer, 84 % with a fitted kernel_us)."""
    r = moesim.simulate("qwen3-235b-a22b", moesim.machine(gpu="gb200"), quant="fp4", runtime="trtllm",
                        tokens=16, mode="analytic")
    res = r.breakdown["by_resource"]
    d = runtime("trtllm").decode
    want = (94 * 13 * d.kernel_us * 1980 / 2112 + d.step_us + d.seq_us) * 1e-6
    assert res["latency"] == pytest.approx(want, rel=0.01), res
    assert "interconnect" not in res or res["interconnect"] == 0.0
    assert res["latency"] < 2.0 * res["gpu_memory"], res


def _apple_max_ultra() -> list:
    uni = _catalog.load("hardware")["unified"]
    return sorted(k for k, v in uni.items() if v.get("vendor") == "apple" and "cpu_bw_gbs" in v)


def test_apple_cpu_ceilings_are_below_the_pool_on_max_and_ultra_chips_only():
    uni = _catalog.load("hardware")["unified"]
    chips = _apple_max_ultra()
    assert {"m1-max", "m2-ultra", "m3-ultra", "m4-max"} <= set(chips)
    for k in chips:
        assert 0 < uni[k]["cpu_bw_gbs"] < uni[k]["mem_bw_gbs"], k
    for k in ("m1", "m1-pro", "m4-pro"):      # "maybe less so for the M1 Pro": base and Pro CPUs reach the pool
        assert "cpu_bw_gbs" not in uni[k]


@pytest.mark.parametrize("uid", ["m1-max", "m3-ultra", "m4-pro"])
def test_unified_cpu_reads_stop_at_the_cpu_cluster_ceiling(uid):
    m = moesim.model("qwen3-30b-a3b")
    q = Q.resolve("Q4_K_M", m)
    mach = moesim.machine(gpu=uid)
    rt = runtime("llama.cpp")
    chip = _catalog.load("hardware")["unified"][uid]
    for kind in ("cpu-only", "unified"):
        hw = lower_machine(mach, rt, parse_placement(kind, m, mach), Q.kernel_mix(m, q))
        pool = mach.gpu_bw_gbs * GB * rt.decode.metal_bw_eff
        assert math.isclose(hw["gpu_bw"], pool)
        want = min(pool, chip["cpu_bw_gbs"] * GB * rt.decode.host_bw_eff_desktop) if "cpu_bw_gbs" in chip else pool
        assert math.isclose(hw["host_bw"], want), (uid, kind)


def test_apple_cpu_only_is_not_faster_than_its_gpu():
    """The M3 Ultra's CPU cores cannot draw the pool the GPU reads: CPU-only decode of an A3B MoE is not
    faster than Metal (it was 1.8x faster when the CPU was given the whole pool)."""
    mach = moesim.machine(gpu="m3-ultra")
    cpu = moesim.simulate("qwen3-30b-a3b", mach, placement="cpu-only", tokens=16, mode="analytic")
    gpu = moesim.simulate("qwen3-30b-a3b", mach, tokens=16, mode="analytic")
    assert cpu.decode_tok_s < 1.15 * gpu.decode_tok_s, (cpu.decode_tok_s, gpu.decode_tok_s)


def _tf(gpu: str) -> dict:
    g = _catalog.load("hardware")["gpu"][gpu]
    return dict(g["tflops"])


@pytest.mark.parametrize("gpu,quant,model,want_rate", [
    ("b200", "nvfp4", "qwen3-235b-a22b", "fp4"),     # W4A4 on fp4 tensor cores
    ("b200", "fp4", "qwen3-235b-a22b", "fp8"),       # W4A8 MXFP4 x MXFP8
    ("h100-sxm", "nvfp4", "qwen3-235b-a22b", "bf16"),  # no fp4 tensor cores: W4A16 mixed GEMMs
    ("h100-sxm", "fp8", "qwen3-235b-a22b", "fp8"),
])
def test_served_gemm_rate_follows_the_weight_path(gpu, quant, model, want_rate):
    m = moesim.model(model)
    mix = Q.kernel_mix(m, Q.resolve(quant, m))
    tf = _tf(gpu)
    peak = max(tf.get("bf16", 0.0), tf.get("fp16", 0.0))
    rel = _served_gemm_rel(tf, mix, peak)
    target = tf.get(want_rate, peak) / peak
    # the flagged share runs at the target rate, the rest (norms, router, bf16 layers) at the 16-bit peak
    flagged = mix.fp8 + mix.fp4_a4 + mix.fp4_a8
    assert flagged > 0.85
    if target > 1.0:
        assert 1.0 < rel <= target * (1 + 1e-9)
        assert rel > target * 0.5
    else:
        assert rel == pytest.approx(1.0)


def test_served_gemm_rate_without_quantized_weights_is_the_16_bit_peak():
    assert _served_gemm_rel({"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}, Q.KernelMix(), 2250.0) == 1.0


def test_unfused_delta_net_layers_pay_their_extra_graph_nodes():
    """llama.cpp builds before ggml's fused GATED_DELTA_NET op ran each Gated DeltaNet layer's decode recurrence as
    a decomposed 23-op graph (PR #20091): delta_net_unfused_ops more nodes per such layer, each a replayed kernel
    (kernel_us) on a GPU with graphs, plus its launch share without them, and a barrier (cpu_node_us) on the CPU.
    Current builds pay nothing extra; ik_llama.cpp leaves its fused delta-net off by default."""
    from moesim.analysis.validate import prepare, RowConfig
    from moesim.engine.lower.decode_model import delta_net_ops
    m = moesim.model("qwen3-next-80b-a3b")
    n_gdn = sum(layer.attention.kind == "gdn" for layer in m.layers)
    lc = runtime("llama.cpp", calibrated=False)
    assert (lc.decode.delta_net_ops, lc.decode.delta_net_unfused_ops, n_gdn) == (0.0, 22.0, 36)
    assert runtime("ik_llama.cpp", calibrated=False).decode.delta_net_ops == 22.0
    ops = delta_net_ops(m, 22.0)
    assert ops.sum() == 22.0 * n_gdn and not ops[[layer.attention.kind != "gdn" for layer in m.layers]].any()
    mix = Q.kernel_mix(m, Q.resolve("Q4_K_M", m))
    one = moesim.machine(gpu="rtx-4090")
    hw = lower_machine(one, lc, parse_placement("all-gpu", m, one), mix)
    # a replayed kernel's 3 us at the reference clock, x 1980 / boost_mhz (4090: 2520, P40: 1531)
    assert hw["op_s"] == pytest.approx(3e-6 * 1980 / 2520) and hw["cpu_op_s"] == pytest.approx(2.5e-6)
    p40 = moesim.machine(gpu="tesla-p40")
    hw = lower_machine(p40, lc, parse_placement("all-gpu", m, p40), mix)
    assert hw["op_s"] == pytest.approx((3.0 * 1980 / 1531 + lc.decode.launch_us_nograph / 15) * 1e-6)

    def step(fused, gpu):
        parts = dict(gpu="rtx-4090") if gpu else dict(host="ddr5-5200x2")
        mach = moesim.machine(**parts, host_mem_gb=128)
        cfg = RowConfig(row={}, model=m.id, quant="Q4_K_M", machine=mach, runtime="llama.cpp",
                        placement="experts-cpu" if gpu else "cpu-only", parallel=None, context=4096, prompt=512,
                        batch=1, mtp=0, kv_dtype=None, delta_net_fused=fused)
        return float(prepare(cfg, calibrated=False).steps()[0]["step_mean"][0])

    # every layer's attention on the GPU (experts on the CPU): 36 x 22 kernels of 3 us each at the 4090's clock
    assert step(False, True) - step(True, True) == pytest.approx(n_gdn * 22 * 3e-6 * 1980 / 2520, rel=1e-9)
    assert step(False, False) - step(True, False) == pytest.approx(n_gdn * 22 * 2.5e-6, rel=1e-9)


def test_delta_net_fusion_follows_the_row_date_and_notes():
    """Validation rows: mainline llama.cpp / Ollama runs dated before March 2026 ran the recurrence unfused;
    ik_llama.cpp's -fdn turns its fused one on; models without Gated DeltaNet layers are untouched."""
    from moesim.analysis.row_notes import delta_net_fused
    nxt, dense = moesim.model("qwen3-next-80b-a3b"), moesim.model("qwen3-30b-a3b")
    feb, apr = {"date": "2026-02-15"}, {"date": "2026-04-02"}
    assert delta_net_fused(nxt, feb, "", "llama.cpp-vulkan", notes := []) is False and notes
    assert delta_net_fused(nxt, feb, "", "ollama", []) is False
    assert delta_net_fused(nxt, apr, "", "llama.cpp", []) is None
    assert delta_net_fused(nxt, {}, "", "llama.cpp", []) is None
    assert delta_net_fused(dense, feb, "", "llama.cpp", []) is None
    assert delta_net_fused(nxt, feb, "llama-bench -fdn 16", "ik_llama.cpp", []) is True
    assert delta_net_fused(nxt, feb, "llama-bench -t 64", "ik_llama.cpp", []) is None


def test_builds_that_capture_one_token_steps_only_launch_larger_ones_kernel_by_kernel():
    """llama.cpp replayed decode steps of more than one token as CUDA graphs only from PR #19645 (2026-02-15,
    up to 4) and at every quantized-MoE batch from PR #26802 (2026-08-09): a row dated before runs larger
    steps without graphs, each GPU layer paying launch_us_nograph on top; a GPU without graphs pays it always."""
    import dataclasses

    from moesim.analysis.row_notes import graph_max_batch
    from moesim.analysis.validate import RowConfig, prepare
    lc = runtime("llama.cpp", calibrated=False)
    assert lc.decode.graph_max_batch == 0
    nov, may, sep = {"date": "2025-11-04"}, {"date": "2026-05-01"}, {"date": "2026-09-01"}
    assert graph_max_batch(nov, "", "llama.cpp", 2, notes := []) == 1 and notes
    assert graph_max_batch(may, "", "llama.cpp", 8, []) == 4 and graph_max_batch(may, "", "ollama", 2, []) == 4
    assert graph_max_batch(sep, "", "llama.cpp", 8, []) is None and graph_max_batch(nov, "", "llama.cpp", 1, []) is None
    assert graph_max_batch(nov, "", "llama.cpp-vulkan", 4, []) is None
    m = moesim.model("qwen3-30b-a3b")
    mix = Q.kernel_mix(m, Q.resolve("Q4_K_M", m))
    old = dataclasses.replace(lc, decode=dataclasses.replace(lc.decode, graph_max_batch=1))
    one, p40 = moesim.machine(gpu="rtx-4090"), moesim.machine(gpu="tesla-p40")
    hw = lower_machine(one, old, parse_placement("all-gpu", m, one), mix)
    assert hw["graph_max_tokens"] == 1 and hw["nograph_s"] == pytest.approx(lc.decode.launch_us_nograph * 1e-6)
    assert hw["mmid_sync_s"] == pytest.approx(0.5 * lc.decode.sync_us * 1e-6)     # MMQ with expert ids syncs
    hw = lower_machine(p40, old, parse_placement("all-gpu", m, p40), mix)
    assert hw["graph_max_tokens"] == 0 and hw["nograph_s"] == hw["mmid_sync_s"] == 0.0

    def step(limit, batch):
        cfg = RowConfig(row={}, model=m.id, quant="Q4_K_M", machine=one, runtime="llama.cpp", placement="all-gpu",
                        parallel=None, context=4096, prompt=512, batch=batch, mtp=0, kv_dtype=None,
                        graph_max_batch=limit)
        return float(prepare(cfg, calibrated=False).steps()[0]["step_mean"][0])

    assert step(1, 1) == step(None, 1)
    # every layer launches kernel by kernel, and each MoE layer's MUL_MAT_ID synchronises the stream once
    extra = m.n_layers * lc.decode.launch_us_nograph * 1e-6 + len(m.moe_layers) * 0.5 * lc.decode.sync_us * 1e-6
    assert step(1, 2) - step(None, 2) == pytest.approx(extra, rel=1e-9)
    assert step(4, 4) == step(None, 4)


def test_a_dgx_spark_build_synchronises_each_moe_layer_past_one_token():
    """llama.cpp's DGX Spark bench (benches/dgx-spark.md, build 6918, November 2025): from one sequence to two a
    step grows 8-16 ms, twice what the second token's experts read, because MUL_MAT_ID then leaves MMVQ for MMQ with
    expert ids and synchronises the stream (PR #18958). Its two-sequence rows of MoE models were +21..+34 % with the
    launches alone (its four-sequence rows +1..+20 %); the synchronisation per MoE layer puts them within 12 %
    (20 %)."""
    from moesim.analysis import validate as V
    from moesim.ingest.packaged import measurements_csv
    rows = [r for r in V.load_rows(measurements_csv())
            if "benches/dgx-spark.md" in r["source_url"] and r["batch"] in ("2", "4") and r["decode_tok_s"]]
    _, records, _ = V.evaluate_rows(rows)
    errs = {r["id"]: (r["batch"], r["decode_err"]) for r in records if r["decode_err"] is not None}
    assert len(errs) >= 12
    assert max(abs(e) for b, e in errs.values() if b == 2) < 0.12
    assert max(abs(e) for b, e in errs.values()) < 0.20


def test_builds_dated_before_their_gpus_graph_gate_launch_every_kernel():
    """llama.cpp replayed decode as CUDA graphs from PR #6766 (May 2024) on compute capability 8.0 and up, and on
    Volta and Turing only from PR #25749 (mid 2026): a row dated before the gate its GPU passes pays
    launch_us_nograph per layer at every batch; the H100 PCIe pair of issue #6763 (143.35 t/s on master, 163.83
    with the graph branch, llama-2-7B Q4_K_M) is the gap between the two."""
    import dataclasses

    from moesim.analysis.row_notes import graphs_min_cc
    apr24, nov25, sep26 = {"date": "2024-04-19"}, {"date": "2025-11-26"}, {"date": "2026-09-01"}
    assert graphs_min_cc(apr24, "", "llama.cpp", "8.9", notes := []) == 99.0 and notes
    assert graphs_min_cc(apr24, "with CUDA graphs (branch)", "llama.cpp", "9.0", []) is None
    assert graphs_min_cc(nov25, "", "llama.cpp", "7.5", []) == 8.0
    assert graphs_min_cc(nov25, "", "ollama", "7.0", []) == 8.0
    assert graphs_min_cc(nov25, "", "llama.cpp", "8.6", []) is None       # the gate passes Ampere
    assert graphs_min_cc(sep26, "", "llama.cpp", "7.5", []) is None       # PR #25749: Turing replays graphs
    assert graphs_min_cc({}, "", "llama.cpp", "7.5", []) is None          # undated: current builds
    assert graphs_min_cc(nov25, "", "llama.cpp-vulkan", "7.5", []) is None
    assert graphs_min_cc(nov25, "", "llama.cpp", None, []) is None        # not a CUDA GPU
    lc = runtime("llama.cpp", calibrated=False)
    assert lc.decode.graphs_min_cc == 0.0
    gated = dataclasses.replace(lc, decode=dataclasses.replace(lc.decode, graphs_min_cc=8.0))
    m = moesim.model("llama-2-7b")
    mix = Q.kernel_mix(m, Q.resolve("Q4_0", m))
    turing, ada = moesim.machine(gpu="rtx-2080"), moesim.machine(gpu="rtx-4090")
    for mach, extra in ((turing, lc.decode.launch_us_nograph), (ada, 0.0)):
        p = parse_placement("all-gpu", m, mach)
        base, old = lower_machine(mach, lc, p, mix), lower_machine(mach, gated, p, mix)
        assert old["launch_s"] - base["launch_s"] == pytest.approx(extra * 1e-6, abs=1e-15)
    from moesim.analysis.validate import build, prepare
    row = dict(id="REF-x", quality="A", model="llama-2-7b", quant="Q4_K_M", runtime="llama.cpp", gpu="h100-pcie",
               gpus="1", placement="all-gpu", batch="1", mtp="0", decode_tok_s="143.35", notes="", date="2024-04-19")
    tok = [prepare(build(dict(row, notes=n)), calibrated=False).predict()[0] for n in ("", "with CUDA graphs")]
    assert 1.0 / tok[0] - 1.0 / tok[1] == pytest.approx(m.n_layers * lc.decode.launch_us_nograph * 1e-6, rel=1e-6)


def _prefill_tok_s(model, quant, machine, runtime_id, placement, **row_settings):
    from moesim.analysis.validate import RowConfig, prepare
    cfg = RowConfig(row={}, model=model, quant=quant, machine=machine, runtime=runtime_id, placement=placement,
                    parallel=None, context=512, prompt=512, batch=1, mtp=0, kv_dtype=None, **row_settings)
    return prepare(cfg, calibrated=False).predict()[1]


def test_cpu_only_prefill_reads_each_expert_once():
    """Without a GPU there is nothing to offload a large ubatch's expert matmuls to: a CPU-only prompt reads
    each used expert once from RAM and multiplies on the CPU, whatever the runtime's op-offload threshold
    (it used to take the copy path, reading the experts twice, host to 'GPU' and again to compute)."""
    from moesim.analysis.validate import RowConfig, prepare
    cpu = moesim.machine(cpu="ryzen-9-7950x", host="ddr5-6000x2")
    for rid in ("llama.cpp", "ik_llama.cpp"):
        assert runtime(rid, calibrated=False).decode.op_offload_min_batch > 0
        cfg = RowConfig(row={}, model="qwen3-30b-a3b", quant="Q4_K_M", machine=cpu, runtime=rid,
                        placement="cpu-only", parallel=None, context=512, prompt=512, batch=1, mtp=0, kv_dtype=None)
        assert prepare(cfg, calibrated=False).dm["gpu_offload"] == 0
        # repacked_cpu_weights turns the runtime's op offload off (op_offload_min_batch 0)
        args = ("qwen3-30b-a3b", "Q4_K_M", cpu, rid, "cpu-only")
        assert _prefill_tok_s(*args) == _prefill_tok_s(*args, repacked_cpu_weights=True) > 0


def test_run_time_repack_keeps_prompt_matmuls_on_the_cpu():
    """ik_llama.cpp's -rtr repacks CPU weights into row-interleaved types no GPU backend reads (ik PR #147),
    so a large ubatch's matmuls on them stay on the CPU ('the weight repacking prevents offloading the prompt
    computation', llama.cpp issue #12481): a row run with it takes op offload off; mainline rows and runs
    without the flag keep the profile's offload."""
    from moesim.analysis.row_notes import repacked_cpu_weights
    assert repacked_cpu_weights("llama-sweep-bench -fa -fmoe -rtr -t 16", "ik_llama.cpp", notes := []) and notes
    assert repacked_cpu_weights("--run-time-repack", "ik_llama.cpp", [])
    assert not repacked_cpu_weights("-rtr", "llama.cpp", [])
    assert not repacked_cpu_weights("-fa -fmoe -ctk q8_0 -ctv-rtr", "ik_llama.cpp", [])
    assert not repacked_cpu_weights("-fa -fmoe", "ik_llama.cpp", [])
    hybrid = moesim.machine(gpu="rtx-4080", cpu="ryzen-9-7950x", host="ddr5-6000x2")
    args = ("qwen3-235b-a22b", "IQ3_S", hybrid, "ik_llama.cpp", "n-cpu-moe=80")
    offloaded, repacked = _prefill_tok_s(*args), _prefill_tok_s(*args, repacked_cpu_weights=True)
    assert repacked != offloaded
    cpu = moesim.machine(cpu="ryzen-9-7950x", host="ddr5-6000x2")
    args = ("qwen3-30b-a3b", "IQ4_XS", cpu, "ik_llama.cpp", "cpu-only")
    assert _prefill_tok_s(*args) == _prefill_tok_s(*args, repacked_cpu_weights=True)


def test_cpu_attention_runs_at_its_kernels_share_of_the_fp32_peak():
    """CPU attention scores run at the runtime's attention-kernel share of the cores' fp32 vector peak
    (runtimes.toml cpu_attn_eff / cpu_prefill_attn_eff), not at its quantized matmul rate; a runtime that
    sets no share (0) keeps the matmul rate."""
    from moesim.engine.lower.machine import _core_cycles, flops_per_cycle
    m = moesim.model("qwen3-30b-a3b")
    mix = Q.kernel_mix(m, Q.resolve("Q4_K_M", m))
    cpu = moesim.machine(cpu="ryzen-9-7950x", host="ddr5-6000x2")
    peak = _core_cycles(cpu) * flops_per_cycle(cpu)
    place = parse_placement("cpu-only", m, cpu)
    for rid, decode, prefill in (("llama.cpp", 0.038, 0.067), ("ik_llama.cpp", 0.10, 0.72), ("ollama", 0.038, 0.067)):
        rt = runtime(rid, calibrated=False)
        hw = lower_machine(cpu, rt, place, mix)
        assert hw["cpu_attn_flops"] == pytest.approx(peak * decode, rel=1e-12)
        want = hw["cpu_flops"] if prefill is None else peak * prefill
        assert hw["cpu_prefill_attn_flops"] == pytest.approx(want, rel=1e-12)
    sg = runtime("sglang", calibrated=False)
    assert sg.decode.cpu_attn_eff == 0.0
    hw = lower_machine(cpu, sg, place, mix)
    assert hw["cpu_attn_flops"] == hw["cpu_flops"] == hw["cpu_prefill_attn_flops"]


def _implied_share(first: str, last: str, field: str, phase: str) -> float:
    """The share of the fp32 peak at which the model's decode (or prefill) time per token per key of depth
    between two rows of one depth sweep equals the measured one (bisection)."""
    import dataclasses

    from moesim.analysis import validate as V
    rows = {r["id"]: r for r in V.load_rows(Path(moesim.__file__).parent / "data" / "measurements_collected.csv")}
    prep = [V.prepare(V.build(rows[i])) for i in (first, last)]
    column = "decode_tok_s" if phase == "decode" else "prefill_tok_s"
    measured = 1 / float(rows[last][column]) - 1 / float(rows[first][column])

    def slope(share):
        t = []
        for p in prep:
            rt = dataclasses.replace(p.rt, decode=dataclasses.replace(p.rt.decode, **{field: share}))
            t.append(1 / p.predict(rt)[0 if phase == "decode" else 1])
        return t[1] - t[0]

    lo, hi = 1e-3, 5.0
    for _ in range(50):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if slope(mid) > measured else (lo, mid)
    return lo


@pytest.mark.parametrize("first,last", [("CPU-n105", "CPU-n108"), ("CPU-n003", "CPU-n005"), ("CPU-n201", "CPU-n204")])
def test_mainline_cpu_decode_depth_slopes_follow_their_prior(first, last):
    """runtimes.toml's llama.cpp cpu_attn_eff (0.038) is the geometric mean of what three depth sweeps of three
    sources imply (3.67, 3.61, 4.04 %): each lies within 10 % of it, so any one held out predicts the others."""
    prior = runtime("llama.cpp", calibrated=False).decode.cpu_attn_eff
    assert _implied_share(first, last, "cpu_attn_eff", "decode") == pytest.approx(prior, rel=0.10)


def test_mainline_cpu_prompt_depth_slopes_give_their_prior():
    """runtimes.toml's llama.cpp cpu_prefill_attn_eff (0.067) is the geometric mean of what the same three depth
    sweeps imply for a prompt's per-row walks (7.96, 5.67, 6.58 %), their re-reads served by the 7950X's L3."""
    prior = runtime("llama.cpp", calibrated=False).decode.cpu_prefill_attn_eff
    shares = [_implied_share(a, b, "cpu_prefill_attn_eff", "prefill")
              for a, b in (("CPU-n105", "CPU-n108"), ("CPU-n003", "CPU-n005"), ("CPU-n201", "CPU-n204"))]
    assert math.exp(sum(map(math.log, shares)) / 3) == pytest.approx(prior, rel=0.02)
    assert all(s == pytest.approx(prior, rel=0.25) for s in shares)


def test_swa_full_makes_a_gpu_decode_walk_the_whole_sliding_window_cache():
    """llama.cpp --swa-full keeps every token in the sliding-window layers' cache; a GPU decode step's flash
    attention then reads all of it (ik_llama.cpp discussion #758: gpt-oss-20b on an RTX 4080, 114.7 vs 137.5
    t/s at 28,672 tokens), while ggml-cpu's per-row kernel skips the masked keys. The notes set it for mainline
    rows only; a prompt on the GPU walks it too."""
    from moesim.analysis.row_notes import swa_full
    from moesim.analysis.validate import RowConfig, prepare
    assert swa_full("llama-sweep-bench -c 30720 -ub 2048, --swa-full; PP 2048", "llama.cpp", notes := []) and notes
    assert not swa_full("SWA cache of the last u-batch only (default)", "llama.cpp", [])
    assert not swa_full("--swa-full", "ik_llama.cpp", [])
    m = moesim.model("gpt-oss-20b")
    windowed = [l for l, layer in enumerate(m.layers) if layer.attention.window]
    full = [l for l, layer in enumerate(m.layers) if not layer.attention.window]
    assert windowed and full
    mach = moesim.machine(gpu="rtx-4080", cpu="ryzen-9-7950x", host="ddr5-6000x2")

    def prepared(placement, on):
        cfg = RowConfig(row={}, model=m.id, quant="MXFP4", machine=mach, runtime="llama.cpp", placement=placement,
                        parallel=None, context=28672, prompt=2048, batch=1, mtp=0, kv_dtype=None, swa_full=on)
        return prepare(cfg, calibrated=False)

    off, on = prepared("all-gpu", False), prepared("all-gpu", True)
    # every windowed layer now reads what a full-attention layer of the same shape reads at this depth
    assert np.allclose(on.dm["kv_bytes"][windowed], off.dm["kv_bytes"][full[0]])
    assert np.all(on.dm["kv_bytes"][windowed] > 10 * off.dm["kv_bytes"][windowed])
    assert np.array_equal(on.dm["kv_bytes"][full], off.dm["kv_bytes"][full])
    assert on.predict()[0] < off.predict()[0] and on.predict()[1] < off.predict()[1]
    cpu_off, cpu_on = prepared("layers-gpu=0", False), prepared("layers-gpu=0", True)
    assert np.array_equal(cpu_on.dm["kv_bytes"], cpu_off.dm["kv_bytes"])
    assert cpu_on.predict() == cpu_off.predict()


def test_kernel_latency_is_counted_in_the_gpus_cycles():
    """A kernel's constant latency (kernel_us, and moe_layer_us, a count of them) holds at kernel_ref_mhz
    (the H100 SXM's 1980 MHz boost) and scales as kernel_ref_mhz / boost_mhz on every GPU the catalog gives a
    boost clock: the RTX 3090 (1695 MHz) pays more per kernel than the RTX 4090 (2520 MHz); host-side launches
    (launch_us_nograph) and Apple's fitted per-layer Metal cost do not scale; a custom GPU without a clock
    keeps the reference latency."""
    import dataclasses

    from moesim.engine.lower.machine import kernel_clock_scale
    lc = runtime("llama.cpp", calibrated=False)
    d = lc.decode
    assert d.kernel_ref_mhz == pytest.approx(1980.0)
    hw_cat = _catalog.load("hardware")
    assert hw_cat["gpu"]["h100-sxm"]["boost_mhz"] == 1980
    m = moesim.model("qwen3-30b-a3b")
    mix = Q.kernel_mix(m, Q.resolve("Q4_K_M", m))

    def lowered(gpu, rt=lc):
        mach = moesim.machine(gpu=gpu)
        return lower_machine(mach, rt, parse_placement("all-gpu", m, mach), mix)

    for gpu, mhz in (("rtx-3090", 1695), ("rtx-4090", 2520), ("h100-sxm", 1980), ("tesla-p40", 1531)):
        g = hw_cat["gpu"][gpu]
        assert g["boost_mhz"] == mhz and kernel_clock_scale(d, g) == pytest.approx(1980 / mhz)
        hw = lowered(gpu)
        assert hw["moe_s"] == pytest.approx(d.moe_layer_us * 1980 / mhz * 1e-6)
        assert hw["op_s"] == pytest.approx(d.kernel_us * 1980 / mhz * 1e-6 + (
            0.0 if g.get("cuda_graphs", True) else d.launch_us_nograph / d.layer_kernels * 1e-6))
    slow, fast = lowered("rtx-3090"), lowered("rtx-4090")
    assert slow["launch_s"] / fast["launch_s"] == pytest.approx(2520 / 1695)
    # no reference clock: no scaling (the latencies as AIC gives them)
    flat = dataclasses.replace(lc, decode=dataclasses.replace(d, kernel_ref_mhz=0.0))
    assert lowered("rtx-4090", flat)["launch_s"] == pytest.approx(d.layer_kernels * d.kernel_us * 1e-6)
    assert kernel_clock_scale(d, {}) == 1.0 and kernel_clock_scale(d, {"boost_mhz": 0}) == 1.0
    # unified chips: GB10 (CUDA) scales; Apple's kernels and per-MoE-layer Metal cost stand as they are
    spark = moesim.machine(gpu="dgx-spark")
    hw = lower_machine(spark, lc, parse_placement("unified", m, spark), mix)
    assert hw["moe_s"] == pytest.approx(d.moe_layer_us * 1980 / hw_cat["unified"]["dgx-spark"]["boost_mhz"] * 1e-6)
    mac = moesim.machine(gpu="m2-max")
    hw = lower_machine(mac, lc, parse_placement("unified", m, mac), mix)
    assert hw["launch_s"] == pytest.approx(d.layer_kernels * d.kernel_us * 1e-6)
    assert hw["moe_s"] == pytest.approx(lc.decode.launch_us_metal * 1e-6)


def test_every_gpu_clock_is_sourced_and_consistent_with_its_fp32_rate():
    """boost_mhz on every discrete GPU and non-Apple unified chip but one (the H20, whose published figures
    disagree), each with its source in the entry's source string, within a plausible range."""
    hw_cat = _catalog.load("hardware")
    missing = []
    for table in ("gpu", "unified"):
        for gid, g in hw_cat[table].items():
            if g.get("vendor") == "apple":
                assert "boost_mhz" not in g, gid
                continue
            if "boost_mhz" not in g:
                missing.append(gid)
                continue
            assert 900 <= g["boost_mhz"] <= 3300, gid
            assert f"boost clock {g['boost_mhz']} MHz" in g["source"], gid
    assert missing == ["h20"]
