"""`moesim rank` over the whole catalog on one machine: the whole process, and in-process.

    python bench/bench_rank.py                 # 5 whole-process runs (median), then in-process cold + warm
    python bench/bench_rank.py --runs 3 --profile

whole process: `python -m moesim rank --gpu rtx-4090 --host ddr5-6000x2 --host-mem-gb 64` as a
subprocess, start-up and import included (the number a user waits for), beside `python -m moesim
--version` (what starting the CLI costs before any work). in-process: the first `moesim.rank(...)` (every
model and quant lowered) and the median of later calls in the same process (what a server pays). The
in-process split says how much of a call is the one sweep (`moesim.sweep`, analytic, in memory) and how
much is rank's own work around it (catalog models, the quant ladder, parameter counts, rows, sorting);
--profile prints the cProfile functions where a cold call's time goes.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time

ARGV = ["rank", "--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "64"]
MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)


def whole_process(argv: list, runs: int) -> tuple:
    """(wall seconds, CPU seconds) of `python -m moesim ARGV` in a fresh process, *runs* times each. CPU
    time (user + system of the child) is what a loaded machine does not inflate as much as wall time."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "moesim", *argv], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="whole-process runs and warm in-process calls")
    ap.add_argument("--profile", action="store_true", help="cProfile the cold in-process call")
    args = ap.parse_args()
    start, start_cpu = whole_process(["--version"], args.runs)
    full, full_cpu = whole_process(ARGV, args.runs)
    print(f"whole process: python -m moesim {' '.join(ARGV)}")
    print(f"  median of {args.runs}: {statistics.median(full):.3f} s wall, {statistics.median(full_cpu):.3f} s CPU "
          f"(walls {', '.join(f'{t:.2f}' for t in full)}); CLI start alone (--version) "
          f"{statistics.median(start):.3f} s wall, {statistics.median(start_cpu):.3f} s CPU")
    in_process(args.runs, args.profile)


if __name__ == "__main__":
    main()
