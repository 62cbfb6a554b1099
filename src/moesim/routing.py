"""Routing profiles (the generative model of expert choice) and their lowering to kernel tables.

A :class:`RoutingProfile` holds the parameters of ``catalog/routing.toml``; :func:`lower` turns a
profile (or a recorded :class:`~moesim.traces.Trace`) into the arrays of ``ms_routing_t``: per-layer
log-popularity, stickiness, prefetch recall, the popularity order (for static pinning) and, for the
analytic path, per-token inclusion probabilities ``q[scenario, layer, expert]``.

``python -m moesim.routing fit TRACE`` fits a profile to a real trace (see :func:`fit_profile`).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
from dataclasses import dataclass, fields, replace

import numpy as np

from . import _catalog
from .errors import MoesimError, unknown_id

N_SCENARIOS = 4   # request draws averaged by the analytic path when profiles have per-request skew


@dataclass(frozen=True)
class RoutingProfile:
    id: str
    zipf_s: float
    jitter: float
    concentration: float
    stickiness: float
    first_stickiness: float
    last_stickiness: float
    request_tokens: int
    recall: float
    source: str = ""

    def layer_stickiness(self, n_layers: int) -> np.ndarray:
        p = np.full(n_layers, float(self.stickiness))
        if n_layers > 1:
            p[-1] = self.last_stickiness
        p[0] = self.first_stickiness
        return p


def _table() -> dict:
    return _catalog.load("routing")


def profile_ids() -> list:
    return sorted(_table()["profiles"])


def profile(id_or_profile=None, family: str | None = None, **overrides) -> RoutingProfile:
    """A profile by id, or the one the model family uses; keyword arguments override fields."""
    if isinstance(id_or_profile, RoutingProfile):
        base = id_or_profile
    else:
        t = _table()
        key = id_or_profile
        if key is None:
            key = t["families"].get(family or "", "generic")
        key = str(key).strip().lower()
        if key not in t["profiles"]:
            raise unknown_id("routing profile", key, t["profiles"], "routing")
        entry = dict(t["defaults"])
        entry.update(t["profiles"][key])
        names = {f.name for f in fields(RoutingProfile)}
        base = RoutingProfile(id=key, **{k: v for k, v in entry.items() if k in names and k != "id"})
    if overrides:
        base = replace(base, **overrides)
    _check(base)
    return base


def _check(p: RoutingProfile) -> None:
    for name in ("zipf_s", "jitter", "concentration"):
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise MoesimError(f"must be a finite number >= 0, got {v!r}", name)
    if p.jitter >= 1:
        raise MoesimError(f"must be < 1, got {p.jitter}", "jitter")
    for name in ("stickiness", "first_stickiness", "last_stickiness", "recall"):
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or not (0.0 <= v <= 1.0):
            raise MoesimError(f"must be a probability in [0, 1], got {v!r}", name)
    if isinstance(p.request_tokens, bool) or not isinstance(p.request_tokens, int) or p.request_tokens < 0:
        raise MoesimError(f"must be an integer >= 0, got {p.request_tokens!r}", "request_tokens")


# ------------------------------------------------------------------------------- inclusion probabilities
def inclusion_probabilities(weights: np.ndarray, k: int) -> np.ndarray:
    """P(expert in a token's top-k) under Gumbel-top-k on ``weights`` (rows are independent cases).

    Rosén's approximation for order sampling with exponential order variables (Gumbel-top-k is
    the k smallest of Exp(w_i)): pi_i = 1 - exp(-w_i t) with t solving sum_i pi_i = k.
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    w = w / w.sum(axis=1, keepdims=True)
    out = np.empty_like(w)
    for r in range(w.shape[0]):
        row = w[r]
        if k >= np.count_nonzero(row):
            out[r] = (row > 0).astype(float)
            continue
        lo, hi = 0.0, 1.0
        while np.sum(1 - np.exp(-row * hi)) < k:
            lo, hi = hi, hi * 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if np.sum(1 - np.exp(-row * mid)) < k:
                lo = mid
            else:
                hi = mid
        out[r] = 1 - np.exp(-row * hi)
    return out


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
          scenarios: int = N_SCENARIOS) -> dict:
    """Kernel routing tables for a profile. The popularity permutation is drawn from ``seed``."""
    return dict(_lower_cached(dims, prof, int(seed) & (2**63 - 1), bool(prefetch), int(scenarios)))


@functools.lru_cache(maxsize=64)
def _lower_cached(dims: RoutingDims, prof: RoutingProfile, seed: int, prefetch: bool, scenarios: int) -> dict:
    L, E, k = dims.n_layers, dims.n_experts, dims.top_k
    rt = dict(n_layers=L, n_experts=E, top_k=k, n_group=dims.n_group, topk_group=dims.topk_group,
              concentration=float(prof.concentration), request_tokens=int(prof.request_tokens))
    if L == 0:
        return rt
    rng = np.random.default_rng([seed, 0x5EED])
    log_pop = np.empty((L, E))
    ranks = np.log(np.arange(1, E + 1, dtype=np.float64))
    for l in range(L):
        s_l = prof.zipf_s * rng.uniform(1 - prof.jitter, 1 + prof.jitter)
        perm = rng.permutation(E)
        log_pop[l, perm] = -s_l * ranks
    g = np.exp(log_pop - log_pop.max(axis=1, keepdims=True))
    g /= g.sum(axis=1, keepdims=True)
    if prof.concentration > 0:
        S = max(1, scenarios)
        q = np.empty((S, L, E))
        for s in range(S):
            w = np.stack([rng.dirichlet(np.maximum(prof.concentration * E * g[l], 1e-12)) for l in range(L)])
            q[s] = inclusion_probabilities(np.maximum(w, 1e-300), k)
    else:
        q = inclusion_probabilities(g, k)[None]
    from ._kernel import q_tables
    rt.update(q_tables=q_tables(q, k), log_pop=log_pop, stickiness=prof.layer_stickiness(L),
              recall=np.full(L, prof.recall if prefetch else 0.0),
              hot=np.argsort(-log_pop, axis=1, kind="stable").astype(np.int32), q=q)
    return rt


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
    from ._kernel import q_tables
    return dict(q_tables=q_tables(q[None], k), n_layers=L, n_experts=E, top_k=k, n_group=0, topk_group=0, concentration=0.0, request_tokens=0,
                log_pop=np.log(freq + 0.5), stickiness=np.zeros(L), recall=np.full(L, float(prefetch_recall)),
                hot=np.argsort(-freq, axis=1, kind="stable").astype(np.int32), q=q[None], trace=tokens)


# ------------------------------------------------------------------------------- statistics
def step_unions(tokens: np.ndarray) -> tuple:
    """Batch-1 step unions of a [T, L, k] token array: (sel [T, L, k], nsel [T, L]), each token's
    distinct experts in expert-id order (the order the decode kernel serves a step in)."""
    T, L, k = tokens.shape
    srt = np.sort(np.asarray(tokens, dtype=np.int32), axis=2)
    nsel = np.full((T, L), k, dtype=np.int32)
    sel = srt.copy()
    if k > 1:
        dup = srt[:, :, 1:] == srt[:, :, :-1]
        for t, l in zip(*np.nonzero(np.any(dup, axis=2))):
            u = np.unique(srt[t, l])
            sel[t, l, :len(u)] = u
            nsel[t, l] = len(u)
    return sel, nsel


def cache_hit_rates(requests, n_experts: int, capacity: int, policy: str = "lru", hot=None) -> np.ndarray:
    """Per-layer hit rate of a per-layer expert cache of ``capacity`` replaying batch-1 requests
    (each request starts with a cold cache), in the C kernel."""
    from . import _kernel
    from .decode import POLICIES
    if policy not in POLICIES:
        raise unknown_id("cache policy", policy, POLICIES, "policy")
    hits = acc = 0.0
    for r in requests:
        sel, nsel = step_unions(np.asarray(r))
        code, h, a = _kernel.cache_replay(sel, nsel, int(n_experts), int(capacity), POLICIES[policy], hot, 0)
        if code:
            raise MoesimError(f"cache replay failed: {_kernel.strerror(code)}", "trace")
        hits, acc = hits + h, acc + a
    return hits / np.maximum(acc, 1)


def reuse(requests) -> float:
    """Fraction of a token's k experts (same layer) that the next token of the request picks again."""
    num = den = 0
    for r in requests:
        r = np.asarray(r)
        if len(r) < 2:
            continue
        prev, nxt = r[:-1], r[1:]
        num += int(np.sum(np.any(nxt[..., :, None] == prev[..., None, :], axis=-1)))
        den += nxt.size
    return num / den if den else 0.0


def sample_requests(dims: RoutingDims, prof: RoutingProfile, n_requests: int, tokens: int, seed: int = 0) -> list:
    """``n_requests`` independent requests of ``tokens`` decode tokens each ([tokens, layers, k]
    arrays) drawn by the C kernel's sampler; request i uses stream (seed, i)."""
    from . import _kernel
    from .errors import KernelError
    rt = lower(dims, profile(prof, request_tokens=0), seed)
    out = []
    for i in range(n_requests):
        cols = dict(batch=[1], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[tokens], warmup=[0],
                    policy=[0], mode=[0], seed=[seed], index=[i])
        code, picks = _kernel.route_sample(rt, cols)
        if code:
            raise KernelError(f"routing sampler: {_kernel.strerror(code)}")
        out.append(picks[:, 0, 0])
    return out


def trace_stats(requests, n_experts: int, top_k: int) -> dict:
    """The statistics a profile is fitted to: reuse R and mean per-layer LRU hit rate at C = 2k, 3k."""
    return {"reuse": reuse(requests),
            "lru_2k": float(np.mean(cache_hit_rates(requests, n_experts, 2 * top_k))),
            "lru_3k": float(np.mean(cache_hit_rates(requests, n_experts, min(n_experts, 3 * top_k))))}


FIT_GRID = dict(zipf_s=(0.2, 0.4, 0.6, 0.8), concentration=(0.5, 1.0, 2.0, 4.0, 8.0),
                stickiness=(0.0, 0.1, 0.2, 0.3, 0.4))
_FIT_KEYS = ("zipf_s", "concentration", "stickiness")


def fit_profile(trace, n_requests: int = 24, seed: int = 0, grid=None, refine: int = 2) -> tuple:
    """Grid-search (s, concentration, stickiness) so sampled requests match the trace's reuse and
    LRU hit rates at 2k and 3k, then ``refine`` rounds of bisection around the best point (each
    round tries the midpoints between the best value and its neighbours on every axis). Every
    candidate is sampled with the same ``seed`` (common random numbers), ``n_requests`` requests
    of the trace's median request length (clipped to 64..512 tokens) over min(layers, 8) layers.
    Returns (profile, model stats, trace stats, squared error)."""
    E, k = trace.n_experts, trace.top_k
    target = trace_stats(trace.requests, E, k)
    lengths = [len(r) for r in trace.requests]
    tokens = int(np.clip(np.median(lengths), 64, 512))
    L = min(len(trace.layers), 8)
    dims = RoutingDims(L, E, k)
    grid = {**FIT_GRID, **(grid or {})}
    axes = {key: sorted({float(v) for v in grid[key]}) for key in _FIT_KEYS}
    if any(not a for a in axes.values()):
        raise MoesimError(f"fit grid needs values for each of {', '.join(_FIT_KEYS)}", "grid")
    seen = {}

    def evaluate(point):
        if point not in seen:
            s, beta, p = point
            prof = RoutingProfile(id="fit", zipf_s=s, jitter=0.2, concentration=beta, stickiness=p,
                                  first_stickiness=p, last_stickiness=p, request_tokens=tokens, recall=0.8,
                                  source="fit")
            _check(prof)
            st = trace_stats(sample_requests(dims, prof, n_requests, tokens, seed), E, k)
            seen[point] = (prof, st, target, sum((st[key] - target[key]) ** 2 for key in target))
        return seen[point]

    def search(candidates):
        for point in candidates:
            evaluate(point)
        return min(seen.values(), key=lambda b: (b[3], [getattr(b[0], key) for key in _FIT_KEYS]))

    best = search(itertools.product(*(axes[key] for key in _FIT_KEYS)))
    for _ in range(max(0, int(refine))):
        local = []
        for key in _FIT_KEYS:
            a, v = axes[key], getattr(best[0], key)
            i = a.index(v)
            mids = [round(0.5 * (v + a[j]), 6) for j in (i - 1, i + 1) if 0 <= j < len(a)]
            axes[key] = sorted(set(a) | set(mids))
            local.append([v] + mids)
        best = search(itertools.product(*local))
    return best


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moesim.routing", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit a routing profile to a recorded trace")
    f.add_argument("trace")
    f.add_argument("--requests", type=int, default=24)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--refine", type=int, default=2, help="bisection rounds after the grid (default 2)")
    args = ap.parse_args(argv)
    from . import traces
    try:
        tr = traces.load(args.trace)
        prof, st, target, err = fit_profile(tr, args.requests, args.seed, refine=args.refine)
    except MoesimError as exc:
        print(f"moesim: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"profile": {k: getattr(prof, k) for k in ("zipf_s", "concentration", "stickiness",
                                                                  "request_tokens")},
                      "model": st, "trace": target, "squared_error": err}, indent=2))
    return 0


if __name__ == "__main__":
    # `python -m moesim.routing` runs this file as __main__, a second copy of the module whose
    # RoutingProfile is not the class moesim.decode checks against: run the package's copy.
    from moesim import routing as _routing
    sys.exit(_routing._main())
