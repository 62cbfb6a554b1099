"""Weight formats: which storage type each tensor gets under a quantization, and its exact bytes.

Two kinds of quantization:

* llama.cpp GGUF file types (``Q4_K_M``, ``IQ2_XXS``, ``MXFP4_MOE``, ...): the per-tensor type
  follows llama.cpp's ``llama_tensor_get_type`` (``src/llama-quant.cpp``, reference/quants.md §2),
  including ``use_more_bits`` layer selection, the 8-expert and 70B special cases and the fallback
  for rows not divisible by the block size. Bytes are ``n_elements / block * bytes_per_block``.
* checkpoint formats (``fp8``, ``nvfp4``, ``mxfp4``, ``int4``, ``mlx-4bit``, ...): a format quantizes
  a set of tensor classes and leaves the rest in bf16 (catalog/quants.toml says which and why).

``native`` means the model's own checkpoint format (``Model.native_quant``): for a config with a
``quantization_config`` the per-tensor :class:`moesim.checkpoint.Scheme` read from it; for a model read
from a GGUF file or safetensors headers, the file's own tensor table (kind ``"stored"``: exact type and
bytes of every tensor as stored, no rules applied). Asking for the file's own type by name (``--quant
Q4_K_M`` for a Q4_K_M file) also gives the stored table; any other quant re-derives types by the rules.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from dataclasses import dataclass

from .. import _catalog, _lowering_cache
from .checkpoint import Scheme, hf_module_path
from ..errors import MoesimError, unknown_id
from .models import Model, catalog_key
from .layers import Tensor
from .gguf_types import gguf_assign, gguf_type_index, use_more_bits


_LINEAR_CLASSES = {"attention", "dense_ffn", "shared_experts", "routed_experts", "mtp"}
_FFN_CLASSES = {"dense_ffn", "shared_experts", "routed_experts"}
_EXPERT_CLASSES = {"shared_experts", "routed_experts"}


@dataclass(frozen=True)
class Quant:
    """A resolved quantization.

    ``kind``: ``"gguf"`` (llama.cpp file type, types by llama.cpp's rules), ``"format"`` (checkpoint
    format; with ``scheme`` set, the per-tensor scheme of a ``quantization_config``) or ``"stored"``
    (the exact tensor table of the artifact named by ``origin``: container, then path:size:mtime per file).
    """

    id: str
    kind: str
    scheme: "Scheme | None" = None
    origin: str = ""

    @property
    def is_gguf(self) -> bool:
        return self.kind == "gguf" or self.origin.startswith("gguf:")

    @property
    def is_stored(self) -> bool:
        return self.kind == "stored"


def _tables() -> dict:
    return _catalog.load("quants")


def ggml_types() -> dict:
    return _tables()["ggml_types"]


def ftype_ids() -> list:
    return sorted(_tables()["ftypes"])


def format_ids() -> list:
    return sorted(_tables()["formats"])


def kv_dtype_ids() -> list:
    return sorted(_tables()["kv_dtypes"])


def indexer_dtype_ids() -> list:
    return sorted(_tables()["indexer_dtypes"])


def quant_ids() -> list:
    """Every quantization name ``fit``/``simulate`` accept (aliases excluded)."""
    return ftype_ids() + format_ids() + ["native"]


def stored_quant(model: Model) -> Quant:
    """The :class:`Quant` whose assignment is *model*'s own stored tensor table (GGUF / safetensors)."""
    st = model.stored
    if st is None:
        raise MoesimError(f"{model.id} was not read from a weights file, so it has no stored tensor table", "quant")
    return Quant(st.label, "stored", origin=f"{st.container}:{st.key}")


def native_quant(model: Model) -> Quant:
    """What ``native`` means for *model*: its stored table, its checkpoint scheme, or its native format."""
    if model.stored is not None:
        return stored_quant(model)
    if model.quant_scheme is not None and model.native_quant == model.quant_scheme.label:
        return Quant(model.quant_scheme.label, "format", scheme=model.quant_scheme)
    return resolve(model.native_quant, None)


def resolve(name: "str | Quant", model: Model | None = None) -> Quant:
    """Canonical :class:`Quant` for a user spelling (case-insensitive for GGUF types).

    With a *model* read from a file, ``native``, ``file`` / ``stored`` and the file's own type name
    resolve to the file's exact tensor table.
    """
    if isinstance(name, Quant):
        return name
    if not isinstance(name, str) or not name.strip():
        raise MoesimError(f"expected a quantization name, got {name!r}", "quant")
    raw = name.strip()
    t = _tables()
    if raw.lower() in ("file", "stored") and (model is None or model.stored is None):
        raise MoesimError(f"{raw!r} means the tensor table of a GGUF/safetensors file, and "
                          f"{'no model was given' if model is None else model.id + ' was not read from one'}",
                          "quant")
    if model is not None and (raw.lower() in ("native", "file", "stored")
                              or (model.stored is not None and _same_name(raw, model.stored.label))):
        return native_quant(model)
    if raw.lower() == "native":
        raise MoesimError("'native' needs a model to resolve against", "quant")
    if model is not None and model.quant_scheme is not None and raw.lower() == model.quant_scheme.label.lower() \
            and raw.lower() not in t["formats"] and raw.lower() not in t["format_aliases"] \
            and raw.upper() not in t["ftypes"]:
        return Quant(model.quant_scheme.label, "format", scheme=model.quant_scheme)
    up = raw.upper().replace("-", "_") if not raw.lower().startswith("mlx") else raw
    up = t["ftype_aliases"].get(up, up)
    if up in t["ftypes"]:
        return Quant(up, "gguf")
    low = raw.lower()
    low = t["format_aliases"].get(low, low)
    if low in t["formats"]:
        return Quant(low, "format")
    known = list(t["ftypes"]) + list(t["formats"]) + list(t["ftype_aliases"]) + ["native"]
    raise unknown_id("quantization", raw, known, "quant")


def _same_name(a: str, b: str) -> bool:
    """Do two quantization spellings name the same thing (``q4_k_m`` vs ``Q4_K_M``, ``Q4_K`` vs ``Q4_K_M``)?"""
    if a.strip().lower() == b.strip().lower():
        return True
    try:
        return resolve(a) == resolve(b)
    except MoesimError:
        return False


def kv_dtype_parts(name) -> tuple:
    """(attention cache dtype key, indexer cache dtype key or None) of a KV dtype name such as ``fp8`` or
    ``fp8+fp4`` (attention cache fp8, sparse-attention indexer cache fp4)."""
    if not isinstance(name, str):
        raise MoesimError(f"expected a KV dtype name, got {name!r}", "kv_dtype")
    t = _tables()
    hit = _KV_PARTS.get(name)                 # a sweep asks for the same few names per group, many times
    if hit is not None and hit[0] is t:
        return hit[1]
    parts = _kv_dtype_parts(name, t)
    if len(_KV_PARTS) > 256:
        _KV_PARTS.clear()
    _KV_PARTS[name] = (t, parts)               # per catalog table object: a reloaded catalog parses again
    return parts


_KV_PARTS: dict = {}                           # name -> (the quant tables it was read from, its parts)


def _kv_dtype_parts(name: str, t: dict) -> tuple:
    attn, plus, idx = name.strip().lower().partition("+")
    attn = t["kv_dtype_aliases"].get(attn.strip(), attn.strip())
    if attn not in t["kv_dtypes"]:
        raise unknown_id("KV cache dtype", name, t["kv_dtypes"], "kv_dtype")
    if not plus:
        return attn, None
    idx = t["kv_dtype_aliases"].get(idx.strip(), idx.strip())
    if idx not in t["indexer_dtypes"]:
        raise MoesimError(f"KV dtype {name!r}: the indexer cache dtype after '+' must be one of "
                          f"{', '.join(sorted(t['indexer_dtypes']))}", "kv_dtype")
    return attn, idx


def kv_dtype_bytes(name: str) -> float:
    """Bytes per cached element for a KV dtype name (``f16``, ``q8_0``, ``fp8``, ``fp8+fp4`` ...)."""
    return float(_tables()["kv_dtypes"][kv_dtype_parts(name)[0]]["bytes"])


def canonical_kv_dtype(name: str) -> str:
    attn, idx = kv_dtype_parts(name)
    return attn if idx is None else f"{attn}+{idx}"


def indexer_dtype(kv_dtype: str | None) -> str:
    """The sparse-attention indexer cache's dtype under a KV dtype: the one after '+', else the default
    (the runtime's own format, whatever the attention cache's dtype; catalog ``indexer_dtype_default``)."""
    idx = kv_dtype_parts(kv_dtype)[1] if kv_dtype is not None else None
    return idx or _tables()["indexer_dtype_default"]["dtype"]


def indexer_dtype_bytes(kv_dtype: str | None) -> float:
    """Bytes per indexer-cache element (scales included) under a KV dtype (:func:`indexer_dtype`)."""
    return float(_tables()["indexer_dtypes"][indexer_dtype(kv_dtype)]["bytes"])


def dtype_source(kind: str, name: str) -> str:
    """The catalog source of a KV (``kind`` "kv") or indexer (``kind`` "indexer") cache dtype."""
    t = _tables()
    if kind == "indexer":
        return t["indexer_dtypes"][name]["source"]
    return t["kv_dtypes"][kv_dtype_parts(name)[0]]["source"]


# ------------------------------------------------------------------------------------- bytes
def ggml_bytes(shape: tuple, type_name: str) -> int:
    """Exact bytes of a ggml tensor: rows of ``ne0`` elements in blocks of the type."""
    info = ggml_types()[type_name]
    n = math.prod(shape)
    return n // info["block"] * info["bytes"]


def format_bytes(shape: tuple, spec: dict, bits: int | None = None) -> float:
    """Bytes of one tensor stored in a checkpoint format (payload + scales/zeros + per-tensor extras)."""
    n = math.prod(shape)
    bits = spec["bits"] if bits is None else bits
    total = n * bits / 8
    ne0 = shape[0]
    rows = n // ne0 if ne0 else 0
    if "block2d" in spec and len(shape) >= 2:
        b = spec["block2d"]
        # an int (square blocks) or HF weight_block_size [out_block, in_block]; ne0 is the input dim
        b_out, b_in = (b, b) if isinstance(b, int) else (b[0], b[1])
        blocks = math.ceil(shape[0] / b_in) * math.ceil(shape[1] / b_out) * (math.prod(shape[2:]) if len(shape) > 2 else 1)
        total += blocks * spec["scale_bits"] / 8
    elif "group" in spec:
        groups = math.ceil(ne0 / spec["group"]) * rows
        total += groups * (spec.get("scale_bits", 0) + spec.get("zero_bits", 0)) / 8
    if "per_row_scale_bits" in spec:
        total += rows * spec["per_row_scale_bits"] / 8
    if "in_index_bits" in spec:   # GPTQ g_idx: one int32 per input channel of each matrix
        total += ne0 * (math.prod(shape[2:]) if len(shape) > 2 else 1) * spec["in_index_bits"] / 8
    total += spec.get("tensor_bytes", 0)
    return total


# ------------------------------------------------------------------------------------- formats
def _scheme_choice(scheme: Scheme, model: Model, t: Tensor) -> "tuple[str, dict] | None":
    """(label, format spec) a checkpoint scheme stores tensor *t* in; None if unquantized."""
    linear = t.name.endswith("weight") and len(t.shape) >= 2 and "_norm" not in t.name
    cls = t.cls if t.cls != "mtp" else _mtp_class(t.name)
    if not linear or cls in ("embeddings", "router"):
        return None
    hit = scheme.format_for(hf_module_path(model.family, t, model.n_layers), cls)
    if hit is None:
        return None
    return hit[0], dict(hit[1])


def _scheme_assign(model: Model, q: Quant, tensors: list) -> list:
    bf16 = _tables()["formats"]["bf16"]
    out = []
    for t in tensors:
        hit = _scheme_choice(q.scheme, model, t)
        label, spec = hit if hit is not None else ("bf16", bf16)
        out.append((t, label, format_bytes(t.shape, spec)))
    return out


def _format_assign(model: Model, q: Quant, tensors: list) -> list:
    if q.scheme is not None:
        return _scheme_assign(model, q, tensors)
    formats = _tables()["formats"]
    spec = formats[q.id]
    targets = spec["targets"]
    native = native_quant(model) if model.native_quant else Quant("bf16", "format")
    bf16 = formats["bf16"]
    others = formats.get(spec.get("others", ""), None)
    n_layer = model.n_layers
    out = []
    for t in tensors:
        linear = t.name.endswith("weight") and len(t.shape) >= 2 and "_norm" not in t.name
        cls = t.cls if t.cls != "mtp" else _mtp_class(t.name)
        chosen, label, bits = bf16, "bf16", None
        if targets == "all":
            chosen, label = spec, q.id
        elif targets in ("mlx", "mlx-mixed"):
            if linear and t.shape[0] % spec["group"] == 0:
                chosen, label = spec, q.id
                if cls == "router":
                    bits = 8  # mlx-lm keeps MoE gates at 8 bits
                if targets == "mlx-mixed":
                    hi = (t.name == "output.weight"
                          or (("attn_v." in t.name or "ffn_down" in t.name) and t.layer >= 0
                              and use_more_bits(t.layer, n_layer)))
                    if hi:
                        bits = spec["high_bits"]
        elif linear and cls not in ("embeddings", "lm_head", "router"):
            hit = ((targets == "linear" and cls in _LINEAR_CLASSES)
                   or (targets == "ffn" and cls in _FFN_CLASSES)
                   or (targets == "experts" and cls in _EXPERT_CLASSES)
                   or (targets == "routed_experts" and cls == "routed_experts"))
            if hit:
                chosen, label = spec, q.id
            elif cls == "attention" and spec.get("attention") == "native" and native.id != q.id \
                    and native.kind == "format":
                if native.scheme is not None:
                    hit = _scheme_choice(native.scheme, model, t)
                    if hit is not None:
                        label, chosen = hit
                else:
                    chosen, label = formats[native.id], native.id
            elif others is not None:
                chosen, label = others, spec["others"]
        if chosen is bf16 and not linear:
            # norms, biases, sinks: fp32 in GGUF conversions, bf16 in checkpoints; count as bf16.
            label = "bf16"
        out.append((t, label, format_bytes(t.shape, chosen, bits)))
    return out


def _mtp_class(name: str) -> str:
    if "_exps" in name:
        return "routed_experts"
    if "_shexp" in name:
        return "shared_experts"
    return "attention"


def native_expert_type(model: Model) -> "str | None":
    """The ggml type *model*'s checkpoint already stores its routed experts in, which every GGUF file type
    of the model keeps (quants.toml gguf_native_experts: gpt-oss's MXFP4 experts), else None."""
    scheme = model.quant_scheme
    if scheme is None:
        return None
    for g in scheme.groups:
        if "cls:routed_experts" not in g.targets:
            continue
        fmt = dict(g.fmt)
        for typ, layout in _tables().get("gguf_native_experts", {}).items():
            if all(fmt.get(k) == layout[k] for k in ("bits", "group", "scale_bits")):
                return typ
    return None


def check_applicable(model: Model, q: Quant) -> None:
    if q.kind == "stored":
        if model.stored is None or q.origin != f"{model.stored.container}:{model.stored.key}":
            where = q.origin.split(";")[0].rsplit(":", 2)[0]        # "gguf:/path/first-shard.gguf"
            raise MoesimError(f"{q.id!r} is the stored tensor table of {where}, not of {model.id}", "quant")
        return
    if model.n_experts or q.scheme is not None:
        return
    if q.kind == "gguf" and q.id == "MXFP4_MOE":
        raise MoesimError(f"MXFP4_MOE quantizes expert tensors and {model.id} has no experts "
                          "(try Q8_0 or Q4_K_M)", "quant")
    if q.kind == "format" and _tables()["formats"][q.id]["targets"] in ("experts", "routed_experts"):
        raise MoesimError(f"format {q.id!r} quantizes only expert weights and {model.id} has no experts", "quant")


def assign(model: Model, quant: "str | Quant", include_mtp: bool = False) -> list:
    """[(Tensor, storage type, bytes)] for every weight of *model* under *quant*."""
    q = resolve(quant, model)
    check_applicable(model, q)
    if model.stored is None and model.mtp_layer is None:
        include_mtp = False                  # the same tensors either way: one cached walk serves both
    return _assign_cached(model, q, include_mtp)


@functools.lru_cache(maxsize=4096)
def _assign_cached(model: Model, q: Quant, include_mtp: bool) -> list:
    if q.kind == "stored":
        return [e for e in model.stored.table if include_mtp or e[0].cls != "mtp"]
    if q.kind == "gguf":
        return gguf_assign(model, q.id, _tables()["ftypes"][q.id]["base"], ggml_types(), include_mtp,
                           native_expert_type(model))
    return _format_assign(model, q, model.tensors(include_mtp=include_mtp))


# the tensor classes of spec.layers, in the order weight tables number them
WEIGHT_CLASS_NAMES = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn", "embeddings", "lm_head",
                      "mtp")
_CLASS_INDEX = {c: i for i, c in enumerate(WEIGHT_CLASS_NAMES)}


@dataclass(frozen=True, eq=False)
class WeightTable:
    """:func:`assign` as columns, one row per tensor in file order: class (index into
    WEIGHT_CLASS_NAMES), layer (-1: global), storage type (index into ``types``) and bytes. What the
    lowering sums per class, layer and type with numpy instead of a Python loop over tensors."""

    cls: np.ndarray
    layer: np.ndarray
    types: tuple
    type_of: np.ndarray
    nbytes: np.ndarray


def weight_table(model: Model, quant: "str | Quant", include_mtp: bool = False) -> WeightTable:
    """:class:`WeightTable` of *model* under *quant* (the same tensors, types and bytes as :func:`assign`)."""
    q = resolve(quant, model)
    check_applicable(model, q)
    if model.stored is None and model.mtp_layer is None:
        include_mtp = False
    return _weight_table_cached(model, q, include_mtp)


@functools.lru_cache(maxsize=4096)
def _weight_table_cached(model: Model, q: Quant, include_mtp: bool) -> WeightTable:
    if q.kind == "gguf":
        types, type_of, nbytes = gguf_type_index(model, q.id, _tables()["ftypes"][q.id]["base"], ggml_types(),
                                                 include_mtp, native_expert_type(model))
        cls, layer = _tensor_columns(model, include_mtp)
        return WeightTable(cls, layer, tuple(types), type_of, nbytes.astype(np.float64))
    rows = _assign_cached(model, q, include_mtp)
    names: dict = {}
    type_of = np.array([names.setdefault(typ, len(names)) for _, typ, _ in rows], dtype=np.int64)
    return WeightTable(np.array([_CLASS_INDEX[t.cls] for t, _, _ in rows], dtype=np.int64),
                       np.array([t.layer for t, _, _ in rows], dtype=np.int64), tuple(names), type_of,
                       np.array([nb for _, _, nb in rows], dtype=np.float64))


def _tensor_columns(model: Model, include_mtp: bool) -> tuple:
    """(class index, layer) of each of the model's tensors, in file order, once per model."""
    def build():
        ts = model.tensors(include_mtp)
        return (np.array([_CLASS_INDEX[t.cls] for t in ts], dtype=np.int64),
                np.array([t.layer for t in ts], dtype=np.int64))
    return model.cached_view("_cache_tensor_columns_mtp" if include_mtp else "_cache_tensor_columns", build)


def bytes_by_class(model: Model, quant: "str | Quant", include_mtp: bool = False) -> dict:
    """Total weight bytes per tensor class."""
    out = {c: 0.0 for c in ("attention", "router", "shared_experts", "routed_experts", "dense_ffn",
                            "embeddings", "lm_head", "mtp")}
    for t, _typ, nb in assign(model, quant, include_mtp):
        out[t.cls] += nb
    return out


@dataclass(frozen=True)
class KernelMix:
    """Byte shares of a configuration's weights in types whose matmul kernels run at their own rate:
    ``cpu_grid``, codebook-grid i-quants among the weights the CPU multiplies (routed experts; every
    linear layer of a model without them); ``cpu_lut``, the value-table types (IQ4_NL, IQ4_XS, MXFP4) among
    the same weights; ``mmq_kquant`` / ``mmq_mxfp4``, K-quants / MXFP4 among all
    linear weights (llama.cpp's GPU prefill GEMMs); ``fp8`` / ``cpu_fp8``, fp8 checkpoint weights among
    all linear weights (GPU GEMMs on fp8 tensor cores) and among those the CPU multiplies (converted to
    bf16 first); ``fp4_a4`` / ``fp4_a8``, fp4 checkpoint weights among all linear weights whose GEMMs run
    on fp4 tensor cores (W4A4 NVFP4) or at the fp8 rate (W4A8 MXFP4) on GPUs with fp4 tensor cores
    (quants.toml fp4_gemm); ``mv_ext`` / ``mv_ext_k``, the types ggml-metal's small-batch mat-vec takes from 2 /
    4 tokens per step among the dense linear weights (quants.toml metal_mv_ext / metal_mv_ext_k: decode's weight
    reads per step, engine.lower.machine.weight_passes)."""

    cpu_grid: float = 0.0
    cpu_lut: float = 0.0
    mmq_kquant: float = 0.0
    mmq_mxfp4: float = 0.0
    fp8: float = 0.0
    cpu_fp8: float = 0.0
    fp4_a4: float = 0.0
    fp4_a8: float = 0.0
    mv_ext: float = 0.0
    mv_ext_k: float = 0.0


def kernel_mix(model: Model, quant: "str | Quant") -> KernelMix:
    """:class:`KernelMix` of *model* under *quant* (flags of ggml_types and formats in quants.toml)."""
    q = resolve(quant, model)
    check_applicable(model, q)
    return _kernel_mix_cached(model, q)


@functools.lru_cache(maxsize=4096)
def _kernel_mix_cached(model: Model, quant: Quant) -> KernelMix:
    return _lowering_cache.memo("kernel_mix", lowering_key(model, quant), lambda: _kernel_mix(model, quant))


def lowering_key(model: Model, q: Quant, *rest) -> "tuple | None":
    """The persistent lowering cache's key of a catalog model under a quant (and *rest*, plain values
    whose repr is exact), None for a model that is not the catalog's own (spec.models.catalog_key)."""
    mid = catalog_key(model)
    return None if mid is None else (mid, repr(q)) + tuple(repr(r) for r in rest)


def _kernel_mix(model: Model, quant: Quant) -> KernelMix:
    types, formats = ggml_types(), _tables()["formats"]
    wt = weight_table(model, quant)
    nt = len(wt.types)
    # (class, type) -> bytes, summed in file order per pair; the pairs in first-seen order
    pair = wt.cls * nt + wt.type_of
    sums = np.bincount(pair, weights=wt.nbytes)
    seen, first = np.unique(pair, return_index=True)
    by_class_type = {(WEIGHT_CLASS_NAMES[p // nt], wt.types[p % nt]): float(sums[p])
                     for p in seen[np.argsort(first, kind="stable")].tolist()}

    def share(classes: tuple, flag: str, value=True) -> float:
        total = flagged = 0.0
        for (cls, typ), nb in by_class_type.items():
            if cls in classes:
                total += nb
                flagged += nb if (types.get(typ) or formats.get(typ) or {}).get(flag, False) == value else 0.0
        return flagged / total if total > 0 else 0.0

    cpu_cls = ("routed_experts",) if model.n_experts else ("attention", "dense_ffn", "shared_experts")
    linear = ("attention", "dense_ffn", "shared_experts", "routed_experts", "lm_head")
    # mul_mat's weights (routed experts: mul_mat_id); under tied embeddings the output GEMV reads token_embd
    dense = tuple(c for c in linear if c != "routed_experts") + (("embeddings",) if model.tie_embeddings else ())
    return KernelMix(cpu_grid=share(cpu_cls, "cpu_grid"), cpu_lut=share(cpu_cls, "cpu_lut"),
                     mmq_kquant=share(linear, "mmq_kquant"),
                     mmq_mxfp4=share(linear, "mmq_mxfp4"), fp8=share(linear, "fp8"), cpu_fp8=share(cpu_cls, "fp8"),
                     fp4_a4=share(linear, "fp4_gemm", "fp4"), fp4_a8=share(linear, "fp4_gemm", "fp8"),
                     mv_ext=share(dense, "metal_mv_ext"), mv_ext_k=share(dense, "metal_mv_ext_k"))


def alias_note(requested, q: Quant) -> "str | None":
    """The assumption to list when a requested quantization name is modelled as another one (an alias
    of quants.toml: ``UD-Q2_K_XL`` as IQ2_M, ``IQ3_K`` as IQ3_S, ``Q4_K`` as Q4_K_M), else None."""
    if not isinstance(requested, str):
        return None
    raw = requested.strip()
    if raw.lower() in ("native", "file", "stored") or _same_spelling(raw, q.id):
        return None
    return f"quant {raw!r} is modelled as {q.id} (an alias in moesim's quantization catalog)"


def _same_spelling(a: str, b: str) -> bool:
    norm = lambda s: s.strip().lower().replace("-", "_")  # noqa: E731
    return norm(a) == norm(b)
