"""Pure-Python twin of ms_prefill.c: seconds to prefill a prompt from the packed tables the kernel reads
(glue.PREFILL_MODEL / PREFILL_MACHINE as dicts), layer by layer, summed as numpy and the C sum."""
from __future__ import annotations

import math

from ..codes import EXP_FETCH


def _pairwise(a: list, lo: int, n: int) -> float:
    """numpy's pairwise summation of a[lo : lo + n] (8 accumulators, blocks of 128)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    if n <= 128:
        r = a[lo:lo + 8]
        i = 8
        while i < n - n % 8:
            for j in range(8):
                r[j] += a[lo + i + j]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(i, n):
            res += a[lo + i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def _np_max(a: float, b: float) -> float:
    return a if (a >= b or math.isnan(a)) else b


def _kv_reads(p: dict, h: dict, l: int, n_tok: int, rows: float) -> float:
    one, heads = float(p["kv_one"][l]), float(p["kv_heads"][l])
    if rows <= 0.0:
        return one
    walks = math.ceil(n_tok / rows) * heads if heads > 0.0 else 1.0
    spill = 1.0
    if h["cpu_llc_bytes"] > 0.0:
        spill = min(max(1.0 - h["cpu_llc_bytes"] / _np_max(one, 1e-300), 0.0), 1.0)
    return one * (1.0 + (walks - 1.0) * spill)


def _dense(p: dict, h: dict, s: int) -> list:
    n_tok = int(p["sizes"][s][0])
    nt, rows = float(n_tok), float(p["size_rows"][s])
    kv = p.get("kv_one") is not None
    tiled = kv and bool(p["size_tiled"][s])
    t = []
    for l in range(len(p["on_gpu"])):
        g = bool(p["on_gpu"][l])
        bw = h["gpu_bw"] if g else h["host_bw"]
        fl = h["prefill_gemm_flops"] if g else h["cpu_flops"]
        sc = float(p["score_flops"][l]) / (h["prefill_attn_flops"] if g else
                                           h["cpu_flops"] if tiled else h["cpu_prefill_attn_flops"])
        pt = float(p["flops"][l]) / fl + sc
        tile = h["prefill_weight_pass_tokens"]
        passes = float(math.ceil(nt / tile)) if (g and tile > 0.0) else 1.0
        x = (float(p["weights"][l]) * passes / bw + nt * pt + nt * float(p["act"][l]) / bw
             + float(p["decompress_flops"][l]) / fl + (h["launch_s"] if g else h["cpu_layer_s"]))
        if kv:
            x += _np_max(_kv_reads(p, h, l, n_tok, rows) / h["host_bw"] - nt * sc, 0.0)
        t.append(x)
    return t


# ms_prefill.c MS_MMQ_X_STEP: MMQ tile widths step by 8 tokens; up to 8 tokens MUL_MAT_ID takes the mat-vec kernel
_MMQ_X_STEP = 8.0


def _expert(p: dict, h: dict, i: int, distinct: float, n_tok: int, layerwise: bool) -> float:
    share, eb, ef = float(p["exp_share"][i]), float(p["exp_bytes"][i]), float(p["exp_flops"][i])
    gemm, passes = h["prefill_expert_flops"], 1.0
    pairs = float(n_tok * int(p["top_k"]))
    per_expert = pairs / _np_max(distinct, 1e-300)
    if h["prefill_moe_half_tokens"] > 0.0:
        gemm = gemm * per_expert / (per_expert + h["prefill_moe_half_tokens"])
    if h["prefill_moe_tile_tokens"] > 0.0 and n_tok > _MMQ_X_STEP:
        width = min(_MMQ_X_STEP * math.ceil(n_tok / _MMQ_X_STEP), h["prefill_moe_tile_tokens"])
        tiles = min(_np_max(per_expert / width + 0.5, 1.0), float(math.ceil(n_tok / width)))
        gemm = gemm * per_expert / (tiles * width)
    if h["prefill_weight_pass_tokens"] > 0.0:
        passes = _np_max(per_expert / h["prefill_weight_pass_tokens"] + 0.5, 1.0)
    reads = pairs if h["gpu_moe_rowwise"] else distinct * passes
    t_gpu = reads * share * eb / h["gpu_bw"] + pairs * share * ef / gemm
    host_distinct, host_pairs = distinct * (1.0 - share), pairs * (1.0 - share)
    if not host_pairs > 0.0:
        return t_gpu
    t_cgpu = host_distinct * passes * eb / h["gpu_bw"] + host_pairs * ef / gemm
    if layerwise:
        link = min(h["pcie_bw"] * h["pcie_links"], h["host_bw"])
        return t_gpu + float(p["exp_layer_experts"][i]) * eb * (1.0 - share) / link + t_cgpu
    t_copy = host_distinct * eb / h["pcie_bw"]
    fetched = t_gpu + (_np_max(t_copy, t_cgpu) if h["overlap"] else t_copy + t_cgpu)
    amx = h["amx_flops"] * p["amx_per_cycle"]
    rate = max(h["cpu_flops"], amx) if host_pairs > 4.0 * _np_max(host_distinct, 1e-300) else h["cpu_flops"]
    t_cpu = host_distinct * eb / h["host_bw"] + host_pairs * ef / rate
    computed = (_np_max(t_gpu, t_cpu) if h["overlap"] else t_gpu + t_cpu) + h["sync_s"]
    return fetched if p["offload"] or int(p["exp_mode"][i]) == EXP_FETCH else computed


def prefill_seconds(p: dict, h: dict) -> float:
    """ms_prefill_seconds: the sum over ubatch sizes of count x (layers' seconds + head), plus the host step that
    builds the first graph."""
    total = 0.0
    for s, (n_tok, count) in enumerate(p["sizes"]):
        n_tok, count = int(n_tok), int(count)
        layerwise = 0 < int(p["threshold"]) <= n_tok
        t = _dense(p, h, s)
        for i, layer in enumerate(p["exp_layer"]):
            t[int(layer)] += _expert(p, h, i, float(p["exp_distinct"][s][i]), n_tok, layerwise)
        t_ub = _pairwise(t, 0, len(t)) + p["head_bytes"] / h["gpu_bw"] + p["head_flops"] / h["prefill_flops"]
        total += count * t_ub
    return total + (h["step_s"] if len(p["sizes"]) else 0.0)
