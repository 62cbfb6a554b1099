"""Decode-simulation throughput: C kernel vs the pure-Python reference, measured in the same run.

    python bench/bench_decode.py [--model qwen3-30b-a3b] [--threads 2] [--routing PROFILE]

Monte Carlo: expert selections per second (token x MoE layer x top-k picks sampled, unioned over the
batch, run through the expert cache and costed step by step). Analytic: full configurations per
second (every layer costed from expected distinct experts and Che-approximated LRU hit rates).
Both paths are checked against the reference on the configurations timed for it.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from moesim.engine import codes as CODES
from moesim.engine import decode as KD
from moesim.engine.lower import decode_model as LDM
from moesim.engine.lower import machine as LHW
from moesim.spec import quants as Q
from moesim.engine.lower import routing as LRT
from moesim.spec import routing as R
from moesim.spec.hardware import machine
from moesim.engine.lower.memory import configure, lower
from moesim.engine.memory import evaluate, _result_from_arrays
from moesim.ingest import model
from moesim.spec.placement import parse
from moesim.spec.runtimes import runtime


def tables(mid: str, quant: str, placement: str, batch_tokens: int, host_mem_gb: float = 512, routing=None):
    m = model(mid)
    low = lower(m, quant)
    mach = machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=host_mem_gb)
    rt = runtime("llama.cpp")
    p = parse(placement, m, mach)
    mem = _result_from_arrays(evaluate(low, configure(m, low, mach, rt, p, 4096, 1, "f16")), 0)
    dm = LDM.lower_model(m, low, p, mach, rt, 4096, "f16", batch_tokens, mem.by_class, mem.tier)
    hw = LHW.lower_machine(mach, rt, p, Q.kernel_mix(m, quant))
    rtab = LRT.lower(LRT.RoutingDims.of(m), R.profile(routing, family=m.family), seed=0)
    return m, dm, hw, rtab


def columns(n, mode, batch, steps, policy="lru"):
    return dict(batch=[batch] * n, tokens_per_step=[1] * n, drafts=[0] * n, accepted=[1.0] * n, steps=[steps] * n,
                warmup=[0] * n, policy=[CODES.POLICIES[policy]] * n, mode=[CODES.MODES[mode]] * n, seed=[0] * n,
                index=list(range(n)))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--placement", default="offload-cache=16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=256, help="Monte Carlo steps per configuration")
    ap.add_argument("--mc-configs", type=int, default=16)
    ap.add_argument("--analytic-configs", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--host-mem-gb", type=float, default=512,
                    help="host RAM (below the model's host share, experts page from NVMe: slower analytic path)")
    ap.add_argument("--routing", help="routing profile id (default: the model family's)")
    args = ap.parse_args()
    m, dm, hw, rtab = tables(args.model, args.quant, args.placement, args.batch, args.host_mem_gb, args.routing)
    print(f"{args.model} {args.quant}, {args.placement}, batch {args.batch}, {args.host_mem_gb:g} GB host: "
          f"{rtab['n_layers']} MoE layers, {rtab['n_experts']} experts, top-{rtab['top_k']}"
          f"{', experts paged from NVMe' if min(dm['page_slots']) < rtab['n_experts'] else ''}")

    # ---- Monte Carlo: selections per second
    ref_steps = max(4, args.steps // 16)
    ref, t_ref = timed(lambda: KD.run(dm, hw, rtab, columns(1, "montecarlo", args.batch, ref_steps), engine="reference"))
    chk = KD.run(dm, hw, rtab, columns(1, "montecarlo", args.batch, ref_steps))
    assert np.allclose(chk["step_mean"], ref["step_mean"], rtol=1e-9), "C and reference disagree (Monte Carlo)"
    ref_rate = ref["selections"].sum() / t_ref
    print(f"Monte Carlo   reference (pure Python): {ref_rate:14,.0f} expert selections/s")
    for threads in sorted({1, args.threads}):
        res, t = timed(lambda: KD.run(dm, hw, rtab, columns(args.mc_configs, "montecarlo", args.batch, args.steps),
                                     n_threads=threads))
        rate = res["selections"].sum() / t
        print(f"Monte Carlo   C kernel, {threads} thread(s): {rate:14,.0f} expert selections/s "
              f"({rate / ref_rate:,.0f}x reference; {args.mc_configs / t:,.1f} configs of {args.steps} steps/s)")

    # ---- analytic: configurations per second
    n_ref = 20
    ref, t_ref = timed(lambda: KD.run(dm, hw, rtab, columns(n_ref, "analytic", args.batch, 1), engine="reference"))
    chk = KD.run(dm, hw, rtab, columns(n_ref, "analytic", args.batch, 1))
    assert np.allclose(chk["step_mean"], ref["step_mean"], rtol=1e-9), "C and reference disagree (analytic)"
    ref_rate = n_ref / t_ref
    print(f"Analytic      reference (pure Python): {ref_rate:14,.1f} configs/s")
    for threads in sorted({1, args.threads}):
        _, t = timed(lambda: KD.run(dm, hw, rtab, columns(args.analytic_configs, "analytic", args.batch, 1),
                                   n_threads=threads))
        rate = args.analytic_configs / t
        print(f"Analytic      C kernel, {threads} thread(s): {rate:14,.0f} configs/s ({rate / ref_rate:,.0f}x reference)")


if __name__ == "__main__":
    main()
