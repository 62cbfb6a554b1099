"""Runtime profiles (llama.cpp, vLLM, SGLang, TensorRT-LLM, ktransformers, MLX): memory budgeting rules."""
from __future__ import annotations

from dataclasses import dataclass

from .. import _catalog
from ..errors import MoesimError, unknown_id


MIB = 2**20


@dataclass(frozen=True)
class Runtime:
    id: str
    gpu_fixed_mib: float
    gpu_margin_mib: float
    gpu_mem_fraction: float
    ubatch: int
    logits_on_gpu: bool
    attention_buffer: str
    kv_granularity: int
    embeddings_on_gpu: bool
    storage_spill: bool
    host_fixed_mib: float
    default_placement: str
    cudagraph_mib: float = 0.0
    activation_tokens: int = 0
    prefill_step: int = 0
    source: str = ""
    decode: "DecodeParams" = None
    launch: str = ""              # the model launch settings applied ([runtimes.<id>.models.<model>]), said in words
    backend: str = ""             # llama.cpp GPU backend ([backends.<name>] in runtimes.toml); "" = the vendor's own

    @property
    def llama_cpp_family(self) -> bool:
        return self.family == "llama.cpp"

    @property
    def family(self) -> str:
        """The runtime family whose behaviour (and fitted parameters) this profile shares."""
        return FAMILIES.get(self.id, self.id)


@dataclass(frozen=True)
class DecodeParams:
    """Decode-speed parameters of a runtime ([decode] in runtimes.toml)."""

    gpu_bw_eff: float
    gddr_bw_eff: float
    gpu_flops_eff: float
    prefill_flops_eff: float
    prefill_flops_eff_hbm: float
    prefill_flops_eff_unified: float
    attn_flops_eff: float
    gpu_kquant_mmq_rel: float
    gpu_mxfp4_mmq_rel: float
    metal_bw_eff: float
    metal_gemv_eff: float
    host_bw_eff_desktop: float
    host_bw_eff_server: float
    cross_socket_eff: float
    core_bw_gbs: float
    core_bw_gbs_server: float
    cpu_flops_eff: float
    cpu_kernel_speedup: float
    cpu_fa_query_rows: float
    cpu_iquant_rel: float
    cpu_lut_rel: float
    metal_tensor_api: bool
    cpu_fp8_rel: float
    pcie_pageable: float
    launch_us: float
    launch_us_nograph: float
    launch_us_metal: float
    sync_us: float
    dma_us: float
    allreduce_us: float
    step_us: float
    seq_us: float
    overlap: bool
    tensor_parallel: bool
    op_offload_min_batch: int
    op_offload_sparse: bool
    layerwise_prefill_tokens: int
    layerwise_chunk_tokens: int
    pinned_experts: bool
    amx_prefill: bool
    amx_flops_eff: float
    alltoall_us: float = 0.0
    alltoall_bw_eff: float = 1.0
    alltoall_dispatch_bytes: float = 2.0
    alltoall_combine_bytes: float = 2.0
    alltoall_scale_bytes: float = 0.0
    kernel_us: float = 3.0        # constant latency of one graph-replayed kernel (AIC's 3 us per memory op)
    kernel_ref_mhz: float = 0.0   # GPU clock kernel_us and moe_layer_us hold at; a GPU with a catalog boost_mhz
                                  # pays them x kernel_ref_mhz / boost_mhz (0: no scaling)
    layer_kernels: float = 0.0    # graph-replayed kernels per decoder layer; > 0: the per-layer latency under
                                  # CUDA graphs is layer_kernels x kernel_us (llama.cpp, served runtimes), else launch_us
    data_parallel: int = 1        # attention data-parallel ranks (tpN-epN-attn-dp): one scheduler per rank
    expert_parallel: int = 1      # expert-parallel ranks (epN, tpN-epM): routed experts sharded, all-to-all per MoE layer
    redundant_experts: int = 0    # EPLB replicas of the hottest experts per MoE layer (--redundant-experts)
    moe_rowwise_prefill: bool = False  # GPU MUL_MAT_ID of a batch token by token (llama.cpp before Jan 2024)
    prompt_activations: bool = False   # a prompt's graph ops stream their f32 activations through device memory
                                       # one kernel each (ggml: engine.lower.activations); False: fused kernels
    cpu_layer_us: float = 0.0     # per layer computed on the CPU: the graph's per-node thread barriers (llama.cpp's
                                  # ggml-cpu); 0 for runtimes whose CPU cost is in their other terms
    moe_layer_us: float = 0.0     # per MoE layer on a GPU: the routing, weighting and combining kernels beside
                                  # the expert GEMMs (latency whatever they read); 0 where the runtime's layer
                                  # cost already holds them
    cpu_node_us: float = 0.0      # one graph node's thread barrier on the CPU (layer_ops' CPU cost)
    graph_max_batch: int = 0      # decode steps of more tokens run without CUDA graphs (launch_us_nograph); 0: none
    graphs_min_cc: float = 0.0    # CUDA GPUs of a lower compute capability run decode without graphs (a dated
                                  # build's gate, row_notes.graphs_min_cc); 0: the catalog's cuda_graphs alone
    delta_net_ops: float = 0.0    # graph nodes a Gated DeltaNet / KDA layer runs per decode step beyond an attention
                                  # layer's (0: a fused recurrence op; delta_net_unfused_ops before it)
    delta_net_unfused_ops: float = 0.0  # the same for builds that decompose the recurrence into small ops
    cpu_attn_eff: float = 0.0     # a decode step's attention scores on the CPU at this share of the cores' fp32 vector
                                  # peak (the runtime's attention kernel); 0: at its matmul rate (cpu_flops)
    cpu_prefill_attn_eff: float = 0.0   # the same for a prompt ubatch's attention
    cpu_attn_eff_nofa: float = 0.0      # cpu_attn_eff with flash attention off (ggml: mul_mat, soft_max, mul_mat)
    cpu_prefill_attn_eff_nofa: float = 0.0  # cpu_prefill_attn_eff with flash attention off
    swa_full: bool = False        # sliding-window layers keep their whole cache and a GPU's attention walks all of it
                                  # (llama.cpp --swa-full; the CPU kernel skips the masked keys); the cache's size is
                                  # not changed
    metal_prefill_rel: float = 1.0    # Apple GPUs: the build's prompt GEMM rate against prefill_flops_eff_unified's
                                      # (ggml-metal builds before mid-2024: llama.cpp-2024h1)
    bf16_emulated_rel: float = 1.0    # prompt GEMM rate on a GPU without bf16 arithmetic (hardware.toml gpu_bf16 = false)
                                      # when the runtime computes in bf16 (MLX: a checkpoint's bf16 scales and norms)
    moe_half_tokens: float = 0.0      # Apple GPUs: rows per used expert at which the runtime's routed-expert prompt GEMMs
                                      # run at half the dense rate (a row tile straddling expert runs repeats its K loop);
                                      # 0: at the dense rate (llama.cpp's backends set theirs in [backends.*])
    moe_half_tokens_matrix: float = 0.0   # the same where the prompt runs on the Neural Accelerators (metal_tensor_api)
    mla_prefill_absorbed: bool = False    # MLA prompts attend in the absorbed form (MQA over the latent cache, no
                                          # decompression: llama.cpp's deepseek2 graph); False: the multi-head form on
                                          # keys decompressed per ubatch (engine.lower.attention.prefill_score_fn)


def runtime_ids() -> list:
    return sorted(_catalog.load("runtimes")["runtimes"])


def _entry(rid: str, table: dict, seen=()) -> dict:
    e = dict(table[rid])
    base = e.pop("base", None)
    if base:
        if base in seen:
            raise MoesimError(f"runtime profile {rid!r} has a base cycle", "runtime")
        merged = _entry(base, table, seen + (rid,))
        decode = {**merged.get("decode", {}), **e.pop("decode", {})}
        merged.update(e)
        if decode:
            merged["decode"] = decode
        return merged
    return e


def decode_priors(key: str, entry: dict | None = None) -> dict:
    """A runtime's decode parameters before calibration: [decode] defaults + the runtime's own."""
    table = _catalog.load("runtimes")["runtimes"]
    dec = dict(_catalog.load("runtimes")["decode"])
    dec.update((entry if entry is not None else _entry(key, table)).get("decode", {}))
    return dec


def calibration() -> dict:
    """Fitted decode parameters (catalog/calibration.toml, written by ``moesim calibrate``); {} if none."""
    try:
        return _catalog.load("calibration")
    except (FileNotFoundError, OSError):
        return {}


FAMILIES = {"llama.cpp": "llama.cpp", "ik_llama.cpp": "llama.cpp", "ollama": "llama.cpp", "vllm": "served",
            "sglang": "served", "trtllm": "served", "ktransformers": "ktransformers",
            "ktransformers-legacy": "ktransformers", "llama.cpp-2024h1": "llama.cpp", "llama.cpp-2023": "llama.cpp",
            "llama.cpp-vulkan": "llama.cpp", "llama.cpp-2024h1-vulkan": "llama.cpp", "llama.cpp-2025-vulkan": "llama.cpp",
            "llama.cpp-sycl": "llama.cpp",
            "llama.cpp-hip": "llama.cpp", "mlx": "mlx",
            "offload": "offload"}


def _family(key: str) -> str:
    """Runtimes that share fitted per-runtime parameters (calibration.toml [runtime.<family>])."""
    return FAMILIES.get(key, key)


def runtime(id_or_rt: "str | Runtime", calibrated: bool = True, model: str | None = None) -> Runtime:
    """The profile ``id_or_rt`` (a Runtime is returned as is), with the fitted parameters unless
    ``calibrated`` is False, and the launch settings the runtime documents for catalog ``model``
    ([runtimes.<id>.models.<model>], e.g. what `kt run` passes for that model)."""
    if isinstance(id_or_rt, Runtime):
        return id_or_rt
    catalog = _catalog.load("runtimes")
    table = catalog["runtimes"]
    key = str(id_or_rt).strip().lower()
    key = catalog.get("runtime_aliases", {}).get(key, key)
    if key not in table:
        raise unknown_id("runtime", id_or_rt, table, "runtime")
    e = _entry(key, table)
    dec = decode_priors(key, e)
    if calibrated:
        cal = calibration()
        fields_ = set(DecodeParams.__dataclass_fields__)
        dec.update({k: v for k, v in cal.get("params", {}).items() if k in fields_})
        dec.update({k: v for k, v in cal.get("runtime", {}).get(_family(key), {}).items() if k in fields_})
    launch = dict(e.pop("models", {}).get(model or "", {}))
    source = launch.pop("source", "runtimes.toml")
    unknown = set(launch) - set(DecodeParams.__dataclass_fields__)
    if unknown:
        raise MoesimError(f"runtime profile {key!r} model {model!r}: unknown launch settings {sorted(unknown)}",
                          "runtime")
    dec.update(launch)
    said = (f"{key} launch for {model}: {', '.join(f'{k} {v}' for k, v in launch.items())} ({source})"
            if launch else "")
    e.pop("decode", None)
    fields = set(Runtime.__dataclass_fields__)
    return Runtime(id=key, decode=DecodeParams(**dec), launch=said,
                   **{k: v for k, v in e.items() if k in fields and k not in ("id", "decode", "launch")})


def catalog_ubatch(rid: str) -> int:
    """The prompt ubatch runtime profile ``rid`` (a catalog id, as Runtime.id holds it) sets in the catalog: what
    :func:`runtime` would put in ``ubatch`` before any override, without building the profile (its decode
    parameters and calibration), which launch advice asks for on every row of a site export."""
    table = _catalog.load("runtimes")["runtimes"]
    if rid not in table:
        raise unknown_id("runtime", rid, table, "runtime")
    return _entry(rid, table)["ubatch"]


def default_runtime(quant, machine) -> Runtime:
    """llama.cpp for GGUF files, MLX for mlx formats, vLLM for other checkpoint formats."""
    if quant.is_gguf:
        return runtime("llama.cpp")
    if quant.id.startswith("mlx"):
        return runtime("mlx")
    return runtime("vllm")


# GPU back ends per runtime, for runtimes that do not run on every vendor's GPU: runtime id -> {vendor: the
# lowest CUDA compute capability, or None for any}. MLX runs on Metal (Apple silicon), on CUDA for "Nvidia
# architecture >= SM 7.5" and on CPUs (https://ml-explore.github.io/mlx/build/html/install.html): not on AMD,
# Intel or Qualcomm GPUs. TensorRT-LLM is NVIDIA's CUDA library (RT §4).
GPU_BACKENDS = {"mlx": {"apple": None, "nvidia": "7.5"}, "trtllm": {"nvidia": None}}
CPU_BACKEND = {"mlx"}            # runtimes that also run on the CPU alone (mlx[cpu], same page)


def _capability(text) -> tuple:
    return tuple(int(x) for x in str(text).split(".")[:2])


def check_runtime_applies(rt: Runtime, machine, placement_kind: str = "") -> None:
    """Raise a MoesimError (field "runtime") when runtime ``rt`` has no back end for the machine's GPU or
    unified chip: MLX on a Strix Halo, a Snapdragon or a Radeon, TensorRT-LLM off NVIDIA, MLX below SM 7.5.
    A cpu-only placement of a runtime with a CPU back end needs no GPU back end."""
    allowed = GPU_BACKENDS.get(rt.id)
    if allowed is None or not machine.gpu or not machine.n_gpus:
        return
    if placement_kind == "cpu-only" and rt.id in CPU_BACKEND:
        return
    hw = _catalog.load("hardware")
    chip = hw["unified"].get(machine.gpu) or hw["gpu"].get(machine.gpu) or {}
    vendor = chip.get("vendor", "unknown")
    if vendor not in allowed:
        names = ", ".join(f"{v} (compute capability >= {cc})" if cc else v for v, cc in allowed.items())
        cpu = " or on the CPU alone (--placement cpu-only)" if rt.id in CPU_BACKEND else ""
        raise MoesimError(f"{rt.id} has no back end for {machine.gpu} (vendor {vendor}): it runs on {names} "
                          f"GPUs{cpu}; choose another --runtime (llama.cpp runs on every vendor's GPU)", "runtime")
    minimum = allowed[vendor]
    have = chip.get("compute_capability") or machine.compute_capability
    if minimum and have and _capability(have) < _capability(minimum):
        raise MoesimError(f"{rt.id} needs compute capability >= {minimum} on {vendor} GPUs; {machine.gpu} "
                          f"has {have}", "runtime")
