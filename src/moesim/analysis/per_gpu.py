"""Memory per GPU of a multi-GPU layout: which tensors a TP x EP x attention-DP layout splits and which it
replicates, applied to the memory kernel's GPU-tier bytes (which count each tensor once over the pool).

Rules (N GPUs, attention TP Ta = N / D under D attention-DP ranks, EP P, R redundant experts, E experts):

* attention weights: split Ta ways; attention DP replicates them on every rank (SGLang DP attention,
  TensorRT-LLM ``--enable-attention-dp``: RT §3.2, §4);
* router (gate): replicated (vLLM builds the MoE gate as a ``ReplicatedLinear``);
* routed experts: the E + R expert slots over N GPUs (EP P x MoE TP N / P; vLLM EP size = TP x DP,
  docs.vllm.ai "Expert Parallel Deployment"); EPLB replicas cost R / N expert slots per GPU per layer;
* shared experts, dense FFN, MTP modules, embeddings and LM head: split N ways (tensor parallel; vLLM's
  VocabParallelEmbedding / ParallelLMHead for the vocabulary);
* KV cache and per-sequence state: each attention-DP rank holds its own sequences' (a D-th); within a rank
  the KV heads split over at most as many TP ranks as there are KV heads, so MLA's single latent head is
  replicated on every TP rank ("duplicated among all TP ranks", RT §3.2);
* compute buffers: split evenly.
"""
from __future__ import annotations

from ..engine.lower.memory import CLASSES, TIERS
from ..engine.lower.parallel import kv_heads, layout_degrees


def split_ways(m, rt, n_gpus: int) -> dict:
    """How many ways each memory class is divided over the GPUs (1 = replicated on each); the routed
    experts' entry is N E / (E + R), so that dividing by it gives the slots one GPU holds."""
    if n_gpus > 1 and not rt.decode.tensor_parallel:
        # layer split / pipeline: each GPU holds its share of the layers, tensors whole
        return {c: float(n_gpus) for c in CLASSES}
    n, attn_tp, ep, _ = layout_degrees(rt, n_gpus)
    dp = max(1, n // attn_tp)
    E = max(1, m.n_experts)
    red = rt.decode.redundant_experts if ep > 1 else 0
    kv = dp * min(attn_tp, kv_heads(m))
    ways = dict(attention=attn_tp, router=1, shared_experts=n, routed_experts=n * E / (E + red), dense_ffn=n,
                embeddings=n, lm_head=n, mtp=n, kv_cache=kv, state=kv, buffers=n)
    return {c: float(ways[c]) for c in CLASSES}


def gpu_bytes_per_gpu(m, rt, n_gpus: int, by_class) -> dict:
    """{total, by_class}: bytes one GPU holds under the runtime's layout, from the memory kernel's
    [class, tier] bytes (GPU tier; each tensor counted once over all the GPUs)."""
    ways = split_ways(m, rt, n_gpus)
    g = TIERS.index("gpu")
    per = {c: float(by_class[i][g]) / ways[c] for i, c in enumerate(CLASSES)}
    return {"total": sum(per.values()), "by_class": per, "split_ways": ways}
