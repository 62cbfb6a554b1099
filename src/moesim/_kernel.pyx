# cython: language_level=3
"""Thin glue between validated numpy arrays and the C core: convert, release the GIL, call, return.

Nothing else lives here: validation happens in the Python modules before these functions run.
"""
import numpy as np
cimport numpy as cnp
from libc.stdlib cimport malloc, free
from libc.stdint cimport int32_t, int64_t

cnp.import_array()


def strerror(int code):
    """The C core's message for an error code (one table, csrc/ms_error.c)."""
    return ms_strerror(code).decode("utf-8")


def openmp_enabled():
    """True when the extension was compiled with OpenMP (thread count > 1 is then honoured)."""
    return bool(_HAVE_OPENMP)


cdef extern from *:
    """
    #ifdef MOESIM_HAVE_OPENMP
    #define _HAVE_OPENMP 1
    #else
    #define _HAVE_OPENMP 0
    #endif
    """
    int _HAVE_OPENMP


cdef void _fill_model(ms_model_t *m, low,
                      const double[::1] attn, const double[::1] router, const double[::1] shared,
                      const double[::1] expert_one, const int32_t[::1] n_experts, const double[::1] dense,
                      const double[::1] kv_elems, const double[::1] kv_fixed, const double[::1] kv_ratio_elems,
                      const double[::1] kv_ratio_fixed, const double[::1] kv_state, const int64_t[::1] kv_cap,
                      const int64_t[::1] kv_ratio):
    m.n_layers = <int32_t> attn.shape[0]
    m.attn = &attn[0]
    m.router = &router[0]
    m.shared = &shared[0]
    m.expert_one = &expert_one[0]
    m.n_experts = &n_experts[0]
    m.dense = &dense[0]
    m.kv_elems = &kv_elems[0]
    m.kv_fixed = &kv_fixed[0]
    m.kv_ratio_elems = &kv_ratio_elems[0]
    m.kv_ratio_fixed = &kv_ratio_fixed[0]
    m.kv_state = &kv_state[0]
    m.kv_cap = &kv_cap[0]
    m.kv_ratio = &kv_ratio[0]
    m.embed = low.embed
    m.head = low.head
    m.mtp = low.mtp
    m.mtp_layers = low.mtp_layers
    m.max_context = low.max_context


def memory_many(low, dict cols, int n_threads):
    """Evaluate len(cols['context']) configurations of one lowered model; returns (code, bad_index, results)."""
    cdef ms_model_t m
    # Keep contiguous arrays alive for the duration of the call.
    arrays = [np.ascontiguousarray(getattr(low, name), dtype=np.float64) for name in
              ("attn", "router", "shared", "expert_one")]
    n_exp = np.ascontiguousarray(low.n_experts, dtype=np.int32)
    more = [np.ascontiguousarray(getattr(low, name), dtype=np.float64) for name in
            ("dense", "kv_elems", "kv_fixed", "kv_ratio_elems", "kv_ratio_fixed", "kv_state")]
    cap = np.ascontiguousarray(low.kv_cap, dtype=np.int64)
    ratio = np.ascontiguousarray(low.kv_ratio, dtype=np.int64)
    _fill_model(&m, low, arrays[0], arrays[1], arrays[2], arrays[3], n_exp, more[0], more[1], more[2],
                more[3], more[4], more[5], cap, ratio)

    cdef Py_ssize_t n = cols["context"].shape[0], i
    cdef const int64_t[::1] context = cols["context"]
    cdef const int64_t[::1] batch = cols["batch"]
    cdef const double[::1] kvb = cols["kv_bytes_per_elem"]
    cdef const int64_t[::1] placement = cols["placement"]
    cdef const int64_t[::1] placement_arg = cols["placement_arg"]
    cdef const int64_t[::1] mtp = cols["mtp"]
    cdef const int64_t[::1] n_gpus = cols["n_gpus"]
    cdef const double[::1] gpu_capacity = cols["gpu_capacity"]
    cdef const double[::1] host_capacity = cols["host_capacity"]
    cdef const double[::1] storage_capacity = cols["storage_capacity"]
    cdef const int64_t[::1] storage_spill = cols["storage_spill"]
    cdef const int64_t[::1] embed_on_gpu = cols["embed_on_gpu"]
    cdef const int64_t[::1] kv_granularity = cols["kv_granularity"]
    cdef const double[::1] gpu_fixed = cols["gpu_fixed"]
    cdef const double[::1] gpu_buf0 = cols["gpu_buf0"]
    cdef const double[::1] gpu_buf_ctx = cols["gpu_buf_ctx"]
    cdef const double[::1] host_fixed = cols["host_fixed"]
    cdef const double[::1] host_buf0 = cols["host_buf0"]
    cdef const double[::1] host_buf_ctx = cols["host_buf_ctx"]

    by_class = np.empty((n, 11, 3), dtype=np.float64)
    tier = np.empty((n, 3), dtype=np.float64)
    weights = np.empty(n, dtype=np.float64)
    kv = np.empty(n, dtype=np.float64)
    state = np.empty(n, dtype=np.float64)
    slope = np.empty(n, dtype=np.float64)
    fits = np.empty(n, dtype=np.int32)
    max_context = np.empty(n, dtype=np.int64)
    max_batch = np.empty(n, dtype=np.int64)
    cdef double[:, :, ::1] bc_v = by_class
    cdef double[:, ::1] tier_v = tier
    cdef double[::1] w_v = weights, kv_v = kv, st_v = state, sl_v = slope
    cdef int32_t[::1] fits_v = fits
    cdef int64_t[::1] mc_v = max_context, mb_v = max_batch

    cdef ms_mem_config_t *cfg = <ms_mem_config_t *> malloc(max(n, 1) * sizeof(ms_mem_config_t))
    cdef ms_mem_result_t *res = <ms_mem_result_t *> malloc(max(n, 1) * sizeof(ms_mem_result_t))
    cdef int code = 0
    cdef int64_t bad = -1
    cdef int k, t
    if cfg == NULL or res == NULL:
        free(cfg)
        free(res)
        raise MemoryError()
    try:
        with nogil:
            for i in range(n):
                cfg[i].context = context[i]
                cfg[i].batch = batch[i]
                cfg[i].kv_bytes_per_elem = kvb[i]
                cfg[i].placement = <int32_t> placement[i]
                cfg[i].placement_arg = placement_arg[i]
                cfg[i].mtp = <int32_t> mtp[i]
                cfg[i].n_gpus = <int32_t> n_gpus[i]
                cfg[i].gpu_capacity = gpu_capacity[i]
                cfg[i].host_capacity = host_capacity[i]
                cfg[i].storage_capacity = storage_capacity[i]
                cfg[i].storage_spill = <int32_t> storage_spill[i]
                cfg[i].embed_on_gpu = <int32_t> embed_on_gpu[i]
                cfg[i].kv_granularity = kv_granularity[i]
                cfg[i].gpu_fixed = gpu_fixed[i]
                cfg[i].gpu_buf0 = gpu_buf0[i]
                cfg[i].gpu_buf_ctx = gpu_buf_ctx[i]
                cfg[i].host_fixed = host_fixed[i]
                cfg[i].host_buf0 = host_buf0[i]
                cfg[i].host_buf_ctx = host_buf_ctx[i]
            code = ms_memory_many(&m, cfg, n, res, n_threads, &bad)
            if code == 0:
                for i in range(n):
                    for k in range(11):
                        for t in range(3):
                            bc_v[i, k, t] = res[i].by_class[k][t]
                    for t in range(3):
                        tier_v[i, t] = res[i].tier[t]
                    w_v[i] = res[i].weights
                    kv_v[i] = res[i].kv
                    st_v[i] = res[i].state
                    sl_v[i] = res[i].kv_bytes_per_token
                    fits_v[i] = res[i].fits
                    mc_v[i] = res[i].max_context
                    mb_v[i] = res[i].max_batch
    finally:
        free(cfg)
        free(res)
    return code, bad, dict(by_class=by_class, tier=tier, weights=weights, kv=kv, state=state,
                           kv_bytes_per_token=slope, fits=fits, max_context=max_context, max_batch=max_batch)
