"""Decode simulation: ``moesim.simulate`` and its lowering to the C kernel (csrc/ms_decode.c).

Lowering turns (model, quant, placement, machine, runtime, context) into per-layer bytes and FLOPs
with the place each layer's attention and routed experts run (``ms_decode_model_t``), the machine
into effective rates and latencies (``ms_machine_t``), and a routing profile or trace into tables
(``ms_routing_t``, see :mod:`moesim.routing`). ``engine="reference"`` runs the pure-Python twin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import __version__
from ..spec import quants as Q
from ..engine.lower import routing as R_routing
from ..spec import routing as R
from .._catalog import load as _load_catalog
from ..errors import MoesimError, unknown_id
from ..spec.hardware import Machine
from ..spec.hardware import as_machine
from ..spec.limits import (MAX_BATCH, MAX_DRAFTS, MAX_MONTECARLO_WORK, MAX_STEPS, check_context, check_count,
                           this_machines_ram)
from ..spec.models import Model
from ..ingest import model as get_model
from ..spec.placement import Placement
from ..spec.runtimes import Runtime
from ..engine.decode import LINKS, PHASES, RESOURCES, run
from ..engine.codes import MODES, POLICIES
from ..engine.lower.machine import lower_machine
from ..engine.lower.decode_model import lower_model
from ..engine.prefill import prefill
from .consistency import capacities, check_result
from . import intervals as I
from .speculation import accepted_per_step, resolve_acceptance


# ------------------------------------------------------------------------------- public API
@dataclass
class Result:
    """Decode (and prefill) of one configuration. Times per token are per sequence."""

    decode_tok_s: float
    aggregate_tok_s: float
    prefill_tok_s: float
    ttft_s: float
    tpot_ms: dict
    breakdown: dict
    bottleneck: str
    expert_hit_rate: float | None
    page_cache_hit_rate: float | None
    distinct_experts_per_step: float
    reuse: float
    bytes_per_token: dict
    memory: dict
    mode: str
    policy: str
    tokens: int
    seed: int
    routing: str
    provenance: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)   # analysis.intervals.fields: 80 % bounds and their basis

    def to_dict(self) -> dict:
        out = dict(self.memory)
        out.update({k: getattr(self, k) for k in (
            "decode_tok_s", "aggregate_tok_s", "prefill_tok_s", "ttft_s", "tpot_ms", "breakdown", "bottleneck",
            "expert_hit_rate", "page_cache_hit_rate", "distinct_experts_per_step", "reuse", "bytes_per_token",
            "mode", "policy", "tokens", "seed", "routing", "provenance")})
        out.update(self.intervals)
        return out


def _check_fraction(value, name: str, lo: float = 0.0, hi: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value) \
            or not (lo <= value <= hi):
        raise MoesimError(f"must be a number in [{lo:g}, {hi:g}], got {value!r}", name)
    return float(value)


def _checked_warmup(warmup, tokens: int) -> int:
    if warmup is None:   # one default for sampled and replayed routing (docs/cost-model.md "Routing")
        warmup = min(32, tokens // 4)
    warmup = check_count(warmup, "warmup", minimum=0)
    if warmup >= tokens:
        raise MoesimError(f"must be smaller than tokens ({tokens}), got {warmup}", "warmup")
    return warmup


def simulate(model, machine: Machine, quant="native", context: int = 4096, batch: int = 1, placement=None,
             runtime=None, kv_dtype: str | None = None, policy: str = "lru", cache_experts: int | None = None,
             prefetch_recall: float | None = None, tokens: int = 256, warmup: int | None = None, seed: int = 0,
             mode: str = "montecarlo", trace=None, routing=None, mtp: int = 0, mtp_acceptance: float | None = None,
             prompt: int = 512, parallel: str | None = None, engine: str = "c",
             allow_beyond_max_context: bool = False, redundant_experts: int = 0, mtp_dataset: str | None = None,
             ubatch: int | None = None) -> Result:
    """Simulate decoding ``tokens`` steps of ``batch`` sequences at KV depth ``context`` (see DESIGN §3).

    *parallel*: the multi-GPU layout (tp8, ep8, tp8-ep2, tp8-ep8-attn-dp, layer-split, ...); expert-parallel
    layouts charge a dispatch and a combine all-to-all per MoE layer and wait for the busiest rank;
    *redundant_experts*: EPLB replicas of the hottest experts per MoE layer over the EP ranks.
    With *mtp* drafts and no *mtp_acceptance*, the acceptance is the model family's measured one on
    *mtp_dataset* (default: the family's own, ``catalog/speculation.toml``); the result names its source.
    *ubatch*: the prompt's physical batch (llama.cpp ``-ub``; default the runtime's, 512), the tokens each
    prefill pass multiplies and reads its experts for.

    *machine*: a :func:`moesim.machine`, a catalog machine id or a dict of its keywords. A context above
    the model's trained maximum is refused unless *allow_beyond_max_context*."""
    from .resolve import configure_run, memory_record
    m = get_model(model)
    machine = as_machine(machine)
    context, notes = check_context(context, m, allow_beyond_max_context)
    batch = check_count(batch, "batch", maximum=MAX_BATCH)
    tokens = check_count(tokens, "tokens", maximum=MAX_STEPS)
    prompt = check_count(prompt, "prompt")
    seed = check_count(seed, "seed", minimum=0)
    mtp = check_count(mtp, "mtp", minimum=0, maximum=MAX_DRAFTS)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    acc = resolve_acceptance(m.family, mtp, mtp_acceptance, mtp_dataset)
    policy, mode = _policy_and_mode(policy, mode)
    if prefetch_recall is not None:
        prefetch_recall = _check_fraction(prefetch_recall, "prefetch_recall")
    warmup = _checked_warmup(warmup, tokens)

    c = configure_run(m, quant, machine, runtime, placement, context, batch, kv_dtype, mtp, parallel, cache_experts,
                      redundant_experts, ubatch)
    q, rt, kv, low, p, mem = c.quant, c.runtime, c.kv, c.low, c.placement, c.mem
    options = dict(parallel=parallel, redundant_experts=redundant_experts, mtp_acceptance=acc.rate,
                   cache_experts=cache_experts, policy=policy,
                   prefetch_recall=prefetch_recall, routing=routing if trace is None else f"trace {trace}")
    memory = memory_record(m, c, machine, quant, context, batch, mtp, notes, runtime, kv_dtype, placement, options)
    memory.update(speculation_fields(m, low, machine, rt, p, context, batch, kv, mem, mtp, acc, routing,
                                     policy, prefetch_recall) if trace is None else {})
    dims = R_routing.RoutingDims.of(m)
    rtab, routing_name, note = routing_table(m, routing, prefetch_recall, seed, trace)
    memory["assumptions"] += [note] if note else []
    if trace is None:
        memory.update(profile_facts(routing_profile(m, routing), memory["assumptions"]))
    drafts, tps = mtp, 1 + mtp
    if rtab.get("trace") is not None and tokens * tps > len(rtab["trace"]):
        memory["assumptions"].append(
            f"routing trace: {len(rtab['trace'])} recorded tokens, fewer than the {tokens * tps} each sequence "
            f"reads ({tokens} steps x {tps} tokens): the replay wraps to the trace's start")
    if mode == "montecarlo":
        _check_montecarlo_size(dims, m.n_layers, batch * tps, tokens, policy)
    dm = lower_model(m, low, p, machine, rt, context, kv, batch * tps, mem.by_class, mem.tier, routing=rtab)
    hw = lower_machine(machine, rt, p, Q.kernel_mix(m, q))
    accepted = accepted_per_step(drafts, acc.rate)
    cols = dict(batch=[batch], tokens_per_step=[tps], drafts=[drafts], accepted=[accepted], steps=[tokens],
                warmup=[warmup], policy=[POLICIES[policy]], mode=[MODES[mode]], seed=[seed], index=[0])
    res = run(dm, hw, rtab, cols, engine=engine)
    pf_tok_s, ttft = prefill(m, dm, hw, rtab, rt, prompt, batch)
    if mode == "montecarlo" and float(res["page_hit_rate"][0]) >= 0.0:
        memory["assumptions"] = memory["assumptions"] + [
            f"weights page from storage: this run's host page cache starts cold ({warmup} of {tokens} steps "
            "excluded as warm-up) and keeps the routing's token-to-token locality; fit's analytic figure is a "
            "steady state under independent picks, so the two differ (a longer --tokens converges the first)"]
    out = _result(res, 0, batch, memory, mode, policy, tokens, seed, routing_name, pf_tok_s, ttft)
    out.intervals = I.fields(out.decode_tok_s, out.prefill_tok_s, I.regime(machine, p, rt))
    prof = pooled_profile(m, routing) if trace is None else None
    if prof is not None:
        out.intervals = widened_for_workloads(out.intervals, (out.decode_tok_s, out.prefill_tok_s) if mode == "analytic"
                                              else None, prof, lambda r: _analytic_speeds(
            m, low, p, machine, rt, context, kv, batch, mem, routing_table(m, r, prefetch_recall, seed)[0], cols, hw,
            prompt, engine))
    return check_result(out, capacities(c.cfg), m.max_context, allow_beyond_max_context, m.n_experts)


def _analytic_speeds(m, low, p, machine, rt, context, kv, batch, mem, rtab, cols, hw, prompt, engine) -> tuple:
    """(decode tok/s per sequence, prefill tok/s) of the run's configuration under routing tables *rtab*, analytic."""
    tps = int(cols["tokens_per_step"][0])
    dm = lower_model(m, low, p, machine, rt, context, kv, batch * tps, mem.by_class, mem.tier, routing=rtab)
    res = run(dm, hw, rtab, dict(cols, mode=[MODES["analytic"]]), engine=engine)
    return (float(res["accepted"][0]) / float(res["step_mean"][0]),
            prefill(m, dm, hw, rtab, rt, prompt, batch)[0])


def pooled_profile(m: Model, routing=None) -> "R.RoutingProfile | None":
    """The run's routing profile where it pools workloads (issue 15: their spread widens the interval), else None
    (a profile of one workload, or a model that routes nothing)."""
    if R_routing.RoutingDims.of(m).n_layers == 0:
        return None
    prof = routing_profile(m, routing)
    return prof if prof.workloads else None


def widened_for_workloads(intervals: dict, base: "tuple | None", prof: R.RoutingProfile, run_one) -> dict:
    """*intervals* widened by the spread of *prof*'s workloads (issue 15: a pooled profile's spread carried into the
    interval of every speed that depends on routing): per metric, (min, max) of each workload's analytic
    (decode, prefill) tok/s, ``run_one(routing profile)``, over the pooled profile's: *base*, the run's own where it
    was analytic, else ``run_one(prof)``."""
    base = run_one(prof) if base is None else base
    speeds = [run_one(wid) for wid in prof.workloads]
    ratios = {}
    for k, metric in enumerate(I.METRICS):
        if base[k] is None or not base[k] > 0:
            continue
        got = [s[k] / base[k] for s in speeds if s[k] is not None and s[k] > 0]
        if got:
            ratios[metric] = (min(got), max(got))
    return I.widen_for_workloads(intervals, ratios, prof.workloads)


def routing_table(m: Model, routing=None, prefetch_recall: float | None = None, seed: int = 0, trace=None) -> tuple:
    """(routing tables for the kernel, the routing's name, an assumption line or None): a recorded *trace*
    replayed, else the *routing* profile (default: the model family's), with next-layer prefetch at
    *prefetch_recall* when it is above 0. Shared by simulate and fit's estimate."""
    from ..ingest import traces as T
    dims = R_routing.RoutingDims.of(m)
    prefetch = prefetch_recall is not None and prefetch_recall > 0
    if trace is not None:
        tr = trace if isinstance(trace, T.Trace) else T.load(trace)
        if dims.n_layers == 0:
            raise MoesimError(f"{m.id} is dense: a routing trace does not apply", "trace")
        name = f"trace {getattr(tr, 'source', '') or 'replay'}"
        return R_routing.lower_trace(dims, tr, prefetch_recall or 0.0), name, None
    prof = routing_profile(m, routing)
    if prefetch:
        prof = R.profile(prof, recall=prefetch_recall)
    note = f"routing: {prof.id}, the {m.family} family's profile (--routing, --trace)" if routing is None else None
    return R_routing.lower(dims, prof, seed, prefetch=prefetch), prof.id, note


def routing_profile(m: Model, routing=None) -> R.RoutingProfile:
    """The routing profile a run samples: *routing* (an id or a RoutingProfile), else the model family's."""
    return routing if isinstance(routing, R.RoutingProfile) else R.profile(routing, family=m.family)


def profile_facts(prof: R.RoutingProfile, assumptions: list) -> dict:
    """What a run reports about its profile beyond its numbers (issue 15): an assumption line when decode
    samples a profile fitted to prompt tokens, and the result keys ``routing_spread`` ({statistic:
    [min, max]} across the workloads the profile pools) where the catalog stores one."""
    if prof.fitted_phase == "prompt":
        assumptions.append(
            f"routing profile {prof.id} was fitted to prompt tokens; decode routing is less skewed than "
            "prompt routing, so this run's expert cache hit rates may be optimistic and its expert unions "
            "small (issue 15)")
    return {"routing_spread": {k: [lo, hi] for k, (lo, hi) in prof.spread_dict().items()}} if prof.spread else {}


def _policy_and_mode(policy, mode) -> tuple:
    """The cache policy and decode path, lower-cased and checked (Belady needs the Monte Carlo path)."""
    if not isinstance(policy, str) or policy.lower() not in POLICIES:
        raise unknown_id("cache policy", policy, POLICIES, "policy")
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise unknown_id("mode", mode, MODES, "mode")
    policy, mode = policy.lower(), mode.lower()
    if mode == "analytic" and policy == "belady":
        raise MoesimError("belady is an offline bound that needs the future: use mode='montecarlo'", "policy")
    return policy, mode


def _check_montecarlo_size(dims, n_layers: int, tokens_per_step: int, steps: int, policy: str) -> None:
    """Refuse, before anything is allocated, a Monte Carlo run whose per-step expert unions (int32 ids and
    counts per step, MoE layer and union slot, plus Belady's next uses) would not fit in this machine's RAM,
    or whose work (steps x layers x expert choices per step) passes MAX_MONTECARLO_WORK."""
    width = min(dims.n_experts, tokens_per_step * dims.top_k) if dims.n_layers else 0
    need = steps * dims.n_layers * max(width, 1) * 4 * (3 if policy == "belady" else 2)
    have = this_machines_ram()
    if have and need > have / 2:
        raise MoesimError(f"{steps:,} Monte Carlo steps at {tokens_per_step} tokens per step need "
                          f"{need / 2**30:.1f} GiB of workspace, over half of this machine's {have / 2**30:.0f} GiB: "
                          "use fewer tokens or mode='analytic'", "tokens")
    work = steps * n_layers * max(1, tokens_per_step * dims.top_k)
    if work > MAX_MONTECARLO_WORK:
        raise MoesimError(f"{steps:,} Monte Carlo steps x {n_layers} layers x {tokens_per_step} tokens per step "
                          f"x top-{dims.top_k} is {work:,} expert choices, over the {MAX_MONTECARLO_WORK:,} one "
                          "call may take (a few minutes on a core); use fewer tokens (the mean converges "
                          "long before), or mode='analytic'", "tokens")


def _analytic_step(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
                   mem, mtp: int, mtp_acceptance: float, rtab, policy: str) -> tuple:
    """(kernel result of one analytic verify step of 1 + mtp tokens per sequence, decode model, machine)."""
    tps = 1 + mtp
    dm = lower_model(m, low, p, machine, rt, context, kv, batch * tps, mem.by_class, mem.tier, routing=rtab)
    hw = lower_machine(machine, rt, p, Q.kernel_mix(m, low.quant))
    cols = dict(batch=[batch], tokens_per_step=[tps], drafts=[mtp], accepted=[accepted_per_step(mtp, mtp_acceptance)],
                steps=[1], warmup=[0], policy=[POLICIES[policy]], mode=[MODES["analytic"]], seed=[0], index=[0])
    return run(dm, hw, rtab, cols), dm, hw


def estimate(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int, kv: str,
             mem, mtp: int = 0, mtp_acceptance: float = 0.8, prompt: int = 512, routing=None,
             policy: str = "lru", prefetch_recall: float | None = None) -> tuple:
    """(decode tok/s per sequence, prefill tok/s) on the analytic path: what ``moesim fit`` reports next
    to the memory view, and what ``simulate(mode="analytic")`` of the same options reports (routing
    profile, cache policy, prefetch recall and MTP drafts as given; seed 0)."""
    rtab, _, _ = routing_table(m, routing, prefetch_recall, 0)
    res, dm, hw = _analytic_step(m, low, machine, rt, p, context, batch, kv, mem, mtp, mtp_acceptance, rtab, policy)
    pf, _ = prefill(m, dm, hw, rtab, rt, prompt, batch)
    return float(res["accepted"][0] / res["step_mean"][0]), pf


def speculation_fields(m: Model, low, machine: Machine, rt: Runtime, p: Placement, context: int, batch: int,
                       kv: str, mem, mtp: int, acc, routing=None, policy: str = "lru",
                       prefetch_recall: float | None = None) -> dict:
    """What MTP drafts buy in this configuration: the acceptance used and its source, and
    ``speculation_speedup``, decode tok/s with *mtp* drafts over tok/s without (two analytic steps: the
    verify step reads the expert union of 1 + mtp tokens per sequence), with a line when it is below 1."""
    if not mtp:
        return {}
    rtab, _, _ = routing_table(m, routing, prefetch_recall, 0)
    spec, _, _ = _analytic_step(m, low, machine, rt, p, context, batch, kv, mem, mtp, acc.rate, rtab, policy)
    plain, _, _ = _analytic_step(m, low, machine, rt, p, context, batch, kv, mem, 0, 0.0, rtab, policy)
    tokens = float(spec["accepted"][0])
    step_ratio = float(spec["step_mean"][0] / plain["step_mean"][0])
    speedup = tokens / step_ratio
    note = (f"MTP pays here: {speedup:.2f}x the decode tok/s without drafts ({tokens:.2f} tokens per verify step, "
            f"the step {step_ratio:.2f}x as long)")
    if speedup < 1.0:
        bound = RESOURCES[int(np.argmax(spec["by_resource"][0]))]
        note = (f"MTP does not pay here: verifying {1 + mtp} tokens per sequence makes the step {step_ratio:.2f}x "
                f"as long (bound by {bound}; {float(spec['distinct'][0]):.1f} distinct experts per MoE layer vs "
                f"{float(plain['distinct'][0]):.1f} without drafts) for {tokens:.2f} tokens per step: "
                f"{speedup:.2f}x the decode tok/s of no speculation at batch {batch}, placement {p}")
    return {"mtp_acceptance": acc.rate, "mtp_acceptance_source": acc.source, "mtp_dataset": acc.dataset,
            "speculation_speedup": speedup, "speculation_note": note}


def breakdown_of(res: dict, i: int = 0) -> dict:
    """Seconds per token of kernel result *res*'s configuration *i* by phase and by resource (each sums
    to ``seconds_per_token``, the step over the tokens it accepts): ``Result.breakdown``."""
    acc = float(res["accepted"][i])
    return {"by_phase": {name: float(res["by_phase"][i][k]) / acc for k, name in enumerate(PHASES)},
            "by_resource": {name: float(res["by_resource"][i][k]) / acc for k, name in enumerate(RESOURCES)},
            "seconds_per_token": float(res["step_mean"][i]) / acc}


def _result(res: dict, i: int, batch: int, memory: dict, mode: str, policy: str, tokens: int, seed: int,
            routing_name: str, pf_tok_s: float, ttft: float) -> Result:
    acc = float(res["accepted"][i])
    step = float(res["step_mean"][i])
    breakdown = breakdown_of(res, i)
    by_res = breakdown["by_resource"]
    per_token = batch * acc
    hit = float(res["hit_rate"][i])
    page = float(res["page_hit_rate"][i])
    return Result(
        decode_tok_s=acc / step, aggregate_tok_s=batch * acc / step, prefill_tok_s=pf_tok_s, ttft_s=ttft,
        tpot_ms={"mean": 1e3 * step / acc, "p50": 1e3 * float(res["step_p50"][i]) / acc,
                 "p99": 1e3 * float(res["step_p99"][i]) / acc},
        breakdown=breakdown,
        bottleneck=max(by_res, key=by_res.get),
        expert_hit_rate=None if hit < 0 else hit, page_cache_hit_rate=None if page < 0 else page,
        distinct_experts_per_step=float(res["distinct"][i]), reuse=float(res["reuse"][i]),
        bytes_per_token={name: float(res["bytes"][i][k]) / per_token for k, name in enumerate(LINKS)},
        memory=memory, mode=mode, policy=policy, tokens=tokens, seed=seed, routing=routing_name,
        provenance={"moesim": __version__, "catalog": _load_catalog("models").get("catalog_version", ""),
                    "seed": seed})
