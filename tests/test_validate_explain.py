"""moesim validate --explain ID: one row's prediction equals evaluate_rows' and its breakdown sums to the step."""
import json
import subprocess
import sys

import pytest

from moesim.analysis.explain import explain
from moesim.analysis.validate import evaluate_rows, load_rows, measurements
from moesim.errors import MoesimError
from moesim.ingest.packaged import measurements_csv

IDS = ("DC-01", "LC-03", "AP-01a")


@pytest.fixture(scope="module")
def corpus():
    rows = load_rows(measurements_csv())
    return {r["id"]: r for r in rows if r["id"] in IDS}


@pytest.mark.parametrize("row_id", IDS)
def test_explain_matches_evaluate_rows(corpus, row_id):
    row = corpus[row_id]
    _, records, _ = evaluate_rows([row])
    rec = records[0]
    d = explain(measurements_csv(), row_id)
    meas_d, meas_p = measurements(row)
    assert d["decode"]["measured"] == meas_d and d["prefill"]["measured"] == meas_p
    assert d["decode"]["predicted"] == pytest.approx(rec["decode_predicted"], rel=1e-12)
    if meas_p:
        assert d["prefill"]["predicted"] == pytest.approx(rec["prefill_predicted"], rel=1e-12)
    b = d["breakdown"]
    for part in ("by_resource", "by_phase"):
        assert sum(b[part].values()) == pytest.approx(b["seconds_per_token"], rel=1e-9)
    assert 1.0 / b["seconds_per_token"] == pytest.approx(d["decode"]["step_predicted"], rel=1e-9)
    assert d["configuration"]["model"] == rec["model"] and d["parameters"]


def test_unknown_id_names_flag_and_close_ids():
    with pytest.raises(MoesimError) as exc:
        explain(measurements_csv(), "LC-3")
    assert "--explain" in str(exc.value) and "LC-03" in str(exc.value)


def test_cli_json_parses():
    out = subprocess.run([sys.executable, "-m", "moesim", "validate", "--explain", "LC-03", "--json"],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert d["id"] == "LC-03" and "breakdown" in d and "parameters" in d


def test_skipped_row_gives_the_reason_evaluate_rows_gives():
    rows = load_rows(measurements_csv())
    _, _, skipped = evaluate_rows(rows)
    assert skipped, "the packaged corpus has rows validate cannot predict"
    sk = skipped[0]
    d = explain(measurements_csv(), sk["id"])
    assert d["id"] == sk["id"] and d["skipped"] == sk["reason"]
    assert "breakdown" not in d and "decode" not in d
    text = subprocess.run([sys.executable, "-m", "moesim", "validate", "--explain", sk["id"]],
                          capture_output=True, text=True, check=True).stdout
    assert f"skipped: {sk['reason']}" in text


def test_explain_shows_the_cpu_rates_where_the_cpu_runs_part_of_the_model():
    """A row whose attention runs on the CPU lists the CPU's matmul and attention rates (the attention kernel's
    own, runtimes.toml cpu_attn_eff, far under the matmul rate in mainline llama.cpp); a row all on one GPU lists
    none of them, and an expert-offload row lists the host's bandwidth and matmul rate only."""
    from moesim.ingest.packaged import collected_measurements_csv
    cpu = explain(collected_measurements_csv(), "CPU-n108")["rates"]
    assert cpu["cpu_attn_flops"] < 0.2 * cpu["cpu_flops"] and cpu["host_bw"] > 0
    gpu = explain(collected_measurements_csv(), "AP-n001")["rates"]
    assert not {"host_bw", "cpu_flops", "cpu_attn_flops"} & set(gpu)
    hybrid = explain(collected_measurements_csv(), "LC-n106")["rates"]
    assert {"host_bw", "cpu_flops"} <= set(hybrid) and "cpu_attn_flops" not in hybrid


@pytest.mark.parametrize("row_id,phase", [("AP-n001", "experts"), ("CPU-n108", "attention"), ("AP-n701", "dense_gemm")])
def test_prompt_breakdown_sums_to_the_predicted_prefill(row_id, phase):
    """--explain splits the prompt's seconds by phase (engine.prefill.PREFILL_PHASES); they sum to the prompt
    tokens over the predicted prefill rate, and the phase that should dominate does: the routed experts of
    gpt-oss-20b on a DGX Spark, the per-row walks of a q8_0 KV cache at 16k of depth on a CPU, the dense GEMMs of Llama-3.1-8B."""
    from moesim.engine.prefill import PREFILL_PHASES
    from moesim.ingest.packaged import collected_measurements_csv
    d = explain(collected_measurements_csv(), row_id)
    parts = d["prefill"]["by_phase_s"]
    assert tuple(parts) == PREFILL_PHASES and all(v >= 0 for v in parts.values())
    prompt = d["configuration"]["prompt"]
    assert sum(parts.values()) == pytest.approx(prompt / d["prefill"]["predicted"], rel=1e-9)
    assert max(parts, key=parts.get) == phase
