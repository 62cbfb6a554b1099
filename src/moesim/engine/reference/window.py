"""Pure-Python twin of the analytic path's token-memory reading (csrc/ms_cache_rates.c, "token memory"):
Che's approximation on a routing's window tables (engine/lower/routing_window.py). Same operations in
the same order as the C, so the two agree to rounding."""
from __future__ import annotations

import math

from ..codes import MAX_TOP_K


def _id_order_hits(p, both, C):
    """ms_step_hits.c id_order_hits: the previous step's C highest-id experts resident, experts independent."""
    E = len(p)
    lsum = labove = hits = loss = 0.0
    zeros = zabove = 0
    for e in range(E):
        if p[e] < 1.0:
            lsum += math.log1p(-p[e])
        else:
            zeros += 1
    g, h = [0.0] * C, [0.0] * C
    g[0] = h[0] = 1.0
    for a in range(E - 1, -1, -1):
        q, b, fewer = p[a], both[a], 0.0
        if q < 1.0:
            labove += math.log1p(-q)
        else:
            zabove += 1
        below = 0.0 if zeros > zabove else math.exp(lsum - labove)
        for j in range(C):
            fewer += g[j]
        hits += b * fewer
        loss += h[C - 1] * b * (1.0 - below)
        for j in range(C - 1, 0, -1):
            g[j] = g[j] * (1.0 - q) + g[j - 1] * q
            h[j] = h[j] * (1.0 - q) + h[j - 1] * b
        g[0] *= 1.0 - q
        h[0] *= 1.0 - q
    return max(0.0, hits - loss)


def _mixed_blind(p, both, C, D, V, both_sum, lret):
    """ms_step_hits.c mixed_blind: the popularity-blind reading over the previous step's distinct count d, a normal of
    mean D and variance V on d = 1..E; d < C keeps all d and C - d older experts back at the absent experts' rate."""
    fnum = fden = 0.0
    for x, y in zip(p, both):
        fnum += x * (x - y)
        fden += x * (1.0 - x)
    fbar = fnum / fden if fden > 0.0 else 0.0
    wsum = h = 0.0
    for d in range(1, len(p) + 1):
        wd = math.exp(-0.5 * (d - D) * (d - D) / V)
        if d >= C:
            hd = both_sum * C / d - min(1.0, d - C) * math.exp(C * lret / d)
        else:
            hd = both_sum + (C - d) * fbar
        wsum += wd
        h += wd * max(0.0, hd)
    return h / wsum if wsum > 0.0 else 0.0


def union_variance(q, l, E, B, tps, j, top_k):
    """ms_step_hits.c ms_union_variance: the variance of scenario combination j's step union count over routing
    layer l's experts (sequence b runs scenario (j + b) mod S for tps tokens; each token picks exactly top_k, pair
    inclusion q_e q_f (k - 1) / (k - (q_e + q_f) / 2))."""
    S, k = len(q), float(top_k)
    nb, more = min(B, S), B % S         # sequences b < B mod S run B // S + 1 times, the rest B // S (as the C)
    n1, n0 = float((B // S + 1) * tps), float((B // S) * tps)

    def absent(factor):
        """prod over the sequences of factor(scenario)^(its tokens): two products, two powers (as the C)."""
        x1 = x0 = 1.0
        for b in range(nb):
            x = factor((j + b) % S)
            if b < more:
                x1 *= x
            else:
                x0 *= x
        return math.pow(x1, n1) * math.pow(x0, n0)

    a = [absent(lambda s: 1.0 - min(q[s][l][e], 1.0 - 1e-16)) for e in range(E)]
    V = 0.0
    for e in range(E):
        V += a[e] * (1.0 - a[e])
        for f in range(e + 1, E):
            def pair(s):
                qe, qf = min(q[s][l][e], 1.0 - 1e-16), min(q[s][l][f], 1.0 - 1e-16)
                return max(1.0 - qe - qf + qe * qf * (k - 1.0) / (k - 0.5 * (qe + qf)), 0.0)
            V += 2.0 * (absent(pair) - a[e] * a[f])
    return max(V, 0.0)


def full_step_hits(p, both, capacity, D, k, V=0.0):
    """Hits per step when the step needs more than the slots hold (ms_step_hits.c ms_full_step_hits): the
    popularity-blind reading (C of the previous step's D experts stay, less the needed resident the first access
    evicts when every resident is needed again; over the previous step's distinct count when its variance V > 0,
    :func:`_mixed_blind`) blended with the id-order one (:func:`_id_order_hits`): the latter up to D / 2 slots, the
    former from 3D / 4 on (D at least k)."""
    both_sum = lret = 0.0
    for x, y in zip(p, both):
        if not x > 0.0:
            continue
        both_sum += y
        lret += x * math.log(max(y / x, 1e-300))
    if V > 0.0:
        blind = _mixed_blind(p, both, capacity, D, V, both_sum, lret)
    else:
        blind = max(0.0, both_sum * capacity / D - min(1.0, D - capacity) * math.exp(capacity * lret / D))
    w = min(1.0, max(0.0, 3.0 - 4.0 * capacity / max(D, k)))
    if not w > 0.0 or capacity < 1.0 or capacity >= MAX_TOP_K:
        return blind
    return w * _id_order_hits(p, both, int(capacity)) + (1.0 - w) * blind


def window_lq(nodes, lq, n):
    """log P(absent from n tokens): linear in n between the nodes, the end segments extended."""
    lo, hi = window_segment(nodes, n)
    return lq[lo] + (lq[hi] - lq[lo]) * (n - nodes[lo]) / (nodes[hi] - nodes[lo])


def window_absent(rt, l, B, n):
    """sum_e exp(B log P(e absent from n tokens)) of routing layer l."""
    nodes, rows = rt["win_n"], rt["win_lq"][l]
    s = 0.0
    for e in range(len(rows)):
        s += math.exp(B * window_lq(nodes, rows[e], n))
    return s


def window_inclusion(rt, l, B, tps):
    """Each expert's probability of being in a step of B sequences x tps tokens."""
    nodes, rows = rt["win_n"], rt["win_lq"][l]
    return [1.0 - math.exp(B * window_lq(nodes, rows[e], tps)) for e in range(len(rows))]


def window_segment(nodes, n):
    """(lo, hi): the node segment holding n (window_lq's), the end ones extended."""
    lo, hi = 0, len(nodes) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if nodes[mid] < n:
            lo = mid
        else:
            hi = mid
    return lo, hi


def window_absent_node(rt, l, B, j):
    """sum_e exp(B log P(e absent from nodes[j] tokens)) of routing layer l."""
    s = 0.0
    for row in rt["win_lq"][l]:
        s += math.exp(B * row[j])
    return s


def window_capacity_tokens(rt, l, B, n0, C):
    """The n >= n0 where E - window_absent(n) reaches C (ms_cache_rates.c window_capacity_tokens): a binary
    search over the nodes for the segment holding it, then Newton's method from the segment's left end."""
    nodes, rows = rt["win_n"], rt["win_lq"][l]
    E, W = len(rows), len(nodes)
    cap = n0 * 2.0 ** 50
    a, b = window_segment(nodes, n0)[1], W - 1
    if E - window_absent_node(rt, l, B, b) < C:
        a = W - 1
    else:
        while a < b:
            mid = (a + b) // 2
            if E - window_absent_node(rt, l, B, mid) >= C:
                b = mid
            else:
                a = mid + 1
    xlo = nodes[a - 1]
    n = max(n0, xlo)
    for _ in range(100):
        absent, slope = 0.0, 0.0
        for q in rows:
            ds = (q[a] - q[a - 1]) / (nodes[a] - xlo)
            v = math.exp(B * (q[a - 1] + ds * (n - xlo)))
            absent += v
            slope -= B * ds * v
        if not slope > 0.0:
            break
        step = (C - (E - absent)) / slope
        if not step > 1e-14 * n:
            break
        n += step
        if n >= cap:
            return cap
    return n


def window_hits(rt, l, B, tps, C, D):
    """Expected LRU hits per step of a C-slot step-level cache (ms_cache_rates.c ms_window_hits): whole steps of
    recency split at U(k) <= C < U(k + 1), U(k) = E - window_absent(k tps)."""
    rows = rt["win_lq"][l]
    E = len(rows)
    support = sum(1 for e in range(E) if rows[e][-1] < 0.0)
    if support <= C:
        return D
    if C <= 0:
        return 0.0
    a1 = E - D
    if D >= C:
        nodes, p, both = rt["win_n"], [], []
        for e in range(E):
            x1 = math.exp(B * window_lq(nodes, rows[e], tps))
            p.append(1.0 - x1)
            both.append(1.0 - 2.0 * x1 + math.exp(B * window_lq(nodes, rows[e], 2.0 * tps)))
        return full_step_hits(p, both, C, D, int(rt["top_k"]))
    k = math.floor(window_capacity_tokens(rt, l, B, tps, C) / tps)
    ak = window_absent(rt, l, B, k * tps)
    ak1 = window_absent(rt, l, B, (k + 1.0) * tps)
    ak2 = window_absent(rt, l, B, (k + 2.0) * tps)
    uk, uk1 = E - ak, E - ak1
    rho = min(1.0, max(0.0, (C - uk) / (uk1 - uk))) if uk1 > uk else 0.0
    return E - a1 - ak + ak1 + rho * (ak - 2.0 * ak1 + ak2)


def window_reuse(rt, l, K):
    """sum_e P(e in two consecutive tokens of one sequence) / k."""
    E = len(rt["win_lq"][l])
    return (E - 2.0 * window_absent(rt, l, 1.0, 1.0) + window_absent(rt, l, 1.0, 2.0)) / K


def window_count(tokens, n_experts, nodes):
    """Twin of ms_window_count (csrc/ms_window.c): out[l][e][j] = how many of the N - n + 1 windows of
    n = nodes[j] consecutive tokens of the stream tokens[t][l][k] hold expert e, from e's absence runs
    (a run of g tokens without e holds max(0, g - n + 1) windows that miss it)."""
    N, L = len(tokens), len(tokens[0])
    out = []
    for l in range(L):
        runs = [[] for _ in range(n_experts)]
        last = [-1] * n_experts
        for t in range(N):
            for e in tokens[t][l]:
                if last[e] == t:
                    continue
                if t - last[e] - 1 > 0:
                    runs[e].append(t - last[e] - 1)
                last[e] = t
        for e in range(n_experts):
            if N - 1 - last[e] > 0:
                runs[e].append(N - 1 - last[e])
        out.append([[(N - n + 1) - sum(max(0, g - n + 1) for g in runs[e]) for n in nodes]
                    for e in range(n_experts)])
    return out


def window_moments(tokens, n_experts, nodes, request_tokens=0):
    """Twin of ms_window_moments (csrc/ms_window.c): out[l][e][j] = [sum N, sum N^2, sum N x, sum x] over the
    windows of n = nodes[j] consecutive tokens that have a next token, inside one request (requests restart
    every request_tokens tokens) when n is shorter than one, N the window's count of expert e, x = 1 when e is
    in the token after it; counted window by window."""
    N, L = len(tokens), len(tokens[0])
    out = []
    for l in range(L):
        present = [[False] * N for _ in range(n_experts)]
        for t in range(N):
            for e in tokens[t][l]:
                present[e][t] = True
        rows = []
        for e in range(n_experts):
            prefix = [0]
            for t in range(N):
                prefix.append(prefix[-1] + present[e][t])
            row = []
            for n in nodes:
                s1 = s2 = s3 = sx = 0
                for i in range(N - n):
                    if 0 < n < request_tokens and i // request_tokens != (i + n) // request_tokens:
                        continue           # the window and its next token cross a request's start
                    c, x = prefix[i + n] - prefix[i], int(present[e][i + n])
                    s1, s2, s3, sx = s1 + c, s2 + c * c, s3 + c * x, sx + x
                row.append([s1, s2, s3, sx])
            rows.append(row)
        out.append(rows)
    return out
