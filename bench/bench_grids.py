"""The grids users run, end to end through the public API (issue: sweeps at full speed on narrow grids).

    python bench/bench_grids.py                 # website and one-machine grids
    python bench/bench_grids.py --twin 40       # + the pure-Python twin on 40 of each grid's groups
    python bench/bench_grids.py --only "offload research" --only datacenter --twin 40
    python bench/bench_grids.py --processes 2   # forked into 2 worker processes (one per core here); warm =
                                                # the third call
    python bench/bench_grids.py --only "issue 19" --threads 2

website: every catalog model x Q4_K_M, Q8_0 x 59 machines (49 discrete GPUs of NVIDIA, AMD and Intel from Pascal
on, each with 128 GB of DDR5-6000 x2, and 10 unified-memory chips: Apple M1-M5, Strix Halo, DGX Spark) x 4
contexts x 3 batches, automatic placement: many small groups, the shape of a fit table on a web page (issue
19 asks for >= 200 models x quants and >= 50 machines).
one machine: every catalog model x 6 GGUF quants on one RTX 4090 + 64 GB at one context and batch: the
"what runs on my GPU" question ("one machine, 31 models": the same on the first 31 catalog ids, issue 19's
size of it, which it asks to answer in under 0.2 s inside the process).
offload research: qwen3-30b-a3b Q4_K_M on an RTX 4090 + 64 GB DDR5, offload-cache with every GPU expert-cache
size 0..E (129), the three analytic policies (lru, lfu, static; belady needs run.mode = montecarlo), prefetch
recall 0, .25, .5, .75, 1 and batches 1..128 at one context: 15,480 configurations in 1,935 groups of 8.
datacenter: deepseek-r1 fp8 under vLLM on a DGX H200 (8 GPUs), five parallel layouts, MTP 0 and 1 (the
catalog's measured acceptance for the family) and batches 1..1024 at 8k context.
issue 19: wide in models, quants, machines and placements, narrow per group: deepseek-r1, qwen3-30b-a3b,
gpt-oss-120b, mixtral-8x7b x Q4_K_M, Q8_0, Q2_K, IQ4_XS x RTX 4090, RTX 5090, H200, RTX 3090 (each with the
machine's default host) x all-gpu, experts-cpu, n-cpu-moe=2..58 (step 4) x 256 contexts (1k..256k) x
batches 1..128, analytic, inapplicable rows skipped: 641,024 configurations in many groups of 2,048, where
the per-group work (lowering, prefill, decode variants; host page caches of models paged from NVMe under
windowed routing) shows.

Each grid runs twice in one process: the first time includes lowering every model and quant (cached
afterwards), the second is what a long-lived process (a server, a notebook) pays. Rates are configurations
per second including the output table. With --twin, engine/reference/sweep.py evaluates every
configuration of the first N groups of each grid one by one (groups with drafts or prefetch take the
whole-step path, which has no twin, and are passed over) (their tables and decode variants lowered first, as the C
path has them, so the twin's rate is of the per-configuration work only and the ratio shows how much of
the C path's time is that work).
"""
from __future__ import annotations

import argparse
import gc
import time

import moesim
from moesim.analysis.sweep.plan import Plan
from moesim.analysis.sweep.run import run_range
from moesim.analysis.sweep.spec import build_spec, normalize_spec
from moesim.engine.reference import sweep as SR
from moesim.spec import models as M

# the website grid's machines (issue 19: at least 50): discrete cards of every vendor and generation a fit table
# lists, each with 128 GB of dual-channel DDR5, and unified-memory chips as they ship
WEBSITE_GPUS = [
    "gtx-1080-ti", "tesla-p40", "rtx-2060", "rtx-2080-ti", "rtx-3060", "rtx-3060-ti", "rtx-3070", "rtx-3080",
    "rtx-3080-ti", "rtx-3090", "rtx-3090-ti", "rtx-4060", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "rtx-4070",
    "rtx-4070-super", "rtx-4070-ti-super", "rtx-4080", "rtx-4080-super", "rtx-4090", "rtx-5060-ti-16gb",
    "rtx-5070", "rtx-5070-ti", "rtx-5080", "rtx-5090", "rtx-a4000", "rtx-a6000", "rtx-4000-ada", "rtx-6000-ada",
    "rtx-pro-6000", "l4", "l40s", "a100-pcie-80gb", "h100-pcie", "rx-6700-xt", "rx-6800-xt", "rx-6900-xt",
    "rx-7600-xt", "rx-7800-xt", "rx-7900-xt", "rx-7900-xtx", "rx-9060-xt-16gb", "rx-9070", "rx-9070-xt",
    "radeon-ai-pro-r9700", "radeon-pro-w7900", "arc-a770-16gb", "arc-b580", "arc-pro-b60"]
WEBSITE_UNIFIED = ["m1-max", "m2-max", "m2-ultra", "m3-max", "m3-ultra", "m4-pro", "m4-max", "m5-max",
                   "ryzen-ai-max-plus-395", "dgx-spark"]


def website_machines() -> list:
    return ([dict(gpu=g, host="ddr5-6000x2", host_mem_gb=128) for g in WEBSITE_GPUS]
            + [dict(gpu=u) for u in WEBSITE_UNIFIED])


def grids() -> dict:
    common = dict(filter={"skip_inapplicable": True, "allow_beyond_max_context": True}, progress=False)
    return {**_research_grids(common), "issue 19": _issue19_grid(),
        "website": dict(models=M.model_ids(), quants=["Q4_K_M", "Q8_0"], machines=website_machines(),
                        contexts=[4096, 16384, 32768, 131072], batches=[1, 4, 16], **common),
        "one machine": dict(models=M.model_ids(), quants=GGUF_LADDER, machines=[ONE_MACHINE],
                            contexts=[4096], batches=[1], **common),
        # issue 19's own question: 31 models (the catalog's size then; its first 31 ids now) x 6 quants
        "one machine, 31 models": dict(models=M.model_ids()[:31], quants=GGUF_LADDER, machines=[ONE_MACHINE],
                                       contexts=[4096], batches=[1], **common),
    }


GGUF_LADDER = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
ONE_MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)


OFFLOAD_MODEL = "qwen3-30b-a3b"


def _research_grids(common: dict) -> dict:
    """The issue-19 reference grids: expert-offload research on one GPU, and a datacenter layout study."""
    E = moesim.model(OFFLOAD_MODEL).n_experts
    return {
        # every cache size 0..E, the analytic policies (belady needs run.mode = montecarlo), 5 recalls
        "offload research": dict(models=[OFFLOAD_MODEL], quants=["Q4_K_M"], placements=["offload-cache"],
                                 machines=[dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)],
                                 cache_experts=list(range(E + 1)), policies=["lru", "lfu", "static"],
                                 prefetch_recall=[0.0, 0.25, 0.5, 0.75, 1.0],
                                 contexts=[4096], batches=[1, 2, 4, 8, 16, 32, 64, 128], **common),
        # MTP acceptance: the catalog's measured one for the model's family (speculation.toml)
        "datacenter": dict(models=["deepseek-r1"], quants=["fp8"], runtimes=["vllm"], machines=["dgx-h200"],
                           parallel=["tp8", "ep8", "tp8-ep8", "tp8-ep8-attn-dp", "pipeline"], mtp=[0, 1],
                           contexts=[8192], batches=[2 ** i for i in range(11)], **common),
    }


def _issue19_grid() -> dict:
    """Issue 19's own grid, as its report gives it (the machines' default hosts; beyond-max contexts skipped)."""
    return dict(models=["deepseek-r1", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"],
                quants=["Q4_K_M", "Q8_0", "Q2_K", "IQ4_XS"],
                machines=[moesim.machine(gpu=g) for g in ("rtx-4090", "rtx-5090", "h200", "rtx-3090")],
                contexts=list(range(1024, 1024 * 257, 1024)), batches=[1, 2, 4, 8, 16, 32, 64, 128],
                placements=["all-gpu", "experts-cpu"] + [f"n-cpu-moe={n}" for n in range(2, 60, 4)],
                mode="analytic", filter={"skip_inapplicable": True}, progress=False)


def timed(kw: dict, threads: int, processes: int = 1) -> tuple:
    """(configurations, wall seconds, CPU seconds of this process): CPU time is what a machine shared with
    other jobs inflates least (forked workers' CPU time is theirs, not counted)."""
    t0, c0 = time.perf_counter(), time.process_time()
    tab = moesim.sweep(**kw, threads=threads, processes=processes)
    return len(tab.columns["context"]), time.perf_counter() - t0, time.process_time() - c0


class CollectorLog:
    """The cyclic collector's work while it is on (gc.callbacks): collections, full ones, seconds."""

    def __init__(self):
        self.events: list = []
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        self.events.append((phase, info["generation"], time.perf_counter()))

    def take(self) -> str:
        starts = [e for e in self.events if e[0] == "start"]
        seconds = sum(b[2] - a[2] for a, b in zip(self.events[::2], self.events[1::2]))
        self.events.clear()
        return f"{len(starts)} collections ({sum(g == 2 for _, g, _ in starts)} full), {seconds:.2f} s"


def twin_rate(kw: dict, n_groups: int) -> float:
    """Configurations per second of the pure-Python twin over the first n_groups groups that run."""
    spec = {k: v for k, v in kw.items() if k != "progress"}
    plan = Plan(normalize_spec(build_spec(**spec)))
    done, seconds = 0, 0.0
    for g in range(plan.n_groups):
        grp = plan.group(g)
        if grp.skip or grp.direct:       # the twin has no whole-step (drafts, prefetch) path
            continue
        run_range(plan, g * plan.block, (g + 1) * plan.block)     # the variants lowered, as the C path has them
        t0 = time.perf_counter()
        done += len(SR.segment(grp, 0, plan.block))
        seconds += time.perf_counter() - t0
        n_groups -= 1
        if n_groups == 0:
            break
    return done / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--processes", type=int, default=1, help="forked worker processes (sweep(processes=N)); the "
                                                             "warm run is the one after N calls (this process takes "
                                                             "each share in turn, so by then it has lowered them all)")
    ap.add_argument("--twin", type=int, default=0, help="groups of each grid for the Python twin")
    ap.add_argument("--only", action="append", help="run only this grid (repeatable), e.g. --only datacenter")
    ap.add_argument("--collector", action="store_true", help="also print the cyclic collector's collections and "
                                                             "seconds in the first and warm runs")
    args = ap.parse_args()
    log = CollectorLog() if args.collector else None
    print(f"{'grid':12s} {'configs':>8s} {'first run (wall, CPU)':>34s} {'warm (wall, CPU)':>34s}")
    for name, kw in grids().items():
        if args.only and name not in args.only:
            continue
        n, first, first_cpu = timed(kw, args.threads, args.processes)
        first_gc = log.take() if log else ""
        for _ in range(args.processes - 1):        # the other shares, lowered in this process in turn
            timed(kw, args.threads, args.processes)
        if log:
            log.take()
        _, warm, warm_cpu = timed(kw, args.threads, args.processes)
        print(f"{name:12s} {n:8d} {first:8.2f} s {first_cpu:7.2f} s CPU {n / first:9.0f}/s "
              f"{warm:8.2f} s {warm_cpu:7.2f} s CPU {n / warm:9.0f}/s")
        if log:
            print(f"{'':12s} collector: first run {first_gc}; warm run {log.take()}")
        if args.twin:
            twin = twin_rate(kw, args.twin)
            print(f"{'':12s} Python twin {twin:.0f} configs/s per configuration; C warm end to end is "
                  f"{n / warm / twin:.1f}x that")


if __name__ == "__main__":
    main()
