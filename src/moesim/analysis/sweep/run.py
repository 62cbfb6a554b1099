"""Running configurations: the C loops (memory, variant lookup, analytic or Monte Carlo decode) over
a range of global configuration indices, group by group, into column buffers; then the filters."""
from __future__ import annotations

import numpy as np

from ...engine import _kernel
from ...engine.glue import handle_library_error
from ..consistency import check_chunk
from ..intervals import fill_sweep_chunk, widen_columns
from .workloads import workload_ratios
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
               threads: int, views: tuple) -> "dict | None":
    """Rows [a, b) (global indices, one group) into cols[a - start : b - start]; returns the rows' routing-workload
    ratios (.workloads.workload_ratios: None where the group's profile pools none); ``views``: (memory columns, decode
    columns) of the whole chunk (:func:`_chunk_views`), which the kernels write from row a - start on. The
    columns that hold one value per group (codes, options, cache bytes per token) are :func:`_fill_constants`', the
    interval columns intervals.fill_sweep_chunk's (run_range fills both for the chunk)."""
    s0, s1 = a - start, b - start
    mem_view, dec_view = views
    code, bad = _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, plan.fast_zipped, a - grp.g * plan.block,
                                     b - a, threads, mem_view, s0)
    handle_library_error(code, "ms_sweep_memory", start + s0 + max(bad, 0))
    keys, ctx, bat = key[s0:s1], cols["context"][s0:s1], cols["batch"][s0:s1]
    if grp.direct:
        from .direct import evaluate
        evaluate(grp, keys, ctx, bat, {k: v[s0:s1] for k, v in dec_view.items()})
        return workload_ratios(grp, cols, key, s0, s1, threads)
    var = variant[s0:s1]
    # evaluate with the very table the rows were resolved against (others may grow the group meanwhile)
    table = grp.resolve_variants(keys, var)
    if plan.mode != "montecarlo":
        code, bad = _kernel.sweep_analytic(table.dec, ctx, bat, var, threads, dec_view, s0)
        where = "ms_sweep_analytic"
    else:
        idx = np.arange(a, b, dtype=np.uint64)
        code, bad = _kernel.sweep_montecarlo(table.dec, ctx, bat, var, idx, threads,
                                             {k: v[s0:s1] for k, v in dec_view.items()})
        where = "ms_sweep_montecarlo"
    handle_library_error(code, where, start + s0 + max(bad, 0))
    return workload_ratios(grp, cols, key, s0, s1, threads)


def _chunk_views(plan, cols: dict, key: np.ndarray) -> tuple:
    """(memory columns, decode columns) of a chunk as the sweep kernels take them (whole columns and a row offset)."""
    mem = {k: cols[k] for k in _kernel.MEM_OUT_I32 + _kernel.MEM_OUT_I64 + _kernel.MEM_OUT_F64 if k != "key"}
    mem["key"] = key
    return mem, {k: cols[k] for k in decode_columns(plan.mode)}


def _fill_constants(cols: dict, consts: list, lengths: list, n: int) -> None:
    """The columns that hold one value per group (the categorical codes, the option axes' values, the cache bytes
    per token) over a chunk's rows [0, n) at once: ``consts`` each group's (codes, option values, cache bytes per
    token) in row order (None where skipped: rows the keep mask drops), ``lengths`` its rows. The chunk holds
    these, not the groups (see ChunkFacts)."""
    live = next((c for c in consts if c is not None), None)
    if live is None:
        return
    def fill(col, value):
        vals = np.array([value(c) if c is not None else 0 for c in consts], dtype=cols[col].dtype)
        cols[col][:n] = np.repeat(vals, lengths)
    for k in live[0]:
        fill(k, lambda c: c[0][k])
    for k in live[1]:
        fill(k, lambda c: c[1][k])
    fill("kv_bytes_per_token", lambda c: c[2])


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
    views = _chunk_views(plan, cols, key)
    consts, lengths, intervals, widen = [], [], [], []
    for g in range(g0, g1 + 1) if n > 0 else ():
        a = max(start, g * plan.block)
        b = min(end, (g + 1) * plan.block)
        grp = plan.group(g)
        lengths.append(b - a)
        if grp.skip:
            consts.append(None)
            if keep is None:
                keep = np.ones(n, dtype=bool)
            keep[a - start:b - start] = False
            continue
        consts.append((grp.codes, grp.option_values, grp.kv_bytes_per_token))
        intervals.append((a - start, b - start, grp.machine, grp.rt))
        ratios = _run_group(plan, grp, cols, key, variant, a, b, start, threads, views)
        if ratios is not None:
            widen.append((slice(a - start, b - start), ratios))
        segments.append((a - start, b - start, grp.facts))     # not the group: see ChunkFacts
        limit = grp.m.max_context
        if limit > 0 and not plan.norm["filter"].get("allow_beyond_max_context", False):
            beyond = cols["context"][a - start:b - start] > limit
            if beyond.any():
                if keep is None:
                    keep = np.ones(n, dtype=bool)
                keep[a - start:b - start] &= ~beyond
    _fill_constants(cols, consts, lengths, n)
    fill_sweep_chunk(cols, intervals, plan.dicts["placement"])
    for rows, ratios in widen:          # a pooled routing profile's spread across its workloads (issue 15)
        widen_columns(cols, rows, ratios)
    check_chunk(plan, cols, segments, threads)     # every evaluated row, before filters or a file see it
    keep = _filter_rows(plan, cols, keep, n)
    names = plan.columns
    if keep is None or keep.all():
        return {c: cols[c] for c in names}
    kept_rows = np.flatnonzero(keep)        # once: a boolean mask per column would count its rows again each time
    return {c: cols[c].take(kept_rows) for c in names}


def run_chunk(plan, k: int, threads: int = 1, buffers: dict | None = None) -> dict:
    start, end = plan.chunk_bounds(k)
    return run_range(plan, start, end, threads, buffers)
