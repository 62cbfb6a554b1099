"""Pure-Python twins of the analytic path's expert-cache hit rates (csrc/ms_cache_rates.c): LRU on a sticky
two-state chain per expert in whole steps of recency (lru_chain_hits, per scenario combination) and LFU with
counts since the run began (lfu_hit_rate). Same operations in the same order as the C, so the two agree to
rounding."""
from __future__ import annotations

import math
import sys

from ..codes import UNION_VAR_EXPERTS
from .window import full_step_hits, union_variance, window_lq, window_segment


def lru_chain_hits(p, f, capacity, top_k, V=0.0):
    """Expected hits per step of a step-level LRU cache over a two-state chain per expert (ms_cache_rates.c
    lru_chain_hits): e is in a step's set with probability p[e] and returns after a step without it with
    probability f[e]. The experts used in the last k steps, U(k) = sum 1 - (1 - p)(1 - f)^(k-1), split at
    U(k) <= C < U(k + 1): those used within k steps are resident, those used exactly k + 1 steps back with
    probability rho = (C - U(k)) / (U(k + 1) - U(k)) (recency within a step follows expert ids). k = 0 (a step
    needs more than C): rho = C / D, less one hit when every resident is needed again (as the C)."""
    E = len(p)
    D = sum(p)
    support = sum(1 for x in p if x > 0)
    reach = sum(1.0 if y > 0 else x for x, y in zip(p, f))
    if support <= capacity or reach <= capacity:
        return D
    if capacity <= 0:
        return 0.0
    if D >= capacity:       # k = 0: the step alone fills the cache
        return full_step_hits(p, [x - (1.0 - x) * y for x, y in zip(p, f)], capacity, D, top_k, V)
    lb = [math.log1p(-min(y, 1.0 - 1e-15)) for y in f]
    # start at the root for equal return rates; from its right Newton's first step lands left (as the C). Only
    # floor(tau) is read: a step under 1e-6 ends it, and the split moves k until U(k) <= C < U(k + 1)
    tau = 1.0
    fsum = sum(y for x, y in zip(p, f) if x > 0)
    if 0.0 < fsum < support:
        tau = max(1.0, 1.0 + math.log((support - capacity) / (support - D)) / math.log1p(-fsum / support))
    for _ in range(200):
        u, du = -capacity, 0.0
        for e in range(E):
            x = (1.0 - p[e]) * math.exp(lb[e] * (tau - 1.0))
            u += 1.0 - x
            du -= lb[e] * x
        if not du > 0.0:
            break
        nxt = max(1.0, tau - u / du)
        if not abs(nxt - tau) > 1e-6:
            tau = nxt
            break
        tau = nxt
    k = float(math.floor(tau))
    moves = 0
    while True:             # U(1) = D < C and U grows to reach > C: a k exists
        uk, uk1, within, exact = _chain_split(p, f, lb, k)
        if moves >= 64 or not ((uk > capacity and k > 1.0) or uk1 <= capacity):
            break
        k += 1.0 if uk1 <= capacity else -1.0
        moves += 1
    rho = min(1.0, max(0.0, (capacity - uk) / (uk1 - uk))) if uk1 > uk else 0.0
    return within + rho * exact


def _chain_split(p, f, lb, k):
    """ms_cache_rates.c chain_split: (U(k), U(k + 1), hits within k steps, hits exactly k + 1 back before rho)."""
    uk = uk1 = within = exact = 0.0
    for e in range(len(p)):
        a = 1.0 - p[e]
        g = math.exp(lb[e] * (k - 1.0))
        z = a * f[e] * g
        uk += 1.0 - a * g
        uk1 += 1.0 - a * math.exp(lb[e] * k)
        within += p[e] - z
        exact += z * f[e]
    return uk, uk1, within, exact


def fresh_rate(q, stick, top_k):
    """The per-token rate at which a sticky routing picks an expert afresh when the token before did not use it
    (ms_internal.h ms_fresh_rate): a dropped expert frees its own slot, so it returns more often than an absent one
    arrives; the expert's per-token inclusion q stays stationary."""
    return q * (1.0 - stick) / (1.0 - q * stick * (top_k - 1.0) / top_k)


def chain_reuse(q, stick, l, E, top_k):
    """The sticky chain's reuse statistic: sum_e P(e in two consecutive tokens) / top_k, over the scenarios
    (ms_cache_rates.c ms_chain_reuse)."""
    s = 0.0
    for k in range(len(q)):
        for e in range(E):
            x = min(q[k][l][e], 1.0 - 1e-16)
            s += x - (1.0 - x) * fresh_rate(x, stick, top_k)
    return s / (len(q) * top_k)


def _scenario_logs(q, stick, l, E, top_k):
    """(log(1 - q), log(1 - f)) per scenario and expert of routing layer l, f the fresh rate (ms_cache_rates.c
    scenario_logs)."""
    lq = [[math.log1p(-min(q[k][l][e], 1.0 - 1e-16)) for e in range(E)] for k in range(len(q))]
    lf = [[math.log1p(-fresh_rate(min(q[k][l][e], 1.0 - 1e-16), stick, top_k)) for e in range(E)]
          for k in range(len(q))]
    return lq, lf


def _combination_rates(lq, lf, B, tps, j, E):
    """(p, f) of scenario combination j: sequence b runs scenario (j + b) mod S (ms_cache_rates.c
    combination_rates)."""
    S = len(lq)
    pc, pf = [], []
    for e in range(E):
        lg = la = 0.0
        for b in range(min(B, S)):
            reps, k = B // S + (1 if b < B % S else 0), (j + b) % S
            lg += reps * lq[k][e]
            la += reps * lf[k][e]
        pc.append(1.0 - math.exp(tps * lg))
        pf.append(1.0 - math.exp(tps * la))
    return pc, pf


def lru_hit_rate(q, stick, l, E, B, tps, C, top_k):
    """Step-level LRU hit rate of a ``C``-slot cache, averaged over the S step windows: the B sequences
    of a step draw routing samples j, j+1, ... (cyclically), each for ``tps`` tokens. A sequence re-picks its
    previous token's experts with the layer's stickiness, so an expert absent from the step before returns
    with 1 - prod (1 - f)^tps, f the :func:`fresh_rate` (:func:`lru_chain_hits`). When S divides B every window
    holds every sample B / S times: one window stands for all (as the C)."""
    S = len(q)
    lq, lf = _scenario_logs(q, stick, l, E, top_k)
    hsum = dsum = 0.0
    for j in range(1 if B % S == 0 else S):
        pc, pf = _combination_rates(lq, lf, B, tps, j, E)
        D = sum(pc)
        # the step's distinct count's spread where a step outgrows the slots (ms_cache_rates.c, MS_UNION_VAR_EXPERTS)
        V = union_variance(q, l, E, B, tps, j, top_k) if D >= C and E <= UNION_VAR_EXPERTS and B * tps > 1 else 0.0
        hsum += lru_chain_hits(pc, pf, C, top_k, V)
        dsum += D
    return hsum / dsum if dsum > 0 else 0.0


def _norm_cdf(x):
    return 0.5 * math.erfc(-x * 0.7071067811865476)


def _norm_pdf(x):
    return math.exp(-0.5 * x * x) * 0.3989422804014327


def newton_in_bracket(th, g, dg, lo, hi):
    """ms_cache_rates.c newton_in_bracket: (the next iterate, lo, hi) of Newton's method on a decreasing function
    kept to its bracket, narrowed by th."""
    if g > 0.0:
        lo = th
    else:
        hi = th
    nxt = th - g / dg if dg < 0.0 else 0.5 * (lo + hi)
    return (nxt if lo < nxt < hi else 0.5 * (lo + hi)), lo, hi


def lfu_threshold(mu, sd, cap, th0):
    """The count threshold with sum_e P(n_e >= th) = cap, n_e ~ N(mu_e, sd_e^2) (ms_cache_rates.c lfu_threshold)."""
    lo = min(m - 40.0 * s for m, s in zip(mu, sd))
    hi = max(m + 40.0 * s for m, s in zip(mu, sd))
    th = th0 if lo < th0 < hi else 0.5 * (lo + hi)
    for _ in range(100):
        g, dg = -cap, 0.0
        for m, s in zip(mu, sd):
            z = (m - th) / s
            g += _norm_cdf(z)
            dg -= _norm_pdf(z) / s
        nxt, lo, hi = newton_in_bracket(th, g, dg, lo, hi)
        if not abs(nxt - th) > 1e-6 * (1.0 + abs(th)):
            return nxt
        th = nxt
    return th


LFU_POINTS = 4
LFU_COMBOS = 4


def moment_at(nodes, row, n):
    """ms_cache_rates.c moment_segment / moment_at: row (values at the lengths nodes) at n, linear between them
    and beyond the last, from 0 below the first (or with a single length)."""
    if n <= nodes[0] or len(nodes) == 1:
        return n / nodes[0] * row[0]
    lo, hi = window_segment(nodes, n)
    w = (n - nodes[lo]) / (nodes[hi] - nodes[lo])
    return (1.0 - w) * row[lo] + w * row[hi]


def gamma_tail(k, theta, x):
    """ms_cache_rates.c gamma_tail: P(n >= x) for n ~ Gamma(k, theta), Wilson-Hilferty's cube-root normal."""
    if not k > 0.0:
        return 0.0
    if not x > 0.0:
        return 1.0
    return _norm_cdf(-(math.cbrt(x / (k * theta)) - (1.0 - 1.0 / (9.0 * k))) * 3.0 * math.sqrt(k))


def lfu_gamma_threshold(k, theta, cap):
    """ms_cache_rates.c lfu_gamma_threshold: th with sum_e P(n_e >= th) = cap, Newton inside a bracket."""
    lo = hi = 0.0
    for ke, te in zip(k, theta):
        hi = max(hi, 40.0 * (ke * te + math.sqrt(ke) * te) + 1.0)
    th = 0.5 * hi
    for _ in range(100):
        g, dg = -cap, 0.0
        for ke, te in zip(k, theta):
            if not ke > 0.0:
                continue
            u = math.cbrt(th / (ke * te))
            z = (u - (1.0 - 1.0 / (9.0 * ke))) * 3.0 * math.sqrt(ke)
            g += _norm_cdf(-z)
            dg -= _norm_pdf(z) * math.sqrt(ke) / (u * u * ke * te)
        nxt, lo, hi = newton_in_bracket(th, g, dg, lo, hi)
        if not abs(nxt - th) > 1e-6 * (1.0 + abs(th)):
            return nxt
        th = nxt
    return th


def last_miss_hits(miss, back, D, every):
    """ms_cache_rates.c last_miss_hits: the previous step's last miss, unless the step's first access misses while
    every resident is needed again (exp(every)), when the least counted needed expert, it, is evicted first."""
    if not miss > 0.0:
        return 0.0
    return min(1.0, miss) * back / miss * (1.0 - min(1.0, miss / D) * math.exp(every))


def lfu_window_rates(rt, l, B, tps):
    """ms_cache_rates.c lfu_window_rates: (step inclusion, return rate, one sequence's per-token inclusion) of
    every expert of layer l from the window tables, as plain floats (IEEE inf past the range, as the C)."""
    nodes, rows = rt["win_n"], rt["win_lq"][l]
    pc, pf, p1 = [], [], []
    for row in rows:
        x1 = math.exp(B * float(window_lq(nodes, row, tps)))
        x2 = math.exp(B * float(window_lq(nodes, row, 2.0 * tps)))
        pc.append(1.0 - x1)
        pf.append(min(1.0, max(0.0, (x1 - x2) / x1)) if x1 > 0.0 else 1.0)
        p1.append(1.0 - math.exp(float(window_lq(nodes, row, 1.0))))
    return pc, pf, p1


def lfu_point(m, steps, warmup):
    """ms_cache_rates.c lfu_point: midpoint m of LFU_POINTS in [warmup, steps)."""
    return warmup + (m + 0.5) * (steps - warmup) / LFU_POINTS


def lfu_moment_hits(rt, l, B, C, steps, warmup):
    """ms_cache_rates.c lfu_moment_hits: LFU under token memory at one token per step from one sequence's count
    moments (win_var, win_cov): gamma counts of the sequence's variance carried to the step's union, the next
    step's presence regressed on the count. Returns (hit rate, the D-weighted share of steps needing every
    resident)."""
    E = int(rt["n_experts"])
    mn, var, cov = [float(x) for x in rt["win_m"]], [list(map(float, v)) for v in rt["win_var"][l]], \
        [list(map(float, c)) for c in rt["win_cov"][l]]
    pc, pf, p1 = lfu_window_rates(rt, l, B, 1)
    D = support = 0.0
    for x in pc:
        D += x
        support += x > 0.0
    hsum = dsum = fsum = 0.0
    for m in range(LFU_POINTS):
        t = lfu_point(m, steps, warmup)
        shape, scale, cv = [], [], []
        for e in range(E):
            p = pc[e]
            ratio = (1.0 - p) / (1.0 - p1[e]) if p1[e] < 1.0 else 0.0
            gain = B * ratio * ratio
            v = max(t * p * (1.0 - p) + gain * (moment_at(mn, var[e], t) - t * p1[e] * (1.0 - p1[e])), 0.0) + 0.25
            shape.append(t * p * t * p / v if p > 0.0 else 0.0)
            scale.append(v / (t * p) if p > 0.0 else 1.0)
            cv.append(gain * moment_at(mn, cov[e], t))
        h = miss = back = 0.0
        if support <= C:
            h = D
        elif C >= 1.0:
            th = lfu_gamma_threshold(shape, scale, C - 1.0) if C - 1.0 > 0.0 else sys.float_info.max
            every = 0.0
            for e in range(E):
                q, p = gamma_tail(shape[e], scale[e], th), pc[e]
                joint = cv[e] / scale[e] * (gamma_tail(shape[e] + 1.0, scale[e], th) - q) if p > 0.0 else 0.0
                h += p * q + joint
                miss += p * (1.0 - q) - joint
                back += (p - (1.0 - p) * pf[e]) * (1.0 - q)
                if q > 0.0:
                    every += q * math.log(max(min(1.0, (p * q + joint) / q), 1e-300))
            h += last_miss_hits(miss, back, D, every)
            fsum += math.exp(every) * D
        hsum += min(max(h, 0.0), D)
        dsum += D
    return (hsum / dsum if dsum > 0.0 else 0.0), (fsum / dsum if dsum > 0.0 else 0.0)


def lfu_hit_rate(q, stick, request_tokens, l, E, B, tps, C, steps, warmup, top_k, windows=None):
    """LFU hit rate of a ``C``-slot cache over steps [warmup, steps) of a run (ms_cache_rates.c ms_lfu_hit_rate): the
    C - 1 most counted experts and the previous step's last miss are resident; counts since the run began,
    normal, from the current request's combination and the earlier requests' mean. ``windows``: a token-memory
    routing (its win_n, win_lq), whose window tables give p and f (one combination); with its count moments at
    one token per step, :func:`lfu_moment_hits`. Returns (hit rate, the D-weighted share of steps needing every
    resident: the caller's LRU share, decode.py's layer counts as ms_analytic.c lfu_layer)."""
    if windows is not None and windows.get("win_var") is not None and tps == 1:
        return lfu_moment_hits(windows, l, B, C, steps, warmup)
    S = len(q)
    R = request_tokens / tps if request_tokens > 0 else 0.0
    pbar, pvar = [0.0] * E, [0.0] * E
    if windows is not None:         # one combination: the earlier requests' mean is its own
        wp, wf, _ = lfu_window_rates(windows, l, B, tps)
        pbar = list(wp)
    lq, lf = _scenario_logs(q, stick, l, E, top_k)
    for rnd in range(2 if windows is None else 0):
        for j in range(S):
            for e in range(E):
                lg = 0.0
                for b in range(min(B, S)):
                    lg += float(B // S + (1 if b < B % S else 0)) * lq[(j + b) % S][e]
                x = 1.0 - math.exp(tps * lg)
                if rnd == 0:
                    pbar[e] += x / S
                else:
                    pvar[e] += (x - pbar[e]) * (x - pbar[e]) / S
    hsum = dsum = th = fsum = 0.0
    combos = 1 if B % S == 0 or windows is not None else S
    stride = combos // LFU_COMBOS if combos > LFU_COMBOS else 1      # up to LFU_COMBOS, spread (as the C)
    for j in range(0, combos, stride):
        pc, pf = _combination_rates(lq, lf, B, tps, j, E) if windows is None else (wp, wf)
        D, support = 0.0, 0
        for x in pc:
            D += x
            support += x > 0.0
        for m in range(LFU_POINTS):
            t = lfu_point(m, steps, warmup)
            if R > 0.0 and t >= R:      # the phase in the current request: exact, or stratified (as the C)
                tcur = math.fmod(t, R) if (steps - warmup) / LFU_POINTS < R else (m + 0.5) * R / LFU_POINTS
            else:
                tcur = t
            tprev = t - tcur
            mu, sd = [], []
            for e in range(E):
                p = pc[e]
                disp = max(2.0 * p / pf[e] - 1.0, 1.0) if pf[e] > 1e-12 else 1e12
                mu.append(tprev * pbar[e] + tcur * p)
                sd.append(math.sqrt(tprev * pbar[e] * (1.0 - pbar[e]) + tprev * R * pvar[e]
                                    + tcur * p * (1.0 - p) * disp + 0.25))
            h = miss = back = every = 0.0
            if support <= C:          # every expert the combination uses fits: nothing is evicted
                h = D
            else:
                th = lfu_threshold(mu, sd, max(C - 1.0, 0.0), th)
                for e in range(E):
                    P = _norm_cdf((mu[e] - th) / sd[e]) if C - 1.0 > 0.0 else 0.0
                    p = pc[e]
                    h += p * P
                    miss += p * (1.0 - P)
                    back += (p - (1.0 - p) * pf[e]) * (1.0 - P)
                    if P > 0.0:
                        every += P * math.log(max(p, 1e-300))
                if C >= 1.0:
                    h += last_miss_hits(miss, back, D, every)
                fsum += math.exp(every) * D if C >= 1.0 else 0.0
            hsum += min(h, D)
            dsum += D
    return (hsum / dsum if dsum > 0.0 else 0.0), (fsum / dsum if dsum > 0.0 else 0.0)
