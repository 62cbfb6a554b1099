"""The sweep's analytic expert-cache hit rate (Che's approximation, ms_analytic.c) against Monte Carlo
(simulate(mode="montecarlo"): a real LRU cache replayed over sampled routing) on one model, at a few GPU
expert-cache sizes and batches (issue 19). Che is an approximation, so this is a tolerance, 0.02: the
offload-research grid (bench/bench_grids.py) is only as good as this agreement. At batch 1 Che is high by
0.005-0.012 here (8192 Monte Carlo steps, seeds 1 and 2); at batch 4 (superposed streams) by up to 0.020 at
16 slots (measured 2026-12-03), at the tolerance's edge, so batch 4 is checked at 0.03.

Two profiles: olmoe's v1 (independent reference model + stickiness, what Che assumes) and the family
default olmoe:v2, whose memory over tens of tokens the analytic path reads through its window tables
(Che's approximation on a stationary correlated stream, engine/lower/routing_window.py; issue 15). Before
the windows, olmoe:v2 at 32 slots, batch 1, read analytic 0.670 against Monte Carlo 0.713; now 0.714.
The other v2 defaults (gpt-oss:pooled, deepseek-v2:v2) are checked at batch 1 at four sizes each."""
from __future__ import annotations

import pytest

import moesim

MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
MODEL = "olmoe-1b-7b"            # 64 experts, top-8: cheap to replay
SIZES = [4, 8, 16, 32, 48]


def _sweep(routing: str):
    return moesim.sweep(models=[MODEL], quants=["Q4_K_M"], machines=[MACHINE], placements=["offload-cache"],
                        cache_experts=SIZES, policies=["lru"], contexts=[4096], batches=[1, 4], routing=[routing],
                        filter={"skip_inapplicable": True}, progress=False)


@pytest.fixture(scope="module")
def table():
    return _sweep("olmoe")


def test_sweep_lru_hit_rate_within_002_of_monte_carlo(table):
    _check_against_monte_carlo(table, "olmoe")


def test_v2_profile_analytic_hit_rate_within_002_of_monte_carlo():
    _check_against_monte_carlo(_sweep("olmoe:v2"), "olmoe:v2")


# v2 default -> (model, GPU expert-cache sizes): from a few slots to most of a layer's experts
V2_DEFAULTS = {"gpt-oss:pooled": ("gpt-oss-20b", [4, 8, 16, 24]), "deepseek-v2:v2": ("deepseek-v2-lite", [8, 16, 32, 48])}


@pytest.mark.parametrize("routing", sorted(V2_DEFAULTS))
def test_other_v2_defaults_analytic_hit_rate_within_002_of_monte_carlo(routing):
    model, sizes = V2_DEFAULTS[routing]
    machine = moesim.machine(**MACHINE)
    for c in sizes:
        an, mc = (moesim.simulate(model, machine, quant="Q4_K_M", context=4096, batch=1, cache_experts=c, policy="lru",
                                  mode=mode, tokens=8192, seed=1, routing=routing).expert_hit_rate
                  for mode in ("analytic", "montecarlo"))
        assert 0.0 < mc <= 1.0 and abs(an - mc) <= 0.02, (routing, c, an, mc)


def _check_against_monte_carlo(table, routing: str):
    machine = moesim.machine(**MACHINE)
    rows = table.to_dicts()
    assert len(rows) == 2 * len(SIZES)
    for row in rows:
        mc = moesim.simulate(MODEL, machine, quant="Q4_K_M", context=4096, batch=int(row["batch"]),
                             cache_experts=int(row["cache_experts"]), policy="lru", mode="montecarlo",
                             tokens=8192, seed=1, routing=routing)
        assert 0.0 < mc.expert_hit_rate <= 1.0
        tol = 0.02 if row["batch"] == 1 else 0.03
        assert abs(row["expert_hit_rate"] - mc.expert_hit_rate) <= tol, (row["cache_experts"], row["batch"],
                                                                          row["expert_hit_rate"], mc.expert_hit_rate)


def test_hit_rate_rises_with_cache_size(table):
    """A bigger cache never lowers the hit rate (so the comparison above is not of a flat column)."""
    for b in (1, 4):
        hits = [r["expert_hit_rate"] for r in table.to_dicts() if r["batch"] == b]
        assert hits == sorted(hits) and hits[-1] > hits[0] + 0.3
