"""`moesim rank` over the whole catalog on one machine: the whole process, and in-process.

    python bench/bench_rank.py                 # 5 whole-process runs (median), then in-process cold + warm
    python bench/bench_rank.py --runs 3 --profile

whole process: `python -m moesim rank --gpu rtx-4090 --host ddr5-6000x2 --host-mem-gb 64` as a
subprocess, start-up and import included (the number a user waits for), beside `python -m moesim
--version` (what starting the CLI costs before any work), three ways: the persistent lowering cache
(moesim._lowering_cache) off, empty (a first run: it lowers the catalog and writes the cache at exit)
and populated (a later run: it loads the lowering). The runs use a temporary cache folder, never the
user's, and a temporary bytecode folder (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE dropped) so that
Python compiles moesim once, as an installed package ships it compiled (--no-pyc: the environment's
own setting). in-process (the lowering cache off, so a cold call lowers everything): the first `moesim.rank(...)` (every
model and quant lowered) and the median of later calls in the same process (what a server pays). The
in-process split says how much of a call is the one sweep (`moesim.sweep`, analytic, in memory) and how
much is rank's own work around it (catalog models, the quant ladder, parameter counts, rows, sorting);
--profile prints the cProfile functions where a cold call's time goes. The CLI forks the sweep into
one process per core (up to 4, ``--processes``); the in-process calls run serially, then warm calls are
repeated forked as the CLI runs them.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

ARGV = ["rank", "--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "64"]
MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)


def whole_process(argv: list, runs: int, env: "dict | None" = None, before_each=None) -> tuple:
    """(wall seconds, CPU seconds) of `python -m moesim ARGV` in a fresh process, *runs* times each
    (*before_each* called before each run). CPU time (user + system of the child) is what a loaded
    machine does not inflate as much as wall time."""
    wall, cpu = [], []
    for _ in range(runs):
        if before_each is not None:
            before_each()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "moesim", *argv], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ) if env is None else env)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


class _TimedSweep:
    """Wraps moesim.analysis.sweep.sweep (which rank imports when it runs) to add up its wall time."""

    def __init__(self, sweep_pkg):
        self.pkg, self.inner, self.seconds, self.configs = sweep_pkg, sweep_pkg.sweep, 0.0, 0

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        tab = self.inner(*a, **kw)
        self.seconds += time.perf_counter() - t0
        self.configs += len(kw["models"]) * len(kw["quants"])
        return tab

    def __enter__(self):
        self.pkg.sweep = self
        return self

    def __exit__(self, *exc):
        self.pkg.sweep = self.inner


def in_process(runs: int, profile: bool) -> None:
    os.environ["MOESIM_CACHE"] = "off"          # a cold call lowers every model and quant
    t0 = time.perf_counter()
    import moesim
    from moesim.analysis import sweep as sweep_pkg
    t_import = time.perf_counter() - t0
    mach = moesim.machine(**MACHINE)
    calls = []
    for i in range(runs + 1):
        prof = cProfile.Profile() if profile and i == 0 else None
        with _TimedSweep(sweep_pkg) as timed:
            t0, c0 = time.perf_counter(), time.process_time()
            if prof:
                prof.enable()
            rows = moesim.rank(mach)
            if prof:
                prof.disable()
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
        calls.append((total, timed.seconds, timed.configs, len(rows), cpu))
        if prof:
            print("cold call, by cumulative time (cProfile adds overhead):")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    total, sweep_s, configs, n_rows, cpu = calls[0]
    print(f"in-process: import moesim {t_import:.3f} s")
    print(f"  cold call: {total:.3f} s wall, {cpu:.3f} s CPU ({configs} configurations -> {n_rows} rows, "
          f"{configs / total:,.0f} configs/s); sweep {sweep_s:.3f} s, rank's own {total - sweep_s:.3f} s")
    warm = calls[1:]
    if warm:
        med = statistics.median(c[0] for c in warm)
        own = statistics.median(c[0] - c[1] for c in warm)
        print(f"  warm calls (median of {len(warm)}): {med:.3f} s wall, {statistics.median(c[4] for c in warm):.3f} s "
              f"CPU ({configs / med:,.0f} configs/s); rank's own {own * 1e3:.1f} ms")
        from moesim.cli.views import RANK_PROCESSES
        from moesim.spec.limits import usable_cpus
        procs = min(usable_cpus(), RANK_PROCESSES)
        if procs > 1:
            walls = []
            for _ in range(runs):
                t0 = time.perf_counter()
                moesim.rank(mach, processes=procs)
                walls.append(time.perf_counter() - t0)
            med = statistics.median(walls)
            print(f"  warm calls forked into {procs} processes (as the CLI runs it; median of {runs}): {med:.3f} s "
                  f"wall ({configs / med:,.0f} configs/s)")


def _median_line(label: str, wall: list, cpu: list) -> str:
    return (f"  {label:<24} median of {len(wall)}: {statistics.median(wall):.3f} s wall, "
            f"{statistics.median(cpu):.3f} s CPU (walls {', '.join(f'{t:.2f}' for t in wall)})")


def whole_process_report(runs: int, pyc: bool) -> None:
    """The whole-process rank with the lowering cache off, empty and populated."""
    tmp = tempfile.mkdtemp(prefix="bench-rank-")
    cache = os.path.join(tmp, "cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOESIM_CACHE")}
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pyc")
        subprocess.run([sys.executable, "-m", "moesim", "--version"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        start = whole_process(["--version"], runs, env)
        off = whole_process(ARGV, runs, {**env, "MOESIM_CACHE": "off"})
        empty = whole_process(ARGV, runs, {**env, "MOESIM_CACHE_DIR": cache},
                              before_each=lambda: shutil.rmtree(cache, ignore_errors=True))
        full = whole_process(ARGV, runs, {**env, "MOESIM_CACHE_DIR": cache})
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"whole process: python -m moesim {' '.join(ARGV)}"
          f"{'' if pyc else ' (bytecode as the environment has it)'}")
    print(_median_line("lowering cache off", *off))
    print(_median_line("cache empty (first run)", *empty))
    print(_median_line("cache populated", *full))
    print(_median_line("CLI start (--version)", *start))
    print(f"  lowering cache on disk: {size / 1e6:.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="whole-process runs and warm in-process calls")
    ap.add_argument("--profile", action="store_true", help="cProfile the cold in-process call")
    ap.add_argument("--no-pyc", action="store_true", help="leave Python's bytecode caching as the environment sets it")
    args = ap.parse_args()
    whole_process_report(args.runs, not args.no_pyc)
    in_process(args.runs, args.profile)


if __name__ == "__main__":
    main()
