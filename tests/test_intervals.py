"""80 % prediction intervals (analysis.intervals): built from the leave-one-source-out residuals that
``moesim calibrate`` stored, carried by fit / simulate / sweep, containing the point, wider where the
regime is thin, and covering 75-85 % of the out-of-sample rows."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import moesim
from moesim.spec.runtimes import runtime as get_runtime
from moesim.analysis import intervals as I
from moesim.spec.runtimes import calibration

LOSO = Path(__file__).parent / "data" / "loso_residuals.json"
# the stored LOSO rows and calibration.toml [intervals] come from one cross-validated calibrate run
needs_table = pytest.mark.skipif(not LOSO.exists() or "intervals" not in calibration(),
                                 reason="no cross-validated [intervals] in calibration.toml yet (issue 14 item 4)")
GPU_BOX = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64}


@pytest.fixture(scope="module")
def loso():
    return json.loads(LOSO.read_text(encoding="utf-8"))["rows"]


def _synthetic(n_rich: int, n_thin: int, spread: float = 0.3, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    rows = [{"regime": "hbm/gpu/served", "group": f"s{i}", "decode_log": float(v)}
            for i, v in enumerate(rng.normal(0, spread, n_rich))]
    rows += [{"regime": "hbm/hybrid/llama.cpp", "group": f"t{i}", "decode_log": float(v)}
             for i, v in enumerate(rng.normal(0, spread, n_thin))]
    return rows


# ------------------------------------------------------------------------------ the table
@needs_table
def test_catalog_table_is_the_stored_loso_residuals(loso):
    """calibration.toml [intervals] is build_table of the rows calibrate's cross-validation left."""
    stored = calibration()["intervals"]
    built = I.build_table(loso)
    for metric in I.METRICS:
        assert set(stored[metric]) == set(built[metric])
        for key, e in built[metric].items():
            assert stored[metric][key]["n"] == e["n"]
            assert stored[metric][key]["lo"] == pytest.approx(e["lo"], rel=1e-5, abs=1e-6)
            assert stored[metric][key]["hi"] == pytest.approx(e["hi"], rel=1e-5, abs=1e-6)
    # one cross-validated run wrote both: calibrate's leave-one-source-out rows (or intervals_build's on a
    # separately held-out corpus), the command named in each
    assert stored["command"] == json.loads(LOSO.read_text(encoding="utf-8"))["command"]
    assert "moesim calibrate" in stored["command"] or "moesim.analysis.intervals_build" in stored["command"]


@needs_table
@pytest.mark.parametrize("metric", I.METRICS)
def test_coverage_on_leave_one_source_out_predictions(loso, metric):
    """The 80 % interval covers 75-85 % of the held-out rows, each source's interval built without it, with
    the small-sample factor calibration.toml keeps (the smallest grid step that reaches the level)."""
    stored = calibration()["intervals"]
    small = float(stored["small_sample"])
    assert small == I.choose_small_sample(loso)
    cov = I.coverage(loso, None, nested=True, small_sample=small)[metric]
    assert cov["n"] >= 20
    assert 0.75 <= cov["covered"] <= 0.85, cov
    assert stored[f"coverage_{metric}"] == pytest.approx(cov["covered"], abs=1e-4)


def test_small_sample_choice_is_the_smallest_step_reaching_the_level():
    rows = _synthetic(60, 4)
    s = I.choose_small_sample(rows)
    assert s in I.SMALL_SAMPLE_GRID
    cov = I.coverage(rows, None, nested=True, small_sample=s)
    assert all(c["covered"] is None or c["covered"] >= I.LEVEL for c in cov.values()) or s == I.SMALL_SAMPLE_GRID[-1]
    if s > 0:
        below = I.coverage(rows, None, nested=True, small_sample=s - 0.25)
        assert any(c["covered"] is not None and c["covered"] < I.LEVEL for c in below.values())


def test_thin_regime_falls_back_and_is_wider():
    rows = _synthetic(40, 3)
    table = I.build_table(rows)
    rich = I.lookup(table, "decode", "hbm/gpu/served")
    thin = I.lookup(table, "decode", "hbm/hybrid/llama.cpp")
    coarse = table["decode"]["hbm"]
    assert "regime hbm/gpu/served" in rich[2]
    assert "device class hbm" in thin[2] and "wider" in thin[2]
    f = I.WIDEN * (1 + I.SMALL_SAMPLE / coarse["n"] ** 0.5)
    assert thin[0] == pytest.approx(min(0.0, coarse["lo"]) * f)
    assert thin[1] == pytest.approx(max(0.0, coarse["hi"]) * f)
    assert thin[1] - thin[0] > rich[1] - rich[0]
    # a regime no row measured, on a device class none did either: all rows, widened twice
    none = I.lookup(table, "decode", "unified/gpu/mlx")
    assert "all rows" in none[2] and none[1] - none[0] > thin[1] - thin[0]


def test_more_rows_make_the_regime_its_own_basis():
    table = I.build_table(_synthetic(40, I.MIN_ROWS))
    assert I.lookup(table, "decode", "hbm/hybrid/llama.cpp")[2].startswith("regime hbm/hybrid/llama.cpp")


@pytest.mark.parametrize("offset", [-1.0, 1.0])
def test_interval_contains_the_point_even_for_a_biased_regime(offset):
    rows = [{"regime": "gddr/gpu/llama.cpp", "group": str(i), "decode_log": offset + 0.01 * i} for i in range(20)]
    lo, hi, _ = I.interval(10.0, "decode", "gddr/gpu/llama.cpp", I.build_table(rows))
    assert lo <= 10.0 <= hi


def test_no_point_or_no_table_gives_no_interval():
    assert I.interval(None, "decode", "hbm/gpu/served")[:2] == (None, None)
    assert I.interval(5.0, "decode", "hbm/gpu/served", {})[:2] == (None, None)


@needs_table
def test_catalog_thin_regimes_are_wider_than_their_basis():
    t = calibration()["intervals"]
    for metric in I.METRICS:
        for key, e in t[metric].items():
            if key.count("/") != 2 or e["n"] >= t["min_rows"]:
                continue
            lo, hi, basis = I.lookup(t, metric, key, t["min_rows"], t["widen"])
            assert "wider" in basis
            base = next(t[metric][k] for k in I._levels(key)[1:] if k in basis or k == I.GLOBAL)
            assert hi - lo > max(0.0, base["hi"]) - min(0.0, base["lo"])


def test_regime_names_device_placement_and_family():
    m = moesim.machine(**GPU_BOX)
    assert I.regime(m, "experts-cpu", get_runtime("ollama")) == "gddr/hybrid/llama.cpp"
    assert I.regime(moesim.machine(host="ddr5-4800x8", host_mem_gb=256), "cpu-only", get_runtime("llama.cpp")) \
        == "cpu/cpu/llama.cpp"
    assert I.placement_kind("n-cpu-moe=20") == "hybrid"


# ------------------------------------------------------------------------------ carried by the results
def _check(d: dict) -> None:
    for name in ("decode_tok_s", "prefill_tok_s"):
        lo, hi = d[f"{name}_lo"], d[f"{name}_hi"]
        assert lo is not None and hi is not None
        assert 0 < lo <= d[name] <= hi
    assert d["interval_basis"]


@needs_table
def test_simulate_and_fit_carry_the_four_fields():
    r = moesim.simulate("qwen3-30b-a3b", moesim.machine(**GPU_BOX), quant="Q4_K_M", context=4096)
    d = r.to_dict()
    _check(d)
    assert d["interval_regime"] == I.regime(moesim.machine(**GPU_BOX), d["placement"], get_runtime(d["runtime"]))
    rows = moesim.fit("qwen3-30b-a3b", moesim.machine(**GPU_BOX), quants=["Q4_K_M"], context=4096)
    _check(rows[0])
    assert rows[0]["decode_tok_s_lo"] / rows[0]["decode_tok_s"] == pytest.approx(d["decode_tok_s_lo"] /
                                                                                d["decode_tok_s"])


@needs_table
def test_sweep_columns_match_the_per_configuration_interval():
    t = moesim.sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M", "Q8_0"], machines=[GPU_BOX],
                     placements=["auto", "cpu-only"], contexts=[2048, 32768], batches=[1, 4])
    m = moesim.machine(**GPU_BOX)
    ok = np.isfinite(t["decode_tok_s"])
    assert ok.any()
    for name in ("decode_tok_s", "prefill_tok_s"):
        assert (t[f"{name}_lo"][ok] <= t[name][ok]).all() and (t[name][ok] <= t[f"{name}_hi"][ok]).all()
    for row in [r for r in t.to_dicts() if math.isfinite(r["decode_tok_s"])]:
        f = I.fields(row["decode_tok_s"], row["prefill_tok_s"],
                     I.regime(m, row["placement"], get_runtime(row["runtime"])))
        for k in I.FIELDS:
            assert row[k] == pytest.approx(f[k], rel=1e-12)


@needs_table
def test_chunk_fill_equals_the_group_by_group_fill():
    """intervals.fill_sweep_chunk (a sweep chunk's interval columns at once) writes what fill_sweep writes group by
    group, bit for bit: groups of several machines and runtimes, one or several placement codes each, rows of
    skipped groups between them left alone, and codes outside the labels (the group by group path)."""
    rng = np.random.default_rng(3)
    labels = ["all-gpu", "experts-cpu", "n-cpu-moe=20", "cpu-only", "layers-gpu=10"]
    machines = [moesim.machine(**GPU_BOX), moesim.machine(host="ddr5-4800x8", host_mem_gb=256)]
    runtimes = [get_runtime("llama.cpp"), get_runtime("ollama")]
    n = 200
    cols = {p: rng.uniform(1.0, 100.0, n) for p in ("decode_tok_s", "prefill_tok_s")}
    cols["placement"] = rng.integers(0, len(labels), n).astype(np.int32)
    groups, s0 = [], 0
    while s0 < n:
        s1 = min(n, s0 + int(rng.integers(1, 13)))
        if rng.random() < 0.8:                  # the others: a skipped group's rows
            if rng.random() < 0.5:
                cols["placement"][s0:s1] = cols["placement"][s0]
            groups.append((s0, s1, machines[int(rng.integers(0, 2))], runtimes[int(rng.integers(0, 2))]))
        s0 = s1
    for codes in (cols["placement"], np.where(np.arange(n) == groups[0][0], -1, cols["placement"]).astype(np.int32)):
        if codes.min() < 0:                     # fill_sweep reads label -1 as the last: the same on both paths
            cols["placement"] = codes
        want = {**cols, **{f: np.full(n, -7.0) for f in I.FIELDS}}
        got = {**cols, **{f: np.full(n, -7.0) for f in I.FIELDS}}
        for g0, g1, m, r in groups:
            I.fill_sweep(want, g0, g1, m, r, labels)
        I.fill_sweep_chunk(got, groups, labels)
        for f in I.FIELDS:
            assert np.array_equal(got[f], want[f], equal_nan=True), f
    I.fill_sweep_chunk(got, [], labels)


def test_pooled_routing_spread_widens_the_interval():
    """Issue 15: a pooled routing profile's spread across its workloads is carried into the interval of the speeds
    that depend on routing. gpt-oss-20b's family default, gpt-oss:pooled, pools gpt-oss:mmlu and gpt-oss:mmlu-pro:
    each bound moves out by its side's extreme ratio of a workload's analytic tok/s to the pooled profile's."""
    m = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    kw = dict(quant="MXFP4_MOE", placement="offload-cache=8", mode="analytic", batch=8)
    pooled = moesim.simulate("gpt-oss-20b", m, **kw)
    base = I.fields(pooled.decode_tok_s, pooled.prefill_tok_s, pooled.intervals["interval_regime"])
    speeds = [moesim.simulate("gpt-oss-20b", m, routing=w, **kw).decode_tok_s for w in ("gpt-oss:mmlu", "gpt-oss:mmlu-pro")]
    ratios = [s / pooled.decode_tok_s for s in speeds]
    assert max(ratios) > 1.0 or min(ratios) < 1.0            # the workloads differ at this batch and cache
    assert pooled.intervals["decode_tok_s_lo"] == pytest.approx(base["decode_tok_s_lo"] * min(1.0, min(ratios)))
    assert pooled.intervals["decode_tok_s_hi"] == pytest.approx(base["decode_tok_s_hi"] * max(1.0, max(ratios)))
    assert "gpt-oss:mmlu-pro" in pooled.intervals["interval_basis"]
    # a Monte Carlo run widens by the same analytic ratios
    mc = moesim.simulate("gpt-oss-20b", m, **dict(kw, mode="montecarlo"))
    mc_base = I.fields(mc.decode_tok_s, mc.prefill_tok_s, mc.intervals["interval_regime"])
    assert mc.intervals["decode_tok_s_hi"] == pytest.approx(mc_base["decode_tok_s_hi"] * max(1.0, max(ratios)))


def test_profile_without_workloads_keeps_the_calibrated_interval():
    m = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    r = moesim.simulate("qwen3-30b-a3b", m, quant="Q4_K_M", placement="offload-cache=16", mode="analytic", batch=8)
    assert r.intervals == I.fields(r.decode_tok_s, r.prefill_tok_s, r.intervals["interval_regime"])


@pytest.mark.parametrize("axes", [{}, {"prefetch_recall": [0.5]}], ids=["split", "prefetch"])
def test_sweep_carries_the_pooled_routing_spread_as_simulate_does(axes):
    """Issue 15 in sweeps: a gpt-oss row's interval (family default gpt-oss:pooled) is simulate's, widened by the
    same workload ratios, on the split analytic path and the whole-step one (prefetch; gpt-oss has no MTP), at batches and
    caches where the workloads move the bounds; a row of a profile that pools nothing keeps the calibrated one."""
    kw = dict(placements=["offload-cache=8", "experts-cpu"], contexts=[2048, 32768], batches=[1, 8], progress=False)
    t = moesim.sweep(models=["gpt-oss-20b"], quants=["MXFP4_MOE"], machines=[GPU_BOX],
                     routing=["auto", "gpt-oss:mmlu"], **kw, **axes)
    m = moesim.machine(**GPU_BOX)
    moved = 0
    for row in t.to_dicts():
        sim = dict(quant=row["quant"], placement=row["placement"], context=row["context"], batch=row["batch"],
                   mode="analytic", routing=None if row["routing"] == "auto" else row["routing"],
                   prefetch_recall=row.get("prefetch_recall"))
        s = moesim.simulate("gpt-oss-20b", m, **sim)
        for k in I.FIELDS:
            assert row[k] == pytest.approx(s.intervals[k], rel=1e-9), (row, k)
        calibrated = I.fields(row["decode_tok_s"], row["prefill_tok_s"], s.intervals["interval_regime"])
        if row["routing"] == "gpt-oss:mmlu":
            assert all(row[k] == pytest.approx(calibrated[k], rel=1e-12) for k in I.FIELDS)
        else:
            moved += row["decode_tok_s_hi"] > calibrated["decode_tok_s_hi"] * (1 + 1e-9)
    assert moved > 0


def test_montecarlo_sweep_widens_by_the_analytic_workload_ratios():
    """A Monte Carlo sweep's rows widen by analytic ratios (workload over pooled, both analytic), simulate's rule."""
    t = moesim.sweep(models=["gpt-oss-20b"], quants=["MXFP4_MOE"], machines=[GPU_BOX], placements=["offload-cache=8"],
                     contexts=[4096], batches=[1, 8], mode="montecarlo", progress=False)
    m = moesim.machine(**GPU_BOX)
    for row in t.to_dicts():
        s = moesim.simulate("gpt-oss-20b", m, quant="MXFP4_MOE", placement="offload-cache=8", context=4096,
                            batch=row["batch"], mode="montecarlo")
        for k in ("decode_tok_s_lo", "decode_tok_s_hi"):
            assert row[k] / row["decode_tok_s"] == pytest.approx(s.intervals[k] / s.decode_tok_s, rel=1e-9)


def test_fit_carries_the_pooled_routing_spread_as_simulate_does():
    m = moesim.machine(**GPU_BOX)
    row = moesim.fit("gpt-oss-120b", m, quants=["MXFP4_MOE"], context=4096, batch=8)[0]
    s = moesim.simulate("gpt-oss-120b", m, quant="MXFP4_MOE", context=4096, batch=8, placement=row["placement"],
                        mode="analytic")
    assert "widened by the routing's workloads" in row["interval_basis"]
    for k in I.FIELDS:
        assert row[k] == pytest.approx(s.intervals[k], rel=1e-12)
    assert row["interval_basis"] == s.intervals["interval_basis"]
