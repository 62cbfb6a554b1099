"""Fitting the routing model to recorded traces (``moesim routing fit``): per-layer parameters matched to
each layer's statistics (analysis.routing_stats), per workload and pooled, with the spread across workloads."""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from ..errors import MoesimError
from ..engine.lower.routing import RoutingDims
from ..spec.routing import RoutingProfile, _check
from . import routing_stats as S
from ..engine.routing import cache_hit_rates, reuse, sample_requests


def trace_stats(requests, n_experts: int, top_k: int) -> dict:
    """The statistics a profile is fitted to: reuse R and mean per-layer LRU hit rate at C = 2k, 3k."""
    return {"reuse": reuse(requests),
            "lru_2k": float(np.mean(cache_hit_rates(requests, n_experts, 2 * top_k))),
            "lru_3k": float(np.mean(cache_hit_rates(requests, n_experts, min(n_experts, 3 * top_k))))}


FIT_ITERATIONS = 10
# recency-kernel shapes tried, (decay, power): P(lag d) ~ decay^(d - 2) d^-power over lags 2 .. history + 1
FIT_KERNELS = ((0.8, 0.0), (0.95, 0.0), (1.0, 1.0), (1.0, 2.0), (1.0, 3.0))
FIT_PARTNERS = (1, 2)            # next-layer partners per expert tried
FIT_HISTORY = 32
_MID_LAGS = (2, 4, 8)            # the recency copy probability is matched to mean reuse at these lags
_TAIL_LAGS = (2, 4, 8, 16, 32)   # the kernel is chosen on these (and LRU, Gini, co-activation, divergence)


def fit_targets(requests, n_experts: int) -> dict:
    """Per-layer statistics the fit matches (analysis.routing_stats definitions), and the LRU hit rates
    that choose the kernel and partners with them."""
    reuse = {d: S.reuse_by_layer(requests, d) for d in _TAIL_LAGS + (1,)}
    return {"reuse": reuse, "mid": np.nanmean([reuse[d] for d in _MID_LAGS], axis=0),
            "gini": S.gini_by_layer(requests, n_experts),
            "coact": S.coactivation_recall_by_layer(requests, n_experts),
            "divergence": S.divergence(requests, n_experts), "lru": S.lru_rates(requests, n_experts)}


def _fitted(base: RoutingProfile, p: dict, kernel: tuple) -> RoutingProfile:
    return replace(base, layer_zipf_s=tuple(map(float, p["s"])), layer_stickiness_fit=tuple(map(float, p["p"])),
                   layer_recency=tuple(map(float, p["h"])), layer_coupling=tuple(map(float, p["c"])),
                   concentration=float(p["beta"]), recency_decay=float(kernel[0]), recency_power=float(kernel[1]))


def _nan0(x):
    return np.where(np.isfinite(x), x, 0.0)


def _calibrate(trace, target, dims, lengths, kernel, partners, seed, iterations, replicates=1) -> tuple:
    """Damped fixed-point updates of every layer's parameters at once, each toward its own statistic:
    Zipf s_l to Gini_l, stickiness p_l to lag-1 reuse, recency h_l to mid-lag reuse, coupling c_l to
    co-activation recall, and one concentration beta to the per-request divergence. Every round samples
    the trace's own request lengths from the same seed (common random numbers), ``replicates`` times
    (each a fresh set of request streams), and matches the replicates' mean statistics."""
    L, E = dims.n_layers, dims.n_experts
    p = {"s": np.full(L, 0.5), "p": np.clip(_nan0(target["reuse"][1]) - 0.1, 0, 0.9), "h": np.full(L, 0.2),
         "c": np.where(np.isfinite(target["coact"]), 0.3, 0.0), "beta": 2.0}
    base = RoutingProfile(id="fit", zipf_s=0.5, jitter=0.0, concentration=2.0, stickiness=0.2, first_stickiness=0.2,
                          last_stickiness=0.2, request_tokens=int(np.median(lengths)), recall=0.8, history=FIT_HISTORY,
                          n_partners=int(partners),
                          source=f"fit to {trace.source}")
    err = np.inf
    for _ in range(max(1, int(iterations))):
        prof = _fitted(base, p, kernel)
        model = _model_targets(dims, prof, lengths, seed, replicates)
        err = _error(model, target)
        p["s"] = np.clip(p["s"] * (np.maximum(target["gini"], 1e-3) / np.maximum(model["gini"], 1e-3)) ** 1.5, 0, 4)
        p["p"] = np.clip(p["p"] + 0.9 * _nan0(target["reuse"][1] - model["reuse"][1]), 0, 0.97)
        p["h"] = np.clip(p["h"] + 1.2 * _nan0(target["mid"] - model["mid"]), 0, 0.97)
        p["c"] = np.where(np.isfinite(target["coact"]), np.clip(p["c"] + 1.5 * _nan0(target["coact"] - model["coact"]),
                                                                0, 0.97), 0.0)
        if np.isfinite(target["divergence"]) and target["divergence"] > 0:
            p["beta"] = float(np.clip(p["beta"] * (model["divergence"] / target["divergence"]) ** 2.5, 0.05, 200))
    return _fitted(base, p, kernel), model, err


def _sample(dims, prof, lengths, seed) -> list:
    return sample_requests(dims, prof, len(lengths), list(lengths), seed)


def _model_targets(dims, prof, lengths, seed, replicates: int) -> dict:
    """fit_targets of the model at the trace's request lengths, averaged over ``replicates`` request
    sets (streams n·i .. n·i + n - 1 of one lowered model): a trace of few requests is matched by the
    model's expected statistics, not by one draw of its per-request skew."""
    n = len(lengths)
    reqs = _sample(dims, prof, list(lengths) * max(1, int(replicates)), seed)
    runs = [fit_targets(reqs[i * n:(i + 1) * n], dims.n_experts) for i in range(max(1, int(replicates)))]
    if len(runs) == 1:
        return runs[0]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # all-nan layers (coact of layer 0) stay nan
        avg = lambda vals: np.nanmean(np.stack([np.asarray(v, dtype=float) for v in vals]), axis=0)
        out = {"reuse": {d: avg([r["reuse"][d] for r in runs]) for d in runs[0]["reuse"]}}
        for key in ("mid", "gini", "coact"):
            out[key] = avg([r[key] for r in runs])
        out["divergence"] = float(avg([r["divergence"] for r in runs]))
        out["lru"] = {key: float(np.mean([r["lru"][key] for r in runs])) for key in runs[0]["lru"]}
    return out


FIT_MODEL_TOKENS = 4000    # a trace of fewer tokens ...
FIT_MODEL_REQUESTS = 16    # ... or fewer requests is matched by the mean of several model replicates (at most 8)


def replicates_for(tokens: int, requests: int) -> int:
    """How many model replicates of the trace's request set each calibration round samples: enough for
    FIT_MODEL_TOKENS tokens and FIT_MODEL_REQUESTS requests' draws of the per-request skew, 1 to 8."""
    return int(np.clip(max(np.ceil(FIT_MODEL_TOKENS / max(1, tokens)), np.ceil(FIT_MODEL_REQUESTS / max(1, requests))), 1, 8))


def _error(model: dict, target: dict) -> float:
    """Sum of squared relative errors of the layer-mean statistics (those the tests hold to 10 %)."""
    pairs = [(S._mean(model["reuse"][d]), S._mean(target["reuse"][d])) for d in (1,) + _TAIL_LAGS]
    pairs += [(model["lru"][key], target["lru"][key]) for key in target["lru"]]
    pairs += [(S._mean(model[key]), S._mean(target[key])) for key in ("gini", "coact")]
    pairs.append((model["divergence"], target["divergence"]))
    return float(sum(((m - t) / t) ** 2 for m, t in pairs if np.isfinite(m) and np.isfinite(t) and t > 0))


def fit_profile(trace, seed: int = 0, iterations: int = FIT_ITERATIONS, kernels=FIT_KERNELS, partners=FIT_PARTNERS,
                max_tokens: int = 20000) -> tuple:
    """Fit the routing model to a trace: per-layer Zipf skew, stickiness, recency and cross-layer
    coupling, one per-request concentration, the recency kernel's shape (decay, power) and the partners
    per expert (the best combination of ``kernels`` x ``partners``).
    Requests beyond ``max_tokens`` tokens in all are left out (the first ones are kept).
    Returns (profile, model statistics, trace statistics, error)."""
    E, k = trace.n_experts, trace.top_k
    reqs, total = [], 0
    for r in trace.requests:
        if reqs and total + len(r) > max_tokens:
            break
        reqs.append(r[: max_tokens - total] if not reqs else r)
        total += len(reqs[-1])
    if not kernels or not partners:
        raise MoesimError("need at least one recency kernel and one partner count to try", "kernels")
    target = fit_targets(reqs, E)
    dims = RoutingDims(len(trace.layers), E, k)
    lengths = [len(r) for r in reqs]
    if dims.n_layers < 2:
        partners = partners[:1]      # one layer: no cross-layer partners to follow
    reps = replicates_for(sum(lengths), len(lengths))
    best = min((_calibrate(trace, target, dims, lengths, tuple(kn), min(P, E), seed, iterations, reps) for kn in kernels
                for P in partners),
               key=lambda b: b[2])
    prof, model, err = best
    _check(prof)
    return prof, _means(model), _means(target), err


def _means(stats: dict) -> dict:
    out = {f"reuse_lag{d}": float(np.nanmean(v)) for d, v in sorted(stats["reuse"].items())}
    out.update(gini=float(np.nanmean(stats["gini"])), divergence=float(stats["divergence"]))
    out["coact_recall"] = float(np.nanmean(stats["coact"])) if np.isfinite(stats["coact"]).any() else float("nan")
    out.update(stats["lru"])
    return out


PROFILE_FIELDS = ("concentration", "request_tokens", "layer_zipf_s", "layer_stickiness_fit", "layer_recency",
                  "layer_coupling", "recency_decay", "recency_power", "history", "n_partners")


def profile_entry(prof: RoutingProfile) -> dict:
    """The catalog/routing.toml fields of a fitted profile (rounded; the rest keep their defaults)."""
    out = {}
    for key in PROFILE_FIELDS:
        v = getattr(prof, key)
        out[key] = [round(float(x), 4) for x in v] if isinstance(v, tuple) else round(v, 4) if isinstance(v, float) else v
    return out


def fit_workloads(trace_list, seed: int = 0, iterations: int = FIT_ITERATIONS) -> dict:
    """Fit each trace (a workload) and, when they share experts, top-k and layers, all of them pooled;
    with each statistic's spread across the workloads (min, max, (max - min) / mean)."""
    if not trace_list:
        raise MoesimError("no trace to fit", "trace")
    fits = {}
    for tr in trace_list:
        prof, model, target, err = fit_profile(tr, seed, iterations)
        fits[tr.source] = {"profile": profile_entry(prof), "model": model, "trace": target, "error": err,
                           "phase": tr.phase, "requests": len(tr.requests), "tokens": tr.n_tokens}
    out = {"workloads": fits}
    shapes = {(t.n_experts, t.top_k, len(t.layers)) for t in trace_list}
    if len(trace_list) > 1 and len(shapes) == 1:
        pooled = type(trace_list[0])(requests=[r for t in trace_list for r in t.requests], layers=trace_list[0].layers,
                                     top_k=trace_list[0].top_k, n_experts=max(t.n_experts for t in trace_list),
                                     source=" + ".join(t.source for t in trace_list))
        prof, model, target, err = fit_profile(pooled, seed, iterations)
        out["pooled"] = {"profile": profile_entry(prof), "model": model, "trace": target, "error": err}
    stats = [f["trace"] for f in fits.values()]
    out["spread"] = {}
    for key in stats[0]:
        vals = np.array([st[key] for st in stats], dtype=float)
        vals = vals[np.isfinite(vals)]
        if vals.size:
            mean = float(vals.mean())
            out["spread"][key] = {"min": float(vals.min()), "max": float(vals.max()),
                                  "relative": float((vals.max() - vals.min()) / mean) if mean else 0.0}
    return out


SPREAD_REQUESTS = 48    # sampled requests per workload profile (as the catalog fits: --requests 48)


def workload_spread(prof, model, n_requests: int = SPREAD_REQUESTS, seed: int = 0) -> dict:
    """{statistic: [min, max]} of the headline statistics (routing_stats.headline) across the workload
    profiles *prof* pools (its ``workloads``), each sampled for *model* as n_requests requests of its own
    request_tokens from *seed*; rounded to 4 places as catalog/routing.toml stores them
    (``[profiles.X.spread]``, the command that made each is in the comment above it)."""
    from ..ingest import model as get_model
    from ..spec.routing import profile
    prof = profile(prof)
    if not prof.workloads:
        raise MoesimError(f"profile {prof.id} pools no workloads", "workloads")
    dims = RoutingDims.of(get_model(model))
    if dims.n_layers == 0:
        raise MoesimError("a dense model routes nothing", "model")
    stats = []
    for wid in prof.workloads:
        w = profile(wid)
        n = max(1, int(w.request_tokens))
        stats.append(S.headline(sample_requests(dims, w, int(n_requests), n, int(seed)), dims.n_experts))
    return {key: [round(min(st[key] for st in stats), 4), round(max(st[key] for st in stats), 4)]
            for key in stats[0]}

