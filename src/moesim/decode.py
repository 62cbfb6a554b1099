"""Decode simulation: ``moesim.simulate`` and its lowering to the C kernel (csrc/ms_decode.c).

Lowering turns (model, quant, placement, machine, runtime, context) into per-layer bytes and FLOPs
with the place each layer's attention and routed experts run (``ms_decode_model_t``), the machine
into effective rates and latencies (``ms_machine_t``), and a routing profile or trace into tables
(``ms_routing_t``, see :mod:`moesim.routing`). ``engine="reference"`` runs the pure-Python twin.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from . import quants as Q
from . import routing as R
from ._catalog import load as _load_catalog
from .errors import KernelError, MoesimError, unknown_id
from .hardware import GB, Machine
from .memory import check_count, configure, evaluate, _result_from_arrays
from .models import Model, model as get_model
from .placement import Placement
from .runtimes import Runtime

POLICIES = {"lru": 0, "lfu": 1, "static": 2, "belady": 3}
MODES = {"montecarlo": 0, "analytic": 1}
EXP_NONE, EXP_GPU, EXP_CPU, EXP_SPLIT, EXP_FETCH = range(5)
RESOURCES = ("gpu_memory", "gpu_compute", "host_memory", "cpu_compute", "pcie", "storage", "latency",
             "interconnect")
PHASES = ("attention", "experts", "transfer", "sync_launch", "head_drafts", "step_overhead")
LINKS = ("gpu_memory", "host_memory", "pcie", "storage")
CONFIG_FIELDS = ("batch", "tokens_per_step", "drafts", "accepted", "steps", "warmup", "policy", "mode", "seed",
                 "index")

# SIMD FLOPs per cycle per core (fp32 FMA lanes x 2 x FMA units) by the widest ISA the catalog lists.
_FLOPS_PER_CYCLE = (("amx", 64.0), ("avx512", 64.0), ("avx2", 32.0), ("neon", 32.0))
_DEFAULT_CORES, _DEFAULT_GHZ = 8, 3.5   # when the catalog has no CPU part (assumed desktop)


# ------------------------------------------------------------------------------- model lowering
@functools.lru_cache(maxsize=128)
def _params(model: Model) -> dict:
    """Parameter counts per (class, layer) plus global ones; MTP modules under key 'mtp'."""
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


def _score_flops(layer, context: int) -> float:
    """Attention-score FLOPs per token (QK^T and AV) at KV depth ``context``."""
    a = layer.attention
    if a.kind == "gqa":
        span = min(context, a.window or a.chunk or context)
        return 4.0 * a.n_heads * a.head_dim * span
    if a.kind == "mla":
        span = min(context, 2048) if a.index_heads else context   # DSA attends to the indexer's top 2048 (RT §2.2)
        flops = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * span
        if a.index_heads:
            flops += 2.0 * a.index_heads * a.index_head_dim * context
        return flops
    if a.kind == "dsv4":
        topk = {4: 512, 128: 8192}.get(a.compress_ratio, 0)        # c4a / c128a top-k (RT §2.2)
        span = min(context, a.window) + (min(context // a.compress_ratio, topk) if a.compress_ratio else 0)
        return 4.0 * a.n_heads * a.head_dim * span
    # kda / gdn: read and update a fixed state per head
    return 4.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim


def _kv_read_bytes(model: Model, low, l: int, context: int, kvb: float) -> float:
    """KV / state bytes one sequence reads in layer l per step."""
    a = model.layers[l].attention
    cap = int(low.kv_cap[l])
    tokens = min(context, cap) if cap > 0 else context
    if a.kind == "mla" and a.index_heads:
        # DSA: indexer keys for every token, latents only for the selected 2048
        return low.kv_fixed[l] * context + low.kv_elems[l] * kvb * min(context, 2048)
    read = (low.kv_elems[l] * kvb + low.kv_fixed[l]) * tokens
    ratio = int(low.kv_ratio[l])
    if ratio > 0:
        entries = context // ratio
        topk = {4: 512, 128: 8192}.get(ratio, entries)
        read += min(entries, topk) * low.kv_ratio_elems[l] * kvb + entries * low.kv_ratio_fixed[l]
    return read + float(low.kv_state[l])


def op_offload_threshold(rt: Runtime, m: Model) -> float:
    """Tokens per step from which the runtime copies CPU-resident experts to the GPU instead of
    computing them on the CPU (llama.cpp: 32; ik_llama.cpp: 32 x experts / active; RT §1.1)."""
    n = rt.decode.op_offload_min_batch
    if n <= 0:
        return math.inf
    if rt.decode.op_offload_sparse and m.top_k:
        return n * m.n_experts / m.top_k
    return n


def lower_model(m: Model, low, p: Placement, machine: Machine, rt: Runtime, context: int, kv_dtype: str,
                tokens_per_step: int, mem_by_class=None, mem_tier=None, cache_slots: int | None = None) -> dict:
    """The ms_decode_model_t arrays for one configuration."""
    L = m.n_layers
    par = _params(m)
    kvb = Q.kv_dtype_bytes(kv_dtype)
    cpu_only = p.kind == "cpu-only" or machine.n_gpus == 0
    on_gpu = np.ones(L, dtype=np.int32)
    if cpu_only:
        on_gpu[:] = 0
    elif p.kind == "layers-gpu":
        on_gpu[:] = [1 if l >= L - p.arg else 0 for l in range(L)]
    mode = np.zeros(L, dtype=np.int32)
    slots = np.zeros(L, dtype=np.int32)
    moe_index = np.full(L, -1, dtype=np.int32)
    E = m.n_experts
    op_offload = not cpu_only and tokens_per_step >= op_offload_threshold(rt, m)
    j = 0
    for l, layer in enumerate(m.layers):
        if layer.ffn.kind != "moe":
            continue
        moe_index[l] = j
        j += 1
        if cpu_only:
            mode[l] = EXP_CPU
        elif p.kind in ("all-gpu", "unified"):
            mode[l] = EXP_GPU
        elif p.kind == "experts-cpu":
            mode[l] = EXP_CPU
        elif p.kind == "n-cpu-moe":
            mode[l] = EXP_CPU if l < p.arg else EXP_GPU
        elif p.kind == "layers-gpu":
            mode[l] = EXP_GPU if on_gpu[l] else EXP_CPU
        elif p.kind == "gpu-experts":
            mode[l] = EXP_GPU if p.arg >= E else (EXP_SPLIT if p.arg > 0 else EXP_CPU)
            slots[l] = min(p.arg, E)
        elif p.kind == "offload-cache":
            mode[l] = EXP_FETCH
            slots[l] = min(cache_slots if cache_slots is not None else p.arg, E)
        if op_offload and mode[l] == EXP_CPU and on_gpu[l]:
            # llama.cpp: >= 32 tokens in a step send CPU-resident expert matmuls to the GPU,
            # copying the used experts each step (RT §1.1)
            mode[l], slots[l] = EXP_FETCH, 0
    # Host page cache: when mmap'd weights spill to storage, only part of the host experts stay in RAM.
    page_slots = np.full(L, max(E, 1), dtype=np.int32)
    if mem_tier is not None and mem_tier[2] > 0 and E:
        host_routed = float(mem_by_class[3][1])
        frac = max(0.0, 1.0 - mem_tier[2] / host_routed) if host_routed > 0 else 0.0
        page_slots[:] = int(math.floor(E * frac))
    n_exp = np.maximum(low.n_experts, 1)
    expert_params = par["routed_experts"] / n_exp
    tp = machine.n_gpus if (rt.decode.tensor_parallel and machine.n_gpus > 1 and not cpu_only) else 1
    quant = Q.resolve(low.quant, m)
    mtp_modules = max(1, m.mtp_layers)
    draft_bytes = draft_flops = 0.0
    if m.mtp_layers:
        last = m.n_layers - 1
        routed_one = low.expert_one[last] if low.n_experts[last] else 0.0
        mtp_routed_bytes = routed_one * (m.mtp_layer.ffn.n_experts if m.mtp_layer.ffn.kind == "moe" else 0)
        k_active = m.mtp_layer.ffn.top_k if m.mtp_layer.ffn.kind == "moe" else 0
        draft_bytes = (low.mtp / mtp_modules - mtp_routed_bytes + k_active * routed_one) + low.head
        draft_flops = 2.0 * ((par["mtp"] - par["mtp_routed"]) / mtp_modules
                             + par["mtp_routed"] / mtp_modules * (k_active / max(1, m.mtp_layer.ffn.n_experts))
                             + par["lm_head"])
    return dict(
        attn_bytes=low.attn + low.router,
        attn_flops=2.0 * (par["attention"] + par["router"]),
        kv_bytes=np.array([_kv_read_bytes(m, low, l, context, kvb) for l in range(L)]),
        score_flops=np.array([_score_flops(layer, context) for layer in m.layers]),
        shared_bytes=low.shared + low.dense,
        shared_flops=2.0 * (par["shared_experts"] + par["dense_ffn"]),
        expert_bytes=np.array(low.expert_one, dtype=np.float64),
        expert_flops=2.0 * expert_params,
        attn_on_gpu=on_gpu, expert_mode=mode, slots=slots, page_slots=page_slots, moe_index=moe_index,
        head_bytes=float(low.head), head_flops=2.0 * par["lm_head"],
        head_on_gpu=0 if (cpu_only or (p.kind == "layers-gpu" and p.arg == 0)) else 1,
        draft_bytes=float(draft_bytes), draft_flops=float(draft_flops),
        # ktransformers layerwise prefill: chunks of at least this many tokens stream whole expert layers
        # (native formats only)
        layerwise_prefill=(rt.decode.layerwise_prefill_tokens
                           if rt.decode.layerwise_prefill_tokens > 0 and not quant.is_gguf else 0),
        layer_experts=np.asarray(low.n_experts, dtype=np.float64),
        amx_flops_per_cycle=_AMX_FLOPS_PER_CYCLE.get(quant.id, 0.0),
        # f32 hidden state each way plus k ids and weights (RT §1.3)
        act_bytes=0.0 if cpu_only else float(2 * m.hidden * 4 + 8 * max(1, m.top_k)),
        allreduce_bytes=(2 * 2.0 * m.hidden * 2 * (tp - 1) / tp) if tp > 1 else 0.0,
    )


# ------------------------------------------------------------------------------- machine lowering
def _cpu_part(machine: Machine) -> dict:
    return _load_catalog("hardware")["cpu"].get(machine.cpu or "", {})


def _core_cycles(machine: Machine) -> float:
    """Core-cycles per second of the cores the run uses. With every core busy on a matmul they run at the
    base clock (vendors rate TDP at the base frequency with all cores active on a high-complexity load,
    Intel ARK's definition); the boost clock is for one busy core. In between, the clock moves linearly
    with the share of idle cores (assumed): the power budget of the idle cores goes to the busy ones."""
    cpu = _cpu_part(machine)
    base = float(cpu.get("base_ghz", cpu.get("boost_ghz", _DEFAULT_GHZ)))
    boost = float(cpu.get("boost_ghz", base))
    total = int(cpu.get("cores", 0)) * max(1, machine.sockets)
    busy = machine.cores or total or _DEFAULT_CORES
    if total and boost > base:
        # busy x clock peaks at total (base + boost) / (2 (boost - base)) cores: one more thread never slows
        busy = min(busy, total * (base + boost) / (2.0 * (boost - base)))
    idle = min(1.0, max(0.0, 1.0 - busy / total)) if total else 0.0
    return busy * (base + (boost - base) * idle) * 1e9


def _rate_mix(share: float, rel: float) -> float:
    """Rate factor when ``share`` of the bytes run at ``rel`` of the rate and the rest at 1: the
    times per FLOP mix."""
    return 1.0 / (share / rel + (1.0 - share))


def _cpu_flops(machine: Machine, d, mix: Q.KernelMix) -> float:
    """CPU matmul FLOP/s of runtime parameters ``d``: codebook-grid i-quants run at cpu_iquant_rel, fp8
    weights (no fp8 arithmetic on CPUs: converted to bf16 before the dot products) at cpu_fp8_rel."""
    isa = tuple(machine.cpu_isa) or ("avx2",)
    per_cycle = next((v for key, v in _FLOPS_PER_CYCLE if key in isa), 16.0)
    return (_core_cycles(machine) * per_cycle * d.cpu_flops_eff * d.cpu_kernel_speedup
            * _rate_mix(mix.cpu_grid, d.cpu_iquant_rel) * _rate_mix(mix.cpu_fp8, d.cpu_fp8_rel))


def _mmq_rel(mix: Q.KernelMix, d) -> float:
    """Rate factor of llama.cpp's CUDA prefill GEMMs (MMQ) by weight type: K-quants ran without int8 tensor
    cores before PR #7860 (gpu_kquant_mmq_rel); MXFP4 tiles go through a lookup to int8 (gpu_mxfp4_mmq_rel)."""
    return _rate_mix(mix.mmq_kquant, d.gpu_kquant_mmq_rel) * _rate_mix(mix.mmq_mxfp4, d.gpu_mxfp4_mmq_rel)


# AMX tile FLOP per cycle per core by the routed experts' format: int8 (INT4 is unpacked to int8 tiles)
# 2048 MACs, bf16 1024 MACs (KT doc/en/AMX.md via RT §5.3); other formats use the AVX-512 path
_AMX_FLOPS_PER_CYCLE = {"int8": 4096.0, "int4": 4096.0, "int4-g32": 4096.0, "bf16": 2048.0}


def lower_machine(machine: Machine, rt: Runtime, p: Placement, mix: Q.KernelMix) -> dict:
    """Effective rates (bytes/s, FLOP/s) and latencies (s) of ms_machine_t; ``mix`` is
    quants.kernel_mix of the configuration (the weight types set the CPU and GPU GEMM rates)."""
    d = rt.decode
    cpu_only = p.kind == "cpu-only" or machine.n_gpus == 0
    if machine.unified:
        # Apple chips run Metal (RT §1.9, §6); NVIDIA's GB10 (DGX Spark) runs CUDA with graphs
        metal = _load_catalog("hardware")["unified"].get(machine.gpu, {}).get("vendor") == "apple"
        eff = d.metal_bw_eff if metal else d.gddr_bw_eff      # GB10: LPDDR5X through CUDA
        pool = machine.gpu_bw_gbs * GB * eff
        peak = machine.gpu_tflops.get("fp16", 0.0) * 1e12
        gpu_flops = peak * d.gpu_flops_eff
        cpu_flops = _cpu_flops(machine, d, mix)
        launch = d.launch_us_metal if metal else d.launch_us
        pf_eff = d.prefill_flops_eff_unified
        if not metal:
            # GB10 prefills like a discrete CUDA card: llama.cpp's int8 MMQ, whose Blackwell rate equals the
            # fp8 rate (RTX 5090: int8 = fp8 = 838.4 TFLOPS in the catalog), at the GDDR cards' share of it
            pf_eff = d.prefill_flops_eff * _mmq_rel(mix, d)
            if rt.llama_cpp_family:
                peak = machine.gpu_tflops.get("int8", machine.gpu_tflops.get("fp8", 0.0)) * 1e12 or peak
        pf = max(peak * pf_eff, cpu_flops)
        return dict(gpu_bw=pool, host_bw=pool, pcie_bw=pool, storage_bw=max(machine.storage_read_gbs, 1e-3) * GB,
                    gpu_flops=max(gpu_flops, cpu_flops), cpu_flops=cpu_flops, interconnect_bw=pool, unified=1,
                    prefill_flops=pf, prefill_gemm_flops=pf, prefill_attn_flops=pf,
                    overlap=1 if d.overlap else 0, launch_s=0.0 if cpu_only else launch * 1e-6,
                    sync_s=0.0, dma_s=0.0, allreduce_s=0.0, step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6,
                    amx_flops=0.0, pcie_links=1)
    server = machine.channels > 4
    host_eff = d.host_bw_eff_server if server else d.host_bw_eff_desktop
    if machine.sockets > 1:
        host_eff *= d.cross_socket_eff
    host_bw = machine.host_bw_gbs * GB * host_eff
    if machine.cores:
        # a few threads cannot saturate many channels: each core streams at most core_bw_gbs(_server)
        host_bw = min(host_bw, machine.cores * (d.core_bw_gbs_server if server else d.core_bw_gbs) * GB)
    cpu_flops = _cpu_flops(machine, d, mix)
    amx = _core_cycles(machine) * d.amx_flops_eff if (d.amx_prefill and "amx" in machine.cpu_isa) else 0.0
    storage_bw = max(machine.storage_read_gbs, 1e-3) * GB
    if cpu_only:
        return dict(gpu_bw=host_bw, host_bw=host_bw, pcie_bw=host_bw, storage_bw=storage_bw, gpu_flops=cpu_flops,
                    prefill_flops=cpu_flops, prefill_gemm_flops=cpu_flops, prefill_attn_flops=cpu_flops,
                    cpu_flops=cpu_flops, interconnect_bw=host_bw, unified=0, overlap=0, launch_s=0.0, sync_s=0.0,
                    dma_s=0.0, allreduce_s=0.0, step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6,
                    amx_flops=amx, pcie_links=1)
    hw = _load_catalog("hardware")
    g = hw["gpu"].get(machine.gpu, {})
    tp = machine.n_gpus if (d.tensor_parallel and machine.n_gpus > 1) else 1
    tf = machine.gpu_tflops
    peak_tflops = max(tf.get("bf16", 0.0), tf.get("fp16", 0.0), tf.get("fp32", 0.0), 1.0)
    pinned = machine.pcie_pinned_gbs or machine.pcie_gbs * 0.88 or 12.0
    pcie = pinned * GB * (1.0 if d.pinned_experts else d.pcie_pageable)
    graphs = g.get("cuda_graphs", True)
    scale_up = g.get("scale_up", {}).get("gbs", 0.0) if isinstance(g.get("scale_up"), dict) else 0.0
    hbm = str(g.get("memory_type", "")).startswith("hbm")
    bw_eff = d.gpu_bw_eff if hbm else d.gddr_bw_eff
    # the HBM prefill efficiency describes tensor-core datacenter parts (A100 / H100); Pascal's HBM2 P100
    # multiplies on dp4a like the GDDR cards
    tensor_cores = g.get("tensor_cores", False)
    pf_eff = d.prefill_flops_eff_hbm if (hbm and tensor_cores) else d.prefill_flops_eff
    if tensor_cores:
        pf_eff *= _mmq_rel(mix, d)
    # llama.cpp multiplies quantized weights with int8 tensor-core MMQ kernels (ggml-cuda mmq): its
    # prefill scales with the int8 rate; served runtimes run bf16/fp8 GEMMs
    pf_peak = tf.get("int8", peak_tflops) if rt.llama_cpp_family else peak_tflops
    pf = pf_peak * 1e12 * pf_eff * tp
    gemm, attn = pf, pf
    if tensor_cores and not rt.llama_cpp_family:
        # served runtimes multiply fp8 checkpoints on fp8 tensor cores (block-scaled fp8 GEMMs: DeepGEMM,
        # CUTLASS, Triton), and their flash-attention kernels run the scores at their own share of the
        # 16-bit peak; llama.cpp's prefill share covers its whole ubatch
        fp8_rel = tf.get("fp8", 0.0) / peak_tflops
        gemm = pf * (_rate_mix(mix.fp8, fp8_rel) if fp8_rel > 1.0 else 1.0)
        attn = peak_tflops * 1e12 * d.attn_flops_eff * tp
    return dict(gpu_bw=machine.gpu_bw_gbs * GB * bw_eff * tp, host_bw=host_bw, pcie_bw=pcie,
                prefill_flops=pf, prefill_gemm_flops=gemm, prefill_attn_flops=attn,
                storage_bw=storage_bw, gpu_flops=peak_tflops * 1e12 * d.gpu_flops_eff * tp, cpu_flops=cpu_flops,
                interconnect_bw=(scale_up or machine.pcie_gbs or 16.0) * GB, unified=0,
                overlap=1 if d.overlap else 0,
                launch_s=(d.launch_us if graphs else d.launch_us_nograph) * 1e-6, sync_s=d.sync_us * 1e-6,
                dma_s=d.dma_us * 1e-6, allreduce_s=d.allreduce_us * 1e-6 if tp > 1 else 0.0,
                step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6 / max(1, d.data_parallel),
                amx_flops=amx, pcie_links=tp)


# ------------------------------------------------------------------------------- running
def run(dm: dict, hw: dict, rt: dict, cols: dict, n_threads: int = 1, engine: str = "c") -> dict:
    """Evaluate configurations (columns of CONFIG_FIELDS) on lowered tables; returns result arrays."""
    n = len(cols["batch"])
    for f in CONFIG_FIELDS:
        if len(cols[f]) != n:
            raise MoesimError(f"config column {f} has {len(cols[f])} rows, expected {n}", f)
    if engine == "reference":
        from . import reference
        return reference.decode_many(dm, hw, rt, cols)
    if engine != "c":
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    from . import _kernel
    code, bad, res = _kernel.decode_many(dm, hw, rt, cols, int(n_threads))
    if code:
        raise KernelError(f"C kernel error at configuration {bad}: {_kernel.strerror(code)}")
    return res


# ------------------------------------------------------------------------------- public API
@dataclass
class Result:
    """Decode (and prefill) of one configuration. Times per token are per sequence."""

    decode_tok_s: float
    aggregate_tok_s: float
    prefill_tok_s: float
    ttft_s: float
    tpot_ms: dict
    breakdown: dict
    bottleneck: str
    expert_hit_rate: float | None
    page_cache_hit_rate: float | None
    distinct_experts_per_step: float
    reuse: float
    bytes_per_token: dict
    memory: dict
    mode: str
    policy: str
    tokens: int
    seed: int
    routing: str
    provenance: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = dict(self.memory)
        out.update({k: getattr(self, k) for k in (
            "decode_tok_s", "aggregate_tok_s", "prefill_tok_s", "ttft_s", "tpot_ms", "breakdown", "bottleneck",
            "expert_hit_rate", "page_cache_hit_rate", "distinct_experts_per_step", "reuse", "bytes_per_token",
            "mode", "policy", "tokens", "seed", "routing", "provenance")})
        return out


def _check_fraction(value, name: str, lo: float = 0.0, hi: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value) \
            or not (lo <= value <= hi):
        raise MoesimError(f"must be a number in [{lo:g}, {hi:g}], got {value!r}", name)
    return float(value)


def accepted_per_step(drafts: int, acceptance: float) -> float:
    """Expected tokens per verify step with a chain of ``drafts`` drafts, each accepted with
    probability ``acceptance`` given its predecessor was: 1 + a + a^2 + ... + a^n."""
    return 1.0 + sum(acceptance ** i for i in range(1, drafts + 1))


def simulate(model, machine: Machine, quant="native", context: int = 4096, batch: int = 1, placement=None,
             runtime=None, kv_dtype: str | None = None, policy: str = "lru", cache_experts: int | None = None,
             prefetch_recall: float | None = None, tokens: int = 256, warmup: int | None = None, seed: int = 0,
             mode: str = "montecarlo", trace=None, routing=None, mtp: int = 0, mtp_acceptance: float = 0.8,
             prompt: int = 512, parallel: str | None = None, engine: str = "c") -> Result:
    """Simulate decoding ``tokens`` steps of ``batch`` sequences at KV depth ``context`` (see DESIGN §3)."""
    from .fit import record, resolve
    from . import traces as T
    m = get_model(model)
    if not isinstance(machine, Machine):
        raise MoesimError("expected a moesim.machine(...)", "machine")
    context = check_count(context, "context")
    batch = check_count(batch, "batch")
    tokens = check_count(tokens, "tokens")
    prompt = check_count(prompt, "prompt")
    seed = check_count(seed, "seed", minimum=0)
    mtp = check_count(mtp, "mtp", minimum=0)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    mtp_acceptance = _check_fraction(mtp_acceptance, "mtp_acceptance")
    if not isinstance(policy, str) or policy.lower() not in POLICIES:
        raise unknown_id("cache policy", policy, POLICIES, "policy")
    policy = policy.lower()
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise unknown_id("mode", mode, MODES, "mode")
    mode = mode.lower()
    if mode == "analytic" and policy == "belady":
        raise MoesimError("belady is an offline bound that needs the future: use mode='montecarlo'", "policy")
    if cache_experts is not None:
        cache_experts = check_count(cache_experts, "cache_experts", minimum=0)
    if prefetch_recall is not None:
        prefetch_recall = _check_fraction(prefetch_recall, "prefetch_recall")
    if warmup is None:
        warmup = 0 if trace is not None else min(32, tokens // 4)
    warmup = check_count(warmup, "warmup", minimum=0)
    if warmup >= tokens:
        raise MoesimError(f"must be smaller than tokens ({tokens}), got {warmup}", "warmup")

    q, rt, kv, low, p = resolve(m, quant, machine, runtime, placement, context, batch, kv_dtype, mtp, parallel)
    if cache_experts is not None:
        if p.kind != "offload-cache" and placement not in (None, "auto"):
            raise MoesimError(f"cache_experts applies to the offload-cache placement, not {p}", "cache_experts")
        p = Placement("offload-cache", min(cache_experts, m.n_experts))
    cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    mem = _result_from_arrays(evaluate(low, cfg), 0)
    memory = record(m, q, kv, context, batch, p, rt, machine, mem, mtp)

    dims = R.RoutingDims.of(m)
    prefetch = prefetch_recall is not None and prefetch_recall > 0
    if trace is not None:
        tr = trace if isinstance(trace, T.Trace) else T.load(trace)
        if dims.n_layers == 0:
            raise MoesimError(f"{m.id} is dense: a routing trace does not apply", "trace")
        rtab = R.lower_trace(dims, tr, prefetch_recall or 0.0)
        routing_name = f"trace {getattr(tr, 'source', '') or 'replay'}"
    else:
        prof = R.profile(routing, family=m.family) if not isinstance(routing, R.RoutingProfile) else routing
        if prefetch:
            prof = R.profile(prof, recall=prefetch_recall)
        rtab = R.lower(dims, prof, seed, prefetch=prefetch)
        routing_name = prof.id
    drafts = mtp
    tps = 1 + drafts
    dm = lower_model(m, low, p, machine, rt, context, kv, batch * tps, mem.by_class, mem.tier)
    hw = lower_machine(machine, rt, p, Q.kernel_mix(m, q))
    accepted = accepted_per_step(drafts, mtp_acceptance)
    cols = dict(batch=[batch], tokens_per_step=[tps], drafts=[drafts], accepted=[accepted], steps=[tokens],
                warmup=[warmup], policy=[POLICIES[policy]], mode=[MODES[mode]], seed=[seed], index=[0])
    res = run(dm, hw, rtab, cols, engine=engine)
    pf_tok_s, ttft = prefill(m, dm, hw, rtab, rt, prompt, batch)
    return _result(res, 0, batch, memory, mode, policy, tokens, seed, routing_name, pf_tok_s, ttft)


def estimate(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
             mem, mtp: int = 0, mtp_acceptance: float = 0.8, prompt: int = 512) -> tuple:
    """(decode tok/s per sequence, prefill tok/s) on the analytic path with the family's routing
    profile: what ``moesim fit`` reports next to the memory view."""
    dims = R.RoutingDims.of(m)
    rtab = R.lower(dims, R.profile(None, family=m.family), 0)
    tps = 1 + mtp
    dm = lower_model(m, low, p, machine, rt, context, kv, batch * tps, mem.by_class, mem.tier)
    hw = lower_machine(machine, rt, p, Q.kernel_mix(m, low.quant))
    cols = dict(batch=[batch], tokens_per_step=[tps], drafts=[mtp], accepted=[accepted_per_step(mtp, mtp_acceptance)],
                steps=[1], warmup=[0], policy=[POLICIES["lru"]], mode=[MODES["analytic"]], seed=[0], index=[0])
    res = run(dm, hw, rtab, cols)
    pf, _ = prefill(m, dm, hw, rtab, rt, prompt, batch)
    return float(res["accepted"][0] / res["step_mean"][0]), pf


_PARALLEL_RE = re.compile(r"^(?:(tp|ep|pp)(\d+)(?:-ep(\d+))?(?:-attn-dp)?|layer-split|row-split|pipeline)$")


def with_parallel(rt: Runtime, parallel: str | None, machine: Machine) -> Runtime:
    """The runtime with its multi-GPU layout set by ``--parallel`` (tp8, tp4-ep4, ep8, tp8-ep8-attn-dp,
    layer-split, row-split, pipeline): tensor/expert parallel layouts read every GPU's memory at
    once (bandwidth adds, all-reduce per layer); layer split and pipelines walk the GPUs in turn."""
    if parallel is None:
        return rt
    if not isinstance(parallel, str):
        raise MoesimError(f"expected a layout such as tp8 or layer-split, got {parallel!r}", "parallel")
    spec = parallel.strip().lower()
    m = _PARALLEL_RE.match(spec)
    if not m:
        raise MoesimError(f"unknown layout {parallel!r}: use tpN, epN, tpN-epM[-attn-dp], layer-split, "
                          "row-split or pipeline", "parallel")
    degree = int(m.group(2)) if m.group(2) else machine.n_gpus
    if degree > max(1, machine.n_gpus):
        raise MoesimError(f"{parallel} spans {degree} GPUs and the machine has {machine.n_gpus} "
                          "(multi-node layouts are not modelled)", "parallel")
    split = spec in ("layer-split", "pipeline") or (m.group(1) == "pp")
    # attention data parallelism: each rank schedules, samples and attends its own share of the batch
    dp = degree if spec.endswith("-attn-dp") else 1
    return dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, tensor_parallel=not split, data_parallel=dp))


def _result(res: dict, i: int, batch: int, memory: dict, mode: str, policy: str, tokens: int, seed: int,
            routing_name: str, pf_tok_s: float, ttft: float) -> Result:
    acc = float(res["accepted"][i])
    step = float(res["step_mean"][i])
    by_res = {name: float(res["by_resource"][i][k]) / acc for k, name in enumerate(RESOURCES)}
    by_phase = {name: float(res["by_phase"][i][k]) / acc for k, name in enumerate(PHASES)}
    per_token = batch * acc
    hit = float(res["hit_rate"][i])
    page = float(res["page_hit_rate"][i])
    return Result(
        decode_tok_s=acc / step, aggregate_tok_s=batch * acc / step, prefill_tok_s=pf_tok_s, ttft_s=ttft,
        tpot_ms={"mean": 1e3 * step / acc, "p50": 1e3 * float(res["step_p50"][i]) / acc,
                 "p99": 1e3 * float(res["step_p99"][i]) / acc},
        breakdown={"by_phase": by_phase, "by_resource": by_res, "seconds_per_token": step / acc},
        bottleneck=max(by_res, key=by_res.get),
        expert_hit_rate=None if hit < 0 else hit, page_cache_hit_rate=None if page < 0 else page,
        distinct_experts_per_step=float(res["distinct"][i]), reuse=float(res["reuse"][i]),
        bytes_per_token={name: float(res["bytes"][i][k]) / per_token for k, name in enumerate(LINKS)},
        memory=memory, mode=mode, policy=policy, tokens=tokens, seed=seed, routing=routing_name,
        provenance={"moesim": __version__, "catalog": _load_catalog("models").get("catalog_version", ""),
                    "seed": seed})


# ------------------------------------------------------------------------------- prefill
def prefill_score_flops(m: Model, prompt: int, depth: int = 0) -> np.ndarray:
    """Attention-score FLOPs per prompt token and layer: a prompt of ``prompt`` tokens appended to
    ``depth`` cached ones attends, on average, over depth + prompt / 2 keys."""
    return np.array([_score_flops(layer, depth + max(1, prompt // 2)) for layer in m.layers])


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
