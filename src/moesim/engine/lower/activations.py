"""Bytes of activations a llama.cpp prompt moves through device memory, per token and layer.

ggml runs a graph one node at a time, each node a kernel that reads its inputs from device memory and writes
its output back (ggml-cuda ggml_cuda_compute_forward per node; activations are f32 tensors), so a prompt's
layer streams every intermediate it builds: the norms, the q8_1 copy MMQ makes of each matmul's input
(ggml_cuda_mul_mat_q: quantize_mmq_q8_1_cuda per call, one row per token and used expert under MUL_MAT_ID:
ne11_flat = ne12 * n_expert_used, code search find_string ids 70931012131, 52187584227), the projections'
outputs, RoPE, the KV cache store, SwiGLU, and a routed layer's weighting and its k - 1 adds of the
experts' outputs (src/llama-graph.cpp build_moe_ffn: ggml_mul(experts, weights), then moe_out =
ggml_add(moe_out, cur_experts[i]); find_string id 53787081935). Small models and many-expert layers move
more such bytes per FLOP than large dense ones, which is where a prompt model of weights and FLOPs alone
runs fast (docs/cost-model.md). Counted per op as each reads and writes whole tensors (no fusion, no cache
hits: a 512-token ubatch's hidden state is megabytes); the attention's KV reads are the scores' cost
(engine.prefill), not counted here.
"""
from __future__ import annotations

import numpy as np

from ...spec.layers import Attention, FFN
from ...spec.models import Model

F32 = 4.0                      # ggml activations are f32
F16 = 2.0                      # the KV cache's default type
Q8_1 = 36.0 / 32.0             # block_q8_1: 32 int8 values + fp16 scale and sum
QUANTIZE = F32 + Q8_1          # MMQ's copy of a matmul input: read f32, write q8_1
ROW_OP = 2 * F32               # a unary op (norm, RoPE): read and write one f32 row
BINARY_OP = 3 * F32            # an add or multiply of two f32 rows into a third


def _attention_widths(a: Attention, hidden: int) -> tuple:
    """(query width, width of each of K and V as written to the cache, attention output width) of one token."""
    if a.kind == "mla":
        q = a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        return q, a.kv_lora_rank + a.qk_rope_head_dim, a.n_heads * (a.v_head_dim or a.qk_nope_head_dim)
    if a.lin_k_heads or a.lin_v_heads:                 # linear attention (delta-net): state, no KV cache
        return a.lin_k_heads * a.lin_k_dim, 0, a.lin_v_heads * a.lin_v_dim
    head = a.head_dim or hidden // max(a.n_heads, 1)
    return a.n_heads * head, a.n_kv_heads * head, a.n_heads * head


def _attention_bytes(a: Attention, d: int) -> float:
    q, kv, out = _attention_widths(a, d)
    b = ROW_OP * d                                     # attn_norm (rms_norm x weight, one fused kernel)
    b += 3 * QUANTIZE * d + F32 * (q + 2 * kv)         # Q, K, V projections: three input copies, three outputs
    b += ROW_OP * (q + kv) * (2 if a.qk_norm else 1)   # RoPE of Q and K (and their norms)
    b += 2 * kv * (F32 + F16)                          # K and V into the f16 cache
    b += F32 * (q + out)                               # flash attention's Q in, output out
    b += QUANTIZE * out + F32 * d                      # output projection
    return b + BINARY_OP * d                           # residual add


def _mlp_bytes(d: int, inter: int) -> float:
    """A gated MLP of ``inter`` units: gate and up (their own input copies), SwiGLU, down."""
    return 2 * QUANTIZE * d + 2 * F32 * inter + BINARY_OP * inter + QUANTIZE * inter + F32 * d


def _ffn_bytes(f: FFN, d: int) -> float:
    b = ROW_OP * d + BINARY_OP * d                     # ffn_norm, residual add
    if f.kind != "moe":
        return b + _mlp_bytes(d, f.intermediate)
    k = f.top_k
    b += F32 * d + F32 * f.n_experts                   # router logits (f32 weights: no input copy)
    b += k * _mlp_bytes(d, f.expert_intermediate)      # every used expert's MLP, per token
    b += k * ROW_OP * d + (k - 1) * BINARY_OP * d      # weighting (by the small weights row), k - 1 adds
    if f.n_shared:
        b += _mlp_bytes(d, f.n_shared * f.shared_intermediate) + BINARY_OP * d
    return b


def prompt_activation_bytes(m: Model) -> np.ndarray:
    """Per layer, the activation bytes a prompt token moves through device memory under llama.cpp (a new
    array each call)."""
    rows = m.cached_view("_prompt_activation_bytes", lambda: tuple(
        _attention_bytes(layer.attention, m.hidden) + _ffn_bytes(layer.ffn, m.hidden) for layer in m.layers))
    return np.array(rows, dtype=np.float64)
