"""Pure-Python reference implementations that the C kernel is held to (differential tests).

Slow and plain on purpose: one loop per concept, no numpy tricks, no shared code with csrc/.
Semantics are documented in csrc/moesim.h; any change there must be made here too.
"""
from __future__ import annotations

import numpy as np

from ._search import largest_true

N_CLASSES, N_TIERS = 11, 3
ATT, ROUTER, SHARED, ROUTED, DENSE, EMBED, HEAD, MTP, KV, STATE, BUF = range(11)
GPU, HOST, STORAGE = range(3)
ALL_GPU, EXPERTS_CPU, N_CPU_MOE, GPU_EXPERTS, LAYERS_GPU, CPU_ONLY, UNIFIED, OFFLOAD_CACHE = range(8)


def _layer_on_gpu(L, cfg, l):
    if cfg["placement"] == CPU_ONLY:
        return False
    if cfg["placement"] == LAYERS_GPU:
        return l >= L - cfg["placement_arg"]
    return True


def _experts_split(low, cfg, l):
    """(routed experts on GPU, routed experts in host RAM) for layer l."""
    e = int(low.n_experts[l])
    p, a = cfg["placement"], cfg["placement_arg"]
    if e == 0:
        return 0, 0
    if p in (ALL_GPU, UNIFIED):
        return e, 0
    if p in (EXPERTS_CPU, CPU_ONLY):
        return 0, e
    if p == N_CPU_MOE:
        return (0, e) if l < a else (e, 0)
    if p == GPU_EXPERTS:
        g = min(a, e)
        return g, e - g
    if p == LAYERS_GPU:
        return (e, 0) if _layer_on_gpu(low.n_layers, cfg, l) else (0, e)
    if p == OFFLOAD_CACHE:
        return min(a, e), e
    raise ValueError(p)


def _cache(low, l, c, kvb):
    cap = int(low.kv_cap[l])
    tokens = min(c, cap) if cap > 0 else c
    kv = (low.kv_elems[l] * kvb + low.kv_fixed[l]) * tokens
    ratio = int(low.kv_ratio[l])
    if ratio > 0:
        kv += (c // ratio) * (low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l])
    return kv, float(low.kv_state[l])


def account(low, cfg, context, batch):
    """Return (by_class, tier, weights, kv, state, kv_slope, fits_bits) for one context and batch."""
    L = low.n_layers
    gran = cfg["kv_granularity"]
    c = context if gran <= 1 else -(-context // gran) * gran
    kvb = cfg["kv_bytes_per_elem"]
    bc = [[0.0] * N_TIERS for _ in range(N_CLASSES)]
    any_gpu = False
    kv_total = state_total = slope = 0.0
    for l in range(L):
        t = GPU if _layer_on_gpu(L, cfg, l) else HOST
        any_gpu = any_gpu or t == GPU
        bc[ATT][t] += low.attn[l]
        bc[ROUTER][t] += low.router[l]
        bc[SHARED][t] += low.shared[l]
        bc[DENSE][t] += low.dense[l]
        g, h = _experts_split(low, cfg, l)
        any_gpu = any_gpu or g > 0
        bc[ROUTED][GPU] += g * low.expert_one[l]
        bc[ROUTED][HOST] += h * low.expert_one[l]
        kv, st = _cache(low, l, c, kvb)
        bc[KV][t] += kv * batch
        bc[STATE][t] += st * batch
        kv_total += kv * batch
        state_total += st * batch
        if low.kv_cap[l] == 0:
            slope += low.kv_elems[l] * kvb + low.kv_fixed[l]
        if low.kv_ratio[l] > 0:
            slope += (low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]) / low.kv_ratio[l]
    head_t = HOST if (cfg["placement"] == CPU_ONLY or (cfg["placement"] == LAYERS_GPU and cfg["placement_arg"] == 0)) else GPU
    emb_t = GPU if (cfg["embed_on_gpu"] and head_t == GPU) else HOST
    bc[EMBED][emb_t] += low.embed
    bc[HEAD][head_t] += low.head
    if cfg["mtp"] and low.mtp_layers > 0:
        bc[MTP][head_t] += low.mtp
        kv, st = _cache(low, L - 1, c, kvb)
        bc[KV][head_t] += kv * batch * low.mtp_layers
        bc[STATE][head_t] += st * batch * low.mtp_layers
        kv_total += kv * batch * low.mtp_layers
        state_total += st * batch * low.mtp_layers
    any_gpu = any_gpu or head_t == GPU
    if cfg["n_gpus"] > 0 and any_gpu:
        bc[BUF][GPU] = cfg["n_gpus"] * (cfg["gpu_fixed"] + cfg["gpu_buf0"] + cfg["gpu_buf_ctx"] * c)
    host_buffers = cfg["host_fixed"] + cfg["host_buf0"] + cfg["host_buf_ctx"] * c
    bc[BUF][HOST] = host_buffers

    gpu = sum(bc[k][GPU] for k in range(N_CLASSES))
    host = sum(bc[k][HOST] for k in range(N_CLASSES))
    host_weights = sum(bc[k][HOST] for k in range(MTP + 1))
    spill = 0.0
    if host > cfg["host_capacity"] and cfg["storage_spill"]:
        spill = min(host - cfg["host_capacity"], host_weights, cfg["storage_capacity"])
    tier = [gpu, host - spill, spill]
    weights = sum(bc[k][GPU] + bc[k][HOST] for k in range(MTP + 1))
    fits = 0
    if gpu <= cfg["n_gpus"] * cfg["gpu_capacity"] and host - spill <= cfg["host_capacity"]:
        if gpu > 0 and cfg["n_gpus"] > 0:
            fits |= 1
        if host - spill - bc[BUF][HOST] > 0:
            fits |= 2
        if spill > 0:
            fits |= 4
        if fits == 0:
            fits = 2
    if gpu > 0 and cfg["n_gpus"] == 0:
        fits = 0
    return bc, tier, weights, kv_total, state_total, slope, fits


def memory_one(low, cfg):
    ctx, b = cfg["context"], cfg["batch"]
    max_ctx = largest_true(lambda x: account(low, cfg, x, b)[6] != 0, 1, low.max_context) or 0
    hi = 1
    while hi < 2**30 and account(low, cfg, ctx, hi)[6]:
        hi *= 2
    max_b = largest_true(lambda x: account(low, cfg, ctx, x)[6] != 0, 1, min(hi, 2**30)) or 0
    bc, tier, weights, kv, state, slope, fits = account(low, cfg, ctx, b)
    return dict(by_class=bc, tier=tier, weights=weights, kv=kv, state=state, kv_bytes_per_token=slope, fits=fits,
                max_context=max(0, max_ctx), max_batch=max(0, max_b))


def memory_many(low, cols):
    n = len(cols["context"])
    out = {k: [] for k in ("by_class", "tier", "weights", "kv", "state", "kv_bytes_per_token", "fits",
                           "max_context", "max_batch")}
    for i in range(n):
        cfg = {k: (int(v[i]) if v.dtype.kind == "i" else float(v[i])) for k, v in cols.items()}
        r = memory_one(low, cfg)
        for k in out:
            out[k].append(r[k])
    return {
        "by_class": np.array(out["by_class"], dtype=np.float64).reshape(n, N_CLASSES, N_TIERS),
        "tier": np.array(out["tier"], dtype=np.float64).reshape(n, N_TIERS),
        "weights": np.array(out["weights"], dtype=np.float64),
        "kv": np.array(out["kv"], dtype=np.float64),
        "state": np.array(out["state"], dtype=np.float64),
        "kv_bytes_per_token": np.array(out["kv_bytes_per_token"], dtype=np.float64),
        "fits": np.array(out["fits"], dtype=np.int32),
        "max_context": np.array(out["max_context"], dtype=np.int64),
        "max_batch": np.array(out["max_batch"], dtype=np.int64),
    }


# ================================================================================ decode
# Mirrors csrc/ms_rng.c, ms_cache.c and ms_decode.c: same streams, same order of draws, same cost.
import math  # noqa: E402

M64 = (1 << 64) - 1
EXP_NONE, EXP_GPU, EXP_CPU, EXP_SPLIT, EXP_FETCH = range(5)
LRU, LFU, STATIC, BELADY = range(4)
R_GPU_MEM, R_GPU_FLOPS, R_HOST_MEM, R_CPU_FLOPS, R_PCIE, R_STORAGE, R_LATENCY, R_NET = range(8)
B_GPU, B_HOST, B_PCIE, B_STORAGE = range(4)
P_ATT, P_EXP, P_XFER, P_SYNC, P_HEAD, P_OVER = range(6)


class Rng:
    """xoshiro256** seeded through splitmix64 from (seed, a, b)."""

    def __init__(self, seed, a, b):
        x = seed & M64
        x, z = self._sm(x)
        x = z ^ (a & M64)
        x, z = self._sm(x)
        x = z ^ (b & M64)
        s = []
        for _ in range(4):
            x, z = self._sm(x)
            s.append(z)
        self.s = s

    @staticmethod
    def _sm(x):
        x = (x + 0x9E3779B97F4A7C15) & M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return x, z ^ (z >> 31)

    def next(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64  # noqa: E731
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return ((self.next() >> 11) + 0.5) * (1.0 / 9007199254740992.0)

    def gumbel(self):
        return -math.log(-math.log(self.uniform()))

    def normal(self):
        u1 = self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)

    def gamma(self, shape):
        boost = 1.0
        if shape < 1.0:
            boost = math.pow(self.uniform(), 1.0 / shape)
            shape += 1.0
        d = shape - 1.0 / 3.0
        c = 1.0 / math.sqrt(9.0 * d)
        while True:
            x = self.normal()
            v = 1.0 + c * x
            if v <= 0.0:
                continue
            v = v * v * v
            u = self.uniform()
            if u < 1.0 - 0.0331 * x * x * x * x:
                return d * v * boost
            if math.log(u) < 0.5 * x * x + d * (1.0 - v + math.log(v)):
                return d * v * boost


class Cache:
    """One per-layer expert cache (LRU, LFU, static pinning, Belady)."""

    def __init__(self, n_experts, capacity, policy, hot):
        self.capacity = min(capacity, n_experts)
        self.policy = policy
        self.slots = []              # expert per slot, in slot order
        self.freq = [0.0] * n_experts
        self.last = [-1.0] * n_experts
        self.next_use = [0.0] * n_experts
        if policy == STATIC:
            self.slots = [int(e) for e in hot[:self.capacity]]
        self.resident = set(self.slots)
        self.need = set()

    def begin_step(self, sel):
        """The step's experts are evicted only when nothing else can be."""
        self.need = set(sel)

    def access(self, e, tick, next_use):
        hit = e in self.resident
        self.need.discard(e)
        self.freq[e] += 1.0
        self.last[e] = tick
        self.next_use[e] = next_use
        if hit or self.policy == STATIC or self.capacity == 0:
            return hit
        if len(self.slots) < self.capacity:
            self.slots.append(e)
        else:
            candidates = [i for i, x in enumerate(self.slots) if x not in self.need] or range(len(self.slots))
            best = None
            for i in candidates:
                if best is None:
                    best = i
                    continue
                a, b = self.slots[i], self.slots[best]
                if self.policy == LFU:
                    if self.freq[a] < self.freq[b] or (self.freq[a] == self.freq[b] and self.last[a] < self.last[b]):
                        best = i
                elif self.policy == BELADY:
                    if self.next_use[a] > self.next_use[b]:
                        best = i
                elif self.last[a] < self.last[b]:
                    best = i
            self.resident.discard(self.slots[best])
            self.slots[best] = e
        self.resident.add(e)
        return False


def next_use(sel, n_steps, n_layers, width):
    """nu[t][l][j]: position (t' x width + j') of the next use of sel[t][l][j] in layer l (n_steps x width if never)."""
    nu = [[None] * n_layers for _ in range(n_steps)]
    for l in range(n_layers):
        last = {}
        for t in range(n_steps - 1, -1, -1):
            nu[t][l] = [last.get(e, n_steps * width) for e in sel[t][l]]
            for j, e in enumerate(sel[t][l]):
                last[e] = t * width + j
    return nu


def _route_token(rt, w, prev, p, rng, E, K):
    """One token's top-k: kept experts of the previous token, then the smallest race keys
    Exp(1)/w_e (Gumbel-top-k on log w); group-limited by each group's two best keys."""
    out = [e for e in prev if rng.uniform() < p]
    key = [-math.log(rng.uniform()) / w[e] for e in range(E)]
    allowed = [True] * E
    G, TG = rt.get("n_group", 0), rt.get("topk_group", 0)
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
    conc = rt.get("concentration", 0.0)
    req_tokens = rt.get("request_tokens", 0)
    log_pop = rt.get("log_pop")
    prev = [[[] for _ in range(L)] for _ in range(B)]
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
                for l in range(L):
                    if trace is not None:
                        picks = [int(e) for e in trace[tp][l % trace.shape[1]]]
                        ov = sum(1 for e in prev[b][l] if e in set(picks)) if prev[b][l] else -1
                    else:
                        picks, ov = _route_token(rt, weights[b][l], prev[b][l], float(rt["stickiness"][l]), rng, E, K)
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


def _layer_time(dm, hw, l, w, seqs, toks, acc):
    def put(r, ph, t):
        acc["res"][r] += t
        acc["phase"][ph] += t

    def argmax(terms):
        best = terms[0]
        for t in terms[1:]:
            if t[0] > best[0]:
                best = t
        return best

    total = 0.0
    nbytes = dm["attn_bytes"][l] + dm["shared_bytes"][l] + seqs * dm["kv_bytes"][l]
    flops = toks * (dm["attn_flops"][l] + dm["score_flops"][l] + dm["shared_flops"][l])
    if dm["attn_on_gpu"][l]:
        ta, r = argmax([(nbytes / hw["gpu_bw"], R_GPU_MEM), (flops / hw["gpu_flops"], R_GPU_FLOPS)])
        acc["bytes"][B_GPU] += nbytes
    else:
        ta, r = argmax([(nbytes / hw["host_bw"], R_HOST_MEM), (flops / hw["cpu_flops"], R_CPU_FLOPS)])
        acc["bytes"][B_HOST] += nbytes
    put(r, P_ATT, ta)
    total += ta
    if dm["attn_on_gpu"][l] and hw["launch_s"] > 0:
        put(R_LATENCY, P_SYNC, hw["launch_s"])
        total += hw["launch_s"]
    if dm["allreduce_bytes"] > 0 and dm["attn_on_gpu"][l]:
        tr = hw["allreduce_s"] + toks * dm["allreduce_bytes"] / hw["interconnect_bw"]
        put(R_NET, P_XFER, tr)
        total += tr
    if dm["expert_mode"][l] == EXP_NONE:
        return total
    eb, ef = dm["expert_bytes"][l], dm["expert_flops"][l]
    g_bytes, c_bytes = w["n_res"] * eb, w["n_cpu"] * eb
    demand = (w["n_fetch"] - w["n_pref"]) * eb
    tg_mem, tg_fl = g_bytes / hw["gpu_bw"], w["pairs_gpu"] * ef / hw["gpu_flops"]
    t_g, r_g = max(tg_mem, tg_fl), (R_GPU_MEM if tg_mem >= tg_fl else R_GPU_FLOPS)
    tc_mem, tc_fl = c_bytes / hw["host_bw"], w["pairs_cpu"] * ef / hw["cpu_flops"]
    t_c, r_c = max(tc_mem, tc_fl), (R_HOST_MEM if tc_mem >= tc_fl else R_CPU_FLOPS)
    t_p = demand / hw["pcie_bw"]
    t_h = (c_bytes + demand) / hw["host_bw"]
    t_s = w["n_disk"] * eb / hw["storage_bw"]
    acc["bytes"][B_GPU] += g_bytes
    acc["bytes"][B_HOST] += c_bytes + (w["n_fetch"] + w["n_waste"]) * eb
    acc["bytes"][B_PCIE] += (w["n_fetch"] + w["n_waste"]) * eb
    acc["bytes"][B_STORAGE] += w["n_disk"] * eb
    if hw["overlap"]:
        te, r = argmax([(t_g, r_g), (t_c, r_c), (t_p, R_PCIE), (t_h, R_HOST_MEM), (t_s, R_STORAGE),
                        ((g_bytes + c_bytes) / hw["gpu_bw"] if hw["unified"] else 0.0, R_GPU_MEM)])
        put(r, P_XFER if r == R_PCIE else P_EXP, te)
    else:
        tcpu, r = argmax([(t_c, r_c), (t_h, R_HOST_MEM), (t_s, R_STORAGE)])
        put(r, P_EXP, tcpu)
        put(r_g, P_EXP, t_g)
        put(R_PCIE, P_XFER, t_p)
        te = tcpu + t_g + t_p
        if hw["unified"] and (g_bytes + c_bytes) / hw["gpu_bw"] > t_g + tcpu:
            extra = (g_bytes + c_bytes) / hw["gpu_bw"] - (t_g + tcpu)
            put(R_GPU_MEM, P_EXP, extra)
            te += extra
    total += te
    if w["n_cpu"] > 0:
        tact = toks * dm["act_bytes"] / hw["pcie_bw"]
        put(R_LATENCY, P_SYNC, hw["sync_s"])
        put(R_PCIE, P_XFER, tact)
        acc["bytes"][B_PCIE] += toks * dm["act_bytes"]
        total += hw["sync_s"] + tact
    if w["n_fetch"] - w["n_pref"] > 0 and hw["dma_s"] > 0:
        td = (w["n_fetch"] - w["n_pref"]) * hw["dma_s"]
        put(R_LATENCY, P_SYNC, td)
        total += td
    return total


def _step_time(dm, hw, c, work, acc):
    seqs, toks = float(c["batch"]), float(c["batch"] * c["tokens_per_step"])
    n = len(dm["attn_bytes"])
    lt = [_layer_time(dm, hw, l, work[l], seqs, toks, acc) for l in range(n)]
    for l in range(1, n):
        w = work[l]
        if w["n_pref"] + w["n_waste"] <= 0:
            continue
        bg = (w["n_pref"] + w["n_waste"]) * dm["expert_bytes"][l] / hw["pcie_bw"]
        if bg > lt[l - 1]:
            acc["res"][R_PCIE] += bg - lt[l - 1]
            acc["phase"][P_XFER] += bg - lt[l - 1]
            lt[l - 1] = bg
    on_gpu = dm["head_on_gpu"]
    bw = hw["gpu_bw"] if on_gpu else hw["host_bw"]
    fl = hw["gpu_flops"] if on_gpu else hw["cpu_flops"]
    rm, rf = (R_GPU_MEM, R_GPU_FLOPS) if on_gpu else (R_HOST_MEM, R_CPU_FLOPS)
    th_m, th_f = dm["head_bytes"] / bw, toks * dm["head_flops"] / fl
    fixed = th_m if th_m >= th_f else th_f
    acc["res"][rm if th_m >= th_f else rf] += fixed
    acc["phase"][P_HEAD] += fixed
    acc["bytes"][B_GPU if on_gpu else B_HOST] += dm["head_bytes"]
    if c["drafts"] > 0:
        dm_t, df_t = dm["draft_bytes"] / bw, seqs * dm["draft_flops"] / fl
        td = c["drafts"] * (dm_t if dm_t >= df_t else df_t)
        acc["res"][rm if dm_t >= df_t else rf] += td
        acc["phase"][P_HEAD] += td
        acc["bytes"][B_GPU if on_gpu else B_HOST] += c["drafts"] * dm["draft_bytes"]
        fixed += td
    ts = hw["step_s"] + hw.get("seq_s", 0.0) * seqs
    if ts > 0:
        acc["res"][R_LATENCY] += ts
        acc["phase"][P_OVER] += ts
        fixed += ts
    return fixed + sum(lt)


def _new_acc():
    return {"res": [0.0] * 8, "phase": [0.0] * 6, "bytes": [0.0] * 4}


def _zero_work():
    return dict(n_res=0.0, n_cpu=0.0, n_fetch=0.0, n_pref=0.0, n_waste=0.0, n_disk=0.0, pairs_gpu=0.0,
                pairs_cpu=0.0)


def decode_montecarlo(dm, hw, rt, c):
    n = len(dm["attn_bytes"])
    L, E = rt["n_layers"], max(1, rt["n_experts"])
    sel, cnt, rnum, rden, selections, _ = route(rt, c)
    T, warm, policy = c["steps"], c["warmup"], c["policy"]
    W = min(E, c["batch"] * c["tokens_per_step"] * rt["top_k"])
    nu = next_use(sel, T, L, max(W, 1)) if policy == BELADY else None
    hot = rt.get("hot")
    recall = rt.get("recall")
    gpu_c, page_c = {}, {}
    for i in range(n):
        l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
        if l < 0:
            continue
        cap = int(dm["slots"][i]) if mode in (EXP_SPLIT, EXP_FETCH) else 0
        gpu_c[l] = Cache(E, cap, STATIC if mode == EXP_SPLIT else policy, hot[l])
        page_c[l] = Cache(E, int(dm["page_slots"][i]), LRU, hot[l])
    prng = Rng(c["seed"], c["index"], M64)
    acc = _new_acc()
    times = []
    hits = loads = phits = ploads = distinct = 0.0
    for t in range(T):
        step_acc = acc if t >= warm else _new_acc()
        W = min(E, c["batch"] * c["tokens_per_step"] * rt["top_k"])
        tick = float(t * W)
        work = []
        for i in range(n):
            w = _zero_work()
            work.append(w)
            l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
            if l < 0 or mode == EXP_NONE:
                continue
            if t >= warm:
                distinct += len(sel[t][l])
            gpu_c[l].begin_step(sel[t][l])
            page_c[l].begin_step(sel[t][l])
            for j, e in enumerate(sel[t][l]):
                pairs = float(cnt[t][l][j])
                nxt = float(nu[t][l][j]) if nu is not None else 0.0
                on_gpu = host_read = False
                if mode == EXP_GPU:
                    on_gpu = True
                elif mode == EXP_CPU:
                    host_read = True
                else:
                    hit = gpu_c[l].access(e, tick + j, nxt)
                    if t >= warm:
                        hits += hit
                        loads += 1
                    if hit:
                        on_gpu = True
                    elif mode == EXP_FETCH:
                        on_gpu = host_read = True
                        w["n_fetch"] += 1
                        if recall[l] > 0 and i > 0 and prng.uniform() < recall[l]:
                            w["n_pref"] += 1
                    else:
                        host_read = True
                if on_gpu:
                    w["n_res"] += 1
                    w["pairs_gpu"] += pairs
                if host_read and mode != EXP_FETCH:
                    w["n_cpu"] += 1
                    w["pairs_cpu"] += pairs
                if host_read and dm["page_slots"][i] < E:
                    ph = page_c[l].access(e, tick + j, 0.0)
                    if t >= warm:
                        phits += ph
                        ploads += 1
                    if not ph:
                        w["n_disk"] += 1
            if recall[l] > 0 and i > 0:
                w["n_waste"] = w["n_fetch"] - w["n_pref"]
        st = _step_time(dm, hw, c, work, step_acc)
        if t >= warm:
            times.append(st)
    k = len(times)
    srt = sorted(times)
    n_moe = sum(1 for i in range(n) if dm["moe_index"][i] >= 0 and dm["expert_mode"][i] != EXP_NONE)
    return dict(step_mean=sum(times) / k, step_p50=srt[(k - 1) // 2], step_p99=srt[math.ceil(0.99 * k) - 1],
                accepted=c["accepted"], hit_rate=hits / loads if loads > 0 else -1.0,
                page_hit_rate=phits / ploads if ploads > 0 else -1.0,
                distinct=distinct / (k * n_moe) if n_moe else 0.0, reuse=rnum / rden if rden else 0.0,
                selections=selections, by_resource=[x / k for x in acc["res"]],
                by_phase=[x / k for x in acc["phase"]], bytes=[x / k for x in acc["bytes"]])


def che_hits(p, capacity):
    """Expected hits per step of a step-aware LRU cache (Che's approximation at step level; when a
    step's D experts exceed the capacity, an id-ordered C-subset of the last step: (C/D) sum p^2)."""
    support = sum(1 for x in p if x > 0)
    D = sum(p)
    if support <= capacity:
        return D
    if capacity <= 0:
        return 0.0
    if D >= capacity:
        return sum(x * x for x in p) * capacity / D
    tau = max(1.0, math.log1p(-capacity / support) / math.log1p(-D / support))
    for _ in range(200):
        f, df = -capacity, 0.0
        for x in p:
            a = -math.log1p(-min(x, 1.0 - 1e-15))
            ex = math.exp(-a * tau)
            f += 1.0 - ex
            df += a * ex
        step = -f / df
        tau = max(1.0, tau + step)
        if not (abs(step) > 1e-14 * tau):
            break
    return sum(x * (1.0 - math.exp(math.log1p(-min(x, 1.0 - 1e-15)) * tau)) for x in p)


def decode_analytic(dm, hw, rt, c):
    if c["policy"] == BELADY:
        raise ValueError("belady needs montecarlo")
    n = len(dm["attn_bytes"])
    E, K = rt["n_experts"], rt["top_k"]
    q = rt["q"]
    S = len(q)
    B, tps = c["batch"], c["tokens_per_step"]
    toks = float(B * tps)
    hits = loads = phits = ploads = distinct = reuse = 0.0
    n_moe = 0
    work = []
    for i in range(n):
        w = _zero_work()
        work.append(w)
        l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
        if l < 0 or mode == EXP_NONE:
            continue
        n_moe += 1
        qbar, sq = [], 0.0
        for e in range(E):
            s = 0.0
            for k in range(S):
                s += q[k][l][e]
                sq += q[k][l][e] * q[k][l][e]
            qbar.append(s / S)
        # step inclusion 1 - (1 - qbar)^toks, written as the kernel evaluates it (exp of toks x log1p)
        p = list(qbar) if toks == 1.0 else [1.0 - math.exp(toks * math.log1p(-min(x, 1.0 - 1e-16))) for x in qbar]
        D = sum(p)
        pinned = [int(e) for e in rt["hot"][l][:min(int(dm["slots"][i]), E)]]
        pinned_set = set(pinned)
        pinned_q = sum(qbar[e] for e in range(E) if e in pinned_set)
        pinned_p = sum(p[e] for e in range(E) if e in pinned_set)
        free_q = sum(qbar[e] for e in range(E) if e not in pinned_set)
        free_p = sum(p[e] for e in range(E) if e not in pinned_set)
        distinct += D
        stick = float(rt["stickiness"][l])
        reuse += stick + (1.0 - stick) * sq / (S * K)
        if mode == EXP_GPU:
            w["n_res"], w["pairs_gpu"] = D, toks * K
        elif mode == EXP_CPU:
            w["n_cpu"], w["pairs_cpu"] = D, toks * K
        elif mode == EXP_SPLIT:
            w["n_res"], w["n_cpu"] = pinned_p, free_p
            w["pairs_gpu"] = toks * pinned_q
            w["pairs_cpu"] = toks * free_q
            hits += pinned_p
            loads += D
        else:
            C = float(dm["slots"][i])
            if c["policy"] == LRU:
                hsum = dsum = 0.0
                for j in range(S):
                    pc = []
                    for e in range(E):
                        lg = 0.0
                        for b in range(min(B, S)):
                            s = (j + b) % S
                            reps = B // S + (1 if b < B % S else 0)
                            lg += reps * math.log1p(-min(q[s][l][e], 1.0 - 1e-16))
                        pc.append(1.0 - math.exp(tps * lg))
                    hsum += che_hits(pc, C)
                    dsum += sum(pc)
                h = hsum / dsum if dsum > 0 else 0.0
                sigma = stick * min(1.0, C / max(D, 1e-300))
                h = sigma + (1.0 - sigma) * h
                w["n_fetch"] = D * (1.0 - h)
            else:
                h = pinned_p / D if D > 0 else 0.0
                w["n_fetch"] = free_p
            w["n_res"], w["pairs_gpu"] = D, toks * K
            rc = float(rt["recall"][l])
            if rc > 0 and i > 0:
                w["n_pref"] = rc * w["n_fetch"]
                w["n_waste"] = w["n_fetch"] - w["n_pref"]
            hits += D * h
            loads += D
        if dm["page_slots"][i] < E and mode in (EXP_CPU, EXP_SPLIT, EXP_FETCH):
            host = w["n_fetch"] if mode == EXP_FETCH else w["n_cpu"]
            ph = che_hits(p, float(dm["page_slots"][i])) / D if D > 0 else 0.0
            w["n_disk"] = host * (1.0 - ph)
            phits += host * ph
            ploads += host
    acc = _new_acc()
    st = _step_time(dm, hw, c, work, acc)
    return dict(step_mean=st, step_p50=st, step_p99=st, accepted=c["accepted"],
                hit_rate=hits / loads if loads > 0 else -1.0, page_hit_rate=phits / ploads if ploads > 0 else -1.0,
                distinct=distinct / n_moe if n_moe else 0.0, reuse=reuse / n_moe if n_moe else 0.0,
                selections=0.0, by_resource=acc["res"], by_phase=acc["phase"], bytes=acc["bytes"])


def decode_many(dm, hw, rt, cols):
    """Reference twin of ms_decode_many: same columns in, same result arrays out."""
    n = len(cols["batch"])
    rows = []
    for i in range(n):
        c = {k: (float(cols[k][i]) if k == "accepted" else int(cols[k][i])) for k in cols}
        r = decode_analytic(dm, hw, rt, c) if c["mode"] == 1 else decode_montecarlo(dm, hw, rt, c)
        rows.append(r)
    out = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]} if rows else {}
    return out
