"""Memory accounting API: lower (model, quant) once, then evaluate configurations in the C kernel.

``lower(model, quant, kv_dtype)`` turns a model's tensor inventory into per-layer byte arrays (the C struct
``ms_model_t``); ``configure(...)`` turns machine + runtime + placement + workload into the scalar
fields of ``ms_mem_config_t``. :func:`memory` evaluates one configuration; ``engine="reference"``
runs the pure-Python twin in :mod:`moesim.reference` instead of C.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ... import _lowering_cache
from ...spec import quants as Q
from ..codes import placement_code
from ...spec.hardware import Machine
from ...spec.models import Model
from ...spec.placement import Placement
from ...spec.runtimes import MIB, Runtime
from .parallel import kv_heads, layout_degrees


CLASSES = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn", "embeddings", "lm_head",
           "mtp", "kv_cache", "state", "buffers")
WEIGHT_CLASSES = CLASSES[:8]
TIERS = ("gpu", "host", "storage")

CONFIG_FIELDS = ("context", "batch", "kv_bytes_per_elem", "placement", "placement_arg", "mtp", "n_gpus",
                 "gpu_capacity", "host_capacity", "storage_capacity", "storage_spill", "embed_on_gpu", "head_copy",
                 "kv_granularity", "gpu_fixed", "gpu_buf0", "gpu_buf_ctx", "host_fixed", "host_buf0",
                 "host_buf_ctx", "gpu_ways")
INT_CONFIG_FIELDS = {"context", "batch", "placement", "placement_arg", "mtp", "n_gpus", "storage_spill",
                     "embed_on_gpu", "kv_granularity"}


@dataclass(frozen=True, eq=False)
class LoweredModel:
    """Per-layer byte arrays of one model under one quantization (ms_model_t)."""

    model_id: str
    quant: str
    attn: np.ndarray
    router: np.ndarray
    shared: np.ndarray
    expert_one: np.ndarray
    n_experts: np.ndarray
    dense: np.ndarray
    kv_elems: np.ndarray
    kv_fixed: np.ndarray
    kv_cap: np.ndarray
    kv_ratio: np.ndarray
    kv_ratio_elems: np.ndarray
    kv_ratio_fixed: np.ndarray
    kv_state: np.ndarray
    embed: float
    head: float
    mtp: float
    mtp_layers: int
    max_context: int
    weights_by_class: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.attn)


@functools.lru_cache(maxsize=4096)
def _lower_cached(model: Model, q: Q.Quant, indexer_bytes: float) -> LoweredModel:
    key = Q.lowering_key(model, q, float(indexer_bytes))
    packed = _lowering_cache.get("lowered", key) if key is not None else None
    if packed is not None:
        low = _unpack(packed)
    else:
        low = _lower(model, q, indexer_bytes)
        if key is not None:
            _lowering_cache.put("lowered", key, _pack(low))
    if key is not None:
        _KEYS[id(low)] = (low, key)             # holds the lowering, so its id stays its own
    return low


_KEYS: dict = {}                # id(lowered model) -> (it, its lowering-cache key): lowering_key_of


def lowering_key_of(low) -> "tuple | None":
    """The persistent lowering cache's key of a lowered model :func:`lower` made (None: not a catalog
    model's, or made elsewhere): tables computed from it alone may be kept under it."""
    hit = _KEYS.get(id(low))
    return hit[1] if hit is not None and hit[0] is low else None


_PACKED_LAYERS = ("attn", "router", "shared", "expert_one", "dense")   # float64 per layer, one [5, L] array


def _pack(low: LoweredModel) -> tuple:
    """A LoweredModel as the lowering cache stores it: its per-layer weight bytes as one array (a few
    arrays per entry load several times faster than a dataclass of a dozen), the rest as plain values."""
    return (low.model_id, low.quant, np.stack([getattr(low, f) for f in _PACKED_LAYERS]), low.n_experts,
            tuple(getattr(low, f) for f in KV_COLUMNS), low.embed, low.head, low.mtp, low.mtp_layers,
            low.max_context, tuple(low.weights_by_class.items()))


def _unpack(packed: tuple) -> LoweredModel:
    mid, quant, layers, n_exp, kv, embed, head, mtp, mtp_layers, max_context, by_class = packed
    for a in kv:                                  # read-only, as _kv_columns makes them
        a.flags.writeable = False
    return LoweredModel(model_id=mid, quant=quant, **dict(zip(_PACKED_LAYERS, layers)), n_experts=n_exp,
                        **dict(zip(KV_COLUMNS, kv)), embed=embed, head=head, mtp=mtp, mtp_layers=mtp_layers,
                        max_context=max_context, weights_by_class=dict(by_class))


def _lower(model: Model, q: Q.Quant, indexer_bytes: float) -> LoweredModel:
    n = model.n_layers
    per, glob, by_class = _class_sums(Q.weight_table(model, q, include_mtp=True), n)
    n_exp = np.array([l.ffn.n_experts if l.ffn.kind == "moe" else 0 for l in model.layers], dtype=np.int32)
    expert_one = np.divide(per["routed_experts"], np.maximum(n_exp, 1))
    kv = _kv_columns(model, indexer_bytes)
    by_class.pop("mtp")
    return LoweredModel(
        model_id=model.id, quant=q.id,
        attn=per["attention"], router=per["router"], shared=per["shared_experts"], expert_one=expert_one,
        n_experts=n_exp, dense=per["dense_ffn"],
        **kv,
        embed=glob["embeddings"], head=glob["lm_head"], mtp=glob["mtp"], mtp_layers=model.mtp_layers,
        max_context=model.max_context, weights_by_class=by_class,
    )


def _kv_columns(model: Model, indexer_bytes: float) -> dict:
    """The cache terms of every layer (Model.kv_terms) as LoweredModel's kv_* arrays: they depend on the
    model and the indexer cache's entry size alone, so every quant's lowering shares one read-only set."""
    def build():
        terms = [model.kv_terms(l, indexer_bytes) for l in model.layers]
        cols = dict(kv_elems=np.array([t.elems for t in terms], dtype=np.float64),
                    kv_fixed=np.array([t.fixed_bytes for t in terms], dtype=np.float64),
                    kv_cap=np.array([t.cap for t in terms], dtype=np.int64),
                    kv_ratio=np.array([t.ratio for t in terms], dtype=np.int64),
                    kv_ratio_elems=np.array([t.ratio_elems for t in terms], dtype=np.float64),
                    kv_ratio_fixed=np.array([t.ratio_fixed_bytes for t in terms], dtype=np.float64),
                    kv_state=np.array([t.state_bytes for t in terms], dtype=np.float64))
        for a in cols.values():
            a.flags.writeable = False
        return cols
    return model.cached_view(f"_cache_kv_columns_{indexer_bytes!r}", build)


KV_COLUMNS = ("kv_elems", "kv_fixed", "kv_cap", "kv_ratio", "kv_ratio_elems", "kv_ratio_fixed", "kv_state")


def kv_columns_key(low) -> tuple:
    """A hashable key of a lowered model's cache columns (KV_COLUMNS: dtype and bytes of each): equal for
    every quant of a model (they share :func:`_kv_columns`), so tables that read these columns alone are
    built once per model instead of once per quant."""
    hit = _KV_KEYS.get(id(low))
    if hit is None or hit[0] is not low:
        if len(_KV_KEYS) > 8192:
            _KV_KEYS.clear()
        hit = _KV_KEYS[id(low)] = (low, tuple((a.dtype.str, a.tobytes()) for a in (getattr(low, f) for f in KV_COLUMNS)))
    return hit[1]


_KV_KEYS: dict = {}             # id(lowered model) -> (it, kv_columns_key): held, so the id stays its own


_PER_LAYER = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn")


def _class_sums(wt: Q.WeightTable, n: int) -> tuple:
    """(per-layer bytes of each per-layer class, bytes of each global class, bytes of every class) of a
    weight table. np.bincount adds each cell's tensors in file order, as a loop over the tensors would."""
    names = Q.WEIGHT_CLASS_NAMES
    total = np.bincount(wt.cls, weights=wt.nbytes, minlength=len(names))
    by_class = {c: float(total[i]) for i, c in enumerate(names)}
    glob = {c: by_class[c] for c in ("embeddings", "lm_head", "mtp")}
    per = {}
    for c in _PER_LAYER:
        rows = wt.cls == names.index(c)
        layer = wt.layer[rows]
        layer = np.where(layer < 0, layer + n, layer)      # a layer of -1 counts as the last, as indexing does
        if layer.size and (layer.min() < 0 or layer.max() >= n):
            raise IndexError(f"{c} tensor outside the model's {n} layers")
        per[c] = np.bincount(layer, weights=wt.nbytes[rows], minlength=n).astype(np.float64)
    return per, glob, by_class


def lower(model: Model, quant, kv_dtype: str | None = None) -> LoweredModel:
    """The model's per-layer byte arrays under *quant*; *kv_dtype* picks the sparse-attention indexer
    cache's dtype (``fp8+fp4``: fp4; a plain KV dtype or None: the default, :func:`quants.indexer_dtype`)."""
    q = Q.resolve(quant, model)
    Q.check_applicable(model, q)
    return _lower_cached(model, q, Q.indexer_dtype_bytes(kv_dtype))


def configure(model: Model, low: LoweredModel, machine: Machine, runtime: Runtime, placement: Placement,
              context: int, batch: int, kv_dtype: str, mtp: int = 0) -> dict:
    """The ms_mem_config_t fields for one configuration (all inputs already validated)."""
    kvb = Q.kv_dtype_bytes(kv_dtype)
    gran = max(1, int(runtime.kv_granularity))
    cpu_only = placement.kind == "cpu-only" or machine.n_gpus == 0
    # Compute buffers (RT §1.6): llama.cpp reserves logits for a whole ubatch plus an attention
    # workspace growing with context; served runtimes reserve an activation peak instead.
    buf0 = buf_ctx = 0.0
    if runtime.ubatch:
        ub = runtime.ubatch
        if runtime.logits_on_gpu:
            buf0 += model.vocab * ub * 4.0
        fa = machine.flash_attention if not cpu_only else True
        if runtime.attention_buffer == "flash" and fa:
            buf_ctx += ub * 2.0                       # f16 KQ mask [n_ctx, n_ubatch]
        elif runtime.attention_buffer in ("flash", "full"):
            heads = max(l.attention.n_heads for l in model.layers)
            buf_ctx += heads * ub * 4.0 * 2           # f32 KQ scores and softmax [n_ctx, n_ubatch, n_head]
    if runtime.activation_tokens:
        widest = max(max(l.ffn.intermediate, l.ffn.expert_intermediate * max(1, l.ffn.top_k)) for l in model.layers)
        buf0 += runtime.activation_tokens * (2 * model.hidden + 2 * widest) * 2.0 / max(1, machine.n_gpus)
    if runtime.prefill_step:
        widest = max(max(l.ffn.intermediate, l.ffn.expert_intermediate * max(1, l.ffn.top_k)) for l in model.layers)
        buf0 += runtime.prefill_step * (2 * model.hidden + 2 * widest) * 2.0
    gpu_fixed = (runtime.gpu_fixed_mib + runtime.cudagraph_mib) * MIB
    if machine.unified:
        pool = machine.gpu_mem_bytes
        gpu_cap = pool * machine.gpu_working_set_fraction
        host_cap = pool - gpu_cap
    else:
        gpu_cap = max(0.0, machine.gpu_mem_bytes * runtime.gpu_mem_fraction - runtime.gpu_margin_mib * MIB)
        host_cap = machine.host_mem_bytes
    if (runtime.id == "sglang" or runtime.family == "ktransformers") and machine.n_gpus and not machine.unified:
        gpu_cap = machine.gpu_mem_bytes * _sglang_mem_fraction(machine)
    cfg = dict(
        context=context, batch=batch, kv_bytes_per_elem=kvb, placement=placement_code(placement),
        placement_arg=max(0, placement.arg), mtp=1 if mtp else 0, n_gpus=0 if cpu_only else machine.n_gpus,
        gpu_capacity=gpu_cap, host_capacity=host_cap,
        storage_capacity=machine.storage_bytes, storage_spill=1 if (runtime.storage_spill and machine.storage_bytes) else 0,
        embed_on_gpu=1 if runtime.embeddings_on_gpu else 0, head_copy=head_copy_bytes(model, low, machine, runtime),
        kv_granularity=gran,
        gpu_fixed=0.0 if cpu_only else gpu_fixed, gpu_buf0=0.0 if cpu_only else buf0,
        gpu_buf_ctx=0.0 if cpu_only else buf_ctx,
        host_fixed=runtime.host_fixed_mib * MIB, host_buf0=buf0 if cpu_only else 0.0,
        host_buf_ctx=buf_ctx if cpu_only else 0.0,
    )
    ways = memory_split_ways(model, runtime, cfg["n_gpus"])
    cfg["gpu_ways"] = tuple(ways[c] for c in CLASSES)      # memory per GPU: the kernel's fit criterion
    return cfg


def head_copy_bytes(model: Model, low: LoweredModel, machine: Machine, runtime: Runtime) -> float:
    """Bytes of a tied head's matrix a runtime loads a second time beside the token embeddings: llama.cpp keeps
    the input embeddings on the CPU and creates the output from token_embd with TENSOR_DUPLICATED, which its
    loader counts and loads again for the output's device (llama-model.cpp / llama-model-loader.cpp, code search
    find_string ids 56441110077, 1638720116). The memory kernel adds them where the head's tier differs from the
    embeddings'. Runtimes that keep the embeddings on the GPU share one tensor, and on a unified chip the GPU
    buffer maps the same mmap'd pages, so neither holds a copy."""
    if not model.tie_embeddings or runtime.embeddings_on_gpu or machine.unified:
        return 0.0
    return float(low.embed)


def config_columns(cfg: dict, n: int) -> dict:
    """n copies of one configuration (:func:`configure`) as the columns engine.memory.evaluate reads
    (gpu_ways as [n, len(CLASSES)])."""
    return {k: np.tile(np.asarray(v, dtype=np.float64), (n, 1)) if k == "gpu_ways"
            else np.full(n, v, dtype=np.int64 if k in INT_CONFIG_FIELDS else np.float64) for k, v in cfg.items()}


def memory_split_ways(m, rt, n_gpus: int) -> dict:
    """How many ways each memory class's GPU bytes divide over the GPUs of a layout (1 = replicated on each;
    ms_mem_config_t.gpu_ways): the one split rule of the memory kernel's per-GPU fit and analysis.per_gpu.

    With N GPUs, attention TP Ta = N / D under D attention-DP ranks, EP P, R redundant experts, E experts:
    attention weights split Ta ways (attention DP replicates them on every rank: SGLang DP attention,
    TensorRT-LLM ``--enable-attention-dp``, RT §3.2, §4); the router is replicated (vLLM builds the MoE gate
    as a ``ReplicatedLinear``); the E + R routed expert slots spread over the N GPUs (EP P x MoE TP N / P;
    vLLM EP size = TP x DP, docs.vllm.ai "Expert Parallel Deployment"), so the entry is N E / (E + R);
    shared experts, dense FFN, MTP modules, embeddings and LM head split N ways (vLLM's
    VocabParallelEmbedding / ParallelLMHead); the KV cache and per-sequence state split D ways (each DP rank
    its own sequences) times at most as many TP ranks as there are KV heads (MLA's single latent head is
    "duplicated among all TP ranks", RT §3.2); compute buffers (allocated per GPU) N ways. A layer split or
    pipeline holds a share of the layers on each GPU, every tensor whole: every class N ways. One GPU (or
    none): every class 1 way. Keys: CLASSES."""
    if n_gpus <= 1 or not rt.decode.tensor_parallel:
        return {c: float(max(1, n_gpus)) for c in CLASSES}
    n, attn_tp, ep, _ = layout_degrees(rt, n_gpus)
    dp = max(1, n // attn_tp)
    e = max(1, m.n_experts)
    red = rt.decode.redundant_experts if ep > 1 else 0
    kv = dp * min(attn_tp, kv_heads(m))
    ways = dict(attention=attn_tp, router=1, shared_experts=n, routed_experts=n * e / (e + red), dense_ffn=n,
                embeddings=n, lm_head=n, mtp=n, kv_cache=kv, state=kv, buffers=n)
    return {c: float(ways[c]) for c in CLASSES}


def _sglang_mem_fraction(machine: Machine) -> float:
    """SGLang's default mem_fraction_static: (gpu_mem - reserved) / gpu_mem with the tiered reserve (RT §3.1)."""
    gib = machine.gpu_mem_bytes / 2**30
    if gib < 20:
        chunk, graph_bs = 2048, 8
    elif gib < 35:
        chunk, graph_bs = 2048, 24 if machine.n_gpus < 4 else 80
    elif gib < 60:
        chunk, graph_bs = 4096, 32 if machine.n_gpus < 4 else 160
    elif gib < 160:
        chunk, graph_bs = 8192, 256 if machine.n_gpus < 4 else 512
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + 1.5 * max(chunk, 2048) + 2 * graph_bs + machine.n_gpus / 8 * 1024
    if gib > 60:
        reserved = max(reserved, 10 * 1024)
    return max(0.1, (gib * 1024 - reserved) / (gib * 1024))


def default_kv_dtype(q: Q.Quant, rt: Runtime, m: Model) -> str:
    """f16 for llama.cpp (its default -ctk/-ctv), bf16 for served checkpoints (vLLM 'auto')."""
    return "f16" if rt.llama_cpp_family else "bf16"
