"""Pure-Python reference implementations that the C kernel is held to (differential tests).

Slow and plain on purpose: one loop per concept, no numpy tricks, no shared code with csrc/.
Semantics are documented in csrc/moesim.h; any change there must be made here too.
"""
from __future__ import annotations

import math

import numpy as np

from ..codes import (BYTES_GPU_MEM, BYTES_HOST_MEM, BYTES_PCIE, BYTES_STORAGE, EXP_CPU, EXP_FETCH, EXP_GPU, EXP_NONE,
    EXP_SPLIT, PHASE_ALLTOALL, PHASE_ATTENTION, PHASE_EXPERTS, PHASE_HEAD, PHASE_OVERHEAD, PHASE_SYNC, PHASE_TRANSFER, POLICY_BELADY,
    POLICY_LFU, POLICY_LRU, POLICY_STATIC, RES_CPU_COMPUTE, RES_GPU_COMPUTE, RES_GPU_MEM, RES_HOST_MEM, RES_INTERCONNECT,
    RES_LATENCY, RES_PCIE, RES_STORAGE)
from ..lower.machine import gemm_tokens, gemv_time, weight_passes
from .cache import Cache, next_use
from .rng import M64, Rng
from .route import route
from . import window as W
from .cache_rates import chain_reuse, lfu_hit_rate, lru_hit_rate


def _argmax(terms):
    """The (time, resource) term with the largest time, the first on a tie (ms_decode.c max_term)."""
    best = terms[0]
    for t in terms[1:]:
        if t[0] > best[0]:
            best = t
    return best


def kernel_time(t_mem: float, t_flops: float, res_mem: int, res_flops: int) -> tuple:
    """ms_kernel_time: (the larger of a kernel group's memory and compute terms, memory on a tie; its resource).
    The sweep twin's per-kind context terms use it too."""
    return (t_flops, res_flops) if t_flops > t_mem else (t_mem, res_mem)


def _put(acc, r, ph, t):
    acc["res"][r] += t
    acc["phase"][ph] += t


def _attention_time(dm, hw, l, seqs, toks, acc):
    """Layer l's attention, router, shared experts and dense FFN (ms_decode.c layer_attention), then its
    launches and tensor-parallel all-reduce."""
    # the weight GEMVs (projections, router, shared experts, dense FFN), then the attention over the KV cache:
    # two kernel groups in turn, each the larger of its memory and compute terms (ms_kernel_time)
    w_bytes = dm["attn_bytes"][l] + dm["shared_bytes"][l]
    kv_bytes = seqs * dm["kv_bytes"][l]
    gpu = bool(dm["attn_on_gpu"][l])
    # a GPU's mat-mat kernel multiplies whole token tiles, and leaves idle the threadgroups few rows do not fill
    w_toks = gemm_tokens(hw, toks, dm["gemm_rows"][l]) if gpu else toks
    w_flops = w_toks * (dm["attn_flops"][l] + dm["shared_flops"][l])
    s_flops = toks * dm["score_flops"][l]
    bw, fl = (hw["gpu_bw"], hw["gpu_flops"]) if gpu else (hw["host_bw"], hw["cpu_flops"])
    res_mem, res_flops = (RES_GPU_MEM, RES_GPU_COMPUTE) if gpu else (RES_HOST_MEM, RES_CPU_COMPUTE)
    # a GPU backend whose GEMVs re-read the weights per token (or per small-batch tile) reads them that often
    passes = weight_passes(hw, toks) if gpu else 1.0
    # ... and decodes each pass's weights at the GEMV's own rate (ggml-metal; 0 elsewhere), its further tokens'
    # dot products on top
    gemv_weights = 0.5 * (dm["attn_flops"][l] + dm["shared_flops"][l])
    t_dec, t_tok = gemv_time(hw, toks, passes, gemv_weights) if gpu else (0.0, 0.0)
    tw, r = kernel_time(passes * (w_bytes / bw), max(w_flops / fl, t_dec), res_mem, res_flops)
    _put(acc, r, PHASE_ATTENTION, tw)
    _put(acc, RES_GPU_COMPUTE, PHASE_ATTENTION, t_tok)
    tw += t_tok
    # the attention scores at the CPU's attention-kernel rate, not its matmul rate
    ts, r = kernel_time(kv_bytes / bw, s_flops / (fl if gpu else hw["cpu_attn_flops"]), res_mem, res_flops)
    _put(acc, r, PHASE_ATTENTION, ts)
    acc["bytes"][BYTES_GPU_MEM if gpu else BYTES_HOST_MEM] += passes * w_bytes + kv_bytes
    total = tw + ts
    if dm["attn_on_gpu"][l] and hw["launch_s"] > 0:
        # a build that captures graphs only up to graph_max_tokens launches larger steps kernel by kernel
        tl = hw["launch_s"] + (hw["nograph_s"] if 0 < hw["graph_max_tokens"] < toks else 0.0)
        _put(acc, RES_LATENCY, PHASE_SYNC, tl)
        total += tl
    if not dm["attn_on_gpu"][l] and hw["cpu_layer_s"] > 0:
        # a CPU layer's graph nodes each end in a barrier across the threads
        _put(acc, RES_LATENCY, PHASE_SYNC, hw["cpu_layer_s"])
        total += hw["cpu_layer_s"]
    if dm["layer_ops"][l] > 0:
        # graph nodes beyond an attention layer's (an unfused recurrence), each launched or barriered
        to = dm["layer_ops"][l] * (hw["op_s"] if gpu else hw["cpu_op_s"])
        _put(acc, RES_LATENCY, PHASE_SYNC, to)
        total += to
    if dm["allreduce_bytes"] > 0 and dm["attn_on_gpu"][l]:
        tr = hw["allreduce_s"] + toks * dm["allreduce_bytes"] / hw["interconnect_bw"]
        _put(acc, RES_INTERCONNECT, PHASE_TRANSFER, tr)
        total += tr
    return total


def _layer_time(dm, hw, l, w, seqs, toks, acc):
    total = _attention_time(dm, hw, l, seqs, toks, acc)
    if dm["expert_mode"][l] == EXP_NONE:
        return total
    eb, ef = dm["expert_bytes"][l], dm["expert_flops"][l]
    # a step of fewer than moe_rowwise_below tokens multiplies each token-expert pair on its own (mul_mv_id)
    rowwise = 0 < hw["moe_rowwise_below"] and toks < hw["moe_rowwise_below"]
    g_bytes, c_bytes = (w["pairs_gpu"] if rowwise else w["n_res"]) * eb, w["n_cpu"] * eb
    demand = (w["n_fetch"] - w["n_pref"]) * eb
    # expert parallelism: the busiest rank's experts and pairs over the mean (1 without EP)
    tg_mem = g_bytes * dm["ep_load_experts"][l] / hw["gpu_bw"]
    # ... and from there its mat-mat kernel multiplies each used expert's tokens in whole mm_tile_tokens tiles
    pairs = w["pairs_gpu"]
    if hw["mm_min_tokens"] > 0 and hw["moe_rowwise_below"] > 0 and not rowwise:
        pairs = max(pairs, w["n_res"] * float(hw["mm_tile_tokens"]))
    tg_fl = pairs * ef * dm["ep_load_pairs"][l] / hw["gpu_flops"]
    if rowwise:     # mul_mv_id decodes each pair's expert weights at the GEMV's rate
        tg_fl = max(tg_fl, gemv_time(hw, toks, toks, 0.5 * w["pairs_gpu"] * ef / toks)[0])
    t_g, r_g = max(tg_mem, tg_fl), (RES_GPU_MEM if tg_mem >= tg_fl else RES_GPU_COMPUTE)
    tc_mem, tc_fl = c_bytes / hw["host_bw"], w["pairs_cpu"] * ef / hw["cpu_flops"]
    t_c, r_c = max(tc_mem, tc_fl), (RES_HOST_MEM if tc_mem >= tc_fl else RES_CPU_COMPUTE)
    t_p = demand / hw["pcie_bw"]
    t_h = (c_bytes + demand) / hw["host_bw"]
    t_s = w["n_disk"] * eb / hw["storage_bw"]
    acc["bytes"][BYTES_GPU_MEM] += g_bytes
    acc["bytes"][BYTES_HOST_MEM] += c_bytes + (w["n_fetch"] + w["n_waste"]) * eb
    acc["bytes"][BYTES_PCIE] += (w["n_fetch"] + w["n_waste"]) * eb
    acc["bytes"][BYTES_STORAGE] += w["n_disk"] * eb
    if hw["overlap"]:
        te, r = _argmax([(t_g, r_g), (t_c, r_c), (t_p, RES_PCIE), (t_h, RES_HOST_MEM), (t_s, RES_STORAGE),
                        ((g_bytes + c_bytes) / hw["gpu_bw"] if hw["unified"] else 0.0, RES_GPU_MEM)])
        _put(acc, r, PHASE_TRANSFER if r == RES_PCIE else PHASE_EXPERTS, te)
    else:
        tcpu, r = _argmax([(t_c, r_c), (t_h, RES_HOST_MEM), (t_s, RES_STORAGE)])
        _put(acc, r, PHASE_EXPERTS, tcpu)
        _put(acc, r_g, PHASE_EXPERTS, t_g)
        _put(acc, RES_PCIE, PHASE_TRANSFER, t_p)
        te = tcpu + t_g + t_p
        if hw["unified"] and (g_bytes + c_bytes) / hw["gpu_bw"] > t_g + tcpu:
            extra = (g_bytes + c_bytes) / hw["gpu_bw"] - (t_g + tcpu)
            _put(acc, RES_GPU_MEM, PHASE_EXPERTS, extra)
            te += extra
    total += te
    if w["n_cpu"] > 0:
        tact = toks * dm["act_bytes"] / hw["pcie_bw"]
        _put(acc, RES_LATENCY, PHASE_SYNC, hw["sync_s"])
        _put(acc, RES_PCIE, PHASE_TRANSFER, tact)
        acc["bytes"][BYTES_PCIE] += toks * dm["act_bytes"]
        total += hw["sync_s"] + tact
    if w["n_fetch"] - w["n_pref"] > 0 and hw["dma_s"] > 0:
        td = (w["n_fetch"] - w["n_pref"]) * hw["dma_s"]
        _put(acc, RES_LATENCY, PHASE_SYNC, td)
        total += td
    if dm["a2a_bytes"] > 0:
        # dispatch + combine all-to-all: latency plus one rank's bytes over its fabric share
        t2 = hw["a2a_s"] + toks * dm["a2a_bytes"] / hw["a2a_bw"]
        _put(acc, RES_INTERCONNECT, PHASE_ALLTOALL, t2)
        total += t2
    # the router, top-k, weighting and combining kernels beside the expert GEMMs; past the graph limit the expert
    # GEMMs take MMQ with expert ids, which synchronises the stream
    tm = hw["moe_s"] + (hw["mmid_sync_s"] if w["pairs_gpu"] > 0 and 0 < hw["graph_max_tokens"] < toks else 0.0)
    if dm["attn_on_gpu"][l] and tm > 0:
        _put(acc, RES_LATENCY, PHASE_SYNC, tm)
        total += tm
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
            acc["res"][RES_PCIE] += bg - lt[l - 1]
            acc["phase"][PHASE_TRANSFER] += bg - lt[l - 1]
            lt[l - 1] = bg
    on_gpu = dm["head_on_gpu"]
    bw = hw["gpu_bw"] if on_gpu else hw["host_bw"]
    fl = hw["gpu_flops"] if on_gpu else hw["cpu_flops"]
    rm, rf = (RES_GPU_MEM, RES_GPU_COMPUTE) if on_gpu else (RES_HOST_MEM, RES_CPU_COMPUTE)
    passes = weight_passes(hw, toks) if on_gpu else 1.0
    head_toks = gemm_tokens(hw, toks, 0.0) if on_gpu else toks
    th_m, th_f = passes * (dm["head_bytes"] / bw), head_toks * dm["head_flops"] / fl
    h_dec, h_tok = gemv_time(hw, toks, passes, 0.5 * dm["head_flops"]) if on_gpu else (0.0, 0.0)
    th_f = max(th_f, h_dec)
    fixed = th_m if th_m >= th_f else th_f
    acc["res"][rm if th_m >= th_f else rf] += fixed
    acc["phase"][PHASE_HEAD] += fixed
    _put(acc, RES_GPU_COMPUTE, PHASE_HEAD, h_tok)
    fixed += h_tok
    acc["bytes"][BYTES_GPU_MEM if on_gpu else BYTES_HOST_MEM] += passes * dm["head_bytes"]
    if c["drafts"] > 0:
        dm_t, df_t = dm["draft_bytes"] / bw, seqs * dm["draft_flops"] / fl
        td = c["drafts"] * (dm_t if dm_t >= df_t else df_t)
        acc["res"][rm if dm_t >= df_t else rf] += td
        acc["phase"][PHASE_HEAD] += td
        acc["bytes"][BYTES_GPU_MEM if on_gpu else BYTES_HOST_MEM] += c["drafts"] * dm["draft_bytes"]
        fixed += td
    ts = hw["step_s"] + hw["seq_s"] * seqs
    if ts > 0:
        acc["res"][RES_LATENCY] += ts
        acc["phase"][PHASE_OVERHEAD] += ts
        fixed += ts
    return fixed + sum(lt)


def _new_acc():
    return {"res": [0.0] * 8, "phase": [0.0] * 7, "bytes": [0.0] * 4}


def _zero_work():
    return dict(n_res=0.0, n_cpu=0.0, n_fetch=0.0, n_pref=0.0, n_waste=0.0, n_disk=0.0, pairs_gpu=0.0,
                pairs_cpu=0.0)


def decode_montecarlo(dm, hw, rt, c):
    """Monte Carlo decode: route every step, serve each layer's selected experts through its caches,
    time the step; statistics over the steps after warm-up."""
    run = _MonteCarlo(dm, rt, c)
    acc = _new_acc()
    times = []
    for t in range(c["steps"]):
        step_acc = acc if t >= run.warm else _new_acc()
        st = _step_time(dm, hw, c, run.step_work(t), step_acc)
        if t >= run.warm:
            times.append(st)
    return run.result(times, acc)


class _MonteCarlo:
    """One Monte Carlo run's state: the routed steps, each MoE layer's GPU and host page caches, the
    prefetch RNG and the counters of the statistics (counted from the warm-up step on)."""

    def __init__(self, dm, rt, c):
        self.dm, self.rt, self.c = dm, rt, c
        self.n = len(dm["attn_bytes"])
        self.E = max(1, rt["n_experts"])
        self.sel, self.cnt, self.rnum, self.rden, self.selections, _ = route(rt, c)
        self.warm = c["warmup"]
        # Belady evicts by next use, which needs the whole future of the routing
        W = min(self.E, c["batch"] * c["tokens_per_step"] * rt["top_k"])
        self.nu = next_use(self.sel, c["steps"], rt["n_layers"], max(W, 1)) if c["policy"] == POLICY_BELADY else None
        self.recall = rt.get("recall")
        self.gpu_c, self.page_c = self._caches()
        self.prng = Rng(c["seed"], c["index"], M64)
        self.hits = self.loads = self.phits = self.ploads = self.distinct = 0.0

    def _caches(self):
        """Per MoE layer: the GPU expert cache (static pinning for a split, the run's policy for fetches)
        and the host page cache (LRU over mmap'd pages)."""
        dm, E, hot = self.dm, self.E, self.rt.get("hot")
        gpu_c, page_c = {}, {}
        for i in range(self.n):
            l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
            if l < 0:
                continue
            cap = int(dm["slots"][i]) if mode in (EXP_SPLIT, EXP_FETCH) else 0
            gpu_c[l] = Cache(E, cap, POLICY_STATIC if mode == EXP_SPLIT else self.c["policy"], hot[l])
            page_c[l] = Cache(E, int(dm["page_slots"][i]), POLICY_LRU, hot[l])
        return gpu_c, page_c

    def step_work(self, t):
        """Step ``t``'s work per layer; cache ticks advance by the step's expert count W."""
        c = self.c
        W = min(self.E, c["batch"] * c["tokens_per_step"] * self.rt["top_k"])
        tick = float(t * W)
        return [self._layer_work(i, t, tick) for i in range(self.n)]

    def _layer_work(self, i, t, tick):
        """Layer ``i``'s experts at step ``t``, served in expert-id order; unused prefetches are waste."""
        dm = self.dm
        w = _zero_work()
        l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
        if l < 0 or mode == EXP_NONE:
            return w
        step = self.sel[t][l]
        if t >= self.warm:
            self.distinct += len(step)
        self.gpu_c[l].begin_step(step)
        self.page_c[l].begin_step(step)
        for j, e in enumerate(step):
            self._serve(w, i, l, mode, t, j, e, tick + j)
        if self.recall[l] > 0 and i > 0:
            w["n_waste"] = w["n_fetch"] - w["n_pref"]
        return w

    def _serve(self, w, i, l, mode, t, j, e, at):
        """One selected expert: where it runs, and its pages read from storage when the host misses."""
        pairs = float(self.cnt[t][l][j])
        on_gpu, host_read = self._locate(w, i, l, mode, t, j, e, at)
        if on_gpu:
            w["n_res"] += 1
            w["pairs_gpu"] += pairs
        if host_read and mode != EXP_FETCH:
            w["n_cpu"] += 1
            w["pairs_cpu"] += pairs
        if host_read and self.dm["page_slots"][i] < self.E:
            ph = self.page_c[l].access(e, at, 0.0)
            if t >= self.warm:
                self.phits += ph
                self.ploads += 1
            if not ph:
                w["n_disk"] += 1

    def _locate(self, w, i, l, mode, t, j, e, at):
        """(runs on the GPU, read from host memory): by placement, or by a GPU cache lookup; a fetch
        miss is copied over PCIe, by the predictor ahead of time with probability ``recall``."""
        nxt = float(self.nu[t][l][j]) if self.nu is not None else 0.0
        if mode == EXP_GPU:
            return True, False
        if mode == EXP_CPU:
            return False, True
        hit = self.gpu_c[l].access(e, at, nxt)
        if t >= self.warm:
            self.hits += hit
            self.loads += 1
        if hit:
            return True, False
        if mode == EXP_FETCH:
            w["n_fetch"] += 1
            if self.recall[l] > 0 and i > 0 and self.prng.uniform() < self.recall[l]:
                w["n_pref"] += 1
            return True, True
        return False, True

    def result(self, times, acc):
        """Step-time statistics over the counted steps, and per-step means of the breakdowns."""
        dm, c, n = self.dm, self.c, self.n
        k = len(times)
        srt = sorted(times)
        n_moe = sum(1 for i in range(n) if dm["moe_index"][i] >= 0 and dm["expert_mode"][i] != EXP_NONE)
        return dict(step_mean=sum(times) / k, step_p50=srt[(k - 1) // 2], step_p99=srt[math.ceil(0.99 * k) - 1],
                    accepted=c["accepted"], hit_rate=self.hits / self.loads if self.loads > 0 else -1.0,
                    page_hit_rate=self.phits / self.ploads if self.ploads > 0 else -1.0,
                    distinct=self.distinct / (k * n_moe) if n_moe else 0.0,
                    reuse=self.rnum / self.rden if self.rden else 0.0,
                    selections=self.selections, by_resource=[x / k for x in acc["res"]],
                    by_phase=[x / k for x in acc["phase"]], bytes=[x / k for x in acc["bytes"]])


def decode_analytic(dm, hw, rt, c):
    """Analytic decode: one expected step from the routing's per-token selection probabilities
    (``rt["q"]``: one table per routing sample), with cache hit rates in closed form."""
    if c["policy"] == POLICY_BELADY:
        raise ValueError("belady needs montecarlo")
    n = len(dm["attn_bytes"])
    E, K = rt["n_experts"], rt["top_k"]
    q = rt["q"]
    tally = dict(hits=0.0, loads=0.0, phits=0.0, ploads=0.0, distinct=0.0, reuse=0.0, n_moe=0)
    work = [_analytic_layer_work(dm, rt, c, i, q, E, K, tally) for i in range(n)]
    acc = _new_acc()
    st = _step_time(dm, hw, c, work, acc)
    n_moe = tally["n_moe"]
    return dict(step_mean=st, step_p50=st, step_p99=st, accepted=c["accepted"],
                hit_rate=tally["hits"] / tally["loads"] if tally["loads"] > 0 else -1.0,
                page_hit_rate=tally["phits"] / tally["ploads"] if tally["ploads"] > 0 else -1.0,
                distinct=tally["distinct"] / n_moe if n_moe else 0.0, reuse=tally["reuse"] / n_moe if n_moe else 0.0,
                selections=0.0, by_resource=acc["res"], by_phase=acc["phase"], bytes=acc["bytes"])


def _layer_counts(rt, q, l, B, tps, slots, policy, hit=True, steps=256, warmup=32):
    """Twin of ms_analytic.c layer_counts: routing layer ``l``'s step counts at ``slots`` GPU slots,
    (distinct, pinned q, pinned p, free q, free p, hit rate, reuse) as codes.CHE_FIELDS orders them, and the
    inclusion probabilities p."""
    E, K = rt["n_experts"], rt["top_k"]
    qbar = _mean_selection(q, l, E)
    memory = rt.get("win_lq") is not None
    p = W.window_inclusion(rt, l, B, tps) if memory else _step_inclusion(qbar, float(B * tps))
    D = 0.0
    for x in p:
        D += x
    pinned_q, pinned_p, free_q, free_p = _pinned_sums(rt["hot"][l], slots, E, qbar, p)
    if not hit:
        h = 0.0
    elif policy == POLICY_LRU:
        h = _lru_layer(rt, q, l, B, tps, float(slots), D)
    elif policy == POLICY_LFU and slots <= 1:  # one slot: no choice of victim, LRU's cache (ms_analytic.c lfu_layer)
        h = _lru_layer(rt, q, l, B, tps, float(slots), D)
    elif policy == POLICY_LFU:
        h, forced = lfu_hit_rate(q, float(rt["stickiness"][l]), int(rt.get("request_tokens", 0)), l, E, B, tps,
                                 float(slots), float(steps), float(warmup), K, windows=rt if memory else None)
        forced *= D / E         # ms_analytic.c lfu_layer: LRU's rate on the steps that need every resident, as far
        if forced > 0.0:        # as their accesses sweep the expert set
            h = (1.0 - forced) * h + forced * _lru_layer(rt, q, l, B, tps, float(slots), D)
    else:
        h = pinned_p / D if D > 0 else 0.0      # static
    stick = float(rt["stickiness"][l])
    reuse = W.window_reuse(rt, l, K) if memory else chain_reuse(q, stick, l, E, K)
    return (D, pinned_q, pinned_p, free_q, free_p, h, reuse), p


def _analytic_layer_work(dm, rt, c, i, q, E, K, tally):
    """Layer ``i``'s expected work in one step, by where its experts are served (its counts from the
    configuration's table when it has one for this layer's slots, as the C reads them); adds its hit, page
    and reuse statistics to ``tally``."""
    w = _zero_work()
    l, mode = int(dm["moe_index"][i]), int(dm["expert_mode"][i])
    if l < 0 or mode == EXP_NONE:
        return w
    toks = float(c["batch"] * c["tokens_per_step"])
    tally["n_moe"] += 1
    slots = int(dm["slots"][i])
    tabled = c.get("che") is not None and c["che_slots"] == slots
    row = _layer_counts(rt, q, l, c["batch"], c["tokens_per_step"], slots, c["policy"],
                        hit=not tabled and mode == EXP_FETCH, steps=c["steps"], warmup=c["warmup"])[0]
    if tabled:
        row = tuple(float(x) for x in c["che"][l])
    D, pinned_q, pinned_p, free_q, free_p, h, reuse = row
    tally["distinct"] += D
    tally["reuse"] += reuse
    if mode == EXP_GPU:
        w["n_res"], w["pairs_gpu"] = D, toks * K
    elif mode == EXP_CPU:
        w["n_cpu"], w["pairs_cpu"] = D, toks * K
    elif mode == EXP_SPLIT:
        w["n_res"], w["n_cpu"] = pinned_p, free_p
        w["pairs_gpu"] = toks * pinned_q
        w["pairs_cpu"] = toks * free_q
        tally["hits"] += pinned_p
        tally["loads"] += D
    else:
        h = _fetch_work(rt, c, i, l, D, h, free_p, w)
        w["n_res"], w["pairs_gpu"] = D, toks * K
        tally["hits"] += D * h
        tally["loads"] += D
    if dm["page_slots"][i] < E and mode in (EXP_CPU, EXP_SPLIT, EXP_FETCH):
        _page_work(dm, rt, c, i, l, mode, D, w, tally)
    return w


def _mean_selection(q, l, E):
    """Per-expert selection probability of layer ``l`` averaged over the routing samples."""
    S = len(q)
    qbar = []
    for e in range(E):
        s = 0.0
        for k in range(S):
            s += q[k][l][e]
        qbar.append(s / S)
    return qbar


def _step_inclusion(qbar, toks):
    """Probability that a step of ``toks`` tokens selects each expert: 1 - (1 - qbar)^toks, written as
    the kernel evaluates it (exp of toks x log1p)."""
    if toks == 1.0:
        return list(qbar)
    return [1.0 - math.exp(toks * math.log1p(-min(x, 1.0 - 1e-16))) for x in qbar]


def _pinned_sums(hot, slots, E, qbar, p):
    """(pinned q, pinned p, free q, free p): selection and inclusion mass of the ``slots`` hottest
    experts (pinned on the GPU) and of the rest."""
    pinned_set = set(int(e) for e in hot[:min(slots, E)])
    pinned_q = sum(qbar[e] for e in range(E) if e in pinned_set)
    pinned_p = sum(p[e] for e in range(E) if e in pinned_set)
    free_q = sum(qbar[e] for e in range(E) if e not in pinned_set)
    free_p = sum(p[e] for e in range(E) if e not in pinned_set)
    return pinned_q, pinned_p, free_q, free_p


def _fetch_work(rt, c, i, l, D, h, free_p, w):
    """A fetching layer's expected misses (``w["n_fetch"]``) and prefetches from its hit rate ``h`` (LRU:
    the sticky chain's or the windows', stickiness included; LFU: its counts'; static: what the pinned set
    leaves); returns the hit rate."""
    if c["policy"] in (POLICY_LRU, POLICY_LFU):
        w["n_fetch"] = D * (1.0 - h)
    else:
        w["n_fetch"] = free_p
    rc = float(rt["recall"][l])
    if rc > 0 and i > 0:
        w["n_pref"] = rc * w["n_fetch"]
        w["n_waste"] = w["n_fetch"] - w["n_pref"]
    return h


def _lru_layer(rt, q, l, B, tps, C, D):
    """Routing layer ``l``'s LRU hit rate (ms_analytic.c lru_layer): Che on the window tables under token
    memory (D: the step's distinct experts), else the sticky chain per scenario combination."""
    if rt.get("win_lq") is not None:
        h = W.window_hits(rt, l, B, tps, C, D) / D if D > 0 else 0.0
        return 1.0 if h > 1.0 else h        # rounding a hair above 1 at C = E - 1 (ms_analytic.c)
    return lru_hit_rate(q, float(rt["stickiness"][l]), l, rt["n_experts"], B, tps, C, int(rt["top_k"]))


def che_table(rt, batch, tokens_per_step, slots, policy, steps=256, warmup=32):
    """Twin of ms_che_table: every routing layer's step counts (codes.CHE_FIELDS) at (batch, tokens_per_step,
    slots, policy) over a run of ``steps`` steps, ``warmup`` not counted; a bad argument raises ValueError (the
    C returns an error code)."""
    if batch < 1 or tokens_per_step < 1 or slots < 0 or steps < 1 or not 0 <= warmup < steps:
        raise ValueError("batch, tokens_per_step and steps must be >= 1, slots >= 0, warmup in [0, steps)")
    if policy not in (POLICY_LRU, POLICY_LFU, POLICY_STATIC):
        raise ValueError("the table is of lru, lfu or static")
    return [list(_layer_counts(rt, rt["q"], l, batch, tokens_per_step, slots, policy, steps=steps, warmup=warmup)[0])
            for l in range(int(rt["n_layers"]))]


def page_table(rt, batch, tokens_per_step, page_slots):
    """Twin of ms_page_table: every routing layer's host page-cache hit rate at (batch, tokens_per_step,
    page_slots); a bad argument raises ValueError (the C returns an error code)."""
    if batch < 1 or tokens_per_step < 1 or page_slots < 0:
        raise ValueError("batch and tokens_per_step must be >= 1, page_slots >= 0")
    out = []
    for l in range(int(rt["n_layers"])):
        D = _layer_counts(rt, rt["q"], l, batch, tokens_per_step, 0, POLICY_LRU, hit=False)[0][0]
        out.append(_lru_layer(rt, rt["q"], l, batch, tokens_per_step, float(page_slots), D) if D > 0 else 0.0)
    return out


def _page_work(dm, rt, c, i, l, mode, D, w, tally):
    """Host reads that miss the page cache are read from storage (``w["n_disk"]``); the hit rate from the
    configuration's page table when it has one for this layer's page slots, as the C reads it, else the page
    cache as an LRU over the step's union (:func:`_lru_layer`, as the GPU cache)."""
    host = w["n_fetch"] if mode == EXP_FETCH else w["n_cpu"]
    ps = int(dm["page_slots"][i])
    if c.get("page_hit") is not None and c["page_hit_slots"] == ps:
        ph = float(c["page_hit"][l])
    else:
        ph = _lru_layer(rt, rt["q"], l, c["batch"], c["tokens_per_step"], float(ps), D)
    w["n_disk"] = host * (1.0 - ph)
    tally["phits"] += host * ph
    tally["ploads"] += host


def decode_many(dm, hw, rt, cols):
    """Reference twin of ms_decode_many: same columns in, same result arrays out."""
    n = len(cols["batch"])
    rows = []
    for i in range(n):
        c = {k: (float(cols[k][i]) if k == "accepted" else int(cols[k][i])) for k in cols
             if k not in ("che", "page_hit")}
        for name in ("che", "page_hit"):
            if cols.get(name) is not None and int(cols[name + "_slots"][i]) >= 0:
                c[name] = cols[name][i]
            else:
                c.pop(name + "_slots", None)
        r = decode_analytic(dm, hw, rt, c) if c["mode"] == 1 else decode_montecarlo(dm, hw, rt, c)
        rows.append(r)
    out = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]} if rows else {}
    return out
