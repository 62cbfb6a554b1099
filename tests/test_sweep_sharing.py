"""Per-group work a sweep plan shares across groups (issue 19): the lowered decode model of groups that differ
only in what lower_model does not read (the machine beyond its GPU count, the policy), and the prefill time
of groups that share the lowered model, machine rates, routing and runtime (the policy). Shared, the rows
still equal ``simulate(mode="analytic")``'s, which lowers and prefills each configuration itself; a
two-GPU machine gets its own lowered model."""
from __future__ import annotations

import moesim
from moesim.analysis.sweep import kept as K, variants as V

import test_sweep_axes as TSA

M5090 = {"gpu": "rtx-5090", "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "5090-64g"}
M4090X2 = {"gpu": "rtx-4090", "gpus": 2, "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "4090x2-64g"}
H200 = {"gpu": "h200", "name": "h200"}
H800 = {"gpu": "h800", "name": "h800"}
H200X2 = {"gpu": "h200", "gpus": 2, "name": "h200x2"}


def _counting(monkeypatch) -> dict:
    """Counts of the variants path's lower_model calls (the machine's GPU count each), prefill calls and
    prefill_terms calls (what prefill reads besides the machine rates)."""
    calls = {"lower_model": [], "prefill": 0, "prefill_terms": 0}
    # lowered models and prefill terms are kept for the process (sweep.kept): counted from none, per this test
    monkeypatch.setattr(K, "_KEPT", {})
    lower, prefill, terms = V.lower_model, V.kernel_seconds_many, V.prefill_terms

    def counting_lower(m, low, p, machine, *a, **k):
        calls["lower_model"].append(machine.n_gpus)
        return lower(m, low, p, machine, *a, **k)

    def counting_prefill(items):            # a group's prefill times in one call: one count per time
        calls["prefill"] += len(items)
        return prefill(items)

    def counting_terms(*a, **k):
        calls["prefill_terms"] += 1
        return terms(*a, **k)

    monkeypatch.setattr(V, "lower_model", counting_lower)
    monkeypatch.setattr(V, "kernel_seconds_many", counting_prefill)
    monkeypatch.setattr(V, "prefill_terms", counting_terms)
    for mach in (M5090, M4090X2, H200, H800, H200X2):
        monkeypatch.setitem(TSA.MACHINES, mach["name"], mach)
    return calls


def test_one_lowered_model_per_gpu_count(monkeypatch):
    """vLLM on one H200, one H800 and two H200s (tensor parallel: the lowered model depends on the GPU
    count): two lowered models for six groups, and every row equals simulate's."""
    calls = _counting(monkeypatch)
    tab = moesim.sweep(models=["qwen3-30b-a3b"], quants=["fp8"], runtimes=["vllm"], machines=[H200, H800, H200X2],
                       policies=["lru", "static"], contexts=[4096], batches=[1, 64], filter=TSA.SKIP, progress=False)
    assert sorted(calls["lower_model"]) == [1, 2]
    assert TSA._check_against_simulate(tab, ("policy",), runtime="vllm") == 12


def test_shared_lowering_and_prefill_equal_simulate(monkeypatch):
    """llama.cpp with experts in host memory on a 4090, a 5090 and two 4090s, two policies: lowered models
    shared by the single-GPU machines, prefill by the policies, and every row equals simulate's."""
    calls = _counting(monkeypatch)
    n = 0
    for placement in ("experts-cpu", "n-cpu-moe=8"):
        calls["lower_model"].clear()
        calls["prefill"] = calls["prefill_terms"] = 0
        tab = moesim.sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[TSA.M64, M5090, M4090X2],
                           placements=[placement], policies=["lru", "static"], contexts=[4096], batches=[1, 64],
                           filter=TSA.SKIP, progress=False)
        # 3 machines x 2 policies = 6 groups, each with 2 lowering keys (op offload below / at 64 tokens): the
        # single-GPU machines share 2 lowered models, the two-GPU one has its own 2; prefill once per machine
        assert sorted(calls["lower_model"]) == [1, 1, 2, 2]
        assert calls["prefill"] == 6
        # prefill's terms other than the machine rates: once per lowered model (the 4090 and 5090 share them;
        # rows equal to simulate's below hold that they read no machine rate)
        assert calls["prefill_terms"] == 4
        n += TSA._check_against_simulate(tab, ("policy",), placement=placement)
    assert n == 24


def test_evicted_groups_are_freed_without_a_collection(monkeypatch):
    """The plan's cache keeps its recent groups; the others go by reference counting (their decode variants
    point back weakly, and a chunk holds each group's ChunkFacts, not the group), so the full collections of
    a wide grid of narrow groups do not walk every group it evaluated. Counted when the chunk's check runs
    (every group evaluated) and after the sweep; fails if either reference holds a group again, or if the
    plan's cache of groups outlives the sweep (a cycle through the plan)."""
    import gc
    import weakref
    from moesim.analysis.sweep import run as SR
    from moesim.analysis.sweep.group import Group
    refs, init, check, alive, plans = [], Group.__init__, SR.check_chunk, [], set()

    def tracked(self, plan, g):
        refs.append(weakref.ref(self))
        plans.add(weakref.ref(plan))
        init(self, plan, g)

    def counting_check(*a, **k):
        alive.append(sum(r() is not None for r in refs))
        return check(*a, **k)
    monkeypatch.setattr(Group, "__init__", tracked)
    monkeypatch.setattr(SR, "check_chunk", counting_check)
    gc.collect()
    gc.disable()
    try:
        moesim.sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M", "Q8_0"], machines=[TSA.M64, M5090],
                     placements=["experts-cpu", "n-cpu-moe=8", "all-gpu"], policies=["lru", "static"],
                     contexts=[4096], batches=[1, 4], filter=TSA.SKIP, progress=False)
        alive.append(sum(r() is not None for r in refs))
    finally:
        gc.enable()
    # at the chunk's check the plan's cache holds the recent groups; after the sweep nothing holds them or the
    # plan (sweep drops the plan's groups, which point back to it)
    assert len(refs) == 24 and alive[0] <= 8 and alive[-1] == 0, (len(refs), alive)
    assert len(plans) == 1 and all(r() is None for r in plans)



def test_decode_columns_kept_per_run_settings(monkeypatch):
    """The sealed decode columns are kept for the process (variants._kept_cols) keyed by what they hold: the
    same grid swept again under another seed must get columns holding that seed, not the first sweep's
    (the analytic path fixes steps and warmup at run's defaults, which the columns hold too). Fails if the
    key drops the seed."""
    from moesim.analysis.sweep.spec import RUN_DEFAULTS
    seen = []
    run = V.run_prepared

    def recording(rt, jobs, *a, **k):
        seen.extend((int(cols.table["steps"][0]), int(cols.table["warmup"][0]), int(cols.table["seed"][0]))
                    for _, _, cols in jobs)
        return run(rt, jobs, *a, **k)
    monkeypatch.setattr(V, "run_prepared", recording)
    # a dense model (no analytic tables, so no routing digest in the key) and a MoE one (whose digest changes
    # with the seed's routing)
    grid = dict(models=["gemma-2-2b", "qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[TSA.M64], contexts=[4096],
                batches=[1, 4], filter=TSA.SKIP, progress=False)
    tokens = RUN_DEFAULTS["tokens"]
    for seed in (1, 2, 1):
        seen.clear()
        moesim.sweep(**grid, seed=seed)
        assert seen and set(seen) == {(tokens, min(32, tokens // 4), seed)}, seen


def test_lowered_tables_kept_for_later_sweeps(monkeypatch):
    """A later sweep of the same grid lowers no decode model and builds no prefill terms (sweep.kept), and its
    rows are the first sweep's; another seed's routing gets its own prefill terms (they read the routing) but
    the same lowered models (which read it only under expert parallelism). Fails if a kept key drops the
    routing, or if the process store misses what a sweep lowered."""
    calls = _counting(monkeypatch)
    grid = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[TSA.M64, M5090], placements=["experts-cpu"],
                contexts=[4096], batches=[1, 64], filter=TSA.SKIP, progress=False)
    first = moesim.sweep(**grid, seed=1)
    assert calls["lower_model"] and calls["prefill_terms"]
    for seed, terms in ((1, 0), (2, 2), (1, 0)):
        calls["lower_model"].clear()
        calls["prefill_terms"] = 0
        tab = moesim.sweep(**grid, seed=seed)
        assert calls["lower_model"] == [] and calls["prefill_terms"] == terms, (seed, calls)
        if seed == 1:
            assert first.to_pandas().equals(tab.to_pandas())
