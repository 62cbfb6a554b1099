"""Model building blocks: a layer's attention and FFN, and the weight tensors they hold."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import MoesimError
from .limits import check_dims


# Tensor classes used for memory accounting and placement.
TENSOR_CLASSES = (
    "attention",       # attention projections, per-layer norms, indexers, linear-attention weights
    "router",          # expert gating: router, expert bias, latent-MoE down/up projections
    "shared_experts",  # always-active experts
    "routed_experts",  # top-k experts
    "dense_ffn",       # FFN of dense layers
    "embeddings",      # token embedding table
    "lm_head",         # output projection and final norm
    "mtp",             # multi-token-prediction modules
)

ATTENTION_KINDS = ("gqa", "mla", "kda", "gdn", "dsv4")

# Top-k defaults where a config does not say: DeepSeek-V3.2's DSA indexer selects 2048 tokens per
# query; DeepSeek-V4's c4a layers select 512 compressed entries (the V4 post, reference/runtimes.md
# §2.2). Configs carry their own ``index_topk`` (V4-Pro 1024, V4-Flash 512), which wins.
DSA_DEFAULT_TOPK = 2048
C4A_DEFAULT_TOPK = 512
# DeepSeek-V4's c128a layers attend a top-k of 8192 compressed entries (same post); no config field.
C128A_TOPK = 8192


def compressed_topk(attention: "Attention", ratio: int) -> "int | None":
    """Compressed KV entries a DeepSeek-V4 layer of compression ``ratio`` attends to (None: all)."""
    if ratio == 4:
        return attention.index_topk or C4A_DEFAULT_TOPK
    if ratio == 128:
        return C128A_TOPK
    return None


@dataclass(frozen=True)
class Attention:
    """One layer's token mixer.

    ``kind``: ``gqa`` (MHA/GQA/MQA, optionally sliding ``window`` or ``chunk``ed), ``mla`` (DeepSeek
    multi-head latent attention; caches ``kv_lora_rank + qk_rope_head_dim`` per token), ``kda`` (Kimi
    Delta Attention) and ``gdn`` (Gated DeltaNet): linear attention with a fixed per-sequence state;
    ``dsv4``: DeepSeek-V4 sliding window + compressed attention (``compress_ratio`` 0, 4 or 128).
    """

    kind: str
    n_heads: int
    n_kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    chunk: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    bias: bool = False
    qk_norm: bool = False
    output_gate: bool = False
    sinks: bool = False
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 0
    full_rank_gate: bool = False
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0             # tokens (DSA) / compressed entries (c4a) the indexer selects
    own_indexer: bool = False
    compress_ratio: int = 0
    o_lora_rank: int = 0
    o_groups: int = 0
    hc_mult: int = 0

    def __post_init__(self):
        if self.kind not in ATTENTION_KINDS:
            raise MoesimError(f"unknown attention kind {self.kind!r}; known: {', '.join(ATTENTION_KINDS)}", "attention")
        check_dims(self, f"{self.kind} attention")
        if self.n_heads < 1 and self.kind in ("gqa", "mla", "dsv4"):
            raise MoesimError(f"{self.kind} attention needs at least one head, got {self.n_heads}",
                              "num_attention_heads")


@dataclass(frozen=True)
class FFN:
    """One layer's feed-forward block: ``dense`` (width ``intermediate``) or ``moe``."""

    kind: str
    intermediate: int = 0
    n_experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    n_shared: int = 0
    shared_intermediate: int = 0
    latent_dim: int = 0
    n_group: int = 1
    topk_group: int = 1
    expert_bias: bool = False
    router_bias: bool = False
    shared_gate: bool = False

    def __post_init__(self):
        if self.kind not in ("dense", "moe"):
            raise MoesimError(f"unknown FFN kind {self.kind!r}; known: dense, moe", "ffn")
        check_dims(self, f"{self.kind} FFN")
        if self.kind != "moe":
            return
        if not 1 <= self.top_k <= self.n_experts:
            raise MoesimError(f"top-k must be in [1, {self.n_experts}] (the routed experts), got {self.top_k}",
                              "num_experts_per_tok")
        # group-limited routing (DeepSeek-V3 n_group / topk_group): whole groups, enough of them for top-k
        if self.n_group < 1 or self.n_experts % self.n_group:
            raise MoesimError(f"must divide the {self.n_experts} routed experts, got {self.n_group}", "n_group")
        if not 1 <= self.topk_group <= self.n_group or self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise MoesimError(f"must be in [1, {self.n_group}] (n_group) and leave room for top-k {self.top_k}, "
                              f"got {self.topk_group}", "topk_group")


@dataclass(frozen=True)
class Layer:
    index: int
    attention: Attention
    ffn: FFN


@dataclass(frozen=True)
class Tensor:
    """One weight tensor: GGUF-style name, ggml shape (ne0 = row length first), class, layer (-1 = global)."""

    name: str
    shape: tuple
    cls: str
    layer: int = -1

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class KVTerms:
    """Per-layer, per-sequence cache bytes as a function of context C (see :meth:`Model.kv_terms`).

    bytes(C) = (elems * kv_bytes_per_elem + fixed_bytes) * min(C, cap or C)
             + (C // ratio) * (ratio_elems * kv_bytes_per_elem + ratio_fixed_bytes)   [ratio > 0]
             + state_bytes
    """

    elems: float = 0.0
    fixed_bytes: float = 0.0
    cap: int = 0
    ratio: int = 0
    ratio_elems: float = 0.0
    ratio_fixed_bytes: float = 0.0
    state_bytes: float = 0.0


@dataclass(frozen=True)
class StoredWeights:
    """The exact tensor table of a weights file a model was read from (GGUF or safetensors headers).

    ``table`` holds ``(Tensor, storage type, bytes)`` for every tensor in the file(s), in file order;
    ``key`` identifies the artifact (paths, sizes, modification times) and is all that equality and
    hashing look at. ``label`` is the file's own quantization name (``Q4_K_M``, ``fp8``, ``bf16``...).
    """

    container: str
    key: str
    label: str
    table: tuple = field(compare=False, repr=False)
    files: tuple = field(compare=False, default=())
    metadata: Mapping | None = field(compare=False, default=None, repr=False)
