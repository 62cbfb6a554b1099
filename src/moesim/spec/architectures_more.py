"""More per-architecture readers of Hugging Face ``config.json`` fields: Hunyuan, dots.llm1, Ling/Ring
(Bailing), Granite MoE and Granite-4.0-H, OLMoE, Phi-3.5-MoE, MiniMax-Text-01/M1, the Qwen3.5 MoE text
model, the Qwen3-VL MoE text model, Grok-1, Arcee Trinity (afmoe) and SmallThinker.

Joined with :data:`moesim.spec.architectures._PARSERS` in ``spec.models``. Two families
here mix in layers whose token mixer is a fixed-size recurrent state rather than a KV cache; both are
represented with the ``gdn`` attention kind, whose cache term is exactly such a state (heads x d_k x
d_v fp32 plus a short-conv tail) -- see :func:`_lightning` and :func:`_mamba2` for the mapping.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import MoesimError
from .architectures import (_check_moe, _dense_first_moe_ffns, _gqa, _int_list, _moe_or_dense, _mtp, _opt,
                            _opt_int, _parse_mixtral, _parse_qwen3_5_dense, _parse_qwen3_next, _parse_qwen_moe, _req)
from .layers import FFN, Attention, Layer


def _per_layer(c: Mapping, key: str, n: int, id: str) -> list:
    """A field that is either one positive integer or a list of one per layer (Hunyuan writes
    ``moe_topk`` / ``num_shared_expert`` / ``moe_intermediate_size`` both ways)."""
    v = c.get(key)
    if isinstance(v, (list, tuple)):
        if len(v) != n:
            raise MoesimError(f"needs one entry per layer ({n}), got {len(v)}", key)
        return [_req({key: x}, key, id) if x else 0 for x in v]
    return [_req(c, key, id)] * n


def _parse_hunyuan_moe(c, hidden, id):
    """hunyuan_v1_moe (Hunyuan-A13B): GQA with per-head QK norm; every layer MoE with a shared MLP."""
    n = _req(c, "num_hidden_layers", id)
    if _opt(c, "use_cla", False):
        # cross-layer attention shares one KV cache between cla_share_factor layers: not modelled
        raise MoesimError("cross-layer attention (use_cla = true) is not supported", "use_cla")
    e = _req(c, "num_experts", id)
    top_k = _per_layer(c, "moe_topk", n, id)
    expert_ff = _per_layer(c, "moe_intermediate_size", n, id)
    shared = _per_layer(c, "num_shared_expert", n, id) if "num_shared_expert" in c else [0] * n
    # use_mixed_mlp_moe: the shared MLP runs beside the experts at width intermediate_size
    if not _opt(c, "use_mixed_mlp_moe", True):
        shared = [0] * n
    shared_ff = _req(c, "intermediate_size", id) if any(shared) else 0
    layers = []
    for i in range(n):
        _check_moe(e, top_k[i], id)
        ffn = _moe_or_dense(False, c, hidden, ff_dense=0, experts=e, top_k=top_k[i], expert_ff=expert_ff[i],
                            shared=shared[i], shared_ff=shared_ff)
        att = _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)), qk_norm=bool(_opt(c, "use_qk_norm", False)))
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_dots1(c, hidden, id):
    """dots1 (dots.llm1): DeepSeek-V3-style MoE (shared experts, dense first layers, sigmoid router
    with a correction bias) over GQA with per-head QK norm (Qwen3-style attention)."""
    ffns = _dense_first_moe_ffns(c, hidden, id, _opt_int(c, "first_k_dense_replace", 0))
    return [Layer(i, _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)), qk_norm=True), f)
            for i, f in enumerate(ffns)], {}


def _parse_bailing_moe(c, hidden, id):
    """bailing_moe / bailing_moe_v2 (Ling, Ring): GQA (fused QKV, optional bias and QK norm), shared
    experts, dense first layers; v2 adds group-limited sigmoid routing with an expert bias and MTP."""
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    first_dense = _opt_int(c, "first_k_dense_replace", 0)
    expert_ff = _req(c, "moe_intermediate_size", id)
    shared_ff = _opt_int(c, "moe_shared_expert_intermediate_size", 0) or expert_ff
    att = _gqa(c, id, bias=bool(_opt(c, "use_qkv_bias", False)), qk_norm=bool(_opt(c, "use_qk_norm", False)))
    layers = []
    for i in range(n):
        dense = i < first_dense
        ffn = _moe_or_dense(dense, c, hidden, ff_dense=_req(c, "intermediate_size", id) if dense else 0,
                            experts=e, top_k=k, expert_ff=expert_ff, shared=_opt_int(c, "num_shared_experts", 0),
                            shared_ff=shared_ff, router_bias=bool(_opt(c, "moe_router_enable_expert_bias", False)),
                            n_group=_opt_int(c, "n_group", 1), topk_group=_opt_int(c, "topk_group", 1))
        layers.append(Layer(i, att, ffn))
    return layers, {"mtp_layers": _mtp(c)}


def _granite_ffn(c, id) -> FFN:
    """Granite MoE FFN: num_local_experts experts of width intermediate_size; granitemoeshared and
    granitemoehybrid add one always-on shared MLP of width shared_intermediate_size."""
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    shared_ff = _opt_int(c, "shared_intermediate_size", 0)
    return FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id),
               n_shared=1 if shared_ff else 0, shared_intermediate=shared_ff)


def _parse_granitemoe(c, hidden, id):
    """granitemoe / granitemoeshared (Granite-3.x MoE): GQA, every layer MoE."""
    n = _req(c, "num_hidden_layers", id)
    ffn = _granite_ffn(c, id)
    att = _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)))
    return [Layer(i, att, ffn) for i in range(n)], {}


def _mamba2(c, id) -> Attention:
    """A Mamba-2 mixer in the ``gdn`` kind's terms. Its decode state is physically the same object as a
    gated-DeltaNet state: per head a d_state x head_dim matrix (fp32), plus a (d_conv - 1)-column conv
    tail over x (n_heads*head_dim channels) and B, C (n_groups*d_state each) -- so lin_k_heads =
    n_groups, lin_k_dim = d_state, lin_v_heads = n_heads, lin_v_dim = head_dim give the exact state bytes.
    The weights come out within 0.6 % of a Mamba-2 block (its in-projection's n_heads dt columns are
    counted as the gdn beta/alpha projection of twice n_heads)."""
    heads, head_dim = _req(c, "mamba_n_heads", id), _req(c, "mamba_d_head", id)
    return Attention("gdn", n_heads=heads, lin_k_heads=_req(c, "mamba_n_groups", id),
                     lin_v_heads=heads, lin_k_dim=_req(c, "mamba_d_state", id), lin_v_dim=head_dim,
                     conv_kernel=_opt_int(c, "mamba_d_conv", 4))


def _parse_granitemoehybrid(c, hidden, id):
    """granitemoehybrid (Granite-4.0-H): Mamba-2 layers with a few GQA layers (``layer_types``), each
    followed by a MoE FFN with a shared MLP."""
    n = _req(c, "num_hidden_layers", id)
    types = c.get("layer_types")
    if not isinstance(types, list) or len(types) != n or any(t not in ("mamba", "attention") for t in types):
        raise MoesimError(f"needs {n} entries, each 'mamba' or 'attention'", "layer_types")
    ffn = _granite_ffn(c, id) if _opt_int(c, "num_local_experts", 0) else FFN(
        "dense", intermediate=_req(c, "shared_intermediate_size", id))
    layers = []
    for i in range(n):
        att = _mamba2(c, id) if types[i] == "mamba" else _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)))
        layers.append(Layer(i, att, ffn))
    return layers, {}


def _parse_olmoe(c, hidden, id):
    """olmoe (OLMoE-1B-7B): GQA with QK norm, every layer MoE, no shared expert."""
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id))
    att = _gqa(c, id, bias=bool(_opt(c, "attention_bias", False)), qk_norm=True)
    return [Layer(i, att, ffn) for i in range(n)], {}


def _parse_phimoe(c, hidden, id):
    """phimoe (Phi-3.5-MoE): Mixtral-shaped (16 experts, top-2) with biased attention projections."""
    n = _req(c, "num_hidden_layers", id)
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    window = _opt_int(c, "sliding_window", 0)
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id))
    att = _gqa(c, id, window=window, bias=bool(_opt(c, "attention_bias", True)))
    return [Layer(i, att, ffn) for i in range(n)], {}


def _lightning(c, id) -> Attention:
    """A MiniMax lightning-attention layer in the ``gdn`` kind's terms. Lightning attention is linear
    attention: its decode state is per head one head_dim x head_dim matrix (kept in fp32), fixed per
    sequence, with no short convolution -- so lin_k_heads = lin_v_heads = heads, both dims head_dim and
    conv_kernel 1 (no conv tail) give the exact state bytes. Its q/k/v and output-gate projections are
    the gdn fused in-projection's four blocks; the gdn beta/alpha and conv weights it adds are 0.3 % of
    the mixer's weights (0.015 % of the layer with its experts)."""
    heads = _req(c, "num_attention_heads", id)
    hd = _opt_int(c, "head_dim", 0) or _req(c, "hidden_size", id) // heads
    return Attention("gdn", n_heads=heads, lin_k_heads=heads, lin_v_heads=heads, lin_k_dim=hd, lin_v_dim=hd,
                     conv_kernel=1)


def _parse_minimax_lightning(c, hidden, id):
    """minimax_text_01 / minimax_m1 / minimax (MiniMax-Text-01, MiniMax-M1): ``attn_type_list`` marks
    each layer lightning (0) or softmax GQA (1); every layer a 32-expert top-2 MoE."""
    n = _req(c, "num_hidden_layers", id)
    kinds = _int_list(c, "attn_type_list")
    if len(kinds) != n or any(x not in (0, 1) for x in kinds):
        raise MoesimError(f"needs {n} entries, each 0 (lightning) or 1 (softmax)", "attn_type_list")
    e, k = _req(c, "num_local_experts", id), _req(c, "num_experts_per_tok", id)
    _check_moe(e, k, id)
    shared = c.get("shared_intermediate_size", 0)
    if isinstance(shared, list):
        shared = max(shared, default=0)
    if shared:
        raise MoesimError("a shared MLP (shared_intermediate_size > 0) is not supported here",
                          "shared_intermediate_size")
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "intermediate_size", id))
    return [Layer(i, _gqa(c, id) if kinds[i] else _lightning(c, id), ffn) for i in range(n)], {}


def _parse_afmoe(c, hidden, id):
    """afmoe (Arcee Trinity): gated GQA with per-head QK norm, sliding-window layers with a full-attention
    layer every global_attn_every_n_layers (or as ``layer_types`` says), num_dense_layers dense layers,
    then sigmoid-routed MoE with an expert bias and shared experts of the routed width."""
    n = _req(c, "num_hidden_layers", id)
    every = _opt_int(c, "global_attn_every_n_layers", 4) or 4
    types = c.get("layer_types") or ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                                     for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(
            t not in ("full_attention", "sliding_attention") for t in types):
        raise MoesimError(f"needs {n} entries, each 'full_attention' or 'sliding_attention'", "layer_types")
    ffns = _dense_first_moe_ffns(c, hidden, id, _opt_int(c, "num_dense_layers", 0), experts_key="num_experts",
                                 shared_key="num_shared_experts")
    window = _req(c, "sliding_window", id)
    return [Layer(i, _gqa(c, id, window=window if types[i] == "sliding_attention" else 0, qk_norm=True,
                          output_gate=True), f) for i, f in enumerate(ffns)], {}


def _parse_smallthinker(c, hidden, id):
    """smallthinker (PowerInfer SmallThinker): GQA, full or sliding per ``sliding_window_layout``; every
    layer MoE of ``moe_num_primary_experts`` ReGLU experts (up, gate, down: the SwiGLU shapes)."""
    n = _req(c, "num_hidden_layers", id)
    swa = _int_list(c, "sliding_window_layout") or [0] * n
    if len(swa) != n or any(x not in (0, 1) for x in swa):
        raise MoesimError(f"needs {n} entries, each 0 (full) or 1 (sliding)", "sliding_window_layout")
    e, k = _req(c, "moe_num_primary_experts", id), _req(c, "moe_num_active_primary_experts", id)
    _check_moe(e, k, id)
    window = _req(c, "sliding_window_size", id) if any(swa) else 0
    ffn = FFN("moe", n_experts=e, top_k=k, expert_intermediate=_req(c, "moe_ffn_hidden_size", id))
    return [Layer(i, _gqa(c, id, window=window if swa[i] else 0), ffn) for i in range(n)], {}


def _parse_qwen3_vl_moe_text(c, hidden, id):
    """qwen3_vl_moe_text (the language model of Qwen3-VL MoE): Qwen3-MoE's layers (GQA with QK norm,
    decoder_sparse_step / mlp_only_layers), read by the Qwen-MoE reader as the qwen3_moe it is."""
    return _parse_qwen_moe({**c, "model_type": "qwen3_moe"}, hidden, id)


MORE_PARSERS = {
    "hunyuan_v1_moe": _parse_hunyuan_moe,
    "dots1": _parse_dots1,
    "bailing_moe": _parse_bailing_moe,
    "bailing_moe_v2": _parse_bailing_moe,
    "granitemoe": _parse_granitemoe,
    "granitemoeshared": _parse_granitemoe,
    "granitemoehybrid": _parse_granitemoehybrid,
    "olmoe": _parse_olmoe,
    "phimoe": _parse_phimoe,
    "minimax_text_01": _parse_minimax_lightning,
    "minimax_m1": _parse_minimax_lightning,
    "minimax": _parse_minimax_lightning,
    # Qwen3.5 / Qwen3.6 MoE language model (the text_config of Qwen3_5MoeForConditionalGeneration): the
    # Qwen3-Next layer pattern -- gated DeltaNet with every 4th layer gated GQA, MoE with a shared expert
    "qwen3_5_moe_text": _parse_qwen3_next,
    "qwen3_5_text": _parse_qwen3_5_dense,         # the dense Qwen3.5 models (27B): the same layers, a SwiGLU MLP
    # Grok-1 (the HF ports' model_type): 8 experts, top-2, each a gated GELU MLP of 3 matrices like
    # Mixtral's SwiGLU ones, over GQA -- the Mixtral reader's fields and shapes
    "grok-1": _parse_mixtral,
    "afmoe": _parse_afmoe,
    "smallthinker": _parse_smallthinker,
    "qwen3_vl_moe_text": _parse_qwen3_vl_moe_text,
}
