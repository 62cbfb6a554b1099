"""What a fresh clone or an installed wheel carries: the measurement corpus and the sample trace as package
data (found by importlib.resources, listed in pyproject's package-data), both re-derivable from their
sources; ``validate``/``calibrate`` with no CSV and ``simulate --trace sample`` run on them."""
from __future__ import annotations

import csv
import fnmatch
import importlib.util
import json
import math
import re
import sys
from importlib import resources
from pathlib import Path

import pytest

from moesim.cli import main
from moesim.analysis import validate as V
from moesim.analysis import row_notes
from moesim.ingest import packaged, traces

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "moesim"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _tool():
    spec = importlib.util.spec_from_file_location("make_package_data", ROOT / "tools" / "make_package_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_resources_are_found_in_the_package():
    data = resources.files("moesim").joinpath("data")
    for name in (packaged.MEASUREMENTS, packaged.SAMPLE_TRACE, "README.md"):
        assert data.joinpath(name).is_file(), name
    assert Path(packaged.measurements_csv()).name == "measurements.csv"
    assert packaged.trace_path("sample") == packaged.sample_trace() and packaged.trace_path("x.jsonl") == "x.jsonl"


def test_pyproject_package_data_covers_every_data_file():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pp["tool"]["setuptools"]["package-data"]["moesim"]
    for folder in ("data", "catalog"):
        for f in (PACKAGE / folder).iterdir():
            rel = f"{folder}/{f.name}"
            assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} would be left out of the wheel"
    proj = pp["project"]
    assert proj["license"] == "MIT" and proj["license-files"] == ["LICENSE"]
    assert proj["authors"] == [{"name": "moesim developers"}] and proj["readme"] == "README.md"
    assert proj["classifiers"] and proj["keywords"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_measurements_are_the_corpus_plus_url_and_date():
    tool = _tool()
    with open(packaged.measurements_csv(), newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        assert reader.fieldnames[-2:] == ["source_url", "date"]
    assert len(rows) > 100 and len({r["id"] for r in rows}) == len(rows)
    collected = {r["id"] for r in tool.collected_rows()}
    for r in rows:
        assert r["source_url"] == "" or r["source_url"].startswith("https://")
        if r["id"] not in collected:      # the shared corpus's rows: url and date derived from source and notes
            assert r["source_url"] == tool.source_url(r["source"])
            assert r["date"] == tool.stated_date(r["source"], r["notes"])
    assert tool.source_url("llama.cpp commit 'x' (mirror git.djapps.eu)") == "https://git.djapps.eu"
    assert tool.source_url("ik_llama.cpp wiki July 2024") == ""
    assert tool.stated_date("lmsys.org/blog/2025-05-05-large-scale-ep", "") == "2025-05-05"
    assert tool.stated_date("x", "May 2024; -ngl all") == "2024-05"
    shared = next((p for p in tool.VALIDATION_CANDIDATES if p.exists()), None)
    if shared is None:
        pytest.skip("../shared/validation not present")
    assert Path(packaged.measurements_csv()).read_text(encoding="utf-8") == tool.measurements_text(shared)


def test_validate_and_calibrate_default_to_the_packaged_corpus(capsys, monkeypatch):
    assert main(["validate", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["summary"]["rows_evaluated"] > 100
    assert rep["summary"]["median_abs_pct_err"] < 25
    from moesim import MoesimError
    from moesim.analysis import calibrate as C

    def stop_at_the_fit(path, **kw):        # the fit itself is covered by tests/test_validate.py
        raise MoesimError(f"would fit {path}", "data")
    monkeypatch.setattr(C, "calibrate", stop_at_the_fit)
    assert main(["calibrate", "--no-cv"]) == 2
    assert f"would fit {packaged.measurements_csv()}" in capsys.readouterr().err


def test_sample_trace_is_derived_from_the_fitted_profile():
    text = Path(packaged.sample_trace()).read_text(encoding="utf-8")
    assert text == _tool().sample_trace_text()                # moesim's sampler, not a copied recording
    meta = json.loads(text.splitlines()[0])
    assert meta["synthetic"] is True and "gpt-oss" in meta["note"]
    tr = traces.load(packaged.sample_trace())
    assert len(tr.requests) == 3 and tr.requests[0].shape == (32, 24, 4) and tr.top_k == 4
    assert tr.n_experts == 32


def test_simulate_replays_the_sample_trace(capsys):
    argv = ["simulate", "gpt-oss-20b", "--machine", "desktop-4090", "--quant", "MXFP4_MOE", "--placement",
            "offload-cache=8", "--tokens", "64", "--json"]
    assert main(argv + ["--trace", "sample"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["routing"].startswith("trace") and 0 < d["expert_hit_rate"] < 1


# ------------------------------------------------------------ the project's own measurements (measurements_collected.csv)
_ISO_DATE = re.compile(r"^20[12]\d-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$")
_WEB_ADDRESS = re.compile(r"^https://[a-z0-9-]+(\.[a-z0-9-]+)+(/\S*)?$", re.I)
# what makes two rows the same measured run (the notes, quality and values aside)
_CONFIG = ("source", "model", "quant", "kv_dtype", "runtime", "gpu", "gpus", "gpu_mem_gb", "host_cpu", "host_mem",
           "host_cores", "parallel", "placement", "prompt_tokens", "depth_tokens", "batch", "mtp")


def _collected():
    return _tool().collected_rows()


def test_collected_rows_name_their_source_web_address_and_date():
    rows = _collected()
    assert len(rows) >= 30
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"].strip() and _WEB_ADDRESS.match(r["source_url"]), r["id"]
        assert _ISO_DATE.match(r["date"]), (r["id"], r["date"])
        # a row found not to be a steady-state measurement after it was collected stays as quality C, saying why
        assert r["quality"] in ("A", "B") or (r["quality"] == "C" and "quality C: " in r["notes"]), r["id"]
        assert V.row_class(r) in V.CLASSES, r["id"]
        assert r["decode_tok_s"] or r["prefill_tok_s"], r["id"]
        assert r["notes"].strip(), r["id"]


def test_collected_rows_repeat_no_measured_run():
    ours = {r["id"] for r in _collected()}
    with open(packaged.measurements_csv(), newline="", encoding="utf-8") as fh:
        seen = {tuple(r[c] for c in _CONFIG) for r in csv.DictReader(fh) if r["id"] not in ours}
    for r in _collected():
        key = tuple(r[c] for c in _CONFIG)
        assert key not in seen, r["id"]
        seen.add(key)


def test_collected_rows_resolve_in_the_catalog():
    from moesim._catalog import load
    from moesim.ingest import model
    from moesim.spec import quants
    from moesim.spec.runtimes import runtime
    hw = load("hardware")
    for r in _collected():
        m = model(r["model"])
        quants.resolve(r["quant"], m)
        runtime(row_notes.RUNTIME_ALIASES.get(r["runtime"], r["runtime"]))
        assert r["gpu"] == "none" or r["gpu"] in hw["gpu"] or r["gpu"] in hw["unified"], r["id"]
        if r["host_cpu"]:
            assert V._cpu_id(r["host_cpu"]), (r["id"], r["host_cpu"])


def test_every_collected_row_is_simulated():
    rows = _collected()
    _, records, skipped = V.evaluate_rows(rows)
    assert skipped == []
    assert len(records) == len(rows)
    for rec in records:
        for key in ("decode_predicted", "prefill_predicted"):
            assert rec[key] is None or (math.isfinite(rec[key]) and rec[key] > 0), rec["id"]
