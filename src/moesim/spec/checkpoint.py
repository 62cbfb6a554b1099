"""Checkpoint quantization schemes: a Hugging Face ``quantization_config`` read into per-tensor formats.

A :class:`Scheme` says, for every weight tensor of a model, which storage format the checkpoint holds it
in: the format of the first config group whose targets match the tensor's Hugging Face module path,
unless an ignore pattern (``ignore`` / ``modules_to_not_convert`` / ``exclude_modules``) matches first;
unmatched linears stay in the checkpoint dtype (bf16). Formats are dicts in the vocabulary of
``catalog/quants.toml`` ``[formats.*]`` (``bits``, ``group``, ``scale_bits``, ``zero_bits``, ``block2d``,
``per_row_scale_bits``, ``tensor_bytes``, ``in_index_bits``) so :func:`moesim.quants.format_bytes` prices
them. Supported ``quant_method`` values:

* ``fp8`` (transformers FineGrainedFP8 / DeepSeek): e4m3 weights, one fp32 ``weight_scale_inv`` per
  ``weight_block_size`` block (per tensor without blocks); ``modules_to_not_convert`` honoured.
* ``mxfp4`` (gpt-oss): the MoE expert linears only (transformers' Mxfp4 quantizer converts the experts
  module), E2M1 in blocks of 32 with an E8M0 scale (quants.md §3).
* ``compressed-tensors`` (llm-compressor: Kimi-K2.5 ``pack-quantized`` int4, ``nvfp4-pack-quantized``,
  ``mxfp4-pack-quantized``, ``float-quantized`` fp8, int8): ``config_groups[*].weights`` (num_bits,
  type, group_size, strategy, symmetric, block_structure) with their ``targets`` and the top-level
  ``ignore`` list (``re:`` prefixed entries are regexes matched at the start of the module path, as in
  compressed-tensors ``is_match``). The flat form the catalog uses for Kimi-K3 (``num_bits``/``type``/
  ``group_size`` at top level, ``targets`` a moesim tensor class) is accepted too.
* ``modelopt`` (NVIDIA ModelOpt ``quant_algo`` NVFP4 / FP8, ``exclude_modules`` fnmatch patterns).
* ``gptq`` / ``awq`` (``bits``, ``group_size``, ``sym``; GPTQ also stores an int32 ``g_idx`` per input
  channel), ``bitsandbytes`` (nf4/fp4 in blocks of 64 with an fp32 absmax, or int8 per row).
* DeepSeek-V4's ``expert_dtype: fp4`` (routed experts fp4, every other linear as quantization_config).

Routers and embeddings are never quantized (they are tiny or looked up); ``lm_head`` only where a
compressed-tensors/modelopt group targets every Linear and no ignore entry names it.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import MoesimError


FIELD = "quantization_config"

# Bits of the per-group scales a format stores when the config does not say (bf16 checkpoints keep
# compressed-tensors / GPTQ scales in the model dtype).
_SCALE16 = 16


def _fmt(**kw) -> tuple:
    """A format as a hashable, sorted tuple of (key, value) items."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kw.items() if v is not None))


FP8_BLOCK128 = _fmt(bits=8, block2d=(128, 128), scale_bits=32)
MXFP4 = _fmt(bits=4, group=32, scale_bits=8)
NVFP4 = _fmt(bits=4, group=16, scale_bits=8, tensor_bytes=8)


@dataclass(frozen=True)
class Group:
    """One quantized group: tensors matching ``targets`` are stored as ``fmt`` (named ``label``)."""

    targets: tuple
    fmt: tuple
    label: str


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint stores its weights, per tensor (see module docstring)."""

    label: str            # what 'native' is called for this checkpoint (fp8, mxfp4, int4-g32, nvfp4, ...)
    method: str           # quant_method
    groups: tuple         # (Group, ...) first match wins
    ignore: tuple = ()    # module patterns left unquantized
    matcher: str = "hf"   # "hf" (transformers should_convert_module), "ct" (compressed-tensors), "glob" (modelopt)
    others: tuple = ()    # format of candidate linears no group matches (DeepSeek-V4: fp8); () = bf16
    others_label: str = ""
    head: bool = False    # may lm_head be quantized (a group targets every Linear)?

    def format_for(self, path: str, cls: str) -> "tuple[str, tuple] | None":
        """(label, format) of the tensor at HF module *path* with moesim class *cls*; None = unquantized."""
        if cls == "lm_head" and not self.head:
            return None
        if any(_ignored(self.matcher, p, path) for p in self.ignore):
            return None
        for g in self.groups:
            if any(_target(self.matcher, t, path, cls) for t in g.targets):
                return g.label, g.fmt
        if self.others and cls != "lm_head":
            return self.others_label, self.others
        return None


def _target(matcher: str, target: str, path: str, cls: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("cls:"):
        return cls == target[4:] or (target[4:] == "experts" and cls in ("routed_experts", "shared_experts"))
    if target.startswith("re:"):
        return _re_match(target[3:], path)
    return path == target or path.endswith("." + target)


def _ignored(matcher: str, pattern: str, path: str) -> bool:
    if matcher == "ct":
        # compressed-tensors is_match: "re:" regexes with re.match, else the exact module name
        # (or its trailing component, as the lists name leaf modules such as "lm_head").
        if pattern.startswith("re:"):
            return _re_match(pattern[3:], path)
        return path == pattern or path.endswith("." + pattern)
    if matcher == "glob":
        # ModelOpt exclude_modules are fnmatch patterns over module names ("*self_attn*", "lm_head").
        return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + ".*") \
            or path.endswith("." + pattern)
    # transformers should_convert_module: the pattern as a regex at the start of the name (a prefix
    # module or a wildcard path), or the name ending with it ("gate" names every router).
    return _re_match(pattern + r"\.", path) or _re_match(pattern, path) or path.endswith(pattern)


def _re_match(pattern: str, path: str) -> bool:
    try:
        return re.match(pattern, path) is not None
    except re.error:
        return False


# ------------------------------------------------------------------------------------ parsing
def _num(q: Mapping, key: str, default=None, where: str = FIELD):
    v = q.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise MoesimError(f"{key} must be a number, got {v!r}", where)
    return v


def _patterns(q: Mapping, *keys) -> tuple:
    out = []
    for k in keys:
        v = q.get(k)
        if v is None:
            continue
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise MoesimError(f"{k} must be a list of module names", FIELD)
        if len(v) > 100_000:
            raise MoesimError(f"{k} lists {len(v)} modules (limit 100000)", FIELD)
        out.extend(v)
    return tuple(out)


def _block(q: Mapping) -> tuple | None:
    b = q.get("weight_block_size") or q.get("block_structure")
    if b is None:
        return None
    if isinstance(b, str):  # compressed-tensors may write "128x128"
        b = [int(x) for x in re.findall(r"\d+", b)]
    if (not isinstance(b, (list, tuple)) or len(b) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1 << 20 for x in b)):
        raise MoesimError(f"weight_block_size must be two positive integers, got {b!r}", FIELD)
    return tuple(b)


def _fp8_fmt(block, strategy: str = "block", scale_bits: int = 32) -> tuple:
    if block:
        return _fmt(bits=8, block2d=block, scale_bits=scale_bits)
    if strategy == "channel":
        return _fmt(bits=8, per_row_scale_bits=scale_bits)
    return _fmt(bits=8, tensor_bytes=scale_bits // 8)


def _int_fmt(bits: int, group: int | None, symmetric: bool, g_idx: bool = False, scale_bits: int = _SCALE16) -> tuple:
    zero = 0 if symmetric else bits
    if group is None or group <= 0:
        return _fmt(bits=bits, per_row_scale_bits=scale_bits + zero, in_index_bits=32 if g_idx else None)
    return _fmt(bits=bits, group=group, scale_bits=scale_bits, zero_bits=zero or None,
                in_index_bits=32 if g_idx else None)


def _int_label(bits: int, group: int | None) -> str:
    if bits == 4 and group == 128:
        return "int4"
    if bits == 4 and group == 32:
        return "int4-g32"
    if bits == 8 and not group:
        return "int8"
    return f"int{bits}" + (f"-g{group}" if group and group > 0 else "")


def _ct_weights(w: Mapping) -> "tuple[str, tuple]":
    """(label, format) of one compressed-tensors ``weights`` quantization args."""
    if not isinstance(w, Mapping):
        raise MoesimError("config_groups[*].weights must be an object", FIELD)
    bits = int(_num(w, "num_bits", 8))
    typ = str(w.get("type", "int")).lower()
    group = w.get("group_size")
    group = int(_num(w, "group_size")) if group is not None else None
    strategy = str(w.get("strategy") or ("group" if group else "tensor")).lower()
    if bits not in (2, 3, 4, 8) or not 0 < (group or 1) <= 1 << 20:
        raise MoesimError(f"unsupported compressed-tensors weights num_bits={bits} group_size={group}", FIELD)
    if typ == "float":
        if bits == 4 and (group == 16 or strategy == "tensor_group"):
            return "nvfp4", NVFP4
        if bits == 4:
            return "mxfp4", _fmt(bits=4, group=group or 32, scale_bits=8)
        if bits == 8:
            return "fp8", _fp8_fmt(_block(w), strategy, scale_bits=32 if strategy == "block" else _SCALE16)
        raise MoesimError(f"unsupported compressed-tensors float weights of {bits} bits", FIELD)
    if typ != "int":
        raise MoesimError(f"unsupported compressed-tensors weights type {typ!r}", FIELD)
    sym = bool(w.get("symmetric", True))
    if strategy in ("channel", "tensor"):
        group = None
    return _int_label(bits, group), _int_fmt(bits, group, sym)


def _compressed_tensors(q: Mapping) -> Scheme:
    ignore = _patterns(q, "ignore")
    groups = []
    head = False
    cg = q.get("config_groups")
    if cg is None:
        # moesim's flat form (catalog kimi-k3): weights args at top level, targets a tensor class.
        label, fmt = _ct_weights(q)
        if "mxfp4" in str(q.get("format", "")):
            label = "mxfp4"
        targets = q.get("targets", "Linear")
        targets = [targets] if isinstance(targets, str) else list(targets)
        from .layers import TENSOR_CLASSES
        tg = tuple(f"cls:{t}" if t in TENSOR_CLASSES or t == "experts" else t for t in targets)
        groups.append(Group(tg, fmt, label))
        head = "Linear" in tg
    else:
        if not isinstance(cg, Mapping) or not cg or len(cg) > 1000:
            raise MoesimError("config_groups must be a non-empty object", FIELD)
        for name in sorted(cg):
            g = cg[name]
            if not isinstance(g, Mapping):
                raise MoesimError(f"config_groups.{name} must be an object", FIELD)
            w = g.get("weights")
            if w is None:
                continue  # activation-only group: weights stay as they are
            label, fmt = _ct_weights(w)
            targets = _patterns(g, "targets") or ("Linear",)
            groups.append(Group(targets, fmt, label))
            head = head or "Linear" in targets
        if not groups:
            raise MoesimError("config_groups quantize no weights", FIELD)
    return Scheme(label=groups[0].label, method="compressed-tensors", groups=tuple(groups), ignore=ignore,
                  matcher="ct", head=head)


def _modelopt(q: Mapping) -> Scheme:
    inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else q
    algo = str(inner.get("quant_algo", "")).upper()
    ignore = _patterns(inner, "exclude_modules", "ignore")
    if algo == "NVFP4":
        group = int(_num(inner, "group_size", 16))
        fmt = NVFP4 if group == 16 else _fmt(bits=4, group=group, scale_bits=8, tensor_bytes=8)
        label = "nvfp4"
    elif algo == "FP8":
        fmt, label = _fmt(bits=8, tensor_bytes=8), "fp8"     # fp32 weight_scale + input_scale per tensor
    else:
        raise MoesimError(f"unsupported ModelOpt quant_algo {algo!r} (supported: NVFP4, FP8)", FIELD)
    return Scheme(label=label, method="modelopt", groups=(Group(("Linear",), fmt, label),), ignore=ignore,
                  matcher="glob", head=True)


def scheme_from_config(cfg: Mapping) -> "Scheme | None":
    """The checkpoint :class:`Scheme` of an HF config (its quantization_config and expert_dtype), or None."""
    q = cfg.get("quantization_config")
    expert_fp4 = str(cfg.get("expert_dtype", "") or "").lower() == "fp4"
    if q is None:
        if expert_fp4:
            return Scheme(label="fp4", method="expert_dtype", groups=(Group(("cls:routed_experts",), MXFP4, "fp4"),))
        return None
    if not isinstance(q, Mapping):
        raise MoesimError("must be an object", FIELD)
    method = str(q.get("quant_method", "")).lower().replace("_", "-")
    if method == "fp8":
        fmt = _fp8_fmt(_block(q))
        ignore = _patterns(q, "modules_to_not_convert", "ignored_layers")
        if expert_fp4:
            # DeepSeek-V4: routed experts fp4 (e2m1, ue8m0 scale per 32, quants.md §3), other linears fp8
            return Scheme(label="fp4", method="fp8+expert_fp4", groups=(Group(("cls:routed_experts",), MXFP4, "fp4"),),
                          ignore=ignore, others=fmt, others_label="fp8")
        return Scheme(label="fp8", method="fp8", groups=(Group(("Linear",), fmt, "fp8"),), ignore=ignore)
    if method == "mxfp4":
        return Scheme(label="mxfp4", method="mxfp4", groups=(Group(("cls:routed_experts",), MXFP4, "mxfp4"),),
                      ignore=_patterns(q, "modules_to_not_convert"))
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "modelopt":
        return _modelopt(q)
    if method in ("gptq", "awq"):
        bits = int(_num(q, "bits", _num(q, "w_bit", 4)))
        group = int(_num(q, "group_size", _num(q, "q_group_size", 128)))
        sym = bool(q.get("sym", method == "gptq" and q.get("zero_point") is None))
        if method == "awq":
            sym = not bool(q.get("zero_point", True))
        if bits not in (2, 3, 4, 8):
            raise MoesimError(f"unsupported {method} bits={bits}", FIELD)
        # GPTQ packs zeros (qzeros) even when symmetric and stores an int32 g_idx per input channel.
        fmt = _int_fmt(bits, group, symmetric=False if method == "gptq" else sym, g_idx=method == "gptq")
        label = _int_label(bits, group if group > 0 else None)
        return Scheme(label=label, method=method, groups=(Group(("Linear",), fmt, label),),
                      ignore=_patterns(q, "modules_to_not_convert"))
    if method == "bitsandbytes":
        if q.get("load_in_8bit"):
            fmt, label = _fmt(bits=8, per_row_scale_bits=32), "int8"
        elif q.get("load_in_4bit"):
            # 4-bit codes in blocks of 64 with an fp32 absmax; double quantization stores the absmax
            # in 8 bits plus one fp32 per 256 blocks (quants.md §3 bitsandbytes).
            dq = bool(q.get("bnb_4bit_use_double_quant"))
            fmt = _fmt(bits=4, group=64, scale_bits=8 + 32 / 256 if dq else 32)
            label = str(q.get("bnb_4bit_quant_type", "nf4")).lower()
        else:
            raise MoesimError("bitsandbytes config sets neither load_in_4bit nor load_in_8bit", FIELD)
        return Scheme(label=label, method=method, groups=(Group(("Linear",), fmt, label),),
                      ignore=_patterns(q, "llm_int8_skip_modules"))
    raise MoesimError(f"unsupported quant_method {q.get('quant_method')!r} (supported: fp8, mxfp4, "
                      "compressed-tensors, modelopt, gptq, awq, bitsandbytes)", FIELD)


# ------------------------------------------------------------------------------------ HF module paths
# Where each family keeps its MoE pieces (Hugging Face modeling code): (moe block, experts, shared,
# router, expert projection names gate/up/down).
_FAMILY_MOE = {
    "mixtral": ("block_sparse_moe", "experts.0", None, "gate", ("w1", "w3", "w2")),
    "minimax_m2": ("block_sparse_moe", "experts.0", None, "gate", ("w1", "w3", "w2")),
    "qwen2_moe": ("mlp", "experts.0", "shared_expert", "gate", None),
    "qwen3_moe": ("mlp", "experts.0", "shared_expert", "gate", None),
    "qwen3_next": ("mlp", "experts.0", "shared_expert", "gate", None),
    "gpt_oss": ("mlp", "experts", None, "router", ("gate_up_proj", "gate_up_proj", "down_proj")),
    "llama4": ("feed_forward", "experts", "shared_expert", "router", ("gate_up_proj", "gate_up_proj", "down_proj")),
    "dbrx": ("ffn", "experts.mlp", None, "router.layer", ("w1", "v1", "w2")),
}
_DEFAULT_MOE = ("mlp", "experts.0", "shared_experts", "gate", None)
_PROJ = ("gate_proj", "up_proj", "down_proj")
_ATTN_LEAF = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj", "attn_q_a": "q_a_proj",
    "attn_q_b": "q_b_proj", "attn_kv_a_mqa": "kv_a_proj_with_mqa", "attn_k_b": "kv_b_proj", "attn_v_b": "kv_b_proj",
    "attn_kv_b": "kv_b_proj", "attn_gate": "g_proj", "attn_qkv": "qkv_proj",
}
_BLK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.(?:weight|bias))?$")


def hf_module_path(family: str, tensor, n_layers: int) -> str:
    """The Hugging Face module path of a moesim/GGUF-named tensor (used to match ignore patterns)."""
    name = tensor.name
    if name.startswith("token_embd"):
        return "model.embed_tokens"
    if name.startswith("output"):
        return "lm_head" if name.startswith("output.") else "model.norm"
    m = _BLK.match(name)
    if not m:
        return name
    i, stem = int(m.group(1)), m.group(2)
    moe, experts, shared, router, proj = _FAMILY_MOE.get(family, _DEFAULT_MOE)
    proj = proj or _PROJ
    base = f"model.layers.{i}"
    which = 0 if "gate" in stem else (1 if "up" in stem else 2)
    if "_exps" in stem:
        return f"{base}.{moe}.{experts}.{proj[which]}"
    if "_shexp" in stem:
        if stem.startswith("ffn_gate_inp"):
            return f"{base}.{moe}.{shared}_gate"
        return f"{base}.{moe}.{shared or 'shared_experts'}.{_PROJ[which]}"
    if stem.startswith(("ffn_gate_inp", "exp_probs_b", "ffn_latent")):
        return f"{base}.{moe}.{router}"
    if stem in ("ffn_gate", "ffn_up", "ffn_down"):
        return f"{base}.{'feed_forward' if family == 'llama4' else 'mlp'}.{_PROJ[which]}"
    if stem.startswith("nextn."):
        return f"{base}.{stem[6:]}"
    attn = "linear_attn" if family == "qwen3_next" and stem.startswith("ssm_") else "self_attn"
    if stem.startswith("indexer."):
        return f"{base}.{attn}.{stem}"
    return f"{base}.{attn}.{_ATTN_LEAF.get(stem, stem)}"
