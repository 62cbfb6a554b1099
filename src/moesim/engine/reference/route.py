"""Pure-Python twin of the routing sampler (``csrc/ms_route.c``): per-request weights and their alias
tables, each token's top-k (cross-layer partners, stickiness, multi-lag memory, weighted sampling without
replacement, group-limited routing), trace replay and each step's union. Slow and plain on purpose;
semantics in csrc/moesim.h (ms_routing_t)."""
from __future__ import annotations

import math

from .rng import Rng

ALIAS_TRIES = 16     # alias draws of one pick before the cumulative scan (ms_route.c MS_ALIAS_TRIES)
ZIG_R, ZIG_V, TWO53 = 7.697117470131487, 3.949659822581572e-3, 9007199254740992.0


def _zig_tables():
    """The exponential ziggurat (Marsaglia & Tsang 2000, zigset) scaled to 53-bit draws: (k, w, f)."""
    de = ZIG_R
    te = de
    q = ZIG_V / math.exp(-de)
    k, w, f = [0] * 256, [0.0] * 256, [0.0] * 256
    k[0] = int(de / q * TWO53)
    w[0] = q / TWO53
    w[255] = de / TWO53
    f[0] = 1.0
    f[255] = math.exp(-de)
    for i in range(254, 0, -1):
        de = -math.log(ZIG_V / de + math.exp(-de))
        k[i + 1] = int(de / te * TWO53)
        te = de
        f[i] = math.exp(-de)
        w[i] = de / TWO53
    return k, w, f


_ZK, _ZW, _ZF = _zig_tables()


def _exp1(rng):
    """One Exp(1) draw (ms_route.c zig_exp): strip from the low 8 bits, value from the high 53."""
    while True:
        v = rng.next()
        j, i = v >> 11, v & 255
        if j < _ZK[i]:
            return j * _ZW[i]
        if i == 0:
            return ZIG_R - math.log(rng.uniform())
        x = j * _ZW[i]
        if _ZF[i] + rng.uniform() * (_ZF[i - 1] - _ZF[i]) < math.exp(-x):
            return x


def _alias_build(w):
    """Walker's alias table of the weights w (Vose's construction): (prob, alias, sum of w); column i keeps
    i with chance prob[i], else gives alias[i]."""
    m = len(w)
    tot = 0.0
    for x in w:
        tot += x
    scale = m / tot
    prob, alias, small, large = [], [], [], []
    for i in range(m):
        prob.append(w[i] * scale)
        alias.append(i)
        (small if prob[i] < 1.0 else large).append(i)
    while small and large:
        a, g = small.pop(), large.pop()
        alias[a] = g
        prob[g] = (prob[g] + prob[a]) - 1.0
        (small if prob[g] < 1.0 else large).append(g)
    for i in large + small:
        prob[i] = 1.0
    return prob, alias, tot


def _alias_draw(w, table, base, m, skip, rng):
    """An expert of block [base, base + m) in proportion to w among those not in skip: alias draws (column
    floor(u m), its coin the fraction), redrawn while they meet a skipped expert, up to ALIAS_TRIES; then
    one uniform against the cumulative weights of the others."""
    prob, alias = table
    for _ in range(ALIAS_TRIES):
        x = rng.uniform() * m
        i = min(int(x), m - 1)
        e = base + (i if x - i < prob[base + i] else alias[base + i])
        if e not in skip:
            return e
    tot = 0.0
    for e in range(base, base + m):
        if e not in skip:
            tot += w[e]
    u, cum, last = rng.uniform() * tot, 0.0, -1
    for e in range(base, base + m):
        if e in skip:
            continue
        last = e
        cum += w[e]
        if u < cum:
            return e
    return last


class _Group:
    """One expert group's smallest race keys Exp(1) / w_e, generated in increasing order."""

    def __init__(self, g, per, tot):
        self.g, self.per, self.tot, self.rem, self.c, self.n = g, per, tot, tot, 0.0, 0

    def next_key(self, w, table, seen, rng):
        """(key, expert) of the next smallest key ((inf, -1) once all are drawn): the last key plus
        Exp(1) / (weight not yet drawn; the ziggurat's draw), its expert in proportion to w among those
        not yet drawn."""
        if self.n == self.per:
            return math.inf, -1
        k = self.c + _exp1(rng) / self.rem
        e = _alias_draw(w, table, self.g * self.per, self.per, seen, rng)
        seen.add(e)
        self.n += 1
        self.c = k
        self.rem -= w[e]
        if self.n < self.per and not self.rem > self.tot * 1e-9:
            self.rem = 0.0
            for x in range(self.g * self.per, (self.g + 1) * self.per):
                if x not in seen:
                    self.rem += w[x]
        return k, e


def _route_grouped(rt, w, table, btot, out, rng, E, K):
    """Group-limited routing: groups ranked by their two smallest keys (by a b, the order of log a + log b),
    the kept experts' groups first, the best others up to topk_group; the free slots take the allowed
    groups' smallest keys not already picked, merged in key order (ties to the lower group)."""
    G, TG = rt["n_group"], rt["topk_group"]
    per = E // G
    seen = set()
    groups, heads, seconds, scores = [], [], [], []
    for g in range(G):
        q = _Group(g, per, btot[g])
        a = q.next_key(w, table, seen, rng)
        b = q.next_key(w, table, seen, rng)
        groups.append(q)
        heads.append(a)
        seconds.append(b)
        scores.append(a[0] * b[0] if per > 1 else a[0])
    picked = []
    for e in out:
        if e // per not in picked:
            picked.append(e // per)
    while len(picked) < TG:
        best = -1
        for g in range(G):
            if g not in picked and (best < 0 or scores[g] < scores[best]):
                best = g
        picked.append(best)
    stage = [0] * G
    chosen = set(out)
    while len(out) < K:
        best = -1
        for g in range(G):
            if g in picked and heads[g][1] >= 0 and (best < 0 or heads[g][0] < heads[best][0]):
                best = g
        e = heads[best][1]
        if stage[best] == 0:
            heads[best] = seconds[best]
            stage[best] = 1
        else:
            heads[best] = groups[best].next_key(w, table, seen, rng)
        if e not in chosen:
            out.append(e)
            chosen.add(e)
    return out


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


def _route_token(rt, w, table, btot, prev, p, rng, E, K, l=0, hist=(), up=None, lag=0):
    """One token's top-k: partners of the layer above (coupling), kept experts of the previous token,
    copies from older tokens (recency), then the next picks of sampling without replacement in proportion
    to w (the law of the smallest race keys Exp(1)/w_e, Gumbel-top-k on log w), one alias draw each;
    group-limited by each group's two best keys."""
    out = []
    if rt.get("coupling") is not None and up is not None and float(rt["coupling"][l]) > 0.0:
        out = _follow_partners(rt, l, w, up, out, rng, K)
    for e in prev:
        if rng.uniform() < p and len(out) < K and e not in out:
            out.append(e)
    if rt.get("recency") is not None and prev:
        out = _recall_older(float(rt["recency"][l]), lag, hist, out, rng, K)
    if _blocks(rt) > 1:
        out = _route_grouped(rt, w, table, btot, out, rng, E, K)
    else:
        chosen = set(out)
        while len(out) < K:
            e = _alias_draw(w, table, 0, E, chosen, rng)
            out.append(e)
            chosen.add(e)
    chosen = set(out)
    overlap = sum(1 for e in prev if e in chosen) if prev else -1
    return out, overlap


def _blocks(rt):
    """Alias blocks per layer: the expert groups under group-limited routing, else one."""
    G, TG = rt["n_group"], rt["topk_group"]
    return G if G > 1 and TG < G else 1


def _new_request(log_pop, conc, rng, E: int, NB: int) -> tuple:
    """A fresh request (ms_route.c new_request): per layer its weights w ~ Dirichlet(conc E g) (g without
    per-request skew), the alias tables over each of the NB blocks and each block's total weight."""
    rows, tabs, tots = [], [], []
    for lp_row in log_pop:
        lp = [float(x) for x in lp_row]
        mx = max(lp)
        z = sum(math.exp(x - mx) for x in lp)
        row = []
        for e in range(E):
            g = math.exp(lp[e] - mx) / z
            x = rng.gamma(conc * E * g) if conc > 0.0 else g
            row.append(x if x > 1e-300 else 1e-300)
        rows.append(row)
        per, prob, alias, tot = E // NB, [], [], []
        for g in range(NB):
            pr, al, tt = _alias_build(row[g * per:(g + 1) * per])
            prob += pr
            alias += al
            tot.append(tt)
        tabs.append((prob, alias))
        tots.append(tot)
    return rows, tabs, tots


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
    tables = [None] * B                                 # [L] (prob, alias) over the layer's blocks
    btots = [None] * B                                  # [L][blocks] weight of each block
    NB = _blocks(rt)
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
                    prev[b] = [[] for _ in range(L)]
                    hist[b] = [[] for _ in range(L)]
                    weights[b], tables[b], btots[b] = _new_request(log_pop, conc, rng, E, NB)
                    tok_in_req[b] = 0
                tok_in_req[b] += 1
                up = None
                lag = _draw_lag(rt["recency_lag"], rng) if trace is None and H else 0
                for l in range(L):
                    if trace is not None:
                        picks = [int(e) for e in trace[tp][l % trace.shape[1]]]
                        ov = sum(1 for e in prev[b][l] if e in set(picks)) if prev[b][l] else -1
                    else:
                        picks, ov = _route_token(rt, weights[b][l], tables[b][l], btots[b][l], prev[b][l],
                                                 float(rt["stickiness"][l]), rng, E, K, l, hist[b][l], up, lag)
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
