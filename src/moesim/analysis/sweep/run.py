"""Running configurations: the C loops (memory, variant lookup, analytic or Monte Carlo decode) over
a range of global configuration indices, group by group, into column buffers; then the filters."""
from __future__ import annotations

import numpy as np

from ...engine import _kernel
from ...engine.glue import handle_library_error
from ..consistency import check_chunk
from ..intervals import fill_sweep
from .table import DECODE_COLUMNS, INTERVAL_COLUMNS, column_type, decode_columns


def _empty_columns(plan, n: int) -> dict:
    """Uninitialised output columns (every row is written by the kernels or dropped)."""
    out = {}
    for c in ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy", "fits", "bottleneck"):
        out[c] = np.empty(n, dtype=np.int32)
    for c in plan.options:
        out[c] = np.empty(n, dtype={"category": np.int32, "int64": np.int64}.get(column_type(c), np.float64))
    for c in ("context", "batch", "max_context", "max_batch"):
        out[c] = np.empty(n, dtype=np.int64)
    for c in ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
              "storage_bytes") + DECODE_COLUMNS[:-1] + INTERVAL_COLUMNS:
        if plan.mode == "montecarlo" or c not in ("tpot_p50_ms", "tpot_p99_ms"):
            out[c] = np.empty(n, dtype=np.float64)
    out["_key"] = np.empty(n, dtype=np.int64)
    out["_variant"] = np.empty(n, dtype=np.int32)
    return out


def _run_group(plan, grp, cols: dict, key: np.ndarray, variant: np.ndarray, a: int, b: int, start: int,
               threads: int) -> None:
    """Rows [a, b) (global indices, one group) into cols[a - start : b - start]."""
    s0, s1 = a - start, b - start
    for k, v in grp.codes.items():
        cols[k][s0:s1] = v
    view = {k: cols[k][s0:s1] for k in _kernel.MEM_OUT_I32 + _kernel.MEM_OUT_I64 + _kernel.MEM_OUT_F64
            if k != "key"}
    view["key"] = key[s0:s1]
    code, bad = _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, plan.fast_zipped, a - grp.g * plan.block,
                                     b - a, threads, view)
    handle_library_error(code, "ms_sweep_memory", start + s0 + max(bad, 0))
    cols["kv_bytes_per_token"][s0:s1] = grp.kv_bytes_per_token
    for k, v in grp.option_values.items():
        cols[k][s0:s1] = v
    dview = {k: cols[k][s0:s1] for k in decode_columns(plan.mode)}
    if grp.direct:
        from .direct import evaluate
        evaluate(grp, view["key"], view["context"], view["batch"], dview)
        fill_sweep(cols, s0, s1, grp.machine, grp.rt, plan.dicts["placement"])
        return
    var = variant[s0:s1]
    # evaluate with the very table the rows were resolved against (others may grow the group meanwhile)
    table = grp.resolve_variants(view["key"], var)
    if plan.mode != "montecarlo":
        code, bad = _kernel.sweep_analytic(table.dec, view["context"], view["batch"], var, threads, dview)
        where = "ms_sweep_analytic"
    else:
        idx = np.arange(a, b, dtype=np.uint64)
        code, bad = _kernel.sweep_montecarlo(table.dec, view["context"], view["batch"], var, idx, threads, dview)
        where = "ms_sweep_montecarlo"
    handle_library_error(code, where, start + s0 + max(bad, 0))
    fill_sweep(cols, s0, s1, grp.machine, grp.rt, plan.dicts["placement"])


def _filter_rows(plan, cols: dict, keep, n: int):
    """The keep mask after the spec's filters (None: keep every row)."""
    for k, bounds in plan.norm["filter"].items():
        if k in ("skip_inapplicable", "allow_beyond_max_context"):
            continue
        if keep is None:
            keep = np.ones(n, dtype=bool)
        if k == "fits":
            keep &= (cols["fits"] != plan.fits_codes[0][0]) == bounds
            continue
        if "min" in bounds:
            keep &= cols[k] >= bounds["min"]
        if "max" in bounds:
            keep &= cols[k] <= bounds["max"]
    return keep


def run_range(plan, start: int, end: int, threads: int = 1, buffers: dict | None = None) -> dict:
    """Columns of global configurations [start, end) (rows dropped by filters removed). With
    ``buffers`` (from :func:`_empty_columns`, at least end - start rows, reused across chunks so the
    kernels write into memory already mapped) the columns returned are views into them.

    Safe to call from several threads on one plan (each with its own buffers)."""
    n = end - start
    if buffers is None:
        buffers = _empty_columns(plan, n)
    cols = {k: v[:n] for k, v in buffers.items()}
    keep = None
    key = cols.pop("_key")
    variant = cols.pop("_variant")
    g0, g1 = start // plan.block, (end - 1) // plan.block
    segments = []
    for g in range(g0, g1 + 1) if n > 0 else ():
        a = max(start, g * plan.block)
        b = min(end, (g + 1) * plan.block)
        grp = plan.group(g)
        if grp.skip:
            if keep is None:
                keep = np.ones(n, dtype=bool)
            keep[a - start:b - start] = False
            continue
        _run_group(plan, grp, cols, key, variant, a, b, start, threads)
        segments.append((a - start, b - start, grp.facts))     # not the group: see ChunkFacts
        limit = grp.m.max_context
        if limit > 0 and not plan.norm["filter"].get("allow_beyond_max_context", False):
            beyond = cols["context"][a - start:b - start] > limit
            if beyond.any():
                if keep is None:
                    keep = np.ones(n, dtype=bool)
                keep[a - start:b - start] &= ~beyond
    check_chunk(plan, cols, segments, threads)     # every evaluated row, before filters or a file see it
    keep = _filter_rows(plan, cols, keep, n)
    names = plan.columns
    if keep is None or keep.all():
        return {c: cols[c] for c in names}
    return {c: cols[c][keep] for c in names}


def run_chunk(plan, k: int, threads: int = 1, buffers: dict | None = None) -> dict:
    start, end = plan.chunk_bounds(k)
    return run_range(plan, start, end, threads, buffers)
