"""The analytic table's per-configuration cost (issue 19) on the offload-research grid's model.

    python bench/bench_che.py            # kernel per configuration, solving Che vs reading the table
    python bench/bench_che.py --mc       # + analytic vs Monte Carlo expert hit rate (slots x batch x policy)
    python bench/bench_che.py --mc --mc-model olmoe-1b-7b --routing olmoe:v2 --slots 8,16,32 --policy lfu
                                         # the same on another model / routing profile (a token-memory default)
    python bench/bench_che.py --families --policy lru
                                         # analytic vs Monte Carlo on the first model of every catalog family
                                         # (its default routing; k/2, k, 2k, 4k and E/4 slots; batches 1, 4, 16;
                                         # 4,096 tokens at batch 1, 4,096 / batch beyond); a host that holds the
                                         # weights; prints the points beyond 0.02 and each family's worst

One decode_many call of n configurations (qwen3-30b-a3b Q4_K_M, offload-cache on a 4090 + 64 GB DDR5, 4k
context, batches 1..128 cycled) with and without the ``che`` / ``che_slots`` columns, and the time of a
table row (ms_che_table, one slot count and batch); CPU seconds.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import moesim
from moesim.engine import codes, decode as KD
from moesim.engine.lower.decode_model import lower_model
from moesim.engine.lower.machine import lower_machine
from moesim.analysis.sweep.plan import Plan
from moesim.analysis.sweep.spec import build_spec, normalize_spec

MODEL = "qwen3-30b-a3b"
MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
BATCHES = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=np.int32)


def kernel(slots: int, policy: str, n: int) -> None:
    plan = Plan(normalize_spec(build_spec(models=[MODEL], quants=["Q4_K_M"], placements=["offload-cache"],
                                          machines=[MACHINE], cache_experts=[slots], policies=[policy],
                                          contexts=[4096], batches=[1])))
    grp = plan.group(0)
    dm = lower_model(grp.m, grp.low, grp.cands[0], grp.machine, grp.rt, 4096, grp.kv, 8, routing=grp.routing)
    hw = lower_machine(grp.machine, grp.rt, grp.cands[0], grp.kernel_mix)
    b = np.resize(BATCHES, n)
    cols = dict(batch=b, tokens_per_step=np.ones(n, np.int32), drafts=np.zeros(n, np.int32), accepted=np.ones(n),
                steps=np.full(n, 256, np.int64), warmup=np.zeros(n, np.int64), policy=np.full(n, grp.policy, np.int32),
                mode=np.ones(n, np.int32), seed=np.zeros(n, np.uint64), index=np.zeros(n, np.uint64))
    s = int(dm["slots"][dm["expert_mode"] == codes.EXP_FETCH][0])
    t = time.process_time()
    tab = KD.che_table(grp.routing, BATCHES.astype(np.int64), 1, s, grp.policy, steps=256, warmup=0)
    row = (time.process_time() - t) / len(BATCHES)
    tcols = dict(cols, che=np.ascontiguousarray(tab[np.arange(n) % len(BATCHES)]), che_slots=np.full(n, s, np.int32))
    out = []
    for name, c in (("counting", cols), ("table", tcols)):
        KD.run(dm, hw, grp.routing, c)
        t = time.process_time()
        KD.run(dm, hw, grp.routing, c)
        dt = time.process_time() - t
        out.append(f"{name} {dt / n * 1e6:8.2f} us ({n / dt:10,.0f}/s)")
    print(f"{policy:6s} slots {s:3d}: " + "   ".join(out) + f"   table row {row * 1e3:.3f} ms")


def monte_carlo(tokens: int, model: str = MODEL, routing: str | None = None, slots=(16, 48, 96),
                policies=("lru", "lfu", "static"), seed: int = 0) -> None:
    m = moesim.machine(**MACHINE)
    worst = 0.0
    print(f"{model}, routing {routing or 'the family default'}, {tokens} tokens, seed {seed}")
    for pol in policies:
        for ce in slots:
            for b in (1, 4, 16):
                kw = dict(quant="Q4_K_M", placement="offload-cache", cache_experts=ce, policy=pol, context=4096, batch=b,
                          routing=routing, seed=seed)
                a = moesim.simulate(model, m, mode="analytic", tokens=tokens, **kw).expert_hit_rate   # LFU: the run length
                mc = moesim.simulate(model, m, mode="montecarlo", tokens=tokens, **kw).expert_hit_rate
                worst = max(worst, abs(a - mc))
                print(f"{pol:6s} slots {ce:3d} batch {b:3d}: analytic {a:.4f} montecarlo {mc:.4f} diff {a - mc:+.4f}")
    print(f"max |analytic - montecarlo| {worst:.4f}")


def families(policies=("lru",), tokens: int = 4096, seed: int = 1) -> None:
    from moesim.ingest import model as load_model
    from moesim.spec import models as M
    machine = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=1024)
    seen, worst_all = set(), 0.0
    for mid in M.model_ids():
        m = load_model(mid)
        if not getattr(m, "n_experts", 0) or m.family in seen:
            continue
        seen.add(m.family)
        E, k = m.n_experts, m.top_k
        sizes = [c for c in sorted({max(1, k // 2), k, 2 * k, 4 * k, E // 4}) if 0 < c < E]
        for pol in policies:
            worst, at = 0.0, None
            for b in (1, 4, 16):
                for c in sizes:
                    kw = dict(quant="Q4_K_M", context=4096, batch=b, cache_experts=c, policy=pol,
                              tokens=max(256, tokens // b), seed=seed)
                    a = moesim.simulate(mid, machine, mode="analytic", **kw).expert_hit_rate
                    mc = moesim.simulate(mid, machine, mode="montecarlo", **kw).expert_hit_rate
                    if abs(a - mc) > 0.02:
                        print(f"  {mid} {pol} slots {c} batch {b}: analytic {a:.4f} montecarlo {mc:.4f} diff {a - mc:+.4f}")
                    if abs(a - mc) >= abs(worst):
                        worst, at = a - mc, (c, b)
            worst_all = max(worst_all, abs(worst))
            print(f"{mid} ({m.family}, {E} experts, top-{k}) {pol}: worst {worst:+.4f} at {at[0]} slots, batch {at[1]}",
                  flush=True)
    print(f"max |analytic - montecarlo| {worst_all:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=4000)
    ap.add_argument("--mc", action="store_true", help="also compare hit rates with Monte Carlo")
    ap.add_argument("--tokens", type=int, default=1000, help="Monte Carlo tokens per configuration")
    ap.add_argument("--mc-model", default=MODEL, help="model of the Monte Carlo comparison")
    ap.add_argument("--routing", default=None, help="routing profile id (default: the model family's)")
    ap.add_argument("--slots", default="16,48,96", help="GPU expert-cache sizes, comma-separated")
    ap.add_argument("--policy", action="append", choices=["lru", "lfu", "static"], help="repeatable; default all three")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", action="store_true",
                    help="only the analytic vs Monte Carlo check on every catalog family (--policy, default lru)")
    args = ap.parse_args()
    if args.families:
        families(tuple(args.policy or ("lru",)))
        return
    for policy in ("lru", "lfu", "static"):
        for slots in (16, 64, 120):
            kernel(slots, policy, args.configs)
    if args.mc:
        monte_carlo(args.tokens, args.mc_model, args.routing, [int(x) for x in args.slots.split(",")],
                    tuple(args.policy or ("lru", "lfu", "static")), args.seed)


if __name__ == "__main__":
    main()
