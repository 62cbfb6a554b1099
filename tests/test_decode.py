"""Decode simulation: the C kernel against the pure-Python reference (both paths), analytic vs
Monte Carlo, invariants, physics sanity and input validation."""
from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from moesim import MoesimError
from moesim.analysis import resolve as RES
from moesim.analysis import simulate as D
from moesim.engine import codes as CODES
from moesim.engine import decode as KD
from moesim.engine import _kernel
from moesim.engine.lower.machine import DECODE_PATHS_OFF
from moesim.engine.lower import attention as ATT
from moesim.engine.lower import decode_model as LDM
from moesim.engine.lower import machine as LHW
from moesim.engine import prefill as PF
from moesim.spec import hardware
from moesim.spec import quants as Q
from moesim.engine.lower import routing as LRT
from moesim.engine import routing as KRT
from moesim.spec import routing as R
from moesim.ingest import traces
from moesim.errors import KernelError
from moesim.analysis.simulate import simulate

RESULT_SCALARS = ("step_mean", "step_p50", "step_p99", "accepted", "hit_rate", "page_hit_rate", "distinct", "reuse",
                  "selections")
RESULT_ARRAYS = ("by_resource", "by_phase", "bytes")


def rel_close(a, b, tol=1e-9):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return np.all(np.abs(a - b) <= tol * np.maximum(1.0, np.maximum(np.abs(a), np.abs(b))))


# ------------------------------------------------------------------------------ random tables
@st.composite
def decode_case(draw, mode=None, policy=None):
    """A random lowered model + machine + routing + one configuration (small enough for Python)."""
    n = draw(st.integers(1, 5))
    E = draw(st.integers(2, 24))
    k = draw(st.integers(1, min(4, E)))
    moe = [draw(st.booleans()) for _ in range(n)]
    if not any(moe):
        moe[draw(st.integers(0, n - 1))] = True
    L = sum(moe)
    pos = st.floats(1e3, 1e9, allow_nan=False)
    modes = [draw(st.integers(1, 4)) if m else 0 for m in moe]
    moe_index, j = [], 0
    for m in moe:
        moe_index.append(j if m else -1)
        j += m
    dm = dict(
        attn_bytes=[draw(pos) for _ in range(n)], attn_flops=[draw(pos) for _ in range(n)],
        kv_bytes=[draw(pos) for _ in range(n)], score_flops=[draw(pos) for _ in range(n)],
        shared_bytes=[draw(st.sampled_from([0.0, 1e6, 3e7])) for _ in range(n)],
        shared_flops=[draw(st.sampled_from([0.0, 2e6])) for _ in range(n)],
        expert_bytes=[draw(pos) for _ in range(n)], expert_flops=[draw(pos) for _ in range(n)],
        attn_on_gpu=[draw(st.integers(0, 1)) for _ in range(n)], expert_mode=modes,
        slots=[draw(st.integers(0, E)) for _ in range(n)],
        page_slots=[draw(st.sampled_from([E, draw(st.integers(0, E))])) for _ in range(n)],
        moe_index=moe_index, head_bytes=draw(pos), head_flops=draw(pos), head_on_gpu=draw(st.integers(0, 1)),
        draft_bytes=draw(pos), draft_flops=draw(pos), act_bytes=draw(st.sampled_from([0.0, 6e4])),
        allreduce_bytes=draw(st.sampled_from([0.0, 2e4])),
        ep_load_experts=[draw(st.sampled_from([1.0, 2.5])) * draw(st.floats(1.0, 2.0)) for _ in range(n)],
        ep_load_pairs=[draw(st.floats(1.0, 3.0)) for _ in range(n)],
        a2a_bytes=draw(st.sampled_from([0.0, 3e4])),
        layer_ops=[draw(st.sampled_from([0.0, 0.0, 22.0])) for _ in range(n)],
        gemm_rows=[draw(st.sampled_from([0.0, 512.0, 5000.0])) for _ in range(n)])
    bw = st.floats(1e9, 5e12, allow_nan=False)
    lat = st.sampled_from([0.0, 3e-6, 2e-5])
    hw = dict(gpu_bw=draw(bw), host_bw=draw(bw), pcie_bw=draw(bw), storage_bw=draw(bw),
              gpu_flops=draw(st.floats(1e12, 1e15)), cpu_flops=draw(st.floats(1e10, 1e13)),
              interconnect_bw=draw(bw), unified=draw(st.integers(0, 1)), overlap=draw(st.integers(0, 1)),
              launch_s=draw(lat), sync_s=draw(lat), dma_s=draw(lat), allreduce_s=draw(lat), step_s=draw(lat),
              seq_s=draw(lat), a2a_bw=draw(bw), a2a_s=draw(st.sampled_from([0.0, 8.3e-5])),
              moe_s=draw(st.sampled_from([0.0, 4e-5])), cpu_layer_s=draw(st.sampled_from([0.0, 9e-5])),
              op_s=draw(st.sampled_from([0.0, 3e-6, 4.7e-6])), cpu_op_s=draw(st.sampled_from([0.0, 2.5e-6])))
    hw.update(graph_max_tokens=draw(st.sampled_from([0, 1, 4])), nograph_s=draw(st.sampled_from([0.0, 2.5e-5])),
              mmid_sync_s=draw(st.sampled_from([0.0, 1.6e-4])),
              cpu_attn_flops=draw(st.floats(1e9, 1e13)), **DECODE_PATHS_OFF)
    if draw(st.booleans()):             # token-count kernel paths (ggml-metal's shape, shares drawn)
        s = draw(st.floats(0.0, 1.0))
        hw.update(mm_min_tokens=draw(st.sampled_from([3, 9])), mm_tile_tokens=draw(st.sampled_from([4, 32])),
                  mv_ext_cols=draw(st.integers(1, 5)), mv_ext_min_tokens=2, mv_ext_k_min_tokens=4, mv_ext_share=s,
                  mv_ext_k_share=draw(st.floats(0.0, 1.0)) * (1.0 - s),
                  moe_rowwise_below=draw(st.sampled_from([0, 2, 32])), mm_tile_rows=draw(st.sampled_from([1, 64])),
                  mm_slots=draw(st.sampled_from([0.0, 190.0])))
    mode = draw(st.integers(0, 1)) if mode is None else mode
    grouped = draw(st.booleans()) and E % 4 == 0 and E >= 8
    prof = R.RoutingProfile(
        id="t", zipf_s=draw(st.floats(0.0, 1.2)), jitter=0.2,
        concentration=draw(st.sampled_from([0.0, 0.5, 2.0])), stickiness=draw(st.floats(0.0, 0.6)),
        first_stickiness=draw(st.floats(0.0, 0.6)), last_stickiness=draw(st.floats(0.0, 0.6)),
        request_tokens=draw(st.sampled_from([0, 3, 7])), recall=draw(st.floats(0.0, 1.0)))
    if draw(st.booleans()):   # token memory: the analytic path reads the window tables (routing_window)
        prof = replace(prof, layer_recency=(draw(st.floats(0.0, 0.9)),), layer_coupling=(draw(st.floats(0.0, 0.9)),),
                       recency_decay=draw(st.sampled_from([0.5, 0.9])), history=draw(st.integers(1, 8)),
                       n_partners=draw(st.integers(0, 2)))
    dims = LRT.RoutingDims(L, E, k, 4 if grouped else 0, draw(st.integers(max(1, -(-k // (E // 4))), 3)) if grouped else 0)
    seed = draw(st.integers(0, 2**32))
    rt = LRT.lower(dims, prof, seed, prefetch=draw(st.booleans()), scenarios=draw(st.integers(1, 3)))
    use_trace = mode == 0 and draw(st.booleans())
    if use_trace:
        tl = draw(st.integers(1, L))
        ntok = draw(st.integers(2, 12))
        rng = np.random.default_rng(seed)
        rt["trace"] = np.stack([np.stack([rng.choice(E, size=k, replace=False) for _ in range(tl)])
                                for _ in range(ntok)]).astype(np.int32)
    policy = draw(st.integers(0, 2 if mode == 1 else 3)) if policy is None else policy
    steps = draw(st.integers(2, 10))
    tps = draw(st.integers(1, 2))
    cols = dict(batch=[draw(st.integers(1, 4))], tokens_per_step=[tps], drafts=[tps - 1],
                accepted=[draw(st.floats(1.0, 2.0))], steps=[steps], warmup=[draw(st.integers(0, steps - 1))],
                policy=[policy], mode=[mode], seed=[seed], index=[draw(st.integers(0, 1000))])
    return dm, hw, rt, cols


# MOESIM_DIFF_EXAMPLES=1500 for a soak run (10,500 cases pass in ~40 s)
DIFF_EXAMPLES = int(os.environ.get("MOESIM_DIFF_EXAMPLES", "60"))
PATHS = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]   # (mode, policy): Monte Carlo x 4, analytic x 3


@pytest.mark.parametrize("mode,policy", PATHS)
def test_kernel_matches_reference(mode, policy):
    """C and pure Python agree to 1e-9 on random configurations: 7 x 60 = 420 hypothesis cases
    (by default) covering both paths and every cache policy."""

    @settings(max_examples=DIFF_EXAMPLES, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(decode_case(mode, policy))
    def check(case):
        dm, hw, rt, cols = case
        assert cols["mode"][0] == mode and cols["policy"][0] == policy
        c = KD.run(dm, hw, rt, cols)
        p = KD.run(dm, hw, rt, cols, engine="reference")
        for key in RESULT_SCALARS + RESULT_ARRAYS:
            assert rel_close(c[key], p[key]), (key, c[key], p[key])

    check()


# ------------------------------------------------------------------------------ helpers
def synthetic(L, E, k, mode=CODES.EXP_FETCH, slots=0, page=None, **hw_over):
    dm = dict(attn_bytes=np.full(L, 1e6), attn_flops=np.full(L, 1e6), kv_bytes=np.full(L, 1e5),
              score_flops=np.full(L, 1e4), shared_bytes=np.zeros(L), shared_flops=np.zeros(L),
              expert_bytes=np.full(L, 5e6), expert_flops=np.full(L, 1e7), attn_on_gpu=np.ones(L, np.int32),
              expert_mode=np.full(L, mode, np.int32), slots=np.full(L, slots, np.int32),
              page_slots=np.full(L, E if page is None else page, np.int32), moe_index=np.arange(L, dtype=np.int32),
              head_bytes=1e6, head_flops=1e6, head_on_gpu=1, draft_bytes=0.0, draft_flops=0.0, act_bytes=1e4,
              allreduce_bytes=0.0, ep_load_experts=np.ones(L), ep_load_pairs=np.ones(L), a2a_bytes=0.0,
              layer_ops=np.zeros(L), gemm_rows=np.zeros(L))
    hw = dict(gpu_bw=1e12, host_bw=5e10, pcie_bw=2.5e10, storage_bw=5e9, gpu_flops=1e14, cpu_flops=1e12,
              interconnect_bw=1e11, unified=0, overlap=1, launch_s=3e-6, sync_s=2e-5, dma_s=6e-6, allreduce_s=0.0,
              step_s=3e-4, seq_s=0.0, a2a_bw=1e11, a2a_s=0.0, moe_s=0.0, cpu_layer_s=0.0, op_s=0.0,
              cpu_op_s=0.0, graph_max_tokens=0, nograph_s=0.0, mmid_sync_s=0.0, cpu_attn_flops=1e12, **DECODE_PATHS_OFF)
    hw.update(hw_over)
    return dm, hw


def cols(batch=1, steps=200, warmup=20, policy="lru", mode="montecarlo", seed=1, tps=1, n=1):
    return dict(batch=[batch] * n, tokens_per_step=[tps] * n, drafts=[tps - 1] * n, accepted=[1.0] * n,
                steps=[steps] * n, warmup=[warmup] * n, policy=[CODES.POLICIES[policy]] * n, mode=[CODES.MODES[mode]] * n,
                seed=[seed] * n, index=list(range(n)))


def independent(s):
    return R.profile("generic", zipf_s=s, concentration=0.0, stickiness=0.0, first_stickiness=0.0,
                     last_stickiness=0.0)


# ------------------------------------------------------------------------------ analytic vs Monte Carlo
@pytest.mark.parametrize("E,k,s", [(64, 6, 0.2), (64, 8, 0.4), (32, 4, 0.6), (128, 8, 0.6)])
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_analytic_agrees_with_montecarlo_under_independent_routing(E, k, s, batch):
    rt = LRT.lower(LRT.RoutingDims(4, E, k), independent(s), seed=1)
    for C in (2 * k, 3 * k):
        dm, hw = synthetic(4, E, k, slots=C)
        mc = KD.run(dm, hw, rt, cols(batch, steps=3000, warmup=100))
        an = KD.run(dm, hw, rt, cols(batch, mode="analytic"))
        assert abs(mc["hit_rate"][0] - an["hit_rate"][0]) <= 0.02, (C, mc["hit_rate"], an["hit_rate"])
        assert abs(an["distinct"][0] / mc["distinct"][0] - 1) <= 0.02
    # static pinning and CPU-served layers too
    dm, hw = synthetic(4, E, k, mode=CODES.EXP_SPLIT, slots=2 * k)
    mc = KD.run(dm, hw, rt, cols(batch, steps=3000, warmup=100))
    an = KD.run(dm, hw, rt, cols(batch, mode="analytic"))
    assert abs(mc["hit_rate"][0] - an["hit_rate"][0]) <= 0.02
    assert abs(an["step_mean"][0] / mc["step_mean"][0] - 1) <= 0.03


def test_analytic_distinct_matches_formula_for_uniform_routing():
    """Uniform popularity: expected distinct experts = E (1 - (1 - k/E)^B) (routing.md §4.1)."""
    E, k = 64, 6
    rt = LRT.lower(LRT.RoutingDims(2, E, k), R.profile("generic", zipf_s=0.0, jitter=0.0, concentration=0.0), seed=0)
    dm, hw = synthetic(2, E, k, mode=CODES.EXP_GPU)
    for B in (1, 4, 8, 16, 64):
        an = KD.run(dm, hw, rt, cols(B, mode="analytic"))
        assert an["distinct"][0] == pytest.approx(E * (1 - (1 - k / E) ** B), rel=1e-9)


# ------------------------------------------------------------------------------ invariants
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gpu_bw", "host_bw", "pcie_bw", "storage_bw", "gpu_flops", "cpu_flops", "interconnect_bw",
                        "a2a_bw"]),
       st.floats(1.01, 20.0), st.integers(0, 3), st.integers(1, 8), st.sampled_from(["montecarlo", "analytic"]),
       st.integers(0, 10**6))
def test_more_bandwidth_never_slower(resource, factor, mode_i, batch, mode, seed):
    E, k = 32, 4
    rt = LRT.lower(LRT.RoutingDims(3, E, k), R.profile("generic"), seed=seed, prefetch=True)
    modes = [CODES.EXP_GPU, CODES.EXP_CPU, CODES.EXP_SPLIT, CODES.EXP_FETCH]
    dm, hw = synthetic(3, E, k, mode=modes[mode_i], slots=8, page=20)
    dm["allreduce_bytes"] = 1e4
    dm["a2a_bytes"] = 1e4
    base = KD.run(dm, hw, rt, cols(batch, steps=40, warmup=5, mode=mode, seed=seed))
    hw2 = dict(hw)
    hw2[resource] *= factor
    faster = KD.run(dm, hw2, rt, cols(batch, steps=40, warmup=5, mode=mode, seed=seed))
    assert faster["step_mean"][0] <= base["step_mean"][0] * (1 + 1e-12)
    assert faster["step_p99"][0] <= base["step_p99"][0] * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.sampled_from(["generic", "gpt-oss", "deepseek-v2"]), st.integers(0, 10**6))
def test_larger_cache_never_lowers_hit_rate_and_belady_bounds_lru(batch, prof, seed):
    E, k = 32, 4
    rt = LRT.lower(LRT.RoutingDims(2, E, k), R.profile(prof), seed=seed)
    prev = {"lru": -1.0, "belady": -1.0}
    for C in range(0, E + 1, 4):
        dm, hw = synthetic(2, E, k, slots=C)
        rates = {}
        for pol in ("lru", "belady", "lfu", "static"):
            r = KD.run(dm, hw, rt, cols(batch, steps=60, warmup=0, policy=pol, seed=seed))
            rates[pol] = r["hit_rate"][0]
            assert 0.0 <= rates[pol] <= 1.0
        assert rates["belady"] >= rates["lru"] - 1e-12
        assert rates["belady"] >= rates["lfu"] - 1e-12
        for pol in prev:
            assert rates[pol] >= prev[pol] - 1e-12, (pol, C)
            prev[pol] = rates[pol]


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 12), st.sampled_from(["generic", "deepseek", "llama4"]), st.integers(0, 10**6),
       st.integers(1, 2))
def test_batch_never_reads_fewer_experts(batch, prof, seed, tps):
    E, k = 64, 4
    rt = LRT.lower(LRT.RoutingDims(3, E, k), R.profile(prof), seed=seed)
    dm, hw = synthetic(3, E, k, mode=CODES.EXP_GPU)
    smaller = KD.run(dm, hw, rt, cols(batch - 1, steps=30, warmup=0, seed=seed, tps=tps))
    larger = KD.run(dm, hw, rt, cols(batch, steps=30, warmup=0, seed=seed, tps=tps))
    assert larger["distinct"][0] >= smaller["distinct"][0]


def test_group_limited_routing_stays_in_groups():
    """DeepSeek-V3 style: every token's experts lie in at most topk_group of n_group groups."""
    dims = LRT.RoutingDims(2, 64, 8, n_group=8, topk_group=4)
    reqs = KRT.sample_requests(dims, R.profile("deepseek"), 3, 50, seed=5)
    for r in reqs:
        groups = r // 8
        for tok in groups.reshape(-1, 8):
            assert len(set(tok.tolist())) <= 4
        assert all(len(set(t.tolist())) == 8 for t in r.reshape(-1, 8))


@pytest.mark.skipif(not _kernel.openmp_enabled(), reason="built without OpenMP: every thread count runs serially, so the comparison would pass vacuously")
def test_same_seed_same_result_on_any_thread_count():
    E, k = 64, 6
    rt = LRT.lower(LRT.RoutingDims(4, E, k), R.profile("deepseek-v2"), seed=3, prefetch=True)
    dm, hw = synthetic(4, E, k, slots=12, page=40)
    c = cols(batch=3, steps=80, warmup=10, seed=11, n=6)
    one = KD.run(dm, hw, rt, c, n_threads=1)
    two = KD.run(dm, hw, rt, c, n_threads=2)
    four = KD.run(dm, hw, rt, c, n_threads=4)
    for key in RESULT_SCALARS + RESULT_ARRAYS:
        assert np.array_equal(one[key], two[key]) and np.array_equal(one[key], four[key])
    # each configuration index owns its stream: rows differ, reruns repeat
    assert len(set(one["step_mean"].tolist())) > 1
    assert np.array_equal(KD.run(dm, hw, rt, c)["step_mean"], one["step_mean"])


def test_trace_replay_through_kernel_matches_cache_replay():
    """Trace replay in the decode kernel (batch 1) gives the same LRU hit rate as the cache kernel."""
    rng = np.random.default_rng(0)
    E, k, L, T = 16, 2, 3, 300
    tokens = np.stack([np.stack([rng.choice(E, size=k, replace=False, p=None) for _ in range(L)])
                       for _ in range(T)]).astype(np.int32)
    tr = traces.Trace(requests=[tokens], layers=list(range(L)), top_k=k, n_experts=E, source="test")
    rt = LRT.lower_trace(LRT.RoutingDims(L, E, k), tr)
    for C in (2, 4, 8):
        dm, hw = synthetic(L, E, k, slots=C)
        sim = KD.run(dm, hw, rt, cols(1, steps=T, warmup=0))
        direct = KRT.cache_hit_rates([tokens], E, C)
        assert sim["hit_rate"][0] == pytest.approx(direct.mean(), abs=1e-12)


@pytest.mark.parametrize("engine", ["c", "reference"])
def test_attention_over_the_cache_adds_to_the_weight_gemvs(engine):
    """A layer's attention runs its weight GEMVs, then the attention over the KV cache: each kernel group is
    the larger of its memory and compute terms and the layer pays both. A compute-bound attention kernel
    (long context, many query heads over one latent head, as MLA) does not hide behind memory-bound GEMVs:
    mlx-lm PR #839 (DeepSeek-V3 on an M3 Ultra) loses 19 % of its decode speed from 4k to 16k of context,
    which a single max over the layer's memory and compute would put at 6 %."""
    L, E, k = 4, 8, 2
    rt = LRT.lower(LRT.RoutingDims(L, E, k), independent(0.0), seed=1)
    c = cols(mode="analytic", steps=64, warmup=0)

    def step(score_flops, kv_bytes):
        dm, hw = synthetic(L, E, k, mode=CODES.EXP_GPU, launch_s=0.0, step_s=0.0)
        dm["score_flops"] = np.full(L, score_flops)
        dm["kv_bytes"] = np.full(L, kv_bytes)
        r = KD.run(dm, hw, rt, c, engine=engine)
        return float(r["step_mean"][0]), hw

    base, hw = step(0.0, 0.0)
    # the GEMVs are memory-bound (1e6 bytes at 1e12 B/s = 1 us; 1e6 FLOPs at 1e14 = 10 ns): scores of 1e10
    # FLOPs (100 us per layer) add in full, though they are below nothing the GEMVs' memory term covers
    slow, _ = step(1e10, 0.0)
    assert slow - base == pytest.approx(L * 1e10 / hw["gpu_flops"], rel=1e-9)
    # memory-bound on both sides, the KV bytes add as they always did
    kv, _ = step(0.0, 1e6)
    assert kv - base == pytest.approx(L * 1e6 / hw["gpu_bw"], rel=1e-9)
    # within the attention over the cache, KV bytes and score FLOPs overlap: the larger counts
    both, _ = step(1e10, 1e6)
    assert both == pytest.approx(slow, rel=1e-12)


# ------------------------------------------------------------------------------ end to end
DESKTOP = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=192)


@pytest.mark.parametrize("mid,quant", [("llama-3-8b", "Q4_K_M"), ("llama-3-8b", "Q8_0"), ("llama-2-7b", "F16")])
def test_dense_model_on_one_gpu_obeys_bandwidth_roofline(mid, quant):
    mach = hardware.machine(gpu="rtx-4090")
    r = simulate(mid, mach, quant=quant, context=2048, placement="all-gpu", tokens=32)
    weights = r.memory["weights_bytes"]
    assert r.decode_tok_s <= mach.gpu_bw_gbs * 1e9 / weights
    assert r.decode_tok_s > 0.3 * mach.gpu_bw_gbs * 1e9 / weights   # and not absurdly slow
    assert r.bottleneck == "gpu_memory"


def test_simulate_reports_every_contract_field():
    r = simulate("qwen3-30b-a3b", hardware.machine(**DESKTOP), quant="Q4_K_M", placement="experts-cpu", tokens=64)
    d = r.to_dict()
    for key in ("decode_tok_s", "aggregate_tok_s", "prefill_tok_s", "ttft_s", "tpot_ms", "breakdown", "bottleneck",
                "expert_hit_rate", "distinct_experts_per_step", "bytes_per_token", "model", "quant", "fits",
                "max_context", "memory_by_tier", "weights_bytes"):
        assert key in d
    assert set(d["tpot_ms"]) == {"mean", "p50", "p99"}
    assert d["tpot_ms"]["p99"] >= d["tpot_ms"]["p50"] > 0
    # CPU experts on dual-channel DDR5: their reads and per-layer hand-offs dominate the step
    res = d["breakdown"]["by_resource"]
    assert d["bottleneck"] in ("host_memory", "latency")
    assert res["host_memory"] + res["latency"] > 0.6 * d["breakdown"]["seconds_per_token"]
    per_phase = sum(d["breakdown"]["by_phase"].values())
    assert per_phase == pytest.approx(d["breakdown"]["seconds_per_token"], rel=1e-9)
    assert sum(d["breakdown"]["by_resource"].values()) == pytest.approx(per_phase, rel=1e-9)
    assert d["decode_tok_s"] == pytest.approx(1e3 / d["tpot_ms"]["mean"], rel=1e-9)
    assert 6 <= d["distinct_experts_per_step"] <= 8 + 1e-9


def test_offloading_more_experts_is_slower_and_hybrid_is_between():
    mach = hardware.machine(**DESKTOP)
    common = dict(quant="Q4_K_M", context=4096, mode="analytic")
    gpu = simulate("qwen3-30b-a3b", mach, placement="all-gpu", **common).decode_tok_s
    part = simulate("qwen3-30b-a3b", mach, placement="n-cpu-moe=24", **common).decode_tok_s
    cpu = simulate("qwen3-30b-a3b", mach, placement="experts-cpu", **common).decode_tok_s
    assert gpu > part > cpu


def test_expert_cache_prefetch_and_policies_end_to_end():
    mach = hardware.machine(**DESKTOP)
    kw = dict(quant="Q4_K_M", placement="offload-cache=32", tokens=128)
    lru = simulate("qwen3-30b-a3b", mach, policy="lru", **kw)
    bel = simulate("qwen3-30b-a3b", mach, policy="belady", **kw)
    pre = simulate("qwen3-30b-a3b", mach, policy="lru", prefetch_recall=0.9, **kw)
    assert 0 < lru.expert_hit_rate <= bel.expert_hit_rate <= 1
    assert bel.decode_tok_s >= lru.decode_tok_s
    assert pre.decode_tok_s >= lru.decode_tok_s
    assert pre.expert_hit_rate == lru.expert_hit_rate    # prefetch hides latency, saves no bytes


def test_speculative_decoding_raises_tokens_per_step():
    mach = hardware.machine(gpu="h200", gpus=8)
    base = simulate("deepseek-v3", mach, quant="fp8", runtime="vllm", tokens=32, mode="analytic")
    spec = simulate("deepseek-v3", mach, quant="fp8", runtime="vllm", tokens=32, mode="analytic", mtp=1,
                    mtp_acceptance=0.85)
    assert spec.decode_tok_s > base.decode_tok_s
    assert spec.tpot_ms["mean"] < base.tpot_ms["mean"]


def test_storage_spill_pages_experts_from_nvme():
    mach = hardware.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    r = simulate("qwen3-235b-a22b", mach, quant="Q4_K_M", placement="experts-cpu", tokens=48)
    assert "storage" in r.memory["fits"]
    assert r.page_cache_hit_rate is not None and r.page_cache_hit_rate < 1
    assert r.bytes_per_token["storage"] > 0
    assert r.bottleneck == "storage"


def test_unified_memory_machine():
    r = simulate("qwen3-30b-a3b", hardware.machine(gpu="m3-ultra"), quant="mlx-4bit", tokens=32)
    assert r.memory["placement"] == "unified"
    assert r.decode_tok_s > 0


def test_trace_replay_end_to_end(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "t.jsonl"
    with open(path, "w") as fh:
        for tok in range(40):
            for layer in range(24):
                ids = rng.choice(32, size=4, replace=False).tolist()
                fh.write(f'{{"problem_id": 0, "layer": {layer}, "token_idx": {tok}, "experts": {ids}, '
                         f'"gating_probs": [0.4, 0.3, 0.2, 0.1]}}\n')
    r = simulate("gpt-oss-20b", hardware.machine(**DESKTOP), quant="MXFP4_MOE", placement="offload-cache=8",
                 trace=str(path), tokens=40)
    assert r.routing.startswith("trace")
    assert 0 <= r.expert_hit_rate <= 1


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs,field", [
    (dict(context=-1), "context"),
    (dict(batch=0), "batch"),
    (dict(tokens=0), "tokens"),
    (dict(policy="fifo"), "policy"),
    (dict(mode="exact"), "mode"),
    (dict(mode="analytic", policy="belady"), "policy"),
    (dict(prefetch_recall=1.5), "prefetch_recall"),
    (dict(mtp_acceptance=-0.1), "mtp_acceptance"),
    (dict(mtp=2), "mtp"),
    (dict(tokens=10, warmup=10), "warmup"),
    (dict(cache_experts=-3), "cache_experts"),
    (dict(routing="nope"), "routing"),
    (dict(placement="all-gpu", cache_experts=4), "cache_experts"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(MoesimError) as exc:
        simulate("qwen3-30b-a3b", hardware.machine(**DESKTOP), quant="Q4_K_M", **kwargs)
    assert exc.value.field == field


def test_bad_routing_profile_values_rejected():
    with pytest.raises(MoesimError) as exc:
        R.profile("generic", stickiness=1.5)
    assert exc.value.field == "stickiness"
    with pytest.raises(MoesimError) as exc:
        R.profile("generic", zipf_s=float("nan"))
    assert exc.value.field == "zipf_s"


def test_bad_trace_rejected_before_the_kernel(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [1, 99], "gating_probs": [1, 0]}\n')
    with pytest.raises(MoesimError) as exc:
        simulate("mixtral-8x7b", hardware.machine(**DESKTOP), quant="Q4_K_M", trace=str(bad))
    assert exc.value.field == "trace"
    wrong_k = traces.Trace(requests=[np.zeros((3, 2, 3), np.int32)], layers=[0, 1], top_k=3, n_experts=8, source="t")
    with pytest.raises(MoesimError) as exc:
        simulate("mixtral-8x7b", hardware.machine(**DESKTOP), quant="Q4_K_M", trace=wrong_k)
    assert exc.value.field == "trace"
    with pytest.raises(MoesimError) as exc:
        simulate("llama-3-8b", hardware.machine(**DESKTOP), quant="Q4_K_M", trace=wrong_k)
    assert exc.value.field == "trace"


def test_kernel_rejects_inconsistent_tables_without_crashing():
    """Raw tables bypass validation: the kernel returns an error code (KernelError), never crashes."""
    dm, hw = synthetic(2, 8, 2, slots=4)
    rt = LRT.lower(LRT.RoutingDims(2, 8, 2), R.profile("generic"), seed=0)
    bad_hw = dict(hw, gpu_bw=0.0)
    with pytest.raises(KernelError, match="bandwidth"):
        KD.run(dm, bad_hw, rt, cols())
    bad_rt = dict(rt, top_k=9)
    with pytest.raises(KernelError, match="routing"):
        KD.run(dm, hw, bad_rt, cols())
    bad_dm = dict(dm, moe_index=np.array([0, 5], np.int32))
    with pytest.raises(KernelError):
        KD.run(bad_dm, hw, rt, cols())
    bad_trace = dict(rt, trace=np.full((4, 2, 2), 8, np.int32))
    with pytest.raises(KernelError, match="trace"):
        KD.run(dm, hw, bad_trace, cols())


def test_op_offload_thresholds_follow_the_runtimes():
    """llama.cpp copies CPU experts to the GPU from 32 tokens per step; ik_llama.cpp scales that by
    experts / active: >= 1024 tokens for DeepSeek-V3, >= 512 for Qwen3-235B (RT §1.1, PR #520)."""
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    assert LDM.op_offload_threshold(runtime("llama.cpp"), model("deepseek-v3")) == 32
    assert LDM.op_offload_threshold(runtime("ik_llama.cpp"), model("deepseek-v3")) == 1024
    assert LDM.op_offload_threshold(runtime("ik_llama.cpp"), model("qwen3-235b-a22b")) == 512
    assert math.isinf(LDM.op_offload_threshold(runtime("vllm"), model("deepseek-v3")))


def test_attention_data_parallel_spreads_per_sequence_host_work():
    """tpN-epN-attn-dp runs one scheduler per rank: the per-sequence host overhead of a step is paid
    per rank (batch / N sequences each), so a large batch steps faster than under plain TP."""
    from moesim.spec.runtimes import runtime
    mach = hardware.machine(gpu="h200", gpus=8)
    dp = RES.with_parallel(runtime("trtllm"), "tp8-ep8-attn-dp", mach)
    tp = RES.with_parallel(runtime("trtllm"), "tp8", mach)
    assert dp.decode.data_parallel == 8 and tp.decode.data_parallel == 1
    p = D.Placement("all-gpu")
    assert LHW.lower_machine(mach, dp, p, Q.KernelMix())["seq_s"] == pytest.approx(
        LHW.lower_machine(mach, tp, p, Q.KernelMix())["seq_s"] / 8)
    fast = simulate("deepseek-r1", mach, quant="fp8", runtime="trtllm", parallel="tp8-ep8-attn-dp", batch=512,
                    context=2048, mode="analytic")
    slow = simulate("deepseek-r1", mach, quant="fp8", runtime="trtllm", parallel="tp8", batch=512, context=2048,
                    mode="analytic")
    assert fast.decode_tok_s > slow.decode_tok_s


def _kt_prefill(quant, cpu, prompt=1024, gpus=1, amx=True):
    import dataclasses
    from moesim.analysis.resolve import resolve
    from moesim.engine.lower.memory import configure
    from moesim.engine.memory import evaluate, _result_from_arrays
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("deepseek-v3")
    mach = hardware.machine(gpu="rtx-4090", gpus=gpus, host="ddr5-4800x8", cpu=cpu, sockets=2, host_mem_gb=1024)
    kt = runtime("ktransformers")
    kt = dataclasses.replace(kt, decode=dataclasses.replace(kt.decode, amx_prefill=amx))
    q, rt, kv, low, p = resolve(m, quant, mach, kt, "experts-cpu", prompt, 1, None, 0,
                                "tp%d" % gpus if gpus > 1 else None)
    mem = _result_from_arrays(evaluate(low, configure(m, low, mach, rt, p, prompt, 1, kv, 0)), 0)
    dm = LDM.lower_model(m, low, p, mach, rt, prompt, kv, 1, mem.by_class, mem.tier)
    rtab = LRT.lower(LRT.RoutingDims.of(m), R.profile(None, family=m.family), 0)
    hw = LHW.lower_machine(mach, rt, p, Q.kernel_mix(m, q))
    return PF.prefill(m, dm, hw, rtab, rt, prompt, 1)[0], dm, hw


def test_ktransformers_prefills_on_amx_tiles_for_int8_experts():
    """KT computes CPU experts on AMX once a ubatch gives each expert > 4 tokens (RT §5.1): int8
    experts on an AMX Xeon prefill faster than on the AVX-512 path; FP8 experts (no AMX format) and
    CPUs without AMX (Zen 4) keep the AVX-512 rate; a few-token ubatch stays on AVX-512."""
    amx, dm, hw = _kt_prefill("int8", "xeon-gold-6454s")
    avx, _, hw_off = _kt_prefill("int8", "xeon-gold-6454s", amx=False)
    assert dm["amx_flops_per_cycle"] == 4096.0 and hw["amx_flops"] > 0 and hw_off["amx_flops"] == 0.0
    assert amx > 1.2 * avx
    fp8_on, dm_fp8, _ = _kt_prefill("fp8", "xeon-gold-6454s")
    fp8_off, _, _ = _kt_prefill("fp8", "xeon-gold-6454s", amx=False)
    assert dm_fp8["amx_flops_per_cycle"] == 0.0 and fp8_on == pytest.approx(fp8_off, rel=1e-12)
    _, _, hw_zen = _kt_prefill("int8", "epyc-9654")
    assert hw_zen["amx_flops"] == 0.0
    few_on, _, _ = _kt_prefill("int8", "xeon-gold-6454s", prompt=16)       # 16 x 8 / 256 = 0.5 token per expert
    few_off, _, _ = _kt_prefill("int8", "xeon-gold-6454s", prompt=16, amx=False)
    assert few_on == pytest.approx(few_off, rel=1e-12)


def test_layerwise_prefill_streams_over_every_gpus_link():
    """From the threshold on (num_tokens >= threshold) KT streams each layer's experts to the GPUs;
    under TP each GPU pulls its slice over its own PCIe link, so two GPUs prefill a long prompt faster
    than one. Just below the threshold the experts are computed on the CPU instead."""
    one, dm1, hw1 = _kt_prefill("fp8", "xeon-platinum-8488c", prompt=16384, gpus=1)
    two, dm2, hw2 = _kt_prefill("fp8", "xeon-platinum-8488c", prompt=16384, gpus=2)
    assert dm1["layerwise_prefill"] > 0 and hw2["pcie_links"] == 2 and hw1["pcie_links"] == 1
    assert two > one
    at = dm1["layerwise_prefill"]
    streamed = [_kt_prefill("fp8", "xeon-platinum-8488c", prompt=at, gpus=g)[0] for g in (1, 2)]
    on_cpu = [_kt_prefill("fp8", "xeon-platinum-8488c", prompt=at - 1, gpus=g)[0] for g in (1, 2)]
    assert streamed[1] > 1.2 * streamed[0]                 # the links add up only when streaming
    assert on_cpu[1] < 1.2 * on_cpu[0]


def test_prefill_on_top_of_a_cached_context_is_slower():
    """A prompt appended to `depth` cached tokens attends over depth + prompt / 2 keys on average
    (llama-bench -d): deeper is slower, windowed layers stop growing at their window, and
    simulate's prompt (from an empty cache) does not depend on the decode context."""
    from moesim.ingest import model
    m = model("gpt-oss-120b")
    shallow, deep = ATT.prefill_score_flops(m, 2048, 0), ATT.prefill_score_flops(m, 2048, 32768)
    windowed = np.array([bool(layer.attention.window) for layer in m.layers])
    assert windowed.any() and (~windowed).any()
    assert np.all(deep[~windowed] > 10 * shallow[~windowed]) and np.allclose(deep[windowed], shallow[windowed])
    mach = hardware.machine(gpu="dgx-spark")
    q, rt, kv, low, p, dm, hw, rtab = _lowered("gpt-oss-120b", "MXFP4", mach, None, "unified", 2048)
    at0 = PF.prefill(m, dm, hw, rtab, rt, 2048, 1)[0]
    at32k = PF.prefill(m, dm, hw, rtab, rt, 2048, 1, depth=32768)[0]
    assert at32k < at0
    a = simulate("gpt-oss-120b", mach, quant="MXFP4", context=4096, prompt=2048, mode="analytic")
    b = simulate("gpt-oss-120b", mach, quant="MXFP4", context=65536, prompt=2048, mode="analytic")
    assert a.prefill_tok_s == pytest.approx(b.prefill_tok_s, rel=1e-12)


def _lowered(mid, quant, mach, runtime, placement, context):
    from moesim.analysis.resolve import resolve
    from moesim.engine.lower.memory import configure
    from moesim.engine.memory import evaluate, _result_from_arrays
    from moesim.ingest import model
    m = model(mid)
    q, rt, kv, low, p = resolve(m, quant, mach, runtime, placement, context, 1, None, 0, None)
    mem = _result_from_arrays(evaluate(low, configure(m, low, mach, rt, p, context, 1, kv, 0)), 0)
    dm = LDM.lower_model(m, low, p, mach, rt, context, kv, 1, mem.by_class, mem.tier)
    hw = LHW.lower_machine(mach, rt, p, Q.kernel_mix(m, q))
    return q, rt, kv, low, p, dm, hw, LRT.lower(LRT.RoutingDims.of(m), R.profile(None, family=m.family), 0)


def test_moe_prefill_on_gpu_gains_from_a_larger_ubatch():
    """Each ubatch streams every used expert's weights once and an expert's GEMM serves only
    ubatch x top-k / experts tokens, so a larger -ub amortises the streaming: faster prefill."""
    import dataclasses
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    mach = hardware.machine(gpu="dgx-spark")
    m = model("gpt-oss-120b")
    rates = []
    for ub in (256, 512, 2048):
        rt = dataclasses.replace(runtime("llama.cpp"), ubatch=ub)
        q, rt, kv, low, p, dm, hw, rtab = _lowered("gpt-oss-120b", "MXFP4", mach, rt, "unified", 4096)
        rates.append(PF.prefill(m, dm, hw, rtab, rt, 4096, 1)[0])
    assert rates[0] < rates[1] < rates[2]


def test_cpu_matmul_rate_follows_runtime_kernels_and_quant_family():
    """Mainline llama.cpp multiplies codebook-grid i-quants on the CPU at cpu_iquant_rel of its rate
    (ik_llama.cpp PR #518); ik_llama.cpp's kernels run cpu_kernel_speedup faster (PR #533)."""
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("deepseek-r1")
    assert Q.kernel_mix(m, "UD-IQ1_S").cpu_grid > 0.9
    assert Q.kernel_mix(m, "Q4_K_M").cpu_grid == 0.0 and Q.kernel_mix(m, "fp8").cpu_grid == 0.0
    mach = hardware.machine(gpu="rtx-4090", host="ddr5-6000x2", cpu="ryzen-9-7950x")
    p = D.Placement("experts-cpu")
    main, ik = runtime("llama.cpp"), runtime("ik_llama.cpp")
    grid = [Q.KernelMix(cpu_grid=s) for s in (0.0, 1.0, 0.5)]
    k_main, i_main = (LHW.lower_machine(mach, main, p, x)["cpu_flops"] for x in grid[:2])
    k_ik, i_ik = (LHW.lower_machine(mach, ik, p, x)["cpu_flops"] for x in grid[:2])
    assert i_main == pytest.approx(k_main * main.decode.cpu_iquant_rel) and main.decode.cpu_iquant_rel < 0.5
    assert k_ik == pytest.approx(k_main * ik.decode.cpu_kernel_speedup) and ik.decode.cpu_kernel_speedup > 1.5
    assert i_ik == pytest.approx(k_ik * ik.decode.cpu_iquant_rel) and i_ik > i_main
    half = LHW.lower_machine(mach, main, p, grid[2])["cpu_flops"]
    assert i_main < half < k_main
    cpu = hardware.machine(gpu=None, host="ddr5-6000x2", cpu="ryzen-9-7950x")
    slow = simulate("mixtral-8x7b", cpu, quant="IQ3_XXS", context=512, prompt=512, mode="analytic")
    fast = simulate("mixtral-8x7b", cpu, quant="IQ3_XXS", context=512, prompt=512, mode="analytic",
                    runtime="ik_llama.cpp")
    assert fast.prefill_tok_s > 2 * slow.prefill_tok_s


def test_cpu_value_table_types_run_at_mainlines_lut_rate():
    """IQ4_NL, IQ4_XS and MXFP4 index a 16-value table (quants.toml cpu_lut): mainline's CPU dot products run
    them at cpu_lut_rel (0.67 from two same-machine pairs, runtimes.toml), ik_llama.cpp's kernels at its full
    rate; K-quants and grid i-quants are not value-table types."""
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    oss, qwen = model("gpt-oss-20b"), model("qwen3-30b-a3b")
    assert Q.kernel_mix(oss, "MXFP4").cpu_lut > 0.99      # the routed experts (their f32 biases aside)
    assert Q.kernel_mix(qwen, "IQ4_XS").cpu_lut > 0.9 and Q.kernel_mix(qwen, "Q4_K_M").cpu_lut == 0.0
    assert Q.kernel_mix(model("deepseek-r1"), "UD-IQ1_S").cpu_lut < 0.1
    mach = hardware.machine(gpu=None, host="ddr5-6000x2", cpu="ryzen-9-7950x")
    p = D.Placement("cpu-only")
    main, ik = runtime("llama.cpp"), runtime("ik_llama.cpp")
    assert 0.5 < main.decode.cpu_lut_rel < 0.8 and ik.decode.cpu_lut_rel == 1.0
    plain, lut = Q.KernelMix(), Q.KernelMix(cpu_lut=1.0)
    assert LHW.lower_machine(mach, main, p, lut)["cpu_flops"] == pytest.approx(
        LHW.lower_machine(mach, main, p, plain)["cpu_flops"] * main.decode.cpu_lut_rel)
    assert LHW.lower_machine(mach, ik, p, lut)["cpu_flops"] == LHW.lower_machine(mach, ik, p, plain)["cpu_flops"]
    kw = dict(context=512, prompt=512, mode="analytic")
    slow = simulate("gpt-oss-20b", mach, quant="MXFP4", **kw).prefill_tok_s
    fast = simulate("gpt-oss-20b", mach, quant="MXFP4", runtime="ik_llama.cpp", **kw).prefill_tok_s
    assert fast / slow > 2.5       # ik's 444 vs mainline's 142 t/s on one 7950X (ik_llama.cpp PR #683): 3.1x


def test_kquant_prefill_before_int8_tensor_core_mmq():
    """llama.cpp builds before PR #7860 ran K-quant MMQ without int8 tensor cores: a Q4_K_M prefill
    on a 4090 is slower under the llama.cpp-2024h1 profile, a Q4_0 one (only its Q6_K output matrix is a
    K-quant) barely, and decode is unchanged."""
    from moesim.ingest import model
    m = model("llama-3-8b")
    assert Q.kernel_mix(m, "Q4_K_M").mmq_kquant > 0.95 and 0.0 < Q.kernel_mix(m, "Q4_0").mmq_kquant < 0.15
    mach = hardware.machine(gpu="rtx-4090")
    for quant, slower in (("Q4_K_M", True), ("Q4_0", False)):
        new, old = (simulate("llama-3-8b", mach, quant=quant, runtime=r, context=1024, prompt=1024, mode="analytic")
                    for r in ("llama.cpp", "llama.cpp-2024h1"))
        assert old.decode_tok_s == pytest.approx(new.decode_tok_s, rel=1e-12)
        assert (old.prefill_tok_s < 0.8 * new.prefill_tok_s) if slower else \
            (0.9 * new.prefill_tok_s < old.prefill_tok_s < new.prefill_tok_s)


def test_release_profiles_keep_their_familys_behaviour():
    """ktransformers-legacy places experts like ktransformers (auto: GPU experts / experts on CPU) and
    llama.cpp-2024h1 fits like llama.cpp: a profile for an older release changes speeds, not placement."""
    from moesim.analysis.resolve import resolve
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("deepseek-v3")
    mach = hardware.machine("xeon-6454s-4090")
    for new, old in (("ktransformers", "ktransformers-legacy"), ("llama.cpp", "llama.cpp-2024h1")):
        assert runtime(old).family == runtime(new).family
        p_new = resolve(m, "int8" if new == "ktransformers" else "Q4_K_M", mach, runtime(new))[4]
        p_old = resolve(m, "int8" if new == "ktransformers" else "Q4_K_M", mach, runtime(old))[4]
        assert p_new == p_old and p_new.kind != "all-gpu"


def test_runtime_launch_settings_per_model():
    """A runtime profile carries the launch settings its docs give for a catalog model (`kt run m2.1`:
    GPU prefill threshold 4096, chunked prefill 32768; the Qwen3-Coder-Next tutorial: 2048 / 16384);
    resolve applies them, the standalone ktransformers-legacy server has none."""
    from moesim.analysis.resolve import resolve
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    plain = runtime("ktransformers").decode
    mm = runtime("ktransformers", model="minimax-m2").decode
    qn = runtime("ktransformers", model="qwen3-next-80b-a3b").decode
    assert (plain.layerwise_prefill_tokens, plain.layerwise_chunk_tokens) == (4096, 8192)
    assert (mm.layerwise_prefill_tokens, mm.layerwise_chunk_tokens) == (4096, 32768)
    assert (qn.layerwise_prefill_tokens, qn.layerwise_chunk_tokens) == (2048, 16384)
    assert runtime("ktransformers-legacy", model="minimax-m2").decode.layerwise_prefill_tokens == 0
    assert runtime("llama.cpp", model="minimax-m2").decode == runtime("llama.cpp").decode
    mach = hardware.machine(gpu="rtx-4090", host="ddr5-4800x8", cpu="xeon-platinum-8488c", sockets=2,
                            host_mem_gb=1024)
    assert resolve(model("minimax-m2"), "fp8", mach, "ktransformers")[1].decode.layerwise_chunk_tokens == 32768
    assert "chunked-prefill-size 32768" in runtime("ktransformers", model="minimax-m2").launch
    assert runtime("ktransformers").launch == "" and runtime("ktransformers-legacy", model="minimax-m2").launch == ""
    from moesim import fit
    row = fit("minimax-m2", mach, quants=["fp8"], runtime="ktransformers")[0]
    assert "--chunked-prefill-size 32768" in row["flags"] and any("launch for minimax-m2" in a
                                                                  for a in row["assumptions"])
    plain = fit("kimi-k2", mach, quants=["Q4_K_M"], runtime="ktransformers")[0]
    assert "--chunked-prefill-size" not in plain["flags"]


def test_fp8_weights_set_gpu_gemm_and_cpu_rates():
    """fp8 checkpoints: served runtimes run the weight GEMMs on fp8 tensor cores (2x the 16-bit rate on
    a 4090) and the attention scores at attn_flops_eff of the 16-bit peak; CPUs, without fp8 arithmetic,
    multiply them at cpu_fp8_rel. llama.cpp (GGUF, no fp8 type) keeps one MMQ rate."""
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("minimax-m2")
    mix = Q.kernel_mix(m, "fp8")
    assert mix.fp8 > 0.99 and mix.cpu_fp8 == 1.0 and Q.kernel_mix(m, "bf16").fp8 == 0.0
    mach = hardware.machine(gpu="rtx-4090", host="ddr5-4800x8", cpu="xeon-platinum-8488c", sockets=2)
    p = D.Placement("experts-cpu")
    kt = runtime("ktransformers")
    fp8, bf16 = LHW.lower_machine(mach, kt, p, mix), LHW.lower_machine(mach, kt, p, Q.KernelMix())
    tf = mach.gpu_tflops
    assert fp8["prefill_gemm_flops"] / fp8["prefill_flops"] == pytest.approx(
        1.0 / (mix.fp8 / (tf["fp8"] / tf["bf16"]) + 1.0 - mix.fp8))
    assert bf16["prefill_gemm_flops"] == bf16["prefill_flops"]
    assert fp8["prefill_attn_flops"] == pytest.approx(tf["bf16"] * 1e12 * kt.decode.attn_flops_eff)
    assert fp8["cpu_flops"] == pytest.approx(bf16["cpu_flops"] * kt.decode.cpu_fp8_rel)
    lcpp = LHW.lower_machine(mach, runtime("llama.cpp"), p, Q.KernelMix(fp8=1.0))
    # llama.cpp's weights take its one GEMM rate; its flash attention the CUDA MMA kernels' share of fp16
    assert lcpp["prefill_gemm_flops"] == lcpp["prefill_flops"]
    assert lcpp["prefill_attn_flops"] == pytest.approx(min(lcpp["prefill_flops"], 0.52 * tf["fp16"] * 1e12))


@given(busy=st.integers(1, 64))
@settings(max_examples=30, deadline=None)
def test_cpu_clock_runs_from_boost_to_base_as_cores_fill(busy):
    """Every core busy on a matmul runs at the base clock (TDP is rated there); fewer busy cores share the
    power budget and clock higher, up to the boost clock: the rate never falls as threads are added and
    per core never rises."""
    from moesim.spec.runtimes import runtime
    d = runtime("llama.cpp").decode

    def rate(cores):
        mach = hardware.machine(gpu=None, host="ddr5-4800x8", cpu="xeon-gold-6454s", sockets=2, cores=cores)
        return LHW.lower_machine(mach, runtime("llama.cpp"), D.Placement("cpu-only"), Q.KernelMix())["cpu_flops"]

    unit = 64 * d.cpu_flops_eff * d.cpu_kernel_speedup * 1e9
    assert rate(64) == pytest.approx(64 * 2.2 * unit)                     # 2 x 32 cores, all busy: base
    assert 2.2 * unit * (1 - 1e-12) <= rate(busy) / busy <= 3.4 * unit * (1 + 1e-12)
    if busy > 1:
        assert rate(busy) >= rate(busy - 1) and rate(busy) / busy <= rate(busy - 1) / (busy - 1) * (1 + 1e-12)


def test_layerwise_prefill_copies_then_computes():
    """KT's layerwise load synchronises the device before and after each layer's expert copy, so a
    streamed chunk's time is the copy plus the compute: removing the PCIe cost takes off exactly the
    layers' expert bytes over the link."""
    prompt = 16384
    rate, dm, hw = _kt_prefill("fp8", "xeon-platinum-8488c", prompt=prompt)
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("deepseek-v3")
    rt = runtime("ktransformers")
    rtab = LRT.lower(LRT.RoutingDims.of(m), R.profile(None, family=m.family), 0)
    fast_link = dict(hw, pcie_bw=1e30, host_bw=1e30)
    t_all = prompt / rate
    t_nolink = prompt / PF.prefill(m, dm, fast_link, rtab, rt, prompt, 1)[0]
    link = min(hw["pcie_bw"] * hw["pcie_links"], hw["host_bw"])
    moe = np.asarray(dm["expert_mode"]) != CODES.EXP_NONE
    copy = sum(dm["layer_experts"][l] * dm["expert_bytes"][l] for l in np.nonzero(moe)[0]) / link
    chunks = -(-prompt // rt.decode.layerwise_chunk_tokens)
    assert dm["layerwise_prefill"] and t_all - t_nolink == pytest.approx(chunks * copy, rel=1e-6)


_PREFILL_CASES = {}


def _prefill_case(name):
    """Lowered prefill inputs (model, dm, hw, rtab, rt, prompt) for a few real configurations, built once."""
    if name not in _PREFILL_CASES:
        from moesim.ingest import model
        from moesim.spec.runtimes import runtime
        if name.startswith("kt"):
            prompt = 8192 if name == "kt-stream" else 2048
            _, dm, hw = _kt_prefill("fp8", "xeon-platinum-8488c", prompt=prompt, gpus=2)
            m, rt = model("deepseek-v3"), runtime("ktransformers")
        else:
            prompt = 1024
            mach = hardware.machine(gpu="rtx-4090", host="ddr5-6000x2", cpu="ryzen-9-7950x", host_mem_gb=192)
            m, rt = model("qwen3-30b-a3b"), runtime("llama.cpp")
            *_, dm, hw, _ = _lowered("qwen3-30b-a3b", "Q4_K_M", mach, rt, "experts-cpu", prompt)
        rtab = LRT.lower(LRT.RoutingDims.of(m), R.profile(None, family=m.family), 0)
        _PREFILL_CASES[name] = (m, dm, hw, rtab, rt, prompt)
    return _PREFILL_CASES[name]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["kt-stream", "kt-cpu", "lcpp"]),
       st.sampled_from(["gpu_bw", "host_bw", "pcie_bw", "prefill_flops", "prefill_gemm_flops", "prefill_attn_flops",
                        "cpu_flops", "amx_flops"]),
       st.floats(1.01, 50.0))
def test_more_of_any_resource_never_slows_prefill(case, resource, factor):
    """Prefill invariant: more bandwidth or FLOP/s of any kind never lowers prefill tok/s (KT streaming and
    CPU paths, llama.cpp with CPU experts)."""
    m, dm, hw, rtab, rt, prompt = _prefill_case(case)
    base = PF.prefill(m, dm, hw, rtab, rt, prompt, 1)[0]
    more = PF.prefill(m, dm, dict(hw, **{resource: hw[resource] * factor}), rtab, rt, prompt, 1)[0]
    assert more >= base * (1 - 1e-12)


def test_unknown_launch_setting_is_a_clear_error(monkeypatch):
    """A launch table naming something that is not a runtime parameter fails loudly, naming the profile."""
    import copy
    from moesim import _catalog
    from moesim.spec import runtimes
    real = _catalog.load("runtimes")
    bad = copy.deepcopy(real)
    bad["runtimes"]["ktransformers"]["models"]["minimax-m2"]["chunk_size"] = 1
    load = _catalog.load
    monkeypatch.setattr(runtimes._catalog, "load", lambda name: bad if name == "runtimes" else load(name))
    with pytest.raises(MoesimError, match="unknown launch settings.*chunk_size"):
        runtimes.runtime("ktransformers", model="minimax-m2")
    assert runtimes.runtime("ktransformers", model="kimi-k2").decode.layerwise_chunk_tokens == 8192


def test_mxfp4_prefill_gemms_run_at_their_own_mmq_rate():
    """llama.cpp's MXFP4 MMQ (gpt-oss) runs at gpu_mxfp4_mmq_rel of its Q4 rate on discrete cards and on
    GB10 alike (GB10 shares the GDDR cards' efficiency); decode and Apple's Metal path are unchanged."""
    import dataclasses
    from moesim.ingest import model
    from moesim.spec.runtimes import runtime
    m = model("gpt-oss-20b")
    mix = Q.kernel_mix(m, "MXFP4")
    assert mix.mmq_mxfp4 > 0.8 and Q.kernel_mix(model("qwen3-30b-a3b"), "Q4_0").mmq_mxfp4 == 0.0
    lc = runtime("llama.cpp")
    full = dataclasses.replace(lc, decode=dataclasses.replace(lc.decode, gpu_mxfp4_mmq_rel=1.0))
    assert lc.decode.gpu_mxfp4_mmq_rel < 0.5
    p = D.Placement("all-gpu")
    for gpu in ("rtx-4090", "dgx-spark"):
        mach = hardware.machine(gpu=gpu)
        pu = D.Placement("unified") if mach.unified else p
        slow, fast = (LHW.lower_machine(mach, r, pu, mix)["prefill_flops"] for r in (lc, full))
        assert slow == pytest.approx(fast / (mix.mmq_mxfp4 / lc.decode.gpu_mxfp4_mmq_rel + 1 - mix.mmq_mxfp4))
        a, b = (simulate("gpt-oss-20b", mach, quant="MXFP4", runtime=r, context=2048, prompt=2048, mode="analytic")
                for r in (lc, full))
        assert a.prefill_tok_s < b.prefill_tok_s and a.decode_tok_s == pytest.approx(b.decode_tok_s, rel=1e-12)
    spark = hardware.machine(gpu="dgx-spark")
    assert LHW.lower_machine(spark, full, D.Placement("unified"), Q.KernelMix())["prefill_flops"] == pytest.approx(
        spark.gpu_tflops["fp8"] * 1e12 * lc.decode.prefill_flops_eff)
    mac = hardware.machine(gpu="m3-max")
    assert (LHW.lower_machine(mac, lc, D.Placement("unified"), mix)["prefill_flops"]
            == LHW.lower_machine(mac, full, D.Placement("unified"), mix)["prefill_flops"])
