"""Expert parallelism: per-rank load from the routing, EPLB replicas, the dispatch/combine all-to-all, the
layout's all-reduces and memory per GPU (engine/lower/parallel.py, analysis/per_gpu.py, csrc/ms_decode.c)."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.analysis.per_gpu import gpu_bytes_per_gpu
from moesim.engine.lower.memory import memory_split_ways as split_ways
from moesim.analysis.resolve import with_parallel
from moesim.engine import decode as KD
from moesim.engine.lower import routing as LRT
from moesim.engine.lower.memory import CLASSES, TIERS, WEIGHT_CLASSES
from moesim.engine.lower.parallel import alltoall_bytes, layout_degrees, rank_load, slot_shares
from moesim.spec import routing as R
from moesim.spec.runtimes import runtime as get_runtime

H200 = dict(gpu="h200", gpus=8)


def _uniform(L, E, k):
    return np.full((L, E), k / E)


def _skewed(L, E, k, s, seed=0):
    """Zipf(s) popularity over a random permutation per layer, scaled to k picks per token."""
    rng = np.random.default_rng(seed)
    w = np.empty((L, E))
    for l in range(L):
        w[l, rng.permutation(E)] = np.arange(1, E + 1, dtype=float) ** -s
    q = w / w.sum(axis=1, keepdims=True) * k
    return np.minimum(q, 0.999)


# ------------------------------------------------------------------------------ per-rank load
def test_uniform_routing_balances_once_every_expert_is_read():
    """Uniform routing: once a step reads every expert each rank reads exactly E / P of them, so the
    busiest rank's experts load is 1 (within rounding)."""
    e, p = rank_load(_uniform(4, 256, 8), 4096, 8)
    np.testing.assert_allclose(e, 1.0, atol=1e-12)
    assert np.all(p >= 1.0) and np.all(p < 1.05)        # pairs: only the sampling spread of 4096 tokens


@pytest.mark.parametrize("tokens", [1, 2, 8, 64])
def test_uniform_routing_finite_tokens_is_the_expected_max_of_binomials(tokens):
    """At a finite step the ranks of a uniform routing hold iid Binomial(E/P, 1 - (1 - k/E)^T) distinct
    experts; the load is E[max of P of them] / mean, written out here with math.comb."""
    E, P, k = 64, 8, 4
    e, _ = rank_load(_uniform(2, E, k), tokens, P)
    S = E // P
    pi = 1.0 - (1.0 - k / E) ** tokens
    cdf = [sum(math.comb(S, j) * pi ** j * (1 - pi) ** (S - j) for j in range(x + 1)) for x in range(S + 1)]
    emax = sum(1.0 - cdf[x] ** P for x in range(S))
    assert e[0] == pytest.approx(emax / (S * pi), rel=1e-12)
    assert e[0] > 1.0


def test_skewed_routing_raises_the_busiest_rank():
    L, E, k = 6, 128, 8
    loads = [rank_load(_skewed(L, E, k, s), 16, 8)[0].mean() for s in (0.0, 0.6, 1.2)]
    assert loads[0] < loads[1] < loads[2]


def test_redundant_experts_lower_the_token_imbalance():
    """EPLB replicas of the hottest experts, packed onto the least-loaded ranks, even out the token-expert
    pairs (what EPLB balances)."""
    q = _skewed(8, 256, 8, 1.2)
    base = rank_load(q, 256, 8)[1].mean()
    more = [rank_load(q, 256, 8, r)[1].mean() for r in (8, 32)]
    assert all(x < 0.5 * base for x in more)


def test_slot_shares_conserve_each_experts_traffic():
    q = _skewed(3, 64, 4, 1.0)
    for red in (0, 8, 24):
        sh = slot_shares(q, 8, red)
        assert sh.shape == (3, 8, (64 + red) // 8)
        np.testing.assert_allclose(sh.sum(axis=(1, 2)), q.sum(axis=1), rtol=1e-12)
    with pytest.raises(MoesimError) as e:
        slot_shares(q, 8, 3)
    assert e.value.field == "redundant_experts"


# ------------------------------------------------------------------------------ the step waits for the busiest rank
def _analytic(parallel, routing, batch=1, **kw):
    return moesim.simulate("deepseek-r1", moesim.machine(**H200), parallel=parallel, routing=routing, batch=batch,
                           mode="analytic", **kw)


def test_step_time_grows_with_the_max_rank_load():
    """Under ep8 the experts phase is the tp8 one with each MoE layer's weight reads scaled by its busiest
    rank's load (batch 8 is memory-bound): exactly sum_l D_l load_l / sum_l D_l, D_l the step's expected
    distinct experts; the ratio grows with the routing's skew."""
    from moesim.analysis.simulate import routing_table
    m = moesim.model("deepseek-r1")
    ratios = []
    for s in (0.0, 0.8, 1.6):
        prof = R.RoutingProfile(id=f"zipf{s}", zipf_s=s, jitter=0.0, concentration=0.0, stickiness=0.0,
                                first_stickiness=0.0, last_stickiness=0.0, request_tokens=0, recall=0.0)
        ep = _analytic("ep8", prof, batch=8).breakdown["by_phase"]["experts"]
        tp = _analytic("tp8", prof, batch=8).breakdown["by_phase"]["experts"]
        q = np.asarray(routing_table(m, prof)[0]["q"]).mean(axis=0)
        d = (1.0 - (1.0 - q) ** 8).sum(axis=1)
        load = rank_load(q, 8, 8)[0]
        assert ep / tp == pytest.approx((d * load).sum() / d.sum(), rel=1e-9)
        ratios.append(ep / tp)
    assert 1.0 < ratios[0] < ratios[1] < ratios[2]


def test_kernel_experts_time_scales_with_the_load():
    from tests.test_decode import cols, synthetic
    from moesim.engine import codes
    L, E, k = 3, 32, 4
    rt = LRT.lower(LRT.RoutingDims(L, E, k), R.profile("generic"), seed=1)
    dm, hw = synthetic(L, E, k, mode=codes.EXP_GPU)
    base = KD.run(dm, hw, rt, cols(1, steps=1, warmup=0, mode="analytic"))
    dm2 = dict(dm, ep_load_experts=np.full(L, 2.0), ep_load_pairs=np.full(L, 2.0))
    for engine in ("c", "reference"):
        slow = KD.run(dm2, hw, rt, cols(1, steps=1, warmup=0, mode="analytic"), engine=engine)
        assert slow["by_phase"][0][1] == pytest.approx(2.0 * base["by_phase"][0][1], rel=1e-12)


# ------------------------------------------------------------------------------ all-to-all
def test_alltoall_bytes_by_hand():
    """DeepSeek-R1 (hidden 7168, top-8) over 8 EP ranks: each rank dispatches its eighth of the step's
    tokens, 7/8 of the 8 copies leave the rank: fp8 (1 byte) + one fp32 scale per 128 (4/128) out, bf16
    (2 bytes) back."""
    rt = with_parallel(get_runtime("vllm"), "ep8", moesim.machine(**H200))
    got = alltoall_bytes(7168, 8, 8, rt.decode)
    assert got == pytest.approx(8 * 7168 * (1 + 4 / 128 + 2) * (7 / 8) / 8, rel=1e-15)
    assert alltoall_bytes(7168, 8, 1, rt.decode) == 0.0


@pytest.mark.parametrize("batch", [1, 32])
def test_alltoall_phase_by_hand(batch):
    """The all_to_all phase: 58 MoE layers x (dispatch 41.6 us + combine 41.6 us + the step's bytes over
    0.8 x NVLink4's 450 GB/s)."""
    r = _analytic("ep8", None, batch=batch)
    per_token_bytes = 8 * 7168 * (1 + 4 / 128 + 2) * (7 / 8) / 8
    step = 58 * (2 * 41.6e-6 + batch * per_token_bytes / (450e9 * 0.8))
    assert r.breakdown["by_phase"]["all_to_all"] == pytest.approx(step, rel=1e-9)
    assert _analytic("tp8", None, batch=batch).breakdown["by_phase"]["all_to_all"] == 0.0


def test_layout_allreduces():
    """tp8: two all-reduces per layer; tp8-ep8 (vLLM "TP8+EP"): every rank holds every token, the experts'
    partial outputs are summed by the same all-reduce and nothing is dispatched; ep8 (vLLM "DP8+EP") and
    tp8-ep8-attn-dp: attention data-parallel, no all-reduce, the all-to-all instead."""
    mach = moesim.machine(**H200)
    vllm = get_runtime("vllm")
    assert layout_degrees(with_parallel(vllm, "tp8", mach), 8) == (8, 8, 1, 8)
    assert layout_degrees(with_parallel(vllm, "tp8-ep8", mach), 8) == (8, 8, 8, 1)
    assert layout_degrees(with_parallel(vllm, "ep8", mach), 8) == (8, 1, 8, 1)
    assert layout_degrees(with_parallel(vllm, "tp8-ep2", mach), 8) == (8, 8, 2, 4)
    assert layout_degrees(with_parallel(vllm, "tp8-ep8-attn-dp", mach), 8) == (8, 1, 8, 1)
    r = {p: _analytic(p, None).breakdown["by_phase"] for p in ("tp8", "tp8-ep8", "ep8", "tp8-ep8-attn-dp")}
    assert r["tp8"]["transfer"] == pytest.approx(r["tp8-ep8"]["transfer"], rel=1e-12) and r["tp8"]["transfer"] > 0
    assert r["ep8"]["transfer"] == r["tp8-ep8-attn-dp"]["transfer"] == 0.0
    assert r["tp8-ep8"]["all_to_all"] == 0.0 < r["ep8"]["all_to_all"] == r["tp8-ep8-attn-dp"]["all_to_all"]


def test_attention_dp_reads_replicated_weights_and_tp_reads_duplicated_mla_kv():
    """Each attention-DP rank reads the whole attention weights (8 copies read over 8 GPUs' bandwidth); under
    TP the MLA latent KV is read by every rank."""
    from moesim.engine.lower.decode_model import lower_model
    from moesim.engine.lower.memory import lower
    from moesim.spec.placement import Placement
    m = moesim.model("deepseek-r1")
    mach = moesim.machine(**H200)
    low = lower(m, "fp8")
    dms = {p: lower_model(m, low, Placement("all-gpu"), mach, with_parallel(get_runtime("vllm"), p, mach), 4096,
                          "bf16", 8) for p in ("tp8", "ep8")}
    np.testing.assert_allclose(dms["ep8"]["attn_bytes"], 8 * dms["tp8"]["attn_bytes"], rtol=1e-15)
    np.testing.assert_allclose(dms["tp8"]["kv_bytes"], 8 * dms["ep8"]["kv_bytes"], rtol=1e-15)


# ------------------------------------------------------------------------------ memory per GPU
def test_tp_memory_per_gpu_is_split_plus_replicated():
    """qwen3-30b-a3b bf16 on 4x H200, tp4: attention, routed experts, LM head, KV (4 KV heads) and buffers
    split 4 ways; the router (a replicated linear) whole on every GPU."""
    r = moesim.fit("qwen3-30b-a3b", moesim.machine(gpu="h200", gpus=4), quants=["bf16"], parallel="tp4")[0]
    gpu = r["memory_by_tier"]["gpu"]["by_class"]
    split = sum(gpu.get(c, 0.0) for c in ("attention", "routed_experts", "lm_head", "kv_cache", "buffers",
                                           "shared_experts", "dense_ffn", "embeddings", "mtp", "state")) / 4
    replicated = gpu.get("router", 0.0)
    assert r["gpu_bytes_per_gpu"] == pytest.approx(split + replicated, rel=1e-12)


def test_attention_dp_replicates_attention_and_splits_kv():
    r = moesim.fit("deepseek-r1", moesim.machine(**H200), quants=["fp8"], parallel="tp8-ep8-attn-dp", batch=8)[0]
    gpu = r["memory_by_tier"]["gpu"]["by_class"]
    per = r["gpu_bytes_per_gpu_by_class"]
    assert per["attention"] == gpu["attention"]                       # whole on each rank
    assert per["kv_cache"] == pytest.approx(gpu["kv_cache"] / 8)     # each rank its own sequences
    assert per["routed_experts"] == pytest.approx(gpu["routed_experts"] / 8)
    tp = moesim.fit("deepseek-r1", moesim.machine(**H200), quants=["fp8"], parallel="tp8", batch=8)[0]
    # MLA's one latent KV head is duplicated on every TP rank
    assert tp["gpu_bytes_per_gpu_by_class"]["kv_cache"] == pytest.approx(gpu["kv_cache"])


def test_redundant_experts_cost_memory_per_gpu():
    base = moesim.fit("deepseek-r1", moesim.machine(**H200), quants=["fp8"], parallel="ep8")[0]
    red = moesim.fit("deepseek-r1", moesim.machine(**H200), quants=["fp8"], parallel="ep8", redundant_experts=32)[0]
    routed = base["memory_by_tier"]["gpu"]["by_class"]["routed_experts"]
    assert red["gpu_bytes_per_gpu_by_class"]["routed_experts"] == pytest.approx(routed * (256 + 32) / 256 / 8)
    assert red["gpu_bytes_per_gpu"] > base["gpu_bytes_per_gpu"]


LAYOUTS = ("tp{n}", "ep{n}", "tp{n}-ep{n}-attn-dp", "layer-split")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["deepseek-r1", "qwen3-30b-a3b", "mixtral-8x7b", "llama-3-8b"]), st.sampled_from(LAYOUTS),
       st.sampled_from([(1, 2), (2, 4), (4, 8), (1, 8), (2, 8)]),
       st.lists(st.floats(0.0, 1e11), min_size=len(CLASSES), max_size=len(CLASSES)))
def test_more_gpus_never_increase_weight_memory_per_gpu(mid, layout, ns, gpu_bytes):
    """Invariant: for the same layout kind and the same tensors, a layout over more GPUs never puts more
    weight bytes on one GPU."""
    m = moesim.model(mid)
    by_class = np.zeros((len(CLASSES), len(TIERS)))
    by_class[:, TIERS.index("gpu")] = gpu_bytes
    per = []
    for n in ns:
        spec = layout.format(n=n)
        if n == 1:
            spec = None
        elif "ep" in spec and not m.n_experts:
            return
        rt = with_parallel(get_runtime("vllm"), spec, moesim.machine(gpu="h200", gpus=n))
        d = gpu_bytes_per_gpu(m, rt, n, by_class)["by_class"]
        per.append(sum(d[c] for c in WEIGHT_CLASSES))
    assert per[1] <= per[0] * (1 + 1e-12)


def test_split_ways_of_a_single_gpu_are_one():
    ways = split_ways(moesim.model("deepseek-r1"), get_runtime("vllm"), 1)
    assert set(ways.values()) == {1.0}


# ------------------------------------------------------------------------------ errors and the CLI
def test_refusals_name_the_field():
    mach = moesim.machine(**H200)
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-r1", mach, redundant_experts=8, mode="analytic")
    assert e.value.field == "redundant_experts"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-r1", mach, parallel="tp8", redundant_experts=8, mode="analytic")
    assert e.value.field == "redundant_experts"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-r1", mach, parallel="ep8", redundant_experts=3, mode="analytic")
    assert e.value.field == "redundant_experts"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-r1", mach, parallel="ep8", redundant_experts=2**31, mode="analytic")
    assert e.value.field == "redundant_experts"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("llama-3-8b", mach, parallel="ep8", mode="analytic")
    assert e.value.field == "parallel"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-r1", mach, parallel="tp8-ep3", mode="analytic")
    assert e.value.field == "parallel"


def test_cli_simulate_ep8_shows_the_alltoall():
    out = subprocess.run([sys.executable, "-m", "moesim", "simulate", "deepseek-r1", "--gpu", "h200", "--gpus", "8",
                          "--parallel", "ep8", "--mode", "analytic"], capture_output=True, text=True, check=True).stdout
    assert "expert-parallel all-to-all (dispatch + combine)" in out
    out = subprocess.run([sys.executable, "-m", "moesim", "simulate", "deepseek-r1", "--gpu", "h200", "--gpus", "8",
                          "--parallel", "ep8", "--redundant-experts", "8", "--mode", "analytic", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert '"gpu_bytes_per_gpu"' in out and '"all_to_all"' in out


# ------------------------------------------------------------------------------ the fit is per GPU (issue 16)
def test_tp8_fit_holds_the_busiest_gpu_hand_computed():
    """deepseek-r1 fp8 on 8x H200, tp8, by hand: every weight class but the router splits 8 ways, the
    router and MLA's one latent KV head are whole on every GPU, the buffers are per GPU; the kernel's
    per-GPU bytes are that sum, and the fit holds it (not the pooled total) to one GPU's budget."""
    mach = moesim.machine(gpu="h200", gpus=8)
    r = moesim.fit("deepseek-r1", mach, quants=["fp8"], runtime="vllm", parallel="tp8", context=8192, batch=64)[0]
    gpu = r["memory_by_tier"]["gpu"]["by_class"]
    split = sum(gpu.get(c, 0.0) for c in ("attention", "shared_experts", "routed_experts", "dense_ffn", "embeddings",
                                           "lm_head", "mtp", "buffers")) / 8
    replicated = gpu.get("router", 0.0) + gpu.get("kv_cache", 0.0) + gpu.get("state", 0.0)
    assert r["gpu_bytes_per_gpu"] == pytest.approx(split + replicated, rel=1e-12)
    from moesim.analysis.resolve import configure_run
    c = configure_run(moesim.model("deepseek-r1"), "fp8", mach, "vllm", None, 8192, 64, parallel="tp8")
    assert c.mem.gpu_per_gpu == pytest.approx(split + replicated, rel=1e-12)
    cap = float(c.cfg["gpu_capacity"])
    assert (r["fits"] != "no") == (c.mem.gpu_per_gpu <= cap)
    # the pooled total would admit ~8x the batch: the replicated latent KV is what limits it
    kv_one = gpu["kv_cache"] / 64
    room = cap - (c.mem.gpu_per_gpu - gpu["kv_cache"] - gpu.get("state", 0.0))
    assert abs(r["max_batch"] - room / (kv_one + gpu.get("state", 0.0) / 64)) <= 2


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["deepseek-r1", "qwen3-30b-a3b", "mixtral-8x7b", "llama-3-8b", "gpt-oss-120b"]),
       st.sampled_from([1024, 8192, 65536]), st.sampled_from([1, 16, 256]))
def test_more_gpus_never_increase_per_gpu_bytes_nor_unfit(mid, context, batch):
    """Invariant through the memory kernel: tp2 -> tp4 -> tp8 on the same per-GPU machine never adds weight
    bytes to one GPU and never turns a configuration that fits into one that does not."""
    per, fits = [], []
    for n in (2, 4, 8):
        r = moesim.fit(mid, moesim.machine(gpu="h200", gpus=n), quants=["fp8"], runtime="vllm", parallel=f"tp{n}",
                       context=context, batch=batch, allow_beyond_max_context=True)[0]
        per.append(sum(r["gpu_bytes_per_gpu_by_class"][c] for c in WEIGHT_CLASSES))
        fits.append(r["fits"] != "no")
    assert per[1] <= per[0] * (1 + 1e-12) and per[2] <= per[1] * (1 + 1e-12)
    assert fits == sorted(fits), f"fits {fits} over tp2, tp4, tp8"


def test_sweep_equals_fit_on_a_multi_gpu_machine():
    """The sweep's memory loop (ms_sweep_memory) and fit (ms_memory) hold the same busiest GPU to its budget:
    the same fits, max_context and max_batch on 8x H200."""
    mids = ["deepseek-r1", "qwen3-30b-a3b", "llama-3-8b"]
    mach = dict(gpu="h200", gpus=8)
    tab = moesim.sweep(models=mids, quants=["fp8"], runtimes=["vllm"], machines=[mach], contexts=[8192, 131072],
                       batches=[1, 64, 4096], progress=False, filter={"allow_beyond_max_context": True})
    rows = tab.to_dicts()
    assert len(rows) == len(mids) * 6
    changed = 0
    for row in rows:
        r = moesim.fit(row["model"], moesim.machine(**mach), quants=["fp8"], runtime="vllm",
                       context=int(row["context"]), batch=int(row["batch"]), allow_beyond_max_context=True)[0]
        assert (row["fits"], int(row["max_context"]), int(row["max_batch"])) == \
            (r["fits"], r["max_context"], r["max_batch"]), row
        changed += r["fits"] == "no"
    assert changed, "no row at the per-GPU boundary: the comparison would not see a pooled fit"
