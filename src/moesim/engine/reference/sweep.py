"""Pure-Python twin of the sweep loops (csrc/ms_sweep.c): slow and plain, the same floating-point
operations in the same order, so tests hold the C kernel to it bit for bit.

It reads a group's lowered tables (``Group.mem_tables`` and ``Group.dec_tables`` of
:mod:`moesim.sweep`) and evaluates configurations one by one. It keeps no memos and searches the
automatic placement by plain bisection, so it also checks the kernel's caches and search shortcuts.
"""
from __future__ import annotations

import math

from ..codes import CLASS_BUFFERS, CLASS_KV, CLASS_STATE
from .decode import kernel_time
from .memory import fits_rule


LIMIT = 1 << 30


def _padded(c: int, gran: int) -> int:
    return c if gran <= 1 else (c + gran - 1) // gran * gran


def _kv_part(t: dict, layout: int, cfg: dict, ctx: int, b: int) -> tuple:
    cp = _padded(ctx, cfg["kv_granularity"])
    gc = t["gpu_count"][layout]
    db = float(b)
    kv_g = kv_h = st_g = st_h = 0.0
    for q in range(len(t["per_token"])):
        cap, ratio = int(t["cap"][q]), int(t["ratio"][q])
        tokens = (cp if cp < cap else cap) if cap > 0 else cp
        v = float(t["per_token"][q]) * float(tokens)
        if ratio > 0:
            v += float(cp // ratio) * float(t["ratio_bytes"][q])
        kvb = v * db
        stb = float(t["state"][q]) * db
        g, c = int(gc[q]), int(t["count"][q])
        kv_g += float(g) * kvb
        kv_h += float(c - g) * kvb
        st_g += float(g) * stb
        st_h += float(c - g) * stb
    ng = cfg["n_gpus"]
    buf_g = float(ng) * (cfg["gpu_fixed"] + cfg["gpu_buf0"] + cfg["gpu_buf_ctx"] * float(cp)) if ng > 0 else 0.0
    buf_h = cfg["host_fixed"] + cfg["host_buf0"] + cfg["host_buf_ctx"] * float(cp)
    return kv_g, kv_h, st_g, st_h, buf_g, buf_h


def account(t: dict, j: int, ctx: int, b: int) -> dict:
    """ms_sweep.c account(): bytes per tier and fits bits of candidate j at (ctx, b)."""
    pl = t["places"]
    cfg = t["cfg"][pl["cfg"][j]]
    kv_g, kv_h, st_g, st_h, buf_g, buf_h = _kv_part(t, pl["layout"][j], cfg, ctx, b)
    w_host = float(pl["w_host"][j])
    bg = buf_g if pl["any_gpu"][j] else 0.0
    gpu = float(pl["w_gpu"][j]) + kv_g + st_g + bg
    ways = cfg["gpu_ways"]           # the busiest GPU in ms_gpu_one's class order: weights, KV, state, buffers
    one = float(pl["w_gpu_one"][j]) + kv_g / float(ways[CLASS_KV]) + st_g / float(ways[CLASS_STATE]) \
        + bg / float(ways[CLASS_BUFFERS])
    host = w_host + kv_h + st_h + buf_h
    spill, fits = fits_rule(cfg, gpu, one, host, w_host, buf_h)
    return dict(gpu=gpu, gpu_one=one, host=host, spill=spill, kv=kv_g + kv_h, state=st_g + st_h, fits=fits)


def _fits(t, j, ctx, b) -> bool:
    return account(t, j, ctx, b)["fits"] != 0


def max_context(t: dict, j: int, b: int) -> int:
    """Largest context that fits (plain bisection; ms_memory.c's answer for a monotone predicate)."""
    lo, hi = 1, int(t["max_context"])
    if not _fits(t, j, lo, b):
        return 0
    if _fits(t, j, hi, b):
        return hi
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        lo, hi = (mid, hi) if _fits(t, j, mid, b) else (lo, mid)
    return lo


def max_batch(t: dict, j: int, ctx: int) -> int:
    """Largest batch that fits: ms_memory.c's doubling search."""
    lo, hi = 1, 2
    if not _fits(t, j, ctx, lo):
        return 0
    while hi < LIMIT and _fits(t, j, ctx, hi):
        lo, hi = hi, hi * 2
    if hi >= LIMIT and _fits(t, j, ctx, LIMIT):
        return LIMIT
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        lo, hi = (mid, hi) if _fits(t, j, ctx, mid) else (lo, mid)
    return lo


def _largest_true(pred, lo: int, hi: int) -> int:
    if not pred(lo):
        return -1
    if pred(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pred(mid) else (lo, mid)
    return lo


def choose(t: dict, ctx: int, b: int) -> int:
    """moesim.fit.auto_placement over the group's candidates."""
    L = t["n_layers"]
    if t["rule"] == 0:
        return 0
    if t["rule"] == 2:
        first, E = t["i_gpu_experts"], t["n_experts"]
        n = _largest_true(lambda x: _fits(t, first + x, ctx, b), 0, E)
        if n > 0:
            return first + n
        if n == 0 or _fits(t, t["i_experts_cpu"], ctx, b):
            return t["i_experts_cpu"]
        return _first_fitting(t, [first + x for x in range(E, 0, -1)], ctx, b, t["i_experts_cpu"])
    if _fits(t, t["i_all_gpu"], ctx, b):
        return t["i_all_gpu"]
    if t["i_n_cpu_moe"] >= 0:
        first = t["i_n_cpu_moe"]
        n = _largest_true(lambda x: _fits(t, first + L - x, ctx, b), 0, L)
        if n >= 0:
            return first + L - n if n < L else t["i_all_gpu"]
    first = t["i_layers_gpu"]
    n = _largest_true(lambda x: _fits(t, first + x, ctx, b), 0, L)
    if n > 0:
        return first + n
    if _fits(t, t["i_cpu_only"], ctx, b):
        return t["i_cpu_only"]
    # nothing the search order reaches fits: the first candidate that does, so choose() is complete
    order = [t["i_n_cpu_moe"] + n for n in range(1, L)] if t["i_n_cpu_moe"] >= 0 else []
    order += [first + k for k in range(L, -1, -1)]
    order += [t["i_experts_cpu"]] if t["i_experts_cpu"] >= 0 else []
    return _first_fitting(t, order, ctx, b, t["i_experts_cpu"] if t["i_experts_cpu"] >= 0 else t["i_all_gpu"])


def _first_fitting(t: dict, order: list, ctx: int, b: int, otherwise: int) -> int:
    return next((j for j in order if _fits(t, j, ctx, b)), otherwise)


def auto_max_context(t: dict, b: int) -> int:
    """ms_sweep_auto_max_context: the largest context that fits under the best placement for it. choose()
    is complete, so that is the largest of every candidate's own (candidate 0's for a fixed rule)."""
    if t["rule"] == 0:
        return max_context(t, 0, b)
    return max(max_context(t, j, b) for j in range(len(t["places"]["code"])))


def memory_one(t: dict, ctx: int, b: int, bi: int, n_b: int) -> dict:
    j = choose(t, ctx, b)
    pl = t["places"]
    r = account(t, j, ctx, b)
    E = t["n_experts"]
    ps = E if E > 1 else 1
    if r["spill"] > 0.0 and E > 0:
        frac = 0.0
        routed = float(pl["routed_host"][j])
        if routed > 0.0:
            frac = 1.0 - r["spill"] / routed
            frac = 0.0 if frac < 0.0 else frac
        ps = int(math.floor(float(E) * frac))
    return dict(context=ctx, batch=b, placement=int(pl["label"][j]), fits=int(t["fits_label"][r["fits"] & 7]),
                key=(j * (E + 2) + ps) * n_b + bi, weights_bytes=float(pl["w_gpu"][j]) + float(pl["w_host"][j]),
                kv_bytes=r["kv"], state_bytes=r["state"], gpu_bytes=r["gpu"], host_bytes=r["host"] - r["spill"],
                storage_bytes=r["spill"], max_context=auto_max_context(t, b), max_batch=max_batch(t, j, ctx))


def _ctx_eval(f5, c4, c: int) -> float:
    """ms_ctx_eval on one (coefficients, caps) pair (the one Python definition lives in moesim.sweep)."""
    from ..lower.attention import ctx_eval
    return ctx_eval((tuple(float(x) for x in f5), tuple(int(x) for x in c4)), c)


def analytic_one(d: dict, v: int, ctx: int, b: int) -> dict:
    """ms_sweep.c analytic_one for variant row v of the decode tables."""
    vf, vi = d["variant_f64"][v], d["variant_i32"][v]
    res = [float(x) for x in vf[1:9]]
    step, pf, db = float(vf[0]), float(vf[12]), float(b)
    nf = len(d["fn_kv_f"])
    kvv = [_ctx_eval(d["fn_kv_f"][f], d["fn_kv_c"][f], ctx) for f in range(nf)]
    sfv = [_ctx_eval(d["fn_sf_f"][f], d["fn_sf_c"][f], ctx) for f in range(nf)]
    for k in range(int(vi[0]), int(vi[0]) + int(vi[1])):
        n, kv_rate, sf_rate = (float(x) for x in d["kind_f64"][k])
        res_mem, res_flops, fn = (int(x) for x in d["kind_i32"][k])
        # the attention over the cache, the larger of memory and compute (the weight GEMVs are the variant's step0)
        ts, rs = kernel_time(db * kvv[fn] * kv_rate, db * (sfv[fn] * sf_rate), res_mem, res_flops)
        res[rs] += n * ts
        step += n * ts
    inv = 1.0 / (step * pf)
    rate = float(vf[9]) * (pf * inv)
    best = 0
    for i in range(1, 8):
        if res[i] > res[best]:
            best = i
    hit = float(vf[11])
    return dict(decode_tok_s=rate, aggregate_tok_s=db * rate, tpot_ms=step * float(vf[10]),
                prefill_tok_s=float(d["prompt"]) * (step * inv), expert_hit_rate=math.nan if hit < 0.0 else hit,
                bottleneck=best)


def segment(group, j0: int, j1: int) -> list:
    """Rows (dicts of the kernel's columns) of configurations j0 .. j1-1 of a group, evaluated one by one."""
    return configurations(group, range(j0, j1))


def configurations(group, js) -> list:
    """Rows of the group's configurations js, evaluated one by one (decode variants the group lacks are
    lowered first, as the C path does)."""
    plan = group.plan
    t = group.mem_tables
    rows = []
    for j in js:
        ci, bi = (j, j) if plan.fast_zipped else (j // plan.n_b, j % plan.n_b)
        rows.append(memory_one(t, int(plan.contexts[ci]), int(plan.batches[bi]), bi, plan.n_b))
    index = {int(k): i for i, k in enumerate(group.table_keys)}
    missing = {r["key"] for r in rows} - set(index)
    if missing:
        group.add_variants(sorted(missing))
        index = {int(k): i for i, k in enumerate(group.table_keys)}
    d = group.dec_tables
    for row in rows:
        row.update(analytic_one(d, index[row["key"]], row["context"], row["batch"]))
    return rows
