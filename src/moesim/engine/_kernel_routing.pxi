# Routing: ms_routing_t, the analytic path's shared tables, the sampler (ms_route_sample) and cache
# replay (ms_cache_replay); included by _kernel.pyx.


def q_tables(q, int top_k):
    """Per-routing tables the analytic path shares across configurations: mean inclusion
    probability over scenarios and log(1 - mean)."""
    q = np.asarray(q, dtype=np.float64)
    qbar = q.mean(axis=0)
    return {"qbar": qbar, "lqbar": np.log1p(-np.minimum(qbar, 1.0 - 1e-16))}


cdef void _fill_routing(ms_routing_t *r, dict t, dict keep):
    """ms_routing_t from a checked table (glue.check_routing): a dense model's per-layer tables and an
    absent trace are NULL."""
    tabs = t["q_tables"] or {"qbar": None, "lqbar": None}
    r.n_layers = t["n_layers"]
    r.n_experts = t["n_experts"]
    r.top_k = t["top_k"]
    r.n_group = t["n_group"]
    r.topk_group = t["topk_group"]
    r.log_pop = <double *> _data(keep, "log_pop", t["log_pop"])
    r.stickiness = <double *> _data(keep, "stickiness", t["stickiness"])
    r.recall = <double *> _data(keep, "recall", t["recall"])
    r.hot = <int32_t *> _data(keep, "hot", t["hot"])
    r.concentration = t["concentration"]
    r.request_tokens = t["request_tokens"]
    r.n_scenarios = t["n_scenarios"]
    r.q = <double *> _data(keep, "q", t["q"])
    r.qbar = <double *> _data(keep, "qbar", tabs["qbar"])
    r.lqbar = <double *> _data(keep, "lqbar", tabs["lqbar"])
    r.win_n = <double *> _data(keep, "win_n", t["win_n"])
    r.win_lq = <double *> _data(keep, "win_lq", t["win_lq"])
    r.n_window = t["win_n"].shape[0] if t["win_n"] is not None else 0
    r.win_m = <double *> _data(keep, "win_m", t["win_m"])
    r.win_var = <double *> _data(keep, "win_var", t["win_var"])
    r.win_cov = <double *> _data(keep, "win_cov", t["win_cov"])
    r.n_moment = t["win_m"].shape[0] if t["win_m"] is not None else 0
    r.windows_checked = t.get("windows_checked", 0)     # set by glue.seal_routing alone
    r.recency = <double *> _data(keep, "recency", t["recency"])
    r.recency_lag = <double *> _data(keep, "recency_lag", t["recency_lag"])
    r.history = t["recency_lag"].shape[0] if t["recency_lag"] is not None else 0
    r.coupling = <double *> _data(keep, "coupling", t["coupling"])
    r.partners = <int32_t *> _data(keep, "partners", t["partners"])
    r.n_partners = t["partners"].shape[2] if t["partners"] is not None else 0
    r.trace = <int32_t *> _data(keep, "trace", t["trace"])
    r.trace_tokens = t["trace"].shape[0] if t["trace"] is not None else 0
    r.trace_layers = t["trace"].shape[1] if t["trace"] is not None else 0


def check_windows(dict checked):
    """ms_check_windows of a routing checked by glue.check_routing (0: well formed or none, 1: malformed)."""
    cdef ms_routing_t r
    keep = {}
    _fill_routing(&r, checked, keep)
    r.windows_checked = 0
    return ms_check_windows(&r)


# the workspace of ms_route_sample is that of a one-layer dense model (the sampler needs only the routing buffers)
_SAMPLER_MODEL = dict({k: [0.0] for k in DECODE_MODEL_F64}, attn_on_gpu=[0], expert_mode=[0], slots=[0], page_slots=[0],
                      moe_index=[-1], head_bytes=0.0, head_flops=0.0, head_on_gpu=0, draft_bytes=0.0, draft_flops=0.0,
                      act_bytes=0.0, allreduce_bytes=0.0, a2a_bytes=0.0)


def route_sample(dict rt, dict cols):
    """Token-level picks [steps, batch, tokens_per_step, layers, k] of one Monte Carlo configuration
    (the first of the columns)."""
    cdef ms_routing_t r
    cdef ms_decode_config_t c
    cdef ms_decode_model_t m
    keep = {}
    _fill_routing(&r, check_routing(rt), keep)
    cfg = check_columns("ms_decode_config_t[]", cols)
    if cfg["n"] < 1:
        raise StructError("ms_decode_config_t[]", "batch", "no configuration")
    _fill_configs(&c, cfg, 1)
    _fill_decode_model(&m, check_struct("ms_decode_model_t", _SAMPLER_MODEL), keep)
    shape = (c.steps, c.batch, c.tokens_per_step, r.n_layers, r.top_k)
    out = np.empty(shape, dtype=np.int32)
    cdef int32_t[::1] v_out = out.reshape(-1) if out.size else np.empty(1, dtype=np.int32)
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


def window_count(tokens, int n_experts, nodes):
    """(code, [L, E, W] int64): how many windows of nodes[j] consecutive tokens of the stream tokens
    [N, L, k] (int32) hold each expert (ms_window_count)."""
    tok = np.ascontiguousarray(tokens, dtype=np.int32)
    nd = np.ascontiguousarray(nodes, dtype=np.int32)
    if tok.ndim != 3 or nd.ndim != 1 or tok.size == 0 or nd.size == 0:
        raise StructError("ms_window_count()", "tokens", "a [tokens, layers, k] stream and 1-D nodes")
    cdef int64_t N = tok.shape[0]
    cdef int32_t L = tok.shape[1], K = tok.shape[2], W = nd.shape[0]
    out = np.zeros((L, max(n_experts, 1), W), dtype=np.int64)
    cdef const int32_t[::1] v_tok = tok.reshape(-1)
    cdef const int32_t[::1] v_nd = nd
    cdef int64_t[::1] v_out = out.reshape(-1)
    cdef int64_t wsb = ms_window_workspace_size(n_experts, max(int(nd.max()), 1))
    cdef char *ws = <char *> malloc(max(wsb, 64))
    cdef int code
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_window_count(&v_tok[0], N, L, K, n_experts, &v_nd[0], W, ws, wsb, &v_out[0])
    finally:
        free(ws)
    return code, out


def window_moments(tokens, int n_experts, nodes, long long request_tokens=0):
    """(code, [L, E, M, 4] int64): per window length nodes[j], over the windows of that many consecutive tokens
    of the stream tokens [N, L, k] (int32) that have a next token (inside one request of request_tokens when
    shorter than one), sums of each expert's count N, N^2, N x and x (x: the expert in the next token)
    (ms_window_moments)."""
    tok = np.ascontiguousarray(tokens, dtype=np.int32)
    nd = np.ascontiguousarray(nodes, dtype=np.int32)
    if tok.ndim != 3 or nd.ndim != 1 or tok.size == 0 or nd.size == 0:
        raise StructError("ms_window_moments()", "tokens", "a [tokens, layers, k] stream and 1-D nodes")
    cdef int64_t N = tok.shape[0]
    cdef int32_t L = tok.shape[1], K = tok.shape[2], M = nd.shape[0]
    out = np.zeros((L, max(n_experts, 1), M, 4), dtype=np.int64)
    cdef const int32_t[::1] v_tok = tok.reshape(-1)
    cdef const int32_t[::1] v_nd = nd
    cdef int64_t[::1] v_out = out.reshape(-1)
    cdef int64_t wsb = ms_window_moments_workspace_size(N, K, n_experts)
    cdef char *ws = <char *> malloc(max(wsb, 64))
    cdef int code
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            code = ms_window_moments(&v_tok[0], N, L, K, n_experts, request_tokens, &v_nd[0], M, ws, wsb, &v_out[0])
    finally:
        free(ws)
    return code, out


def cache_replay(sel, nsel, int n_experts, int capacity, int policy, hot, long long warmup):
    """Per-layer (hits, accesses) of one cache replaying step unions sel [T, L, W] / nsel [T, L];
    hot [L, E] (the static policy's pinned order) or None."""
    a = check_struct("ms_cache_replay()", dict(sel=sel, nsel=nsel, hot=hot), {"n_experts": n_experts})
    cdef int64_t T = a["sel"].shape[0]
    cdef int32_t L = a["sel"].shape[1], W = a["sel"].shape[2]
    keep = {}
    cdef int32_t *p_s = <int32_t *> _data(keep, "s", a["sel"])
    cdef int32_t *p_n = <int32_t *> _data(keep, "n", a["nsel"])
    cdef int32_t *p_h = <int32_t *> _data(keep, "h", a["hot"])
    hits = np.zeros(max(L, 1))
    acc = np.zeros(max(L, 1))
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
    return code, hits[:L], acc[:L]
