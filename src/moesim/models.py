"""Model architecture specs: parsed from Hugging Face ``config.json`` fields, lowered to a tensor inventory.

One parser serves both the built-in catalog (whose entries *are* HF config fields, see
``catalog/models.toml``) and user-supplied configs (:meth:`Model.from_hf_config`), so the two
cannot disagree. A :class:`Model` is a tuple of :class:`Layer` (attention + FFN) plus embeddings,
head and MTP modules; :meth:`Model.tensors` names every weight tensor the way llama.cpp's GGUF
files do (``blk.N.ffn_down_exps.weight``), with ggml shapes ``(ne0, ne1, ne2)`` where ``ne0`` is the
row (input) length. Quantization rules and ``-ot`` placement work on those names.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Mapping

from . import _catalog
from .checkpoint import Scheme, scheme_from_config
from .errors import MoesimError, unknown_id

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
    own_indexer: bool = False
    compress_ratio: int = 0
    o_lora_rank: int = 0
    o_groups: int = 0
    hc_mult: int = 0


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


@dataclass(frozen=True)
class Model:
    """A model architecture. Build with :func:`model` (catalog id or a file path), :meth:`from_hf_config`,
    :meth:`from_gguf` or :meth:`from_safetensors`."""

    id: str
    name: str = field(compare=False)
    family: str
    hidden: int
    vocab: int
    tie_embeddings: bool
    layers: tuple
    max_context: int
    mtp_layers: int = 0
    mtp_layer: Layer | None = None
    native_quant: str = "bf16"
    quantization_config: Mapping | None = field(default=None, compare=False)
    expert_dtype: str | None = None
    published_total_params: float | None = field(default=None, compare=False)
    published_active_params: float | None = field(default=None, compare=False)
    published_active_excludes_embeddings: bool = field(default=False, compare=False)
    source: str = field(default="", compare=False)
    quant_scheme: "Scheme | None" = None
    stored: StoredWeights | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(cls, config: Mapping | str | os.PathLike, id: str | None = None, **meta) -> "Model":
        """Parse a Hugging Face ``config.json`` (a path, a directory holding one, or a dict)."""
        path = None
        if not isinstance(config, Mapping):
            from .ingest import _load_json
            if not isinstance(config, (str, os.PathLike)):
                raise MoesimError(f"expected a config dict or a path, got {type(config).__name__}", "config")
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            if not os.path.exists(path):
                raise MoesimError(f"{path}: no such file", "config")
            config = _load_json(path, "config.json", "config")
            if isinstance(config, dict) and config.get("quantization_config") is None:
                # NVIDIA ModelOpt checkpoints describe their quantization in hf_quant_config.json
                extra = os.path.join(os.path.dirname(path), "hf_quant_config.json")
                if os.path.exists(extra):
                    q = _load_json(extra, "hf_quant_config.json", "config")
                    if isinstance(q, dict) and isinstance(q.get("quantization"), Mapping):
                        config = dict(config, quantization_config={"quant_method": "modelopt", **q["quantization"]})
            if id is None:
                id = os.path.basename(os.path.dirname(os.path.abspath(path))) or "model"
            meta.setdefault("source", f"config.json at {path}")
        if not isinstance(config, Mapping):
            raise MoesimError(f"{path + ': ' if path else ''}a config must be a JSON object", "config")
        where = meta.get("source") or "config"
        try:
            return _parse(dict(config), id or str(config.get("_name_or_path", "model")), meta)
        except MoesimError as exc:
            if path is None:
                raise
            msg = str(exc)
            if exc.field and msg.startswith(f"{exc.field}: "):
                msg = msg[len(exc.field) + 2:]
            raise MoesimError(f"{path}: {msg}", exc.field) from None   # name the file
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as exc:
            # a field of the wrong JSON type (a string where a count belongs, a list of objects...)
            raise MoesimError(f"{where}: malformed config ({type(exc).__name__}: {exc})", "config") from None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "Model":
        """Read a GGUF file (following ``-0000k-of-0000N.gguf`` splits): architecture from its metadata,
        the exact type and bytes of every tensor from its tensor table (no weights are read)."""
        from .ingest import read_gguf_model
        return read_gguf_model(path)

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike, config: Mapping | str | os.PathLike | None = None) -> "Model":
        """A model from ``model.safetensors.index.json`` and/or safetensors headers (no weights read); the
        architecture comes from *config* or the ``config.json`` beside the files."""
        from .ingest import read_safetensors_model
        return read_safetensors_model(path, config)

    # ------------------------------------------------------------------ derived views
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def moe_layers(self) -> tuple:
        return tuple(l for l in self.layers if l.ffn.kind == "moe")

    @property
    def n_experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        moe = self.moe_layers
        return moe[0].ffn.n_experts if moe else 0

    @property
    def top_k(self) -> int:
        moe = self.moe_layers
        return moe[0].ffn.top_k if moe else 0

    def tensors(self, include_mtp: bool = True) -> list:
        """Every weight tensor, named as llama.cpp names them in GGUF files.

        A model read from a GGUF file returns the file's own tensors (real names and shapes)."""
        if self.stored is not None and self.stored.container == "gguf":
            return [t for t, _typ, _nb in self.stored.table if include_mtp or t.cls != "mtp"]
        out = [Tensor("token_embd.weight", (self.hidden, self.vocab), "embeddings")]
        for layer in self.layers:
            out.extend(_layer_tensors(self, layer, f"blk.{layer.index}.", None))
        out.append(Tensor("output_norm.weight", (self.hidden,), "lm_head"))
        if not self.tie_embeddings:
            out.append(Tensor("output.weight", (self.hidden, self.vocab), "lm_head"))
        if include_mtp and self.mtp_layer is not None:
            for m in range(self.mtp_layers):
                idx = self.n_layers + m
                prefix = f"blk.{idx}."
                out.extend(_layer_tensors(self, self.mtp_layer, prefix, "mtp"))
                out.append(Tensor(prefix + "nextn.eh_proj.weight", (2 * self.hidden, self.hidden), "mtp", idx))
                for nm in ("nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"):
                    out.append(Tensor(prefix + nm, (self.hidden,), "mtp", idx))
        return out

    def param_counts(self) -> tuple:
        """(total, active) parameters, embeddings and head counted, MTP excluded, norms included."""
        total = active = 0
        for t in self.tensors(include_mtp=False):
            n = t.n_elements
            total += n
            if t.cls == "routed_experts" and 0 <= t.layer < self.n_layers and self.layers[t.layer].ffn.n_experts:
                ffn = self.layers[t.layer].ffn
                active += n * ffn.top_k / ffn.n_experts
            else:
                active += n
        return total, active

    def kv_terms(self, layer: Layer) -> KVTerms:
        """Cache bytes of one layer for one sequence, as the affine/capped terms of :class:`KVTerms`.

        Element counts are in the KV dtype; ``fixed_bytes`` are caches with their own dtype (DSA
        indexer keys: fp8 + one fp32 scale per 128, AIC-sdk ``indexer_cache_entry_bytes``).
        """
        a = layer.attention
        if a.kind == "gqa":
            return KVTerms(elems=2 * a.n_kv_heads * a.head_dim, cap=a.window or a.chunk)
        if a.kind == "mla":
            # llama.cpp/FlashMLA cache the compressed latent plus the rope key; V is a view of it.
            fixed = 0.0
            if a.index_heads:
                fixed = a.index_head_dim + 4 * (a.index_head_dim / 128)
            return KVTerms(elems=a.kv_lora_rank + a.qk_rope_head_dim, fixed_bytes=fixed)
        if a.kind in ("kda", "gdn"):
            # Fixed recurrent state, fp32: heads x d_k x d_v, plus the short-conv tail of
            # (kernel - 1) columns over the q/k/v channels in bf16 (models.md §5, §8).
            heads = a.lin_v_heads
            state = heads * a.lin_k_dim * a.lin_v_dim * 4
            conv_channels = a.lin_k_heads * a.lin_k_dim * 2 + a.lin_v_heads * a.lin_v_dim
            state += (a.conv_kernel - 1) * conv_channels * 2
            return KVTerms(state_bytes=float(state))
        if a.kind == "dsv4":
            # AIC-sdk get_kvcache_bytes_per_sequence (models.md, DeepSeek-V4): a sliding window of
            # min(C, 128) entries of head_dim, plus C // ratio compressed entries, plus the fp32
            # compressor state; ratio 4 layers add an fp4 indexer cache of index_head_dim per entry.
            r = a.compress_ratio
            terms = dict(elems=a.head_dim, cap=a.window)
            if r > 0:
                coff = 2 if r == 4 else 1
                state = 2 * r * coff * a.head_dim * 4
                ratio_fixed = 0.0
                if r == 4:
                    ratio_fixed = a.index_head_dim * 0.5
                    state += 2 * r * 2 * a.index_head_dim * 4
                terms.update(ratio=r, ratio_elems=a.head_dim, ratio_fixed_bytes=ratio_fixed,
                             state_bytes=float(state))
            return KVTerms(**terms)
        raise AssertionError(a.kind)


# ---------------------------------------------------------------------------------- tensors
def _layer_tensors(model: Model, layer: Layer, p: str, force_cls: str | None) -> list:
    h = model.hidden
    li = layer.index if force_cls is None else -1
    a, f = layer.attention, layer.ffn
    out = []

    def add(name, shape, cls):
        out.append(Tensor(p + name, tuple(int(x) for x in shape), force_cls or cls, li if li >= 0 else
                          (model.n_layers if force_cls else -1)))

    add("attn_norm.weight", (h,), "attention")
    if a.kind == "gqa":
        q_out = a.n_heads * a.head_dim * (2 if a.output_gate else 1)
        kv_out = a.n_kv_heads * a.head_dim
        add("attn_q.weight", (h, q_out), "attention")
        add("attn_k.weight", (h, kv_out), "attention")
        add("attn_v.weight", (h, kv_out), "attention")
        add("attn_output.weight", (a.n_heads * a.head_dim, h), "attention")
        if a.bias:
            add("attn_q.bias", (q_out,), "attention")
            add("attn_k.bias", (kv_out,), "attention")
            add("attn_v.bias", (kv_out,), "attention")
        if a.qk_norm:
            add("attn_q_norm.weight", (a.head_dim,), "attention")
            add("attn_k_norm.weight", (a.head_dim,), "attention")
        if a.sinks:
            add("attn_sinks.weight", (a.n_heads,), "attention")
            add("attn_output.bias", (h,), "attention")
    elif a.kind == "mla":
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            add("attn_q_a.weight", (h, a.q_lora_rank), "attention")
            add("attn_q_a_norm.weight", (a.q_lora_rank,), "attention")
            add("attn_q_b.weight", (a.q_lora_rank, a.n_heads * qk), "attention")
        else:
            add("attn_q.weight", (h, a.n_heads * qk), "attention")
        add("attn_kv_a_mqa.weight", (h, a.kv_lora_rank + a.qk_rope_head_dim), "attention")
        add("attn_kv_a_norm.weight", (a.kv_lora_rank,), "attention")
        add("attn_k_b.weight", (a.qk_nope_head_dim, a.kv_lora_rank, a.n_heads), "attention")
        add("attn_v_b.weight", (a.kv_lora_rank, a.v_head_dim, a.n_heads), "attention")
        add("attn_output.weight", (a.n_heads * a.v_head_dim, h), "attention")
        if a.output_gate:
            add("attn_gate.weight", (h, a.n_heads * a.v_head_dim), "attention")
        if a.own_indexer:
            q_in = a.q_lora_rank or h
            add("indexer.attn_q_b.weight", (q_in, a.index_heads * a.index_head_dim), "attention")
            add("indexer.attn_k.weight", (h, a.index_head_dim), "attention")
            add("indexer.k_norm.weight", (a.index_head_dim,), "attention")
            add("indexer.proj.weight", (h, a.index_heads), "attention")
    elif a.kind in ("kda", "gdn"):
        qk = a.lin_k_heads * a.lin_k_dim
        vd = a.lin_v_heads * a.lin_v_dim
        if a.kind == "gdn":
            add("ssm_in.weight", (h, 2 * qk + 2 * vd), "attention")
            add("ssm_beta_alpha.weight", (h, 2 * a.lin_v_heads), "attention")
            add("ssm_conv1d.weight", (a.conv_kernel, 2 * qk + vd), "attention")
            add("ssm_dt.bias", (a.lin_v_heads,), "attention")
            add("ssm_a", (a.lin_v_heads,), "attention")
            add("ssm_norm.weight", (a.lin_v_dim,), "attention")
            add("ssm_out.weight", (vd, h), "attention")
        else:
            add("attn_q.weight", (h, qk), "attention")
            add("attn_k.weight", (h, qk), "attention")
            add("attn_v.weight", (h, vd), "attention")
            add("attn_output.weight", (vd, h), "attention")
            add("ssm_conv1d.weight", (a.conv_kernel, 2 * qk + vd), "attention")
            if a.full_rank_gate:
                add("ssm_f.weight", (h, qk), "attention")
            else:
                add("ssm_f_a.weight", (h, a.lin_k_dim), "attention")
                add("ssm_f_b.weight", (a.lin_k_dim, qk), "attention")
            add("ssm_g_a.weight", (h, a.lin_v_dim), "attention")
            add("ssm_g_b.weight", (a.lin_v_dim, vd), "attention")
            add("ssm_beta.weight", (h, a.lin_v_heads), "attention")
            add("ssm_a", (a.lin_v_heads,), "attention")
            add("ssm_dt.bias", (qk,), "attention")
            add("ssm_norm.weight", (a.lin_v_dim,), "attention")
    elif a.kind == "dsv4":
        add("attn_q_a.weight", (h, a.q_lora_rank), "attention")
        add("attn_q_a_norm.weight", (a.q_lora_rank,), "attention")
        add("attn_q_b.weight", (a.q_lora_rank, a.n_heads * a.head_dim), "attention")
        add("attn_kv.weight", (h, a.head_dim), "attention")
        add("attn_kv_norm.weight", (a.head_dim,), "attention")
        add("attn_o_a.weight", (a.n_heads * a.head_dim // a.o_groups, a.o_groups * a.o_lora_rank), "attention")
        add("attn_o_b.weight", (a.o_groups * a.o_lora_rank, h), "attention")
        add("attn_sinks.weight", (a.n_heads,), "attention")
        if a.compress_ratio:
            coff = 2 if a.compress_ratio == 4 else 1
            add("attn_comp_kv.weight", (h, a.head_dim * coff), "attention")
            add("attn_comp_gate.weight", (h, a.head_dim * coff), "attention")
            add("attn_comp_ape.weight", (a.head_dim * coff, a.compress_ratio), "attention")
            if a.compress_ratio == 4:
                add("indexer.attn_q_b.weight", (a.q_lora_rank, a.index_heads * a.index_head_dim), "attention")
                add("indexer.proj.weight", (h, a.index_heads), "attention")
                add("indexer.comp_kv.weight", (h, a.index_head_dim * 2), "attention")
                add("indexer.comp_gate.weight", (h, a.index_head_dim * 2), "attention")
        if a.hc_mult:
            mix = (2 + a.hc_mult) * a.hc_mult
            add("hc_attn_fn.weight", (a.hc_mult * h, mix), "attention")
            add("hc_ffn_fn.weight", (a.hc_mult * h, mix), "attention")

    add("ffn_norm.weight", (h,), "attention")
    if f.kind == "dense":
        add("ffn_gate.weight", (h, f.intermediate), "dense_ffn")
        add("ffn_up.weight", (h, f.intermediate), "dense_ffn")
        add("ffn_down.weight", (f.intermediate, h), "dense_ffn")
    else:
        e, fi = f.n_experts, f.expert_intermediate
        d = f.latent_dim or h
        add("ffn_gate_inp.weight", (h, e), "router")
        if f.router_bias:
            add("exp_probs_b.bias", (e,), "router")
        if f.latent_dim:
            add("ffn_latent_down.weight", (h, d), "router")
            add("ffn_latent_up.weight", (d, h), "router")
        add("ffn_gate_exps.weight", (d, fi, e), "routed_experts")
        add("ffn_up_exps.weight", (d, fi, e), "routed_experts")
        add("ffn_down_exps.weight", (fi, d, e), "routed_experts")
        if f.expert_bias:
            add("ffn_gate_exps.bias", (fi, e), "routed_experts")
            add("ffn_up_exps.bias", (fi, e), "routed_experts")
            add("ffn_down_exps.bias", (d, e), "routed_experts")
        if f.n_shared:
            s = f.shared_intermediate * f.n_shared
            add("ffn_gate_shexp.weight", (h, s), "shared_experts")
            add("ffn_up_shexp.weight", (h, s), "shared_experts")
            add("ffn_down_shexp.weight", (s, h), "shared_experts")
            if f.shared_gate:
                add("ffn_gate_inp_shexp.weight", (h,), "shared_experts")
    return out


# ---------------------------------------------------------------------------------- parsing
def _req(cfg: Mapping, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise MoesimError(f"config for {where} lacks required field {key!r}", key)
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v <= 0 or int(v) != v:
        raise MoesimError(f"must be a positive integer, got {v!r}", key)
    return int(v)


def _opt(cfg: Mapping, key: str, default):
    v = cfg.get(key, default)
    return default if v is None else v


def _int_list(cfg: Mapping, key: str) -> list:
    v = cfg.get(key) or []
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise MoesimError("must be a list of integers", key)
    return list(v)


def _check_moe(n_experts: int, top_k: int, where: str):
    if top_k > n_experts:
        raise MoesimError(f"{where}: top-k {top_k} exceeds the number of experts {n_experts}",
                          "num_experts_per_tok")


def _parse(cfg: dict, id: str, meta: dict) -> Model:
    mt = str(cfg.get("model_type", "")).lower()
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and mt in ("kimi_k3", "llama4"):
        inner = dict(text)
        inner.setdefault("quantization_config", cfg.get("quantization_config"))
        family_cfg, family = inner, mt
    else:
        family_cfg, family = cfg, mt
    parser = _PARSERS.get(family)
    if parser is None:
        raise MoesimError(f"unsupported architecture model_type={mt!r}; supported: "
                          + ", ".join(sorted(_PARSERS)), "model_type")
    c = family_cfg
    hidden = _req(c, "d_model" if family == "dbrx" else "hidden_size", id)
    layers, extra = parser(c, hidden, id)
    if not layers:
        raise MoesimError("the config describes no layers", "num_hidden_layers")
    vocab = _req(c, "vocab_size", id)
    max_ctx = int(_opt(c, "max_position_embeddings", _opt(c, "max_seq_len", 0)) or 0)
    if max_ctx <= 0:
        raise MoesimError("config lacks max_position_embeddings", "max_position_embeddings")
    mtp_layers = int(extra.pop("mtp_layers", 0) or 0)
    scheme = scheme_from_config({"quantization_config": cfg.get("quantization_config"),
                                 "expert_dtype": c.get("expert_dtype", cfg.get("expert_dtype"))})
    return Model(
        id=id,
        name=meta.get("name", id),
        family=family,
        hidden=hidden,
        vocab=vocab,
        tie_embeddings=bool(_opt(c, "tie_word_embeddings", False)),
        layers=tuple(layers),
        max_context=max_ctx,
        mtp_layers=mtp_layers,
        mtp_layer=_mtp_layer(layers, hidden) if mtp_layers else None,
        native_quant=meta.get("native_quant") or _native_quant_from_config(cfg, scheme),
        quantization_config=cfg.get("quantization_config"),
        expert_dtype=c.get("expert_dtype"),
        published_total_params=meta.get("published_total_params"),
        published_active_params=meta.get("published_active_params"),
        published_active_excludes_embeddings=bool(meta.get("published_active_excludes_embeddings", False)),
        source=meta.get("source", ""),
        quant_scheme=scheme,
    )


def _mtp_layer(layers: list, hidden: int) -> Layer:
    """An MTP module is one more decoder layer shaped like the last MoE layer (DeepSeek-V3 §2.2)."""
    last = [l for l in layers if l.ffn.kind == "moe"] or layers
    return Layer(index=-1, attention=last[-1].attention, ffn=last[-1].ffn)


def _native_quant_from_config(cfg: Mapping, scheme: "Scheme | None") -> str:
    """The checkpoint's own format name: the quantization scheme's label, else its torch dtype."""
    if scheme is not None:
        return scheme.label
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return "fp16" if dtype == "float16" else "bf16"


def _moe_or_dense(dense: bool, c: Mapping, hidden: int, *, ff_dense: int, experts: int, top_k: int,
                  expert_ff: int, shared: int = 0, shared_ff: int = 0, **kw) -> FFN:
    if dense:
        return FFN("dense", intermediate=ff_dense)
    return FFN("moe", n_experts=experts, top_k=top_k, expert_intermediate=expert_ff,
               n_shared=shared, shared_intermediate=(shared_ff or expert_ff) if shared else 0, **kw)


def _parse_deepseek(c, hidden, id):
    """deepseek_v2 / deepseek_v3 / deepseek_v32 / kimi_k2 / glm_moe_dsa: MLA + (group-limited) MoE."""
    n = _req(c, "num_hidden_layers", id)
    heads = _req(c, "num_attention_heads", id)
    e = _req(c, "n_routed_experts", id)
    k = _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    first_dense = int(_opt(c, "first_k_dense_replace", 0))
    freq = int(_opt(c, "moe_layer_freq", 1)) or 1
    index_heads = int(_opt(c, "index_n_heads", 0))
    indexer_types = c.get("indexer_types")
    if indexer_types is not None and (not isinstance(indexer_types, list) or len(indexer_types) != n):
        raise MoesimError(f"needs one entry per layer ({n})", "indexer_types")
    layers = []
    for i in range(n):
        own_idx = bool(index_heads) and (indexer_types is None or indexer_types[i] == "full")
        att = Attention("mla", n_heads=heads, q_lora_rank=int(_opt(c, "q_lora_rank", 0)),
                        kv_lora_rank=_req(c, "kv_lora_rank", id),
                        qk_nope_head_dim=_req(c, "qk_nope_head_dim", id),
                        qk_rope_head_dim=_req(c, "qk_rope_head_dim", id),
                        v_head_dim=_req(c, "v_head_dim", id),
                        index_heads=index_heads, index_head_dim=int(_opt(c, "index_head_dim", 0)),
                        own_indexer=own_idx)
        dense = i < first_dense or (i % freq) != 0
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "n_shared_experts", 0)),
                            n_group=int(_opt(c, "n_group", 1)), topk_group=int(_opt(c, "topk_group", 1)),
                            router_bias=_opt(c, "topk_method", "") == "noaux_tc")
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _opt(c, "num_nextn_predict_layers", 0)}


def _parse_deepseek_v4(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    ratios = _int_list(c, "compress_ratios")
    if len(ratios) < n:
        raise MoesimError(f"needs one entry per layer ({n}), got {len(ratios)}", "compress_ratios")
    if any(r not in (0, 4, 128) for r in ratios):
        raise MoesimError("entries must be 0, 4 or 128 (AIC-sdk supported ratios)", "compress_ratios")
    e, k = _req(c, "n_routed_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    layers = []
    for i in range(n):
        att = Attention("dsv4", n_heads=_req(c, "num_attention_heads", id), n_kv_heads=1,
                        head_dim=_req(c, "head_dim", id), window=_req(c, "sliding_window", id),
                        q_lora_rank=_req(c, "q_lora_rank", id), qk_rope_head_dim=_req(c, "qk_rope_head_dim", id),
                        o_lora_rank=_req(c, "o_lora_rank", id), o_groups=_req(c, "o_groups", id),
                        index_heads=int(_opt(c, "index_n_heads", 0)), index_head_dim=int(_opt(c, "index_head_dim", 0)),
                        compress_ratio=ratios[i], hc_mult=int(_opt(c, "hc_mult", 0)), sinks=True)
        ffn = _moe_or_dense(False, c, hidden, ff_dense=0, experts=e, top_k=k,
                            expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "n_shared_experts", 0)), router_bias=True)
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _opt(c, "num_nextn_predict_layers", 0)}


def _parse_kimi_linear(c, hidden, id):
    """kimi_linear and kimi_k3 text configs: KDA layers with periodic MLA layers; (latent) MoE."""
    n = _req(c, "num_hidden_layers", id)
    lin = c.get("linear_attn_config") or {}
    if not isinstance(lin, Mapping):
        raise MoesimError("must be an object", "linear_attn_config")
    full = set(_int_list(lin, "full_attn_layers"))  # 1-based
    if any(not 1 <= x <= n for x in full):
        raise MoesimError(f"full_attn_layers must be 1-based layer numbers in [1, {n}]", "linear_attn_config")
    kda = set(_int_list(lin, "kda_layers"))
    if kda and (kda & full or len(kda | full) != n):
        raise MoesimError("kda_layers and full_attn_layers must partition the layers", "linear_attn_config")
    heads = _req(c, "num_attention_heads", id)
    e = _req(c, "num_experts", id)
    k = _req(c, "num_experts_per_token", id)
    _check_moe(e, k, id)
    first_dense = int(_opt(c, "first_k_dense_replace", 0))
    latent = int(_opt(c, "routed_expert_hidden_size", 0))
    layers = []
    for i in range(n):
        if (i + 1) in full:
            att = Attention("mla", n_heads=heads, q_lora_rank=int(_opt(c, "q_lora_rank", 0)),
                            kv_lora_rank=_req(c, "kv_lora_rank", id), qk_nope_head_dim=_req(c, "qk_nope_head_dim", id),
                            qk_rope_head_dim=_req(c, "qk_rope_head_dim", id), v_head_dim=_req(c, "v_head_dim", id),
                            output_gate=bool(_opt(c, "mla_use_output_gate", False)))
        else:
            lh, ld = _req(lin, "num_heads", id), _req(lin, "head_dim", id)
            att = Attention("kda", n_heads=lh, lin_k_heads=lh, lin_v_heads=lh, lin_k_dim=ld, lin_v_dim=ld,
                            conv_kernel=int(_opt(lin, "short_conv_kernel_size", 4)),
                            full_rank_gate=bool(_opt(lin, "use_full_rank_gate", _opt(c, "use_full_rank_gate", False))))
        dense = i < first_dense
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "num_shared_experts", 0)), latent_dim=latent, router_bias=True)
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _opt(c, "num_nextn_predict_layers", 0)}


def _gqa(c, id, **kw) -> Attention:
    heads = _req(c, "num_attention_heads", id)
    hidden = c.get("hidden_size") or c.get("d_model")
    kv = int(_opt(c, "num_key_value_heads", heads))
    hd = int(_opt(c, "head_dim", 0)) or hidden // heads
    if kv <= 0 or heads % kv:
        raise MoesimError(f"must divide num_attention_heads ({heads}), got {kv}", "num_key_value_heads")
    return Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=hd, **kw)


def _parse_qwen_moe(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    step = int(_opt(c, "decoder_sparse_step", 1)) or 1
    mlp_only = set(_int_list(c, "mlp_only_layers"))
    window = int(_opt(c, "sliding_window", 0)) if _opt(c, "use_sliding_window", False) else 0
    shared_ff = int(_opt(c, "shared_expert_intermediate_size", 0))
    layers = []
    for i in range(n):
        dense = i in mlp_only or (i + 1) % step != 0
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=1 if shared_ff else 0, shared_ff=shared_ff, shared_gate=bool(shared_ff))
        layers.append(Layer(i, _gqa(c, id, window=window, qk_norm=c.get("model_type") == "qwen3_moe"), ffn))
    return layers, {}


def _parse_qwen3_next(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    types = c.get("layer_types")
    interval = int(_opt(c, "full_attention_interval", 4)) or 4
    if types is not None and (not isinstance(types, list) or len(types) != n):
        raise MoesimError(f"needs {n} entries", "layer_types")
    e, k = _req(c, "num_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    shared_ff = int(_opt(c, "shared_expert_intermediate_size", 0))
    layers = []
    for i in range(n):
        is_full = (types[i] == "full_attention") if types else (i + 1) % interval == 0
        if is_full:
            att = _gqa(c, id, qk_norm=True, output_gate=True)
        else:
            att = Attention("gdn", n_heads=_req(c, "linear_num_value_heads", id),
                            lin_k_heads=_req(c, "linear_num_key_heads", id),
                            lin_v_heads=_req(c, "linear_num_value_heads", id),
                            lin_k_dim=_req(c, "linear_key_head_dim", id), lin_v_dim=_req(c, "linear_value_head_dim", id),
                            conv_kernel=int(_opt(c, "linear_conv_kernel_dim", 4)))
        ffn = _moe_or_dense(False, c, hidden, ff_dense=0, experts=e, top_k=k,
                            expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=1 if shared_ff else 0, shared_ff=shared_ff, shared_gate=bool(shared_ff))
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _opt(c, "num_nextn_predict_layers", 0)}


def _parse_gpt_oss(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if len(types) != n:
        raise MoesimError(f"needs {n} entries, got {len(types)}", "layer_types")
    e = _req(c, "num_local_experts", id)
    k = _req(c, "num_experts_per_tok" if "num_experts_per_tok" in c else "experts_per_token", id)
    _check_moe(e, k, id)
    window = _req(c, "sliding_window", id)
    layers = []
    for i in range(n):
        att = _gqa(c, id, window=window if types[i] == "sliding_attention" else 0, bias=True, sinks=True)
        ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id),
                  expert_bias=True)
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_mixtral(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    window = int(_opt(c, "sliding_window", 0))
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id))
    return [Layer(i, _gqa(c, id, window=window), ffn) for i in range(n)], {}


def _parse_llama4(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    step = int(_opt(c, "interleave_moe_layer_step", 1)) or 1
    chunk = int(_opt(c, "attention_chunk_size", 0))
    nope_every = int(_opt(c, "no_rope_layer_interval", 4)) or 4
    ff = _req(c, "intermediate_size", id)
    # HF Llama4TextConfig: no_rope_layers[i] == 0 marks a NoPE (global) layer and moe_layers lists the
    # MoE layers; when absent both are derived from the intervals exactly as below.
    rope_flags = _int_list(c, "no_rope_layers")
    if rope_flags and len(rope_flags) != n:
        raise MoesimError(f"needs one entry per layer ({n}), got {len(rope_flags)}", "no_rope_layers")
    moe_list = c.get("moe_layers")
    moe_set = set(_int_list(c, "moe_layers")) if moe_list is not None else None
    if moe_set is not None and any(not 0 <= x < n for x in moe_set):
        raise MoesimError(f"entries must be layer indices in [0, {n})", "moe_layers")
    layers = []
    for i in range(n):
        # NoPE layers (every 4th, 0-based 3, 7, ...) use full causal attention; the others are
        # chunked (models.md §11; HF `use_rope = (layer_idx + 1) % no_rope_layer_interval != 0`).
        is_global = rope_flags[i] == 0 if rope_flags else (i + 1) % nope_every == 0
        att = _gqa(c, id, chunk=0 if is_global else chunk, qk_norm=bool(_opt(c, "use_qk_norm", False)))
        if (i in moe_set) if moe_set is not None else (i + 1) % step == 0:
            ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=ff, n_shared=1, shared_intermediate=ff)
        else:
            ffn = FFN("dense", intermediate=_req(c, "intermediate_size_mlp", id))
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_glm4_moe(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "n_routed_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    first_dense = int(_opt(c, "first_k_dense_replace", 0))
    layers = []
    for i in range(n):
        dense = i < first_dense
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "n_shared_experts", 0)), router_bias=True,
                            n_group=int(_opt(c, "n_group", 1)), topk_group=int(_opt(c, "topk_group", 1)))
        att = _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)), qk_norm=bool(_opt(c, "use_qk_norm", False)))
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _opt(c, "num_nextn_predict_layers", 0)}


def _parse_minimax_m2(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    shared_ff = int(_opt(c, "shared_intermediate_size", 0))
    kinds = c.get("attn_type_list")
    if kinds is not None and (not isinstance(kinds, list) or any(x != 1 for x in kinds)):
        # MiniMax-Text-01 style lightning (linear) attention layers are marked 0 here; M2 is all 1.
        raise MoesimError("only full-attention layers (all 1) are supported for minimax_m2", "attn_type_list")
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id),
              n_shared=1 if shared_ff else 0, shared_intermediate=shared_ff,
              router_bias=bool(_opt(c, "use_routing_bias", False)))
    att = _gqa(c, id, qk_norm=bool(_opt(c, "use_qk_norm", False)))
    mtp = int(_opt(c, "num_mtp_modules", 0)) if _opt(c, "use_mtp", False) else 0
    return [Layer(i, att, ffn) for i in range(n)], {"mtp_layers": mtp}


def _parse_dbrx(c, hidden, id):
    n = _req(c, "n_layers", id)
    attn = c.get("attn_config") or {}
    ffc = c.get("ffn_config") or {}
    e, k = _req(ffc, "moe_num_experts", id), _req(ffc, "moe_top_k", id)
    _check_moe(e, k, id)
    heads = _req(c, "n_heads", id)
    kv = int(_opt(attn, "kv_n_heads", heads))
    att = Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=hidden // heads)
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(ffc, "ffn_hidden_size", id))
    return [Layer(i, att, ffn) for i in range(n)], {}


def _parse_ernie(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "moe_num_experts", id), _req(c, "moe_k", id)
    _check_moe(e, k, id)
    start = int(_opt(c, "moe_layer_start_index", 0))
    end = int(_opt(c, "moe_layer_end_index", n - 1))
    if end < 0:          # ERNIE configs write -1 for "through the last layer"
        end = n - 1
    interval = int(_opt(c, "moe_layer_interval", 1)) or 1
    layers = []
    for i in range(n):
        dense = not (start <= i <= end and (i - start) % interval == 0)
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "moe_num_shared_experts", 0)))
        layers.append(Layer(i, _gqa(c, id), ffn))
    return layers, {}


def _parse_inkling(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    glob = set(_int_list(c, "global_layers"))
    e, k = _req(c, "n_routed_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    first_dense = int(_opt(c, "first_k_dense_replace", 0))
    heads, hd = _req(c, "num_attention_heads", id), _req(c, "head_dim", id)
    layers = []
    for i in range(n):
        if i in glob:
            att = Attention("gqa", n_heads=heads, n_kv_heads=_req(c, "num_key_value_heads_global", id), head_dim=hd)
        else:
            att = Attention("gqa", n_heads=heads, n_kv_heads=_req(c, "num_key_value_heads_local", id), head_dim=hd,
                            window=_req(c, "sliding_window", id))
        dense = i < first_dense
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=int(_opt(c, "n_shared_experts", 0)))
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_dense(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    window = int(_opt(c, "sliding_window", 0) or 0)
    ffn = FFN("dense", intermediate=_req(c, "intermediate_size", id))
    qk_norm = c.get("model_type") == "qwen3"
    bias = c.get("model_type") == "qwen2" or bool(_opt(c, "attention_bias", False))
    return [Layer(i, _gqa(c, id, window=window, qk_norm=qk_norm, bias=bias), ffn) for i in range(n)], {}


_PARSERS = {
    "deepseek_v2": _parse_deepseek,
    "deepseek_v3": _parse_deepseek,
    "deepseek_v32": _parse_deepseek,
    "kimi_k2": _parse_deepseek,
    "glm_moe_dsa": _parse_deepseek,
    "deepseek_v4": _parse_deepseek_v4,
    "kimi_linear": _parse_kimi_linear,
    "kimi_k3": _parse_kimi_linear,
    "qwen2_moe": _parse_qwen_moe,
    "qwen3_moe": _parse_qwen_moe,
    "qwen3_next": _parse_qwen3_next,
    "gpt_oss": _parse_gpt_oss,
    "mixtral": _parse_mixtral,
    "llama4": _parse_llama4,
    "llama4_text": _parse_llama4,
    "glm4_moe": _parse_glm4_moe,
    "minimax_m2": _parse_minimax_m2,
    "dbrx": _parse_dbrx,
    "ernie4_5_moe": _parse_ernie,
    "inkling": _parse_inkling,
    "llama": _parse_dense,
    "mistral": _parse_dense,
    "qwen2": _parse_dense,
    "qwen3": _parse_dense,
}


# ---------------------------------------------------------------------------------- catalog
def _merged_config(entries: Mapping, mid: str, seen: tuple = ()) -> dict:
    entry = entries[mid]
    base = entry.get("base")
    cfg: dict = {}
    if base:
        if base in seen or base not in entries:
            raise MoesimError(f"catalog entry {mid!r} has a bad base {base!r}", "base")
        cfg = _merged_config(entries, base, seen + (mid,))
    for key, value in entry.get("config", {}).items():
        if isinstance(value, Mapping) and isinstance(cfg.get(key), Mapping):
            merged = dict(cfg[key])
            merged.update(value)
            cfg[key] = merged
        else:
            cfg[key] = copy.deepcopy(value)
    return cfg


def model_ids() -> list:
    return sorted(_catalog.load("models")["models"])


_MODEL_CACHE: dict = {}


_ARTIFACT_SUFFIXES = (".gguf", ".json", ".safetensors")


def looks_like_path(text: str) -> bool:
    """Is *text* meant as a file path (an existing path, a path separator or an artifact suffix)?"""
    return (os.path.exists(text) or os.sep in text or (os.altsep or os.sep) in text
            or text.lower().endswith(_ARTIFACT_SUFFIXES))


def model(id_or_model: "str | os.PathLike | Model") -> Model:
    """A catalog model by id (``moesim.model("deepseek-v3")``), or a model read from a path wherever an id
    is accepted: a GGUF file (first or any shard), a ``config.json`` or a directory holding one (with
    safetensors headers/index beside it when present), a ``model.safetensors.index.json`` or a
    ``.safetensors`` file. A Model passes through."""
    if isinstance(id_or_model, Model):
        return id_or_model
    if isinstance(id_or_model, os.PathLike):
        from .ingest import load
        return load(id_or_model)
    if not isinstance(id_or_model, str):
        raise MoesimError(f"expected a model id string, got {type(id_or_model).__name__}", "model")
    key = id_or_model.strip().lower()
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    entries = _catalog.load("models")["models"]
    if key not in entries:
        if id_or_model.strip() and looks_like_path(id_or_model.strip()):
            from .ingest import load
            return load(id_or_model.strip())
        raise unknown_id("model", id_or_model, entries, "model")
    entry = entries[key]
    meta = {k: v for k, v in entry.items() if k not in ("config", "base")}
    m = _parse(_merged_config(entries, key), key, meta)
    _MODEL_CACHE[key] = m
    return m


def hf_config(id: str) -> dict:
    """The catalog entry's HF config dict (what ``Model.from_hf_config`` would be given)."""
    entries = _catalog.load("models")["models"]
    if id not in entries:
        raise unknown_id("model", id, entries, "model")
    return _merged_config(entries, id)
