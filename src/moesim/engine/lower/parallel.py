"""Expert parallelism lowered for the decode kernel: the busiest rank's load from the routing profile
(with EPLB-style redundant experts), the dispatch/combine all-to-all bytes and the all-reduce bytes of a
TP x EP x attention-DP layout.

The layout is the runtime's ``decode`` parameters as ``--parallel`` set them (analysis.resolve.with_parallel):
``tensor_parallel`` (the GPUs work on one step together), ``data_parallel`` (attention-DP ranks D),
``expert_parallel`` (EP ranks P) and ``redundant_experts`` (R replicas per MoE layer).
"""
from __future__ import annotations

import numpy as np

from ...errors import MoesimError


def layout_degrees(rt, n_gpus: int) -> tuple:
    """(GPUs N, attention TP Ta, expert-parallel P, MoE TP) of a runtime's layout on ``n_gpus`` GPUs: attention
    is split Ta = N / D ways (attention DP replicates it on each of D ranks); routed experts are spread over P
    ranks, each expert split MoE-TP = N / P ways (TensorRT-LLM's "MoE TP4 x EP2" under attention TP8, RT §4)."""
    d = rt.decode
    n = n_gpus if (d.tensor_parallel and n_gpus > 1) else 1
    dp = max(1, min(d.data_parallel, n))
    ep = max(1, min(d.expert_parallel, n))
    return n, max(1, n // dp), ep, max(1, n // ep)


def _reduce_degrees(n: int, attn_tp: int, ep: int) -> tuple:
    """The ranks each of a layer's two all-reduces spans (1 = none): attention's over its Ta ranks; the FFN's
    over all N when every rank holds every token (attention TP: tensor- or expert-parallel partial outputs
    are summed, vLLM -tp N [--enable-expert-parallel]), else over the MoE-TP ranks N / P (attention DP: the
    combine all-to-all brings each token's expert outputs home)."""
    dp = max(1, n // attn_tp)
    return attn_tp, (n if dp == 1 else max(1, n // ep))


def allreduce_count(n: int, attn_tp: int, ep: int) -> int:
    """All-reduces per layer (0, 1 or 2; see _reduce_degrees)."""
    return sum(1 for t in _reduce_degrees(n, attn_tp, ep) if t > 1)


def allreduce_bytes(hidden: int, n: int, attn_tp: int, ep: int) -> float:
    """All-reduce bytes per token per layer: a bf16 all-reduce of the hidden state over t ranks (a ring moves
    2 (t - 1) / t of the tensor per rank) for each of the layer's all-reduces (_reduce_degrees)."""
    return sum(2.0 * hidden * 2 * (t - 1) / t for t in _reduce_degrees(n, attn_tp, ep) if t > 1)


def kv_heads(m) -> int:
    """The fewest KV heads any attention layer keeps (MLA: one latent head; linear attention: its heads),
    computed once per model."""
    return m.cached_view("_cache_kv_heads", lambda: _kv_heads(m))


def _kv_heads(m) -> int:
    heads = []
    for layer in m.layers:
        a = layer.attention
        if a.kind == "mla":
            heads.append(1)
        elif a.kind in ("kda", "gdn"):
            heads.append(max(1, a.lin_v_heads or a.n_heads))
        else:
            heads.append(max(1, a.n_kv_heads or a.n_heads))
    return min(heads) if heads else 1


def replication(m, n: int, attn_tp: int) -> tuple:
    """(attention weights, KV) read factors: the bytes the GPUs read together over those counted once.
    Attention DP replicates the attention weights on each of its D = N / Ta ranks; within a rank the KV
    heads split over at most as many TP ranks as there are KV heads, the rest read copies (MLA's latent KV
    is duplicated on every TP rank, RT §3.2)."""
    dp = max(1, n // attn_tp)
    return float(dp), attn_tp / min(attn_tp, kv_heads(m))


def alltoall_bytes(hidden: int, top_k: int, ep: int, d, dp: int = 2) -> float:
    """Dispatch + combine bytes that one rank sends per step token per MoE layer; none unless attention is
    data-parallel (dp > 1): under attention TP every rank already holds every token (vLLM's "TP8+EP"; its
    all-to-all backends serve "any EP+DP configuration", docs.vllm.ai Expert Parallel Deployment). The
    step's tokens are split evenly over the P ranks, each rank dispatching its own; each token goes to its
    top-k experts, of which (P - 1) / P sit on other ranks: fp8 activations with their per-128 scales out,
    bf16 results back (DeepEP's FP8 dispatch, BF16 combine; runtimes.toml alltoall_*)."""
    if ep <= 1 or top_k <= 0 or dp <= 1:
        return 0.0
    per_elem = d.alltoall_dispatch_bytes + d.alltoall_scale_bytes + d.alltoall_combine_bytes
    return top_k * hidden * per_elem * (ep - 1) / ep / ep


# ------------------------------------------------------------------------------- per-rank load
def slot_shares(qbar: np.ndarray, ep: int, redundant: int = 0) -> np.ndarray:
    """[L, P, S] selection probability of each expert slot on each rank (S = (E + R) / P slots per rank).

    Without replicas experts sit in contiguous blocks (vLLM's ``linear`` expert placement; the routing's
    popularity permutation is random per layer, so the blocks hold random popularities). With R replicas
    (EPLB): R times, the expert with the largest per-replica share gains a replica; then the slots, hottest
    first, go to the least-loaded rank that has a free slot (greedy balanced packing). Each replica takes an
    equal share of its expert's tokens."""
    L, E = qbar.shape
    if (E + redundant) % ep:
        raise MoesimError(f"{E} experts + {redundant} redundant must split evenly over {ep} EP ranks",
                          "redundant_experts")
    S = (E + redundant) // ep
    if redundant == 0:
        return qbar.reshape(L, ep, S).copy()
    rows = np.arange(L)
    reps = np.ones((L, E))
    for _ in range(redundant):
        reps[rows, np.argmax(qbar / reps, axis=1)] += 1
    share = np.repeat((qbar / reps).ravel(), reps.astype(np.int64).ravel()).reshape(L, E + redundant)
    share = -np.sort(-share, axis=1)
    out = np.zeros((L, ep, S))
    load = np.zeros((L, ep))
    used = np.zeros((L, ep), dtype=np.int64)
    for j in range(E + redundant):
        r = np.argmin(np.where(used < S, load, np.inf), axis=1)
        out[rows, r, used[rows, r]] = share[:, j]
        load[rows, r] += share[:, j]
        used[rows, r] += 1
    return out


def _expected_max_count(p: np.ndarray) -> np.ndarray:
    """E[max over ranks of the number of selected slots] per layer, for independent slots with inclusion
    probabilities ``p`` [L, P, S]: each rank's count is Poisson-binomial (built slot by slot), and
    E[max] = sum_x (1 - prod_r P(count_r <= x))."""
    L, P, S = p.shape
    pmf = np.zeros((L, P, S + 1))
    pmf[:, :, 0] = 1.0
    for s in range(S):
        ps = p[:, :, s:s + 1]
        pmf[:, :, 1:] = pmf[:, :, 1:] * (1.0 - ps) + pmf[:, :, :-1] * ps
        pmf[:, :, 0] *= 1.0 - ps[:, :, 0]
    cdf = np.clip(np.cumsum(pmf, axis=2), 0.0, 1.0)
    return (1.0 - np.prod(cdf[:, :, :S], axis=1)).sum(axis=1)


def _expected_max_normal(mu: np.ndarray, var: np.ndarray, points: int = 1025) -> np.ndarray:
    """E[max over ranks] of independent normals N(mu, var) [L, P] (counts, so clipped at 0):
    the integral of 1 - prod_r Phi((x - mu_r) / sigma_r) over x >= 0 by the trapezoid rule."""
    from scipy.special import ndtr
    sd = np.sqrt(np.maximum(var, 0.0))
    hi = (mu + 9.0 * sd).max(axis=1) + 1e-12
    x = np.linspace(0.0, 1.0, points)[None, :] * hi[:, None]                   # [L, X]
    gap = x[:, None, :] - mu[:, :, None]
    cdf = np.where(sd[:, :, None] > 0, ndtr(gap / np.maximum(sd[:, :, None], 1e-300)), (gap >= 0).astype(float))
    f = 1.0 - np.prod(cdf, axis=1)
    dx = np.diff(x, axis=1)
    return (0.5 * (f[:, 1:] + f[:, :-1]) * dx).sum(axis=1)


_RANK_LOADS: dict = {}      # (qbar bytes and shape, tokens, ep, redundant) -> (load_e, load_p), read-only


def rank_load(qbar: np.ndarray, tokens: int, ep: int, redundant: int = 0) -> tuple:
    """:func:`_rank_load`, memoised on its inputs (a sweep asks for the same routing, step size and EP
    degree under every layout, draft count and machine that share them); returns fresh copies."""
    qbar = np.asarray(qbar, dtype=np.float64)
    key = (qbar.tobytes(), qbar.shape, float(max(1, tokens)), int(ep), int(redundant))
    hit = _RANK_LOADS.get(key)
    if hit is None:
        if len(_RANK_LOADS) >= 512:
            _RANK_LOADS.clear()
        hit = _RANK_LOADS[key] = _rank_load(qbar, tokens, ep, redundant)   # a race computes it twice
    return hit[0].copy(), hit[1].copy()


def _rank_load(qbar: np.ndarray, tokens: int, ep: int, redundant: int = 0) -> tuple:
    """(experts load, pairs load) per MoE layer: the busiest EP rank's expected work over the mean rank's,
    at a step of ``tokens`` tokens, from each expert's per-token selection probability ``qbar`` [L, E].

    Experts (weight bytes read): a slot is read when one of the step's tokens picks it, probability
    1 - (1 - share)^tokens; the mean is the kernel's own (the distinct experts of the step over P), so
    replicas that are both read count against the busiest rank. Pairs (FLOPs): a rank's token-expert pairs
    are a sum over tokens, normal with mean tokens x sum(share) and variance tokens x sum(share (1 - share));
    at one token they are the experts count. Picks of different experts are taken as independent."""
    qbar = np.asarray(qbar, dtype=np.float64)
    L, E = qbar.shape
    if ep <= 1 or L == 0:
        return np.ones(L), np.ones(L)
    T = float(max(1, tokens))
    share = slot_shares(qbar, ep, redundant)
    p_slot = 1.0 - np.exp(T * np.log1p(-np.minimum(share, 1.0 - 1e-16)))
    p_expert = 1.0 - np.exp(T * np.log1p(-np.minimum(qbar, 1.0 - 1e-16)))
    mean_e = p_expert.sum(axis=1) / ep
    load_e = np.where(mean_e > 0, _expected_max_count(p_slot) / np.maximum(mean_e, 1e-300), 1.0)
    if T == 1.0:
        return load_e, load_e.copy()
    mu = T * share.sum(axis=2)
    var = T * (share * (1.0 - share)).sum(axis=2)
    mean_p = mu.sum(axis=1) / ep
    load_p = np.where(mean_p > 0, _expected_max_normal(mu, var) / np.maximum(mean_p, 1e-300), 1.0)
    return load_e, np.maximum(load_p, 1.0)


def layer_loads(moe_index: np.ndarray, routing: dict | None, tokens: int, ep: int, redundant: int) -> tuple:
    """(ep_load_experts, ep_load_pairs) per model layer (1 on dense layers and without EP) from the
    routing tables' selection probabilities (their mean over the request scenarios)."""
    n = len(moe_index)
    le, lp = np.ones(n), np.ones(n)
    if ep <= 1 or not routing or routing.get("q") is None:
        return le, lp
    qbar = np.asarray(routing["q"], dtype=np.float64).mean(axis=0)
    qbar = qbar / np.maximum(qbar.sum(axis=1, keepdims=True), 1e-300) * float(routing["top_k"])
    e_row, p_row = rank_load(qbar, tokens, ep, redundant)
    moe = np.asarray(moe_index) >= 0
    le[moe] = e_row[np.asarray(moe_index)[moe]]
    lp[moe] = p_row[np.asarray(moe_index)[moe]]
    return le, lp
