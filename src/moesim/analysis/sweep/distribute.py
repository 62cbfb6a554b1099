"""Running a sweep's chunks: serially (writing overlapped with the next chunk's kernels) or on
dask.distributed (each worker runs the same kernel and writes the same files), with a progress bar.

A worker process keeps the plans of the sweeps it runs (:data:`_PLANS`, by spec hash) and shares
each among its threads: a Plan and its Groups are safe to share (see :class:`~.group.Group`)."""
from __future__ import annotations

import sys
from pathlib import Path

from .plan import OnceCache, Plan
from .run import _empty_columns, run_chunk
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


def _run_chunks(plan: Plan, pending: list, out: Path | None, fmt: str, threads: int, scheduler, local_workers,
                progress: _Progress) -> dict:
    """Run pending chunks serially (writing overlapped with the next chunk) or on dask.distributed."""
    if scheduler is not None or local_workers:
        return _run_dask(plan, pending, out, fmt, threads, scheduler, local_workers, progress)
    if out is not None:
        return _run_writing(plan, pending, out, fmt, threads, progress)
    results: dict = {}
    for k in pending:
        results[k] = run_chunk(plan, k, threads)
        progress.update(plan.chunk_len(k))
    return results
