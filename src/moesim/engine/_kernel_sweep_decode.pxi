# Sweep decode: one group's ms_sweep_decode_t (SweepDecode: variants, attention kinds, context functions,
# Monte Carlo templates) and the analytic / Monte Carlo loops; included by _kernel.pyx.


cdef inline const void *_rows(arr):
    """Data of a checked table's array (glue.check_struct: C-contiguous, the C dtype, the declared shape): read
    through a pointer, not a typed memoryview (a sweep builds a table per group)."""
    return cnp.PyArray_DATA(<cnp.ndarray> arr)


cdef void _fill_ctx_fns(ms_ctx_fn_t *out, f, c, Py_ssize_t n):
    """n ms_ctx_fn_t from checked rows: 5 coefficients (a1, a2, b1, b2, s), 4 caps (c1, c2, r, k1)."""
    cdef const double *fv = <const double *> _rows(f)
    cdef const int64_t *cv = <const int64_t *> _rows(c)
    cdef Py_ssize_t i
    for i in range(n):
        out[i].a1 = fv[5 * i]; out[i].a2 = fv[5 * i + 1]; out[i].b1 = fv[5 * i + 2]; out[i].b2 = fv[5 * i + 3]
        out[i].s = fv[5 * i + 4]
        out[i].c1 = cv[4 * i]; out[i].c2 = cv[4 * i + 1]; out[i].r = cv[4 * i + 2]; out[i].k1 = cv[4 * i + 3]


def ctx_eval(f, c, long long context):
    """Evaluate one context function (5 floats, 4 ints) as the C kernel does (tests)."""
    cdef ms_ctx_fn_t fn
    _fill_ctx_fns(&fn, np.ascontiguousarray(f, dtype=np.float64).reshape(1, 5),
                  np.ascontiguousarray(c, dtype=np.int64).reshape(1, 4), 1)
    return ms_ctx_eval(&fn, context)


def weight_passes(dict hw, double tokens):
    """ms_weight_passes of a checked machine table (glue.MACHINE) at a step of ``tokens`` tokens (the C side of
    engine.lower.machine.weight_passes, which the differential tests hold it equal to)."""
    cdef ms_machine_t h
    _fill_machine(&h, hw)
    return ms_weight_passes(&h, tokens)


def gemm_tokens(dict hw, double tokens, double rows):
    """ms_gemm_tokens of a checked machine table (glue.MACHINE): the C side of engine.lower.machine.gemm_tokens."""
    cdef ms_machine_t h
    _fill_machine(&h, hw)
    return ms_gemm_tokens(&h, tokens, rows)


def gemv_time(dict hw, double tokens, double passes, double weights):
    """ms_gemv_time of a checked machine table (glue.MACHINE): the C side of engine.lower.machine.gemv_time,
    (the passes' decode, the further tokens' dot products)."""
    cdef ms_machine_t h
    cdef double tokens_s = 0.0, pass_s
    _fill_machine(&h, hw)
    pass_s = ms_gemv_time(&h, tokens, passes, weights, &tokens_s)
    return pass_s, tokens_s


cdef void _fill_variants(ms_sweep_variant_t *out, f, i32, Py_ssize_t n):
    """n ms_sweep_variant_t from checked rows: f64 (step0, by_resource[8], accepted, tpot_scale, hit_rate,
    prefill0), i32 (kind0, n_kinds, mc)."""
    cdef const double *vf = <const double *> _rows(f)
    cdef const int32_t *vi = <const int32_t *> _rows(i32)
    cdef Py_ssize_t i
    cdef int k
    for i in range(n):
        out[i].step0 = vf[13 * i]
        for k in range(MS_N_RES):
            out[i].by_resource[k] = vf[13 * i + 1 + k]
        out[i].accepted = vf[13 * i + 9]
        out[i].tpot_scale = vf[13 * i + 10]
        out[i].hit_rate = vf[13 * i + 11]
        out[i].prefill0 = vf[13 * i + 12]
        out[i].kind0 = vi[3 * i]
        out[i].n_kinds = vi[3 * i + 1]
        out[i].mc = vi[3 * i + 2]


cdef void _fill_kinds(ms_sweep_kind_t *out, f, i32, Py_ssize_t n):
    """n ms_sweep_kind_t from checked rows: f64 (n, kv_rate, sf_rate), i32 (res_mem, res_flops, fn)."""
    cdef const double *kf = <const double *> _rows(f)
    cdef const int32_t *ki = <const int32_t *> _rows(i32)
    cdef Py_ssize_t i
    for i in range(n):
        out[i].n = kf[3 * i]
        out[i].kv_rate = kf[3 * i + 1]
        out[i].sf_rate = kf[3 * i + 2]
        out[i].res_mem = ki[3 * i]
        out[i].res_flops = ki[3 * i + 1]
        out[i].fn = ki[3 * i + 2]


cdef class SweepDecode:
    """C view of one group's decode variants and Monte Carlo templates (analysis.sweep builds the dict;
    glue.SWEEP_DECODE declares it)."""
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
        dims = {}
        c = check_struct("ms_sweep_decode_t", t, dims)
        cdef Py_ssize_t nv = dims["n_variants"], nk = dims["n_kinds"], nf = dims["n_fns"]
        if nf > MS_SWEEP_MAX_FNS:
            raise MoesimError(f"{nf} distinct attention context functions exceed the kernel limit SWEEP_MAX_FNS = "
                              f"{MS_SWEEP_MAX_FNS} (csrc/moesim.h MS_SWEEP_MAX_FNS)", "ms_sweep_decode_t.fn_kv_f")
        memset(&self.d, 0, sizeof(self.d))
        self.variants = <ms_sweep_variant_t *> malloc(max(nv, 1) * sizeof(ms_sweep_variant_t))
        self.kinds = <ms_sweep_kind_t *> malloc(max(nk, 1) * sizeof(ms_sweep_kind_t))
        self.fns = <ms_ctx_fn_t *> malloc(max(nf, 1) * 2 * sizeof(ms_ctx_fn_t))
        if self.variants == NULL or self.kinds == NULL or self.fns == NULL:
            raise MemoryError()
        if nv:
            _fill_variants(self.variants, c["variant_f64"], c["variant_i32"], nv)
        if nk:
            _fill_kinds(self.kinds, c["kind_f64"], c["kind_i32"], nk)
        if nf:
            _fill_ctx_fns(self.fns, c["fn_kv_f"], c["fn_kv_c"], nf)
            _fill_ctx_fns(self.fns + nf, c["fn_sf_f"], c["fn_sf_c"], nf)
        self.d.variants = self.variants
        self.d.n_variants = <int32_t> nv
        self.d.kinds = self.kinds
        self.d.n_kinds = <int32_t> nk                   # the C bounds every variant's kind slice by it
        self.d.n_fns = <int32_t> nf
        self.d.fn_kv = self.fns
        self.d.fn_sf = self.fns + nf
        self.d.prompt = c["prompt"]
        if c["mc"] is not None:
            self._fill_mc(c["mc"], t["mc"], keep)
        self.keep = keep

    cdef _fill_mc(self, dict mc, object raw, dict keep):
        """The Monte Carlo templates: per-layer context functions, one (model, machine) per template, the
        group's routing."""
        cdef Py_ssize_t nt, i
        models, machines = raw.get("models"), raw.get("machines")
        if not isinstance(models, (list, tuple)) or not isinstance(machines, (list, tuple)) \
                or len(models) != len(machines):
            raise StructError("ms_sweep_decode_t.mc", "models", "expected equal-length lists of models and machines")
        self.d.n_layers = <int32_t> mc["layer_fn"].shape[0]
        self.d.layer_fn = <int32_t *> _data(keep, "layer_fn", mc["layer_fn"])
        nt = len(models)
        self.models = <ms_decode_model_t *> malloc(max(nt, 1) * sizeof(ms_decode_model_t))
        self.machines = <ms_machine_t *> malloc(max(nt, 1) * sizeof(ms_machine_t))
        if self.models == NULL or self.machines == NULL:
            raise MemoryError()
        for i in range(nt):
            sub = {}
            keep["model%d" % i] = sub
            _fill_decode_model(&self.models[i], check_struct("ms_decode_model_t", models[i]), sub)
            _fill_machine(&self.machines[i], check_struct("ms_machine_t", machines[i]))
        _fill_routing(&self.routing, check_routing(raw.get("routing")), keep)
        self.d.n_templates = <int32_t> nt               # the C bounds every variant's template index by it
        self.d.mc_models = self.models
        self.d.mc_machines = self.machines
        self.d.routing = &self.routing
        self.d.steps = mc["steps"]
        self.d.warmup = mc["warmup"]
        self.d.policy = mc["policy"]
        self.d.seed = mc["seed"] & 0xFFFFFFFFFFFFFFFF

    def __dealloc__(self):
        free(self.variants)
        free(self.kinds)
        free(self.fns)
        free(self.models)
        free(self.machines)


cdef ms_sweep_dec_out_t _dec_out(dict out, Py_ssize_t n, bint bottleneck=True, Py_ssize_t offset=0) except *:
    """The decode columns of `out` (each at least n long) as C sees them; p50 / p99 NULL when absent
    (analytic), and the bottleneck column NULL without `bottleneck` (what only reads, the screen); from row
    ``offset`` of each on."""
    cdef ms_sweep_dec_out_t o
    o.decode_tok_s = <double *> _col(out["decode_tok_s"], b'f', 8, n, True, "decode_tok_s", offset)
    o.aggregate_tok_s = <double *> _col(out["aggregate_tok_s"], b'f', 8, n, True, "aggregate_tok_s", offset)
    o.tpot_ms = <double *> _col(out["tpot_ms"], b'f', 8, n, True, "tpot_ms", offset)
    o.prefill_tok_s = <double *> _col(out["prefill_tok_s"], b'f', 8, n, True, "prefill_tok_s", offset)
    o.hit_rate = <double *> _col(out["expert_hit_rate"], b'f', 8, n, True, "expert_hit_rate", offset)
    o.bottleneck = NULL
    if bottleneck:
        o.bottleneck = <int32_t *> _col(out["bottleneck"], b'i', 4, n, True, "bottleneck", offset)
    o.tpot_p50_ms = NULL
    o.tpot_p99_ms = NULL
    if out.get("tpot_p50_ms") is not None:
        o.tpot_p50_ms = <double *> _col(out["tpot_p50_ms"], b'f', 8, n, True, "tpot_p50_ms", offset)
        o.tpot_p99_ms = <double *> _col(out["tpot_p99_ms"], b'f', 8, n, True, "tpot_p99_ms", offset)
    return o


def sweep_analytic(SweepDecode dec, context, batch, variant, int n_threads, dict out, Py_ssize_t offset=0):
    """Analytic decode and prefill of n configurations into rows offset .. offset+n-1 of `out`; returns (code, bad)."""
    cdef Py_ssize_t n = len(context)
    if len(batch) != n or len(variant) != n:
        raise ValueError("context, batch and variant differ in length")
    if n == 0:
        return 0, -1
    cdef const int64_t *ctx = <int64_t *> _col(context, b'i', 8, n, False, "context")
    cdef const int64_t *bat = <int64_t *> _col(batch, b'i', 8, n, False, "batch")
    cdef const int32_t *var = <int32_t *> _col(variant, b'i', 4, n, False, "variant")
    cdef ms_sweep_dec_out_t o = _dec_out(out, n, True, offset)
    cdef int nt = _threads(n_threads)
    cdef int code
    cdef int64_t bad = -1
    with nogil:
        code = ms_sweep_analytic(&dec.d, ctx, bat, var, n, nt, &o, &bad)
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
    cdef int nt = _threads(n_threads)
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


def sweep_screen(dict cols, segments, fits_lut, double rel, int64_t max_batch, int n_threads=1):
    """ms_sweep_screen over the rows of `segments` ((start, end, gpu_cap, host_cap, storage_cap,
    max_context, context_bound) each) of the chunk columns `cols`: (code, first flagged row or -1)."""
    cdef const int8_t[::1] lut = fits_lut
    cdef Py_ssize_t n_seg = len(segments), k, n = 0
    if lut.shape[0] < 1:
        raise ValueError("empty fits table")
    for seg in segments:
        if not (0 <= seg[0] <= seg[1]):
            raise ValueError("bad segment")
        n = max(n, seg[1])
    if n == 0:
        return 0, -1
    cdef ms_sweep_mem_out_t mem = _mem_out(cols, n, False)      # key, placement, bottleneck: not read
    cdef ms_sweep_dec_out_t dec = _dec_out(cols, n, False)
    cdef ms_screen_segment_t *segs = <ms_screen_segment_t *> malloc(max(n_seg, 1) * sizeof(ms_screen_segment_t))
    cdef int code
    cdef int64_t first = -1
    cdef int32_t n_lut = <int32_t> lut.shape[0]
    cdef int nt = _threads(n_threads)
    if segs == NULL:
        raise MemoryError()
    try:
        for k in range(n_seg):
            s = segments[k]
            segs[k].start = s[0]; segs[k].end = s[1]
            segs[k].gpu_cap = s[2]; segs[k].host_cap = s[3]; segs[k].storage_cap = s[4]
            segs[k].max_context = s[5]; segs[k].context_bound = s[6]
        with nogil:
            code = ms_sweep_screen(&mem, &dec, segs, <int32_t> n_seg, &lut[0], n_lut, rel, max_batch, nt, &first)
    finally:
        free(segs)
    return code, first
