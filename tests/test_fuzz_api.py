"""Fuzzing the public API's arguments (hypothesis): wrong types, NaN/inf, negative, huge, unknown ids and
contradictory settings give a valid, finite result or a MoesimError naming a field; never a bare
built-in exception or a kernel error. Example counts come from conftest.fuzz_count (--long,
MOESIM_FUZZ_COUNT); each example's outcome is tallied."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from conftest import Tally, fuzz_count
from moesim import MoesimError

pytestmark = pytest.mark.fuzz
FIT_EXAMPLES = fuzz_count(40, 3_000)
SIM_EXAMPLES = fuzz_count(60, 2_000)
TALLY = {}
HOSTILE = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=8), st.lists(st.integers(), max_size=2))


def mostly(valid, hostile=HOSTILE):
    """*valid* about four times in five: with seven arguments each hostile half the time, almost every
    call would be refused and the accepting paths hardly fuzzed."""
    return st.integers(0, 9).flatmap(lambda i: hostile if i >= 8 else valid)


SMALL_INT = mostly(st.integers(1, 8192), st.one_of(st.integers(-3, 70000), HOSTILE))
MACHINES = mostly(st.sampled_from(["desktop-4090", "dgx-h200", "mac-studio-m3-ultra-512"]),
                  st.one_of(st.just("nope"), HOSTILE, st.fixed_dictionaries({
                      "gpu": st.sampled_from(["rtx-4090", "h100", "x"]),
                      "host": st.sampled_from(["ddr5-6000x2", "ddr5-6000xx", "ddr4-3200x99"])})))


def _finite(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0)


@settings(max_examples=FIT_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["qwen3-30b-a3b", "llama-3-8b", "deepseek-v2-lite", "nope"]), machine=MACHINES,
       quant=mostly(st.sampled_from(["Q4_K_M", "Q8_0", "MXFP4", "UD-Q2_K_XL", "fp8", "zz"])),
       context=SMALL_INT, batch=SMALL_INT, mtp=mostly(st.just(0), SMALL_INT),
       placement=mostly(st.sampled_from(["auto", "all-gpu", "experts-cpu", "n-cpu-moe=3", "n-cpu-moe=-1",
                                         "layers-gpu=999", "offload-cache", "bogus"])))
def test_fit_gives_a_sane_record_or_a_named_error(model, machine, quant, context, batch, mtp, placement):
    tally = TALLY.get("fit") or TALLY.setdefault("fit", Tally("test_fit_gives_a_sane_record_or_a_named_error"))
    try:
        recs = moesim.fit(model, machine, quants=[quant], context=context, batch=batch, mtp=mtp, placement=placement)
    except MoesimError as exc:
        assert exc.field, exc
        tally.refuse()
        return
    tally.ok()
    for r in recs:
        assert r["weights_bytes"] > 0 and _finite(r["kv_bytes"]) and _finite(r["decode_tok_s"])
        assert r["max_context"] >= 0 and r["max_batch"] >= 0


@settings(max_examples=SIM_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["qwen3-30b-a3b", "llama-3-8b", "mixtral-8x7b"]), machine=MACHINES,
       context=SMALL_INT, batch=mostly(st.integers(1, 16), SMALL_INT),
       tokens=mostly(st.integers(8, 64), st.one_of(st.integers(-2, 64), HOSTILE)),
       policy=mostly(st.sampled_from(["lru", "lfu", "static", "belady", "LRU", "x"])),
       mode=st.sampled_from(["montecarlo", "analytic", "MonteCarlo", "y"]),
       cache_experts=mostly(st.none(), st.one_of(st.integers(-2, 300), HOSTILE)),
       prefetch_recall=mostly(st.none(), st.one_of(st.floats(-1, 2), HOSTILE)),
       warmup=st.one_of(st.none(), st.integers(-1, 80)), seed=mostly(st.integers(0, 2**32), SMALL_INT))
def test_simulate_gives_a_sane_result_or_a_named_error(model, machine, context, batch, tokens, policy, mode,
                                                       cache_experts, prefetch_recall, warmup, seed):
    tally = TALLY.get("sim") or TALLY.setdefault("sim", Tally("test_simulate_gives_a_sane_result_or_a_named_error"))
    try:
        r = moesim.simulate(model, machine, quant="Q4_K_M", context=context, batch=batch, tokens=tokens,
                            policy=policy, mode=mode, cache_experts=cache_experts, prefetch_recall=prefetch_recall,
                            warmup=warmup, seed=seed)
    except MoesimError as exc:
        assert exc.field, exc
        tally.refuse()
        return
    tally.ok()
    assert r.decode_tok_s > 0 and math.isfinite(r.decode_tok_s) and math.isfinite(r.aggregate_tok_s)
    assert r.tpot_ms["p99"] >= r.tpot_ms["p50"] * (1 - 1e-12) > 0
    assert r.expert_hit_rate is None or 0.0 <= r.expert_hit_rate <= 1.0
    by = r.breakdown["by_resource"]
    assert math.isclose(sum(by.values()), r.breakdown["seconds_per_token"], rel_tol=1e-9)
