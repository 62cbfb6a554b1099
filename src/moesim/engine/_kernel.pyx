# cython: language_level=3
"""Thin glue between validated numpy arrays and the C core: convert, release the GIL, call, return.

Nothing else lives here: validation happens in the Python modules before these functions run.
"""
import numpy as np
cimport numpy as cnp
from libc.stdlib cimport malloc, free
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memset

cnp.import_array()


def strerror(int code):
    """The C core's message for an error code (one table, csrc/ms_error.c)."""
    return ms_strerror(code).decode("utf-8")


def rng_outputs(state, int64_t n):
    """The first n outputs of the kernel's xoshiro256** from the raw 4-word state (known-answer tests)."""
    cdef ms_rng_t rng
    cdef int64_t i
    words = [int(w) & 0xFFFFFFFFFFFFFFFF for w in state]
    if len(words) != 4 or n < 0:
        raise ValueError("rng_outputs needs a 4-word state and n >= 0")
    for i in range(4):
        rng.s[i] = words[i]
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] v = out
    for i in range(n):
        v[i] = ms_rng_next(&rng)
    return out


def splitmix64_outputs(uint64_t seed, int64_t n):
    """The first n outputs of the kernel's splitmix64 started at *seed* (known-answer tests)."""
    cdef uint64_t x = seed
    cdef int64_t i
    out = np.empty(max(n, 0), dtype=np.uint64)
    cdef uint64_t[::1] v = out
    for i in range(max(n, 0)):
        v[i] = ms_splitmix64_next(&x)
    return out


def rng_stream(uint64_t seed, uint64_t a, uint64_t b, int64_t n):
    """(outputs, uniforms) of the stream named (seed, a, b), n of each from two fresh streams."""
    cdef ms_rng_t rng
    cdef int64_t i
    raw = np.empty(max(n, 0), dtype=np.uint64)
    uni = np.empty(max(n, 0), dtype=np.float64)
    cdef uint64_t[::1] vr = raw
    cdef double[::1] vu = uni
    ms_rng_init(&rng, seed, a, b)
    for i in range(max(n, 0)):
        vr[i] = ms_rng_next(&rng)
    ms_rng_init(&rng, seed, a, b)
    for i in range(max(n, 0)):
        vu[i] = ms_rng_uniform(&rng)
    return raw, uni


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


# ------------------------------------------------------------------------------------ sweeps

MEM_OUT_F64 = ("weights_bytes", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes", "storage_bytes")


cdef void _fill_mem_config(ms_mem_config_t *c, dict cfg):
    c.context = 1
    c.batch = 1
    c.kv_bytes_per_elem = cfg["kv_bytes_per_elem"]
    c.placement = 0
    c.placement_arg = 0
    c.mtp = cfg["mtp"]
    c.n_gpus = cfg["n_gpus"]
    c.gpu_capacity = cfg["gpu_capacity"]
    c.host_capacity = cfg["host_capacity"]
    c.storage_capacity = cfg["storage_capacity"]
    c.storage_spill = cfg["storage_spill"]
    c.embed_on_gpu = cfg["embed_on_gpu"]
    c.kv_granularity = cfg["kv_granularity"]
    c.gpu_fixed = cfg["gpu_fixed"]
    c.gpu_buf0 = cfg["gpu_buf0"]
    c.gpu_buf_ctx = cfg["gpu_buf_ctx"]
    c.host_fixed = cfg["host_fixed"]
    c.host_buf0 = cfg["host_buf0"]
    c.host_buf_ctx = cfg["host_buf_ctx"]


cdef class SweepMemory:
    """C view of one group's memory tables (moesim.sweep builds the dict)."""
    cdef ms_sweep_mem_t g
    cdef ms_sweep_place_t *places
    cdef object keep

    def __cinit__(self):
        self.places = NULL

    def __init__(self, dict t):
        keep = {}
        self.g.n_kinds = <int32_t> len(t["per_token"])
        self.g.per_token = <double *> _ptr(keep, "per_token", t["per_token"], np.float64)
        self.g.ratio_bytes = <double *> _ptr(keep, "ratio_bytes", t["ratio_bytes"], np.float64)
        self.g.state = <double *> _ptr(keep, "state", t["state"], np.float64)
        self.g.cap = <int64_t *> _ptr(keep, "cap", t["cap"], np.int64)
        self.g.ratio = <int64_t *> _ptr(keep, "ratio", t["ratio"], np.int64)
        self.g.count = <int32_t *> _ptr(keep, "count", t["count"], np.int32)
        gc = np.ascontiguousarray(t["gpu_count"], dtype=np.int32).reshape(-1, max(1, self.g.n_kinds))
        self.g.n_layouts = <int32_t> gc.shape[0]
        self.g.gpu_count = <int32_t *> _ptr(keep, "gpu_count", gc, np.int32)
        self.g.max_context = t["max_context"]
        _fill_mem_config(&self.g.cfg[0], t["cfg"][0])
        _fill_mem_config(&self.g.cfg[1], t["cfg"][1])
        pl = t["places"]
        cdef Py_ssize_t n = len(pl["code"]), j
        self.places = <ms_sweep_place_t *> malloc(max(n, 1) * sizeof(ms_sweep_place_t))
        if self.places == NULL:
            raise MemoryError()
        for j in range(n):
            self.places[j].code = pl["code"][j]
            self.places[j].arg = pl["arg"][j]
            self.places[j].layout = pl["layout"][j]
            self.places[j].cfg = pl["cfg"][j]
            self.places[j].any_gpu = pl["any_gpu"][j]
            self.places[j].label = pl["label"][j]
            self.places[j].w_gpu = pl["w_gpu"][j]
            self.places[j].w_host = pl["w_host"][j]
            self.places[j].routed_host = pl["routed_host"][j]
        self.g.n_places = <int32_t> n
        self.g.places = self.places
        self.g.rule = t["rule"]
        self.g.n_layers = t["n_layers"]
        self.g.n_experts = t["n_experts"]
        self.g.i_all_gpu = t["i_all_gpu"]
        self.g.i_n_cpu_moe = t["i_n_cpu_moe"]
        self.g.i_layers_gpu = t["i_layers_gpu"]
        self.g.i_cpu_only = t["i_cpu_only"]
        self.g.i_experts_cpu = t["i_experts_cpu"]
        self.g.i_gpu_experts = t["i_gpu_experts"]
        for j in range(8):
            self.g.fits_label[j] = t["fits_label"][j]
        self.keep = keep

    def __dealloc__(self):
        free(self.places)


MEM_OUT_I64 = ("context", "batch", "key", "max_context", "max_batch")
MEM_OUT_I32 = ("placement", "fits")


def sweep_memory(SweepMemory mem, contexts, batches, bint zipped, long long j0, long long n, int n_threads,
                 dict out):
    """Memory of configurations j0 .. j0+n-1 of one group into the columns of `out`; (code, bad)."""
    cdef const int64_t[::1] cv = contexts
    cdef const int64_t[::1] bv = batches
    if n <= 0:
        return 0, -1
    cdef int64_t[::1] ctx = out["context"], bat = out["batch"], key = out["key"], mc = out["max_context"]
    cdef int64_t[::1] mb = out["max_batch"]
    cdef int32_t[::1] place = out["placement"], fits = out["fits"]
    cdef double[::1] w = out["weights_bytes"], kv = out["kv_bytes"], st = out["state_bytes"]
    cdef double[::1] gpu = out["gpu_bytes"], host = out["host_bytes"], sto = out["storage_bytes"]
    if min(ctx.shape[0], bat.shape[0], key.shape[0], mc.shape[0], mb.shape[0], place.shape[0], fits.shape[0],
           w.shape[0], kv.shape[0], st.shape[0], gpu.shape[0], host.shape[0], sto.shape[0]) < n:
        raise ValueError("output column shorter than the configurations")
    cdef ms_sweep_mem_out_t o
    o.context = &ctx[0]; o.batch = &bat[0]; o.placement = &place[0]; o.fits = &fits[0]; o.key = &key[0]
    o.weights = &w[0]; o.kv = &kv[0]; o.state = &st[0]; o.gpu = &gpu[0]; o.host = &host[0]; o.storage = &sto[0]
    o.max_context = &mc[0]; o.max_batch = &mb[0]
    cdef ms_sweep_axes_t ax
    ax.contexts = &cv[0]
    ax.batches = &bv[0]
    ax.n_c = cv.shape[0]
    ax.n_b = <int32_t> bv.shape[0]
    ax.zipped = 1 if zipped else 0
    cdef int nt = max(1, n_threads if _HAVE_OPENMP else 1)
    cdef int64_t per = ms_sweep_memory_workspace_size(ax.n_b)
    cdef int64_t wsb = per * nt
    cdef void *ws = malloc(wsb)
    cdef int code
    cdef int64_t bad = -1
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_sweep_memory(&mem.g, &ax, j0, n, nt, ws, wsb, &o, &bad)
    finally:
        free(ws)
    return code, bad


def sweep_lookup(keys, table_keys, variant, Py_ssize_t max_missing=4096):
    """Variant index per key (-1 unknown) into `variant`; returns (unknown count, missing keys)."""
    cdef const int64_t[::1] k = keys
    cdef const int64_t[::1] tk = table_keys if len(table_keys) else np.zeros(1, dtype=np.int64)
    cdef int32_t[::1] v = variant
    cdef Py_ssize_t n = k.shape[0]
    missing = np.empty(max(1, max_missing), dtype=np.int64)
    cdef int64_t[::1] mv = missing
    cdef int64_t nm = 0, unknown = 0, n_table = len(table_keys)
    if n == 0:
        return 0, missing[:0]
    if v.shape[0] < n:
        raise ValueError("variant column shorter than keys")
    with nogil:
        unknown = ms_sweep_lookup(&k[0], n, &tk[0], n_table, &v[0], &mv[0], max_missing, &nm)
    return unknown, missing[:nm]


cdef void _fill_ctx_fns(ms_ctx_fn_t *out, f, c, Py_ssize_t n):
    cdef const double[:, ::1] fv = np.ascontiguousarray(f, dtype=np.float64).reshape(n, 5)
    cdef const int64_t[:, ::1] cv = np.ascontiguousarray(c, dtype=np.int64).reshape(n, 4)
    cdef Py_ssize_t i
    for i in range(n):
        out[i].a1 = fv[i, 0]; out[i].a2 = fv[i, 1]; out[i].b1 = fv[i, 2]; out[i].b2 = fv[i, 3]; out[i].s = fv[i, 4]
        out[i].c1 = cv[i, 0]; out[i].c2 = cv[i, 1]; out[i].r = cv[i, 2]; out[i].k1 = cv[i, 3]


def ctx_eval(f, c, long long context):
    """Evaluate one context function (5 floats, 4 ints) as the C kernel does (tests)."""
    cdef ms_ctx_fn_t fn
    _fill_ctx_fns(&fn, f, c, 1)
    return ms_ctx_eval(&fn, context)


cdef class SweepDecode:
    """C view of one group's decode variants (and Monte Carlo templates)."""
    cdef ms_sweep_decode_t d
    cdef ms_sweep_variant_t *variants
    cdef ms_sweep_kind_t *kinds
    cdef ms_ctx_fn_t *fns
    cdef ms_decode_model_t *models
    cdef ms_machine_t *machines
    cdef ms_routing_t routing
    cdef object keep

    def __cinit__(self):
        self.variants = NULL
        self.kinds = NULL
        self.fns = NULL
        self.models = NULL
        self.machines = NULL

    def __init__(self, dict t):
        keep = {}
        memset(&self.d, 0, sizeof(self.d))
        cdef Py_ssize_t nv = len(t["variant_f64"]), nk = len(t["kind_f64"]), nf = len(t["fn_kv_f"]), i, k
        if nf > 64:
            raise ValueError("too many distinct attention context functions")
        vf = np.ascontiguousarray(t["variant_f64"], dtype=np.float64).reshape(nv, 13)
        vi = np.ascontiguousarray(t["variant_i32"], dtype=np.int32).reshape(nv, 3)
        self.variants = <ms_sweep_variant_t *> malloc(max(nv, 1) * sizeof(ms_sweep_variant_t))
        self.kinds = <ms_sweep_kind_t *> malloc(max(nk, 1) * sizeof(ms_sweep_kind_t))
        self.fns = <ms_ctx_fn_t *> malloc(max(nf, 1) * 2 * sizeof(ms_ctx_fn_t))
        if self.variants == NULL or self.kinds == NULL or self.fns == NULL:
            raise MemoryError()
        for i in range(nv):
            self.variants[i].step0 = vf[i, 0]
            for k in range(8):
                self.variants[i].by_resource[k] = vf[i, 1 + k]
            self.variants[i].accepted = vf[i, 9]
            self.variants[i].tpot_scale = vf[i, 10]
            self.variants[i].hit_rate = vf[i, 11]
            self.variants[i].prefill0 = vf[i, 12]
            self.variants[i].kind0 = vi[i, 0]
            self.variants[i].n_kinds = vi[i, 1]
            self.variants[i].mc = vi[i, 2]
        kf = np.ascontiguousarray(t["kind_f64"], dtype=np.float64).reshape(nk, 5)
        ki = np.ascontiguousarray(t["kind_i32"], dtype=np.int32).reshape(nk, 3)
        for i in range(nk):
            self.kinds[i].n = kf[i, 0]
            self.kinds[i].t_bytes0 = kf[i, 1]
            self.kinds[i].kv_rate = kf[i, 2]
            self.kinds[i].t_flops0 = kf[i, 3]
            self.kinds[i].sf_rate = kf[i, 4]
            self.kinds[i].res_mem = ki[i, 0]
            self.kinds[i].res_flops = ki[i, 1]
            self.kinds[i].fn = ki[i, 2]
        if nf:
            _fill_ctx_fns(self.fns, t["fn_kv_f"], t["fn_kv_c"], nf)
            _fill_ctx_fns(self.fns + nf, t["fn_sf_f"], t["fn_sf_c"], nf)
        self.d.variants = self.variants
        self.d.n_variants = <int32_t> nv
        self.d.kinds = self.kinds
        self.d.n_fns = <int32_t> nf
        self.d.fn_kv = self.fns
        self.d.fn_sf = self.fns + nf
        self.d.prompt = t["prompt"]
        mc = t.get("mc")
        cdef Py_ssize_t nt
        if mc is not None:
            lf = np.ascontiguousarray(mc["layer_fn"], dtype=np.int32)
            self.d.n_layers = <int32_t> lf.shape[0]
            self.d.layer_fn = <int32_t *> _ptr(keep, "layer_fn", lf, np.int32)
            nt = len(mc["models"])
            self.models = <ms_decode_model_t *> malloc(max(nt, 1) * sizeof(ms_decode_model_t))
            self.machines = <ms_machine_t *> malloc(max(nt, 1) * sizeof(ms_machine_t))
            if self.models == NULL or self.machines == NULL:
                raise MemoryError()
            for i in range(nt):
                sub = {}
                keep["model%d" % i] = sub
                _fill_decode_model(&self.models[i], mc["models"][i], sub)
                _fill_machine(&self.machines[i], mc["machines"][i])
            _fill_routing(&self.routing, mc["routing"], keep)
            self.d.mc_models = self.models
            self.d.mc_machines = self.machines
            self.d.routing = &self.routing
            self.d.steps = mc["steps"]
            self.d.warmup = mc["warmup"]
            self.d.policy = mc["policy"]
            self.d.seed = int(mc["seed"]) & 0xFFFFFFFFFFFFFFFF
        self.keep = keep

    def __dealloc__(self):
        free(self.variants)
        free(self.kinds)
        free(self.fns)
        free(self.models)
        free(self.machines)


cdef ms_sweep_dec_out_t _dec_out(dict out, Py_ssize_t n) except *:
    cdef ms_sweep_dec_out_t o
    cdef double[::1] a = out["decode_tok_s"], b = out["aggregate_tok_s"], c = out["tpot_ms"]
    cdef double[::1] f = out["prefill_tok_s"], h = out["expert_hit_rate"]
    cdef double[::1] d, e
    cdef int32_t[::1] bn = out["bottleneck"]
    if a.shape[0] < n or b.shape[0] < n or c.shape[0] < n or f.shape[0] < n or h.shape[0] < n or bn.shape[0] < n:
        raise ValueError("output column shorter than the configurations")
    o.decode_tok_s = &a[0]; o.aggregate_tok_s = &b[0]; o.tpot_ms = &c[0]
    o.prefill_tok_s = &f[0]; o.hit_rate = &h[0]; o.bottleneck = &bn[0]
    o.tpot_p50_ms = NULL
    o.tpot_p99_ms = NULL
    if out.get("tpot_p50_ms") is not None:
        d = out["tpot_p50_ms"]
        e = out["tpot_p99_ms"]
        if d.shape[0] < n or e.shape[0] < n:
            raise ValueError("output column shorter than the configurations")
        o.tpot_p50_ms = &d[0]
        o.tpot_p99_ms = &e[0]
    return o


def sweep_analytic(SweepDecode dec, context, batch, variant, int n_threads, dict out):
    """Analytic decode and prefill of n configurations into `out`; returns (code, bad)."""
    cdef const int64_t[::1] ctx = context
    cdef const int64_t[::1] bat = batch
    cdef const int32_t[::1] var = variant
    cdef Py_ssize_t n = ctx.shape[0]
    if bat.shape[0] != n or var.shape[0] != n:
        raise ValueError("context, batch and variant differ in length")
    if n == 0:
        return 0, -1
    cdef ms_sweep_dec_out_t o = _dec_out(out, n)
    cdef int nt = max(1, n_threads if _HAVE_OPENMP else 1)
    cdef int code
    cdef int64_t bad = -1
    with nogil:
        code = ms_sweep_analytic(&dec.d, &ctx[0], &bat[0], &var[0], n, nt, &o, &bad)
    return code, bad


def sweep_montecarlo(SweepDecode dec, context, batch, variant, index, int n_threads, dict out):
    """Monte Carlo decode (stream (seed, index[i])) of n configurations into `out`; returns (code, bad)."""
    cdef const int64_t[::1] ctx = context
    cdef const int64_t[::1] bat = batch
    cdef const int32_t[::1] var = variant
    cdef const uint64_t[::1] idx = index
    cdef Py_ssize_t n = ctx.shape[0]
    if bat.shape[0] != n or var.shape[0] != n or idx.shape[0] != n:
        raise ValueError("context, batch, variant and index differ in length")
    if n == 0:
        return 0, -1
    if dec.d.mc_models == NULL or dec.d.n_variants == 0:
        raise ValueError("no Monte Carlo templates")
    cdef ms_sweep_dec_out_t o = _dec_out(out, n)
    cdef int nt = max(1, n_threads if _HAVE_OPENMP else 1)
    cdef int32_t max_b = <int32_t> int(np.max(np.asarray(batch)))
    cdef int64_t wsb = ms_sweep_montecarlo_workspace_size(&dec.d, max_b)
    wsb = (wsb + 63) // 64 * 64
    cdef char *ws = <char *> malloc(max(wsb, 64) * nt)
    cdef int code
    cdef int64_t bad = -1
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_sweep_montecarlo(&dec.d, &ctx[0], &bat[0], &var[0], &idx[0], n, nt, ws, wsb, &o, &bad)
    finally:
        free(ws)
    return code, bad


include "_place.pxi"
