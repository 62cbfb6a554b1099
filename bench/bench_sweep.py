"""Sweep throughput: the C sweep loops vs their pure-Python twin, measured in the same run, and a large
analytic sweep streamed to Parquet.

    python bench/bench_sweep.py                        # analytic + Monte Carlo rates, 1 thread and all cores
    python bench/bench_sweep.py --big 100000000        # + a 100-million-configuration sweep to Parquet

Analytic rate: configurations per second of one chunk evaluated end to end in memory (the memory
kernel: placement, bytes per tier, fits, max context and batch; variant lookup; decode and prefill),
after the group's one-off lowering, into reused column buffers: what the sweep engine does per chunk
before writing. The pure-Python twin (moesim/sweep_reference.py) evaluates a sample of the same
configurations one by one; a loop of moesim.simulate(mode="analytic") is timed too, for scale, and the
same loop on the pure-Python reference cost model (engine="reference", moesim/reference.py).
Monte Carlo rate: configurations per second (each `--tokens` decode steps through the kernel's
sampler and caches) vs the pure-Python reference decoder (moesim/reference.py).
The big sweep runs `moesim sweep SPEC --out DIR` in a child process and reports its wall time, peak
resident memory (ru_maxrss of the child) and bytes written.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import moesim
from moesim.engine import decode as KD
from moesim.engine.lower import decode_model as LDM
from moesim.engine.lower import machine as LHW
from moesim.engine.reference import sweep as SR
from moesim.analysis.sweep.plan import Plan
from moesim.analysis.sweep.run import _empty_columns, run_range
from moesim.analysis.sweep.spec import build_spec, make_machine_cached, normalize_spec

MACHINE = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 192, "name": "4090-192g"}
BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]


def plan_for(model: str, placement: str, n_contexts: int, **run) -> Plan:
    spec = build_spec(models=[model], quants=["Q4_K_M"], machines=[MACHINE], placements=[placement],
                      contexts={"start": 256, "stop": 1 << 20, "num": n_contexts, "log": True}, batches=BATCHES,
                      chunk_size=1 << 20, filter={"allow_beyond_max_context": True},  # every row evaluated
                      **run)
    return Plan(normalize_spec(spec))


def rate_c(plan: Plan, threads: int, repeats: int = 3) -> float:
    n = min(plan.total, plan.chunk_size)
    buf = _empty_columns(plan, n)
    run_range(plan, 0, n, threads, buf)                       # group lowering and variants, once
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run_range(plan, 0, n, threads, buf)
        best = min(best, time.perf_counter() - t)
    return n / best


def rate_twin(plan: Plan, n: int) -> float:
    grp = plan.group(0)
    js = [int(j) for j in np.linspace(0, plan.block - 1, n).astype(int)]
    SR.configurations(grp, js[:2])                            # variants already lowered by the C runs
    t = time.perf_counter()
    SR.configurations(grp, js)
    return n / (time.perf_counter() - t)


def rate_simulate(plan: Plan, n: int, placement: str, engine: str = "c") -> float:
    mach = make_machine_cached(MACHINE)
    model = plan.values["models"][0]
    js = np.linspace(0, plan.block - 1, n).astype(int)
    t = time.perf_counter()
    for j in js:
        ci, bi = divmod(int(j), plan.n_b)
        moesim.simulate(model, mach, quant="Q4_K_M", context=int(plan.contexts[ci]), batch=int(plan.batches[bi]),
                        placement=None if placement == "auto" else placement, mode="analytic", engine=engine,
                        allow_beyond_max_context=True)
    return n / (time.perf_counter() - t)


def check_twin(plan: Plan, n: int = 200) -> None:
    grp = plan.group(0)
    cols = run_range(plan, 0, plan.block)
    js = [int(j) for j in np.linspace(0, plan.block - 1, n).astype(int)]
    for j, ref in zip(js, SR.configurations(grp, js)):
        for k, v in ref.items():
            if k != "key" and not (cols[k][j] == v or (v != v and cols[k][j] != cols[k][j])):
                raise SystemExit(f"C and Python twin differ at {j} {k}: {cols[k][j]} vs {v}")


def rate_mc_reference(plan: Plan, n: int) -> float:
    """Pure-Python Monte Carlo (moesim/reference.py) on the group's first configurations."""
    grp = plan.group(0)
    run_range(plan, 0, n)                                      # builds the variants (templates)
    t = time.perf_counter()
    for j in range(n):
        ci, bi = divmod(j, plan.n_b)
        ctx, b = int(plan.contexts[ci]), int(plan.batches[bi])
        p = grp.cands[0]
        dm = LDM.lower_model(grp.m, grp.low, p, grp.machine, grp.rt, ctx, grp.kv, b)
        hw = LHW.lower_machine(grp.machine, grp.rt, p, grp.kernel_mix)
        cols = dict(batch=[b], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[plan.run["tokens"]],
                    warmup=[plan.run["warmup"]], policy=[0], mode=[0], seed=[0], index=[j])
        KD.run(dm, hw, grp.routing, cols, engine="reference")
    return n / (time.perf_counter() - t)


BIG_MODELS = ["deepseek-r1", "qwen3-30b-a3b", "gpt-oss-120b", "glm-4.5-air", "llama-4-scout"]
BIG_QUANTS = ["Q2_K", "Q4_K_M", "Q8_0", "BF16"]
BIG_MACHINES = ['{gpu = "rtx-4090", host = "ddr5-6000x2", host_mem_gb = 192, name = "4090-192g"}',
                '{gpu = "rtx-4090", host = "ddr5-6000x2", host_mem_gb = 64, name = "4090-64g"}',
                '"dgx-h200"', '{gpu = "m3-ultra", name = "m3-ultra-512g", gpu_mem_gb = 512}',
                '{host = "ddr5-4800x12", host_mem_gb = 768, cores = 64, name = "epyc-768g"}']


def big_sweep(n_total: int, threads: int, keep: bool) -> None:
    n_groups = len(BIG_MODELS) * len(BIG_QUANTS) * len(BIG_MACHINES)
    n_ctx = -(-n_total // (n_groups * len(BATCHES)))
    tmp = Path(tempfile.mkdtemp(prefix="moesim-bench-"))
    spec = tmp / "spec.toml"
    quoted = lambda xs: "[" + ", ".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    spec.write_text(f"""[axes]
models = {quoted(BIG_MODELS)}
quants = {quoted(BIG_QUANTS)}
machines = [{", ".join(BIG_MACHINES)}]
placements = ["auto"]
contexts = {{start = 256, stop = {256 + 7 * (n_ctx - 1)}, step = 7}}
batches = {BATCHES}

[filter]
allow_beyond_max_context = true
""")
    out = tmp / "out"
    cmd = [sys.executable, "-m", "moesim", "sweep", str(spec), "--out", str(out), "--threads", str(threads),
           "--no-progress"]
    total = n_groups * n_ctx * len(BATCHES)
    print(f"\nbig sweep: {len(BIG_MODELS)} models x {len(BIG_QUANTS)} quants x {len(BIG_MACHINES)} machines x auto "
          f"placement x {n_ctx:,} contexts (256, 263, ...) x {len(BATCHES)} batches = {total:,} configurations")
    print("  spec:\n    " + spec.read_text().strip().replace("\n", "\n    "))
    print("  " + " ".join(cmd[1:]).replace(str(tmp), "$TMP"))
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if res.returncode:
        raise SystemExit(res.stderr)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024   # kB on Linux
    size = sum(p.stat().st_size for p in out.iterdir())
    print("  " + res.stdout.strip())
    print(f"  wall {wall:.1f} s ({total / wall / 1e6:.1f} M configurations/s to disk), peak RSS "
          f"{rss / 2**20:.0f} MiB, {size / 2**30:.2f} GiB of Parquet in {len(list(out.glob('part-*')))} files")
    if keep:
        print(f"  kept {out}")
    else:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, default=200_000, help="log-spaced contexts per group (x 10 batches)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="'all cores' thread count")
    ap.add_argument("--twin", type=int, default=300, help="configurations timed on the Python twin")
    ap.add_argument("--mc-configs", type=int, default=64)
    ap.add_argument("--mc-ref-configs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="Monte Carlo steps per configuration")
    ap.add_argument("--big", type=int, default=0, help="configurations of the Parquet sweep (0: skip)")
    ap.add_argument("--keep", action="store_true", help="keep the big sweep's output")
    args = ap.parse_args()
    from moesim.engine import _kernel
    print(f"moesim {moesim.__version__}, OpenMP {'on' if _kernel.openmp_enabled() else 'off'}, "
          f"{os.cpu_count()} cores; machine {MACHINE}")
    print(f"grid per row: Q4_K_M x {args.contexts:,} log-spaced contexts (256 .. 1M) x batches {BATCHES}")
    print("\nanalytic               placement        C 1 thread        C %d threads     Python twin    "
          "ratio (1 thread)  simulate() loop          reference.py" % args.threads)
    for model, placement in (("deepseek-r1", "n-cpu-moe=58"), ("deepseek-r1", "auto"),
                             ("qwen3-30b-a3b", "all-gpu"), ("qwen3-30b-a3b", "auto"), ("gpt-oss-120b", "auto")):
        plan = plan_for(model, placement, args.contexts)
        check_twin(plan)
        c1 = rate_c(plan, 1)
        cn = rate_c(plan, args.threads)
        tw = rate_twin(plan, args.twin)
        sim = rate_simulate(plan, 100, placement)
        ref = rate_simulate(plan, 10, placement, engine="reference")
        print(f"  {model:20s} {placement:14s} {c1 / 1e6:8.1f} M/s   {cn / 1e6:8.1f} M/s   {tw:10,.0f}/s   "
              f"{c1 / tw:12,.0f}x   {sim:8,.0f}/s ({c1 / sim:,.0f}x)   {ref:6,.1f}/s ({c1 / ref:,.0f}x)")
    print(f"\nMonte Carlo ({args.tokens} steps)  placement        C 1 thread     C %d threads    Python reference   ratio"
          % args.threads)
    for model, placement in (("qwen3-30b-a3b", "offload-cache=16"), ("deepseek-r1", "n-cpu-moe=58")):
        plan = Plan(normalize_spec(build_spec(
            models=[model], quants=["Q4_K_M"], machines=[MACHINE], placements=[placement],
            contexts={"start": 256, "stop": 1 << 17, "num": args.mc_configs // 2, "log": True}, batches=[1, 4],
            mode="montecarlo", tokens=args.tokens, chunk_size=1 << 20, filter={"allow_beyond_max_context": True})))
        plan = Plan(plan.norm)
        c1 = rate_c(plan, 1, repeats=1)
        cn = rate_c(plan, args.threads, repeats=1)
        ref = rate_mc_reference(plan, args.mc_ref_configs)
        print(f"  {model:20s}       {placement:16s} {c1:8,.0f}/s     {cn:8,.0f}/s     {ref:10,.2f}/s   {c1 / ref:8,.0f}x")
    if args.big:
        big_sweep(args.big, args.threads, args.keep)


if __name__ == "__main__":
    main()
