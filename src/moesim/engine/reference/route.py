"""Pure-Python twin of the routing sampler (``csrc/ms_route.c``): per-request weights, each token's top-k
(cross-layer partners, stickiness, multi-lag memory, the Gumbel-top-k race, group-limited routing), trace
replay and each step's union. Slow and plain on purpose; semantics in csrc/moesim.h (ms_routing_t)."""
from __future__ import annotations

import math

from .rng import Rng


def _recall_older(h, lag, hist, out, rng, K):
    """Multi-lag memory: each free slot copies, with probability h, a uniformly chosen expert of the
    token's memory lag (hist[lag], newest first) unless already picked or the request is shorter."""
    for _ in range(K - len(out)):
        if not rng.uniform() < h or lag >= len(hist):
            continue
        e = hist[lag][int(rng.uniform() * K)]
        if e not in out:
            out.append(e)
    return out


def _draw_lag(dist, rng):
    u, cum = rng.uniform(), 0.0
    for i in range(len(dist) - 1):
        cum += float(dist[i])
        if u < cum:
            return i
    return len(dist) - 1


def _follow_partners(rt, l, w, up, out, rng, K):
    """Cross-layer dependence: free slot a takes, with probability coupling[l], a partner of the token's
    a-th expert at layer l - 1, chosen in proportion to the request's weights w, unless already picked."""
    f, part = float(rt["coupling"][l]), rt["partners"][l - 1]
    P = part.shape[1]
    for a in range(K - len(out)):
        cand = [int(x) for x in part[up[a]]]
        if not rng.uniform() < f:
            continue
        tot = 0.0
        for c in cand:
            tot += w[c]
        u, cum, e = rng.uniform() * tot, 0.0, cand[P - 1]
        for i in range(P - 1):
            cum += w[cand[i]]
            if u < cum:
                e = cand[i]
                break
        if e not in out:
            out.append(e)
    return out


def _route_token(rt, w, prev, p, rng, E, K, l=0, hist=(), up=None, lag=0):
    """One token's top-k: partners of the layer above (coupling), kept experts of the previous token,
    copies from older tokens (recency), then
    the smallest race keys Exp(1)/w_e (Gumbel-top-k on log w); group-limited by each group's two best keys."""
    out = []
    if rt.get("coupling") is not None and up is not None and float(rt["coupling"][l]) > 0.0:
        out = _follow_partners(rt, l, w, up, out, rng, K)
    for e in prev:
        if rng.uniform() < p and len(out) < K and e not in out:
            out.append(e)
    if rt.get("recency") is not None and prev:
        out = _recall_older(float(rt["recency"][l]), lag, hist, out, rng, K)
    key = [-math.log(rng.uniform()) / w[e] for e in range(E)]
    allowed = [True] * E
    G, TG = rt["n_group"], rt["topk_group"]
    if G > 1 and TG < G:
        per = E // G
        gscore = []
        for g in range(G):
            best2 = sorted(key[g * per:(g + 1) * per])[:2]
            gscore.append(math.log(best2[0]) + (math.log(best2[1]) if per > 1 else 0.0))
        picked = []
        for e in out:
            if e // per not in picked:
                picked.append(e // per)
        while len(picked) < TG:
            best = min((g for g in range(G) if g not in picked), key=lambda g: (gscore[g], g))
            picked.append(best)
        allowed = [e // per in picked for e in range(E)]
    chosen = set(out)
    while len(out) < K:
        best = -1
        for e in range(E):
            if not allowed[e] or e in chosen:
                continue
            if best < 0 or key[e] < key[best]:
                best = e
        out.append(best)
        chosen.add(best)
    overlap = sum(1 for e in prev if e in chosen) if prev else -1
    return out, overlap


def route(rt, c):
    """(sel, cnt, reuse_num, reuse_den, selections, tokens): step unions [T][L] lists of the
    Monte Carlo configuration c, and each token's picks [T][B][tps][L]."""
    L, E, K, B, tps, T = rt["n_layers"], rt["n_experts"], rt["top_k"], c["batch"], c["tokens_per_step"], c["steps"]
    trace = rt.get("trace")
    conc = rt["concentration"]
    req_tokens = rt["request_tokens"]
    log_pop = rt.get("log_pop")
    prev = [[[] for _ in range(L)] for _ in range(B)]
    hist = [[[] for _ in range(L)] for _ in range(B)]   # older tokens' picks, newest first
    H = len(rt["recency_lag"]) if rt.get("recency") is not None else 0
    weights = [None] * B
    tok_in_req = [0] * B
    trace_pos = [(len(trace) * b) // B if trace is not None else 0 for b in range(B)]
    sel = [[[] for _ in range(L)] for _ in range(T)]
    cnt = [[[] for _ in range(L)] for _ in range(T)]
    picks_all = [[[[None] * L for _ in range(tps)] for _ in range(B)] for _ in range(T)]
    rnum = rden = selections = 0.0
    if L == 0:
        return sel, cnt, 0.0, 0.0, 0.0, picks_all
    for t in range(T):
        pos = [dict() for _ in range(L)]
        for b in range(B):
            rng = Rng(c["seed"], c["index"], (b << 32) ^ t)
            for j in range(tps):
                tp = 0
                if trace is not None:
                    tp = trace_pos[b] % len(trace)
                    trace_pos[b] = tp + 1
                elif tok_in_req[b] == 0 or (req_tokens > 0 and tok_in_req[b] >= req_tokens):
                    rows = []
                    for l in range(L):
                        prev[b][l] = []
                        hist[b][l] = []
                        lp = [float(x) for x in log_pop[l]]
                        mx = max(lp)
                        z = sum(math.exp(x - mx) for x in lp)
                        row = []
                        for e in range(E):
                            g = math.exp(lp[e] - mx) / z
                            x = rng.gamma(conc * E * g) if conc > 0.0 else g
                            row.append(x if x > 1e-300 else 1e-300)
                        rows.append(row)
                    weights[b] = rows
                    tok_in_req[b] = 0
                tok_in_req[b] += 1
                up = None
                lag = _draw_lag(rt["recency_lag"], rng) if trace is None and H else 0
                for l in range(L):
                    if trace is not None:
                        picks = [int(e) for e in trace[tp][l % trace.shape[1]]]
                        ov = sum(1 for e in prev[b][l] if e in set(picks)) if prev[b][l] else -1
                    else:
                        picks, ov = _route_token(rt, weights[b][l], prev[b][l], float(rt["stickiness"][l]), rng, E, K,
                                                 l, hist[b][l], up, lag)
                        if H and prev[b][l]:
                            hist[b][l] = ([list(prev[b][l])] + hist[b][l])[:H]
                    up = picks
                    prev[b][l] = picks
                    picks_all[t][b][j][l] = picks
                    if ov >= 0 and t >= c["warmup"]:
                        rnum += ov
                        rden += K
                    selections += K
                    for e in picks:
                        if e in pos[l]:
                            cnt[t][l][pos[l][e]] += 1
                        else:
                            pos[l][e] = len(sel[t][l])
                            sel[t][l].append(e)
                            cnt[t][l].append(1)
        for l in range(L):   # served in expert-id order
            order = sorted(range(len(sel[t][l])), key=lambda j: sel[t][l][j])
            sel[t][l] = [sel[t][l][j] for j in order]
            cnt[t][l] = [cnt[t][l][j] for j in order]
    return sel, cnt, rnum, rden, selections, picks_all
