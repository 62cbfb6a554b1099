"""Model architecture specs: parsed from Hugging Face ``config.json`` fields, lowered to a tensor inventory.

One parser serves both the built-in catalog (whose entries *are* HF config fields, see
``catalog/models.toml``) and user-supplied configs (:meth:`Model.from_hf_config`), so the two
cannot disagree. A :class:`Model` is a tuple of :class:`Layer` (attention + FFN) plus embeddings,
head and MTP modules; :meth:`Model.tensors` names every weight tensor the way llama.cpp's GGUF
files do (``blk.N.ffn_down_exps.weight``), with ggml shapes ``(ne0, ne1, ne2)`` where ``ne0`` is the
row (input) length. Quantization rules and ``-ot`` placement work on those names.
"""
from __future__ import annotations

import dataclasses

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

from .. import _catalog, _lowering_cache
from .checkpoint import Scheme, scheme_from_config
from ..errors import MoesimError, unknown_id
from .layers import KVTerms, Layer, StoredWeights, Tensor
from .architectures import _PARSERS as _BASE_PARSERS, _mtp_layer, _native_quant_from_config, _opt, _opt_int, _req
from .architectures_more import MORE_PARSERS
from .model_names import _hf_alias_index, resolve_model_id  # noqa: F401  (re-exported: spec.models' API)


# every model_type read (architectures_more.py holds the families that did not fit in one module)
_PARSERS = {**_BASE_PARSERS, **MORE_PARSERS}


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

    def __hash__(self) -> int:
        # computed once: every lowering cache keys on the model, and its layers hash recursively
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # the cached hash stays behind: string hashes differ between processes (dask workers); the
        # cached derived views are rebuilt where they are needed
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def cached_view(self, key: str, build):
        """A derived view computed once per model (the model is frozen, so it cannot go stale)."""
        v = self.__dict__.get(key)
        if v is None:
            v = build()
            object.__setattr__(self, key, v)
        return v

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(cls, config: Mapping | str | os.PathLike, id: str | None = None, **meta) -> "Model":
        """Parse a Hugging Face ``config.json`` (a path, a directory holding one, or a dict)."""
        if not isinstance(config, Mapping):
            if not isinstance(config, (str, os.PathLike)):
                raise MoesimError(f"expected a config dict or a path, got {type(config).__name__}", "config")
            return _artifact_reader("config")(config, id, **meta)
        where = meta.get("source") or "config"
        try:
            return _parse(dict(config), id or str(config.get("_name_or_path", "model")), meta)
        except MoesimError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as exc:
            # a field of the wrong JSON type (a string where a count belongs, a list of objects...)
            raise MoesimError(f"{where}: malformed config ({type(exc).__name__}: {exc})", "config") from None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "Model":
        """Read a GGUF file (following ``-0000k-of-0000N.gguf`` splits): architecture from its metadata,
        the exact type and bytes of every tensor from its tensor table (no weights are read)."""
        return _artifact_reader("gguf")(path)

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike, config: Mapping | str | os.PathLike | None = None) -> "Model":
        """A model from ``model.safetensors.index.json`` and/or safetensors headers (no weights read); the
        architecture comes from *config* or the ``config.json`` beside the files."""
        return _artifact_reader("safetensors")(path, config)

    # ------------------------------------------------------------------ derived views
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def moe_layers(self) -> tuple:
        return self.cached_view("_cache_moe_layers", lambda: tuple(l for l in self.layers if l.ffn.kind == "moe"))

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
        every = self.cached_view("_cache_tensors_mtp", lambda: tuple(self._tensors(True)))
        if include_mtp:
            return list(every)
        # the MTP modules' tensors are the only ones of class "mtp" (a GGUF file's included): drop them
        return list(self.cached_view("_cache_tensors", lambda: tuple(t for t in every if t.cls != "mtp")))

    def _tensors(self, include_mtp: bool) -> list:
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
        """(total, active) parameters, embeddings and head counted, MTP excluded, norms included;
        counted once per model."""
        return self.cached_view("_cache_param_counts",
                                lambda: _lowering_cache.memo("params", catalog_key(self), self._count_params))

    def _count_params(self) -> tuple:
        # each layer's (top-k, experts): the routed experts one token uses, looked up once per layer
        routed = [(l.ffn.top_k, l.ffn.n_experts) for l in self.layers]
        total = active = 0
        for t in self.tensors(include_mtp=False):
            if t.cls == "mtp":
                continue
            n = math.prod(t.shape)
            total += n
            if t.cls == "routed_experts" and 0 <= t.layer < len(routed) and routed[t.layer][1]:
                k, e = routed[t.layer]
                active += n * k / e
            else:
                active += n
        return total, active

    def kv_terms(self, layer: Layer, indexer_bytes: float | None = None) -> KVTerms:
        """Cache bytes of one layer for one sequence, as the affine/capped terms of :class:`KVTerms`.

        Element counts are in the KV dtype; ``fixed_bytes`` / ``ratio_fixed_bytes`` are the
        sparse-attention indexer's key cache, whose dtype is its own: *indexer_bytes* per element
        (scales included), by default the catalog's ``indexer_dtype_default`` (fp8 + one fp32 scale
        per 128, what vLLM stores whatever the attention cache's dtype).
        """
        if indexer_bytes is None:
            q = _catalog.load("quants")
            indexer_bytes = float(q["indexer_dtypes"][q["indexer_dtype_default"]["dtype"]]["bytes"])
        a = layer.attention
        if a.kind == "gqa":
            return KVTerms(elems=2 * a.n_kv_heads * a.head_dim, cap=a.window or a.chunk)
        if a.kind == "mla":
            # llama.cpp/FlashMLA cache the compressed latent plus the rope key; V is a view of it.
            fixed = a.index_head_dim * indexer_bytes if a.index_heads else 0.0
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
            # compressor state; ratio 4 layers add an indexer cache of index_head_dim per entry.
            r = a.compress_ratio
            terms = dict(elems=a.head_dim, cap=a.window)
            if r > 0:
                coff = 2 if r == 4 else 1
                state = 2 * r * coff * a.head_dim * 4
                ratio_fixed = 0.0
                if r == 4:
                    ratio_fixed = a.index_head_dim * indexer_bytes
                    state += 2 * r * 2 * a.index_head_dim * 4
                terms.update(ratio=r, ratio_elems=a.head_dim, ratio_fixed_bytes=ratio_fixed,
                             state_bytes=float(state))
            return KVTerms(**terms)
        raise AssertionError(a.kind)


# ---------------------------------------------------------------------------------- tensors
def _layer_tensors(model: Model, layer: Layer, p: str, force_cls: str | None) -> list:
    """One block's tensors under prefix ``p``: its attention (by kind), then its FFN. With ``force_cls``
    (an MTP block) every tensor takes that class and the layer index past the main layers."""
    h = model.hidden
    li = layer.index if force_cls is None else -1
    out = []

    def add(name, shape, cls):
        out.append(Tensor(p + name, tuple(map(int, shape)), force_cls or cls, li if li >= 0 else
                          (model.n_layers if force_cls else -1)))

    def attn(name, shape):
        add(name, shape, "attention")

    attn("attn_norm.weight", (h,))
    a = layer.attention
    if a.kind in _ATTENTION_TENSORS:
        _ATTENTION_TENSORS[a.kind](attn, a, h)
    attn("ffn_norm.weight", (h,))
    if layer.ffn.kind == "dense":
        _dense_ffn_tensors(add, layer.ffn, h)
    else:
        _moe_ffn_tensors(add, layer.ffn, h)
    return out


def _gqa_tensors(attn, a, h: int) -> None:
    """Grouped-query attention: Q (doubled by an output gate), K, V, O; optional biases, QK norms, sinks."""
    q_out = a.n_heads * a.head_dim * (2 if a.output_gate else 1)
    kv_out = a.n_kv_heads * a.head_dim
    attn("attn_q.weight", (h, q_out))
    attn("attn_k.weight", (h, kv_out))
    attn("attn_v.weight", (h, kv_out))
    attn("attn_output.weight", (a.n_heads * a.head_dim, h))
    if a.bias:
        attn("attn_q.bias", (q_out,))
        attn("attn_k.bias", (kv_out,))
        attn("attn_v.bias", (kv_out,))
    if a.qk_norm:
        attn("attn_q_norm.weight", (a.head_dim,))
        attn("attn_k_norm.weight", (a.head_dim,))
    if a.sinks:
        attn("attn_sinks.weight", (a.n_heads,))
        attn("attn_output.bias", (h,))


def _mla_tensors(attn, a, h: int) -> None:
    """Multi-head latent attention (DeepSeek): low-rank Q (or full Q), the compressed KV with its split
    K/V up-projections as llama.cpp stores them, an optional gate and the DSA lightning indexer."""
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    if a.q_lora_rank:
        attn("attn_q_a.weight", (h, a.q_lora_rank))
        attn("attn_q_a_norm.weight", (a.q_lora_rank,))
        attn("attn_q_b.weight", (a.q_lora_rank, a.n_heads * qk))
    else:
        attn("attn_q.weight", (h, a.n_heads * qk))
    attn("attn_kv_a_mqa.weight", (h, a.kv_lora_rank + a.qk_rope_head_dim))
    attn("attn_kv_a_norm.weight", (a.kv_lora_rank,))
    attn("attn_k_b.weight", (a.qk_nope_head_dim, a.kv_lora_rank, a.n_heads))
    attn("attn_v_b.weight", (a.kv_lora_rank, a.v_head_dim, a.n_heads))
    attn("attn_output.weight", (a.n_heads * a.v_head_dim, h))
    if a.output_gate:
        attn("attn_gate.weight", (h, a.n_heads * a.v_head_dim))
    if a.own_indexer:
        q_in = a.q_lora_rank or h
        attn("indexer.attn_q_b.weight", (q_in, a.index_heads * a.index_head_dim))
        attn("indexer.attn_k.weight", (h, a.index_head_dim))
        attn("indexer.k_norm.weight", (a.index_head_dim,))
        attn("indexer.proj.weight", (h, a.index_heads))


def _gdn_tensors(attn, a, h: int) -> None:
    """Gated DeltaNet linear attention (Qwen3-Next): fused in-projection, conv, decay and out-projection."""
    qk = a.lin_k_heads * a.lin_k_dim
    vd = a.lin_v_heads * a.lin_v_dim
    attn("ssm_in.weight", (h, 2 * qk + 2 * vd))
    attn("ssm_beta_alpha.weight", (h, 2 * a.lin_v_heads))
    attn("ssm_conv1d.weight", (a.conv_kernel, 2 * qk + vd))
    attn("ssm_dt.bias", (a.lin_v_heads,))
    attn("ssm_a", (a.lin_v_heads,))
    attn("ssm_norm.weight", (a.lin_v_dim,))
    attn("ssm_out.weight", (vd, h))


def _kda_tensors(attn, a, h: int) -> None:
    """Kimi Delta Attention (Kimi-Linear): separate Q/K/V/O, conv, a full- or low-rank forget gate and a
    low-rank output gate."""
    qk = a.lin_k_heads * a.lin_k_dim
    vd = a.lin_v_heads * a.lin_v_dim
    attn("attn_q.weight", (h, qk))
    attn("attn_k.weight", (h, qk))
    attn("attn_v.weight", (h, vd))
    attn("attn_output.weight", (vd, h))
    attn("ssm_conv1d.weight", (a.conv_kernel, 2 * qk + vd))
    if a.full_rank_gate:
        attn("ssm_f.weight", (h, qk))
    else:
        attn("ssm_f_a.weight", (h, a.lin_k_dim))
        attn("ssm_f_b.weight", (a.lin_k_dim, qk))
    attn("ssm_g_a.weight", (h, a.lin_v_dim))
    attn("ssm_g_b.weight", (a.lin_v_dim, vd))
    attn("ssm_beta.weight", (h, a.lin_v_heads))
    attn("ssm_a", (a.lin_v_heads,))
    attn("ssm_dt.bias", (qk,))
    attn("ssm_norm.weight", (a.lin_v_dim,))


def _dsv4_tensors(attn, a, h: int) -> None:
    """DeepSeek-V4 attention: low-rank Q, one shared KV head, grouped low-rank output, sinks; compressed
    layers add the KV compressor (and at ratio 4 the indexer); hyper-connection mixers when hc_mult."""
    attn("attn_q_a.weight", (h, a.q_lora_rank))
    attn("attn_q_a_norm.weight", (a.q_lora_rank,))
    attn("attn_q_b.weight", (a.q_lora_rank, a.n_heads * a.head_dim))
    attn("attn_kv.weight", (h, a.head_dim))
    attn("attn_kv_norm.weight", (a.head_dim,))
    attn("attn_o_a.weight", (a.n_heads * a.head_dim // a.o_groups, a.o_groups * a.o_lora_rank))
    attn("attn_o_b.weight", (a.o_groups * a.o_lora_rank, h))
    attn("attn_sinks.weight", (a.n_heads,))
    if a.compress_ratio:
        coff = 2 if a.compress_ratio == 4 else 1
        attn("attn_comp_kv.weight", (h, a.head_dim * coff))
        attn("attn_comp_gate.weight", (h, a.head_dim * coff))
        attn("attn_comp_ape.weight", (a.head_dim * coff, a.compress_ratio))
        if a.compress_ratio == 4:
            attn("indexer.attn_q_b.weight", (a.q_lora_rank, a.index_heads * a.index_head_dim))
            attn("indexer.proj.weight", (h, a.index_heads))
            attn("indexer.comp_kv.weight", (h, a.index_head_dim * 2))
            attn("indexer.comp_gate.weight", (h, a.index_head_dim * 2))
    if a.hc_mult:
        mix = (2 + a.hc_mult) * a.hc_mult
        attn("hc_attn_fn.weight", (a.hc_mult * h, mix))
        attn("hc_ffn_fn.weight", (a.hc_mult * h, mix))


# attention kind -> the function adding its tensors (a kind not listed adds none beyond the norms)
_ATTENTION_TENSORS = {"gqa": _gqa_tensors, "mla": _mla_tensors, "gdn": _gdn_tensors, "kda": _kda_tensors,
                      "dsv4": _dsv4_tensors}


def _dense_ffn_tensors(add, f, h: int) -> None:
    """A dense SwiGLU FFN: gate, up, down."""
    add("ffn_gate.weight", (h, f.intermediate), "dense_ffn")
    add("ffn_up.weight", (h, f.intermediate), "dense_ffn")
    add("ffn_down.weight", (f.intermediate, h), "dense_ffn")


def _moe_ffn_tensors(add, f, h: int) -> None:
    """A MoE FFN: router (+ bias, + latent projections), stacked routed experts (+ biases), shared experts."""
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


def _parse(cfg: dict, id: str, meta: dict) -> Model:
    mt = str(cfg.get("model_type", "")).lower()
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and mt in ("kimi_k3", "llama4", "gemma3"):
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
    max_ctx = _opt_int(c, "max_position_embeddings", _opt_int(c, "max_seq_len", 0)) or 0
    if max_ctx <= 0:
        raise MoesimError("config lacks max_position_embeddings", "max_position_embeddings")
    mtp_layers = int(extra.pop("mtp_layers", 0) or 0)
    # Gemma and Cohere configs omit tie_word_embeddings: their transformers config classes default it on
    tie = bool(_opt(c, "tie_word_embeddings", extra.pop("tie_default", False)))
    scheme = scheme_from_config({"quantization_config": cfg.get("quantization_config"),
                                 "expert_dtype": c.get("expert_dtype", cfg.get("expert_dtype"))})
    return Model(
        id=id,
        name=meta.get("name", id),
        family=family,
        hidden=hidden,
        vocab=vocab,
        tie_embeddings=tie,
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
def hf_ids(id: str) -> list:
    """The Hugging Face repo ids that are aliases of catalog model *id*."""
    return list(_catalog.load("models")["models"][_require_id(id)].get("hf_ids", []))


def _require_id(id: str) -> str:
    if not isinstance(id, str):
        raise MoesimError(f"expected a model id string, got {type(id).__name__}", "model")
    mid = resolve_model_id(id)
    if mid is None:
        entries = _catalog.load("models")["models"]
        # nearest catalog ids and, for an 'org/name', the nearest Hugging Face aliases
        raise unknown_id("model", id, list(entries) + list(_hf_alias_names()), "model")
    return mid


def _hf_alias_names() -> list:
    entries = _catalog.load("models")["models"]
    return [a for e in entries.values() for a in e.get("hf_ids", [])]


def catalog_model(id: str) -> Model:
    """The catalog model *id* (``catalog/models.toml``) or the entry whose ``hf_ids`` lists that Hugging
    Face repo id, parsed once and cached. Paths are read by :func:`moesim.ingest.model`, which falls back
    to this."""
    key = _require_id(id)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    m = _lowering_cache.memo("model", key, lambda: _parse_entry(key))
    object.__setattr__(m, "_catalog_id", key)
    _MODEL_CACHE[key] = m
    return m


def _parse_entry(key: str) -> Model:
    entries = _catalog.load("models")["models"]
    entry = entries[key]
    meta = {k: v for k, v in entry.items() if k not in ("config", "base", "hf_ids")}
    return _shared_specs(_parse(_merged_config(entries, key), key, meta))


_SPECS: dict = {}          # layer spec (Attention, FFN) -> the one instance catalog models hold


def _shared_specs(m: Model) -> Model:
    """*m*, just parsed, with equal layer specs (most layers' attention and FFN) one shared instance
    across the catalog: the same values, a fifth the size pickled (the lowering cache's model file).
    Specs are frozen values, so sharing one is safe; the layers are set before anything else sees them."""
    for layer in m.layers + ((m.mtp_layer,) if m.mtp_layer is not None else ()):
        object.__setattr__(layer, "attention", _SPECS.setdefault(layer.attention, layer.attention))
        object.__setattr__(layer, "ffn", _SPECS.setdefault(layer.ffn, layer.ffn))
    return m


def catalog_key(m: Model) -> "str | None":
    """The catalog id of a model :func:`catalog_model` returned (a pure function of that catalog entry
    and moesim's code, so the persistent lowering cache, moesim._lowering_cache, may key on it); None for
    any other model (read from a file, changed by overrides, unpickled: its views are built, not cached)."""
    return m.__dict__.get("_catalog_id")


def is_catalog_id(text: str) -> bool:
    """Does *text* name a catalog model (its id or one of its Hugging Face ids)?"""
    return isinstance(text, str) and resolve_model_id(text) is not None


# The artifact readers (GGUF, safetensors, config.json on disk) live in moesim.ingest, the layer above;
# it registers them here when imported (``import moesim`` does), so that Model.from_gguf and friends stay
# where users look for them without this layer importing upward.
ARTIFACT_READERS: dict = {}


def _artifact_reader(kind: str):
    reader = ARTIFACT_READERS.get(kind)
    if reader is None:
        raise MoesimError(f"no {kind} reader registered: import moesim.ingest first", "model")
    return reader


def hf_config(id: str) -> dict:
    """The catalog entry's HF config dict (what ``Model.from_hf_config`` would be given)."""
    return _merged_config(_catalog.load("models")["models"], _require_id(id))
