"""Calibration sees serving rows as validate does: one prediction function (validate.predict_row) for
both, serve-sim's ratio in the fit left fresh at the fitted values, leave-one-source-out over a small
synthetic corpus written to tmp (a few evaluations, not a full calibration)."""
from __future__ import annotations

import numpy as np
import pytest

from moesim.analysis import calibrate as C
from moesim.analysis import validate as V
from test_validate import row, write_csv

SERVING = dict(id="DC-90", model="gpt-oss-20b", quant="MXFP4", runtime="sglang", gpu="h100-sxm", gpus="1",
               parallel="tp1", placement="all-gpu", prompt_tokens="256", depth_tokens="256", batch="8",
               decode_tok_s="150", source="github.com/s/serving bench",
               notes="random 256 in/32 out; max concurrency 8; decode = aggregate/batch")


def corpus(tmp_path):
    rows = [row(**SERVING)]
    for i, (pl, gpu) in enumerate([("experts-cpu", "rtx-4090"), ("n-cpu-moe=24", "rtx-3090"),
                                   ("all-gpu", "rtx-pro-6000"), ("experts-cpu", "rtx-3090")]):
        rows.append(row(id=f"LC-{i}", placement=pl, gpu=gpu, host_mem="ddr5", host_channels="2",
                        host_mem_gb="256", decode_tok_s=str(25 + 10 * i), prefill_tok_s=str(400 + 100 * i),
                        prompt_tokens="512", source=f"github.com/s{i % 2}/r test"))
    return write_csv(tmp_path / "corpus.csv", rows)


def test_calibrate_predicts_a_serving_row_as_validate_does(tmp_path):
    path = corpus(tmp_path)
    records = {r["id"]: r for r in V.validate(path, calibrated=False)["rows"]}
    prepared, _, _ = V.evaluate_rows(V.load_rows(path), calibrated=False)
    model = C.Model(prepared)
    got = dict(zip([pr.cfg.row["id"] for pr in prepared], model.predict(C.prior_vector())))
    serving = records["DC-90"]
    assert serving["serving"] is not None and serving["decode_predicted"] != serving["decode_step_predicted"]
    for rid, rec in records.items():
        assert got[rid][0] == pytest.approx(rec["decode_predicted"], rel=1e-12), rid
        assert got[rid][1] == pytest.approx(rec["prefill_predicted"] or got[rid][1], rel=1e-12), rid
    assert model.serving == [pr.cfg.row["id"] == "DC-90" for pr in prepared]


def test_fit_leaves_the_serving_ratio_fresh_at_its_result(tmp_path):
    prepared, _, _ = V.evaluate_rows(V.load_rows(corpus(tmp_path)), calibrated=False)
    model = C.Model(prepared)
    idx = list(range(len(prepared)))
    values = C.fit(model, idx, max_nfev=3)
    exact, fitted = model.predict(values, idx), model.surrogate(values, idx)
    for (dec, pf), (sdec, spf) in zip(exact, fitted):
        assert sdec == pytest.approx(dec, rel=1e-12) and spf == pytest.approx(pf, rel=1e-12)
    i = model.serving.index(True)
    assert model.ratio[i] != 1.0            # serve-sim's prefill interference, not the batch step


def test_leave_one_source_out_with_a_serving_row(tmp_path):
    report = C.calibrate(corpus(tmp_path), max_nfev=2)
    cv = report["cross_validated"]
    assert cv["groups"] == ["github.com/s/serving", "github.com/s0/r", "github.com/s1/r"]
    held = {r["id"]: r for r in cv["rows"]}
    assert set(held) == {"DC-90", "LC-0", "LC-1", "LC-2", "LC-3"} and np.isfinite(held["DC-90"]["decode_err"])
    assert cv["by_class"]["DC"]["decode"]["n"] == 1
