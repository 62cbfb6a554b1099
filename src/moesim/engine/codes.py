"""The enum codes and limits of ``csrc/moesim.h``, mirrored once for Python.

Every integer the kernel's ABI defines has its name here, the header's ``MS_`` prefix dropped
(``MS_PLACE_ALL_GPU`` is ``PLACE_ALL_GPU``); ``tests/test_layout.py`` parses the header and checks each
one. Python code and the pure-Python twins import these instead of retyping literals.
"""
from __future__ import annotations

# Error codes (ms_strerror has the messages; glue.handle_library_error turns them into exceptions).
ERR_NULL_ARGUMENT, ERR_BAD_SIZE, ERR_BAD_PLACEMENT, ERR_BAD_CONTEXT = -1, -2, -3, -4
ERR_BAD_CAPACITY, ERR_NO_MEMORY, ERR_BAD_ROUTING, ERR_BAD_POLICY = -5, -6, -7, -8
ERR_BAD_TRACE, ERR_BAD_WORKSPACE, ERR_BAD_MACHINE, ERR_BAD_SWEEP = -9, -10, -11, -12
ERR_BAD_SERVE, ERR_KV_TOO_SMALL = -13, -14

# Tensor classes and memory tiers: the rows and columns of ms_mem_result_t.by_class.
(CLASS_ATTENTION, CLASS_ROUTER, CLASS_SHARED, CLASS_ROUTED, CLASS_DENSE, CLASS_EMBED, CLASS_HEAD, CLASS_MTP,
 CLASS_KV, CLASS_STATE, CLASS_BUFFERS, N_CLASSES) = range(12)
TIER_GPU, TIER_HOST, TIER_STORAGE, N_TIERS = range(4)

# Placements (MS_PLACE_*), keyed by the --placement names of spec.placement.
(PLACE_ALL_GPU, PLACE_EXPERTS_CPU, PLACE_N_CPU_MOE, PLACE_GPU_EXPERTS, PLACE_LAYERS_GPU, PLACE_CPU_ONLY,
 PLACE_UNIFIED, PLACE_OFFLOAD_CACHE, N_PLACEMENTS) = range(9)
PLACEMENT_CODES = {
    "all-gpu": PLACE_ALL_GPU, "experts-cpu": PLACE_EXPERTS_CPU, "n-cpu-moe": PLACE_N_CPU_MOE,
    "gpu-experts": PLACE_GPU_EXPERTS, "layers-gpu": PLACE_LAYERS_GPU, "cpu-only": PLACE_CPU_ONLY,
    "unified": PLACE_UNIFIED, "offload-cache": PLACE_OFFLOAD_CACHE,
}

# Bits of ms_mem_result_t.fits: which tiers a configuration uses; 0 means it does not fit.
FITS_GPU, FITS_HOST, FITS_STORAGE = 1, 2, 4

# Where a layer's routed experts are served from (MS_EXP_*).
EXP_NONE, EXP_GPU, EXP_CPU, EXP_SPLIT, EXP_FETCH, N_EXP_MODES = range(6)
POLICY_LRU, POLICY_LFU, POLICY_STATIC, POLICY_BELADY, N_POLICIES = range(5)
POLICIES = {"lru": POLICY_LRU, "lfu": POLICY_LFU, "static": POLICY_STATIC, "belady": POLICY_BELADY}
MODE_MONTECARLO, MODE_ANALYTIC = range(2)
# Fields of an analytic table row per routing layer (MS_CHE_*; ms_che_table, engine.decode.che_table).
CHE_FIELDS = ("distinct", "pinned_q", "pinned_p", "free_q", "free_p", "hit_rate", "reuse")
CHE_D, CHE_PINNED_Q, CHE_PINNED_P, CHE_FREE_Q, CHE_FREE_P, CHE_HIT, CHE_REUSE = range(7)
MODES = {"montecarlo": MODE_MONTECARLO, "analytic": MODE_ANALYTIC}

# Resources a step's time is attributed to, byte counters and phases.
(RES_GPU_MEM, RES_GPU_COMPUTE, RES_HOST_MEM, RES_CPU_COMPUTE, RES_PCIE, RES_STORAGE, RES_LATENCY,
 RES_INTERCONNECT, N_RES) = range(9)
BYTES_GPU_MEM, BYTES_HOST_MEM, BYTES_PCIE, BYTES_STORAGE, N_BYTES = range(5)
(PHASE_ATTENTION, PHASE_EXPERTS, PHASE_TRANSFER, PHASE_SYNC, PHASE_HEAD, PHASE_OVERHEAD, PHASE_ALLTOALL,
 N_PHASES) = range(8)

# Sweep group rules: how each configuration's placement is chosen.
SWEEP_FIXED, SWEEP_AUTO_LLAMA, SWEEP_AUTO_KT = range(3)

# Kernel limits (MS_MAX_*; engine.glue checks them before C runs, naming the field and the bound).
MAX_MOE_LAYERS = 256   # MoE layers of one routing table (ms_routing_t.n_layers)
MAX_TOP_K = 512        # experts per token (ms_routing_t.top_k)
UNION_VAR_EXPERTS = 16  # the analytic LRU reads a step's distinct-count variance up to this many experts (ms_internal.h)
MAX_HISTORY = 256      # recency lags (ms_routing_t.history)
MAX_PARTNERS = 64      # cross-layer partners per expert (ms_routing_t.n_partners)
SWEEP_MAX_FNS = 64     # context functions per sweep group


def placement_code(placement) -> int:
    """The kernel's MS_PLACE_* code of a :class:`~moesim.spec.placement.Placement`."""
    return PLACEMENT_CODES[placement.kind]
