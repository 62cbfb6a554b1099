"""A GGUF file's metadata and tensor table mapped to a :class:`~moesim.spec.models.Model`."""
from __future__ import annotations

import os
import re

from ..errors import MoesimError
from ..spec.limits import ARCH_BOUNDS, MAX_MTP_MODULES
from ..spec.layers import DSA_DEFAULT_TOPK, FFN, Attention, Layer, StoredWeights, Tensor
from ..spec.models import Model
from ..spec.architectures import _mtp_layer
from .gguf import ArrayInfo, GGUFArtifact, GGUF_MAX_BLOCKS, _SPLIT_RE, _ftype_name, read_gguf
from .bounded import _err


_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


# ----------------------------------------------------------------------------------- GGUF -> Model
# llama.cpp architecture name (general.architecture) -> the HF model_type moesim uses as family.
GGUF_ARCHS = {
    "llama": "llama", "mistral3": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe", "qwen3next": "qwen3_next", "deepseek2": "deepseek_v3", "glm4moe": "glm4_moe",
    "glm-dsa": "glm_moe_dsa", "gpt-oss": "gpt_oss", "llama4": "llama4", "dbrx": "dbrx",
    "ernie4_5-moe": "ernie4_5_moe", "minimax-m2": "minimax_m2", "kimi-linear": "kimi_linear",
}


def gguf_tensor_class(name: str, n_main: int) -> "tuple[str, int]":
    """(moesim tensor class, layer) of a tensor by its llama.cpp name; layer -1 for global tensors."""
    m = _BLK.match(name)
    if m is None:
        if name.startswith("token_embd"):
            return "embeddings", -1
        if name.startswith("output"):
            return "lm_head", -1
        return "attention", 0     # rope_freqs and other small global tensors: with the first layer
    i, stem = int(m.group(1)), m.group(2)
    if i >= n_main or stem.startswith("nextn."):
        return "mtp", i
    if "exps." in stem or stem.endswith("exps"):
        return "routed_experts", i
    if "_shexp" in stem:
        return "shared_experts", i
    if stem.startswith(("ffn_gate_inp", "exp_probs_b", "ffn_latent")):
        return "router", i
    if re.match(r"ffn_(gate|up|down|gate_up)(\.|$)", stem):
        return "dense_ffn", i
    return "attention", i


class _HP:
    """Typed access to a GGUF file's ``{arch}.*`` hyperparameters with errors naming file and key."""

    def __init__(self, art: GGUFArtifact, arch: str):
        self.kv, self.arch, self.path = art.kv, arch, art.path

    def get(self, key: str, layer: int | None = None, default=None, required: bool = False):
        full = f"{self.arch}.{key}"
        v = self.kv.get(full)
        if v is None:
            if required:
                raise _err(self.path, f"lacks required metadata {full!r}", full)
            return default
        if isinstance(v, list):
            if not v:
                raise _err(self.path, f"{full} is an empty array", full)
            v = v[layer] if layer is not None and layer < len(v) else (max(v) if layer is None else None)
            if v is None:
                raise _err(self.path, f"{full} has no entry for layer {layer}", full)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v > 1 << 40:
            raise _err(self.path, f"{full} must be a non-negative number, got {v!r}", full)
        return int(v)


def _shape(stems: dict, key: str):
    t = stems.get(key)
    return t.shape if t is not None else None


def _gguf_layer(art: GGUFArtifact, hp: _HP, arch: str, i: int, stems: dict, hidden: int) -> Layer:
    """Block ``i`` from its tensors (``stems``: names without the ``blk.i.`` prefix) and the metadata."""
    def bad(problem):
        return _err(art.path, f"block {i}: {problem}", "gguf")

    linear = any(k.startswith("ssm_") for k in stems)
    if "attn_kv_a_mqa.weight" in stems:
        att = _mla_attention(hp, i, stems, hidden, bad)
    elif arch == "qwen3next" and linear:
        att = _gdn_attention(hp, bad)
    elif arch == "kimi-linear" and linear:
        att = _kda_attention(hp, i, stems, bad)
    else:
        att = _gqa_attention(hp, arch, i, stems, hidden, bad)
    if "ffn_gate_inp.weight" in stems:
        ffn = _moe_ffn(hp, arch, stems, hidden, bad)
    else:
        up = _shape(stems, "ffn_up.weight")
        down = _shape(stems, "ffn_down.weight")
        ff = (up[1] if up and len(up) > 1 else None) or (down[0] if down else None) \
            or hp.get("feed_forward_length", i, required=True)
        ffn = FFN("dense", intermediate=ff)
    return Layer(i, att, ffn)


def _mla_attention(hp: _HP, i: int, stems: dict, hidden: int, bad) -> Attention:
    """MLA (deepseek2 and its kin): dimensions from the metadata, checked against attn_kv_a_mqa's width."""
    heads = hp.get("attention.head_count", i, required=True)
    rope = hp.get("rope.dimension_count", required=True)
    kv_lora = hp.get("attention.kv_lora_rank", required=True)
    if hp.get("attention.key_length_mla") is not None:    # after llama.cpp's MLA rework (#12801)
        qk = hp.get("attention.key_length_mla")
        v_dim = hp.get("attention.value_length_mla", required=True)
    else:
        qk = hp.get("attention.key_length", required=True)
        v_dim = hp.get("attention.value_length", required=True)
    shp = _shape(stems, "attn_kv_a_mqa.weight")
    if len(shp) < 2 or shp[1] != kv_lora + rope:
        raise bad(f"attn_kv_a_mqa has {shp}, expected ({hidden}, kv_lora_rank + rope = {kv_lora + rope})")
    if qk <= rope or heads == 0:
        raise bad(f"key length {qk} must exceed the rope dimension {rope}")
    return Attention("mla", n_heads=heads, q_lora_rank=hp.get("attention.q_lora_rank", default=0)
                     if "attn_q_a.weight" in stems else 0,
                     kv_lora_rank=kv_lora, qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=v_dim,
                     index_heads=hp.get("attention.indexer.head_count", default=0),
                     index_head_dim=hp.get("attention.indexer.key_length", default=0),
                     index_topk=hp.get("attention.indexer.top_k", default=DSA_DEFAULT_TOPK)
                     if hp.get("attention.indexer.head_count", default=0) else 0,
                     own_indexer="indexer.attn_k.weight" in stems, output_gate="attn_gate.weight" in stems)


def _gdn_attention(hp: _HP, bad) -> Attention:
    """Qwen3-Next's Gated DeltaNet layers: heads and state size from the ssm.* metadata."""
    k_heads = hp.get("ssm.group_count", required=True)
    v_heads = hp.get("ssm.time_step_rank", required=True)
    inner = hp.get("ssm.inner_size", required=True)
    if not (k_heads and v_heads) or inner % v_heads:
        raise bad(f"ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")
    return Attention("gdn", n_heads=v_heads, lin_k_heads=k_heads, lin_v_heads=v_heads,
                     lin_k_dim=hp.get("ssm.state_size", required=True), lin_v_dim=inner // v_heads,
                     conv_kernel=hp.get("ssm.conv_kernel", default=4))


def _kda_attention(hp: _HP, i: int, stems: dict, bad) -> Attention:
    """Kimi-Linear's KDA layers: the head count from ssm_beta's width (else the metadata), the head
    dimension from kda.head_dim (else attn_q's width per head)."""
    beta = _shape(stems, "ssm_beta.weight")
    heads = beta[1] if beta and len(beta) > 1 else hp.get("attention.head_count", i, required=True)
    hd = hp.get("kda.head_dim") or (_shape(stems, "attn_q.weight") or (0, 0))[-1] // max(1, heads)
    if not heads or not hd:
        raise bad("cannot tell the KDA head count and head dimension")
    return Attention("kda", n_heads=heads, lin_k_heads=heads, lin_v_heads=heads, lin_k_dim=hd, lin_v_dim=hd,
                     conv_kernel=hp.get("ssm.conv_kernel", default=4), full_rank_gate="ssm_f.weight" in stems)


def _gqa_attention(hp: _HP, arch: str, i: int, stems: dict, hidden: int, bad) -> Attention:
    """Grouped-query attention, with the sliding or chunked window llama.cpp gives this layer index."""
    heads = hp.get("attention.head_count", i, required=True)
    kv = hp.get("attention.head_count_kv", i, default=heads)
    if not heads or not kv or heads % kv:
        raise bad(f"attention.head_count_kv {kv} must divide attention.head_count {heads}")
    head_dim = hp.get("attention.key_length") or hidden // heads
    window, chunk = _local_attention(hp, arch, i)
    q = _shape(stems, "attn_q.weight")
    gate = bool(q and len(q) > 1 and q[1] == 2 * heads * head_dim)   # qwen3next gated attention
    return Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=head_dim, window=window, chunk=chunk,
                     bias="attn_q.bias" in stems, qk_norm="attn_q_norm.weight" in stems,
                     output_gate=gate, sinks="attn_sinks.weight" in stems)


def _local_attention(hp: _HP, arch: str, i: int) -> tuple:
    """(sliding window, chunk) of layer ``i``: llama.cpp sets them per architecture, not from the file."""
    window = chunk = 0
    if arch == "gpt-oss":
        # llama.cpp LLM_ARCH_OPENAI_MOE: set_swa_pattern(2) -> sliding on even layers (il % 2 < 1)
        if i % 2 == 0:
            window = hp.get("attention.sliding_window", required=True)
    elif arch == "llama4":
        # llama.cpp LLM_ARCH_LLAMA4: chunked attention, n_swa = 8192, set_swa_pattern(4) (3 chunked,
        # 1 full) unless the file sets attention.sliding_window = 0
        sw = hp.get("attention.sliding_window")
        if sw != 0 and i % 4 < 3:
            chunk = 8192
    return window, chunk


def _moe_ffn(hp: _HP, arch: str, stems: dict, hidden: int, bad) -> FFN:
    """A MoE FFN read from its stacked expert tensors (whose third dimension is the expert count), checked
    against the metadata; shared experts from the *_shexp widths."""
    exps = next((stems[k] for k in ("ffn_down_exps.weight", "ffn_up_exps.weight", "ffn_gate_up_exps.weight")
                 if k in stems), None)
    if exps is None or len(exps.shape) != 3:
        raise bad("has a router (ffn_gate_inp) but no stacked expert tensors")
    n_exp = exps.shape[2]
    meta_exp = hp.get("expert_count", default=n_exp)
    if meta_exp != n_exp:
        raise bad(f"{arch}.expert_count is {meta_exp} but the expert tensors hold {n_exp}")
    if "ffn_down_exps.weight" in stems:
        ff, width = exps.shape[0], exps.shape[1]
    elif "ffn_up_exps.weight" in stems:
        width, ff = exps.shape[0], exps.shape[1]
    else:
        width, ff = exps.shape[0], exps.shape[1] // 2
    top_k = hp.get("expert_used_count", required=True)
    if not 1 <= top_k <= n_exp:
        raise bad(f"{arch}.expert_used_count {top_k} is not in [1, {n_exp}]")
    n_shared, shared_ff = _shared_experts(hp, stems, bad)
    return FFN("moe", n_experts=n_exp, top_k=top_k, expert_intermediate=ff, n_shared=n_shared,
               shared_intermediate=shared_ff, latent_dim=width if width != hidden else 0,
               n_group=hp.get("expert_group_count", default=1) or 1,
               topk_group=hp.get("expert_group_used_count", default=1) or 1,
               expert_bias=any(k.startswith(("ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"))
                               for k in stems),
               router_bias="exp_probs_b.bias" in stems, shared_gate="ffn_gate_inp_shexp.weight" in stems)


def _shared_experts(hp: _HP, stems: dict, bad) -> tuple:
    """(shared experts, width of one): the files store them fused, so the total width is split by
    expert_shared_count."""
    sh = _shape(stems, "ffn_down_shexp.weight") or _shape(stems, "ffn_up_shexp.weight")
    if sh is None:
        return 0, 0
    total = sh[0] if "ffn_down_shexp.weight" in stems else sh[1]
    n_shared = hp.get("expert_shared_count", default=1) or 1
    if total % n_shared:
        raise bad(f"shared-expert width {total} is not a multiple of expert_shared_count {n_shared}")
    return n_shared, total // n_shared


def _model_id(path: str) -> str:
    base = os.path.basename(path)
    m = _SPLIT_RE.match(base)
    if m:
        base = m.group("prefix")
    return re.sub(r"\.gguf$", "", base, flags=re.I) or "model"


def gguf_model(art: GGUFArtifact) -> Model:
    """The :class:`Model` a GGUF artifact describes, carrying its exact tensor table."""
    path = art.path
    arch = art.kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _err(path, "lacks general.architecture", "architecture")
    if arch not in GGUF_ARCHS:
        raise _err(path, f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(GGUF_ARCHS))}",
                   "architecture")
    hp = _HP(art, arch)
    n_blocks = hp.get("block_count", required=True)
    max_blocks = min(GGUF_MAX_BLOCKS, ARCH_BOUNDS["num_hidden_layers"] + MAX_MTP_MODULES)
    if not 1 <= n_blocks <= max_blocks:
        raise _err(path, f"{arch}.block_count {n_blocks} is not in [1, {max_blocks}] (the plausible maximum)",
                   f"{arch}.block_count")
    nextn = hp.get("nextn_predict_layers", default=0)
    if nextn >= n_blocks:
        raise _err(path, f"{arch}.nextn_predict_layers {nextn} leaves no main layers of {n_blocks}", "gguf")
    n_main = n_blocks - nextn
    hidden = hp.get("embedding_length", required=True)
    per_block: list = [dict() for _ in range(n_blocks)]
    table = []
    for t, _shard in art.tensors:
        m = _BLK.match(t.name)
        if m:
            b = int(m.group(1))
            if b >= n_blocks:
                raise _err(path, f"tensor {t.name!r} is in block {b} but {arch}.block_count is {n_blocks}", "gguf")
            per_block[b][m.group(2)] = t
        cls, layer = gguf_tensor_class(t.name, n_main)
        table.append((Tensor(t.name, tuple(int(d) for d in t.shape), cls, layer), t.type_name, int(t.nbytes)))
    names = {t.name: t for t, _ in art.tensors}
    emb = names.get("token_embd.weight")
    if emb is None or len(emb.shape) != 2:
        raise _err(path, "has no 2-D token_embd.weight", "gguf")
    if emb.shape[0] != hidden:
        raise _err(path, f"token_embd.weight has rows of {emb.shape[0]}, {arch}.embedding_length is {hidden}", "gguf")
    layers = []
    for i in range(n_main):
        if not per_block[i]:
            raise _err(path, f"block {i} has no tensors", "gguf")
        layers.append(_gguf_layer(art, hp, arch, i, per_block[i], hidden))
    family = GGUF_ARCHS[arch]
    has_moe = any(l.ffn.kind == "moe" for l in layers)
    if arch == "deepseek2" and not any(l.ffn.router_bias for l in layers):
        family = "deepseek_v2"              # V2 routes by softmax, V3/R1/Kimi-K2 add the noaux_tc bias
    if arch == "llama" and has_moe:
        family = "mixtral"
    ftype = _ftype_name(art.kv.get("general.file_type"))
    label = ftype or _dominant_type(table)
    name = art.kv.get("general.name")
    mid = _model_id(path)
    stored = StoredWeights(container="gguf", key=art.key, label=label, table=tuple(table),
                           files=tuple(s.path for s in art.shards), metadata=_summary(art))
    return Model(id=mid, name=name if isinstance(name, str) and name else mid, family=family, hidden=hidden,
                 vocab=emb.shape[1], tie_embeddings="output.weight" not in names, layers=tuple(layers),
                 max_context=hp.get("context_length", required=True) or 1, mtp_layers=nextn,
                 mtp_layer=_mtp_layer(layers, hidden) if nextn else None, native_quant=label,
                 source=f"GGUF {path}" + (f" ({len(art.shards)} shards)" if len(art.shards) > 1 else ""),
                 stored=stored)


def _dominant_type(table) -> str:
    by = {}
    for t, typ, nb in table:
        if len(t.shape) >= 2:
            by[typ] = by.get(typ, 0) + nb
    return max(by, key=by.get) if by else "F32"


def _summary(art: GGUFArtifact) -> dict:
    """Metadata worth showing: scalars and short arrays, never tokenizer vocabularies."""
    out = {}
    for k, v in art.kv.items():
        if k.startswith("tokenizer.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            if isinstance(v, (list, ArrayInfo)):
                out[k + ".length"] = v.count if isinstance(v, ArrayInfo) else len(v)
            continue
        if isinstance(v, ArrayInfo):
            out[k] = f"<array of {v.count}>"
        elif isinstance(v, str) and len(v) > 200:
            out[k] = v[:200] + "..."
        elif isinstance(v, list) and len(v) > 64:
            out[k] = f"<array of {len(v)}>"
        else:
            out[k] = v
    return out


def read_gguf_model(path: str | os.PathLike) -> Model:
    path = os.fspath(path)
    art = read_gguf(path)
    try:
        return gguf_model(art)
    except MoesimError as exc:
        if path in str(exc):
            raise
        # a layer's own bound check (check_dims) names the field but not the file
        problem = str(exc)[len(f"{exc.field}: "):] if exc.field else str(exc)
        raise _err(path, problem, exc.field or "gguf") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError) as exc:
        raise _err(path, f"malformed GGUF metadata ({type(exc).__name__}: {exc})", "gguf") from None
