# Memory accounting: ms_model_t and columns of ms_mem_config_t into ms_memory_many; included by _kernel.pyx.


cdef void _fill_model(ms_model_t *m, dict t, dict keep):
    """ms_model_t from a checked table (glue.MODEL)."""
    m.n_layers = <int32_t> t["attn"].shape[0]
    m.attn = <double *> _data(keep, "attn", t["attn"])
    m.router = <double *> _data(keep, "router", t["router"])
    m.shared = <double *> _data(keep, "shared", t["shared"])
    m.expert_one = <double *> _data(keep, "expert_one", t["expert_one"])
    m.n_experts = <int32_t *> _data(keep, "n_experts", t["n_experts"])
    m.dense = <double *> _data(keep, "dense", t["dense"])
    m.kv_elems = <double *> _data(keep, "kv_elems", t["kv_elems"])
    m.kv_fixed = <double *> _data(keep, "kv_fixed", t["kv_fixed"])
    m.kv_ratio_elems = <double *> _data(keep, "kv_ratio_elems", t["kv_ratio_elems"])
    m.kv_ratio_fixed = <double *> _data(keep, "kv_ratio_fixed", t["kv_ratio_fixed"])
    m.kv_state = <double *> _data(keep, "kv_state", t["kv_state"])
    m.kv_cap = <int64_t *> _data(keep, "kv_cap", t["kv_cap"])
    m.kv_ratio = <int64_t *> _data(keep, "kv_ratio", t["kv_ratio"])
    m.embed = t["embed"]
    m.head = t["head"]
    m.mtp = t["mtp"]
    m.mtp_layers = t["mtp_layers"]
    m.max_context = t["max_context"]


cdef void _fill_mem_configs(ms_mem_config_t *cfg, dict c, Py_ssize_t n):
    """n ms_mem_config_t from checked columns (glue.MEM_CONFIG_COLUMNS, each of length n)."""
    cdef const int64_t[::1] context = c["context"], batch = c["batch"], placement_arg = c["placement_arg"]
    cdef const int64_t[::1] kv_granularity = c["kv_granularity"]
    cdef const int32_t[::1] placement = c["placement"], mtp = c["mtp"], n_gpus = c["n_gpus"]
    cdef const int32_t[::1] storage_spill = c["storage_spill"], embed_on_gpu = c["embed_on_gpu"]
    cdef const double[::1] kvb = c["kv_bytes_per_elem"], gpu_capacity = c["gpu_capacity"]
    cdef const double[::1] host_capacity = c["host_capacity"], storage_capacity = c["storage_capacity"]
    cdef const double[::1] gpu_fixed = c["gpu_fixed"], gpu_buf0 = c["gpu_buf0"], gpu_buf_ctx = c["gpu_buf_ctx"]
    cdef const double[::1] host_fixed = c["host_fixed"], host_buf0 = c["host_buf0"], host_buf_ctx = c["host_buf_ctx"]
    cdef const double[::1] head_copy = c["head_copy"]
    cdef const double[:, ::1] gpu_ways = c["gpu_ways"]
    cdef Py_ssize_t i
    cdef int k
    with nogil:
        for i in range(n):
            cfg[i].context = context[i]
            cfg[i].batch = batch[i]
            cfg[i].kv_bytes_per_elem = kvb[i]
            cfg[i].placement = placement[i]
            cfg[i].placement_arg = placement_arg[i]
            cfg[i].mtp = mtp[i]
            cfg[i].n_gpus = n_gpus[i]
            cfg[i].gpu_capacity = gpu_capacity[i]
            cfg[i].host_capacity = host_capacity[i]
            cfg[i].storage_capacity = storage_capacity[i]
            cfg[i].storage_spill = storage_spill[i]
            cfg[i].embed_on_gpu = embed_on_gpu[i]
            cfg[i].head_copy = head_copy[i]
            cfg[i].kv_granularity = kv_granularity[i]
            cfg[i].gpu_fixed = gpu_fixed[i]
            cfg[i].gpu_buf0 = gpu_buf0[i]
            cfg[i].gpu_buf_ctx = gpu_buf_ctx[i]
            cfg[i].host_fixed = host_fixed[i]
            cfg[i].host_buf0 = host_buf0[i]
            cfg[i].host_buf_ctx = host_buf_ctx[i]
            for k in range(MS_N_CLASSES):
                cfg[i].gpu_ways[k] = gpu_ways[i, k]


cdef dict _mem_results(const ms_mem_result_t *res, Py_ssize_t n):
    """Result arrays of n ms_mem_result_t."""
    by_class = np.empty((n, MS_N_CLASSES, MS_N_TIERS), dtype=np.float64)
    tier = np.empty((n, MS_N_TIERS), dtype=np.float64)
    gpu_per_gpu = np.empty(n, dtype=np.float64)
    weights = np.empty(n, dtype=np.float64)
    kv = np.empty(n, dtype=np.float64)
    state = np.empty(n, dtype=np.float64)
    slope = np.empty(n, dtype=np.float64)
    fits = np.empty(n, dtype=np.int32)
    max_context = np.empty(n, dtype=np.int64)
    max_batch = np.empty(n, dtype=np.int64)
    cdef double[:, :, ::1] bc_v = by_class
    cdef double[:, ::1] tier_v = tier
    cdef double[::1] g1_v = gpu_per_gpu, w_v = weights, kv_v = kv, st_v = state, sl_v = slope
    cdef int32_t[::1] fits_v = fits
    cdef int64_t[::1] mc_v = max_context, mb_v = max_batch
    cdef Py_ssize_t i
    cdef int k, t
    with nogil:
        for i in range(n):
            for k in range(MS_N_CLASSES):
                for t in range(MS_N_TIERS):
                    bc_v[i, k, t] = res[i].by_class[k][t]
            for t in range(MS_N_TIERS):
                tier_v[i, t] = res[i].tier[t]
            g1_v[i] = res[i].gpu_per_gpu
            w_v[i] = res[i].weights
            kv_v[i] = res[i].kv
            st_v[i] = res[i].state
            sl_v[i] = res[i].kv_bytes_per_token
            fits_v[i] = res[i].fits
            mc_v[i] = res[i].max_context
            mb_v[i] = res[i].max_batch
    return dict(by_class=by_class, tier=tier, gpu_per_gpu=gpu_per_gpu, weights=weights, kv=kv, state=state, kv_bytes_per_token=slope, fits=fits,
                max_context=max_context, max_batch=max_batch)


def memory_many(low, dict cols, int n_threads):
    """Evaluate len(cols['context']) configurations of one lowered model; returns (code, bad_index, results)."""
    cdef ms_model_t m
    keep = {}
    _fill_model(&m, check_struct("ms_model_t", low), keep)
    c = check_columns("ms_mem_config_t[]", cols)
    cdef Py_ssize_t n = c["n"]
    cdef ms_mem_config_t *cfg = <ms_mem_config_t *> malloc(max(n, 1) * sizeof(ms_mem_config_t))
    cdef ms_mem_result_t *res = <ms_mem_result_t *> malloc(max(n, 1) * sizeof(ms_mem_result_t))
    cdef int code = 0
    cdef int64_t bad = -1
    if cfg == NULL or res == NULL:
        free(cfg)
        free(res)
        raise MemoryError()
    try:
        _fill_mem_configs(cfg, c, n)
        with nogil:
            code = ms_memory_many(&m, cfg, n, res, n_threads, &bad)
        if code == 0:
            out = _mem_results(res, n)
        else:   # the columns' shapes, nothing in them (the caller raises through handle_library_error)
            out = {k: np.empty((n,) + v.shape[1:], dtype=v.dtype) for k, v in _mem_results(res, 0).items()}
    finally:
        free(cfg)
        free(res)
    return code, bad, out
