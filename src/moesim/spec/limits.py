"""Boundary checks shared by every entry point: counts, sizes and ranges, each error naming its field."""
from __future__ import annotations

import math
import os

import numpy as np

from ..errors import MoesimError


# --------------------------------------------------------------------------------- validation
def check_count(value, name: str, minimum: int = 1, maximum: int = 2**40) -> int:
    """A whole number in [minimum, maximum], or a MoesimError naming the field and the bound (bools,
    NaN and fractional floats refused)."""
    if isinstance(value, bool) or value is None:
        raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or int(value) != value:
            raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name)
        value = int(value)
    try:
        iv = int(value)
    except (TypeError, ValueError):
        raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name) from None
    if iv < minimum:
        raise MoesimError(f"must be >= {minimum}, got {iv}", name)
    if iv > maximum:
        raise MoesimError(f"must be <= {maximum:,}, got {iv:,}", name)
    return iv


# Draft tokens per verify step: runtimes verify chains of a few drafts (DeepSeek-V3: one MTP module);
# llama.cpp switches to its batched-expert path at 32 tokens per step (reference/runtimes.md §1.1), and
# 64 is far past any draft length in use.
MAX_DRAFTS = 64
# Concurrent sequences: vLLM schedules at most max_num_seqs (256 by default) per step; 65,536 is far past
# any serving batch. Simulated decode steps: 2**20 is a million-token generation, longer than any model's
# trained context but one (models.toml).
MAX_BATCH = 1 << 16
MAX_STEPS = 1 << 20
# Prompt tokens one prefill pass multiplies (llama.cpp -ub, at most -b, 2048 by default): 131,072 is past any
# context a pass is run at on one machine.
MAX_UBATCH = 1 << 17
# Monte Carlo work: steps x layers x expert choices per step (tokens per step x top-k, at least 1 for a
# dense layer). The kernel draws about 2 million choices a second on one core (docs/speed.md), so 2**28
# is a couple of minutes, the longest one call should run (a million-token DeepSeek-V3 decode is twice
# that); past it the Monte Carlo mean has long since converged and mode="analytic" gives the steady state.
MAX_MONTECARLO_WORK = 1 << 28


# --------------------------------------------------------------------------------- plausibility
# Upper bounds on architecture fields, so that a tiny hostile file cannot declare a model that takes
# gigabytes to describe, and a typo cannot become a silent wrong number. Each sits well above the
# largest published open model (models.toml: Llama-3-70B's 80 layers, Kimi K2's 384 routed experts,
# Qwen3-Next's 512, Gemma-class 262,144-token vocabularies, Llama-4-Scout's 10M-token context) and
# at or under what the C kernel supports (csrc/moesim.h: MS_MAX_MOE_LAYERS 256, MS_MAX_TOP_K 512).
ARCH_BOUNDS = {
    "num_hidden_layers": 256,
    "hidden_size": 65536,
    "vocab_size": 1 << 22,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 8192,
    "intermediate_size": 1 << 20,
    "n_routed_experts": 16384,
    "num_experts_per_tok": 512,
    "n_shared_experts": 64,
    "max_position_embeddings": 1 << 28,
}
# Other spellings of the same counts across config.json families (DBRX, ERNIE, Mixtral, gpt-oss, ...).
ARCH_SYNONYMS = {
    "n_layers": "num_hidden_layers", "num_layers": "num_hidden_layers", "d_model": "hidden_size",
    "n_heads": "num_attention_heads", "kv_n_heads": "num_key_value_heads", "moe_num_experts": "n_routed_experts",
    "num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts", "moe_top_k": "num_experts_per_tok",
    "moe_k": "num_experts_per_tok", "experts_per_token": "num_experts_per_tok", "ffn_hidden_size": "intermediate_size",
    "moe_intermediate_size": "intermediate_size", "max_seq_len": "max_position_embeddings",
}
# MTP modules per model: DeepSeek-V3 and GLM-4.5 ship one (models.md); 16 is far above any checkpoint.
MAX_MTP_MODULES = 16
# dataclass field -> the config.json name its bound and errors use
_FIELD_BOUND = {
    "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
    "lin_k_heads": "num_attention_heads", "lin_v_heads": "num_attention_heads", "index_heads": "num_attention_heads",
    "intermediate": "intermediate_size", "expert_intermediate": "intermediate_size",
    "shared_intermediate": "intermediate_size", "latent_dim": "hidden_size",
    "n_experts": "n_routed_experts", "top_k": "num_experts_per_tok", "n_shared": "n_shared_experts",
    "n_group": "n_routed_experts", "topk_group": "n_routed_experts",
}
_DEFAULT_BOUND = 1 << 24        # ranks, head dims, windows, chunks, ratios: far above any published value


def check_dims(obj, where: str) -> None:
    """Every integer field of a layer spec (Attention, FFN) is a whole number in [0, its bound];
    a MoesimError names the field (config.json spelling where there is one) and the bound."""
    for name, value in vars(obj).items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            continue
        field = _FIELD_BOUND.get(name, name)
        bound = ARCH_BOUNDS.get(field, _DEFAULT_BOUND)
        if value < 0:
            raise MoesimError(f"{where}: must be >= 0, got {int(value)}", field)
        if value > bound:
            raise MoesimError(f"{where}: {int(value):,} is above the plausible maximum {bound:,}", field)


def check_bounded(value: int, field: str, where: str = "") -> int:
    """A positive architecture count at or under its bound (ARCH_BOUNDS, by its own name or a synonym)."""
    bound = ARCH_BOUNDS.get(ARCH_SYNONYMS.get(field, field), _DEFAULT_BOUND)
    if value > bound:
        prefix = f"{where}: " if where else ""
        raise MoesimError(f"{prefix}{value:,} is above the plausible maximum {bound:,}", field)
    return value


def check_context(context, model, allow_beyond_max_context: bool = False) -> tuple:
    """(context, assumptions): a context at or under the model's trained maximum, or a MoesimError that
    names the limit. With *allow_beyond_max_context* a longer one is kept (memory and speed extrapolate;
    quality is not modelled) and the returned assumption says so. Never above ARCH_BOUNDS."""
    context = check_count(context, "context")
    hard = ARCH_BOUNDS["max_position_embeddings"]
    if context > hard:
        raise MoesimError(f"{context:,} tokens is above the plausible maximum {hard:,}", "context")
    limit = int(getattr(model, "max_context", 0) or 0)
    if limit <= 0 or context <= limit:
        return context, []
    if not allow_beyond_max_context:
        raise MoesimError(f"{context:,} is above {model.id}'s maximum context of {limit:,} tokens "
                          "(max_position_embeddings); pass allow_beyond_max_context=True "
                          "(--allow-beyond-max-context) to extrapolate", "context")
    return context, [f"context {context:,} is beyond {model.id}'s trained maximum of {limit:,} "
                     "(allow_beyond_max_context): memory and speed extrapolate, quality is not modelled"]


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def this_machines_ram() -> int:
    """Bytes of physical memory of the machine moesim runs on (0 when the OS does not say): the bound on
    workspaces sized from untrusted input, checked before they are allocated."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0
