"""Routing statistics of a set of requests ([tokens, layers, k] expert ids), per layer where it matters:
reuse at a lag, layer-to-layer co-activation predictor recall, popularity Gini, per-request divergence
from the global popularity, batch union. The routing fit matches them; ``moesim routing stats`` prints them.

Definitions (docs/cost-model.md "Routing"): reuse at lag d is |S_t & S_{t-d}| / k within a request; the
co-activation predictor scores layer l + 1's experts by their summed co-occurrence counts with layer l's
experts (a table counted on the same requests) and takes the top k; Gini is of per-expert counts; the
divergence is the token-weighted total-variation distance between a request's and the set's per-layer
expert distributions; the batch union is the distinct experts of B tokens of B different requests.
"""
from __future__ import annotations

import numpy as np


def _layers(requests) -> int:
    return int(requests[0].shape[1])


def reuse_by_layer(requests, lag: int) -> np.ndarray:
    """[layers] reuse at `lag` (nan where no request is longer than the lag)."""
    L = _layers(requests)
    num, den = np.zeros(L), np.zeros(L)
    for r in requests:
        if len(r) <= lag:
            continue
        now, then = r[lag:], r[:-lag]
        same = (now[:, :, :, None] == then[:, :, None, :]).any(axis=3)      # [T - lag, L, k]
        num += same.sum(axis=(0, 2))
        den += same.shape[0] * same.shape[2]
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def _coactivation(requests, n_experts: int) -> np.ndarray:
    """[layers - 1, E, E] co-occurrence counts of layer l's and layer l + 1's experts in one token."""
    L, E = _layers(requests), n_experts
    tab = np.zeros((max(L - 1, 0), E * E))
    for r in requests:
        for l in range(L - 1):
            pairs = (r[:, l, :, None] * E + r[:, l + 1, None, :]).ravel()
            tab[l] += np.bincount(pairs, minlength=E * E)
    return tab.reshape(-1, E, E)


def coactivation_recall_by_layer(requests, n_experts: int, table_requests=None) -> np.ndarray:
    """[layers] recall of the co-activation predictor of layer l from layer l - 1 (entry 0 is nan);
    the table is counted on `table_requests` (default: the same requests)."""
    L = _layers(requests)
    out = np.full(L, np.nan)
    if L < 2:
        return out
    tab = _coactivation(requests if table_requests is None else table_requests, n_experts)
    k = requests[0].shape[2]
    tie = 1e-9 * np.arange(n_experts)[::-1]
    for l in range(L - 1):
        hit = tot = 0
        for r in requests:
            score = tab[l][r[:, l, :]].sum(axis=1) + tie
            pred = np.argpartition(-score, k - 1, axis=1)[:, :k] if k < n_experts else np.argsort(-score, axis=1)
            hit += int((pred[:, :, None] == r[:, l + 1, None, :]).any(axis=2).sum())
            tot += pred.shape[0] * k
        out[l + 1] = hit / tot
    return out


def layer_counts(requests, n_experts: int) -> np.ndarray:
    """[layers, E] selections of each expert."""
    L = _layers(requests)
    flat = np.concatenate([r.reshape(-1, L, r.shape[2]) for r in requests])
    return np.stack([np.bincount(flat[:, l].ravel(), minlength=n_experts) for l in range(L)]).astype(float)


def gini_by_layer(requests, n_experts: int) -> np.ndarray:
    c = np.sort(layer_counts(requests, n_experts), axis=1)
    n = c.shape[1]
    w = 2 * np.arange(1, n + 1) - n - 1
    tot = c.sum(axis=1)
    return np.where(tot > 0, c @ w / (n * np.maximum(tot, 1e-300)), 0.0)


def divergence(requests, n_experts: int) -> float:
    """Token-weighted mean total-variation distance of each request's per-layer expert distribution
    from the set's (nan for fewer than two requests)."""
    if len(requests) < 2:
        return float("nan")
    glob = layer_counts(requests, n_experts)
    glob /= glob.sum(axis=1, keepdims=True)
    num = den = 0.0
    for r in requests:
        p = layer_counts([r], n_experts)
        p /= p.sum(axis=1, keepdims=True)
        num += len(r) * 0.5 * np.abs(p - glob).sum(axis=1).mean()
        den += len(r)
    return num / den


def batch_union(requests, batch: int, seed: int = 0, trials: int = 200) -> float:
    """Mean distinct experts per layer among `batch` tokens at random positions of distinct requests
    (random tokens of the whole set when it holds fewer than `batch` requests)."""
    rng = np.random.default_rng(seed)
    flat = np.concatenate(requests)
    owner = np.concatenate([np.full(len(r), i) for i, r in enumerate(requests)])
    start = np.concatenate([[0], np.cumsum([len(r) for r in requests])])
    tot = 0.0
    for _ in range(trials):
        if len(requests) >= batch:
            reqs = rng.choice(len(requests), batch, replace=False)
            rows = start[reqs] + (rng.random(batch) * (start[reqs + 1] - start[reqs])).astype(int)
        else:
            rows = rng.integers(len(owner), size=batch)
        toks = np.sort(flat[rows].transpose(1, 0, 2).reshape(flat.shape[1], -1), axis=1)   # [L, B * k]
        tot += float(np.mean(1 + (np.diff(toks, axis=1) != 0).sum(axis=1)))
    return tot / trials


LAGS = (1, 2, 4, 8, 16, 32)


def summary(requests, n_experts: int) -> dict:
    """The routing statistics of ``moesim routing stats``: means over layers and the per-layer profiles."""
    k = int(requests[0].shape[2])
    reuse = {d: reuse_by_layer(requests, d) for d in LAGS}
    coact = coactivation_recall_by_layer(requests, n_experts)
    gini = gini_by_layer(requests, n_experts)
    out = {"requests": len(requests), "tokens": int(sum(len(r) for r in requests)), "layers": _layers(requests),
           "experts": int(n_experts), "top_k": k}
    out.update({f"reuse_lag{d}": _mean(v) for d, v in reuse.items()})
    out.update(lru_rates(requests, n_experts))
    for B in (8, 32):
        out[f"union_b{B}"] = batch_union(requests, B)
    out.update(coact_recall=_mean(coact), gini=float(np.mean(gini)), divergence=divergence(requests, n_experts))
    out["per_layer"] = {"reuse_lag1": _list(reuse[1]), "reuse_lag8": _list(reuse[8]), "gini": _list(gini),
                        "coact_recall": _list(coact)}
    return out


LRU_SIZES = (1, 2, 4)   # cache sizes in multiples of top-k that ``moesim routing stats`` reports


def lru_rates(requests, n_experts: int) -> dict:
    """{"lru_1k", "lru_2k", "lru_4k"}: mean per-layer LRU hit rate at a cache of m x top-k experts."""
    from ..engine.routing import cache_hit_rates
    k = int(requests[0].shape[2])
    return {f"lru_{m}k": float(np.mean(cache_hit_rates(requests, n_experts, min(m * k, n_experts))))
            for m in LRU_SIZES}


def headline(requests, n_experts: int) -> dict:
    """The headline statistics a profile's workload spread ranges over: consecutive-token reuse
    (reuse_lag1) and the LRU hit rates of :func:`lru_rates`."""
    return {"reuse_lag1": _mean(reuse_by_layer(requests, 1)), **lru_rates(requests, n_experts)}


def _mean(v) -> float:
    v = np.asarray(v, dtype=float)
    return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def _list(v) -> list:
    return [None if not np.isfinite(x) else round(float(x), 4) for x in np.asarray(v, dtype=float)]
