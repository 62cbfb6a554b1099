"""The analytic path's reading of a routing model with token memory (issue 15): window statistics of one
sequence, tabulated once per lowered profile from the routing model itself (its own sampler).

A profile with multi-lag memory (``layer_recency``) or cross-layer partners (``layer_coupling``) makes a
sequence's tokens depend on each other and on the layer above, so the per-token inclusion probabilities of
its Zipf popularity (what ``inclusion_probabilities`` gives) are neither the experts' real marginals nor
independent from token to token. What the analytic path needs is, per layer and expert e, the stationary
probability pi_e(n) that e appears among n consecutive tokens of one sequence:

* distinct experts per step of B sequences x tps tokens: sum_e 1 - (1 - pi_e(tps))^B (sequences are
  independent requests, so absence multiplies);
* Che's approximation for a step-level LRU cache of C slots, generalised to a stationary correlated
  stream: an expert is resident iff it was used in the last T steps, T solving
  sum_e 1 - (1 - pi_e(T tps))^B = C; a step's expected hits are
  sum_e P(e in step and in the T steps before) = sum_e 1 - a_e(tps) - a_e(T tps) + a_e((T + 1) tps)
  with a_e(n) = (1 - pi_e(n))^B (independent picks reduce this to Che's sum_e p_e (1 - (1 - p_e)^T));
* the marginal pi_e(1) (the q every other consumer reads: pinned mass, expert-parallel loads, prefill).

pi_e(n) has no closed form under the v2 model (partners, memory and the Gumbel race interact), so it is
counted on WINDOW_STREAMS sampled streams of WINDOW_TOKENS tokens each (requests restart at the profile's
own request length, as in Monte Carlo), drawn by the C sampler from streams (seed, WINDOW_INDEX + i) —
``seed`` the lowering's seed, so the tables describe the same popularity permutation and partner table the
sampler uses. Deterministic: a pure function of (dims, profile, seed) (cached per process by
lower/routing.py; plain numpy arrays, so a persistent cache may store them).
Counting (csrc/ms_window.c, twin reference/window.py window_count): every window of n tokens inside a
stream (N - n + 1 of them) counts, for all n in one pass over the picks: a window misses e iff it lies in
one of e's absence runs, and a run of g tokens holds max(0, g - n + 1) windows of n. pi_e(n) = windows
holding e / windows, summed over the streams.
"""
from __future__ import annotations

import numpy as np

from ...spec.limits import usable_cpus

# window lengths (tokens) the tables hold: every length to 32, then steps of 2^(1/4) to 4096; the kernel
# interpolates log(1 - pi) linearly between them and extrapolates the last segment
# sorted distinct values, as np.unique gives them (np.unique imports numpy.ma: ~30 ms of every start)
WINDOW_NODES = np.array(sorted(set(np.concatenate([np.arange(1, 33), np.round(32 * 2.0 ** (np.arange(1, 29) / 4))]).tolist())))
# window lengths (tokens) of the LFU count moments (win_m): powers of two to 8192, read linearly between them
MOMENT_NODES = 2 ** np.arange(14)
WINDOW_TOKENS = 16384      # tokens per sampled stream
WINDOW_STREAMS = 2
WINDOW_INDEX = 1 << 40     # stream index base, apart from sample_requests' indices 0, 1, ...
LOG_ABSENT_FLOOR = -700.0  # log(1 - pi) where pi rounds to 1 (exp of it underflows to 0)
# what a persistent cache of the tables must add to its key (dims, profile, seed): the counting scheme
SCHEME = ("windows-v2", WINDOW_TOKENS, WINDOW_STREAMS, WINDOW_INDEX, tuple(int(n) for n in WINDOW_NODES),
          "moments-v1", tuple(int(n) for n in MOMENT_NODES))


def has_memory(rt: dict) -> bool:
    """Whether lowered sampler tables make tokens depend on each other beyond stickiness."""
    return rt.get("recency") is not None or rt.get("coupling") is not None


def window_tables(rt: dict, seed: int, tokens: int | None = None, streams: int | None = None) -> dict:
    """{"q": [1, L, E] marginals pi_e(1), "win_n": WINDOW_NODES, "win_lq": [L, E, nodes] log(1 - pi_e(n)),
    "win_m": the MOMENT_NODES below the stream's length, "win_var" / "win_cov": [L, E, moment nodes] the
    variance of an expert's count over that many tokens and its covariance with the expert in the next token
    (what the LFU path reads)} counted on the sampler's own streams (module docstring): a pure function of
    (rt's sampler tables, seed)."""
    from concurrent.futures import ThreadPoolExecutor
    from .. import _kernel
    from ..glue import handle_library_error
    L, E = rt["n_layers"], rt["n_experts"]
    N = int(tokens or WINDOW_TOKENS)
    nodes = WINDOW_NODES.astype(np.int64)
    mnodes = MOMENT_NODES[MOMENT_NODES < N].astype(np.int64)
    n_streams = int(streams or WINDOW_STREAMS)

    def one_stream(i: int) -> tuple:
        cols = dict(batch=[1], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[N], warmup=[0],
                    policy=[0], mode=[0], seed=[int(seed)], index=[WINDOW_INDEX + i])
        code, picks = _kernel.route_sample(rt, cols)
        handle_library_error(code, "ms_route_sample", i)
        code, counts = _kernel.window_count(picks[:, 0, 0], E, nodes)
        handle_library_error(code, "ms_window_count", i)
        code, sums = _kernel.window_moments(picks[:, 0, 0], E, mnodes, int(rt.get("request_tokens", 0)))
        handle_library_error(code, "ms_window_moments", i)
        return counts, sums

    # the streams are independent and the kernels release the GIL: one thread each, up to the cores
    # (integer counts, so the sum is exact in any order)
    workers = max(1, min(n_streams, usable_cpus()))
    if workers == 1:
        parts = [one_stream(i) for i in range(n_streams)]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(one_stream, range(n_streams)))
    seen = np.zeros((L, E, len(nodes)))
    sums = np.zeros((L, E, len(mnodes), 4), dtype=np.int64)
    for counts, s in parts:
        seen += counts
        sums += s
    pi = np.minimum(seen / (n_streams * (N - nodes + 1.0)), 1.0)
    lq = np.maximum(np.log(np.maximum(1.0 - pi, 1e-300)), LOG_ABSENT_FLOOR)
    lq = np.minimum.accumulate(lq, axis=2)             # non-increasing in n (rounding)
    # the count moments over the windows that have a next token (N - n of them a stream)
    per = sums / (n_streams * (N - mnodes.astype(np.float64)))[None, None, :, None]
    mean, mean_x = per[..., 0], per[..., 3]
    var = np.maximum(per[..., 1] - mean * mean, 0.0)
    cov = per[..., 2] - mean * mean_x
    return {"q": pi[None, :, :, 0].copy(), "win_n": nodes.astype(np.float64), "win_lq": np.ascontiguousarray(lq),
            "win_m": mnodes.astype(np.float64), "win_var": np.ascontiguousarray(var),
            "win_cov": np.ascontiguousarray(cov)}
