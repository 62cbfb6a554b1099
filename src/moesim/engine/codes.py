"""The enum codes of ``csrc/moesim.h``, mirrored once for Python."""
from __future__ import annotations


FITS_GPU, FITS_HOST, FITS_STORAGE = 1, 2, 4

POLICIES = {"lru": 0, "lfu": 1, "static": 2, "belady": 3}
MODES = {"montecarlo": 0, "analytic": 1}
EXP_NONE, EXP_GPU, EXP_CPU, EXP_SPLIT, EXP_FETCH = range(5)

N_CLASSES, N_TIERS = 11, 3
ATT, ROUTER, SHARED, ROUTED, DENSE, EMBED, HEAD, MTP, KV, STATE, BUF = range(11)
GPU, HOST, STORAGE = range(3)
ALL_GPU, EXPERTS_CPU, N_CPU_MOE, GPU_EXPERTS, LAYERS_GPU, CPU_ONLY, UNIFIED, OFFLOAD_CACHE = range(8)
EXP_NONE, EXP_GPU, EXP_CPU, EXP_SPLIT, EXP_FETCH = range(5)
LRU, LFU, STATIC, BELADY = range(4)
R_GPU_MEM, R_GPU_FLOPS, R_HOST_MEM, R_CPU_FLOPS, R_PCIE, R_STORAGE, R_LATENCY, R_NET = range(8)
B_GPU, B_HOST, B_PCIE, B_STORAGE = range(4)
P_ATT, P_EXP, P_XFER, P_SYNC, P_HEAD, P_OVER = range(6)

FITS_GPU, FITS_HOST, FITS_STORAGE = 1, 2, 4
