"""Lowering a machine under a runtime to ``ms_machine_t``: effective bandwidths, FLOP/s, latencies."""
from __future__ import annotations

import math
from dataclasses import replace

from ...spec import quants as Q
from ..._catalog import load as _load_catalog
from ...spec.hardware import GB, Machine
from ...spec.placement import Placement
from ...spec.runtimes import Runtime
from .parallel import allreduce_count, layout_degrees


_DEFAULT_CORES, _DEFAULT_GHZ = 8, 3.5   # when the catalog has no CPU part (assumed desktop)


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


# the widest vector an ISA list lets a kernel use, bits, and the catalog core of a part that names none
_ISA_BITS = (("avx512", 512, "isa-avx512"), ("avx2", 256, "isa-avx2"), ("neon", 128, "isa-neon"))


def flops_per_cycle(machine: Machine) -> float:
    """fp32 SIMD FLOP per cycle per core: the catalog's core microarchitecture (hardware.toml [cpu_core],
    named by the CPU part's ``core`` or the unified chip's ``cpu_core``) as fma_units x lanes x 2, its
    FMA width capped by the ISA the run may use (an AVX2-only build on a 512-bit core runs 256-bit FMAs).
    A part that names no core takes the isa-* entry of its widest ISA."""
    hw = _load_catalog("hardware")
    isa = tuple(machine.cpu_isa) or ("avx2",)
    isa_bits, isa_core = next(((b, c) for key, b, c in _ISA_BITS if any(i.startswith(key) for i in isa)),
                              (256, "isa-other"))
    if machine.unified:
        part = hw["unified"].get(machine.gpu or "", {}).get("cpu_core")
    else:
        part = _cpu_part(machine).get("core")
    core = hw["cpu_core"][part or isa_core]
    return float(core["fma_units"]) * min(int(core["vector_bits"]), isa_bits) / 32.0 * 2.0


def cpu_attention_flops(machine: Machine, d, cpu_flops: float) -> dict:
    """ms_machine_t.cpu_attn_flops and the prompt's CPU attention rate (cpu_prefill_attn_flops): the runtime's
    attention kernels at their share of the cores' fp32 vector peak (cpu_attn_eff, cpu_prefill_attn_eff), or
    at its matmul rate ``cpu_flops`` where it sets none; and the last-level cache a prompt's per-row walks of
    the KV cache re-read from (cpu_llc_bytes: hardware.toml l3_mb, 0 where the catalog gives none)."""
    peak = _core_cycles(machine) * flops_per_cycle(machine)
    llc = 0.0 if machine.unified else float(_cpu_part(machine).get("l3_mb", 0.0)) * 2**20
    return dict(cpu_llc_bytes=llc, cpu_attn_flops=peak * d.cpu_attn_eff if d.cpu_attn_eff > 0 else cpu_flops,
                cpu_prefill_attn_flops=peak * d.cpu_prefill_attn_eff if d.cpu_prefill_attn_eff > 0 else cpu_flops)


def _rate_mix(share: float, rel: float) -> float:
    """Rate factor when ``share`` of the bytes run at ``rel`` of the rate and the rest at 1: the
    times per FLOP mix."""
    return 1.0 / (share / rel + (1.0 - share))


def _cpu_flops(machine: Machine, d, mix: Q.KernelMix) -> float:
    """CPU matmul FLOP/s of runtime parameters ``d``: codebook-grid i-quants run at cpu_iquant_rel, value-table
    types (IQ4_NL, IQ4_XS, MXFP4) at cpu_lut_rel, fp8
    weights (no fp8 arithmetic on CPUs: converted to bf16 before the dot products) at cpu_fp8_rel."""
    return (_core_cycles(machine) * flops_per_cycle(machine) * d.cpu_flops_eff * d.cpu_kernel_speedup
            * _rate_mix(mix.cpu_grid, d.cpu_iquant_rel) * _rate_mix(mix.cpu_lut, d.cpu_lut_rel)
            * _rate_mix(mix.cpu_fp8, d.cpu_fp8_rel))


def _mmq_rel(mix: Q.KernelMix, d, backend: str = "cuda") -> float:
    """Rate factor of llama.cpp's prefill GEMMs (MMQ) by weight type: K-quants ran without int8 tensor cores
    before PR #7860 (gpu_kquant_mmq_rel); MXFP4 tiles go through a lookup to int8 (gpu_mxfp4_mmq_rel). The
    MXFP4 factor was measured on CUDA cards (4090, 5090) only: under HIP the same MMQ code prefills gpt-oss
    faster per FLOP than K-quant models on the same chip (Strix Halo rows of three sources, e.g. gpt-oss-20b
    pp512 1,000-1,500 t/s vs Qwen3-30B-A3B Q4_K 300-1,100 t/s), so it applies to the CUDA backend alone."""
    mxfp4 = d.gpu_mxfp4_mmq_rel if backend == "cuda" else 1.0
    return _rate_mix(mix.mmq_kquant, d.gpu_kquant_mmq_rel) * _rate_mix(mix.mmq_mxfp4, mxfp4)


# ------------------------------------------------------------------------------- llama.cpp GPU backends
_BACKEND_OF_VENDOR = {"nvidia": "cuda", "amd": "hip", "intel": "sycl", "apple": "metal"}


def backend_terms(rt: Runtime, g: dict) -> dict:
    """The llama.cpp backend's terms on discrete GPU ``g`` (runtimes.toml [backends.*]): ``name``, ``peak``
    (which catalog rate its prompt GEMMs run at: "int8", "fp16" or "vector"), ``fp16_acc_rel`` (the fp16 path
    accumulating in fp16 at this multiple of the catalog's fp16 rate), ``moe_fp32_share`` (routed-expert
    GEMMs at this share of the fp32 vector peak, 0: as the dense GEMMs), ``moe_half_tokens`` (the tokens per
    used expert at which a ubatch's routed-expert GEMMs run at half the dense rate, 0: no such loss) and
    ``bw_eff`` (decode share of peak bandwidth, 0: the runtime's gddr / HBM share) and ``fa_fp32_share`` (the
    prompt's flash attention at this share of the fp32 vector peak where that is below its GEMM rate, 0: at
    the GEMM rate) and ``fa_fp16_share`` (the same of the 16-bit matrix peak, on cards with matrix units) and
    ``weight_pass_tokens`` (the tokens per pass its prompt GEMMs make over their weights, 0: one pass per
    ubatch) and ``moe_padded_tiles`` (its routed-expert GEMMs compute whole ubatch-wide tiles per used expert) and
    ``int8_share`` (its prompt GEMMs at this share of a card's int8 rate in place of the runtime's prefill_flops_eff,
    0: that) and ``dense_gemm_rel`` (an earlier build's dense prompt GEMMs on a card's matrix units at this multiple of
    the current rate; routed experts keep it) and ``decode_paths`` (its decode kernels' token-count paths,
    :func:`decode_paths`; empty: none) and ``launch_us_nograph`` (the backend's own per-layer host cost, by arch prefix or vendor, in place of the
    runtime's no-graph launch and paid whether or not the chip replays CUDA graphs; -1: the runtime's, see
    :func:`with_backend_launch`).
    Runtimes outside llama.cpp get {} (their own GEMM paths)."""
    if not rt.llama_cpp_family:
        return {}
    tables = _load_catalog("runtimes").get("backends", {})
    name = rt.backend or _BACKEND_OF_VENDOR.get(str(g.get("vendor", "")), "cuda")
    b = tables.get(name, {})
    if "base" in b:                                     # an era of a backend: its base's terms, then its own
        b = {**tables.get(b["base"], {}), **b}
    arch, vendor = str(g.get("arch", "")), str(g.get("vendor", ""))
    matrix = bool(g.get("tensor_cores", False)) and arch not in b.get("matrix_off", ())
    path = "matrix" if matrix else "no_matrix"       # the per-path terms' key
    # MMQ's int8 kernels need an int8 rate: a card without one (no dp4a: P100, sm_60) runs its experts through cuBLAS
    mmq = "int8" in g.get("tflops", {})
    segment = f"{vendor}-{g.get('segment', '')}"
    nograph = b.get("launch_us_nograph", {})        # keyed by arch prefix or by vendor
    return dict(name=name, peak=b.get("gemm", "int8") if matrix else b.get("no_matrix_gemm", "int8"),
                launch_us_nograph=_arch_value(nograph, arch, float(nograph.get(vendor, -1.0))),
                moe_fp32_share=float(b.get("moe_fp32_share", {}).get(vendor, 0.0)),
                moe_half_tokens=float(b.get("moe_half_tokens", {}).get(vendor, 0.0)),
                weight_pass_tokens=float(b.get("weight_pass_tokens", {}).get(path, 0.0)),
                moe_padded_tiles=mmq and path in b.get("moe_padded_tiles", ()),
                int8_share=float(b.get("int8_share", {}).get(path, 0.0)) if mmq else 0.0,
                bw_eff=float(b.get("bw_eff", {}).get(arch, 0.0)),
                fa_fp32_share=_arch_value(b.get("fa_fp32_share", {}), arch),
                fa_fp16_share=float(b.get("fa_fp16_share", {}).get(vendor, 0.0)) if matrix else 0.0,
                fp16_acc_rel=float(b.get("fp16_acc_rel", {}).get(segment, 1.0)),
                dense_gemm_rel=float(b.get("dense_gemm_rel", {}).get(vendor, 1.0)) if matrix else 1.0,
                decode_paths=dict(b.get("decode_paths", {})))


def _arch_value(table: dict, arch: str, default: float = 0.0) -> float:
    """The value of ``table`` under the longest key that prefixes ``arch`` (gfx11 covers gfx1100 ... gfx1151);
    ``default`` where none does."""
    keys = [k for k in table if arch.startswith(str(k))]
    return float(table[max(keys, key=len)]) if keys and arch else default


def fp32_tflops(tf: dict, g: dict) -> float:
    """The card's fp32 vector rate: the catalog's ``fp32_tflops`` (the ``tflops`` table of a card with matrix
    units lists only their rates)."""
    return float(g.get("fp32_tflops", tf.get("fp32", 0.0)))


# each per-family map of a backend and the key that must cite its numbers
_TERM_SOURCES = {"moe_fp32_share": "moe_source", "bw_eff": "bw_source", "fp16_acc_rel": "acc_source",
                 "dense_gemm_rel": "dense_rel_source",
                 "moe_half_tokens": "moe_half_source", "fa_fp32_share": "fa_source", "fa_fp16_share": "fa_fp16_source",
                 "launch_us_nograph": "launch_source", "weight_pass_tokens": "pass_source",
                 "decode_paths": "decode_paths_source", "moe_padded_tiles": "padded_source",
                 "int8_share": "int8_share_source"}


def backend_source_errors(tables: dict) -> list:
    """What in runtimes.toml [backends.*] ``tables`` lacks a source: a backend without ``source``, or a
    per-family value (moe_fp32_share, bw_eff, fp16_acc_rel, moe_half_tokens, fa_fp32_share) whose key its
    ``*_source`` line does not name."""
    errors = []
    for name, b in tables.items():
        if not str(b.get("source", "")).strip():
            errors.append(f"backend {name}: no source")
        for term, cite in _TERM_SOURCES.items():
            for key in b.get(term, {}):
                if str(key) not in str(b.get(cite, "")):
                    errors.append(f"backend {name}: {term}.{key} has no source line ({cite})")
    return errors


def vector_tflops(tf: dict, g: dict) -> float:
    """The shader ALUs' rate a scalar (non-matrix) GEMM runs at: packed fp16 at 2x fp32 where the card has it
    (RDNA, Xe, GeForce since Turing: the catalog's fp16 is then the matrix rate or 2x fp32), else fp32 (Pascal
    GP10x runs fp16 at 1/64)."""
    fp32 = fp32_tflops(tf, g)
    packed = bool(g.get("tensor_cores", False)) or tf.get("fp16", 0.0) >= 2.0 * fp32 * 0.99
    return 2.0 * fp32 if packed else fp32


def _gemm_peak(tf: dict, g: dict, terms: dict, peak_tflops: float) -> float:
    """TFLOPS of the rate a llama.cpp backend's prompt GEMMs run at (backend_terms ``peak``)."""
    kind = terms.get("peak", "int8")
    if kind == "fp16":
        return tf.get("fp16", peak_tflops) * terms.get("fp16_acc_rel", 1.0)
    if kind == "vector":
        return vector_tflops(tf, g) or peak_tflops
    return tf.get("int8", peak_tflops)


# AMX tile FLOP per cycle per core by the routed experts' format: int8 (INT4 is unpacked to int8 tiles)
# 2048 MACs, bf16 1024 MACs (KT doc/en/AMX.md via RT §5.3); other formats use the AVX-512 path
_AMX_FLOPS_PER_CYCLE = {"int8": 4096.0, "int4": 4096.0, "int4-g32": 4096.0, "bf16": 2048.0}


def kernel_clock_scale(d, chip: dict) -> float:
    """What one kernel's constant latency (``kernel_us``, ``moe_layer_us``) is multiplied by on this GPU: it is
    counted in the GPU's cycles, so ``kernel_ref_mhz / boost_mhz`` (runtimes.toml kernel_ref_mhz); 1 where
    either clock is unknown (a custom GPU, a runtime without a reference)."""
    boost = float(chip.get("boost_mhz", 0.0) or 0.0)
    return d.kernel_ref_mhz / boost if (boost > 0 and d.kernel_ref_mhz > 0) else 1.0


def graph_launch_us(d, clock: float = 1.0) -> float:
    """Per-layer latency of a decode step replayed as a CUDA graph: each of the runtime's ``layer_kernels``
    graph nodes per decoder layer pays ``kernel_us`` whatever it reads, x ``clock`` (:func:`kernel_clock_scale`)
    (llama.cpp and the serving runtimes, runtimes.toml); a runtime that does not count its kernels keeps its
    per-layer ``launch_us`` (eager engines: host-side launches, not scaled)."""
    return d.layer_kernels * d.kernel_us * clock if d.layer_kernels > 0 else d.launch_us


def layer_launch_us(d, graphs: bool, clock: float = 1.0) -> float:
    """Per-layer kernel latency of a decode step: the graph-replayed kernels' (:func:`graph_launch_us`), and
    without CUDA / HIP graphs each kernel's launch on top (``launch_us_nograph``, what graphs save: host-side,
    not scaled by the GPU clock)."""
    return graph_launch_us(d, clock) + (0.0 if graphs else d.launch_us_nograph)


def graph_limit(d, graphs: bool) -> dict:
    """ms_machine_t's graph_max_tokens, nograph_s and mmid_sync_s: a GPU that replays decode as CUDA graphs, under a
    build that captures them only up to ``graph_max_batch`` tokens, pays ``launch_us_nograph`` per layer on larger
    steps (a GPU without graphs pays it always, in launch_s). Those builds stop capturing there because a larger
    step's MUL_MAT_ID leaves the mat-vec kernel for MMQ with expert ids, which synchronises the stream (ggml-cuda's
    TAG_MUL_MAT_ID_CUDA_GRAPHS; PR #18958): each MoE layer then pays one of the two synchronisations ``sync_us``
    charges a CPU-expert layer."""
    limit = int(d.graph_max_batch) if graphs else 0
    return dict(graph_max_tokens=limit, nograph_s=d.launch_us_nograph * 1e-6 if limit > 0 else 0.0,
                mmid_sync_s=0.5 * d.sync_us * 1e-6 if limit > 0 else 0.0)


def node_op_us(d, graphs: bool, clock: float = 1.0) -> float:
    """One extra graph node of a layer on the GPU (a decode model's ``layer_ops``): a replayed kernel's
    ``kernel_us`` x ``clock``, and without graphs its share of the layer's launches on top."""
    share = d.launch_us_nograph / d.layer_kernels if d.layer_kernels > 0 else 0.0
    return d.kernel_us * clock + (0.0 if graphs else share)


def replays_graphs(d, chip: dict) -> bool:
    """Whether the runtime's build replays decode steps as CUDA / HIP graphs on this GPU: the catalog's
    ``cuda_graphs`` (what current builds do on the chip), unless the build gates graphs by compute capability
    (``graphs_min_cc``: a dated llama.cpp build, row_notes.graphs_min_cc) above the chip's."""
    if not chip.get("cuda_graphs", True):
        return False
    cc = chip.get("compute_capability")
    return not (d.graphs_min_cc > 0.0 and cc is not None and float(cc) < d.graphs_min_cc)


def with_backend_launch(d, graphs: bool, terms: dict) -> tuple:
    """(decode parameters, graphs) under a llama.cpp backend that sets its own per-layer launch cost
    (runtimes.toml [backends.*] launch_us_nograph): the Vulkan backend records command buffers while the GPU
    runs (no host launch per kernel on the critical path) and the HIP backend pays its measured per-layer
    cost; both in place of the runtime's ``launch_us_nograph`` and of any CUDA-graph replay."""
    us = terms.get("launch_us_nograph", -1.0)
    if us < 0.0:
        return d, graphs
    return replace(d, launch_us_nograph=us), False


def placement_key(p: Placement) -> bool:
    """All :func:`lower_machine` reads of a placement (whether it is CPU-only): what a cache of its tables
    keys on, so placements that differ elsewhere (n-cpu-moe=1, =2, ...) share one table."""
    return p.kind == "cpu-only"


def lower_machine(machine: Machine, rt: Runtime, p: Placement, mix: Q.KernelMix) -> dict:
    """Effective rates (bytes/s, FLOP/s) and latencies (s) of ms_machine_t; ``mix`` is
    quants.kernel_mix of the configuration (the weight types set the CPU and GPU GEMM rates)."""
    d = rt.decode
    cpu_only = placement_key(p) or machine.n_gpus == 0
    if machine.unified:
        return _lower_unified(machine, rt, mix, cpu_only)
    host_bw = _host_bw(machine, d)
    cpu_flops = _cpu_flops(machine, d, mix)
    amx = _core_cycles(machine) * d.amx_flops_eff if (d.amx_prefill and "amx" in machine.cpu_isa) else 0.0
    storage_bw = max(machine.storage_read_gbs, 1e-3) * GB
    if cpu_only:
        return dict(gpu_bw=host_bw, host_bw=host_bw, pcie_bw=host_bw, storage_bw=storage_bw, gpu_flops=cpu_flops,
                    prefill_flops=cpu_flops, prefill_gemm_flops=cpu_flops, prefill_attn_flops=cpu_flops,
                    prefill_expert_flops=cpu_flops, gpu_moe_rowwise=0,
                    cpu_flops=cpu_flops, interconnect_bw=host_bw, unified=0, overlap=0, launch_s=0.0, sync_s=0.0,
                    dma_s=0.0, allreduce_s=0.0, step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6,
                    amx_flops=amx, pcie_links=1, a2a_bw=host_bw, a2a_s=0.0, moe_s=0.0,
                    cpu_layer_s=d.cpu_layer_us * 1e-6, op_s=0.0, cpu_op_s=d.cpu_node_us * 1e-6,
                    **graph_limit(d, False), **cpu_attention_flops(machine, d, cpu_flops), **DECODE_PATHS_OFF)
    g = _load_catalog("hardware")["gpu"].get(machine.gpu, {})
    tp = machine.n_gpus if (d.tensor_parallel and machine.n_gpus > 1) else 1
    tf = machine.gpu_tflops
    peak_tflops = max(tf.get("bf16", 0.0), tf.get("fp16", 0.0), tf.get("fp32", 0.0), 1.0)
    pinned = machine.pcie_pinned_gbs or machine.pcie_gbs * 0.88 or 12.0
    pcie = pinned * GB * (1.0 if d.pinned_experts else d.pcie_pageable)
    terms = backend_terms(rt, g)
    d, graphs = with_backend_launch(d, replays_graphs(d, g), terms)
    scale_up = g.get("scale_up", {}).get("gbs", 0.0) if isinstance(g.get("scale_up"), dict) else 0.0
    hbm = str(g.get("memory_type", "")).startswith("hbm")
    # a backend whose decode kernels measurably reach less of a family's bandwidth (runtimes.toml bw_eff)
    bw_eff = terms.get("bw_eff") or (d.gpu_bw_eff if hbm else d.gddr_bw_eff)
    pf, gemm, attn = _gpu_prefill_flops(machine, rt, g, mix, hbm, peak_tflops, tp, terms)
    share, fp32 = terms.get("moe_fp32_share", 0.0), fp32_tflops(tf, g)
    # a backend whose MUL_MAT_ID measurably runs the routed experts slower than its dense GEMMs (moe_fp32_share)
    expert = min(gemm, fp32 * 1e12 * share * tp) if share > 0 and fp32 > 0 else gemm
    gemm *= terms.get("dense_gemm_rel", 1.0)        # an earlier build's dense GEMM tiles (experts keep theirs)
    clock = kernel_clock_scale(d, g)
    return dict(gpu_bw=machine.gpu_bw_gbs * GB * bw_eff * tp, host_bw=host_bw, pcie_bw=pcie,
                prefill_flops=pf, prefill_gemm_flops=gemm, prefill_attn_flops=attn, prefill_expert_flops=expert,
                prefill_moe_half_tokens=terms.get("moe_half_tokens", 0.0),
                prefill_weight_pass_tokens=terms.get("weight_pass_tokens", 0.0),
                prefill_moe_tile_tokens=moe_tile_tokens(terms),
                gpu_moe_rowwise=int(d.moe_rowwise_prefill),
                storage_bw=storage_bw, gpu_flops=peak_tflops * 1e12 * d.gpu_flops_eff * tp, cpu_flops=cpu_flops,
                interconnect_bw=(scale_up or machine.pcie_gbs or 16.0) * GB, unified=0,
                overlap=1 if d.overlap else 0,
                launch_s=layer_launch_us(d, graphs, clock) * 1e-6, sync_s=d.sync_us * 1e-6,
                dma_s=d.dma_us * 1e-6, allreduce_s=_allreduce_s(machine, rt) if tp > 1 else 0.0,
                step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6 / max(1, d.data_parallel),
                amx_flops=amx, pcie_links=tp, a2a_bw=_alltoall_gbs(machine, g) * GB * d.alltoall_bw_eff,
                a2a_s=2.0 * d.alltoall_us * 1e-6, moe_s=d.moe_layer_us * clock * 1e-6,
                cpu_layer_s=d.cpu_layer_us * 1e-6, op_s=node_op_us(d, graphs, clock) * 1e-6,
                cpu_op_s=d.cpu_node_us * 1e-6, **graph_limit(d, graphs), **cpu_attention_flops(machine, d, cpu_flops),
                **decode_paths(terms.get("decode_paths", {}), mix, int(g.get("gpu_cores", 0) or 0)))


def _allreduce_s(machine: Machine, rt: Runtime) -> float:
    """Latency of a layer's all-reduces: allreduce_us is two of them (attention and FFN under plain TP);
    expert parallelism replaces the FFN's by the combine, attention DP the attention's."""
    n, attn_tp, ep, _ = layout_degrees(rt, machine.n_gpus)
    return rt.decode.allreduce_us * 1e-6 * allreduce_count(n, attn_tp, ep) / 2.0


def _alltoall_gbs(machine: Machine, g: dict) -> float:
    """One GPU's all-to-all bandwidth, GB/s per direction: the catalog's scale-up fabric (NVLink through
    NVSwitch, the NVL72 rack's NVLink5, an XGMI mesh's all-to-all figure), else the PCIe link."""
    up = g.get("scale_up") if isinstance(g.get("scale_up"), dict) else {}
    return float(up.get("all_to_all_gbs", up.get("gbs", 0.0)) or machine.pcie_gbs or 16.0)


def _lower_unified(machine: Machine, rt: Runtime, mix: Q.KernelMix, cpu_only: bool) -> dict:
    """A unified-memory chip: one pool is GPU memory, host memory and the "PCIe" link alike."""
    d = rt.decode
    # Apple chips run Metal (RT §1.9, §6); NVIDIA's GB10 (DGX Spark) runs CUDA with graphs
    u = _load_catalog("hardware")["unified"].get(machine.gpu, {})
    metal = u.get("vendor") == "apple"
    eff = d.metal_bw_eff if metal else d.gddr_bw_eff      # GB10: LPDDR5X through CUDA
    # a chip whose GPU measures well under its spec (Strix Halo: rocm_bandwidth_test 212 of 256 GB/s)
    # streams at the kernels' share of that measured figure (catalog gpu_measured_bw_gbs); it is a GPU
    # measurement, so the CPU cores keep the spec pool
    measured = 0.0 if cpu_only else float(u.get("gpu_measured_bw_gbs", 0.0))
    bw = min(machine.gpu_bw_gbs, measured or machine.gpu_bw_gbs)
    pool = bw * GB * eff
    host = min(machine.gpu_bw_gbs * GB * eff, _cpu_cluster_bw(machine, d))
    peak = machine.gpu_tflops.get("fp16", 0.0) * 1e12
    gpu_flops = peak * d.gpu_flops_eff
    cpu_flops = _cpu_flops(machine, d, mix)
    # chips without CUDA graphs (AMD iGPUs: HIP graphs off) pay the no-graph launch per layer, or their backend's
    d, graphs = with_backend_launch(d, replays_graphs(d, u), {} if metal else backend_terms(rt, u))
    # Apple chips: launch_us_metal is fitted per MoE layer on Metal / MLX as it stands (no clock scaling)
    clock = 1.0 if metal else kernel_clock_scale(d, u)
    launch = d.launch_us_metal if metal else layer_launch_us(d, graphs, clock)
    pf_eff = d.prefill_flops_eff_unified * (d.metal_prefill_rel if metal else 1.0)
    # ggml-metal's flash attention and routed-expert tiles ([backends.metal]); MLX's are the runtime's own
    terms = _metal_terms() if metal and rt.llama_cpp_family else {}
    # ggml-metal (llama.cpp on an Apple GPU): every layer's kernels as ggml-cuda counts them at kernel_us, and each
    # MoE layer's routing, weighting and per-pair dispatch on top at launch_us_metal (MLX keeps it on every layer)
    ggml_metal = bool(terms.get("decode_paths"))
    layer_s, moe_s = (graph_launch_us(d), launch) if ggml_metal else (launch, 0.0 if metal else d.moe_layer_us * clock)
    if metal and not cpu_only and not u.get("gpu_bf16", True):
        # the runtime's bf16 forward on a GPU that emulates bf16 (M1 / M2): its prompt GEMMs pay the emulation
        pf_eff = pf_eff * d.bf16_emulated_rel
    # routed-expert prompt GEMMs that lose rate at few rows per expert: the runtime's tile on Apple GPUs (MLX), the
    # llama.cpp backend's otherwise
    # (a 2023 build's token-by-token MUL_MAT_ID has no expert tiles)
    moe_half = terms.get("moe_half_tokens", d.moe_half_tokens) if metal and not d.moe_rowwise_prefill else 0.0
    if metal and d.metal_tensor_api and not cpu_only and machine.gpu_tflops.get("matrix", 0.0) > 0:
        # the M5 GPU's Neural Accelerators multiply the prompt's GEMMs (decode's GEMVs stay on the ALUs)
        peak, moe_half = machine.gpu_tflops["matrix"] * 1e12, d.moe_half_tokens_matrix
    if not metal:
        pf_eff, peak, terms = _unified_gemm(machine, rt, u, mix, peak)
        # a measured GEMM rate (Strix Halo: 36.9 of 59.4 TFLOPS) replaces the peak it falls short of
        if not cpu_only:
            peak = min(peak, float(u.get("gpu_measured_gemm_tflops", 0.0)) * 1e12 or peak)
    # CPU-only: the prompt's GEMMs run on the CPU cores too (a CPU build, or -ngl 0 without a GPU backend)
    pf = cpu_flops if cpu_only else max(peak * pf_eff, cpu_flops)
    if ggml_metal and not cpu_only:
        # ggml-metal's decode steps past the mat-vec kernels run the prompt's simdgroup mat-mat kernels (kernel_mul_mm,
        # mul_mm_id: [backends.metal] decode_paths), so their FLOPs go at the prompt's GEMM rate, not at gpu_flops_eff
        # (the decode GEMMs of CUDA and the served runtimes)
        gpu_flops = pf
    return dict(gpu_bw=pool, host_bw=host, pcie_bw=pool, storage_bw=max(machine.storage_read_gbs, 1e-3) * GB,
                gpu_flops=max(gpu_flops, cpu_flops), cpu_flops=cpu_flops, interconnect_bw=pool, unified=1,
                prefill_flops=pf, prefill_expert_flops=pf,
                prefill_gemm_flops=pf if cpu_only else pf * terms.get("dense_gemm_rel", 1.0),
                prefill_attn_flops=pf if cpu_only else flash_attention_flops(pf, machine.gpu_tflops, u, terms),
                prefill_moe_half_tokens=0.0 if cpu_only else (moe_half if metal else terms.get("moe_half_tokens", 0.0)),
                prefill_weight_pass_tokens=0.0 if cpu_only else terms.get("weight_pass_tokens", 0.0),
                prefill_moe_tile_tokens=0.0 if cpu_only else moe_tile_tokens(terms),
                gpu_moe_rowwise=0 if cpu_only else int(d.moe_rowwise_prefill),
                overlap=1 if d.overlap else 0, launch_s=0.0 if cpu_only else layer_s * 1e-6,
                sync_s=0.0, dma_s=0.0, allreduce_s=0.0, step_s=d.step_us * 1e-6, seq_s=d.seq_us * 1e-6,
                amx_flops=0.0, pcie_links=1, a2a_bw=pool, a2a_s=0.0,
                moe_s=0.0 if cpu_only else moe_s * 1e-6, cpu_layer_s=d.cpu_layer_us * 1e-6,
                op_s=0.0 if cpu_only else node_op_us(d, metal or graphs, clock) * 1e-6, cpu_op_s=d.cpu_node_us * 1e-6,
                **graph_limit(d, graphs and not (cpu_only or metal)), **cpu_attention_flops(machine, d, cpu_flops),
                **decode_paths({} if cpu_only else terms.get("decode_paths", {}), mix, int(u.get("gpu_cores", 0) or 0),
                               gemv_weight_s(machine, d) if metal else 0.0))


def moe_tile_tokens(terms: dict) -> float:
    """The widest tile a backend's routed-expert prompt GEMMs pad each used expert's tokens to (its MMQ_X_MAX,
    weight_pass_tokens) where it sizes the tile for the whole ubatch (runtimes.toml moe_padded_tiles), else 0."""
    return terms.get("weight_pass_tokens", 0.0) if terms.get("moe_padded_tiles") else 0.0


def gemv_weight_s(machine: Machine, d) -> float:
    """Seconds ggml-metal's mat-vec kernels take per weight they decode: two FLOPs a weight at ``metal_gemv_eff`` of
    the Apple GPU's fp16 rate (runtimes.toml: its decode GEMVs run at a share of the ALUs, not of the bandwidth)."""
    rate = machine.gpu_tflops.get("fp16", 0.0) * 1e12 * d.metal_gemv_eff
    return 2.0 / rate if rate > 0.0 else 0.0


def _metal_terms() -> dict:
    """llama.cpp's Metal backend terms the unified path reads: its prompt flash attention's share of the fp16 rate,
    the tokens per used expert at which its routed-expert prompt GEMMs run at half the dense rate, and its decode
    kernels' token-count paths (decode_paths)."""
    b = _load_catalog("runtimes").get("backends", {}).get("metal", {})
    return {"fa_fp16_share": float(b.get("fa_fp16_share", {}).get("apple", 0.0)),
            "moe_half_tokens": float(b.get("moe_half_tokens", {}).get("apple", 0.0)),
            "decode_paths": dict(b.get("decode_paths", {}))}


DECODE_PATHS_OFF = dict(mm_min_tokens=0, mm_tile_tokens=1, mv_ext_cols=1, mv_ext_min_tokens=0, mv_ext_k_min_tokens=0,
                        mv_ext_share=0.0, mv_ext_k_share=0.0, moe_rowwise_below=0, mm_tile_rows=1, mm_slots=0.0,
                        gemv_weight_s=0.0, gemv_token_rel=0.0)


def decode_paths(paths: dict, mix: Q.KernelMix, gpu_cores: int = 0, gemv_weight_s: float = 0.0) -> dict:
    """ms_machine_t's token-count kernel paths: a backend's ``decode_paths`` table (runtimes.toml [backends.*];
    empty: off, every step reads its weights once) with the configuration's weight-type shares (``mix``), for
    the mat-mat kernel's occupancy the GPU's cores (0: unknown, no occupancy term) and the mat-vec kernels' decode
    time per weight (:func:`gemv_time`; 0: off)."""
    if not paths:
        return dict(DECODE_PATHS_OFF)
    out = {k: int(paths[k]) for k in ("mm_min_tokens", "mm_tile_tokens", "mv_ext_cols", "mv_ext_min_tokens",
                                      "mv_ext_k_min_tokens", "moe_rowwise_below", "mm_tile_rows")}
    return dict(out, mv_ext_share=float(mix.mv_ext), mv_ext_k_share=float(mix.mv_ext_k),
                mm_slots=float(gpu_cores) * float(paths["mm_tgs_per_core"]), gemv_weight_s=float(gemv_weight_s),
                gemv_token_rel=float(paths.get("gemv_token_rel", 0.0)) if gemv_weight_s > 0.0 else 0.0)


def weight_passes(hw: dict, tokens: float) -> float:
    """How many times a decode step of ``tokens`` tokens reads the dense weights on the GPU under ``hw``'s token-count
    kernel paths (ms_weight_passes, the same arithmetic): once where they are off or for one token; once per
    mm_tile_tokens tile from mm_min_tokens (ggml-metal's mat-mat); below it once per mv_ext_cols tokens for the
    weights the small-batch mat-vec takes from their types' fewest tokens, else once per token (mul_mv)."""
    if hw["mm_min_tokens"] <= 0 or tokens <= 1.0:
        return 1.0
    if tokens >= hw["mm_min_tokens"]:
        return float(math.ceil(tokens / hw["mm_tile_tokens"]))
    ext = float(math.ceil(tokens / hw["mv_ext_cols"]))
    s_ext = ext if tokens >= hw["mv_ext_min_tokens"] else tokens
    k_ext = ext if tokens >= hw["mv_ext_k_min_tokens"] else tokens
    s, k = hw["mv_ext_share"], hw["mv_ext_k_share"]
    return s * s_ext + k * k_ext + max(0.0, 1.0 - s - k) * tokens


def gemm_tokens(hw: dict, tokens: float, rows: float) -> float:
    """The tokens a GPU decode step's dense GEMMs count FLOPs for (ms_gemm_tokens, the same arithmetic): the step's
    own below mm_min_tokens or where the paths are off; from it the mat-mat kernel's whole tiles, each of ``rows`` /
    mm_tile_rows threadgroups, a tile whose threadgroups fill fewer than the mm_slots the GPU holds at once taking
    as long as mm_slots of them (the decode model's gemm_rows: 0, unknown, counts no idle threadgroups)."""
    if hw["mm_min_tokens"] <= 0 or tokens < hw["mm_min_tokens"]:
        return tokens
    tiles = float(math.ceil(tokens / hw["mm_tile_tokens"]))
    idle = 1.0
    if hw["mm_slots"] > 0.0 and rows > 0.0:
        idle = max(1.0, hw["mm_slots"] * float(hw["mm_tile_rows"]) / (tiles * rows))
    return tiles * float(hw["mm_tile_tokens"]) * idle


def gemv_time(hw: dict, tokens: float, passes: float, weights: float) -> tuple:
    """A GPU step's mat-vec kernels over ``weights`` weights in ``passes`` passes (ms_gemv_time, the same
    arithmetic): (the passes' decode at ``gemv_weight_s`` a weight and pass, which overlaps the weights' stream; the
    dot products of each token a pass serves past its first, ``gemv_token_rel`` of that, which the stream does not
    hide), below the mat-mat path's mm_min_tokens; (0, 0) where it is off."""
    if not hw["gemv_weight_s"] > 0.0 or (hw["mm_min_tokens"] > 0 and tokens >= hw["mm_min_tokens"]):
        return 0.0, 0.0
    per_pass = weights * hw["gemv_weight_s"]
    return per_pass * passes, per_pass * hw["gemv_token_rel"] * max(0.0, tokens - passes)


def _unified_gemm(machine: Machine, rt: Runtime, u: dict, mix: Q.KernelMix, peak: float) -> tuple:
    """(prefill share, FLOP/s it is a share of, the backend's terms) of a unified chip other than Apple's: its GPU
    prefills like a discrete card of its vendor under the runtime's backend (:func:`backend_terms`), at the GDDR
    cards' share.
    GB10 (CUDA) and Strix Halo under HIP run llama.cpp's int8 MMQ (GB10's int8 rate equals its fp8 rate, as the
    RTX 5090's: int8 = fp8 = 838.4 TFLOPS in the catalog) with its per-type rates; under Vulkan the weights
    are dequantized to fp16 tiles for the matrix cores (runtimes.toml [backends.vulkan]), which the MMQ rates
    do not describe."""
    d = rt.decode
    if not rt.llama_cpp_family:
        return d.prefill_flops_eff * _mmq_rel(mix, d), peak, {}
    tf = machine.gpu_tflops
    terms = backend_terms(rt, u)
    if terms["peak"] == "int8" or not u.get("tensor_cores", False):
        rate = tf.get("int8", tf.get("fp8", 0.0)) * 1e12 or peak
        return d.prefill_flops_eff * _mmq_rel(mix, d, terms["name"]), rate, terms
    return d.prefill_flops_eff, _gemm_peak(tf, u, terms, peak / 1e12) * 1e12, terms


def _cpu_cluster_bw(machine: Machine, d) -> float:
    """What the CPU cores of a unified chip stream from the shared pool: the chip's CPU-cluster ceiling
    (catalog cpu_bw_gbs; the M1 Max's CPU cores reach about 243 of its 409.6 GB/s) at the share of a
    STREAM-class figure llama.cpp's CPU path reaches on desktops (RT §8.4 item 1). Chips without the field
    give the CPU the whole pool."""
    ceiling = float(_load_catalog("hardware")["unified"].get(machine.gpu, {}).get("cpu_bw_gbs", 0.0))
    return ceiling * GB * d.host_bw_eff_desktop if ceiling > 0 else float("inf")


def _host_bw(machine: Machine, d) -> float:
    """Effective host DRAM bandwidth: the server or desktop share of peak, less across sockets, and
    capped by what the cores in use can stream."""
    server = machine.channels > 4
    host_eff = d.host_bw_eff_server if server else d.host_bw_eff_desktop
    if machine.sockets > 1:
        host_eff *= d.cross_socket_eff
    host_bw = machine.host_bw_gbs * GB * host_eff
    if machine.cores:
        # a few threads cannot saturate many channels: each core streams at most core_bw_gbs(_server)
        host_bw = min(host_bw, machine.cores * (d.core_bw_gbs_server if server else d.core_bw_gbs) * GB)
    return host_bw


def _served_gemm_rel(tf: dict, mix: Q.KernelMix, peak_tflops: float) -> float:
    """Served runtimes' GEMM rate over the 16-bit peak by weight path: fp8 checkpoints on fp8 tensor cores;
    on GPUs with fp4 tensor cores (Blackwell) W4A4 NVFP4 at the fp4 rate and W4A8 MXFP4 at the fp8 rate;
    without them fp4 weights run W4A16 mixed GEMMs at the 16-bit rate (quants.toml fp4_gemm)."""
    fp8_rel = max(1.0, tf.get("fp8", 0.0) / peak_tflops)
    fp4_rel = tf.get("fp4", 0.0) / peak_tflops
    a8_rel = fp8_rel if fp4_rel > 1.0 else 1.0
    a4_rel = max(1.0, fp4_rel)
    rest = max(0.0, 1.0 - mix.fp8 - mix.fp4_a4 - mix.fp4_a8)
    return 1.0 / (mix.fp8 / fp8_rel + mix.fp4_a8 / a8_rel + mix.fp4_a4 / a4_rel + rest)


def _gpu_prefill_flops(machine: Machine, rt: Runtime, g: dict, mix: Q.KernelMix, hbm: bool,
                       peak_tflops: float, tp: int, terms: "dict | None" = None) -> tuple:
    """(prefill, prefill GEMM, prefill attention) FLOP/s of the discrete GPUs; llama.cpp's GEMMs run at the
    rate its backend uses on the card (:func:`backend_terms`: int8 MMQ under CUDA / HIP, fp16 on the matrix
    units under SYCL and Vulkan's cooperative matrices, the shader ALUs where Vulkan uses none)."""
    d = rt.decode
    tf = machine.gpu_tflops
    # the HBM prefill efficiency describes tensor-core datacenter parts (A100 / H100); Pascal's HBM2 P100
    # multiplies on dp4a like the GDDR cards
    tensor_cores = g.get("tensor_cores", False)
    pf_eff = d.prefill_flops_eff_hbm if (hbm and tensor_cores) else d.prefill_flops_eff
    if rt.llama_cpp_family and (terms or {}).get("int8_share", 0.0) > 0.0:
        pf_eff = terms["int8_share"]            # the backend's measured share of the card's int8 (dp4a) rate
    attn_eff = pf_eff
    if tensor_cores and (terms or {}).get("peak", "int8") == "int8":
        # the K-quant / MXFP4 MMQ rates describe the int8 MMQ kernels, not fp16 dequantize-and-multiply paths
        pf_eff *= _mmq_rel(mix, d, (terms or {}).get("name", "cuda"))
    # llama.cpp multiplies quantized weights with int8 tensor-core MMQ kernels (ggml-cuda mmq): its
    # prefill scales with the int8 rate; served runtimes run bf16/fp8 GEMMs
    pf_peak = _gemm_peak(tf, g, terms or {}, peak_tflops) if rt.llama_cpp_family else peak_tflops
    pf = pf_peak * 1e12 * pf_eff * tp
    gemm, attn = pf, pf_peak * 1e12 * attn_eff * tp
    if tensor_cores and not rt.llama_cpp_family:
        # served runtimes multiply fp8 checkpoints on fp8 tensor cores (block-scaled fp8 GEMMs: DeepGEMM,
        # CUTLASS, Triton), and their flash-attention kernels run the scores at their own share of the
        # 16-bit peak; llama.cpp's prefill share covers its whole ubatch
        gemm = pf * _served_gemm_rel(tf, mix, peak_tflops)
        attn = peak_tflops * 1e12 * d.attn_flops_eff * tp
    return pf, gemm, flash_attention_flops(attn, tf, g, terms or {}, tp)


def flash_attention_flops(attn: float, tf: dict, g: dict, terms: dict, n: int = 1) -> float:
    """A llama.cpp backend's prompt attention rate: the rate ``attn`` of its weights' GEMMs without their
    weight-type factors, or the share of a peak its flash-attention kernels measurably reach where that is
    lower (backend_terms ``fa_fp32_share``: AMD's tile kernels on the shader ALUs; ``fa_fp16_share``: CUDA's
    MMA kernels on the fp16 tensor cores), on ``n`` GPUs."""
    share, fp32 = terms.get("fa_fp32_share", 0.0), fp32_tflops(tf, g)
    if share > 0 and fp32 > 0:
        attn = min(attn, share * fp32 * 1e12 * n)
    share16, fp16 = terms.get("fa_fp16_share", 0.0), float(tf.get("fp16", 0.0))
    if share16 > 0 and fp16 > 0:
        attn = min(attn, share16 * fp16 * 1e12 * n)
    return attn
