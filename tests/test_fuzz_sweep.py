"""Fuzzing sweep specs with counts (conftest.fuzz_count): a small valid spec with keys, values and types
set to hostile ones (negative, huge, NaN, unknown ids, wrong types, ranges of 2^40 points, contradictory
zips), and its TOML text mutated. Each gives a plan (run when small: a table whose rows match the plan)
or a MoesimError naming the field; never a bare built-in exception, a MemoryError from an untrusted
size, or a hang (ranges are counted before they are allocated)."""
from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest

import moesim
from conftest import bounded, fuzz_count, fuzz_file, mutate_bytes
from moesim import MoesimError
from moesim.analysis.sweep.plan import Plan
from moesim.analysis.sweep.spec import build_spec, load_spec, normalize_spec

pytestmark = pytest.mark.fuzz
SEED = {
    "axes": {"models": ["qwen3-30b-a3b", "llama-3-8b"], "quants": ["Q4_K_M"],
             "machines": ["desktop-4090", {"gpu": "rtx-4090", "host": "ddr5-6000x2", "name": "composed"}],
             "placements": ["auto"], "contexts": {"start": 512, "stop": 8192, "num": 3, "log": True},
             "batches": [1, 4]},
    "zip": [],
    "filter": {"fits": True},
    "run": {"mode": "analytic", "seed": 0, "chunk_size": 8},
}
SEED_TOML = b"""[axes]
models = ["qwen3-30b-a3b", "llama-3-8b"]
quants = ["Q4_K_M"]
machines = ["desktop-4090", {gpu = "rtx-4090", host = "ddr5-6000x2", name = "composed"}]
contexts = {start = 512, stop = 8192, num = 3, log = true}
batches = [1, 4]

[filter]
fits = true
decode_tok_s = {min = 1}

[run]
mode = "analytic"
chunk_size = 8
"""
HUGE_RANGES = [{"start": 1, "stop": 2**40, "step": 1}, {"start": 1, "stop": 2**40, "num": 10**9},
               {"start": 1, "stop": 2**40, "num": 10**9, "log": True}, {"start": 1, "stop": 2**28, "num": 2**21},
               {"start": 5, "stop": 1}, {"start": 1, "stop": 9, "num": 3, "step": 2}, {"start": 1},
               {"start": 1, "stop": 64, "step": 1}, {"start": 1, "stop": 64, "num": 4, "zz": 1}]
HOSTILE = [-1, 0, 1, 3, 2**31, 2**63, 1e300, float("nan"), float("inf"), -0.0, 2.5, "x", "", " ", "auto", "belady",
           "montecarlo", "ANALYTIC", "nope", "Q4_K_Q", "fp8", "all-gpu", "n-cpu-moe=999", "rtx-9090", True, False,
           [], {}, [[]], ["models"], [["models", "quants"]], [["contexts", "batches"]], [["contexts", "models"]],
           {"gpu": "h100"}, {"gpu": "x"}, {"name": ""}, {"bogus": 1}, {"min": 1}, {"max": float("nan")},
           {"min": "1"}, *HUGE_RANGES]
SECTIONS = {"axes": ["models", "quants", "machines", "runtimes", "kv_dtypes", "placements", "policies", "contexts",
                     "batches", "bogus"],
            "zip": None,
            "filter": ["fits", "skip_inapplicable", "allow_beyond_max_context", "decode_tok_s", "max_context",
                       "bogus"],
            "run": ["mode", "seed", "chunk_size", "prompt", "tokens", "warmup", "bogus"]}
MAX_RUN = 64      # plans at most this large are run (in memory)


def _hostile(rng: random.Random):
    return copy.deepcopy(rng.choice(HOSTILE))      # a fresh object: a later edit must not change HOSTILE


def _mutate_spec(rng: random.Random) -> dict:
    spec = copy.deepcopy(SEED)
    for _ in range(rng.randint(1, 3)):
        sec = rng.choice(sorted(SECTIONS) + ["bogus"])
        if sec == "bogus" or rng.random() < 0.05:
            spec[sec] = _hostile(rng)
            continue
        if sec == "zip":
            spec["zip"] = _hostile(rng)
            continue
        if not isinstance(spec.get(sec), dict):
            spec[sec] = {}
        key = rng.choice(SECTIONS[sec])
        op = rng.random()
        if op < 0.1:
            spec[sec].pop(key, None)
        elif op < 0.3 and isinstance(spec[sec].get(key), list) and spec[sec][key]:
            lst = spec[sec][key]
            lst[rng.randrange(len(lst))] = _hostile(rng)
        elif op < 0.4:
            spec[sec][key] = [_hostile(rng) for _ in range(rng.randint(0, 3))]
        else:
            spec[sec][key] = _hostile(rng)
    return spec


def _check_table(plan: Plan, table) -> None:
    n = len(table)
    assert n <= plan.total
    for name in table.column_names:
        col = np.asarray(table[name])
        assert len(col) == n, name
        if col.dtype.kind == "f":
            finite = col[~np.isnan(col)]            # NaN marks "not applicable" (a config that does not fit)
            assert np.all(np.isfinite(finite)) and np.all(finite >= 0), name


def _plan_or_refusal(spec, tally) -> "Plan | None":
    try:
        plan = Plan(normalize_spec(build_spec(spec)))
    except MoesimError as exc:
        assert exc.field, exc
        tally.refuse()
        return None
    assert plan.total >= 1 and plan.n_chunks >= 1
    return plan


def test_mutated_sweep_specs_plan_run_or_are_refused(tally):
    rng = random.Random("sweep specs")
    count = fuzz_count(800, 40_000)
    ran = 0
    for i in range(count):
        spec = _mutate_spec(rng)
        with bounded(30, spec):
            plan = _plan_or_refusal(spec, tally)
            if plan is None:
                continue
            if plan.total <= MAX_RUN and (ran < 40 or rng.random() < 0.05):
                try:
                    table = moesim.sweep(spec, threads=1)
                except MoesimError as exc:      # a combination refused only when evaluated
                    assert exc.field, exc
                    tally.refuse()
                    continue
                _check_table(plan, table)
                ran += 1
        tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count


def test_mutated_sweep_toml_loads_plans_or_is_refused(tmp_path, tally):
    rng = random.Random("sweep toml")
    fuzz_file(tally, tmp_path / "spec.toml", lambda: mutate_bytes(SEED_TOML, rng), fuzz_count(1500, 150_000), 30,
              load_spec, "spec", lambda spec: _plan_or_refusal(spec, tally) is not None)


@pytest.mark.parametrize("rng_spec, field", [({"start": 1, "stop": 2**40, "step": 1}, "axes.contexts.step"),
                                             ({"start": 1, "stop": 2**40, "num": 10**9}, "axes.contexts.num"),
                                             ({"start": 1, "stop": 2**28, "num": 2**21}, "axes.contexts.num")])
def test_huge_ranges_are_refused_before_allocation(rng_spec, field):
    """Regression: a 2^40-point step range or a 10^9-point num range raised MemoryError (numpy allocating
    8 TiB / 7.5 GiB) instead of a MoesimError."""
    spec = copy.deepcopy(SEED)
    spec["axes"]["contexts"] = rng_spec
    with pytest.raises(MoesimError) as ei:
        Plan(normalize_spec(spec))
    assert ei.value.field == field, ei.value


@pytest.mark.parametrize("kw", [{"threads": 2**31}, {"threads": 2**31 - 1}, {"local_workers": 2**31}])
def test_huge_thread_and_worker_counts_are_refused(kw):
    """Regression: threads=2^31 overflowed the kernel's C int (OverflowError), 2^31-1 made it allocate
    per-thread workspaces (MemoryError); local_workers=2^31 would start that many dask processes."""
    with pytest.raises(MoesimError, match="must be <= 4,096") as ei:
        moesim.sweep(copy.deepcopy(SEED), **kw)
    assert ei.value.field in kw


def test_spec_that_is_not_utf8_is_refused(tmp_path):
    """Regression: a byte that is not UTF-8 escaped load_spec as a UnicodeDecodeError."""
    p = tmp_path / "spec.toml"
    p.write_bytes(SEED_TOML.replace(b"llama-3-8b", b"llama-\xfe-8b"))
    with pytest.raises(MoesimError, match="not UTF-8") as ei:
        load_spec(p)
    assert ei.value.field == "spec" and str(p) in str(ei.value)


@pytest.mark.parametrize("value", [{1, 2}, object(), "self"])
def test_spec_values_that_are_not_toml_are_refused(value):
    """Regression: a set or another object in a spec dict escaped build_spec as a TypeError, a table that
    holds itself as a ValueError (circular reference)."""
    spec = copy.deepcopy(SEED)
    spec["axes"]["models"] = spec if value == "self" else value
    with pytest.raises(MoesimError, match="expected tables of TOML values") as ei:
        moesim.sweep(spec)
    assert ei.value.field == "spec"


def test_seed_spec_runs():
    plan = Plan(normalize_spec(build_spec(copy.deepcopy(SEED))))
    table = moesim.sweep(copy.deepcopy(SEED), threads=1)
    assert plan.total == 2 * 1 * 2 * 3 * 2 and 0 < len(table) <= plan.total
    _check_table(plan, table)
    assert math.isfinite(float(np.nanmax(table["decode_tok_s"])))
