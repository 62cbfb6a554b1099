"""Lowering (model, quant, placement, machine, runtime, context) to ``ms_decode_model_t``."""
from __future__ import annotations

import functools
import math

import numpy as np

from ... import _lowering_cache
from ...spec import quants as Q
from ...spec.hardware import Machine
from ...spec.models import Model, catalog_key
from ...spec.placement import Placement
from ...spec.runtimes import Runtime
from ..codes import EXP_CPU, EXP_FETCH, EXP_GPU, EXP_NONE, EXP_SPLIT
from .machine import _AMX_FLOPS_PER_CYCLE
from .attention import decode_context_rows, full_window_rows, prefill_kv_read, query_heads_per_kv
from .parallel import allreduce_bytes, alltoall_bytes, layer_loads, layout_degrees, replication


# ------------------------------------------------------------------------------- model lowering
@functools.lru_cache(maxsize=1024)
def _params(model: Model) -> dict:
    """Parameter counts per (class, layer) plus global ones; MTP modules under key 'mtp'."""
    return _lowering_cache.memo("layer_params", catalog_key(model), lambda: _count_params(model))


@functools.lru_cache(maxsize=1024)
def _flop_rows(model: Model) -> tuple:
    """(attention + router, shared experts + dense FFN) FLOPs per token and layer, read-only: parameter
    counts alone, so every lowering of a model shares them."""
    par = _params(model)
    rows = 2.0 * (par["attention"] + par["router"]), 2.0 * (par["shared_experts"] + par["dense_ffn"])
    for a in rows:
        a.flags.writeable = False
    return rows


def _count_params(model: Model) -> dict:
    L = model.n_layers
    per = {c: np.zeros(L) for c in ("attention", "router", "shared_experts", "routed_experts", "dense_ffn")}
    glob = {"embeddings": 0.0, "lm_head": 0.0, "mtp": 0.0, "mtp_routed": 0.0}
    for t in model.tensors(include_mtp=True):
        n = float(t.n_elements)
        if t.cls == "mtp":
            glob["mtp"] += n
            if "_exps" in t.name:
                glob["mtp_routed"] += n
        elif t.cls in glob:
            glob[t.cls] += n
        else:
            per[t.cls][t.layer] += n
    per.update(glob)
    return per


def op_offload_threshold(rt: Runtime, m: Model) -> float:
    """Tokens per step from which the runtime copies CPU-resident experts to the GPU instead of
    computing them on the CPU (llama.cpp: 32; ik_llama.cpp: 32 x experts / active; RT §1.1)."""
    n = rt.decode.op_offload_min_batch
    if n <= 0:
        return math.inf
    if rt.decode.op_offload_sparse and m.top_k:
        return n * m.n_experts / m.top_k
    return n


def cpu_fa_reads(m: Model, rt: Runtime, on_gpu: np.ndarray) -> np.ndarray:
    """Per layer, the times a decode step reads each sequence's KV: on the CPU under a per-row flash-attention
    kernel (cpu_fa_query_rows > 0: ggml-cpu's one_chunk path, which a one-token step always takes) once per
    query head, as its KV head's rows are walked for each head of the group; else once."""
    if rt.decode.cpu_fa_query_rows <= 0:
        return np.ones(m.n_layers)
    return np.where(np.asarray(on_gpu, dtype=bool), 1.0, np.maximum(query_heads_per_kv(m), 1.0))


def attention_copies(m: Model, on_gpu: np.ndarray, n: int, attn_tp: int) -> tuple:
    """Per layer, (attention weights, KV) read factors over the bytes counted once: the GPUs' replication
    (engine.lower.parallel.replication) where a layer's attention runs on the GPUs, 1 where the CPU runs it
    from host memory (one copy, not split over the GPUs)."""
    attn_c, kv_c = replication(m, n, attn_tp)
    if attn_c == 1.0 and kv_c == 1.0:          # one copy wherever attention runs (a single GPU)
        return np.ones(m.n_layers), np.ones(m.n_layers)
    gpu = np.asarray(on_gpu) != 0
    return np.where(gpu, attn_c, 1.0), np.where(gpu, kv_c, 1.0)


def attention_key(p: Placement) -> tuple:
    """All :func:`kv_copies_of` reads of a placement (CPU-only; how many layers keep attention on the GPU
    under layers-gpu): what a cache of its rows keys on, so n-cpu-moe=1, =2, ... share one row."""
    return p.kind == "cpu-only", p.arg if p.kind == "layers-gpu" else -1


def kv_copies_of(m: Model, p: Placement, machine: Machine, rt: Runtime) -> np.ndarray:
    """The per-layer KV read factor lower_model applies (what a sweep's context terms must carry too)."""
    cpu_only = p.kind == "cpu-only" or machine.n_gpus == 0
    n, attn_tp, _, _ = layout_degrees(rt, 0 if cpu_only else machine.n_gpus)
    on_gpu = _attention_on_gpu(p, m.n_layers, cpu_only)
    return attention_copies(m, on_gpu, n, attn_tp)[1] * cpu_fa_reads(m, rt, on_gpu)


def lower_model(m: Model, low, p: Placement, machine: Machine, rt: Runtime, context: int, kv_dtype: str,
                tokens_per_step: int, mem_by_class=None, mem_tier=None, cache_slots: int | None = None,
                routing: dict | None = None) -> dict:
    """The ms_decode_model_t arrays for one configuration; *routing* (the kernel's routing tables) sets the
    busiest expert-parallel rank's load (engine.lower.parallel), without it every rank counts as balanced."""
    L = m.n_layers
    par = _params(m)
    attn_flops, shared_flops = _flop_rows(m)
    kvb = Q.kv_dtype_bytes(kv_dtype)
    cpu_only = p.kind == "cpu-only" or machine.n_gpus == 0
    op_offload = not cpu_only and tokens_per_step >= op_offload_threshold(rt, m)
    on_gpu, mode, slots, moe_index = (a.copy() for a in _layer_modes(m, p, cpu_only, op_offload, cache_slots))
    E = m.n_experts
    page_slots = _page_slots(L, E, mem_by_class, mem_tier)
    n_exp = np.maximum(low.n_experts, 1)
    expert_params = par["routed_experts"] / n_exp
    n, attn_tp, ep, _ = layout_degrees(rt, 0 if cpu_only else machine.n_gpus)
    if p.kind not in ("all-gpu", "unified"):
        ep = 1                 # experts held in host memory are not sharded over the GPUs
    load_e, load_p = layer_loads(moe_index, routing, tokens_per_step, ep, rt.decode.redundant_experts if ep > 1 else 0)
    quant = _quant_of(m, low)
    draft_bytes, draft_flops = _draft_cost(m, low, par)
    kv_bytes, score_flops = decode_context_rows(m, low, context, kvb)
    if rt.decode.swa_full:
        kv_bytes, score_flops = full_window_rows(m, low, context, kvb, on_gpu, kv_bytes, score_flops)
    attn_copies, kv_copies = attention_copies(m, on_gpu, n, attn_tp)
    return dict(
        attn_bytes=(low.attn + low.router) * attn_copies,
        attn_flops=attn_flops.copy(),
        kv_bytes=kv_bytes * kv_copies * cpu_fa_reads(m, rt, on_gpu), score_flops=score_flops,
        shared_bytes=low.shared + low.dense,
        shared_flops=shared_flops.copy(),
        expert_bytes=np.array(low.expert_one, dtype=np.float64),
        expert_flops=2.0 * expert_params,
        attn_on_gpu=on_gpu, expert_mode=mode, slots=slots, page_slots=page_slots, moe_index=moe_index,
        head_bytes=head_read_bytes(m, low), head_flops=2.0 * head_params(m, par),
        head_on_gpu=0 if (cpu_only or (p.kind == "layers-gpu" and p.arg == 0)) else 1,
        draft_bytes=float(draft_bytes), draft_flops=float(draft_flops),
        # a large prompt ubatch copies CPU-resident experts to the GPU (op offload) only where there is one
        gpu_offload=0 if cpu_only else 1,
        # ktransformers layerwise prefill: chunks of at least this many tokens stream whole expert layers
        # (native formats only)
        layerwise_prefill=(rt.decode.layerwise_prefill_tokens
                           if rt.decode.layerwise_prefill_tokens > 0 and not quant.is_gguf else 0),
        layer_experts=np.asarray(low.n_experts, dtype=np.float64),
        # CPU prefill attention's KV reads (engine.prefill): the layers' cache functions, query heads per KV
        # head, and the query rows that share one read (ggml-cpu's tiled path needs F16/F32 K and V)
        **_cpu_fa(m, low, rt, kvb, kv_dtype),
        amx_flops_per_cycle=_AMX_FLOPS_PER_CYCLE.get(quant.id, 0.0),
        # f32 hidden state each way plus k ids and weights (RT §1.3)
        act_bytes=0.0 if cpu_only else float(2 * m.hidden * 4 + 8 * max(1, m.top_k)),
        allreduce_bytes=allreduce_bytes(m.hidden, n, attn_tp, ep),
        ep_load_experts=load_e, ep_load_pairs=load_p,
        a2a_bytes=alltoall_bytes(m.hidden, m.top_k, ep, rt.decode, n // attn_tp),
        layer_ops=delta_net_ops(m, rt.decode.delta_net_ops),
        gemm_rows=gemm_rows(m),
    )


@functools.lru_cache(maxsize=1024)
def gemm_rows(m: Model) -> np.ndarray:
    """Per layer, the output rows of its dense GEMMs (attention projections, router, shared experts, dense FFN: each
    2-D weight's ne1), their FLOP-weighted harmonic mean: a mat-mat kernel's threadgroups per token tile are its rows
    over the tile's, and a matrix's share of the layer's time goes as its FLOPs over its rows (ms_gemm_tokens); 0
    where a layer has none (read-only: one array per model)."""
    flops, per_row = np.zeros(m.n_layers), np.zeros(m.n_layers)
    for t in m.tensors(include_mtp=False):
        if t.cls in ("attention", "router", "shared_experts", "dense_ffn") and len(t.shape) == 2 and t.layer >= 0:
            f = 2.0 * t.shape[0] * t.shape[1]
            flops[t.layer] += f
            per_row[t.layer] += f / t.shape[1]
    rows = np.divide(flops, per_row, out=np.zeros_like(flops), where=per_row > 0)
    rows.flags.writeable = False
    return rows


@functools.lru_cache(maxsize=4096)
def delta_net_ops(m: Model, ops: float) -> np.ndarray:
    """Per layer, the graph nodes beyond an attention layer's (ms_decode_model_t.layer_ops): *ops* on each
    Gated DeltaNet / KDA layer, whose recurrence a runtime may run as many small ops, 0 elsewhere (read-only:
    one array per model and count, every lowering shares it)."""
    a = np.array([ops if layer.attention.kind in ("gdn", "kda") else 0.0 for layer in m.layers])
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=4096)
def _quant_of(m: Model, low) -> Q.Quant:
    """The Quant a lowered model was lowered under (it keeps the id)."""
    return Q.resolve(low.quant, m)


@functools.lru_cache(maxsize=4096)
def _layer_modes(m: Model, p: Placement, cpu_only: bool, op_offload: bool, cache_slots) -> tuple:
    """(attention on the GPU, expert mode, GPU slots, MoE index) per layer, read-only: they depend on the
    model's shape and the placement, not the quant, so every quant of a model shares them."""
    on_gpu = _attention_on_gpu(p, m.n_layers, cpu_only)
    out = (on_gpu,) + _expert_modes(m, p, on_gpu, cpu_only, op_offload, cache_slots)
    for a in out:
        a.flags.writeable = False
    return out


FA_TILE_Q = 64                  # GGML_FA_TILE_Q: query rows of ggml-cpu's tiled flash attention (ggml-cpu common.h)


def _cpu_fa(m: Model, low, rt: Runtime, kvb: float, kv_dtype: str) -> dict:
    fns, heads = prefill_kv_read(m, low, kvb)
    rows = float(rt.decode.cpu_fa_query_rows)
    tile = float(FA_TILE_Q) if rows > 0 and str(kv_dtype).lower() in ("f16", "f32") else rows
    return dict(prefill_kv_fns=fns, prefill_kv_heads=heads, cpu_fa_rows=rows, cpu_fa_tile=tile)


def _attention_on_gpu(p: Placement, L: int, cpu_only: bool) -> np.ndarray:
    """1 where a layer's attention (and KV) runs on the GPU: all layers, none, or the last ``arg``
    (llama.cpp -ngl offloads from the output end)."""
    on_gpu = np.ones(L, dtype=np.int32)
    if cpu_only:
        on_gpu[:] = 0
    elif p.kind == "layers-gpu":
        on_gpu[:] = [1 if l >= L - p.arg else 0 for l in range(L)]
    return on_gpu


def _expert_modes(m: Model, p: Placement, on_gpu, cpu_only: bool, op_offload: bool, cache_slots) -> tuple:
    """(mode, GPU slots, MoE index) per layer; dense layers keep mode EXP_NONE and index -1. With op
    offload, CPU-resident experts of GPU layers are fetched instead: llama.cpp sends >= 32-token steps'
    CPU expert matmuls to the GPU, copying the used experts each step (RT §1.1). :func:`_expert_mode`
    per MoE layer, as arrays: only n-cpu-moe and layers-gpu depend on the layer."""
    L, E = m.n_layers, m.n_experts
    moe, moe_index = _moe_layers(m)
    on = np.asarray(on_gpu) != 0
    if not cpu_only and p.kind == "n-cpu-moe":
        mode = np.where(np.arange(L) < p.arg, EXP_CPU, EXP_GPU).astype(np.int32)
        slots = np.zeros(L, dtype=np.int32)
    elif not cpu_only and p.kind == "layers-gpu":
        mode = np.where(on, EXP_GPU, EXP_CPU).astype(np.int32)
        slots = np.zeros(L, dtype=np.int32)
    else:
        one_mode, one_slots = _expert_mode(p, 0, on_gpu, E, cpu_only, cache_slots)
        mode = np.full(L, one_mode, dtype=np.int32)
        slots = np.full(L, one_slots, dtype=np.int32)
    mode[~moe] = EXP_NONE
    slots[~moe] = 0
    if op_offload:
        fetch = (mode == EXP_CPU) & on
        mode[fetch] = EXP_FETCH
        slots[fetch] = 0
    return mode, slots, moe_index.copy()


@functools.lru_cache(maxsize=1024)
def _moe_layers(m: Model) -> tuple:
    """(which layers have routed experts, each one's MoE index or -1), read-only."""
    moe = np.array([layer.ffn.kind == "moe" for layer in m.layers], dtype=bool)
    moe_index = np.full(m.n_layers, -1, dtype=np.int32)
    moe_index[moe] = np.arange(int(moe.sum()), dtype=np.int32)
    moe.flags.writeable = False
    moe_index.flags.writeable = False
    return moe, moe_index


def _expert_mode(p: Placement, l: int, on_gpu, E: int, cpu_only: bool, cache_slots) -> tuple:
    """(mode, GPU slots) of MoE layer ``l``'s routed experts under placement ``p``."""
    if cpu_only:
        return EXP_CPU, 0
    if p.kind in ("all-gpu", "unified"):
        return EXP_GPU, 0
    if p.kind == "experts-cpu":
        return EXP_CPU, 0
    if p.kind == "n-cpu-moe":
        return (EXP_CPU if l < p.arg else EXP_GPU), 0
    if p.kind == "layers-gpu":
        return (EXP_GPU if on_gpu[l] else EXP_CPU), 0
    if p.kind == "gpu-experts":
        return (EXP_GPU if p.arg >= E else (EXP_SPLIT if p.arg > 0 else EXP_CPU)), min(p.arg, E)
    if p.kind == "offload-cache":
        return EXP_FETCH, min(cache_slots if cache_slots is not None else p.arg, E)
    return EXP_NONE, 0


def head_read_bytes(m: Model, low) -> float:
    """Bytes the output projection reads per token: the lm_head class (its matrix and the final norm), and under
    tied embeddings the token-embedding matrix it multiplies by (llama.cpp loads token_embd a second time as the
    output, TENSOR_DUPLICATED in llama-model.cpp; the served runtimes share one tensor): the head's GEMV reads
    vocab x hidden either way."""
    return float(low.head) + (float(low.embed) if m.tie_embeddings else 0.0)


def head_params(m: Model, par: dict) -> float:
    """Parameters the output projection multiplies per token (see :func:`head_read_bytes`)."""
    return par["lm_head"] + (par["embeddings"] if m.tie_embeddings else 0.0)


def _page_slots(L: int, E: int, mem_by_class, mem_tier) -> np.ndarray:
    """Host page-cache slots per layer: when mmap'd weights spill to storage, only part of the host
    experts stay in RAM (the rest are paged in from storage)."""
    page_slots = np.full(L, max(E, 1), dtype=np.int32)
    if mem_tier is not None and mem_tier[2] > 0 and E:
        host_routed = float(mem_by_class[3][1])
        frac = max(0.0, 1.0 - mem_tier[2] / host_routed) if host_routed > 0 else 0.0
        page_slots[:] = int(math.floor(E * frac))
    return page_slots


def _draft_cost(m: Model, low, par: dict) -> tuple:
    """(bytes, FLOPs) of one MTP draft token: one MTP module with its active experts only, plus the head."""
    if not m.mtp_layers:
        return 0.0, 0.0
    mtp_modules = max(1, m.mtp_layers)
    last = m.n_layers - 1
    routed_one = low.expert_one[last] if low.n_experts[last] else 0.0
    mtp_routed_bytes = routed_one * (m.mtp_layer.ffn.n_experts if m.mtp_layer.ffn.kind == "moe" else 0)
    k_active = m.mtp_layer.ffn.top_k if m.mtp_layer.ffn.kind == "moe" else 0
    draft_bytes = (low.mtp / mtp_modules - mtp_routed_bytes + k_active * routed_one) + head_read_bytes(m, low)
    draft_flops = 2.0 * ((par["mtp"] - par["mtp_routed"]) / mtp_modules
                         + par["mtp_routed"] / mtp_modules * (k_active / max(1, m.mtp_layer.ffn.n_experts))
                         + head_params(m, par))
    return draft_bytes, draft_flops
