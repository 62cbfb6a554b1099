"""Expert-cache replay and the fitted routing profiles against the real traces in ../shared/traces
(skipped when absent): the C kernel's LRU equals a pure-Python LRU exactly, hit rates behave like
hit rates, and each fitted profile reproduces its trace's reuse and LRU hit rate at 2k experts."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from moesim.analysis import routing_fit as RF
from moesim.engine.lower import routing as LRT
from moesim.engine import routing as KRT
from moesim.spec import routing
from moesim.ingest import traces

# ../shared/traces next to the checkout; MOESIM_TRACES points elsewhere (a worktree one level deeper)
TRACES = Path(os.environ.get("MOESIM_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))

# catalog profile id -> trace file or directory
FITTED = {
    "gpt-oss": "gpt-oss-20b",
    "deepseek-v2": "deepseek-v2-lite",
    "mixtral": "mixtral-8x7b_humaneval.jsonl",
    "olmoe": "olmoe-1b-7b_gsm8k_layer0.jsonl",
}
TRACE_NAMES = sorted(FITTED.values())


@functools.lru_cache(maxsize=None)
def _load(name: str):
    return traces.load(TRACES / name)


def trace(name: str):
    if not (TRACES / name).exists():
        pytest.skip(f"{TRACES / name} not present (routing traces live in ../shared/traces)")
    return _load(name)


def capacities(tr) -> list:
    k, E = tr.top_k, tr.n_experts
    return sorted({min(m * k, E) for m in (1, 2, 3, 4)} | {E})


def python_lru(requests, capacity: int) -> np.ndarray:
    """Per-layer LRU hit rate, written out plainly: per layer and per request the cache starts empty;
    a token's distinct experts are served in expert-id order; a resident expert is a hit and becomes
    most recent; a missing one is inserted, evicting the least recent expert that the token does not
    still need (the least recent of all if every resident expert is still needed)."""
    n_layers = requests[0].shape[1]
    hits = [0] * n_layers
    accesses = [0] * n_layers
    for req in requests:
        tokens = np.asarray(req).tolist()
        for l in range(n_layers):
            cache = []                       # resident experts, least recently used first
            for tok in tokens:
                step = sorted(set(tok[l]))
                pending = set(step)
                for e in step:
                    accesses[l] += 1
                    pending.discard(e)
                    if e in cache:
                        hits[l] += 1
                        cache.remove(e)
                    elif capacity == 0:
                        continue
                    elif len(cache) == capacity:
                        victims = [x for x in cache if x not in pending] or cache
                        cache.remove(victims[0])
                    cache.append(e)
    return np.array(hits, dtype=float) / np.maximum(np.array(accesses, dtype=float), 1)


# ------------------------------------------------------------------------------- (a) kernel LRU is exact
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_kernel_lru_equals_python_lru_on_traces(name):
    tr = trace(name)
    for C in capacities(tr):
        kernel = KRT.cache_hit_rates(tr.requests, tr.n_experts, C, "lru")
        expected = python_lru(tr.requests, C)
        assert kernel.shape == (len(tr.layers),)
        assert list(kernel) == list(expected), f"capacity {C}"


@st.composite
def small_requests(draw):
    E = draw(st.integers(1, 10))
    k = draw(st.integers(1, 4))
    L = draw(st.integers(1, 3))
    reqs = []
    for _ in range(draw(st.integers(1, 3))):
        T = draw(st.integers(1, 25))
        ids = draw(st.lists(st.integers(0, E - 1), min_size=T * L * k, max_size=T * L * k))
        reqs.append(np.array(ids, dtype=np.int32).reshape(T, L, k))   # repeats within a token allowed
    return E, reqs, draw(st.integers(0, E + 2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_requests())
def test_kernel_lru_equals_python_lru_random(case):
    E, reqs, C = case
    assert list(KRT.cache_hit_rates(reqs, E, C, "lru")) == list(python_lru(reqs, min(C, E)))


# ------------------------------------------------------------------------------- (b) hit-rate invariants
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_hit_rates_monotone_and_belady_bounds_lru(name):
    tr = trace(name)
    E = tr.n_experts
    caps = sorted(set(capacities(tr)) | {1, tr.top_k + 1, E - 1} - {0})
    lru = np.array([KRT.cache_hit_rates(tr.requests, E, C, "lru") for C in caps])
    belady = np.array([KRT.cache_hit_rates(tr.requests, E, C, "belady") for C in caps])
    for rates in (lru, belady):
        assert np.all((rates >= 0) & (rates <= 1))
        assert np.all(np.diff(rates, axis=0) >= 0), "hit rate fell as the cache grew"
    assert np.all(belady >= lru), "Belady (offline optimum) below LRU"
    # a cache holding every expert misses only each expert's first use in a request
    assert list(lru[-1]) == list(belady[-1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_requests())
def test_belady_at_least_lru_random(case):
    E, reqs, C = case
    lru = KRT.cache_hit_rates(reqs, E, C, "lru")
    belady = KRT.cache_hit_rates(reqs, E, C, "belady")
    assert np.all(belady >= lru - 1e-12)
    assert np.all((lru >= 0) & (lru <= 1) & (belady <= 1))


def test_belady_is_the_offline_optimum():
    # one layer, E = 4, C = 2, the same four experts twice: MIN (evict the expert whose next access is
    # furthest) hits 3 and 1 in the second token (2 of 8 accesses); the step-level ranking hits only one
    req = np.array([[[3, 0, 2, 1]], [[3, 0, 2, 1]]], dtype=np.int32)
    assert KRT.cache_hit_rates([req], 4, 2, "belady")[0] == 2 / 8


# ------------------------------------------------------------------------------- (c) fitted profiles
@pytest.mark.parametrize("pid", sorted(FITTED))
def test_fitted_profile_reproduces_trace(pid):
    tr = trace(FITTED[pid])
    E, k = tr.n_experts, tr.top_k
    target = RF.trace_stats(tr.requests, E, k)
    prof = routing.profile(pid)
    assert prof.request_tokens > 0
    dims = LRT.RoutingDims(min(len(tr.layers), 8), E, k)
    # a seed and request count other than the fit's (seed 0, 48 requests)
    reqs = KRT.sample_requests(dims, prof, 64, prof.request_tokens, seed=20261)
    model = RF.trace_stats(reqs, E, k)
    for key in ("reuse", "lru_2k"):
        assert abs(model[key] - target[key]) <= 0.05, (key, model, target)
    assert abs(model["lru_3k"] - target["lru_3k"]) <= 0.08, model


def test_fit_replicates_small_traces_and_tries_power_kernels():
    # few tokens or few requests: the model side is the mean of several replicate request sets
    assert RF.replicates_for(20000, 120) == 1 and RF.replicates_for(799, 6) == 6 and RF.replicates_for(4000, 6) == 3
    assert RF.replicates_for(4471, 1) == 8 and RF.replicates_for(100, 100) == 8
    assert any(power > 0 for _decay, power in RF.FIT_KERNELS) and any(power == 0 for _d, power in RF.FIT_KERNELS)
    # a tiny synthetic trace: the fit runs, picks one of the kernels tried, and reports LRU with the rest
    dims = LRT.RoutingDims(2, 16, 2)
    reqs = KRT.sample_requests(dims, routing.profile("generic", layer_recency=(0.5,), recency_power=2.0,
                                                     recency_decay=1.0), 3, 40, 1)
    tr = traces.Trace(requests=reqs, layers=[0, 1], top_k=2, n_experts=16, source="synthetic")
    prof, model, target, err = RF.fit_profile(tr, iterations=2, kernels=((0.8, 0.0), (1.0, 2.0)), partners=(1,))
    assert (prof.recency_decay, prof.recency_power) in ((0.8, 0.0), (1.0, 2.0)) and np.isfinite(err)
    assert {"lru_1k", "lru_2k", "lru_4k"} <= set(model) and {"lru_1k", "lru_2k", "lru_4k"} <= set(target)


# trace -> the v2 profile (the full model, issue 15) fitted to it
V2_PROFILE = {"gpt-oss-20b": "gpt-oss:pooled", "deepseek-v2-lite": "deepseek-v2:v2",
              "olmoe-1b-7b_gsm8k_layer0.jsonl": "olmoe:v2"}


@pytest.mark.parametrize("name", sorted(V2_PROFILE))
def test_v2_profile_reproduces_trace(name):
    """The full-model profiles, sampled at the trace's own layers and request lengths (as fitted) from a
    seed other than the fit's, reproduce the trace's reuse and LRU hit rate at 2k within 0.05."""
    tr = trace(name)
    E, k = tr.n_experts, tr.top_k
    prof = routing.profile(V2_PROFILE[name])
    assert prof.layer_zipf_s and prof.source.count("moesim routing fit") >= 1, prof.id
    lengths = [len(r) for r in tr.requests]
    long = KRT.sample_requests(LRT.RoutingDims(len(tr.layers), E, k), prof, len(lengths), max(lengths), seed=20261)
    model = RF.trace_stats([r[:n] for r, n in zip(long, lengths)], E, k)
    target = RF.trace_stats(tr.requests, E, k)
    for key in ("reuse", "lru_2k"):
        assert abs(model[key] - target[key]) <= 0.05, (key, model, target)


# ------------------------------------------------------------------------------- (d) reproducible sampling
@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(FITTED)), st.integers(0, 2**62))
def test_sampling_reproducible(pid, seed):
    dims = LRT.RoutingDims(4, 16, 2)
    prof = routing.profile(pid)
    a = KRT.sample_requests(dims, prof, 3, 40, seed)
    b = KRT.sample_requests(dims, prof, 3, 40, seed)
    c = KRT.sample_requests(dims, prof, 3, 40, seed + 1)
    assert len(a) == 3 and all(x.shape == (40, 4, 2) and x.dtype == np.int32 for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # requests within one draw are independent streams
    assert not np.array_equal(a[0], a[1])
    for x in a:
        assert x.min() >= 0 and x.max() < 16
        assert (np.diff(np.sort(x, axis=2), axis=2) > 0).all()   # k distinct experts per token


@pytest.mark.parametrize("pid", sorted(FITTED))
def test_sampling_reproducible_at_trace_shape(pid):
    prof = routing.profile(pid)
    dims = {"gpt-oss": (8, 32, 4), "deepseek-v2": (8, 64, 6), "mixtral": (8, 8, 2), "olmoe": (1, 64, 8)}[pid]
    dims = LRT.RoutingDims(*dims)
    a = KRT.sample_requests(dims, prof, 2, 64, 7)
    b = KRT.sample_requests(dims, prof, 2, 64, 7)
    c = KRT.sample_requests(dims, prof, 2, 64, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not any(np.array_equal(x, y) for x, y in zip(a, c))


def test_missing_traces_skip(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "TRACES", tmp_path / "nowhere")
    with pytest.raises(pytest.skip.Exception):
        trace("gpt-oss-20b")


def test_inclusion_probabilities_solve_the_rosen_equation_like_bisection():
    """The vectorised Newton solve against per-row bisection on the same equation sum_i 1 - exp(-w_i t) = k,
    on skewed Dirichlet rows (with the lowering's 1e-300 floor), flat rows, and rows with <= k experts."""
    from moesim.engine.lower.routing import inclusion_probabilities

    def bisection(row, k):
        if k >= np.count_nonzero(row):
            return (row > 0).astype(float)
        lo, hi = 0.0, 1.0
        while np.sum(1 - np.exp(-row * hi)) < k:
            lo, hi = hi, hi * 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if np.sum(1 - np.exp(-row * mid)) < k else (lo, mid)
        return 1 - np.exp(-row * hi)

    rng = np.random.default_rng(7)
    for E, k, conc in ((8, 2, 0.05), (64, 6, 1.0), (256, 8, 0.01), (128, 1, 10.0), (16, 16, 1.0)):
        w = np.maximum(np.stack([rng.dirichlet(np.full(E, conc)) for _ in range(12)]), 1e-300)
        w[0, 2:] = 0.0                                  # a row with at most k experts
        w /= w.sum(axis=1, keepdims=True)
        got = inclusion_probabilities(w, k)
        want = np.stack([bisection(r, k) for r in w])
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert np.all((got >= 0) & (got <= 1))


# ------------------------------------------------------------------------------- (e) analytic vs sampled union
# model -> its v1 and v2 profiles (the v2 ones are the family defaults, catalog/routing.toml [families])
UNION_CASES = [("gpt-oss-20b", "gpt-oss"), ("gpt-oss-20b", "gpt-oss:pooled"), ("deepseek-v2-lite", "deepseek-v2"),
               ("deepseek-v2-lite", "deepseek-v2:v2"), ("olmoe-1b-7b", "olmoe"), ("olmoe-1b-7b", "olmoe:v2")]
FAMILY = {"gpt-oss-20b": "gpt_oss", "deepseek-v2-lite": "deepseek_v2", "olmoe-1b-7b": "olmoe"}


@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("mid,pid", UNION_CASES, ids=[f"{m}-{p}" for m, p in UNION_CASES])
def test_analytic_union_agrees_with_sampled_union(mid, pid, batch):
    """The analytic path's distinct experts per step is within 5 % of the Monte Carlo sampler's: for the v2
    profiles read through their window tables (issue 15: before them, gpt-oss:pooled read 14.2 against
    the sampler's 30.0 at batch 32, deepseek-v2:v2 53.0 against 60.1), for the v1 ones through Rosen
    inclusion of N_SCENARIOS Dirichlet draws (with 4 draws gpt-oss at batch 16 read 10 % low, 16: 3 %)."""
    from moesim.analysis.simulate import simulate
    from moesim.spec import hardware
    mach = hardware.machine(gpu="h100-sxm")
    an, mc = (simulate(mid, mach, batch=batch, tokens=96, mode=mode, routing=pid).distinct_experts_per_step
              for mode in ("analytic", "montecarlo"))
    gap = abs(an - mc) / mc
    assert gap <= 0.05, f"{pid} batch {batch}: analytic {an:.2f} vs sampled {mc:.2f} distinct experts ({gap:+.1%})"


@pytest.mark.parametrize("mid", sorted(FAMILY))
def test_family_defaults_are_checked_against_the_sampler(mid):
    """Each fitted family's default profile is one the union check above covers."""
    assert (mid, routing.profile(family=FAMILY[mid]).id) in UNION_CASES
