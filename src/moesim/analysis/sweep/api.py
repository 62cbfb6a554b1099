"""``moesim.sweep(...)``: spec -> plan -> chunks (serial or dask) -> a table or a sweep directory."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import types
from pathlib import Path

from ... import __version__
from ..._catalog import catalog_version
from ...errors import unknown_id
from ...spec.hardware import Machine
from ...spec.limits import this_machines_ram
from .distribute import _Progress, _run_chunks
from .plan import Plan
from .spec import MAX_THREADS, _count, _err, build_spec, normalize_spec
from .store import FORMATS, _finish, _pending, _prepare_out, locked
from .table import SweepTable, _concat


def _in_memory(plan: Plan, fmt: str, threads: int, scheduler, local_workers, progress: bool,
               processes: int = 1) -> SweepTable:
    need = 2 * plan.total * 8 * len(plan.columns)        # the chunks' columns, then the table they join into
    have = this_machines_ram()
    if have and need > have / 2:
        raise _err("out", f"{plan.total:,} configurations need about {need / 2**30:,.1f} GiB held in memory, over "
                          f"half of this machine's {have / 2**30:.0f} GiB: give out= (a directory of chunks, "
                          "written with bounded memory) or a smaller grid")
    bar = _Progress(plan.total, progress)
    try:
        res = _run_chunks(plan, list(range(plan.n_chunks)), None, fmt, threads, scheduler, local_workers, bar,
                          processes)
    finally:
        bar.close()
    cols = _concat([res[k] for k in range(plan.n_chunks)], plan.columns)
    return SweepTable(cols, plan.dicts, {"moesim": __version__, "catalog": catalog_version(),
                                         "seed": plan.run["seed"], "spec_hash": plan.hash, "mode": plan.mode})


# allocations between young collections while a sweep runs: lowering a grid's groups allocates some 10^7 small objects,
# most of them kept (the process's lowered tables); at Python's default 700 the young collections run ~2,700 times in a
# first website grid (bench/bench_grids.py) and the full ones they trigger, 12 of them, walk every table kept so far
SWEEP_GC_THRESHOLD = 10_000
_gc_lock = threading.Lock()
# sweeps running in this process, the collector's thresholds before the first of them, whether it froze the heap
_gc_state = types.SimpleNamespace(running=0, thresholds=None, froze=False)


@contextlib.contextmanager
def _collector_relaxed():
    """The cyclic collector, while any sweep of this process runs, run less often (:data:`SWEEP_GC_THRESHOLD`) and
    blind to the objects alive when the first of them started (gc.freeze: the catalog, earlier sweeps' kept
    lowerings, which a full collection would otherwise walk every other warm website sweep); the last sweep to end
    puts both back. It still runs: a long sweep's own cyclic garbage is collected as it goes. Objects the caller
    froze stay frozen (no freeze then: unfreeze would thaw theirs)."""
    st = _gc_state
    with _gc_lock:
        if st.running == 0:
            st.thresholds = gc.get_threshold()
            st.froze = gc.get_freeze_count() == 0
            if st.froze:
                gc.freeze()
            gc.set_threshold(max(st.thresholds[0], SWEEP_GC_THRESHOLD), *st.thresholds[1:])
        st.running += 1
    try:
        yield
    finally:
        with _gc_lock:
            st.running -= 1
            if st.running == 0:
                gc.set_threshold(*st.thresholds)
                if st.froze:
                    gc.unfreeze()


def _to_directory(plan: Plan, out, fmt: str, threads: int, scheduler, local_workers, progress: bool) -> dict:
    outp = Path(out)
    try:
        with locked(outp):
            return _write_directory(plan, outp, fmt, threads, scheduler, local_workers, progress)
    except OSError as exc:   # read-only, permission denied, disk full: the folder's fault, said as such
        raise _err("out", f"cannot write the sweep to {outp}: {exc.strerror or exc}") from None


def _write_directory(plan: Plan, outp: Path, fmt: str, threads: int, scheduler, local_workers, progress: bool) -> dict:
    done = _prepare_out(outp, plan, fmt)
    if done is not None:
        return dict(done, already_complete=True)
    pending = _pending(outp, plan, fmt)
    bar = _Progress(plan.total, progress)
    todo = set(pending)
    bar.update(sum(plan.chunk_len(k) for k in range(plan.n_chunks) if k not in todo))
    try:
        _run_chunks(plan, pending, outp, fmt, threads, scheduler, local_workers, bar)
    finally:
        bar.close()
    return _finish(outp, plan, fmt)


def sweep(spec=None, *, models=None, quants=None, machines=None, runtimes=None, kv_dtypes=None, placements=None,
          policies=None, cache_experts=None, prefetch_recall=None, mtp=None, mtp_acceptance=None, parallel=None,
          routing=None, ubatch=None, contexts=None, batches=None, zip=None, filter=None, mode=None, seed=None,
          chunk_size=None, prompt=None, tokens=None, warmup=None, out=None, format: str = "parquet",
          threads: int | None = None, scheduler: str | None = None, local_workers: int | None = None,
          progress: bool | None = None, processes: int | None = None):
    """Evaluate a grid of configurations (DESIGN §4 ``moesim.sweep``).

    Axes (lists; contexts/batches also ``{start, stop, num, log}`` ranges): ``models``, ``quants``,
    ``machines`` (catalog ids or dicts of :func:`moesim.machine` arguments, or Machine objects),
    ``runtimes``, ``kv_dtypes``, ``placements`` (``"auto"`` = what the runtime's own fitting picks, per
    configuration), ``policies``, ``contexts``, ``batches``, and simulate's options ``cache_experts`` (GPU
    expert-cache slots per MoE layer: placement offload-cache=N), ``prefetch_recall``, ``mtp`` (drafts),
    ``mtp_acceptance``, ``parallel`` (``"auto"`` or tp2, ep8, ...), ``routing`` (profile ids or
    ``"auto"``), ``ubatch`` (llama.cpp -ub) and ``prompt`` (a list of prompt lengths; one number is the
    run option), each a column when given; ``zip=[["models", "quants"]]`` varies axes
    together; ``filter={"fits": True}`` keeps configurations that fit. ``mode`` is ``"analytic"`` or
    ``"montecarlo"`` (stream (seed, global index) per configuration).

    Without ``out``: returns a :class:`SweepTable`. With ``out``: writes chunk files and a manifest to
    that directory (resumable; see :mod:`moesim.analysis.sweep`) and returns the manifest dict.
    ``threads`` (default: every core; one per dask worker) never changes results, nor do ``scheduler`` /
    ``local_workers`` (dask.distributed) or ``processes``: an in-memory sweep forked into that many worker
    processes on Linux (the threads shared among them; elsewhere it runs in this process). Python's share
    of a grid of many small groups runs on one core per process, so ``processes`` is what speeds those up;
    fork from a process whose other threads hold no locks (a script or the CLI, not a threaded server)."""
    if machines is not None and isinstance(machines, Machine):
        machines = [machines]
    s = build_spec(spec, models=models, quants=quants, machines=machines, runtimes=runtimes, kv_dtypes=kv_dtypes,
                   placements=placements, policies=policies, cache_experts=cache_experts,
                   prefetch_recall=prefetch_recall, mtp=mtp, mtp_acceptance=mtp_acceptance, parallel=parallel,
                   routing=routing, ubatch=ubatch, contexts=contexts, batches=batches, zip=zip,
                   filter=filter, mode=mode, seed=seed, chunk_size=chunk_size, prompt=prompt, tokens=tokens,
                   warmup=warmup)
    if format not in FORMATS:
        raise unknown_id("format", format, FORMATS, "format")
    distributed = scheduler is not None or bool(local_workers)
    threads = (_count(threads, "threads", maximum=MAX_THREADS) if threads is not None
               else (1 if distributed else os.cpu_count() or 1))
    if scheduler is not None and local_workers:
        raise _err("scheduler", "give either a scheduler address or local_workers, not both")
    if local_workers is not None:
        local_workers = _count(local_workers, "local_workers", 0, MAX_THREADS)
    processes = 1 if processes is None else _count(processes, "processes", maximum=MAX_THREADS)
    if processes > 1:
        if out is not None or distributed:
            raise _err("processes", "forked worker processes run in-memory sweeps; a sweep written to out= or "
                                    "run on dask takes local_workers or a scheduler instead")
        threads = max(1, threads // processes)        # the cores are shared among the processes
    plan = Plan(normalize_spec(s))
    plan.table_threads = threads
    if progress is None:
        progress = bool(out) and sys.stderr.isatty() and plan.total > plan.chunk_size
    try:
        with _collector_relaxed():
            if out is None:
                return _in_memory(plan, format, threads, scheduler, local_workers, progress, processes)
            return _to_directory(plan, out, format, threads, scheduler, local_workers, progress)
    finally:
        # the plan's cached groups point back to it: without them the plan goes by reference counting as the
        # sweep returns, not in a later full collection that walks everything it shared (the next sweep's)
        plan.drop_groups()
