"""Lowering a routing profile or a recorded trace to the arrays of ``ms_routing_t``."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ... import _lowering_cache
from ...errors import MoesimError
from ...spec.routing import N_SCENARIOS, RoutingProfile, per_layer
from . import routing_window as W


# ------------------------------------------------------------------------------- inclusion probabilities
def inclusion_probabilities(weights: np.ndarray, k: int) -> np.ndarray:
    """P(expert in a token's top-k) under Gumbel-top-k on ``weights`` (rows are independent cases).

    Rosén's approximation for order sampling with exponential order variables (Gumbel-top-k is
    the k smallest of Exp(w_i)): pi_i = 1 - exp(-w_i t) with t solving sum_i pi_i = k.
    f(t) = sum_i (1 - exp(-w_i t)) - k is increasing and concave, so Newton's method started at t = 0
    (below the root) rises monotonically to it; every row is solved at once.
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    w = w / w.sum(axis=1, keepdims=True)
    out = (w > 0).astype(float)
    rows = np.flatnonzero(np.count_nonzero(w, axis=1) > k)
    if rows.size:
        out[rows] = _solve_inclusion(w[rows], k)
    return out


def _solve_inclusion(w: np.ndarray, k: int, max_iter: int = 500) -> np.ndarray:
    """1 - exp(-w t) with t the root of f(t) = sum(1 - exp(-w t)) - k per row (Newton from below)."""
    t = np.zeros(w.shape[0])
    active = np.arange(w.shape[0])
    for _ in range(max_iter):
        wa, ta = w[active], t[active]
        e = np.exp(-wa * ta[:, None])
        f = (1.0 - e).sum(axis=1) - k
        slope = (wa * e).sum(axis=1)
        nxt = ta - f / slope
        # concavity keeps the iterates below the root; rounding can make a step stall or step back
        moved = nxt > ta * (1.0 + 4e-16)
        t[active] = np.maximum(ta, nxt)
        active = active[moved]
        if active.size == 0:
            break
    return 1.0 - np.exp(-w * t[:, None])


# ------------------------------------------------------------------------------- lowering
@dataclass(frozen=True)
class RoutingDims:
    """The routing shape of a model: MoE layers, experts, top-k, expert groups."""

    n_layers: int
    n_experts: int
    top_k: int
    n_group: int = 0
    topk_group: int = 0

    @classmethod
    def of(cls, model) -> "RoutingDims":
        moe = model.moe_layers
        if not moe:
            return cls(0, 0, 0)
        f = moe[0].ffn
        for l in moe:
            if (l.ffn.n_experts, l.ffn.top_k) != (f.n_experts, f.top_k):
                raise MoesimError(f"{model.id}: MoE layers differ in experts/top-k; the kernel needs one shape",
                                  "model")
        grouped = f.n_group > 1 and f.topk_group < f.n_group
        return cls(len(moe), f.n_experts, f.top_k, f.n_group if grouped else 0, f.topk_group if grouped else 0)


def lower(dims: RoutingDims, prof: RoutingProfile, seed: int = 0, prefetch: bool = False,
          scenarios: int = N_SCENARIOS, window: bool = True) -> dict:
    """Kernel routing tables for a profile. The popularity permutation is drawn from ``seed``. A profile
    with a prefill regime adds ``prefill_q``, that regime's inclusion probabilities (the same seed, so the
    same popularity ranks, with the prompt's own skew), which prefill costing reads instead of ``q``.
    A profile with token memory (multi-lag recency, cross-layer partners) gets the window tables the
    analytic path reads instead of independent picks, and its sampled marginals as ``q`` (routing_window;
    ``window=False``: the sampler's tables only, for callers that only sample)."""
    seed = int(seed) & (2**63 - 1)
    rt = dict(_lower_cached(dims, prof, seed, bool(prefetch), int(scenarios)))
    if window and dims.n_layers and W.has_memory(rt):
        rt.update(_window_cached(dims, prof, seed, int(scenarios)))
    if prof.prefill and dims.n_layers:
        rt["prefill_q"] = lower(dims, prof.regime("prefill"), seed, False, scenarios, window)["q"]
    return rt


@functools.lru_cache(maxsize=64)
def _window_cached(dims: RoutingDims, prof: RoutingProfile, seed: int, scenarios: int) -> dict:
    """The window tables of a memory profile and the q tables of its sampled marginals (one scenario:
    per-request skew is inside the windows), counted once per (dims, profile, seed) and kept in the
    persistent lowering cache (the counting costs 0.6-1.3 CPU s a profile; q_tables is derived again)."""
    key = (repr(dims), repr(prof), seed, scenarios, W.SCHEME)
    tabs = _lowering_cache.get("window", key)
    if tabs is None:
        tabs = W.window_tables(_lower_cached(dims, prof, seed, False, scenarios), seed)
        _lowering_cache.put("window", key, tabs)
    tabs = dict(tabs)
    from .._kernel import q_tables
    tabs["q_tables"] = q_tables(tabs["q"], dims.top_k)
    return tabs


@functools.lru_cache(maxsize=1024)
def _lower_cached(dims: RoutingDims, prof: RoutingProfile, seed: int, prefetch: bool, scenarios: int) -> dict:
    # a pure function of its arguments (frozen dataclasses of plain values: their repr is exact)
    key = (repr(dims), repr(prof), seed, prefetch, scenarios)
    packed = _lowering_cache.get("routing", key)
    if packed is not None:
        return _unpack(packed, dims.top_k)
    rt = _lower_tables(dims, prof, seed, prefetch, scenarios)
    _lowering_cache.put("routing", key, _pack(rt))
    return rt


_DERIVED = ("q_tables",)     # what the lowering cache leaves out and _unpack computes again (a third)


def _pack(rt: dict) -> tuple:
    """(the keys in order, the tables but q_tables and hot): what the lowering cache stores."""
    return tuple(rt), {k: v for k, v in rt.items() if k not in _DERIVED}


def _unpack(packed: tuple, k: int) -> dict:
    """The tables _lower_tables made, from _pack's: q_tables and hot as _lower_tables computes them."""
    order, kept = packed
    if "q" not in kept:
        return {name: kept[name] for name in order}
    from .._kernel import q_tables
    # hot (experts by popularity) is kept: a stable argsort per profile costs more than its bytes load
    derived = {"q_tables": q_tables(kept["q"], k)}
    return {name: derived[name] if name in derived else kept[name] for name in order}


def _lower_tables(dims: RoutingDims, prof: RoutingProfile, seed: int, prefetch: bool, scenarios: int) -> dict:
    L, E, k = dims.n_layers, dims.n_experts, dims.top_k
    rt = dict(n_layers=L, n_experts=E, top_k=k, n_group=dims.n_group, topk_group=dims.topk_group,
              concentration=float(prof.concentration), request_tokens=int(prof.request_tokens))
    if L == 0:
        return rt
    rng = np.random.default_rng([seed, 0x5EED])
    log_pop = np.empty((L, E))
    ranks = np.log(np.arange(1, E + 1, dtype=np.float64))
    fitted_s = per_layer(prof.layer_zipf_s, L) if prof.layer_zipf_s else None
    for l in range(L):
        s_l = prof.zipf_s * rng.uniform(1 - prof.jitter, 1 + prof.jitter)
        perm = rng.permutation(E)
        log_pop[l, perm] = -(s_l if fitted_s is None else fitted_s[l]) * ranks
    g = np.exp(log_pop - log_pop.max(axis=1, keepdims=True))
    g /= g.sum(axis=1, keepdims=True)
    if prof.concentration > 0:
        S = max(1, scenarios)
        w = np.stack([rng.dirichlet(np.maximum(prof.concentration * E * g[l], 1e-12))
                      for _s in range(S) for l in range(L)])
        q = inclusion_probabilities(np.maximum(w, 1e-300), k).reshape(S, L, E)
    else:
        q = inclusion_probabilities(g, k)[None]
    from .._kernel import q_tables
    rt.update(q_tables=q_tables(q, k), log_pop=log_pop, stickiness=prof.layer_stickiness(L),
              recall=np.full(L, prof.recall if prefetch else 0.0),
              hot=np.argsort(-log_pop, axis=1, kind="stable").astype(np.int32), q=q)
    rt.update(_memory_tables(dims, prof, np.random.default_rng([seed, 0xC0A7]), log_pop))
    return rt


PARTNER_BLOCK = 4   # popularity ranks a partner may move by (a block of ranks is shuffled)


def _partner_table(log_pop: np.ndarray, P: int, rng) -> np.ndarray:
    """[L, E, P] partners: partner i of the expert of popularity rank r at layer l is the expert of rank
    pi_i(r) at layer l + 1, pi_i a random bijection within blocks of PARTNER_BLOCK ranks. Every next-layer
    expert is the partner of exactly P experts and ranks move little, so following partners carries a
    layer's popularity over (neither concentrating nor flattening it, whatever the seed)."""
    L, E = log_pop.shape
    order = np.argsort(-log_pop, axis=1, kind="stable")
    rank = np.argsort(order, axis=1)
    out = np.zeros((L, E, P), dtype=np.int32)
    for l in range(L - 1):
        for i in range(P):
            pi = np.concatenate([b + rng.permutation(min(PARTNER_BLOCK, E - b)) for b in range(0, E, PARTNER_BLOCK)])
            out[l, :, i] = order[l + 1][pi[rank[l]]]
    return out


def _memory_tables(dims: RoutingDims, prof: RoutingProfile, rng, log_pop: np.ndarray) -> dict:
    """The multi-lag recency tables and the cross-layer partner table (each expert's n_partners next-layer
    partners, drawn from the seed), where the profile has them."""
    L, E, k = dims.n_layers, dims.n_experts, dims.top_k
    out = {}
    rec = prof.recency_tables(L)
    if rec is not None:
        out["recency"], out["recency_lag"] = rec
    if prof.layer_coupling and any(prof.layer_coupling) and L > 1:
        P = min(E, prof.n_partners or k)
        out["coupling"] = per_layer(prof.layer_coupling, L)
        out["partners"] = _partner_table(log_pop, P, rng)
    return out


def lower_trace(dims: RoutingDims, trace, prefetch_recall: float = 0.0) -> dict:
    """Kernel tables replaying a recorded trace; model MoE layer l reads trace layer l mod trace layers."""
    if trace.top_k != dims.top_k:
        raise MoesimError(f"trace has top-{trace.top_k} routing, the model top-{dims.top_k}", "trace")
    if trace.n_experts > dims.n_experts:
        raise MoesimError(f"trace uses {trace.n_experts} experts, the model has {dims.n_experts}", "trace")
    tokens = np.concatenate([np.asarray(r, dtype=np.int32) for r in trace.requests], axis=0)
    if tokens.ndim != 3 or tokens.shape[0] == 0:
        raise MoesimError("trace holds no tokens", "trace")
    if tokens.min() < 0 or tokens.max() >= dims.n_experts:
        raise MoesimError("trace expert id out of range", "trace")
    L, E, k, TL = dims.n_layers, dims.n_experts, dims.top_k, tokens.shape[1]
    freq = np.zeros((L, E))
    for l in range(L):
        freq[l] = np.bincount(tokens[:, l % TL, :].ravel(), minlength=E)
    q = freq / tokens.shape[0]
    from .._kernel import q_tables
    out = dict(q_tables=q_tables(q[None], k), n_layers=L, n_experts=E, top_k=k, n_group=0, topk_group=0,
               concentration=0.0, request_tokens=0, log_pop=np.log(freq + 0.5), stickiness=np.zeros(L),
               recall=np.full(L, float(prefetch_recall)), hot=np.argsort(-freq, axis=1, kind="stable").astype(np.int32),
               q=q[None], trace=tokens)
    if getattr(trace, "prompts", None):   # prefill costing reads the recorded prompt tokens' popularity
        prompt = np.concatenate([np.asarray(r, dtype=np.int32) for r in trace.prompts], axis=0)
        if prompt.ndim != 3 or prompt.shape[2] != k or prompt.min() < 0 or prompt.max() >= E:
            raise MoesimError("trace prompt tokens: top-k or expert ids out of range", "trace")
        out["prefill_q"] = _trace_q(prompt, L, E)[None]
    return out


def _trace_q(tokens: np.ndarray, L: int, E: int) -> np.ndarray:
    """[L, E] share of tokens choosing each expert; model layer l reads trace layer l mod trace layers."""
    TL = tokens.shape[1]
    return np.stack([np.bincount(tokens[:, l % TL, :].ravel(), minlength=E)[:E] for l in range(L)]) / tokens.shape[0]
