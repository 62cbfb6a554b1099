"""Memory-accounting throughput: C kernel vs the pure-Python reference, measured in the same run.

    python bench/bench_memory.py [--configs 200000] [--threads 2]

Each configuration is a full `ms_memory` call: bytes per tier and class at the given context and
batch, plus the largest context and largest batch that fit (two searches over the same accounting).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from moesim.engine.lower import memory as M
from moesim.engine import memory as EMEM
from moesim.spec.hardware import machine
from moesim.ingest import model
from moesim.spec.placement import parse
from moesim.spec.runtimes import runtime


def random_columns(mod, low, n, rng):
    mach = machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=192)
    base = M.configure(mod, low, mach, runtime("llama.cpp"), parse("all-gpu"), 4096, 1, "f16")
    cols = M.config_columns(base, n)
    cols["context"] = rng.integers(1, mod.max_context + 1, n)
    cols["batch"] = rng.integers(1, 65, n)
    cols["placement"] = rng.choice([0, 1, 2, 3, 4, 5], n)
    cols["placement_arg"] = rng.integers(0, mod.n_layers + 1, n)
    cols["gpu_capacity"] = rng.uniform(8, 200, n) * 2**30
    cols["host_capacity"] = rng.uniform(16, 1024, n) * 1e9
    return cols


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="deepseek-r1")
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--configs", type=int, default=200_000)
    ap.add_argument("--reference-configs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    mod = model(args.model)
    low = M.lower(mod, args.quant)
    cols = random_columns(mod, low, args.configs, rng)
    ref_cols = {k: v[: args.reference_configs] for k, v in cols.items()}

    t = time.perf_counter()
    ref = EMEM.evaluate(low, ref_cols, engine="reference")
    ref_rate = args.reference_configs / (time.perf_counter() - t)
    check = EMEM.evaluate(low, ref_cols, engine="c")
    assert np.array_equal(check["max_context"], ref["max_context"]), "C and reference disagree"

    rates = {}
    for threads in sorted({1, args.threads}):
        t = time.perf_counter()
        EMEM.evaluate(low, cols, n_threads=threads)
        rates[threads] = args.configs / (time.perf_counter() - t)
    print(f"model {args.model} {args.quant}: {low.n_layers} layers")
    print(f"reference (pure Python): {ref_rate:12,.0f} configs/s")
    for threads, r in rates.items():
        print(f"C kernel, {threads} thread(s): {r:12,.0f} configs/s   ({r / ref_rate:,.0f}x reference)")


if __name__ == "__main__":
    main()
