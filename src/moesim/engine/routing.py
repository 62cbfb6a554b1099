"""Kernel drivers over routing: sampled requests, per-step unions, cache hit rates, reuse."""
from __future__ import annotations

import numpy as np

from ..errors import MoesimError, unknown_id
from .glue import handle_library_error
from .lower.routing import RoutingDims, lower
from ..spec.routing import RoutingProfile, profile


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
    (each request starts with a cold cache), in the C kernel. ``hot`` [layers, experts]: the experts
    the static policy pins, most popular first (default: in id order)."""
    from . import _kernel
    from .codes import POLICIES, POLICY_STATIC
    if policy not in POLICIES:
        raise unknown_id("cache policy", policy, POLICIES, "policy")
    hits = acc = 0.0
    for r in requests:
        sel, nsel = step_unions(np.asarray(r))
        pinned = hot
        if pinned is None and POLICIES[policy] == POLICY_STATIC:
            pinned = np.tile(np.arange(int(n_experts), dtype=np.int32), (sel.shape[1], 1))
        code, h, a = _kernel.cache_replay(sel, nsel, int(n_experts), int(capacity), POLICIES[policy], pinned, 0)
        handle_library_error(code, "ms_cache_replay")
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


def sample_requests(dims: RoutingDims, prof: RoutingProfile, n_requests: int, tokens, seed: int = 0) -> list:
    """``n_requests`` independent requests of ``tokens`` decode tokens each ([tokens, layers, k]
    arrays) drawn by the C kernel's sampler; request i uses stream (seed, i). ``tokens`` may be a list
    of per-request lengths: each stream re-seeds at every step, so request i is then the first
    tokens[i] tokens of the request a common length would give."""
    from . import _kernel
    rt = lower(dims, profile(prof, request_tokens=0), seed, window=False)
    lengths = [int(tokens)] * n_requests if np.ndim(tokens) == 0 else [int(n) for n in tokens]
    if len(lengths) != n_requests:
        raise MoesimError(f"{len(lengths)} request lengths for {n_requests} requests", "tokens")
    out = []
    for i in range(n_requests):
        if lengths[i] <= 0:
            out.append(np.zeros((0, dims.n_layers, dims.top_k), dtype=np.int32))
            continue
        cols = dict(batch=[1], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[lengths[i]], warmup=[0],
                    policy=[0], mode=[0], seed=[seed], index=[i])
        code, picks = _kernel.route_sample(rt, cols)
        handle_library_error(code, "ms_route_sample", i)
        out.append(picks[:, 0, 0])
    return out
