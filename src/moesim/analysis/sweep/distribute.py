"""Running a sweep's chunks: serially (writing overlapped with the next chunk's kernels), in forked
worker processes (an in-memory sweep on one Linux machine) or on dask.distributed (each worker runs the
same kernel and writes the same files), with a progress bar.

A worker process keeps the plans of the sweeps it runs (:data:`_PLANS`, by spec hash) and shares
each among its threads: a Plan and its Groups are safe to share (see :class:`~.group.Group`)."""
from __future__ import annotations

import itertools
import mmap
import os
import pickle
import sys
from pathlib import Path

import numpy as np

from .plan import OnceCache, Plan
from .run import _empty_columns, run_chunk, run_range
from .spec import _err, spec_hash
from .store import _chunk_path, _write_chunk
from .table import SweepTable


_PLANS = OnceCache(4)


def _plan_for(norm: dict) -> Plan:
    """This process's Plan of a normalized spec, built once even when worker threads ask together."""
    return _PLANS.get(spec_hash(norm), lambda: Plan(norm))


def _dask_chunk(k: int, norm: dict, out: str | None, fmt: str, threads: int):
    """One chunk on a dask worker: the same kernel; writes its file (out) or returns its columns."""
    plan = _plan_for(norm)
    plan.table_threads = max(1, threads)
    cols = run_chunk(plan, k, threads)
    if out is None:
        return k, plan.chunk_len(k), cols
    rows = _write_chunk(SweepTable(cols, plan.dicts), _chunk_path(Path(out), k, fmt), fmt)
    return k, plan.chunk_len(k), rows


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="cfg", unit_scale=True, dynamic_ncols=True, smoothing=0.1,
                            desc="moesim sweep", file=sys.stderr)

    def update(self, n: int):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _run_dask(plan: Plan, pending: list, out: Path | None, fmt: str, threads: int, scheduler, local_workers,
              progress: _Progress) -> dict:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise _err("scheduler", "dask.distributed is not installed (pip install \"moesim[dask]\")") from None
    results: dict = {}
    cluster = None
    if scheduler is not None:
        client = Client(scheduler, timeout="30s")
    else:
        cluster = LocalCluster(n_workers=int(local_workers), threads_per_worker=max(1, threads),
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        futs = client.map(_dask_chunk, pending, norm=plan.norm, out=str(out) if out else None, fmt=fmt,
                          threads=threads, pure=False)
        for fut in as_completed(futs):
            k, n_cfg, res = fut.result()
            results[k] = res
            progress.update(n_cfg)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return results


def _run_writing(plan: Plan, pending: list, out: Path, fmt: str, threads: int, progress: _Progress) -> dict:
    """Serial kernels, chunk files written on a small thread pool."""
    from concurrent.futures import ThreadPoolExecutor
    # writers encode finished chunks (pyarrow releases the GIL) while the kernels fill the next column
    # set; a set is reused once its chunk is on disk, so memory stays at (writers + 1) chunks
    results: dict = {}
    writers = max(1, min(threads, 4))
    size = min(plan.chunk_size, plan.total)
    sets = [_empty_columns(plan, size) for _ in range(writers + 1)]
    busy: list = [None] * len(sets)
    with ThreadPoolExecutor(max_workers=writers) as pool:
        for i, k in enumerate(pending):
            slot = i % len(sets)
            if busy[slot] is not None:
                kk, f = busy[slot]
                results[kk] = f.result()
            cols = run_chunk(plan, k, threads, sets[slot])
            busy[slot] = (k, pool.submit(_write_chunk, SweepTable(cols, plan.dicts), _chunk_path(out, k, fmt), fmt))
            progress.update(plan.chunk_len(k))
        for item in busy:
            if item is not None:
                results[item[0]] = item[1].result()
    return results


def can_fork() -> bool:
    """Whether sweeps may fork workers here: Linux only (macOS's system frameworks are not fork-safe, and
    Windows has no fork); elsewhere ``processes`` runs serially, with the same results."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


# pieces per forked process: the groups' costs differ (a 1T-parameter model's rows take longer than a 1B
# one's), so each process takes every P-th of several slices rather than one contiguous share
SLICES_PER_PROCESS = 4


def _pieces(plan: Plan, pending: list, processes: int) -> list:
    """Each process's share of the pending chunks' configurations: ``SLICES_PER_PROCESS`` x ``processes``
    contiguous slices of about as many groups (a group's rows stay in one slice; a slice stays inside
    one chunk), dealt out in turn, as lists of (chunk, start, end)."""
    ranges = [(k,) + plan.chunk_bounds(k) for k in pending]
    total = sum(b - a for _, a, b in ranges)
    n = processes * SLICES_PER_PROCESS
    cuts = [min(total, -(-(total * i // n) // plan.block) * plan.block) for i in range(n + 1)]
    slices = []
    for lo, hi in zip(cuts, cuts[1:]):
        seen = 0
        for k, a, b in ranges:                  # lo, hi: offsets in the pending order, at group boundaries
            s, e = max(a, a + lo - seen), min(b, a + hi - seen)
            if s < e:
                slices.append((k, s, e))
            seen += b - a
    shares = [slices[i::processes] for i in range(processes)]
    return [sh for sh in shares if sh]


def _run_piece(plan: Plan, piece: list, threads: int) -> list:
    return [(k, a, run_range(plan, a, b, threads)) for k, a, b in piece]


def _shared_columns(plan: Plan, n: int) -> dict:
    """The plan's output columns for n rows in one anonymous shared mapping (mmap.mmap(-1, ...): shared with the
    processes forked after it): a worker writes its rows there and the caller reads them in place, instead of
    pickling them down a pipe (issue 19's grid: ~100 MB of columns a worker)."""
    dtypes = {c: a.dtype for c, a in _empty_columns(plan, 1).items()}
    offsets, total = {}, 0
    for c in plan.columns:
        total = -(-total // 8) * 8
        offsets[c] = total
        total += dtypes[c].itemsize * n
    mm = mmap.mmap(-1, max(total, 1))
    return {c: np.frombuffer(mm, dtype=dtypes[c], count=n, offset=offsets[c]) for c in plan.columns}


def _child(plan: Plan, piece: list, threads: int, fd: int, shared: dict) -> None:
    """A forked worker: its share's columns written into ``shared`` (:func:`_shared_columns`) and their places
    (chunk, first configuration, first row, rows) pickled down ``fd``, or the error it met; then it leaves at once
    (os._exit: the parent's atexit handlers and buffered output are the parent's), after handing what it lowered
    to the persistent lowering cache."""
    try:
        try:
            places, row = [], 0
            for k, a, b in piece:
                cols = run_range(plan, a, b, threads)
                m = len(cols[plan.columns[0]])
                for c in plan.columns:
                    shared[c][row:row + m] = cols[c]
                places.append((k, a, row, m))
                row += m
            payload = ("ok", places)
        except BaseException as exc:                # re-raised in the parent
            payload = ("error", exc)
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(("error", RuntimeError(f"sweep worker: {type(exc).__name__}: {exc}")))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        from ... import _lowering_cache
        _lowering_cache.flush()
    finally:
        os._exit(0)


_TURNS = itertools.count()


def _run_forked(plan: Plan, pending: list, threads: int, processes: int, progress: _Progress) -> dict:
    """In-memory chunks on ``processes`` forked workers, this process one of them: the plan (and what it
    has lowered) is inherited, not rebuilt, so a small sweep gains as much as a large one. The slices are
    joined per chunk in configuration order: the same columns as a serial run."""
    from .table import _concat
    shares = _pieces(plan, pending, processes)
    # this process takes a different share on each call: what a worker lowers dies with it, so a long-lived
    # process that kept the same share would lower the others' again on every call; turning, it has lowered every
    # share after `processes` calls and its forked workers inherit them all (the same columns either way)
    turn = next(_TURNS) % len(shares)
    shares = shares[turn:] + shares[:turn]
    children = []
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for share in shares[1:]:
            shared = _shared_columns(plan, sum(e - s for _, s, e in share))
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(plan, share, threads, w, shared)
            os.close(w)
            children.append((pid, os.fdopen(r, "rb"), shared))
        parts = _run_piece(plan, shares[0], threads)
        progress.update(sum(e - s for _, s, e in shares[0]))
        errors = []
        for (pid, f, shared), share in zip(children, shares[1:]):
            with f:
                data = f.read()
            os.waitpid(pid, 0)
            status, value = pickle.loads(data) if data else ("error", RuntimeError("sweep worker died"))
            if status != "ok":
                errors.append(value)
                continue
            parts += [(k, a, {c: v[row:row + m] for c, v in shared.items()}) for k, a, row, m in value]
            progress.update(sum(e - s for _, s, e in share))
        children = []
    finally:
        for pid, f, _ in children:                  # this process failed first: its workers are not needed
            f.close()
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
    if errors:
        raise errors[0]
    by_chunk: dict = {}
    for k, _, cols in sorted(parts, key=lambda p: (p[0], p[1])):
        by_chunk.setdefault(k, []).append(cols)
    return {k: v[0] if len(v) == 1 else _concat(v, plan.columns) for k, v in by_chunk.items()}


def _run_chunks(plan: Plan, pending: list, out: Path | None, fmt: str, threads: int, scheduler, local_workers,
                progress: _Progress, processes: int = 1) -> dict:
    """Run pending chunks serially (writing overlapped with the next chunk), in forked processes (in
    memory) or on dask.distributed."""
    if scheduler is not None or local_workers:
        return _run_dask(plan, pending, out, fmt, threads, scheduler, local_workers, progress)
    if processes > 1 and out is None and can_fork():
        return _run_forked(plan, pending, threads, processes, progress)
    if out is not None:
        return _run_writing(plan, pending, out, fmt, threads, progress)
    results: dict = {}
    for k in pending:
        results[k] = run_chunk(plan, k, threads)
        progress.update(plan.chunk_len(k))
    return results
