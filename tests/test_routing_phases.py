"""Routing phases (issue 15): a profile's prefill regime lowers to a valid inclusion-probability table
(``prefill_q``) that prefill costing reads, a more skewed prompt regime never widens a ubatch's expert
union (nor slows prefill with the experts offloaded), and bad prefill / spread / phase fields are
MoesimErrors naming the field."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from moesim import MoesimError
from moesim.analysis.simulate import simulate
from moesim.engine.lower import routing as LRT
from moesim.spec import hardware
from moesim.spec import routing as R

DIMS = LRT.RoutingDims(8, 32, 4)
SETTINGS = dict(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

regimes = st.fixed_dictionaries({
    "zipf_s": st.floats(0.0, 3.0), "jitter": st.floats(0.0, 0.5), "concentration": st.floats(0.0, 20.0),
    "stickiness": st.floats(0.0, 1.0)})


def _union(q: np.ndarray, n: int) -> np.ndarray:
    """[scenarios, layers] expected distinct experts of an n-token ubatch (engine/prefill.py's formula)."""
    return (1.0 - (1.0 - q) ** n).sum(axis=-1)


@settings(**SETTINGS)
@given(regime=regimes, seed=st.integers(0, 2**31))
def test_prefill_q_is_an_inclusion_table(regime, seed):
    prof = R.profile("qwen", prefill=regime)
    rt = LRT.lower(DIMS, prof, seed)
    pq = np.asarray(rt["prefill_q"])
    assert pq.shape[1:] == (DIMS.n_layers, DIMS.n_experts)
    assert np.all(pq >= 0) and np.all(pq <= 1 + 1e-12)
    np.testing.assert_allclose(pq.sum(axis=-1), DIMS.top_k, rtol=1e-6)
    # the decode tables are the profile's own, untouched by the prefill regime
    np.testing.assert_array_equal(rt["q"], LRT.lower(DIMS, R.profile("qwen"), seed)["q"])


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**31), name=st.sampled_from(["qwen", "gpt-oss", "gpt-oss:mmlu", "deepseek-v2"]))
def test_prefill_regime_equal_to_decode_gives_decode_q(seed, name):
    base = R.profile(name)
    assert "prefill_q" not in LRT.lower(DIMS, base, seed)          # absent: prefill costing reads q
    same = R.profile(name, prefill={"zipf_s": base.zipf_s, "concentration": base.concentration})
    rt = LRT.lower(DIMS, same, seed)
    np.testing.assert_array_equal(rt["prefill_q"], rt["q"])


@settings(**SETTINGS)
@given(s=st.floats(0.0, 2.5), ds=st.floats(0.01, 1.5), jitter=st.floats(0.0, 0.5), seed=st.integers(0, 2**31),
       n=st.sampled_from([1, 4, 16, 512]))
def test_more_skewed_prefill_never_widens_the_union(s, ds, jitter, seed, n):
    def union(zipf_s):
        prof = R.profile("generic", prefill={"zipf_s": zipf_s, "jitter": jitter, "concentration": 0.0})
        return _union(np.asarray(LRT.lower(DIMS, prof, seed)["prefill_q"]), n)
    assert np.all(union(s + ds) <= union(s) + 1e-9)


MACHINE = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=192)


@pytest.mark.parametrize("placement", ["experts-cpu", "n-cpu-moe=24"])
def test_more_skewed_prefill_never_slows_offloaded_prefill(placement):
    mach = hardware.machine(**MACHINE)
    ttft = []
    for s in (0.0, 0.5, 1.0, 2.0, 3.0):
        prof = R.profile("qwen", prefill={"zipf_s": s, "concentration": 0.0})
        r = simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", placement=placement, tokens=16, mode="analytic",
                     routing=prof)
        ttft.append(r.ttft_s)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(ttft, ttft[1:])), ttft
    assert ttft[-1] < ttft[0]       # the union shrinks enough to show (the test can fail)


def test_no_prefill_regime_prices_prompts_as_decode():
    mach = hardware.machine(**MACHINE)
    base = R.profile("qwen")
    same = R.profile("qwen", prefill={"zipf_s": base.zipf_s})
    a, b = (simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", placement="experts-cpu", tokens=16, mode="analytic",
                     routing=p) for p in (base, same))
    assert a.ttft_s == b.ttft_s and a.decode_tok_s == b.decode_tok_s


@pytest.mark.parametrize("override,field", [
    (dict(prefill={"zipf_s": -1.0}), "prefill.zipf_s"),
    (dict(prefill={"jitter": 1.5}), "prefill.jitter"),
    (dict(prefill={"stickiness": 2.0}), "prefill.stickiness"),
    (dict(prefill={"history": 0}), "prefill.history"),
    (dict(prefill={"request_tokens": 64}), "prefill.request_tokens"),
    (dict(prefill={"bogus": 1.0}), "prefill.bogus"),
    (dict(prefill=[1, 2, 3]), "prefill"),
    (dict(spread={"reuse_lag1": [0.5, 0.2]}), "spread.reuse_lag1"),
    (dict(spread={"lru_2k": [float("nan"), 0.2]}), "spread.lru_2k"),
    (dict(spread={"reuse_lag1": 0.3}), "spread"),
    (dict(spread={"reuse_lag1": [0.3]}), "spread"),
    (dict(fitted_phase="prefill"), "fitted_phase"),
    (dict(workloads=[1, 2]), "workloads"),
])
def test_bad_phase_fields_name_the_field(override, field):
    with pytest.raises(MoesimError) as exc:
        R.profile("qwen", **override)
    assert exc.value.field == field


def test_regime_phase_is_checked():
    with pytest.raises(MoesimError) as exc:
        R.profile("qwen").regime("prompt")
    assert exc.value.field == "phase"


def test_fitted_phase_in_the_catalog():
    assert R.profile("deepseek-v2").fitted_phase == R.profile("deepseek-v2:v2").fitted_phase == "prompt"     # teacher-forced prompts (../shared/traces)
    for pid in ("gpt-oss", "gpt-oss:mmlu", "gpt-oss:mmlu-pro", "gpt-oss:pooled"):
        assert R.profile(pid).fitted_phase == "decode"


def test_decode_on_a_prompt_fitted_profile_is_noted_not_changed():
    mach = hardware.machine(**MACHINE)
    run = lambda routing: simulate("deepseek-v2-lite", mach, tokens=16, mode="analytic", routing=routing)  # noqa: E731
    noted, plain = run(None), run(R.profile(family="deepseek_v2", fitted_phase=""))   # the family default
    note = [a for a in noted.memory["assumptions"] if "fitted to prompt tokens" in a]
    assert len(note) == 1 and "deepseek-v2" in note[0] and "issue 15" in note[0]
    assert not any("fitted to prompt tokens" in a for a in plain.memory["assumptions"])
    assert (noted.decode_tok_s, noted.ttft_s, noted.expert_hit_rate) == (plain.decode_tok_s, plain.ttft_s,
                                                                          plain.expert_hit_rate)
    gpt = simulate("gpt-oss-20b", mach, tokens=16, mode="analytic")
    assert not any("fitted to prompt tokens" in a for a in gpt.memory["assumptions"])


SPREAD_PROFILES = ("gpt-oss", "gpt-oss:pooled")


@pytest.mark.parametrize("pid", SPREAD_PROFILES)
def test_stored_spread_is_what_workload_spread_recomputes(pid):
    from moesim.analysis.routing_fit import workload_spread
    prof = R.profile(pid)
    assert prof.workloads == ("gpt-oss:mmlu", "gpt-oss:mmlu-pro")
    stored = {k: list(v) for k, v in prof.spread_dict().items()}
    assert set(stored) == {"reuse_lag1", "lru_1k", "lru_2k", "lru_4k"}
    again = workload_spread(pid, "gpt-oss-20b")
    assert again.keys() == stored.keys()
    for key, (lo, hi) in stored.items():
        assert again[key] == pytest.approx([lo, hi], abs=1e-4), key
        assert 0 <= lo <= hi <= 1


def test_workload_spread_is_a_range_over_the_workloads():
    from moesim.analysis.routing_fit import workload_spread
    from moesim.analysis import routing_stats as S
    from moesim.engine.routing import sample_requests
    from moesim.ingest import model as get_model
    dims = LRT.RoutingDims.of(get_model("gpt-oss-20b"))
    one = {}
    for wid in ("gpt-oss:mmlu", "gpt-oss:mmlu-pro"):
        w = R.profile(wid)
        one[wid] = S.headline(sample_requests(dims, w, 8, w.request_tokens, 3), dims.n_experts)
    got = workload_spread("gpt-oss:pooled", "gpt-oss-20b", n_requests=8, seed=3)
    for key, (lo, hi) in got.items():
        assert lo == pytest.approx(min(v[key] for v in one.values()), abs=1e-4)
        assert hi == pytest.approx(max(v[key] for v in one.values()), abs=1e-4)
    with pytest.raises(MoesimError) as exc:
        workload_spread("qwen", "gpt-oss-20b")
    assert exc.value.field == "workloads"


def test_spread_in_routing_stats_and_simulate_json(capsys):
    import json
    from pathlib import Path
    from moesim.cli import main
    dump = Path(__file__).resolve().parent / "data" / "steplist_router_dump.json"
    assert main(["routing", "stats", str(dump), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "routing_spread" not in plain
    assert main(["routing", "stats", str(dump), "--profile", "gpt-oss:pooled", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["routing_spread"]["spread"] == {k: list(v) for k, v in R.profile("gpt-oss:pooled").spread_dict().items()}
    assert {k: v for k, v in out.items() if k != "routing_spread"} == plain        # the statistics are unchanged
    assert main(["routing", "stats", str(dump), "--profile", "gpt-oss:pooled"]) == 0
    text = capsys.readouterr().out
    lo, hi = R.profile("gpt-oss:pooled").spread_dict()["reuse_lag1"]
    assert "spread across its workloads" in text and f"{lo:.3f} .. {hi:.3f}" in text
    mach = hardware.machine(**MACHINE)
    d = simulate("gpt-oss-20b", mach, tokens=16, mode="analytic").to_dict()
    assert d["routing_spread"] == {k: list(v) for k, v in R.profile(family="gpt_oss").spread_dict().items()}
    assert "routing_spread" not in simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", tokens=16, mode="analytic").to_dict()
