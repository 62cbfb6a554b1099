# Decode: ms_decode_model_t, ms_machine_t and columns of ms_decode_config_t into ms_decode_many;
# included by _kernel.pyx (ms_routing_t is _kernel_routing.pxi).

DECODE_MODEL_F64 = ("attn_bytes", "attn_flops", "kv_bytes", "score_flops", "shared_bytes", "shared_flops",
                    "expert_bytes", "expert_flops", "ep_load_experts", "ep_load_pairs", "layer_ops", "gemm_rows")
DECODE_MODEL_I32 = ("attn_on_gpu", "expert_mode", "slots", "page_slots", "moe_index")
DECODE_RESULT_F64 = ("step_mean", "step_p50", "step_p99", "accepted", "hit_rate", "page_hit_rate", "distinct", "reuse",
                     "selections")


cdef void _fill_decode_model(ms_decode_model_t *m, dict d, dict keep):
    """ms_decode_model_t from a checked table (glue.DECODE_MODEL)."""
    m.n_layers = <int32_t> d["attn_bytes"].shape[0]
    m.attn_bytes = <double *> _data(keep, "attn_bytes", d["attn_bytes"])
    m.attn_flops = <double *> _data(keep, "attn_flops", d["attn_flops"])
    m.kv_bytes = <double *> _data(keep, "kv_bytes", d["kv_bytes"])
    m.score_flops = <double *> _data(keep, "score_flops", d["score_flops"])
    m.shared_bytes = <double *> _data(keep, "shared_bytes", d["shared_bytes"])
    m.shared_flops = <double *> _data(keep, "shared_flops", d["shared_flops"])
    m.expert_bytes = <double *> _data(keep, "expert_bytes", d["expert_bytes"])
    m.expert_flops = <double *> _data(keep, "expert_flops", d["expert_flops"])
    m.attn_on_gpu = <int32_t *> _data(keep, "attn_on_gpu", d["attn_on_gpu"])
    m.expert_mode = <int32_t *> _data(keep, "expert_mode", d["expert_mode"])
    m.slots = <int32_t *> _data(keep, "slots", d["slots"])
    m.page_slots = <int32_t *> _data(keep, "page_slots", d["page_slots"])
    m.moe_index = <int32_t *> _data(keep, "moe_index", d["moe_index"])
    m.head_bytes = d["head_bytes"]
    m.head_flops = d["head_flops"]
    m.head_on_gpu = d["head_on_gpu"]
    m.draft_bytes = d["draft_bytes"]
    m.draft_flops = d["draft_flops"]
    m.act_bytes = d["act_bytes"]
    m.allreduce_bytes = d["allreduce_bytes"]
    m.ep_load_experts = <double *> _data(keep, "ep_load_experts", d["ep_load_experts"])
    m.ep_load_pairs = <double *> _data(keep, "ep_load_pairs", d["ep_load_pairs"])
    m.a2a_bytes = d["a2a_bytes"]
    m.layer_ops = <double *> _data(keep, "layer_ops", d["layer_ops"])
    m.gemm_rows = <double *> _data(keep, "gemm_rows", d["gemm_rows"])


cdef void _fill_machine(ms_machine_t *h, dict hw):
    """ms_machine_t from a checked table (glue.MACHINE)."""
    h.gpu_bw = hw["gpu_bw"]; h.host_bw = hw["host_bw"]; h.pcie_bw = hw["pcie_bw"]
    h.storage_bw = hw["storage_bw"]; h.gpu_flops = hw["gpu_flops"]; h.cpu_flops = hw["cpu_flops"]
    h.interconnect_bw = hw["interconnect_bw"]; h.unified = hw["unified"]; h.overlap = hw["overlap"]
    h.launch_s = hw["launch_s"]; h.sync_s = hw["sync_s"]; h.dma_s = hw["dma_s"]
    h.allreduce_s = hw["allreduce_s"]; h.step_s = hw["step_s"]; h.seq_s = hw["seq_s"]
    h.a2a_bw = hw["a2a_bw"]; h.a2a_s = hw["a2a_s"]; h.moe_s = hw["moe_s"]
    h.cpu_layer_s = hw["cpu_layer_s"]
    h.op_s = hw["op_s"]; h.cpu_op_s = hw["cpu_op_s"]
    h.graph_max_tokens = hw["graph_max_tokens"]; h.nograph_s = hw["nograph_s"]; h.mmid_sync_s = hw["mmid_sync_s"]
    h.cpu_attn_flops = hw["cpu_attn_flops"]
    h.mm_min_tokens = hw["mm_min_tokens"]; h.mm_tile_tokens = hw["mm_tile_tokens"]
    h.mv_ext_cols = hw["mv_ext_cols"]; h.mv_ext_min_tokens = hw["mv_ext_min_tokens"]
    h.mv_ext_k_min_tokens = hw["mv_ext_k_min_tokens"]; h.mv_ext_share = hw["mv_ext_share"]
    h.mv_ext_k_share = hw["mv_ext_k_share"]; h.moe_rowwise_below = hw["moe_rowwise_below"]
    h.mm_tile_rows = hw["mm_tile_rows"]; h.mm_slots = hw["mm_slots"]; h.gemv_weight_s = hw["gemv_weight_s"]
    h.gemv_token_rel = hw["gemv_token_rel"]


cdef void _fill_configs(ms_decode_config_t *cfg, dict c, Py_ssize_t n):
    """n ms_decode_config_t from checked columns (glue.DECODE_CONFIG_COLUMNS, each of length n)."""
    cdef const int32_t[::1] batch = c["batch"], tps = c["tokens_per_step"], drafts = c["drafts"]
    cdef const int32_t[::1] policy = c["policy"], mode = c["mode"]
    cdef const double[::1] accepted = c["accepted"]
    cdef const int64_t[::1] steps = c["steps"], warmup = c["warmup"]
    cdef const uint64_t[::1] seed = c["seed"], index = c["index"]
    cdef const double[:, :, ::1] che
    cdef const int32_t[::1] che_slots
    cdef const double[:, ::1] page_hit
    cdef const int32_t[::1] page_hit_slots
    cdef bint tabled = c.get("che") is not None, paged = c.get("page_hit") is not None
    cdef Py_ssize_t i
    if tabled:
        che = c["che"]
        che_slots = c["che_slots"]
    if paged:
        page_hit = c["page_hit"]
        page_hit_slots = c["page_hit_slots"]
    for i in range(n):
        cfg[i].che = NULL
        cfg[i].che_slots = -1
        cfg[i].page_hit = NULL
        cfg[i].page_hit_slots = -1
        if tabled and che_slots[i] >= 0 and che.shape[1] > 0:
            cfg[i].che = &che[i, 0, 0]
            cfg[i].che_slots = che_slots[i]
        if paged and page_hit_slots[i] >= 0 and page_hit.shape[1] > 0:
            cfg[i].page_hit = &page_hit[i, 0]
            cfg[i].page_hit_slots = page_hit_slots[i]
        cfg[i].batch = batch[i]
        cfg[i].tokens_per_step = tps[i]
        cfg[i].drafts = drafts[i]
        cfg[i].accepted = accepted[i]
        cfg[i].steps = steps[i]
        cfg[i].warmup = warmup[i]
        cfg[i].policy = policy[i]
        cfg[i].mode = mode[i]
        cfg[i].seed = seed[i]
        cfg[i].index = index[i]


cdef dict _decode_results(const ms_decode_result_t *res, Py_ssize_t n, bint filled):
    """Result arrays of n ms_decode_result_t (left unset unless `filled`), written through typed views."""
    out = {name: np.empty(n) for name in DECODE_RESULT_F64}
    by_res = np.empty((n, MS_N_RES)); by_phase = np.empty((n, MS_N_PHASES)); nbytes = np.empty((n, MS_N_BYTES))
    cdef double[::1] step_mean = out["step_mean"], step_p50 = out["step_p50"], step_p99 = out["step_p99"]
    cdef double[::1] accepted = out["accepted"], hit_rate = out["hit_rate"], page_hit_rate = out["page_hit_rate"]
    cdef double[::1] distinct = out["distinct"], reuse = out["reuse"], selections = out["selections"]
    cdef double[:, ::1] v_res = by_res, v_phase = by_phase, v_bytes = nbytes
    cdef Py_ssize_t i
    cdef int k
    if filled:
        for i in range(n):
            step_mean[i] = res[i].step_mean
            step_p50[i] = res[i].step_p50
            step_p99[i] = res[i].step_p99
            accepted[i] = res[i].accepted
            hit_rate[i] = res[i].hit_rate
            page_hit_rate[i] = res[i].page_hit_rate
            distinct[i] = res[i].distinct
            reuse[i] = res[i].reuse
            selections[i] = res[i].selections
            for k in range(MS_N_RES):
                v_res[i, k] = res[i].by_resource[k]
            for k in range(MS_N_PHASES):
                v_phase[i, k] = res[i].by_phase[k]
            for k in range(MS_N_BYTES):
                v_bytes[i, k] = res[i].bytes[k]
    out["by_resource"] = by_res
    out["by_phase"] = by_phase
    out["bytes"] = nbytes
    return out


def decode_many(dm, hw, rt, cols, int n_threads):
    """Run len(cols['batch']) decode configurations; returns (code, bad_index, result arrays). *dm*, *hw*,
    *rt* and *cols*: dicts, or tables glue.seal (glue.seal_routing) checked once."""
    cdef ms_routing_t r
    cdef ms_decode_config_t *cfg = NULL
    cdef ms_decode_result_t *res = NULL
    cdef char *ws = NULL
    cdef Py_ssize_t cap = 0, n = 0
    cdef int64_t ws_cap = 0, bad = -1
    cdef int code
    keep = {}
    try:
        _fill_routing(&r, check_routing(rt), keep)
        code = _decode_job(&r, dm, hw, cols, _threads(n_threads), &bad, &cfg, &res, &cap, &ws, &ws_cap, &n)
        out = _decode_results(res, n, code == 0)
    finally:
        free(cfg); free(res); free(ws)
    return code, bad, out


cdef tuple _table_rows(batches, tokens_per_step, str name):
    """(batches, tokens per step) of a table call as int32 columns of one length."""
    b = np.ascontiguousarray(batches, dtype=np.int32)
    t = np.ascontiguousarray(tokens_per_step, dtype=np.int32)
    if t.shape[0] != b.shape[0]:
        raise StructError(name, "tokens_per_step", f"{t.shape[0]} rows, expected {b.shape[0]}")
    return b, t


cdef int64_t _table_workspace_bytes(const ms_routing_t *r):
    """One thread's workspace of a table call, rounded up to whole cache lines (the threads' blocks sit side by side)."""
    return (max(ms_che_table_workspace_size(r), 64) + 63) // 64 * 64


cdef tuple _first_bad(const int32_t[::1] codes):
    """(the first row's error code or 0, its index or -1): what a serial loop that stopped there returned."""
    cdef Py_ssize_t i
    for i in range(codes.shape[0]):
        if codes[i]:
            return codes[i], i
    return 0, -1


def che_table(rt, batches, tokens_per_step, int slots, int policy, int64_t steps, int64_t warmup, int n_threads=1):
    """(code, index of the first bad row or -1, [n, L, MS_CHE_FIELDS] rows): ms_che_table for each (batches[i],
    tokens_per_step[i]) at `slots` GPU slots under `policy` over a run of `steps` steps, `warmup` of them not
    counted (engine.decode.che_table checks the arguments). Rows are independent: up to n_threads run at once,
    each with its own workspace, the rows the same on any thread count."""
    cdef ms_routing_t r
    keep = {}
    _fill_routing(&r, check_routing(rt), keep)
    b_arr, t_arr = _table_rows(batches, tokens_per_step, "ms_che_table()")
    cdef const int32_t[::1] b = b_arr
    cdef const int32_t[::1] t = t_arr
    cdef Py_ssize_t n = b.shape[0], i
    out = np.zeros((n, max(r.n_layers, 1), MS_CHE_FIELDS), dtype=np.float64)
    cdef double[:, :, ::1] v = out
    cdef int32_t[::1] codes = np.zeros(n, dtype=np.int32)
    cdef int64_t wsb = _table_workspace_bytes(&r)
    cdef int nt = _threads(min(n_threads, max(<int> n, 1)))
    cdef char *ws = <char *> malloc(wsb * nt)
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in prange(n, num_threads=nt, schedule="dynamic", chunksize=1):
                codes[i] = ms_che_table(&r, b[i], t[i], slots, policy, steps, warmup, ws + threadid() * wsb, wsb,
                                        &v[i, 0, 0])
    finally:
        free(ws)
    code, bad = _first_bad(codes)
    return code, bad, out[:, :r.n_layers]


def page_table(rt, batches, tokens_per_step, int page_slots, int n_threads=1):
    """(code, index of the first bad row or -1, [n, L] rates): ms_page_table for each (batches[i],
    tokens_per_step[i]) at `page_slots` host page slots (engine.decode.page_table checks the arguments); rows
    on up to n_threads threads as che_table's."""
    cdef ms_routing_t r
    keep = {}
    _fill_routing(&r, check_routing(rt), keep)
    b_arr, t_arr = _table_rows(batches, tokens_per_step, "ms_page_table()")
    cdef const int32_t[::1] b = b_arr
    cdef const int32_t[::1] t = t_arr
    cdef Py_ssize_t n = b.shape[0], i
    out = np.zeros((n, max(r.n_layers, 1)), dtype=np.float64)
    cdef double[:, ::1] v = out
    cdef int32_t[::1] codes = np.zeros(n, dtype=np.int32)
    cdef int64_t wsb = _table_workspace_bytes(&r)
    cdef int nt = _threads(min(n_threads, max(<int> n, 1)))
    cdef char *ws = <char *> malloc(wsb * nt)
    if ws == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in prange(n, num_threads=nt, schedule="dynamic", chunksize=1):
                codes[i] = ms_page_table(&r, b[i], t[i], page_slots, ws + threadid() * wsb, wsb, &v[i, 0])
    finally:
        free(ws)
    code, bad = _first_bad(codes)
    return code, bad, out[:, :r.n_layers]


cdef int _decode_job(ms_routing_t *r, dm, hw, cols, int nt, int64_t *bad, ms_decode_config_t **cfg,
                     ms_decode_result_t **res, Py_ssize_t *cap, char **ws, int64_t *ws_cap,
                     Py_ssize_t *n_out) except? -100:
    """ms_decode_many of one (decode model, machine, config columns) job on routing *r*, its results left in
    *res (*n_out of them), growing the buffers (*cfg, *res of *cap rows, *ws of *ws_cap bytes per thread) as
    it needs (decode_many's one job, decode_variants' each); the C code."""
    cdef ms_decode_model_t m
    cdef ms_machine_t mach
    cdef Py_ssize_t n, i
    cdef int64_t w, need = 64
    cdef int code
    keep = {}
    _fill_decode_model(&m, check_struct("ms_decode_model_t", dm), keep)
    _fill_machine(&mach, check_struct("ms_machine_t", hw))
    c = check_columns("ms_decode_config_t[]", cols)
    check_che_columns(c, r.n_layers)
    n = c["n"]
    n_out[0] = n
    if max(n, 1) > cap[0]:
        free(cfg[0]); free(res[0])
        cfg[0] = <ms_decode_config_t *> malloc(max(n, 1) * sizeof(ms_decode_config_t))
        res[0] = <ms_decode_result_t *> malloc(max(n, 1) * sizeof(ms_decode_result_t))
        cap[0] = max(n, 1) if cfg[0] != NULL and res[0] != NULL else 0
        if cap[0] == 0:
            raise MemoryError()
    _fill_configs(cfg[0], c, n)
    for i in range(n):
        w = ms_decode_workspace_size(&m, r, &cfg[0][i])
        if w > need:
            need = w
    need = (need + 63) // 64 * 64
    if need > ws_cap[0]:
        free(ws[0])
        ws[0] = <char *> malloc(need * nt)
        ws_cap[0] = need if ws[0] != NULL else 0
        if ws[0] == NULL:
            raise MemoryError()
    with nogil:
        code = ms_decode_many(&m, &mach, r, cfg[0], n, res[0], nt, ws[0], ws_cap[0], bad)
    return code


def decode_variants(rt, list jobs, int n_threads):
    """(code, failing job or -1, its bad configuration or -1, rows): ms_decode_many of several (decode model,
    machine, config columns) jobs that share routing *rt*, one call for all (a sweep group's decode variants),
    into one [configurations, 13] array in job order: step_mean, by_resource, accepted, 0, hit_rate, 0
    (ms_sweep_variant_t's layout; the caller fills the zeros)."""
    cdef ms_routing_t r
    cdef ms_decode_config_t *cfg = NULL
    cdef ms_decode_result_t *res = NULL
    cdef char *ws = NULL
    cdef Py_ssize_t cap = 0, row = 0, n = 0, j, i
    cdef int64_t ws_cap = 0, bad = -1
    cdef int code = 0, k, nt = _threads(n_threads)
    keep = {}
    _fill_routing(&r, check_routing(rt), keep)
    sizes = [len(cols["batch"]) for _, _, cols in jobs]
    out = np.zeros((sum(sizes), 4 + MS_N_RES + 1))
    cdef double[:, ::1] v = out
    try:
        for j in range(len(jobs)):
            dm, hw, cols = jobs[j]
            code = _decode_job(&r, dm, hw, cols, nt, &bad, &cfg, &res, &cap, &ws, &ws_cap, &n)
            if code:
                return code, j, bad, None
            for i in range(n):
                v[row + i, 0] = res[i].step_mean
                for k in range(MS_N_RES):
                    v[row + i, 1 + k] = res[i].by_resource[k]
                v[row + i, 1 + MS_N_RES] = res[i].accepted
                v[row + i, 3 + MS_N_RES] = res[i].hit_rate
            row += n
    finally:
        free(cfg); free(res); free(ws)
    return 0, -1, -1, out


# ------------------------------------------------------------------------------- prepared jobs (issue 19)
# A sweep runs the same lowered decode models, machine rates and config columns in many decode calls (the website
# grid: ~15k calls of ~5 jobs each). These hold each one checked (glue.check_struct) and filled into its C struct
# once, so decode_prepared only points at them: decode_variants' per-job checks and fills (typed views of twelve
# config columns, a dict per model) were more instructions than the decode itself.

cdef class DecodeModel:
    """A decode model table (glue.DECODE_MODEL), checked and filled into ms_decode_model_t once (``table``: it)."""
    cdef ms_decode_model_t m
    cdef dict keep
    cdef readonly object table

    def __init__(self, dm):
        self.keep = {}
        _fill_decode_model(&self.m, check_struct("ms_decode_model_t", dm), self.keep)
        self.table = dm


cdef class DecodeMachine:
    """A machine table (glue.MACHINE), checked and filled into ms_machine_t once."""
    cdef ms_machine_t h
    cdef readonly object table

    def __init__(self, hw):
        _fill_machine(&self.h, check_struct("ms_machine_t", hw))
        self.table = hw


cdef class DecodeConfigs:
    """Config columns (glue.DECODE_CONFIG_COLUMNS), checked and filled into n ms_decode_config_t once; the
    analytic tables' layer counts kept for the routing check (glue.check_che_columns)."""
    cdef ms_decode_config_t *cfg
    cdef Py_ssize_t n
    cdef dict c
    cdef readonly object che_layers, page_layers, table

    def __cinit__(self):
        self.cfg = NULL

    def __init__(self, cols):
        c = check_columns("ms_decode_config_t[]", cols)
        self.n = c["n"]
        self.che_layers = None if c.get("che") is None else c["che"].shape[1]
        self.page_layers = None if c.get("page_hit") is None else c["page_hit"].shape[1]
        check_che_columns(c, self.che_layers if self.che_layers is not None else (
            self.page_layers if self.page_layers is not None else 0))
        self.cfg = <ms_decode_config_t *> malloc(max(self.n, 1) * sizeof(ms_decode_config_t))
        if self.cfg == NULL:
            raise MemoryError()
        _fill_configs(self.cfg, c, self.n)
        self.c = c                      # the checked arrays the configs point into
        self.table = cols

    def __dealloc__(self):
        free(self.cfg)


cdef class DecodeRouting:
    """A routing table (glue.check_routing), checked and filled into ms_routing_t once."""
    cdef ms_routing_t r
    cdef dict keep
    cdef readonly object table

    def __init__(self, rt):
        self.keep = {}
        _fill_routing(&self.r, check_routing(rt), self.keep)
        self.table = rt


def decode_prepared(DecodeRouting routing, list jobs, int n_threads):
    """decode_variants of prepared (DecodeModel, DecodeMachine, DecodeConfigs) jobs that share ``routing``: the same
    C calls on the same structs, into the same [configurations, 13] array; (code, failing job or -1, its bad
    configuration or -1, rows)."""
    cdef ms_routing_t *r = &routing.r
    cdef ms_decode_result_t *res = NULL
    cdef char *ws = NULL
    cdef Py_ssize_t cap = 0, row = 0, n, j, i, total = 0
    cdef int64_t ws_cap = 0, bad = -1, w, need
    cdef int code = 0, k, nt = _threads(n_threads)
    cdef DecodeModel dm
    cdef DecodeMachine hw
    cdef DecodeConfigs cc
    for j in range(len(jobs)):
        cc = jobs[j][2]
        for name, layers in (("che", cc.che_layers), ("page_hit", cc.page_layers)):
            if layers is not None and layers != r.n_layers:     # glue.check_che_columns' check, per call
                raise StructError("ms_decode_config_t[]", name, f"{layers} layers, the routing has {r.n_layers}")
        total += cc.n
    out = np.zeros((total, 4 + MS_N_RES + 1))
    cdef double[:, ::1] v = out
    try:
        for j in range(len(jobs)):
            dm, hw, cc = jobs[j]
            n = cc.n
            if max(n, 1) > cap:
                free(res)
                res = <ms_decode_result_t *> malloc(max(n, 1) * sizeof(ms_decode_result_t))
                cap = max(n, 1) if res != NULL else 0
                if res == NULL:
                    raise MemoryError()
            need = 64
            for i in range(n):
                w = ms_decode_workspace_size(&dm.m, r, &cc.cfg[i])
                if w > need:
                    need = w
            need = (need + 63) // 64 * 64
            if need > ws_cap:
                free(ws)
                ws = <char *> malloc(need * nt)
                ws_cap = need if ws != NULL else 0
                if ws == NULL:
                    raise MemoryError()
            with nogil:
                code = ms_decode_many(&dm.m, &hw.h, r, cc.cfg, n, res, nt, ws, ws_cap, &bad)
            if code:
                return code, j, bad, None
            for i in range(n):
                v[row + i, 0] = res[i].step_mean
                for k in range(MS_N_RES):
                    v[row + i, 1 + k] = res[i].by_resource[k]
                v[row + i, 1 + MS_N_RES] = res[i].accepted
                v[row + i, 3 + MS_N_RES] = res[i].hit_rate
            row += n
    finally:
        free(res); free(ws)
    return 0, -1, -1, out
