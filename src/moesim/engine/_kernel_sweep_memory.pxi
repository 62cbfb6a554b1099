# Sweep memory: one group's ms_sweep_mem_t (SweepMemory) and the loop over its configurations
# (sweep_memory, ms_sweep_memory); included by _kernel.pyx.

MEM_OUT_F64 = ("weights_bytes", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes", "storage_bytes")
MEM_OUT_I64 = ("context", "batch", "key", "max_context", "max_batch")
MEM_OUT_I32 = ("placement", "fits")


cdef void _fill_mem_config(ms_mem_config_t *c, dict cfg):
    """A group's ms_mem_config_t from a checked table (glue.MEM_CONFIG); context, batch and placement are
    set per configuration by the C loop."""
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
    c.head_copy = cfg["head_copy"]
    c.kv_granularity = cfg["kv_granularity"]
    c.gpu_fixed = cfg["gpu_fixed"]
    c.gpu_buf0 = cfg["gpu_buf0"]
    c.gpu_buf_ctx = cfg["gpu_buf_ctx"]
    c.host_fixed = cfg["host_fixed"]
    c.host_buf0 = cfg["host_buf0"]
    c.host_buf_ctx = cfg["host_buf_ctx"]
    cdef const double[::1] ways = cfg["gpu_ways"]
    cdef int k
    for k in range(MS_N_CLASSES):
        c.gpu_ways[k] = ways[k]


cdef void _fill_places(ms_sweep_place_t *places, dict pl, Py_ssize_t n):
    """n ms_sweep_place_t from checked columns (glue.SWEEP_PLACES)."""
    cdef const int32_t[::1] code = pl["code"], layout = pl["layout"], cfg = pl["cfg"], any_gpu = pl["any_gpu"]
    cdef const int32_t[::1] label = pl["label"]
    cdef const int64_t[::1] arg = pl["arg"]
    cdef const double[::1] w_gpu = pl["w_gpu"], w_host = pl["w_host"], routed_host = pl["routed_host"]
    cdef const double[::1] w_gpu_one = pl["w_gpu_one"]
    cdef Py_ssize_t j
    for j in range(n):
        places[j].code = code[j]
        places[j].arg = arg[j]
        places[j].layout = layout[j]
        places[j].cfg = cfg[j]
        places[j].any_gpu = any_gpu[j]
        places[j].label = label[j]
        places[j].w_gpu = w_gpu[j]
        places[j].w_host = w_host[j]
        places[j].w_gpu_one = w_gpu_one[j]
        places[j].routed_host = routed_host[j]


cdef class SweepMemory:
    """C view of one group's memory tables (analysis.sweep builds the dict; glue.SWEEP_MEMORY declares it)."""
    cdef ms_sweep_mem_t g
    cdef ms_sweep_place_t *places
    cdef object keep

    def __cinit__(self):
        self.places = NULL

    def __init__(self, dict t):
        keep = {}
        dims = {}
        c = check_struct("ms_sweep_mem_t", t, dims)
        cfgs = t.get("cfg")
        if not isinstance(cfgs, (list, tuple)) or len(cfgs) != 2:
            raise StructError("ms_sweep_mem_t", "cfg", "expected the group's two ms_mem_config_t (GPU, CPU-only)")
        self.g.n_kinds = <int32_t> dims["n_kinds"]
        self.g.per_token = <double *> _data(keep, "per_token", c["per_token"])
        self.g.ratio_bytes = <double *> _data(keep, "ratio_bytes", c["ratio_bytes"])
        self.g.state = <double *> _data(keep, "state", c["state"])
        self.g.cap = <int64_t *> _data(keep, "cap", c["cap"])
        self.g.ratio = <int64_t *> _data(keep, "ratio", c["ratio"])
        self.g.count = <int32_t *> _data(keep, "count", c["count"])
        self.g.n_layouts = <int32_t> dims["n_layouts"]
        self.g.gpu_count = <int32_t *> _data(keep, "gpu_count", c["gpu_count"])
        self.g.max_context = c["max_context"]
        _fill_mem_config(&self.g.cfg[0], check_struct("ms_mem_config_t", cfgs[0]))
        _fill_mem_config(&self.g.cfg[1], check_struct("ms_mem_config_t", cfgs[1]))
        cdef Py_ssize_t n = dims["n_places"], j
        self.places = <ms_sweep_place_t *> malloc(max(n, 1) * sizeof(ms_sweep_place_t))
        if self.places == NULL:
            raise MemoryError()
        _fill_places(self.places, c["places"], n)
        self.g.n_places = <int32_t> n
        self.g.places = self.places
        self.g.rule = c["rule"]
        self.g.n_layers = c["n_layers"]
        self.g.n_experts = c["n_experts"]
        self.g.i_all_gpu = c["i_all_gpu"]
        self.g.i_n_cpu_moe = c["i_n_cpu_moe"]
        self.g.i_layers_gpu = c["i_layers_gpu"]
        self.g.i_cpu_only = c["i_cpu_only"]
        self.g.i_experts_cpu = c["i_experts_cpu"]
        self.g.i_gpu_experts = c["i_gpu_experts"]
        for j in range(8):
            self.g.fits_label[j] = c["fits_label"][j]
        self.keep = keep

    def __dealloc__(self):
        free(self.places)


cdef ms_sweep_mem_out_t _mem_out(dict out, Py_ssize_t n, bint keys=True, Py_ssize_t offset=0) except *:
    """The memory columns of `out` (each at least n long) as C sees them; without `keys` the key and
    placement columns are not read (NULL: what only reads the others, the screen); from row ``offset`` of each on."""
    cdef ms_sweep_mem_out_t o
    o.context = <int64_t *> _col(out["context"], b'i', 8, n, True, "context", offset)
    o.batch = <int64_t *> _col(out["batch"], b'i', 8, n, True, "batch", offset)
    o.max_context = <int64_t *> _col(out["max_context"], b'i', 8, n, True, "max_context", offset)
    o.max_batch = <int64_t *> _col(out["max_batch"], b'i', 8, n, True, "max_batch", offset)
    o.fits = <int32_t *> _col(out["fits"], b'i', 4, n, True, "fits", offset)
    o.weights = <double *> _col(out["weights_bytes"], b'f', 8, n, True, "weights_bytes", offset)
    o.kv = <double *> _col(out["kv_bytes"], b'f', 8, n, True, "kv_bytes", offset)
    o.state = <double *> _col(out["state_bytes"], b'f', 8, n, True, "state_bytes", offset)
    o.gpu = <double *> _col(out["gpu_bytes"], b'f', 8, n, True, "gpu_bytes", offset)
    o.host = <double *> _col(out["host_bytes"], b'f', 8, n, True, "host_bytes", offset)
    o.storage = <double *> _col(out["storage_bytes"], b'f', 8, n, True, "storage_bytes", offset)
    o.placement = NULL; o.key = NULL
    if keys:
        o.key = <int64_t *> _col(out["key"], b'i', 8, n, True, "key", offset)
        o.placement = <int32_t *> _col(out["placement"], b'i', 4, n, True, "placement", offset)
    return o


def sweep_memory(SweepMemory mem, contexts, batches, bint zipped, long long j0, long long n, int n_threads,
                 dict out, Py_ssize_t offset=0):
    """Memory of configurations j0 .. j0+n-1 of one group into rows offset .. offset+n-1 of the columns of `out`;
    (code, bad)."""
    if n <= 0:
        return 0, -1
    if len(contexts) == 0 or len(batches) == 0:
        raise ValueError("sweep_memory needs at least one context and one batch")
    cdef ms_sweep_mem_out_t o = _mem_out(out, n, True, offset)
    cdef ms_sweep_axes_t ax
    ax.contexts = <int64_t *> _col(contexts, b'i', 8, 1, False, "contexts")
    ax.batches = <int64_t *> _col(batches, b'i', 8, 1, False, "batches")
    ax.n_c = len(contexts)
    ax.n_b = <int32_t> len(batches)
    ax.zipped = 1 if zipped else 0
    cdef int nt = _threads(n_threads)
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
    cdef Py_ssize_t n = len(keys)
    missing = np.empty(max(1, max_missing), dtype=np.int64)
    cdef int64_t nm = 0, unknown = 0, n_table = len(table_keys)
    if n == 0:
        return 0, missing[:0]
    if len(variant) < n:
        raise ValueError("variant column shorter than keys")
    cdef const int64_t *k = <int64_t *> _col(keys, b'i', 8, n, False, "keys")
    cdef const int64_t *tk = <int64_t *> _col(table_keys if n_table else _ONE_KEY, b'i', 8, 1, False, "table_keys")
    cdef int32_t *v = <int32_t *> _col(variant, b'i', 4, n, True, "variant")
    cdef int64_t *mv = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> missing)
    with nogil:
        unknown = ms_sweep_lookup(k, n, tk, n_table, v, mv, max_missing, &nm)
    return unknown, missing[:nm]


_ONE_KEY = np.zeros(1, dtype=np.int64)          # an empty table's stand-in (C reads none of it)
