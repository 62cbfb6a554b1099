"""Validation against measurements and calibration: row building with documented defaults, the
report on ../shared/validation (skipped when absent), the naive roofline, determinism, bounds and a
synthetic round trip (data made by the model with known parameters is fitted back to them)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from moesim.analysis import calibrate as C
from moesim.analysis import validate as V
from moesim.errors import MoesimError
from moesim.report.plots import validation_plot

DATA = Path(__file__).resolve().parents[2] / "shared" / "validation" / "calibration.csv"
COLUMNS = ["id", "quality", "model", "quant", "kv_dtype", "runtime", "gpu", "gpus", "gpu_mem_gb", "host_cpu",
           "host_mem", "host_channels", "host_sockets", "host_cores", "host_mem_gb", "measured_host_bw_gbs", "pcie",
           "parallel", "placement", "prompt_tokens", "depth_tokens", "batch", "mtp", "decode_tok_s",
           "aggregate_tok_s", "prefill_tok_s", "source", "notes"]


def row(**kw) -> dict:
    r = {c: "" for c in COLUMNS}
    r.update(id="LC-99", quality="A", model="qwen3-30b-a3b", quant="Q4_K_M", runtime="llama.cpp", gpu="rtx-4090",
             gpus="1", placement="experts-cpu", batch="1", mtp="0", decode_tok_s="30", source="github.com/x/y test")
    r.update({k: str(v) for k, v in kw.items()})
    return r


def write_csv(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


# ------------------------------------------------------------------------------ building rows
def test_missing_fields_get_documented_defaults():
    cfg = V.build(row(host_cpu="", host_mem="", host_channels="", host_mem_gb=""))
    assert cfg.machine.channels == V.DEFAULTS["channels_desktop"]
    assert cfg.machine.host_mem_bytes == V.DEFAULTS["host_mem_gb"] * 1e9
    assert cfg.context == V.DEFAULTS["context"]
    assert any("channels" in a for a in cfg.assumed) and any("RAM" in a for a in cfg.assumed)
    server = V.build(row(host_cpu="Xeon Gold 6454S", host_mem="ddr5-4800", host_sockets="2"))
    assert server.machine.cpu == "xeon-gold-6454s" and server.machine.channels == 8 and server.machine.sockets == 2


def test_measured_host_bandwidth_is_used():
    cfg = V.build(row(host_mem="ddr4", host_channels="4", measured_host_bw_gbs="102"))
    assert cfg.machine.host_bw_gbs == pytest.approx(102 / V.DEFAULTS["stream_fraction"])


@pytest.mark.parametrize("kw,reason", [
    (dict(parallel="ep72-pd-disagg", gpu="h100-sxm", gpus="72", placement="all-gpu"), "multi-node"),
    (dict(runtime="exo", gpu="m4-pro", gpus="8", placement="unified"), "multi-machine"),
    (dict(model="no-such-model"), "unknown model"),
    (dict(quant="Q9_Z"), "quantization"),
])
def test_rows_that_cannot_be_built_say_why(kw, reason):
    with pytest.raises(V.Skip, match=reason):
        V.build(row(**kw))


def test_unified_and_cpu_only_rows():
    ap = V.build(row(gpu="m3-ultra", host_mem="unified", host_mem_gb="512", placement="unified", quant="mlx-4bit",
                     runtime="mlx"))
    assert ap.machine.unified and ap.machine.gpu_mem_bytes == 512e9
    cpu = V.build(row(gpu="none", gpus="0", host_cpu="Ryzen 9 7950X", host_mem="ddr5", placement="cpu-only",
                      quant="Q4_K_S", model="mixtral-8x7b"))
    assert cpu.machine.n_gpus == 0 and cpu.machine.cpu == "ryzen-9-7950x"


def test_roofline_is_bandwidth_over_active_bytes():
    pr = V.prepare(V.build(row(model="llama-3-8b", placement="all-gpu")))
    weights = sum(pr.low.weights_by_class.values()) - pr.low.embed
    assert pr.roofline_tok_s == pytest.approx(pr.cfg.machine.gpu_bw_gbs * 1e9 / weights, rel=1e-9)
    dec, _ = pr.predict()
    assert dec < pr.roofline_tok_s


def test_validate_report_on_a_small_csv(tmp_path):
    rows = [row(id="LC-1", decode_tok_s="40"), row(id="LC-2", quality="C", decode_tok_s="20"),
            row(id="DC-1", parallel="ep72-pd-disagg", gpu="h100-sxm", gpus="72", placement="all-gpu"),
            row(id="LC-3", decode_tok_s="", prefill_tok_s="")]
    rep = V.validate(write_csv(tmp_path / "v.csv", rows))
    s = rep["summary"]
    assert s["rows_evaluated"] == 2 and {x["id"] for x in s["rows_skipped"]} == {"DC-1", "LC-3"}
    assert s["decode"]["n"] == 1 and s["quality_c"]["decode"]["n"] == 1
    r1 = next(r for r in rep["rows"] if r["id"] == "LC-1")
    assert r1["decode_err"] == pytest.approx(r1["decode_predicted"] / 40 - 1)
    assert "median_abs_pct_err" in s and "p90_abs_pct_err" in s and "by_class" in s
    validation_plot(rep, tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 1000


def test_bad_csv_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model\nx,y\n")
    with pytest.raises(MoesimError, match="lacks column"):
        V.load_rows(bad)
    with pytest.raises(MoesimError, match="cannot read"):
        V.load_rows(tmp_path / "missing.csv")


# ------------------------------------------------------------------------------ the shipped data
@pytest.mark.skipif(not DATA.exists(), reason="../shared/validation not present")
def test_validate_on_shared_measurements():
    rep = V.validate(DATA)
    s = rep["summary"]
    assert s["rows_evaluated"] >= 110
    assert all(sk["reason"] for sk in s["rows_skipped"])
    # better than the peers' one-line roofline by a wide margin, overall and on hybrid (KT) rows
    assert s["decode"]["median_abs_pct_err"] < 0.5 * s["roofline_decode"]["median_abs_pct_err"]
    assert s["by_class"]["KT"]["decode"]["median_abs_pct_err"] < s["by_class"]["KT"]["roofline_decode"]["median_abs_pct_err"]
    assert s["decode"]["median_abs_pct_err"] < 30


# ------------------------------------------------------------------------------ calibration
PARAMS = (C.Param("gddr_bw_eff", 0.3, 1.0), C.Param("host_bw_eff_desktop", 0.2, 1.0),
          C.Param("sync_us", 1.0, 3000.0, "llama.cpp", log=True), C.Param("step_us", 10.0, 50000.0, "llama.cpp", log=True))


def synthetic_rows():
    rows = []
    for i, (mid, quant, pl, gpu, host) in enumerate([
            ("qwen3-30b-a3b", "Q4_K_M", "experts-cpu", "rtx-4090", "ddr5-6000x2"),
            ("qwen3-30b-a3b", "Q4_K_M", "n-cpu-moe=24", "rtx-3090", "ddr4-3200x2"),
            ("qwen3-30b-a3b", "Q8_0", "all-gpu", "rtx-pro-6000", "ddr5-6000x2"),
            ("gpt-oss-20b", "MXFP4", "all-gpu", "rtx-4090", "ddr5-6000x2"),
            ("gpt-oss-20b", "MXFP4", "experts-cpu", "rtx-3090", "ddr5-4800x2"),
            ("gpt-oss-120b", "MXFP4", "n-cpu-moe=30", "rtx-5090", "ddr5-6000x2"),
            ("llama-3-8b", "Q4_K_M", "all-gpu", "rtx-3090", "ddr4-3200x2"),
            ("mixtral-8x7b", "Q4_K_M", "experts-cpu", "rtx-4090", "ddr5-5600x2"),
            ("deepseek-v2-lite", "Q4_K_M", "experts-cpu", "rtx-2080", "ddr4-3200x2")]):
        part, ch = host.split("x")
        rows.append(row(id=f"LC-{i}", model=mid, quant=quant, placement=pl, gpu=gpu, host_mem=part,
                        host_channels=ch, host_mem_gb="256", source=f"github.com/s{i % 3}/r test"))
    prepared = [V.prepare(V.build(r), calibrated=False) for r in rows]
    return prepared


def test_calibration_recovers_known_parameters():
    prepared = synthetic_rows()
    model = C.Model(prepared, PARAMS)
    truth = np.array([0.62, 0.55, 150.0, 900.0])
    for pr, (dec, _) in zip(prepared, model.predict(truth)):
        pr.cfg.row["decode_tok_s"] = str(dec)
        pr.cfg.row["prefill_tok_s"] = ""
    got = C.fit(model, list(range(len(prepared))), prior_weight=0.0)
    assert np.all(np.abs(np.log(got / truth)) < 0.02), (got, truth)
    for p, v in zip(PARAMS, got):
        assert p.lo <= v <= p.hi


def test_calibration_is_deterministic_and_bounded():
    prepared = synthetic_rows()
    model = C.Model(prepared, PARAMS)
    for pr, (dec, _) in zip(prepared, model.predict(np.array([0.3, 0.2, 1.0, 10.0]))):
        pr.cfg.row["decode_tok_s"] = str(dec * 0.2)     # faster than any physical parameter allows
    a = C.fit(model, list(range(len(prepared))))
    b = C.fit(model, list(range(len(prepared))))
    assert np.array_equal(a, b)
    for p, v in zip(PARAMS, a):
        assert p.lo <= v <= p.hi
    assert a[0] == pytest.approx(0.3) and a[1] == pytest.approx(0.2)   # pinned at the physical bounds


def test_calibration_file_is_layered_over_priors(tmp_path, monkeypatch):
    from moesim.spec import runtimes
    report = {"params": {"gpu_bw_eff": 0.5, "llama.cpp.sync_us": 123.0},
              "priors": {"gpu_bw_eff": 0.8, "llama.cpp.sync_us": 20.0},
              "bounds": {"gpu_bw_eff": [0.3, 1.0], "llama.cpp.sync_us": [1, 3000]},
              "rows_fitted": 10, "in_sample": {"decode": {"median_abs_pct_err": 5.0}},
              "priors_error": {"decode": {"median_abs_pct_err": 9.0}}}
    out = tmp_path / "calibration.toml"
    C.write_toml(report, out, "moesim calibrate test.csv")
    import tomllib
    cal = tomllib.loads(out.read_text())
    monkeypatch.setattr(runtimes, "calibration", lambda: cal)
    assert runtimes.runtime("llama.cpp").decode.sync_us == 123.0
    assert runtimes.runtime("vllm").decode.gpu_bw_eff == 0.5
    assert runtimes.runtime("vllm").decode.sync_us == runtimes.decode_priors("vllm")["sync_us"]
    assert runtimes.runtime("llama.cpp", calibrated=False).decode.sync_us == 20.0


# ------------------------------------------------------------------------------ command line
def test_validate_and_calibrate_commands(tmp_path, capsys):
    import json
    from moesim.cli import main
    rows = [row(id=f"LC-{i}", decode_tok_s=str(20 + 5 * i), source=f"github.com/s{i % 3}/r doc") for i in range(6)]
    data = write_csv(tmp_path / "v.csv", rows)
    assert main(["validate", str(data), "--json", "--plot", str(tmp_path / "p.png")]) == 0
    rep = json.loads(capsys.readouterr().out)
    s = rep["summary"]
    for key in ("median_abs_pct_err", "p90_abs_pct_err", "by_class", "rows_evaluated", "rows_skipped"):
        assert key in s
    assert s["rows_evaluated"] == 6 and (tmp_path / "p.png").exists()
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(data), "--no-cv", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "decode median |err|" in text and out.read_text().startswith("# Fitted decode parameters")
    # --rows: the leave-one-source-out rows the [intervals] of --out are built from, the command in both
    loso = tmp_path / "loso.json"
    assert main(["calibrate", str(data), "--out", str(out), "--rows", str(loso), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    stored = json.loads(loso.read_text())
    assert stored["rows"] == rep["intervals"]["rows"] and len(stored["rows"]) == 6
    assert f'command = "{stored["command"]}"' in out.read_text() and "--rows" in stored["command"]
    assert main(["calibrate", str(data), "--no-cv", "--rows", str(loso)]) == 2
    assert "rows" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_runs_date_picks_the_llama_cpp_build_era():
    """A llama.cpp row is modelled by the profile of its build's era whether its notes, its date column or its
    source document dates it (row_notes.row_month): before June 2024 llama.cpp-2024h1, before 2024 the 2023
    profile, an undated row and a later one the current profile."""
    apple = dict(gpu="m2-ultra", placement="unified", host_mem="unified", quant="Q8_0", model="qwen2.5-7b")
    assert V.build(row(**apple, date="2024-03-03")).runtime == "llama.cpp-2024h1"
    assert V.build(row(**apple, date="2023-09-09")).runtime == "llama.cpp-2023"
    assert V.build(row(**apple, date="2025-08-27")).runtime == "llama.cpp"
    assert V.build(row(**apple)).runtime == "llama.cpp"
    # the shared corpus's XiongjieDai rows state no month of their own; the document's tables are of May 2024
    xdb = "github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference README Overview tables"
    assert V.build(row(**apple, source=xdb)).runtime == "llama.cpp-2024h1"


def test_notes_and_depth_shape_the_configuration():
    """llama-bench -d rows (depth beyond the prompt) prefill on top of the depth; a stated -ub sets
    the ubatch; ktransformers v0.2 / v0.3 rows run the pre-SGLang profile (no layerwise prefill)."""
    bench = V.build(row(prompt_tokens="2048", depth_tokens="32768", notes="fa 1; ub 2048; pp2048 at depth 32768"))
    assert bench.prompt_depth == 32768 and bench.ubatch == 2048
    assert V.prepare(bench).rt.ubatch == 2048
    # llama-bench's own column name states the ubatch too (n_ubatch 2048: 92 collected rows were read as the default)
    assert V.build(row(prompt_tokens="2048", notes="llama-bench build 6918; n_ubatch 2048; fa 1")).ubatch == 2048
    server = V.build(row(prompt_tokens="2048", depth_tokens="2048", notes="amb 512; 16 threads"))
    assert server.prompt_depth == 0 and server.ubatch == 0
    kt = dict(runtime="ktransformers", model="deepseek-v3", quant="int8", gpu="rtx-4090", placement="experts-cpu",
              host_cpu="Xeon Gold 6454S", host_mem="ddr5-4800", host_sockets="2")
    assert V.build(row(**kt, notes="v0.3-preview AMX")).runtime == "ktransformers-legacy"
    assert V.build(row(**kt, notes="SGLang + kt-kernel")).runtime == "ktransformers"
    assert V.build(row(notes="May 2024; -ngl all")).runtime == "llama.cpp-2024h1"
    assert V.build(row(notes="b6918; fa 1")).runtime == "llama.cpp"
    legacy = V.prepare(V.build(row(**kt, notes="v0.3-preview AMX", prompt_tokens="8192")))
    assert legacy.dm["layerwise_prefill"] == 0
    kt_fp8 = dict(kt, quant="fp8", prompt_tokens="2048")
    stated = V.prepare(V.build(row(**kt_fp8, notes="SGLang + kt-kernel; GPU prefill threshold 2048")))
    default = V.prepare(V.build(row(**kt_fp8, notes="SGLang + kt-kernel")))
    assert stated.cfg.kt_threshold == 2048 and stated.dm["layerwise_prefill"] == 2048
    assert default.dm["layerwise_prefill"] == 4096
    model = C.Model([stated, default])
    assert [model.runtime_for(i, C.prior_vector()).decode.layerwise_prefill_tokens for i in (0, 1)] == [2048, 4096]
    cpu = dict(gpu="none", gpus="0", host_cpu="Ryzen 9 7950X", host_mem="ddr5", host_channels="2", host_cores="16",
               placement="cpu-only", quant="Q4_K_S", model="mixtral-8x7b", prompt_tokens="512")
    four, sixteen = (V.prepare(V.build(row(**cpu, notes=f"pp512 16 threads; tg128 {n} threads"))) for n in (4, 16))
    assert four.cfg.decode_threads == 4 and four.cfg.machine.cores == 16
    (d4, p4), (d16, p16) = four.predict(), sixteen.predict()
    assert d4 < d16 and p4 == pytest.approx(p16, rel=1e-12)     # 4 threads cannot stream 2 channels; prompt on 16


def test_notes_set_chunked_prefill_and_an_avx2_build():
    """"chunked prefill N" sets SGLang's chunk under ktransformers (kept by the calibration model);
    "AVX2" says the CPU build had no AVX-512 / AMX kernels: on Zen 4 (AVX-512 double-pumped on 256-bit FMA
    pipes) that costs no FMA throughput, on Zen 5's 512-bit pipes it halves the SIMD rate."""
    kt = dict(runtime="ktransformers", model="deepseek-v3", quant="int8", gpu="rtx-4090", placement="experts-cpu",
              host_cpu="Xeon Gold 6454S", host_mem="ddr5-4800", host_sockets="2", prompt_tokens="1024")
    chunked = V.prepare(V.build(row(**kt, notes="SGLang + kt-kernel; chunked prefill 4096")))
    assert chunked.cfg.kt_chunk == 4096 and chunked.rt.decode.layerwise_chunk_tokens == 4096
    assert C.Model([chunked]).runtime_for(0, C.prior_vector()).decode.layerwise_chunk_tokens == 4096
    cpu = dict(gpu="none", gpus="0", host_cpu="Ryzen 9 7950X", host_mem="ddr5", host_channels="2", host_cores="16",
               placement="cpu-only", quant="Q4_K_S", model="mixtral-8x7b", prompt_tokens="512")
    avx2, native = (V.build(row(**cpu, notes=n)) for n in ("July 2024; AVX2; pp512 16 threads", "July 2024; pp512 16 threads"))
    assert avx2.machine.cpu_isa == ("avx2",) and "avx512" in native.machine.cpu_isa
    assert V.prepare(avx2).predict()[1] == pytest.approx(V.prepare(native).predict()[1], rel=1e-12)
    zen5 = dict(cpu, host_cpu="EPYC 9355", host_mem="ddr5-6400", host_channels="12", host_cores="32")
    avx2, native = (V.build(row(**zen5, notes=n)) for n in ("July 2024; AVX2; pp512 32 threads", "July 2024; pp512 32 threads"))
    assert V.prepare(avx2).predict()[1] < 0.6 * V.prepare(native).predict()[1]


def test_parameter_resting_on_fewer_than_two_sources_keeps_its_prior():
    """issue 14: no fitted parameter rests on fewer than 2 sources. The same rows from one source leave
    every parameter at its prior; spread over three sources they are fitted."""
    prepared = synthetic_rows()
    model = C.Model(prepared, PARAMS)
    truth = np.array([0.62, 0.55, 150.0, 900.0])
    for pr, (dec, _) in zip(prepared, model.predict(truth)):
        pr.cfg.row["decode_tok_s"] = str(dec)
    idx = list(range(len(prepared)))
    spread = C.fit(model, idx)
    assert np.all(spread != C.prior_vector(PARAMS))
    for pr in prepared:
        pr.cfg.row["source"] = "github.com/s0/r test"
    assert all(len(src) == 1 for _, src in C.support(model, C.prior_vector(PARAMS), idx))
    assert np.array_equal(C.fit(model, idx), C.prior_vector(PARAMS))


def test_support_names_the_rows_a_parameter_moves():
    """Host DRAM bandwidth sets the decode of rows with experts in host memory, not of a dense model held
    on the GPU; every row depends on the llama.cpp per-step cost."""
    prepared = synthetic_rows()
    model = C.Model(prepared, PARAMS)
    idx = list(range(len(prepared)))
    for pr in prepared:
        pr.cfg.row["decode_tok_s"] = "10"
    sup = C.support(model, C.prior_vector(PARAMS), idx)
    host_rows = set(sup[1][0])
    ids = {prepared[i].cfg.row["id"]: i for i in idx}
    assert ids["LC-0"] in host_rows and ids["LC-7"] in host_rows      # experts-cpu
    assert ids["LC-6"] not in host_rows and ids["LC-2"] not in host_rows   # all on the GPU
    assert len(sup[1][1]) >= 2 and all(0 < len(rows) <= len(idx) for rows, _ in sup)


def test_shipped_calibration_fits_no_parameter_on_fewer_than_two_sources():
    """Every parameter calibration.toml sets was fitted on rows of at least two sources (its [support])."""
    from moesim.spec.runtimes import calibration
    cal = calibration()
    sup = cal["support"]
    written = [k for k in cal["params"]] + [f"{fam}.{k}" for fam, vals in cal.get("runtime", {}).items() for k in vals]
    assert written
    for name in written:
        assert sup[name]["fitted"] and sup[name]["sources"] >= C.MIN_SOURCES, name
    assert all(s["fitted"] == (s["sources"] >= C.MIN_SOURCES) for s in sup.values())


@pytest.mark.parametrize("rid", ["CPU-n104", "AP-n007", "AP-n205", "LC-n106", "LC-n204"])
def test_the_calibration_model_keeps_each_rows_settings(rid):
    """calibrate refits every row with the priors swapped for the trial parameters; the row's own settings
    (flash attention off, its build's CUDA-graph batch limit and delta-net recurrence, -rtr) stay, so at the
    priors the fit predicts exactly what ``moesim validate --uncalibrated`` does (it once dropped them: the
    held-out figures judged those rows without the physics validate gives them)."""
    import moesim
    rows = {r["id"]: r for r in V.load_rows(Path(moesim.__file__).parent / "data" / "measurements_collected.csv")}
    pr = V.prepare(V.build(rows[rid]), calibrated=False)
    settings = V.row_decode_settings(pr.cfg, pr.rt.decode)
    assert settings and all(getattr(pr.rt.decode, k) == v for k, v in settings.items())
    decode, prefill = C.Model([pr]).predict(C.prior_vector())[0]
    want = V.predict_row(pr)
    assert decode == pytest.approx(want.decode, rel=1e-9)
    assert (prefill is None and want.prefill is None) or prefill == pytest.approx(want.prefill, rel=1e-9)


def test_validate_prints_a_prefill_only_file(tmp_path, capsys):
    """A file whose rows measure only prompts (no decode rate) reports its prefill errors and '-' for the decode
    summaries it has no rows for, rather than failing on the empty ones."""
    from moesim.cli import main
    data = tmp_path / "prefill.csv"
    write_csv(data, [row(id="AP-91", decode_tok_s="", prefill_tok_s="2000", prompt_tokens="2048", gpu="m2-ultra",
                         placement="unified", host_mem="unified", quant="Q8_0")])
    assert main(["validate", str(data)]) == 0
    out = capsys.readouterr().out
    assert "decode median |err| -, p90 - (0 rows); prefill median" in out and "(1 rows)" in out
