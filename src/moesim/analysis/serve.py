"""Serving under load: ``moesim.serve_sim`` (``moesim serve-sim``), a continuous-batching scheduler
(csrc/ms_serve.c) over the step-cost table of :mod:`.serve_table`, with a KV pool from the memory kernel.

Requests of ``isl`` prompt and ``osl`` output tokens arrive as a Poisson stream (``rate``) or from a
closed loop of ``concurrency`` clients. The KV pool is what fit leaves after the weights: the memory
tier that holds the cache (its capacity after the runtime's reserve, less weights, buffers and fixed
overheads), in blocks of the runtime's block size at the cache bytes per token of a full request. A
recurrent state (linear-attention layers) takes its own blocks per running request. With a shared
prefix of ``prefix_tokens`` the prefix's whole blocks are computed once and then skipped by every later
request; hybrid models keep a recurrent-state snapshot at each cached block boundary (vLLM "Mamba/KDA
prefix caching retains a full recurrent-state snapshot once per block_size-token boundary", PR #45845;
SGLang's MambaRadixCache likewise keeps states on radix-tree nodes, python/sglang/srt/mem_cache/
mamba_radix_cache.py), counted against the pool.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from .. import __version__
from .._catalog import load as _load_catalog
from ..engine.codes import CLASS_KV, CLASS_STATE, TIER_GPU, TIER_HOST
from ..engine.serve import run as run_scheduler
from ..errors import MoesimError
from ..ingest import model as get_model
from ..spec.hardware import as_machine
from ..spec.limits import MAX_BATCH, check_context, check_count
from .consistency import capacities
from .serve_table import step_table
from .simulate import _check_fraction, routing_table

MAX_REQUESTS = 1 << 20


@dataclass
class ServeResult:
    """One serving run: latency percentiles, throughput, goodput, the KV pool and the scheduler's counters."""

    ttft_ms: dict
    tpot_ms: dict
    e2e_s: dict
    per_user_tok_s: float
    aggregate_tok_s: float
    per_gpu_tok_s: float
    goodput: dict
    workload: dict
    scheduler: dict
    kv: dict
    assumptions: list
    provenance: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}     # every field, in declaration order


def scheduler_limits(machine, rt, max_num_batched_tokens=None, max_num_seqs=None) -> tuple:
    """(max_num_batched_tokens, max_num_seqs, note): vLLM's API-server defaults for the GPU (RT §2.3),
    one scheduler per attention data-parallel rank, unless given."""
    s = _load_catalog("runtimes")["serving"]
    large = machine.gpu_mem_bytes >= s["large_gpu_gib"] * 2**30 and not (machine.gpu or "").startswith("a100")
    dp = max(1, rt.decode.data_parallel)
    tokens = s["max_num_batched_tokens_large" if large else "max_num_batched_tokens"] * dp
    seqs = s["max_num_seqs_large" if large else "max_num_seqs"] * dp
    note = None
    if max_num_batched_tokens is None or max_num_seqs is None:
        note = (f"scheduler: vLLM API-server defaults for {'a >= 70 GiB' if large else 'this'} GPU "
                f"(max_num_batched_tokens {tokens // dp}, max_num_seqs {seqs // dp} per scheduler"
                + (f", x {dp} attention-DP ranks" if dp > 1 else "") + "; --max-num-batched-tokens, --max-num-seqs)")
    if max_num_batched_tokens is not None:
        tokens = check_count(max_num_batched_tokens, "max_num_batched_tokens", maximum=1 << 24)
    if max_num_seqs is not None:
        seqs = check_count(max_num_seqs, "max_num_seqs", maximum=MAX_BATCH)
    return tokens, seqs, note


def hybrid_block_size(c) -> int:
    """vLLM's block size for a model with recurrent-state layers (0 for any other): one page must hold a
    layer's whole state, so the attention block grows to B = 16 x ceil(state page / (16 x one token's
    attention page)) tokens (vllm/platforms/interface.py; "Setting attention block size to 528 tokens to
    ensure that attention page size is >= mamba page size" for Qwen3.5-4B, vLLM issue #40696). Other
    runtimes keep their own page size here."""
    low, rt = c.low, c.runtime
    state = float(np.max(low.kv_state)) if len(low.kv_state) else 0.0
    if state <= 0 or rt.id != "vllm":
        return 0
    kvb = float(c.cfg["kv_bytes_per_elem"])
    token = float(np.max(np.asarray(low.kv_elems) * kvb + np.asarray(low.kv_fixed)))
    base = max(1, int(rt.kv_granularity))
    return base * math.ceil(state / (base * token)) if token > 0 else base


def kv_pool(m, c, isl: int, osl: int, prefix_tokens: int) -> dict:
    """The KV block pool of configuration *c* (``resolve.Configured`` at context isl + osl, batch 1)."""
    mem = c.mem
    caps = capacities(c.cfg)
    tier = TIER_GPU if caps["n_gpus"] > 0 and mem.by_class[CLASS_KV, TIER_GPU] > 0 else TIER_HOST
    cache = float(mem.by_class[CLASS_KV, tier] + mem.by_class[CLASS_STATE, tier])
    if tier == TIER_GPU:
        # memory is per GPU: the room on the busiest GPU, times the ways the cache splits over the GPUs
        kv_ways = float(c.cfg["gpu_ways"][CLASS_KV])
        free = (caps["gpu_one"] - float(mem.gpu_per_gpu)) * kv_ways + cache
    else:
        free = caps["host"] - float(mem.tier[tier]) + cache
    block = hybrid_block_size(c) or max(1, int(c.runtime.kv_granularity))
    per_token = float(mem.kv) / (isl + osl)
    block_bytes = max(block * per_token, 1.0)
    state = float(mem.state)
    n_blocks = max(0, int(free // block_bytes))
    prefix_blocks = min(prefix_tokens // block, (isl - 1) // block) if prefix_tokens else 0
    # recurrent-state snapshots the cached prefix keeps: vLLM one per block boundary (PR #45845); SGLang's
    # MambaRadixCache one per radix-tree node holding a state, here the node where the shared prefix ends
    snapshots = prefix_blocks if c.runtime.id == "vllm" else min(1, prefix_blocks)
    return dict(tier="gpu" if tier == TIER_GPU else "host", free_bytes=free, block_size=block,
                bytes_per_token=per_token, bytes_per_block=block_bytes, n_blocks=n_blocks,
                tokens=n_blocks * block, state_bytes_per_seq=state, state_blocks=math.ceil(state / block_bytes),
                prefix_blocks=prefix_blocks, snapshots=snapshots, snapshot_bytes=snapshots * state,
                snapshot_blocks=math.ceil(snapshots * state / block_bytes))


def _check_workload(rate, concurrency, isl, osl, requests, prefix_tokens) -> tuple:
    if (rate is None) == (concurrency is None):
        raise MoesimError("give either a request rate or a concurrency (closed loop), not both", "rate")
    if rate is not None:
        rate = _check_fraction(rate, "rate", lo=1e-9, hi=1e9)
    if concurrency is not None:
        concurrency = check_count(concurrency, "concurrency", maximum=MAX_BATCH)
    isl, osl = check_count(isl, "isl"), check_count(osl, "osl")
    prefix_tokens = check_count(prefix_tokens, "prefix_tokens", minimum=0)
    if prefix_tokens > isl:
        raise MoesimError(f"a shared prefix is part of the prompt: at most isl ({isl}), got {prefix_tokens}",
                          "prefix_tokens")
    s = _load_catalog("runtimes")["serving"]
    if requests is None:
        requests = max(16, s["closed_loop_rounds"] * concurrency) if concurrency else s["poisson_requests"]
    requests = check_count(requests, "requests", maximum=MAX_REQUESTS)
    return rate, concurrency, isl, osl, requests, prefix_tokens


def serve_sim(model, machine, quant="native", isl: int = 1024, osl: int = 256, rate: float | None = None,
              concurrency: int | None = None, runtime=None, kv_dtype: str | None = None, placement=None,
              parallel: str | None = None, max_num_batched_tokens: int | None = None,
              max_num_seqs: int | None = None, requests: int | None = None, seed: int = 0,
              slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None, prefix_tokens: int = 0,
              routing=None, engine: str = "c") -> ServeResult:
    """Serve *requests* requests of *isl* prompt and *osl* output tokens, arriving at *rate* per second
    (Poisson, seeded) or from *concurrency* clients (closed loop), on a continuous-batching scheduler."""
    from .resolve import configure_run
    m = get_model(model)
    machine = as_machine(machine)
    rate, concurrency, isl, osl, requests, prefix_tokens = _check_workload(rate, concurrency, isl, osl, requests,
                                                                           prefix_tokens)
    seed = check_count(seed, "seed", minimum=0, maximum=2**63 - 1)
    for name, slo in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms)):
        if slo is not None:
            _check_fraction(slo, name, lo=0.0, hi=1e12)
    if m.max_context and isl + osl > m.max_context:
        raise MoesimError(f"isl + osl = {isl + osl:,} tokens is above {m.id}'s maximum context of "
                          f"{m.max_context:,}", "isl")
    context, notes = check_context(isl + osl, m, False)
    c = configure_run(m, quant, machine, runtime, placement, context, 1, kv_dtype, 0, parallel)
    if not c.mem.fits_bits:
        raise MoesimError(f"{m.id} ({c.quant.id if hasattr(c.quant, 'id') else quant}) does not fit this machine "
                          f"with one {context}-token request (moesim fit shows why)", "machine")
    budget, seqs, note = scheduler_limits(machine, c.runtime, max_num_batched_tokens, max_num_seqs)
    pool = kv_pool(m, c, isl, osl, prefix_tokens)
    one = math.ceil((isl + osl) / pool["block_size"]) + pool["state_blocks"] + pool["snapshot_blocks"]
    if one > pool["n_blocks"]:
        raise MoesimError(f"the KV pool ({pool['n_blocks']} blocks of {pool['block_size']} tokens after the "
                          f"weights) cannot hold one {isl}+{osl}-token request ({one} blocks)", "isl")
    # the most requests that can run at once: each holds at least its first chunk's blocks and its state
    smallest = math.ceil(min(isl - pool["prefix_blocks"] * pool["block_size"], budget) / pool["block_size"])
    most = min(seqs, concurrency or seqs, requests, pool["n_blocks"] // max(1, smallest + pool["state_blocks"]))
    rtab, routing_name, _ = routing_table(m, routing, None, 0)
    s = _load_catalog("runtimes")["serving"]
    table = step_table(m, c, machine, isl, osl, budget, max(1, most), rtab, pool["prefix_blocks"] * pool["block_size"],
                       s["context_points"])
    cfg = dict(closed_loop=concurrency is not None, concurrency=concurrency or 0, rate=rate or 0.0,
               n_requests=requests, isl=isl, osl=osl, max_num_batched_tokens=budget, max_num_seqs=seqs,
               block_size=pool["block_size"], n_blocks=pool["n_blocks"], state_blocks=pool["state_blocks"],
               prefix_blocks=pool["prefix_blocks"], snapshot_blocks=pool["snapshot_blocks"],
               max_steps=requests * (isl + osl) * 4 + 16)
    out = run_scheduler(table, cfg, seed, 0, engine=engine)
    assumptions = list(notes) + ([note] if note else []) + [
        f"routing: {routing_name}; step costs from the analytic kernel, interpolated (docs/cost-model.md)"]
    workload = dict(model=m.id, quant=getattr(c.quant, "id", str(quant)), runtime=c.runtime.id, kv_dtype=c.kv,
                    placement=str(c.placement), parallel=parallel, isl=isl, osl=osl, rate=rate,
                    concurrency=concurrency, requests=requests, seed=seed, prefix_tokens=prefix_tokens,
                    n_gpus=max(1, machine.n_gpus), machine=machine.id)
    return _result(out, workload, cfg, pool, slo_ttft_ms, slo_tpot_ms, assumptions)


def _pct(x: np.ndarray, scale: float) -> dict:
    if x.size == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(x.mean()) * scale, "p50": float(np.percentile(x, 50)) * scale,
            "p99": float(np.percentile(x, 99)) * scale}


def _result(out: dict, workload: dict, cfg: dict, pool: dict, slo_ttft_ms, slo_tpot_ms, assumptions) -> ServeResult:
    arrival, first = np.asarray(out["arrival_s"], float), np.asarray(out["first_token_s"], float)
    finish, osl = np.asarray(out["finish_s"], float), workload["osl"]
    ttft, e2e = first - arrival, finish - arrival
    tpot = (finish - first) / (osl - 1) if osl > 1 else np.zeros(0)
    makespan = float(finish.max() - arrival.min())
    aggregate = arrival.size * osl / makespan if makespan > 0 else float("inf")
    ok = np.ones(arrival.size, bool)
    if slo_ttft_ms is not None:
        ok &= ttft * 1e3 <= _check_fraction(slo_ttft_ms, "slo_ttft_ms", lo=0.0, hi=1e12)
    if slo_tpot_ms is not None and osl > 1:
        ok &= tpot * 1e3 <= _check_fraction(slo_tpot_ms, "slo_tpot_ms", lo=0.0, hi=1e12)
    goodput = dict(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, fraction=float(ok.mean()),
                   req_s=float(ok.sum()) / makespan if makespan > 0 else 0.0,
                   tok_s=float(ok.sum()) * osl / makespan if makespan > 0 else 0.0)
    per_user = float(np.mean(1.0 / tpot)) if tpot.size and np.all(tpot > 0) else None
    scheduler = dict(max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
                     steps=int(out["steps"]), preemptions=int(out["preempted"]), max_running=int(out["max_running"]),
                     mean_in_system=float(e2e.sum() / makespan) if makespan > 0 else 0.0,
                     makespan_s=makespan)
    kv = dict(pool, peak_blocks=int(out["peak_blocks"]), peak_fraction=out["peak_blocks"] / max(1, pool["n_blocks"]))
    return ServeResult(ttft_ms=_pct(ttft, 1e3), tpot_ms=_pct(tpot, 1e3), e2e_s=_pct(e2e, 1.0),
                       per_user_tok_s=per_user, aggregate_tok_s=aggregate,
                       per_gpu_tok_s=aggregate / workload["n_gpus"], goodput=goodput, workload=workload,
                       scheduler=scheduler, kv=kv, assumptions=assumptions,
                       provenance={"moesim": __version__,
                                   "catalog": _load_catalog("models").get("catalog_version", "")})


def sweep_concurrency(model, machine, levels, **kw) -> dict:
    """Serve at each concurrency in *levels* (closed loop): the curve of throughput per GPU against
    tok/s per user, with its Pareto points (no other point is better on both)."""
    if not levels:
        raise MoesimError("give at least one concurrency", "sweep_concurrency")
    points = []
    for level in levels:
        r = serve_sim(model, machine, concurrency=level, **kw)
        points.append(dict(concurrency=int(level), per_gpu_tok_s=r.per_gpu_tok_s, per_user_tok_s=r.per_user_tok_s,
                           aggregate_tok_s=r.aggregate_tok_s, ttft_ms_p50=r.ttft_ms["p50"],
                           tpot_ms_p50=r.tpot_ms["p50"], preemptions=r.scheduler["preemptions"]))
    for p in points:
        u = p["per_user_tok_s"] or 0.0
        p["pareto"] = not any(q is not p and q["per_gpu_tok_s"] >= p["per_gpu_tok_s"] and (q["per_user_tok_s"] or 0.0) >= u
                              and (q["per_gpu_tok_s"] > p["per_gpu_tok_s"] or (q["per_user_tok_s"] or 0.0) > u)
                              for q in points)
    return {"points": points, "workload": {k: v for k, v in kw.items() if not callable(v)}}
