"""The prefill (prompt processing) model: per-ubatch GEMMs, weight streaming, attention at depth."""
from __future__ import annotations

import numpy as np

from ..spec.models import Model
from ..spec.runtimes import Runtime
from .codes import EXP_FETCH, EXP_GPU, EXP_NONE, EXP_SPLIT
from .lower.decode_model import op_offload_threshold
from .lower.attention import prefill_score_flops


def prefill(m: Model, dm: dict, hw: dict, rtab: dict, rt: Runtime, prompt: int, batch: int = 1,
            depth: int = 0) -> tuple:
    """(prefill tokens/s, time to first token) for a ``prompt``-token prompt on top of ``depth`` cached
    tokens, per ubatch (DESIGN §3); attention as :func:`prefill_score_flops`.

    Each ubatch reads every weight it uses once and then runs its tokens' multiply-adds at the prefill
    GEMM rate (the two add); experts in host RAM are computed on the CPU, or, under llama.cpp's op offload
    (ubatch >= 32) and on expert-cache engines, the experts the ubatch uses are copied over PCIe
    (RT §1.1-1.2). A ubatch of n tokens uses sum_e 1 - (1 - q_e)^n distinct experts per layer."""
    threshold = dm.get("layerwise_prefill", 0)
    if threshold > 0:
        # kt-kernel under SGLang: the scheduler cuts a prompt into chunked-prefill-size forwards
        ub = max(1, min(prompt, rt.decode.layerwise_chunk_tokens))
    else:
        ub = max(1, min(prompt, rt.ubatch or rt.prefill_step or 2048))
    n_full, last = divmod(prompt, ub)
    sizes = [(ub, n_full)] + ([(last, 1)] if last else [])
    offload = ub >= op_offload_threshold(rt, m)
    gflops, gemm, cflops = hw["prefill_flops"], hw["prefill_gemm_flops"], hw["cpu_flops"]
    on_gpu = np.asarray(dm["attn_on_gpu"], dtype=bool)
    mode = np.asarray(dm["expert_mode"])
    moe_idx = np.asarray(dm["moe_index"])
    k = rtab.get("top_k", 0)
    qbar = np.asarray(rtab["q"]).mean(axis=0) if rtab.get("n_layers") else None
    bw = np.where(on_gpu, hw["gpu_bw"], hw["host_bw"])
    fl = np.where(on_gpu, gemm, cflops)
    score = prefill_score_flops(m, prompt, depth) / np.where(on_gpu, hw["prefill_attn_flops"], cflops)
    weights = np.asarray(dm["attn_bytes"]) + np.asarray(dm["shared_bytes"])
    per_tok = (np.asarray(dm["attn_flops"]) + np.asarray(dm["shared_flops"])) / fl + score
    total = 0.0
    for n_tok, count in sizes:
        # KT switches per forward: a chunk of num_tokens >= the threshold streams (KTSGL kt_ep_wrapper.py)
        layerwise = 0 < threshold <= n_tok
        # a ubatch streams each weight matrix once and its tiles' loads are not hidden behind the
        # multiply-adds (llama.cpp PR #8495: LLaMA-8B Q5_K_S on a 4090 takes 9.1 ms per 16-token and
        # 48 ms per 512-token ubatch, weight reads + per-token work, not their max)
        t = weights / bw + n_tok * per_tok + np.where(on_gpu, hw["launch_s"], 0.0)
        for l in np.nonzero(mode != EXP_NONE)[0] if qbar is not None else ():
            q = qbar[moe_idx[l]]
            used = 1.0 - (1.0 - q) ** n_tok
            gpu_share = 1.0 if mode[l] == EXP_GPU else 0.0
            if mode[l] == EXP_SPLIT:
                pinned = np.asarray(rtab["hot"][moe_idx[l]][:dm["slots"][l]])
                gpu_share = float(q[pinned].sum() / max(q.sum(), 1e-300))
            eb, ef = dm["expert_bytes"][l], dm["expert_flops"][l]
            distinct, pairs = float(used.sum()), n_tok * k
            # as for the dense GEMMs, each used expert's weights are read once per ubatch on top of its
            # multiply-adds (it serves only pairs / distinct tokens of the ubatch)
            t_gpu = distinct * gpu_share * eb / hw["gpu_bw"] + pairs * gpu_share * ef / gemm
            host_distinct, host_pairs = distinct * (1 - gpu_share), pairs * (1 - gpu_share)
            if layerwise and host_pairs > 0:
                # the layer's whole expert set crosses PCIe (double-buffered expert by expert), then the GPU
                # computes the layer: the load synchronises the device before and after it (KTSGL
                # kt_ep_wrapper.py load()), so copy and compute add. Under tensor parallelism each GPU pulls
                # its own slice over its own link, all fed from host DRAM
                t_copy = (dm["layer_experts"][l] * eb * (1 - gpu_share)
                          / min(hw["pcie_bw"] * hw["pcie_links"], hw["host_bw"]))
                t_cgpu = host_distinct * eb / hw["gpu_bw"] + host_pairs * ef / gemm
                t[l] += t_gpu + t_copy + t_cgpu
            elif host_pairs <= 0:
                t[l] += t_gpu
            elif offload or mode[l] == EXP_FETCH:
                t_copy = host_distinct * eb / hw["pcie_bw"]
                t_cgpu = host_distinct * eb / hw["gpu_bw"] + host_pairs * ef / gemm
                t[l] += t_gpu + (max(t_copy, t_cgpu) if hw["overlap"] else t_copy + t_cgpu)
            else:
                # AMX tiles once the ubatch gives each expert more than 4 tokens on average (RT §5.1)
                amx = hw["amx_flops"] * dm["amx_flops_per_cycle"]
                rate = max(cflops, amx) if host_pairs > 4.0 * max(host_distinct, 1e-300) else cflops
                t_cpu = host_distinct * eb / hw["host_bw"] + host_pairs * ef / rate
                t[l] += (max(t_gpu, t_cpu) if hw["overlap"] else t_gpu + t_cpu) + hw["sync_s"]
        t_ub = float(t.sum()) + dm["head_bytes"] / hw["gpu_bw"] + dm["head_flops"] / gflops
        total += count * t_ub
    ttft = total * batch
    return prompt * batch / ttft, ttft
