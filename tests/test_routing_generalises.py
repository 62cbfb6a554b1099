"""Does the routing model generalise? Fit on half of each real trace (../shared/traces, skipped when
absent), sample the fitted model at the other half's request lengths, and compare the statistics an
expert-offloading study rests on. The statistics here are written from scratch in plain numpy and do
not use moesim's own statistics code (only the fit, the sampler and, for the replay check, the cache).

Split: even-indexed requests fit, odd-indexed ones check; traces with fewer than 4 requests (one long
stream) are first cut into 128-token pieces, so both halves sample the whole stream.

Checks the current model fails are xfail(strict=True) with the gap measured when the mark was set, so
they turn into failures (and must be un-marked) when the model improves.
"""
from __future__ import annotations

import functools
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from moesim.analysis import routing_fit as RF
from moesim.engine import routing as KRT
from moesim.engine.lower.routing import RoutingDims
from moesim.ingest import traces
from moesim.spec import routing as R

# ../shared/traces next to the checkout; MOESIM_TRACES points elsewhere (a worktree one level deeper)
TRACES = Path(os.environ.get("MOESIM_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))
TRACE_NAMES = ("deepseek-v2-lite", "gpt-oss-20b", "mixtral-8x7b_humaneval.jsonl", "olmoe-1b-7b_gsm8k_layer0.jsonl")
TOLERANCE = 0.10          # issue 15: "matches within 10 %"
REPLAY_TOLERANCE = 0.05   # issue 15: replay vs sampled-profile LRU at 2k, 4k within 5 %
SEED = 20261


# ------------------------------------------------------------------------------- independent statistics
def reuse_at_lag(requests, lag: int) -> float:
    """Mean over (request, token t >= lag, layer) of |S_t & S_{t-lag}| / k."""
    num = den = 0
    for r in requests:
        if len(r) <= lag:
            continue
        a = np.sort(r[lag:], axis=2)
        b = np.sort(r[:-lag], axis=2)
        k = r.shape[2]
        for i in range(k):
            num += int(np.sum(np.any(a[:, :, i:i + 1] == b, axis=2)))
        den += a.size
    return num / den if den else float("nan")


def lru_hit_rate(requests, capacity: int) -> float:
    """Plain per-layer LRU, cold per request, tokens in order, each token's experts in id order."""
    hits = total = 0
    for r in requests:
        for l in range(r.shape[1]):
            cache = OrderedDict()
            for tok in r[:, l, :]:
                for e in sorted(set(tok.tolist())):
                    total += 1
                    if e in cache:
                        hits += 1
                        cache.move_to_end(e)
                    else:
                        cache[e] = True
                        if len(cache) > capacity:
                            cache.popitem(last=False)
    return hits / total


def batch_union(requests, batch: int, seed: int = 0, trials: int = 400) -> float:
    """Mean distinct experts per layer among `batch` tokens of one step: tokens at random positions of
    `batch` distinct requests when there are enough requests, else random tokens of the whole set."""
    rng = np.random.default_rng(seed)
    lens = np.array([len(r) for r in requests])
    L = requests[0].shape[1]
    out = []
    for _ in range(trials):
        if len(requests) >= batch:
            idx = rng.choice(len(requests), batch, replace=False)
            toks = [requests[i][rng.integers(lens[i])] for i in idx]
        else:
            flat = rng.integers(lens.sum(), size=batch)
            starts = np.concatenate([[0], np.cumsum(lens)])
            which = np.searchsorted(starts, flat, side="right") - 1
            toks = [requests[i][f - starts[i]] for i, f in zip(which, flat)]
        toks = np.stack(toks)              # [batch, L, k]
        out.append(np.mean([len(np.unique(toks[:, l])) for l in range(L)]))
    return float(np.mean(out))


def coactivation_table(requests, n_experts: int) -> np.ndarray:
    """counts[l, i, j]: tokens choosing i at layer l and j at layer l + 1."""
    L = requests[0].shape[1]
    t = np.zeros((L - 1, n_experts, n_experts))
    for r in requests:
        for l in range(L - 1):
            a, b = r[:, l, :], r[:, l + 1, :]
            for i in range(a.shape[1]):
                for j in range(b.shape[1]):
                    np.add.at(t[l], (a[:, i], b[:, j]), 1)
    return t


def coactivation_recall(fit_requests, check_requests, n_experts: int) -> float:
    """Recall of predicting layer l+1's k experts as the k with the highest summed co-activation count
    with layer l's experts (table from fit_requests, scored on check_requests)."""
    table = coactivation_table(fit_requests, n_experts)
    hit = tot = 0
    for r in check_requests:
        k = r.shape[2]
        for l in range(r.shape[1] - 1):
            score = table[l][r[:, l, :]].sum(axis=1)              # [T, E]
            score = score + 1e-9 * np.arange(n_experts)[::-1]       # stable tie-break by id
            pred = np.argsort(-score, axis=1)[:, :k]
            hit += int(np.sum(np.any(pred[:, :, None] == r[:, l + 1, None, :], axis=2)))
            tot += pred.size
    return hit / tot


def gini(counts) -> float:
    x = np.sort(np.asarray(counts, dtype=float))
    n = len(x)
    if x.sum() == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ x / (n * x.sum()))


def global_gini(requests, n_experts: int) -> float:
    """Mean over layers of the Gini coefficient of expert popularity."""
    L = requests[0].shape[1]
    return float(np.mean([gini(np.bincount(np.concatenate([r[:, l].ravel() for r in requests]),
                                           minlength=n_experts)) for l in range(L)]))


def request_divergence(requests, n_experts: int) -> float:
    """Token-weighted mean total-variation distance between a request's per-layer expert distribution and
    the global one of the same request set (nan for a single request)."""
    if len(requests) < 2:
        return float("nan")
    L = requests[0].shape[1]
    num = den = 0.0
    for l in range(L):
        glob = np.bincount(np.concatenate([r[:, l].ravel() for r in requests]), minlength=n_experts)
        glob = glob / glob.sum()
        for r in requests:
            p = np.bincount(r[:, l].ravel(), minlength=n_experts) / r[:, l].size
            num += len(r) * 0.5 * np.abs(p - glob).sum()
            den += len(r)
    return num / den


def statistics(fit, check, n_experts: int, top_k: int) -> dict:
    k = top_k
    out = {f"reuse_lag{d}": reuse_at_lag(check, d) for d in (1, 2, 8, 32)}
    for m in (1, 2, 4):
        out[f"lru_{m}k"] = lru_hit_rate(check, min(m * k, n_experts))
    for B in (8, 32):
        out[f"union_b{B}"] = batch_union(check, B)
    if check[0].shape[1] > 1:
        out["coact_recall"] = coactivation_recall(fit, check, n_experts)
    out["gini"] = global_gini(check, n_experts)
    out["divergence"] = request_divergence(check, n_experts)
    return out


# ------------------------------------------------------------------------------- fit / check split
CHUNK = 128   # tokens per piece when a trace has too few requests to split by request


def split(requests) -> tuple:
    """Even-indexed requests fit, odd ones check; a trace of fewer than 4 requests is first cut into
    CHUNK-token pieces (each piece then counts as a request: cold cache, no memory across pieces)."""
    if len(requests) < 4:
        requests = [r[i:i + CHUNK] for r in requests for i in range(0, len(r), CHUNK)]
    return list(requests[0::2]), list(requests[1::2])


def sampled_like(dims, prof, like, seed) -> list:
    """Model requests with the lengths of `like` (request i: stream i, truncated)."""
    long = KRT.sample_requests(dims, prof, len(like), max(len(r) for r in like), seed)
    return [s[:len(r)] for s, r in zip(long, like)]


@functools.lru_cache(maxsize=None)
def measured(name: str) -> dict:
    """The half-fit of the full routing model against the held-out half."""
    tr = traces.load(TRACES / name)
    fit, _check = split(tr.requests)
    half = traces.Trace(requests=fit, layers=tr.layers, top_k=tr.top_k, n_experts=tr.n_experts,
                        source=tr.source + " (fit half)")
    return compared(tr, RF.fit_profile(half)[0])


def compared(tr, prof) -> dict:
    """{"real", "model"} statistics of the held-out half and of *prof* sampled at both halves' lengths."""
    E, k = tr.n_experts, tr.top_k
    fit, check = split(tr.requests)
    dims = RoutingDims(len(tr.layers), E, k)
    # one lowered model (the seed fixes its popularity permutation and partner table), independent streams
    model = sampled_like(dims, prof, fit + check, SEED)
    model_fit, model_check = model[:len(fit)], model[len(fit):]
    real = statistics(fit, check, E, k)
    model = statistics(model_fit, model_check, E, k)
    for m in (2, 4):   # the same comparison through moesim's own cache replay
        C = min(m * k, E)
        real[f"replay_lru_{m}k"] = float(np.mean(KRT.cache_hit_rates(check, E, C)))
        model[f"replay_lru_{m}k"] = float(np.mean(KRT.cache_hit_rates(model_check, E, C)))
    return {"real": real, "model": model}


def relative_gap(name: str, stat: str) -> float:
    m = measured(name)
    return (m["model"][stat] - m["real"][stat]) / m["real"][stat]


def passed(m: dict) -> int:
    """How many of the held-out checks (test_sampled_model_matches_held_out_half) *m* passes."""
    ok = 0
    for stat in STATS:
        if stat in m["real"] and np.isfinite(m["real"][stat]):
            tol = REPLAY_TOLERANCE if stat.startswith("replay") else TOLERANCE
            ok += abs((m["model"][stat] - m["real"][stat]) / m["real"][stat]) <= tol
    return ok


STATS = ("reuse_lag1", "reuse_lag2", "reuse_lag8", "reuse_lag32", "lru_1k", "lru_2k", "lru_4k", "union_b8",
         "union_b32", "coact_recall", "gini", "divergence", "replay_lru_2k", "replay_lru_4k")

# (trace, statistic) -> relative gap (model - trace) / trace, measured with the model the mark was set on
# (power-law recency kernels, LRU in the kernel choice, replicated model samples for small traces). The
# Mixtral trace holds 2 requests and the OLMoE trace one stream, so their halves are a few 128-token
# pieces, and gpt-oss-20b's halves are 6 requests each: part of every gap is the halves' own difference
# (DeepSeek-V2-Lite's Gini: fit half 0.200, checked half 0.161; gpt-oss-20b reuse at lag 32 0.287 vs 0.249,
# divergence 0.245 vs 0.208; Mixtral reuse at lag 1 0.417 vs 0.364), which a model of the fit half keeps.
KNOWN_GAPS: dict = {
    ("deepseek-v2-lite", "gini"): +0.343,
    # lag-2 / lag-8 reuse is under-predicted on this trace: over fit seeds 0-5 the gap is -7 to -22 % (lag 2)
    # with either sampler, about -12 % on average; seed 0 had landed inside the tolerance with the race sampler
    ("deepseek-v2-lite", "reuse_lag2"): -0.150,
    ("deepseek-v2-lite", "reuse_lag8"): -0.106,
    ("gpt-oss-20b", "reuse_lag32"): +0.154,
    ("gpt-oss-20b", "divergence"): +0.155,
    ("mixtral-8x7b_humaneval.jsonl", "reuse_lag1"): +0.156,
    ("mixtral-8x7b_humaneval.jsonl", "reuse_lag2"): +0.278,
    ("mixtral-8x7b_humaneval.jsonl", "lru_1k"): +0.140,
    ("mixtral-8x7b_humaneval.jsonl", "lru_2k"): +0.162,
    ("mixtral-8x7b_humaneval.jsonl", "coact_recall"): +0.157,
    ("mixtral-8x7b_humaneval.jsonl", "gini"): +0.151,
    ("mixtral-8x7b_humaneval.jsonl", "replay_lru_2k"): +0.153,
}


XFAIL_NOTE = {"mixtral-8x7b_humaneval.jsonl": "; 2 fitted pieces of <= 128 tokens, 1 checked: the v2 fit overfits, the mixtral default stays v1",
              "olmoe-1b-7b_gsm8k_layer0.jsonl": "; replay LRU is held to 5 % (plain LRU at 4k, held to 10 %, is +5.7 %)"}


def _cases():
    for name in TRACE_NAMES:
        for stat in STATS:
            gap = KNOWN_GAPS.get((name, stat))
            marks = [] if gap is None else [pytest.mark.xfail(
                strict=True, reason=f"model off by {gap:+.0%} (issue 15){XFAIL_NOTE.get(name, '')}")]
            yield pytest.param(name, stat, marks=marks, id=f"{name.split('_')[0].split('.')[0]}-{stat}")


# trace -> (the v1 catalog profile fitted to it: scalar skew/stickiness, model family)
V1 = {"deepseek-v2-lite": ("deepseek-v2", "deepseek_v2"), "gpt-oss-20b": ("gpt-oss", "gpt_oss"),
      "mixtral-8x7b_humaneval.jsonl": ("mixtral", "mixtral"), "olmoe-1b-7b_gsm8k_layer0.jsonl": ("olmoe", "olmoe")}


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_family_default_is_the_routing_model_that_generalises(name):
    """issue 15: a family's default profile is the full (v2) model exactly when that model, fitted on one
    half of the family's trace, passes more held-out checks than the v1 profile does. The analytic path
    reads a default as the sampler draws it (its window tables; tests/test_routing.py
    test_analytic_union_agrees_with_sampled_union and tests/test_sweep_cache_mc.py hold that for every v2
    default). The v1 profile was fitted to the whole trace, held-out half included, so the comparison
    favours v1."""
    skip_if_absent(name)
    v1_id, family = V1[name]
    v1 = passed(compared(traces.load(TRACES / name), R.profile(v1_id)))
    v2 = passed(measured(name))
    default = R.profile(family=family)
    assert bool(default.layer_zipf_s) == (v2 > v1), f"default {default.id}: v2 half-fit passes {v2}, v1 {v1}"
    if v2 <= v1:
        assert default.id == v1_id


def skip_if_absent(name: str) -> None:
    if not (TRACES / name).exists():
        pytest.skip(f"{TRACES / name} not present (routing traces live in ../shared/traces)")


@pytest.mark.parametrize("name,stat", list(_cases()))
def test_sampled_model_matches_held_out_half(name, stat):
    skip_if_absent(name)
    m = measured(name)
    if stat not in m["real"] or not np.isfinite(m["real"][stat]):
        pytest.skip(f"{stat} undefined for {name} (one logged layer or requests shorter than the lag)")
    tol = REPLAY_TOLERANCE if stat.startswith("replay") else TOLERANCE
    gap = relative_gap(name, stat)
    assert abs(gap) <= tol, f"{stat}: model {m['model'][stat]:.4f} vs held-out trace {m['real'][stat]:.4f} ({gap:+.1%})"


# ------------------------------------------------------------------------------- the statistics themselves
def test_statistics_on_hand_made_requests():
    # one layer, k = 2, E = 4: tokens {0,1}, {0,2}, {0,1}, {3,2}
    r = np.array([[[0, 1]], [[2, 0]], [[1, 0]], [[3, 2]]], dtype=np.int32)
    assert reuse_at_lag([r], 1) == pytest.approx((1 + 1 + 0) / 6)
    assert reuse_at_lag([r], 2) == pytest.approx((2 + 1) / 4)
    # LRU C=2: miss miss | 0 hit, 2 miss (evict 1) | 0 hit, 1 miss (evict 2) | 2 miss, 3 miss -> 2 hits of 8
    assert lru_hit_rate([r], 2) == pytest.approx(2 / 8)
    assert lru_hit_rate([r], 4) == pytest.approx(4 / 8)
    assert gini([5, 5, 5, 5]) == 0.0 and gini([0, 0, 0, 8]) == pytest.approx(0.75)
    assert request_divergence([r, r], 4) == 0.0 and np.isnan(request_divergence([r], 4))
    two = np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]], dtype=np.int32)   # layer 0 {0,1} always leads to {2,3}
    assert coactivation_recall([two], [two], 4) == 1.0
    assert batch_union([r] * 8, 8, trials=50) <= 4


def test_missing_traces_skip(monkeypatch):
    import sys
    monkeypatch.setattr(sys.modules[__name__], "TRACES", Path("/nonexistent/traces"))
    with pytest.raises(pytest.skip.Exception):
        skip_if_absent("gpt-oss-20b")
