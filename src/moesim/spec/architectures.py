"""Per-architecture readers of Hugging Face ``config.json`` fields into layers (DeepSeek, Qwen, gpt-oss, ...)."""
from __future__ import annotations

from typing import Mapping

from .checkpoint import Scheme
from ..errors import MoesimError
from .limits import MAX_MTP_MODULES, check_bounded
from .layers import C4A_DEFAULT_TOPK, DSA_DEFAULT_TOPK, Attention, FFN, Layer


# ---------------------------------------------------------------------------------- parsing
def _req(cfg: Mapping, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise MoesimError(f"config for {where} lacks required field {key!r}", key)
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v <= 0 or int(v) != v:
        raise MoesimError(f"must be a positive integer, got {v!r}", key)
    return check_bounded(int(v), key, where)


def _opt(cfg: Mapping, key: str, default):
    v = cfg.get(key, default)
    return default if v is None else v


def _opt_int(cfg: Mapping, key: str, default: int) -> int:
    """An optional whole-number field: its default when absent or null, else an integer in [-1, its bound]
    (-1 is how some configs write "none" or "through the last layer")."""
    v = cfg.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) > 2**62 or int(v) != v or v < -1:
        raise MoesimError(f"must be a whole number, got {v!r}", key)
    return check_bounded(int(v), key) if v > 0 else int(v)


def _mtp(cfg: Mapping, key: str = "num_nextn_predict_layers") -> int:
    """MTP modules the checkpoint ships: a whole number in [0, MAX_MTP_MODULES]."""
    v = _opt(cfg, key, 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or int(v) != v or not 0 <= v <= MAX_MTP_MODULES:
        raise MoesimError(f"must be an integer in [0, {MAX_MTP_MODULES}], got {v!r}", key)
    return int(v)


def _int_list(cfg: Mapping, key: str) -> list:
    v = cfg.get(key) or []
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise MoesimError("must be a list of integers", key)
    return list(v)


def _check_moe(n_experts: int, top_k: int, where: str):
    if top_k > n_experts:
        raise MoesimError(f"{where}: top-k {top_k} exceeds the number of experts {n_experts}",
                          "num_experts_per_tok")


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
    first_dense = _opt_int(c, "first_k_dense_replace", 0)
    freq = _opt_int(c, "moe_layer_freq", 1) or 1
    index_heads = _opt_int(c, "index_n_heads", 0)
    indexer_types = c.get("indexer_types")
    if indexer_types is not None and (not isinstance(indexer_types, list) or len(indexer_types) != n):
        raise MoesimError(f"needs one entry per layer ({n})", "indexer_types")
    layers = []
    for i in range(n):
        own_idx = bool(index_heads) and (indexer_types is None or indexer_types[i] == "full")
        att = Attention("mla", n_heads=heads, q_lora_rank=_opt_int(c, "q_lora_rank", 0),
                        kv_lora_rank=_req(c, "kv_lora_rank", id),
                        qk_nope_head_dim=_req(c, "qk_nope_head_dim", id),
                        qk_rope_head_dim=_req(c, "qk_rope_head_dim", id),
                        v_head_dim=_req(c, "v_head_dim", id),
                        index_heads=index_heads, index_head_dim=_opt_int(c, "index_head_dim", 0),
                        index_topk=_opt_int(c, "index_topk", DSA_DEFAULT_TOPK) if index_heads else 0,
                        own_indexer=own_idx)
        dense = i < first_dense or (i % freq) != 0
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=_opt_int(c, "n_shared_experts", 0),
                            n_group=_opt_int(c, "n_group", 1), topk_group=_opt_int(c, "topk_group", 1),
                            router_bias=_opt(c, "topk_method", "") == "noaux_tc")
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _mtp(c)}


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
                        index_heads=_opt_int(c, "index_n_heads", 0), index_head_dim=_opt_int(c, "index_head_dim", 0),
                        index_topk=_opt_int(c, "index_topk", C4A_DEFAULT_TOPK),
                        compress_ratio=ratios[i], hc_mult=_opt_int(c, "hc_mult", 0), sinks=True)
        ffn = _moe_or_dense(False, c, hidden, ff_dense=0, experts=e, top_k=k,
                            expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=_opt_int(c, "n_shared_experts", 0), router_bias=True)
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _mtp(c)}


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
    first_dense = _opt_int(c, "first_k_dense_replace", 0)
    latent = _opt_int(c, "routed_expert_hidden_size", 0)
    layers = []
    for i in range(n):
        if (i + 1) in full:
            att = Attention("mla", n_heads=heads, q_lora_rank=_opt_int(c, "q_lora_rank", 0),
                            kv_lora_rank=_req(c, "kv_lora_rank", id), qk_nope_head_dim=_req(c, "qk_nope_head_dim", id),
                            qk_rope_head_dim=_req(c, "qk_rope_head_dim", id), v_head_dim=_req(c, "v_head_dim", id),
                            output_gate=bool(_opt(c, "mla_use_output_gate", False)))
        else:
            lh, ld = _req(lin, "num_heads", id), _req(lin, "head_dim", id)
            att = Attention("kda", n_heads=lh, lin_k_heads=lh, lin_v_heads=lh, lin_k_dim=ld, lin_v_dim=ld,
                            conv_kernel=_opt_int(lin, "short_conv_kernel_size", 4),
                            full_rank_gate=bool(_opt(lin, "use_full_rank_gate", _opt(c, "use_full_rank_gate", False))))
        dense = i < first_dense
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=_opt_int(c, "num_shared_experts", 0), latent_dim=latent, router_bias=True)
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _mtp(c)}


def _gqa(c, id, **kw) -> Attention:
    heads = _req(c, "num_attention_heads", id)
    hidden = c.get("hidden_size") or c.get("d_model")
    kv = _opt_int(c, "num_key_value_heads", heads)
    hd = _opt_int(c, "head_dim", 0) or hidden // heads
    if kv <= 0 or heads % kv:
        raise MoesimError(f"must divide num_attention_heads ({heads}), got {kv}", "num_key_value_heads")
    return Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=hd, **kw)


def _parse_qwen_moe(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    step = _opt_int(c, "decoder_sparse_step", 1) or 1
    mlp_only = set(_int_list(c, "mlp_only_layers"))
    window = _opt_int(c, "sliding_window", 0) if _opt(c, "use_sliding_window", False) else 0
    shared_ff = _opt_int(c, "shared_expert_intermediate_size", 0)
    layers = []
    for i in range(n):
        dense = i in mlp_only or (i + 1) % step != 0
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=1 if shared_ff else 0, shared_ff=shared_ff, shared_gate=bool(shared_ff))
        layers.append(Layer(i, _gqa(c, id, window=window, qk_norm=c.get("model_type") == "qwen3_moe"), ffn))
    return layers, {}


def _parse_qwen3_next(c, hidden, id, dense: bool = False):
    """Qwen3-Next / Qwen3.5 (MoE, or *dense*: the qwen3_5_text models' SwiGLU MLP of intermediate_size)."""
    n = _req(c, "num_hidden_layers", id)
    types = c.get("layer_types")
    interval = _opt_int(c, "full_attention_interval", 4) or 4
    if types is not None and (not isinstance(types, list) or len(types) != n):
        raise MoesimError(f"needs {n} entries", "layer_types")
    e, k = (0, 0) if dense else (_req(c, "num_experts", id), _req(c, "num_experts_per_tok", id))
    if not dense:
        _check_moe(e, k, id)
    ff_dense = _req(c, "intermediate_size", id) if dense else 0
    shared_ff = _opt_int(c, "shared_expert_intermediate_size", 0)
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
                            conv_kernel=_opt_int(c, "linear_conv_kernel_dim", 4))
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=ff_dense, experts=e, top_k=k,
                            expert_ff=0 if dense else _req(c, "moe_intermediate_size", id),
                            shared=1 if shared_ff else 0, shared_ff=shared_ff, shared_gate=bool(shared_ff))
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _mtp(c)}


def _parse_qwen3_5_dense(c, hidden, id):
    return _parse_qwen3_next(c, hidden, id, dense=True)


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
    window = _opt_int(c, "sliding_window", 0)
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id))
    return [Layer(i, _gqa(c, id, window=window), ffn) for i in range(n)], {}


def _parse_llama4(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    step = _opt_int(c, "interleave_moe_layer_step", 1) or 1
    chunk = _opt_int(c, "attention_chunk_size", 0)
    nope_every = _opt_int(c, "no_rope_layer_interval", 4) or 4
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


def _dense_first_moe_ffns(c, hidden, id, first_dense: int, experts_key: str = "n_routed_experts",
                          shared_key: str = "n_shared_experts") -> list:
    """Each layer's FFN in the DeepSeek-V3 layout that GLM-4.5, dots1 and Trinity share: dense for the
    first *first_dense* layers, then sigmoid-routed MoE with an expert bias, shared experts and
    group-limited routing."""
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, experts_key, id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    dense_ff = lambda i: _req(c, "intermediate_size", id) if i < first_dense else 0  # noqa: E731
    return [_moe_or_dense(i < first_dense, c, hidden, ff_dense=dense_ff(i), experts=e, top_k=k,
                          expert_ff=_req(c, "moe_intermediate_size", id),
                          shared=_opt_int(c, shared_key, 0), router_bias=True,
                          n_group=_opt_int(c, "n_group", 1), topk_group=_opt_int(c, "topk_group", 1))
            for i in range(n)]


def _parse_glm4_moe(c, hidden, id):
    ffns = _dense_first_moe_ffns(c, hidden, id, _opt_int(c, "first_k_dense_replace", 0))
    att = lambda: _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)),  # noqa: E731
                       qk_norm=bool(_opt(c, "use_qk_norm", False)))
    return [Layer(i, att(), f) for i, f in enumerate(ffns)], {"mtp_layers": _mtp(c)}


def _parse_minimax_m2(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    shared_ff = _opt_int(c, "shared_intermediate_size", 0)
    kinds = c.get("attn_type_list")
    if kinds is not None and (not isinstance(kinds, list) or any(x != 1 for x in kinds)):
        # MiniMax-Text-01 style lightning (linear) attention layers are marked 0 here; M2 is all 1.
        raise MoesimError("only full-attention layers (all 1) are supported for minimax_m2", "attn_type_list")
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id),
              n_shared=1 if shared_ff else 0, shared_intermediate=shared_ff,
              router_bias=bool(_opt(c, "use_routing_bias", False)))
    att = _gqa(c, id, qk_norm=bool(_opt(c, "use_qk_norm", False)))
    mtp = _mtp(c, "num_mtp_modules") if _opt(c, "use_mtp", False) else 0
    return [Layer(i, att, ffn) for i in range(n)], {"mtp_layers": mtp}


def _parse_dbrx(c, hidden, id):
    n = _req(c, "n_layers", id)
    attn = c.get("attn_config") or {}
    ffc = c.get("ffn_config") or {}
    e, k = _req(ffc, "moe_num_experts", id), _req(ffc, "moe_top_k", id)
    _check_moe(e, k, id)
    heads = _req(c, "n_heads", id)
    kv = _opt_int(attn, "kv_n_heads", heads)
    att = Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=hidden // heads)
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(ffc, "ffn_hidden_size", id))
    return [Layer(i, att, ffn) for i in range(n)], {}


def _parse_ernie(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "moe_num_experts", id), _req(c, "moe_k", id)
    _check_moe(e, k, id)
    start = _opt_int(c, "moe_layer_start_index", 0)
    end = _opt_int(c, "moe_layer_end_index", n - 1)
    if end < 0:          # ERNIE configs write -1 for "through the last layer"
        end = n - 1
    interval = _opt_int(c, "moe_layer_interval", 1) or 1
    layers = []
    for i in range(n):
        dense = not (start <= i <= end and (i - start) % interval == 0)
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=_req(c, "moe_intermediate_size", id),
                            shared=_opt_int(c, "moe_num_shared_experts", 0))
        layers.append(Layer(i, _gqa(c, id), ffn))
    return layers, {}


def _parse_inkling(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    glob = set(_int_list(c, "global_layers"))
    e, k = _req(c, "n_routed_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    first_dense = _opt_int(c, "first_k_dense_replace", 0)
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
                            shared=_opt_int(c, "n_shared_experts", 0))
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_dense(c, hidden, id):
    n = _req(c, "num_hidden_layers", id)
    # Qwen2/Qwen3 configs carry a sliding_window that only applies when use_sliding_window is set
    # (HF Qwen2Attention); Mistral v0.1 has no such switch and always slides.
    window = int(_opt(c, "sliding_window", 0) or 0) if _opt(c, "use_sliding_window", True) else 0
    ffn = FFN("dense", intermediate=_req(c, "intermediate_size", id))
    qk_norm = c.get("model_type") == "qwen3"
    bias = c.get("model_type") == "qwen2" or bool(_opt(c, "attention_bias", False))
    return [Layer(i, _gqa(c, id, window=window, qk_norm=qk_norm, bias=bias), ffn) for i in range(n)], {}


def _layer_kinds(c, n: int, global_every: int) -> list:
    """Per-layer 'sliding_attention' / 'full_attention': the config's layer_types, else every
    *global_every*-th layer (1-based) is full (HF Gemma2/Gemma3/Cohere2 defaults)."""
    types = c.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise MoesimError(f"needs one entry per layer ({n})", "layer_types")
        return list(types)
    return ["full_attention" if (i + 1) % global_every == 0 else "sliding_attention" for i in range(n)]


def _parse_gemma(c, hidden, id):
    """gemma2 / gemma3_text: interleaved sliding-window and global GQA layers, GeGLU FFN (three
    matrices, as SwiGLU), tied embeddings by default. Gemma 2 alternates (even layers slide); Gemma 3
    slides five of every six layers (sliding_window_pattern) and adds QK norms."""
    n = _req(c, "num_hidden_layers", id)
    gemma3 = str(c.get("model_type", "")).startswith("gemma3")
    every = _opt_int(c, "sliding_window_pattern", 6) if gemma3 else 2
    kinds = _layer_kinds(c, n, every or 1)
    window = _req(c, "sliding_window", id)
    ffn = FFN("dense", intermediate=_req(c, "intermediate_size", id))
    layers = [Layer(i, _gqa(c, id, window=window if kinds[i] == "sliding_attention" else 0,
                             qk_norm=gemma3, bias=bool(_opt(c, "attention_bias", False))), ffn)
              for i in range(n)]
    return layers, {"tie_default": True}


def _parse_phi3(c, hidden, id):
    """phi3 (Phi-3, Phi-3.5-mini, Phi-4): fused QKV and gate/up projections hold the same weights as
    the split GQA/SwiGLU tensors. The config's sliding_window is not applied: llama.cpp disables Phi
    SWA ("Phi SWA is currently disabled", llama.cpp PR 13676) and caches every position."""
    n = _req(c, "num_hidden_layers", id)
    ffn = FFN("dense", intermediate=_req(c, "intermediate_size", id))
    att = _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)))
    return [Layer(i, att, ffn) for i in range(n)], {}


def _parse_cohere(c, hidden, id):
    """cohere (Command-R, Aya-23) and cohere2 (Command-R7B, Command-A): parallel attention + SwiGLU
    blocks, tied embeddings by default; cohere2 slides three of every four layers."""
    n = _req(c, "num_hidden_layers", id)
    ffn = FFN("dense", intermediate=_req(c, "intermediate_size", id))
    qk_norm = bool(_opt(c, "use_qk_norm", False))
    if c.get("model_type") == "cohere2":
        kinds = _layer_kinds(c, n, _opt_int(c, "sliding_window_pattern", 4) or 1)
        window = _req(c, "sliding_window", id)
    else:
        kinds, window = ["full_attention"] * n, 0
    layers = [Layer(i, _gqa(c, id, window=window if kinds[i] == "sliding_attention" else 0, qk_norm=qk_norm,
                             bias=bool(_opt(c, "attention_bias", False))), ffn) for i in range(n)]
    return layers, {"tie_default": True}


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
    "gemma2": _parse_gemma,
    "gemma3_text": _parse_gemma,
    "gemma3": _parse_gemma,
    "phi3": _parse_phi3,
    "cohere": _parse_cohere,
    "cohere2": _parse_cohere,
}
