"""Leave-one-device-family-out cross-validation (issue 14): the family of a machine, and that each
family's rows are predicted by a fit that never saw any row of that family."""
from __future__ import annotations

import pytest

import moesim
from moesim.analysis import calibrate as C
from moesim.analysis import validate as V
from moesim.analysis.intervals import device_family
from moesim.ingest.packaged import measurements_csv
from moesim.report.text import calibrate_text


@pytest.mark.parametrize("parts, placement, family", [
    (dict(gpu="rtx-4090"), None, "nvidia-ada"),
    (dict(gpu="rtx-3090"), None, "nvidia-ampere"),
    (dict(gpu="tesla-p40"), None, "nvidia-pascal"),
    (dict(gpu="h200"), None, "nvidia-hopper"),
    (dict(gpu="b200"), None, "nvidia-blackwell"),
    (dict(gpu="rx-7900-xtx"), None, "amd-rdna"),
    (dict(gpu="mi300x"), None, "amd-cdna"),
    (dict(gpu="m2-max"), None, "apple-gpu"),
    (dict(gpu="m2-max"), "cpu-only", "apple-cpu"),
    (dict(gpu="ryzen-ai-max-plus-395"), None, "amd-apu"),
    (dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64), "cpu-only", "cpu-desktop"),
    (dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64), "n-cpu-moe=10", "nvidia-ada"),
])
def test_device_family(parts, placement, family):
    assert device_family(moesim.machine(**parts), placement) == family


def _prepared(n: int = 40) -> tuple:
    rows = [r for r in V.load_rows(measurements_csv()) if r["quality"] in ("A", "B")]
    prepared, _, _ = V.evaluate_rows(rows[:n], calibrated=False)
    return C.Model(prepared), prepared


def test_each_family_is_predicted_by_a_fit_without_any_of_its_rows(monkeypatch):
    model, prepared = _prepared()
    families = [device_family(pr.cfg.machine, pr.p) for pr in prepared]
    assert len(set(families)) >= 3, "the test corpus should span several device families"
    seen = []

    def fake_fit(model, idx, x0=None, **kw):     # records what each fold trains on; keeps the priors
        seen.append(list(idx))
        return C.prior_vector()

    monkeypatch.setattr(C, "fit", fake_fit)
    out = C.held_out(model, C.prior_vector(), families)
    assert out["groups"] == sorted(set(families))
    assert len(seen) == len(out["groups"])
    for g, train in zip(out["groups"], seen):
        assert all(families[i] != g for i in train)
        assert len(train) == sum(f != g for f in families)
    # every row is predicted exactly once, in its own family's fold, and the summaries count them
    assert sorted(r["id"] for r in out["rows"]) == sorted(pr.cfg.row["id"] for pr in prepared)
    assert all(r["group"] == families[[pr.cfg.row["id"] for pr in prepared].index(r["id"])] for r in out["rows"])
    assert sum(v["decode"]["n"] for v in out["by_group"].values()) == out["decode"]["n"]
    # with the priors everywhere the held-out errors are the priors' own errors
    ids = {pr.cfg.row["id"]: i for i, pr in enumerate(prepared)}
    for r in out["rows"]:
        if "decode_err" in r:
            pred = model.predict(C.prior_vector(), [ids[r["id"]]])[0][0]
            measured = V._num(prepared[ids[r["id"]]].cfg.row, "decode_tok_s")
            assert r["decode_err"] == pytest.approx(pred / measured - 1, rel=1e-12)


def test_unknown_holdout_names_the_field():
    with pytest.raises(moesim.MoesimError, match="holdout"):
        C.calibrate(measurements_csv(), holdout=("machine",))


def test_report_text_lists_each_family():
    summary = {"n": 3, "median_abs_pct_err": 12.5, "p90_abs_pct_err": 30.0}
    empty = {"n": 0, "median_abs_pct_err": None, "p90_abs_pct_err": None}
    rep = {"params": {}, "bounds": {}, "priors": {}, "rows_fitted": 3, "rows_skipped": [], "fit_seconds": 1.0,
           "in_sample": {"decode": summary, "prefill": empty}, "priors_error": {"decode": summary, "prefill": empty},
           "device_family_out": {"decode": summary, "prefill": empty, "groups": ["amd-rdna", "nvidia-ada"],
                                 "by_group": {"amd-rdna": {"decode": summary, "prefill": empty},
                                              "nvidia-ada": {"decode": summary, "prefill": empty}},
                                 "by_class": {"A": {"decode": summary, "prefill": empty}}, "rows": []}}
    text = calibrate_text(rep)
    assert "leave-one-device-family-out (2 families): decode median |err| 12.5 %, p90 30.0 %" in text
    assert "family amd-rdna" in text and "family nvidia-ada" in text and "class A" in text


def test_validate_summarises_by_device_family():
    recs = [{"quality": "A", "class": "LC", "decode_err": e, "prefill_err": None, "roofline_err": None,
             "device_family": f, "serving": None} for e, f in ((0.1, "nvidia-ada"), (-0.3, "nvidia-ada"),
                                                                 (0.5, "amd-apu"), (None, "amd-apu"))]
    recs.append({"quality": "C", "class": "LC", "decode_err": 9.0, "prefill_err": None, "roofline_err": None,
                 "device_family": "intel-gpu", "serving": None})
    fam = V.summarise(recs, [])["by_device_family"]
    assert set(fam) == {"nvidia-ada", "amd-apu"}          # quality C rows stay out of the headline
    assert fam["nvidia-ada"]["decode"] == {"n": 2, "median_abs_pct_err": pytest.approx(20.0),
                                           "p90_abs_pct_err": pytest.approx(28.0)}
    assert fam["amd-apu"]["decode"]["n"] == 1 and fam["amd-apu"]["prefill"]["n"] == 0


def test_forked_folds_give_the_serial_records_in_order():
    """calibrate --processes: the held-out fits forked over worker processes give the serial run's records, in
    its order (each fold's fit starts from the full fit's values whichever process runs it)."""
    model, prepared = _prepared(24)
    families = [device_family(pr.cfg.machine, pr.p) for pr in prepared]
    serial = C.held_out(model, C.prior_vector(), families, max_nfev=3)
    calls = []
    forked = C.held_out(model, C.prior_vector(), families, max_nfev=3, processes=2,
                        progress=lambda i, n, g: calls.append((i, n, g)))
    assert forked["rows"] == serial["rows"]
    assert [c[2] for c in calls] == serial["groups"] and calls[-1][:2] == (len(serial["groups"]),) * 2
    assert C._FOLDS == ()
