# The serving scheduler (csrc/ms_serve.c); included by _kernel.pyx.

_SERVE_INT_FIELDS = ("concurrency", "n_requests", "isl", "osl", "max_num_batched_tokens", "max_num_seqs",
                     "block_size", "n_blocks", "state_blocks", "prefix_blocks", "snapshot_blocks", "max_steps")


def _serve_grid(dict table, str name):
    arr = np.ascontiguousarray(table[name], dtype=np.float64)
    if arr.ndim != 1 or arr.size < 1 or arr.size > 2**31 - 1:
        raise StructError("ms_serve_table_t", name, f"expected a non-empty 1-D grid, got shape {arr.shape}")
    return arr


def _serve_values(dict table, str name, int64_t rows, int64_t cols):
    arr = np.ascontiguousarray(table[name], dtype=np.float64)
    if arr.shape != (rows, cols):
        raise StructError("ms_serve_table_t", name, f"expected shape {(rows, cols)}, got {arr.shape}")
    return arr


def serve(dict table, dict cfg, uint64_t seed, uint64_t stream):
    """(code, outputs) of ms_serve for a step table and a configuration (the random stream (seed, stream, 0)).
    Shapes are checked here; the C core checks the values (MS_ERR_BAD_SERVE) and never crashes."""
    cdef ms_serve_table_t t
    cdef ms_serve_config_t c
    cdef ms_serve_out_t out
    cdef ms_rng_t rng
    cdef int code
    cdef int64_t ws_bytes
    cdef void *ws
    keep = {}
    gb, gc = _serve_grid(table, "grid_b"), _serve_grid(table, "grid_c")
    gp, gd = _serve_grid(table, "grid_p"), _serve_grid(table, "grid_d")
    dec = _serve_values(table, "decode_s", gb.size, gc.size)
    pf = _serve_values(table, "prefill_s", gp.size, gd.size)
    t.n_b, t.n_c, t.n_p, t.n_d = gb.size, gc.size, gp.size, gd.size
    t.grid_b = <const double *> _data(keep, "gb", gb)
    t.grid_c = <const double *> _data(keep, "gc", gc)
    t.grid_p = <const double *> _data(keep, "gp", gp)
    t.grid_d = <const double *> _data(keep, "gd", gd)
    t.decode_s = <const double *> _data(keep, "dec", dec)
    t.prefill_s = <const double *> _data(keep, "pf", pf)
    t.forward_s = float(table["forward_s"])
    for name in _SERVE_INT_FIELDS:
        v = cfg[name]
        if isinstance(v, bool) or int(v) != v or not -(2**63) <= int(v) < 2**63:
            raise StructError("ms_serve_config_t", name, f"expected an int64, got {v!r}")
    c.closed_loop = 1 if cfg["closed_loop"] else 0
    c.rate = float(cfg["rate"])
    c.concurrency, c.n_requests, c.isl, c.osl = cfg["concurrency"], cfg["n_requests"], cfg["isl"], cfg["osl"]
    c.max_num_batched_tokens, c.max_num_seqs = cfg["max_num_batched_tokens"], cfg["max_num_seqs"]
    c.block_size, c.n_blocks, c.state_blocks = cfg["block_size"], cfg["n_blocks"], cfg["state_blocks"]
    c.prefix_blocks, c.snapshot_blocks, c.max_steps = cfg["prefix_blocks"], cfg["snapshot_blocks"], cfg["max_steps"]
    n = max(int(cfg["n_requests"]), 1)
    cols = {k: np.empty(n, dtype=np.float64) for k in ("arrival_s", "first_token_s", "finish_s")}
    cols["preemptions"] = np.zeros(n, dtype=np.int32)
    out.arrival_s = <double *> cnp.PyArray_DATA(cols["arrival_s"])
    out.first_token_s = <double *> cnp.PyArray_DATA(cols["first_token_s"])
    out.finish_s = <double *> cnp.PyArray_DATA(cols["finish_s"])
    out.preemptions = <int32_t *> cnp.PyArray_DATA(cols["preemptions"])
    ws_bytes = max(ms_serve_workspace_size(&c), 8)
    ws = malloc(ws_bytes)
    if ws == NULL:
        raise MemoryError("ms_serve workspace")
    ms_rng_init(&rng, seed, stream, 0)
    try:
        with nogil:
            code = ms_serve(&t, &c, &rng, ws, ws_bytes, &out)
    finally:
        free(ws)
    if code:
        return code, None
    cols.update(steps=out.steps, preempted=out.preempted, max_running=out.max_running, peak_blocks=out.peak_blocks,
                busy_s=out.busy_s)
    return 0, cols
