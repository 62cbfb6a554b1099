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


# ------------------------------------------------------------------------------------ decode
DECODE_MODEL_F64 = ("attn_bytes", "attn_flops", "kv_bytes", "score_flops", "shared_bytes", "shared_flops",
                    "expert_bytes", "expert_flops")
DECODE_MODEL_I32 = ("attn_on_gpu", "expert_mode", "slots", "page_slots", "moe_index")


cdef void *_ptr(dict keep, str name, value, dtype):
    """Contiguous copy of value kept alive in `keep`; returns its data pointer."""
    arr = np.ascontiguousarray(value, dtype=dtype)
    if arr.size == 0:
        arr = np.zeros(1, dtype=dtype)
    keep[name] = arr
    return cnp.PyArray_DATA(arr)


cdef void _fill_decode_model(ms_decode_model_t *m, dict dm, dict keep):
    m.n_layers = <int32_t> len(dm["attn_bytes"])
    m.attn_bytes = <double *> _ptr(keep, "attn_bytes", dm["attn_bytes"], np.float64)
    m.attn_flops = <double *> _ptr(keep, "attn_flops", dm["attn_flops"], np.float64)
    m.kv_bytes = <double *> _ptr(keep, "kv_bytes", dm["kv_bytes"], np.float64)
    m.score_flops = <double *> _ptr(keep, "score_flops", dm["score_flops"], np.float64)
    m.shared_bytes = <double *> _ptr(keep, "shared_bytes", dm["shared_bytes"], np.float64)
    m.shared_flops = <double *> _ptr(keep, "shared_flops", dm["shared_flops"], np.float64)
    m.expert_bytes = <double *> _ptr(keep, "expert_bytes", dm["expert_bytes"], np.float64)
    m.expert_flops = <double *> _ptr(keep, "expert_flops", dm["expert_flops"], np.float64)
    m.attn_on_gpu = <int32_t *> _ptr(keep, "attn_on_gpu", dm["attn_on_gpu"], np.int32)
    m.expert_mode = <int32_t *> _ptr(keep, "expert_mode", dm["expert_mode"], np.int32)
    m.slots = <int32_t *> _ptr(keep, "slots", dm["slots"], np.int32)
    m.page_slots = <int32_t *> _ptr(keep, "page_slots", dm["page_slots"], np.int32)
    m.moe_index = <int32_t *> _ptr(keep, "moe_index", dm["moe_index"], np.int32)
    m.head_bytes = dm["head_bytes"]
    m.head_flops = dm["head_flops"]
    m.head_on_gpu = dm["head_on_gpu"]
    m.draft_bytes = dm["draft_bytes"]
    m.draft_flops = dm["draft_flops"]
    m.act_bytes = dm["act_bytes"]
    m.allreduce_bytes = dm["allreduce_bytes"]


cdef void _fill_machine(ms_machine_t *h, dict hw):
    h.gpu_bw = hw["gpu_bw"]; h.host_bw = hw["host_bw"]; h.pcie_bw = hw["pcie_bw"]
    h.storage_bw = hw["storage_bw"]; h.gpu_flops = hw["gpu_flops"]; h.cpu_flops = hw["cpu_flops"]
    h.interconnect_bw = hw["interconnect_bw"]; h.unified = hw["unified"]; h.overlap = hw["overlap"]
    h.launch_s = hw["launch_s"]; h.sync_s = hw["sync_s"]; h.dma_s = hw["dma_s"]
    h.allreduce_s = hw["allreduce_s"]; h.step_s = hw["step_s"]
    h.seq_s = hw.get("seq_s", 0.0)


def q_tables(q, int top_k):
    """Per-routing tables the analytic path shares across configurations: mean inclusion
    probability over scenarios, log(1 - mean) and the per-layer sum of squares."""
    q = np.asarray(q, dtype=np.float64)
    qbar = q.mean(axis=0)
    return {"qbar": qbar, "lqbar": np.log1p(-np.minimum(qbar, 1.0 - 1e-16)), "qsq": (q * q).sum(axis=(0, 2))}


cdef void _fill_routing(ms_routing_t *r, dict rt, dict keep):
    E = max(1, int(rt["n_experts"]))
    L = max(1, int(rt["n_layers"]))
    r.n_layers = rt["n_layers"]
    r.n_experts = rt["n_experts"]
    r.top_k = rt["top_k"]
    r.n_group = rt.get("n_group", 0)
    r.topk_group = rt.get("topk_group", 0)
    r.log_pop = <double *> _ptr(keep, "log_pop", rt.get("log_pop", np.zeros((L, E))), np.float64)
    r.stickiness = <double *> _ptr(keep, "stickiness", rt.get("stickiness", np.zeros(L)), np.float64)
    r.recall = <double *> _ptr(keep, "recall", rt.get("recall", np.zeros(L)), np.float64)
    r.hot = <int32_t *> _ptr(keep, "hot", rt.get("hot", np.tile(np.arange(E), (L, 1))), np.int32)
    r.concentration = rt.get("concentration", 0.0)
    r.request_tokens = rt.get("request_tokens", 0)
    q = np.asarray(rt.get("q", np.zeros((1, L, E))), dtype=np.float64)
    r.n_scenarios = q.shape[0]
    r.q = <double *> _ptr(keep, "q", q, np.float64)
    tabs = rt.get("q_tables") or q_tables(q, int(rt["top_k"]))
    r.qbar = <double *> _ptr(keep, "qbar", tabs["qbar"], np.float64)
    r.lqbar = <double *> _ptr(keep, "lqbar", tabs["lqbar"], np.float64)
    r.qsq = <double *> _ptr(keep, "qsq", tabs["qsq"], np.float64)
    r.trace = NULL
    r.trace_tokens = 0
    r.trace_layers = 0
    trace = rt.get("trace")
    if trace is not None:
        r.trace = <int32_t *> _ptr(keep, "trace", trace, np.int32)
        r.trace_tokens = trace.shape[0]
        r.trace_layers = trace.shape[1]


cdef void _fill_config(ms_decode_config_t *c, dict cols, Py_ssize_t i):
    c.batch = int(cols["batch"][i])
    c.tokens_per_step = int(cols["tokens_per_step"][i])
    c.drafts = int(cols["drafts"][i])
    c.accepted = float(cols["accepted"][i])
    c.steps = int(cols["steps"][i])
    c.warmup = int(cols["warmup"][i])
    c.policy = int(cols["policy"][i])
    c.mode = int(cols["mode"][i])
    c.seed = int(cols["seed"][i]) & 0xFFFFFFFFFFFFFFFF
    c.index = int(cols["index"][i]) & 0xFFFFFFFFFFFFFFFF


def decode_many(dict dm, dict hw, dict rt, dict cols, int n_threads):
    """Run len(cols['batch']) decode configurations; returns (code, bad_index, result arrays)."""
    cdef ms_decode_model_t m
    cdef ms_machine_t mach
    cdef ms_routing_t r
    keep = {}
    _fill_decode_model(&m, dm, keep)
    _fill_machine(&mach, hw)
    _fill_routing(&r, rt, keep)
    cdef Py_ssize_t n = len(cols["batch"]), i
    cdef ms_decode_config_t *cfg = <ms_decode_config_t *> malloc(max(n, 1) * sizeof(ms_decode_config_t))
    cdef ms_decode_result_t *res = <ms_decode_result_t *> malloc(max(n, 1) * sizeof(ms_decode_result_t))
    if cfg == NULL or res == NULL:
        free(cfg); free(res)
        raise MemoryError()
    cdef int64_t ws_bytes = 64, w
    for i in range(n):
        _fill_config(&cfg[i], cols, i)
        w = ms_decode_workspace_size(&m, &r, &cfg[i])
        if w > ws_bytes:
            ws_bytes = w
    cdef int nt = max(1, n_threads if _HAVE_OPENMP else 1)
    ws_bytes = (ws_bytes + 63) // 64 * 64
    cdef char *ws = <char *> malloc(ws_bytes * nt)
    if ws == NULL:
        free(cfg); free(res)
        raise MemoryError()
    cdef int code = 0, k
    cdef int64_t bad = -1
    names = ("step_mean", "step_p50", "step_p99", "accepted", "hit_rate", "page_hit_rate", "distinct", "reuse",
             "selections")
    out = {name: np.empty(n) for name in names}
    by_res = np.empty((n, 8)); by_phase = np.empty((n, 6)); nbytes = np.empty((n, 4))
    try:
        with nogil:
            code = ms_decode_many(&m, &mach, &r, cfg, n, res, nt, ws, ws_bytes, &bad)
        if code == 0:
            for i in range(n):
                out["step_mean"][i] = res[i].step_mean
                out["step_p50"][i] = res[i].step_p50
                out["step_p99"][i] = res[i].step_p99
                out["accepted"][i] = res[i].accepted
                out["hit_rate"][i] = res[i].hit_rate
                out["page_hit_rate"][i] = res[i].page_hit_rate
                out["distinct"][i] = res[i].distinct
                out["reuse"][i] = res[i].reuse
                out["selections"][i] = res[i].selections
                for k in range(8):
                    by_res[i, k] = res[i].by_resource[k]
                for k in range(6):
                    by_phase[i, k] = res[i].by_phase[k]
                for k in range(4):
                    nbytes[i, k] = res[i].bytes[k]
    finally:
        free(cfg); free(res); free(ws)
    out["by_resource"] = by_res
    out["by_phase"] = by_phase
    out["bytes"] = nbytes
    return code, bad, out


def route_sample(dict rt, dict cols):
    """Token-level picks [steps, batch, tokens_per_step, layers, k] of one Monte Carlo configuration."""
    cdef ms_routing_t r
    cdef ms_decode_config_t c
    cdef ms_decode_model_t m
    keep = {}
    _fill_routing(&r, rt, keep)
    _fill_config(&c, cols, 0)
    shape = (c.steps, c.batch, c.tokens_per_step, r.n_layers, r.top_k)
    out = np.empty(shape, dtype=np.int32)
    cdef int32_t[::1] v_out = out.reshape(-1)
    # workspace as for a one-layer dense model (the sampler needs only the routing buffers)
    dz = {"attn_bytes": [0.0], "attn_flops": [0.0], "kv_bytes": [0.0], "score_flops": [0.0],
          "shared_bytes": [0.0], "shared_flops": [0.0], "expert_bytes": [0.0], "expert_flops": [0.0],
          "attn_on_gpu": [0], "expert_mode": [0], "slots": [0], "page_slots": [0], "moe_index": [-1],
          "head_bytes": 0.0, "head_flops": 0.0, "head_on_gpu": 0, "draft_bytes": 0.0, "draft_flops": 0.0,
          "act_bytes": 0.0, "allreduce_bytes": 0.0}
    _fill_decode_model(&m, dz, keep)
    cdef int64_t wsb = ms_decode_workspace_size(&m, &r, &c)
    cdef char *ws = <char *> malloc(max(wsb, 64))
    cdef int code
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_route_sample(&r, &c, &v_out[0], ws, wsb)
    finally:
        free(ws)
    return code, out


def cache_replay(sel, nsel, int n_experts, int capacity, int policy, hot, long long warmup):
    """Per-layer (hits, accesses) of one cache replaying step unions sel [T, L, W] / nsel [T, L]."""
    s = np.ascontiguousarray(sel, dtype=np.int32)
    ns = np.ascontiguousarray(nsel, dtype=np.int32)
    cdef int64_t T = s.shape[0]
    cdef int32_t L = s.shape[1], W = s.shape[2]
    keep = {}
    cdef int32_t *p_s = <int32_t *> _ptr(keep, "s", s, np.int32)
    cdef int32_t *p_n = <int32_t *> _ptr(keep, "n", ns, np.int32)
    cdef int32_t *p_h = <int32_t *> _ptr(keep, "h", hot if hot is not None else np.tile(np.arange(n_experts), (L, 1)),
                                         np.int32)
    hits = np.zeros(L)
    acc = np.zeros(L)
    cdef double[::1] v_hits = hits, v_acc = acc
    cdef int64_t wsb = ms_cache_workspace_size(n_experts, L, T, W)
    cdef char *ws = <char *> malloc(max(wsb, 64))
    cdef int code
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_cache_replay(p_s, p_n, T, L, W, n_experts, capacity, policy, p_h, warmup, ws, wsb,
                                   &v_hits[0], &v_acc[0])
    finally:
        free(ws)
    return code, hits, acc
