"""llama.cpp's choice of a ggml type for each tensor of a GGUF file (llama_tensor_get_type and its
quantize_state_impl counters, src/llama-quant.cpp, LQ in quants.toml's sources): the rules by tensor
role and layer, the fallbacks for rows a type's blocks do not divide, and the walk over a model's
tensors in file order. ``spec.quants`` owns the tables (ggml_types, ftypes) and calls :func:`gguf_assign`."""
from __future__ import annotations

import math

import numpy as np

from .layers import Tensor
from .models import Model


def _quantizable(t: Tensor) -> bool:
    """llama.cpp quantizes tensors named '*weight' with >= 2 dims, except norms, routers, convs."""
    name = t.name
    if not name.endswith("weight") or len(t.shape) < 2:
        return False
    if "_norm.weight" in name or "ffn_gate_inp" in name or "ssm_conv1d" in name or "pos_embd" in name:
        return False
    return True


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    # Integer division as in C; (i - n/8) % 3 is only evaluated for i >= n/8, so no negative modulo.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_FALLBACK = {"TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
             "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "Q2_K": "IQ4_NL",
             "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_VERY_LOW = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}


class _GGUFState:
    """The counters llama.cpp's quantize_state_impl keeps while walking tensors in file order."""

    def __init__(self, model: Model, plan: "_WalkPlan", types: dict):
        self.types = types
        self.n_layer = model.n_layers
        self.n_expert = max(1, model.n_experts)
        a0 = model.layers[0].attention
        self.n_gqa = a0.n_heads // a0.n_kv_heads if a0.kind == "gqa" and a0.n_kv_heads else 1
        self.is_70b = model.family == "llama" and model.n_layers == 80
        self.n_attention_wv = plan.n_attention_wv
        self.has_output = plan.has_output
        self.i_attention_wv = 0
        self.i_ffn_down = 0


# Rules of the tables below: ``(state, i, n) -> type | None`` (None keeps the base type), ``i`` the
# role's counter (attn_v tensor or layer index), ``n`` its total.
def _gqa4(hi: str, lo: "str | None" = None):
    """Rule: ``hi`` for grouped-query attention with >= 4 query heads per KV head, else ``lo``."""
    return lambda s, i, n: hi if s.n_gqa >= 4 else lo


def _first_eighth(hi: str, lo: "str | None" = None):
    """Rule: ``hi`` for the first n/8 layers, else ``lo``."""
    return lambda s, i, n: hi if i < n // 8 else lo


def _more_bits(hi: str):
    """Rule: ``hi`` on the layers use_more_bits picks (first and last eighth, every third between)."""
    return lambda s, i, n: hi if use_more_bits(i, n) else None


# llama_tensor_get_type's per-ftype overrides, one table per tensor role: ftype -> a type or a rule.
_ATTN_V_TYPES = {
    "Q2_K": _gqa4("Q4_K", "Q3_K"), "Q2_K_S": _gqa4("Q4_K"),
    "IQ3_XXS": _gqa4("Q4_K", "IQ3_S"),   # no imatrix
    "IQ3_XS": _gqa4("Q4_K"), "IQ3_S": _gqa4("Q4_K"), "IQ3_M": "Q4_K",
    "Q3_K_M": lambda s, i, n: "Q5_K" if i < 2 else "Q4_K", "Q3_K_L": "Q5_K",
    "IQ4_NL": _gqa4("Q5_K"), "IQ4_XS": _gqa4("Q5_K"),
    "Q4_K_M": _more_bits("Q6_K"), "Q5_K_M": _more_bits("Q6_K"),
    "Q4_K_S": lambda s, i, n: "Q5_K" if i < 4 else None,
}
_FFN_DOWN_TYPES = {
    "Q2_K": "Q3_K", "Q2_K_S": _first_eighth("Q4_K"), "IQ3_XXS": _first_eighth("Q4_K", "Q3_K"),
    "Q3_K_M": lambda s, i, n: "Q5_K" if i < n // 16 else "Q4_K",
    "IQ3_M": lambda s, i, n: "Q4_K" if i < n // 8 or (s.n_expert == 8 and use_more_bits(i, n)) else None,
    "Q3_K_L": "Q5_K", "Q4_K_M": _more_bits("Q6_K"),
    "IQ4_NL": _first_eighth("Q5_K"), "IQ4_XS": _first_eighth("Q5_K"),
    "Q5_K_M": _more_bits("Q6_K"), "Q4_K_S": _first_eighth("Q5_K"),
}
_TOKEN_EMBD_TYPES = {"IQ2_XXS": "Q2_K", "IQ2_XS": "Q2_K", "IQ1_S": "Q2_K", "IQ1_M": "Q2_K",
                     "IQ2_S": "IQ3_S", "IQ2_M": "IQ3_S", "IQ3_XXS": "IQ3_S", "TQ1_0": "Q4_K", "TQ2_0": "Q4_K"}
_ATTN_QK_TYPES = {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}          # attn_k (fewer than 8 experts), attn_q
_ATTN_OUTPUT_TYPES = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}
_ATTN_OUTPUT_8_EXPERTS = {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M",
                          "IQ3_S", "IQ3_M", "IQ4_XS"}                # -> Q5_K with 8 experts
_ATTN_QKV_TYPES = {"Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "IQ3_M": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}
_OUTPUT_VERY_LOW = {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}   # output -> Q5_K


def _table_type(table: dict, ftype: str, base: str, s: "_GGUFState", i: int = 0, n: int = 0) -> str:
    """The type ``table`` gives ``ftype`` (a type or a rule), ``base`` when it gives none."""
    rule = table.get(ftype)
    new = rule(s, i, n) if callable(rule) else rule
    return base if new is None else new


def _gguf_type(ftype: str, base: str, t: Tensor, s: _GGUFState, types: dict) -> str:
    """llama_tensor_get_type, for one tensor that is being quantized."""
    return _fit_block(_role_type(ftype, base, t, s), t.shape[0], types)


def _role_type(ftype: str, base: str, t: Tensor, s: _GGUFState) -> str:
    """The type llama.cpp picks by the tensor's role (its name), in llama.cpp's order of checks."""
    name = t.name
    if ftype == "MXFP4_MOE":
        # MXFP4 for stacked expert tensors (ne[2] > 1), Q8_0 for everything else (quants.md §2.4).
        return "MXFP4" if len(t.shape) > 2 and t.shape[2] > 1 else "Q8_0"
    if name == "output.weight" or (not s.has_output and name == "token_embd.weight"):
        return _output_type(ftype, base, t, s.types)
    if name == "token_embd.weight":
        return _TOKEN_EMBD_TYPES.get(ftype, base)
    if ftype in _VERY_LOW:
        return _very_low_type(ftype, base, name, s)
    if "attn_v.weight" in name:
        return _attn_v_type(ftype, base, s)
    if "attn_k.weight" in name:
        return "Q8_0" if s.n_expert == 8 else _ATTN_QK_TYPES.get(ftype, base)
    if "attn_q.weight" in name:
        return _ATTN_QK_TYPES.get(ftype, base)
    if "ffn_down" in name:
        layer = t.layer if t.layer >= 0 else s.i_ffn_down
        s.i_ffn_down += 1
        return _table_type(_FFN_DOWN_TYPES, ftype, base, s, layer, s.n_layer)
    if "attn_output.weight" in name:
        if s.n_expert == 8:
            return "Q5_K" if ftype in _ATTN_OUTPUT_8_EXPERTS else base
        return _ATTN_OUTPUT_TYPES.get(ftype, base)
    if "attn_qkv.weight" in name:
        return _ATTN_QKV_TYPES.get(ftype, base)
    if ("ffn_gate" in name or "ffn_up" in name) and ftype == "IQ3_XS":
        layer = t.layer if t.layer >= 0 else s.i_ffn_down
        if s.n_layer // 8 <= layer < 7 * s.n_layer // 8:
            return "IQ3_XXS"
    return base


def _output_type(ftype: str, base: str, t: Tensor, types: dict) -> str:
    """The output projection (or a tied token embedding): Q8_0 when its rows do not fit the base type's
    blocks, Q5_K for the very low ftypes, else Q6_K unless the base is already Q8_0."""
    if t.shape[0] % types[base]["block"] != 0:
        return "Q8_0"
    if ftype in _OUTPUT_VERY_LOW:
        return "Q5_K"
    return base if base == "Q8_0" else "Q6_K"


def _very_low_type(ftype: str, base: str, name: str, s: _GGUFState) -> str:
    """The 1-2 bit ftypes' own rules (llama.cpp checks them before the per-role ones), with the
    attn_v and ffn_down counters advanced as llama.cpp advances them."""
    low_k = "IQ3_S" if ftype in ("IQ2_S", "IQ2_M") else "Q2_K"
    if "attn_v.weight" in name:
        s.i_attention_wv += 1
        return "Q4_K" if s.n_gqa >= 4 or s.n_expert >= 4 else low_k
    if s.n_expert == 8 and "attn_k.weight" in name:
        return "Q4_K"
    if "ffn_down" in name:
        # This branch counts ffn_down tensors, not layers (LQ).
        new = low_k if s.i_ffn_down < s.n_layer // 8 else base
        s.i_ffn_down += 1
        return new
    if "attn_output.weight" in name:
        if s.n_expert == 8:
            return "Q5_K"
        if ftype in ("IQ1_S", "IQ1_M"):
            return "IQ2_XXS"
        if ftype in ("IQ2_S", "IQ2_M"):
            return "IQ3_S"
    return base


def _attn_v_type(ftype: str, base: str, s: _GGUFState) -> str:
    """attn_v by its ftype rule, then raised to Q5_K on 70B llamas and to Q8_0 with 8 experts."""
    new = _table_type(_ATTN_V_TYPES, ftype, base, s, s.i_attention_wv, s.n_attention_wv)
    if s.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"
    if s.n_expert == 8:
        new = "Q8_0"
    s.i_attention_wv += 1
    return new


def _fit_block(new: str, ne0: int, types: dict) -> str:
    """A type whose block does not divide the rows falls back (llama.cpp's fallback table), then to F16."""
    if ne0 % types[new]["block"] != 0:
        new = _FALLBACK.get(new, new)
        if ne0 % types[new]["block"] != 0:
            new = "F16"
    return new


_COUNTED_ROLES, _IQ3_XS_ROLES = ("attn_v.weight", "ffn_down"), ("ffn_gate", "ffn_up")


def _role(name: str) -> str:
    """A tensor's name with its block number replaced, ``blk.12.attn_v.weight`` -> ``blk.*.attn_v.weight``
    (what ``re.sub(r"^blk\\.\\d+\\.", "blk.*.", name)`` gives, without the regex: one call per tensor)."""
    head, dot, rest = name.partition(".")
    if head == "blk":
        num, dot2, tail = rest.partition(".")
        if dot2 and num.isdecimal():          # \d: any Unicode decimal digit, as isdecimal
            return "blk.*." + tail
    return name


class _WalkPlan:
    """A model's tensors (in file order) as llama.cpp's walk sees them, once per model: each tensor's
    (role, shape) key with one representative tensor per key; the tensors whose type may depend on the
    walk's counters or their layer (quantized attn_v / ffn_down, and gate / up, which IQ3_XS lowers
    mid-model), in file order; element counts; and the two facts the walk's state reads off the list."""

    def __init__(self, model: Model, include_mtp: bool):
        tensors = model.tensors(include_mtp)
        keys: dict = {}
        self.tensors = tuple(tensors)
        self.reps = []                   # per key: (representative tensor, quantizable, counted, gate_up)
        key_of, counted_at, gate_up_at = [], [], []
        for i, t in enumerate(tensors):
            role = _role(t.name)
            k = keys.get((role, t.shape))
            if k is None:
                k = keys[(role, t.shape)] = len(self.reps)
                self.reps.append((t, _quantizable(t), any(c in role for c in _COUNTED_ROLES),
                                  any(c in role for c in _IQ3_XS_ROLES)))
            key_of.append(k)
            _, quantizable, counted, gate_up = self.reps[k]
            if quantizable and counted:
                counted_at.append(i)
            elif quantizable and gate_up:
                gate_up_at.append(i)
        self.key_of = np.array(key_of, dtype=np.int64)
        self.counted_at = counted_at
        self.walked_iq3_xs = sorted(counted_at + gate_up_at)
        self.numel = np.array([math.prod(t.shape) for t in tensors], dtype=np.int64)   # Tensor.n_elements
        # quantized routed-expert tensors: what keeps a checkpoint's native expert type (gguf_type_index)
        self.routed_quantized = np.array([t.cls == "routed_experts" and self.reps[k][1]
                                          for t, k in zip(tensors, key_of)], dtype=bool)
        self.n_attention_wv = sum(1 for t in tensors if t.name.endswith("attn_v.weight"))
        self.has_output = any(t.name == "output.weight" for t in tensors)


def _walk_plan(model: Model, include_mtp: bool) -> _WalkPlan:
    return model.cached_view("_cache_gguf_walk_mtp" if include_mtp else "_cache_gguf_walk",
                             lambda: _WalkPlan(model, include_mtp))


def gguf_type_index(model: Model, ftype: str, base: str, types: dict, include_mtp: bool,
                    native_experts: "str | None" = None) -> tuple:
    """(ggml type names, each tensor's index into them, each tensor's bytes as int64), in file order:
    llama.cpp's per-tensor types for file type *ftype* (base type *base*; *types*: quants.toml's
    ggml_types). A tensor whose type depends on neither its layer nor the walk's counters gets its (role,
    shape)'s type, computed once; only the others are walked, in file order (the counters advance on them
    alone, so the walk over them equals llama.cpp's over every tensor). *native_experts*: the ggml type
    the checkpoint's routed experts already have, which they keep whatever the file type (quants.toml
    gguf_native_experts); the walk's counters still advance over them, as llama.cpp's do."""
    plan = _walk_plan(model, include_mtp)
    s = _GGUFState(model, plan, types)
    mixture = types[base]["block"] > 1  # llama.cpp applies its rules only to quantized ftypes
    names: dict = {}
    key_type = np.empty(len(plan.reps), dtype=np.int64)
    for k, (t, quantizable, _counted, _gate_up) in enumerate(plan.reps):
        if not quantizable or not mixture:
            typ = base if quantizable else "F32"
        else:                            # walked tensors of this key overwrite it below
            typ = _gguf_type(ftype, base, t, s, types) if not _counted else base
        key_type[k] = names.setdefault(typ, len(names))
    tix = key_type[plan.key_of]
    if mixture:
        s = _GGUFState(model, plan, types)
        for i in plan.walked_iq3_xs if ftype == "IQ3_XS" else plan.counted_at:
            tix[i] = names.setdefault(_gguf_type(ftype, base, plan.tensors[i], s, types), len(names))
    if native_experts is not None:
        tix[plan.routed_quantized] = names.setdefault(native_experts, len(names))
    order = list(names)
    block = np.array([types[n]["block"] for n in order], dtype=np.int64)
    per_block = np.array([types[n]["bytes"] for n in order], dtype=np.int64)
    return order, tix, plan.numel // block[tix] * per_block[tix]


def gguf_assign(model: Model, ftype: str, base: str, types: dict, include_mtp: bool,
                native_experts: "str | None" = None) -> list:
    """[(Tensor, ggml type, bytes)]: :func:`gguf_type_index` as one entry per tensor, in file order."""
    order, tix, nbytes = gguf_type_index(model, ftype, base, types, include_mtp, native_experts)
    return [(t, order[i], nb) for t, i, nb in zip(_walk_plan(model, include_mtp).tensors, tix.tolist(),
                                                    nbytes.tolist())]
