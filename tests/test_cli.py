"""The command line: one-line errors with exit status 2, JSON fields of DESIGN §4, catalog listings."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moesim.cli import main

FIT_FIELDS = {"model", "quant", "kv_dtype", "context", "batch", "placement", "weights_bytes",
              "weights_bytes_by_class", "kv_bytes_per_token", "kv_bytes", "state_bytes", "memory_by_tier",
              "fits", "max_context", "max_batch"}
MACHINE = ["--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "192"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_json_fields(capsys):
    code, out, err = run(capsys, "fit", "deepseek-r1", *MACHINE, "--quant", "Q4_K_M", "--quant", "Q2_K", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["quant"] for r in rows] == ["Q4_K_M", "Q2_K"]
    for r in rows:
        assert FIT_FIELDS <= set(r)
        assert r["fits"] == "gpu+host+storage"     # 377 GiB of Q4_K_M cannot sit in 24 GB + 192 GB
        assert r["placement"].startswith("n-cpu-moe=")
        assert "--n-cpu-moe" in r["flags"]
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
    assert rows[1]["weights_bytes"] < rows[0]["weights_bytes"]
    assert rows[1]["decode_tok_s"] > rows[0]["decode_tok_s"]     # fewer bytes per token, less spilled to NVMe


def test_fit_small_model_all_gpu(capsys):
    code, out, _ = run(capsys, "fit", "qwen3-30b-a3b", *MACHINE, "--quant", "Q4_K_M", "--json")
    r = json.loads(out)[0]
    assert code == 0 and r["placement"] == "all-gpu" and r["fits"].startswith("gpu")
    assert r["kv_bytes_per_token"] == 98304


def test_fit_table_readable(capsys):
    code, out, _ = run(capsys, "fit", "gpt-oss-120b", "--gpu", "m3-ultra", "--quant", "MXFP4")
    assert code == 0
    assert "unified" in out and "MXFP4_MOE" in out and "max context" in out


@pytest.mark.parametrize("argv, field", [
    (["fit", "deepseek-v3x", *MACHINE], "model"),
    (["fit", "llama-2-7b", *MACHINE, "--context", "-5"], "context"),
    (["fit", "llama-2-7b", *MACHINE, "--batch", "0"], "batch"),
    (["fit", "llama-2-7b", *MACHINE, "--quant", "Q4_K_Q"], "quant"),
    (["fit", "llama-2-7b", *MACHINE, "--quant", "MXFP4_MOE"], "quant"),
    (["fit", "llama-2-7b", "--gpu", "rtx-9090"], "gpu"),
    (["fit", "llama-2-7b", "--gpu", "m3-ultra", "--host", "ddr5-4800x8"], "host"),
    (["fit", "qwen3-30b-a3b", *MACHINE, "--placement", "n-cpu-moe=99"], "placement"),
    (["fit", "llama-2-7b", *MACHINE, "--kv-dtype", "q3_0"], "kv_dtype"),
    (["fit", "llama-2-7b", *MACHINE, "--gpu-mem-gb", "nan"], "usage"),
    (["fit", "llama-2-7b", "--gpus", "0", "--gpu", "rtx-4090", "--host", "ddr5-4800x2"], "gpus"),
    (["fit"], "usage"),
])
def test_bad_input_one_line_exit_2(capsys, argv, field):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("moesim: error: ")
    assert f"{field}:" in err
    assert "Traceback" not in err


def test_unknown_model_suggests_nearest(capsys):
    _, _, err = run(capsys, "fit", "deepseek-v3x", *MACHINE)
    assert "did you mean" in err and "'deepseek-v3'" in err


@pytest.mark.parametrize("command", ["models", "hardware", "quants"])
def test_listings_json(capsys, command):
    code, out, _ = run(capsys, command, "--json")
    data = json.loads(out)
    assert code == 0 and data
    if command == "models":
        ids = {r["id"] for r in data}
        assert {"deepseek-r1", "kimi-k3", "inkling", "gpt-oss-120b", "llama-2-7b"} <= ids
    if command == "hardware":
        assert "rtx-4090" in data["gpu"] and "m3-ultra" in data["unified"]
    if command == "quants":
        assert "Q4_K_M" in data["gguf_ftypes"] and "nvfp4" in data["formats"] and "q8_0" in data["kv_dtypes"]


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "moesim", "fit", "nope-model", "--gpu", "rtx-4090"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("moesim: error: model:")


SIM_FIELDS = {"decode_tok_s", "aggregate_tok_s", "prefill_tok_s", "ttft_s", "tpot_ms", "breakdown", "bottleneck",
              "expert_hit_rate", "distinct_experts_per_step", "bytes_per_token"} | FIT_FIELDS


def test_simulate_json_fields(capsys):
    code, out, err = run(capsys, "simulate", "qwen3-30b-a3b", *MACHINE, "--quant", "Q4_K_M", "--placement",
                         "offload-cache", "--cache-experts", "16", "--batch", "2", "--tokens", "64", "--seed", "7",
                         "--json")
    assert code == 0, err
    d = json.loads(out)
    assert SIM_FIELDS <= set(d)
    assert d["placement"] == "offload-cache=16" and d["batch"] == 2 and d["seed"] == 7
    assert 0 <= d["expert_hit_rate"] <= 1
    assert d["aggregate_tok_s"] == pytest.approx(2 * d["decode_tok_s"])
    code2, out2, _ = run(capsys, "simulate", "qwen3-30b-a3b", *MACHINE, "--quant", "Q4_K_M", "--placement",
                         "offload-cache", "--cache-experts", "16", "--batch", "2", "--tokens", "64", "--seed", "7",
                         "--json")
    assert json.loads(out2) == d                  # same seed, same result


def test_simulate_text_and_analytic(capsys):
    code, out, err = run(capsys, "simulate", "gpt-oss-20b", *MACHINE, "--quant", "MXFP4_MOE", "--mode", "analytic")
    assert code == 0, err
    assert "tok/s" in out and "per sequence" in out and "80 % interval" in out and "bottleneck" in out


@pytest.mark.parametrize("argv,field", [
    (["--policy", "fifo"], "policy"),
    (["--mode", "exact"], "mode"),
    (["--prefetch-recall", "2"], "prefetch_recall"),
    (["--tokens", "0"], "tokens"),
    (["--mode", "analytic", "--policy", "belady"], "policy"),
    (["--trace", "/nonexistent/trace.jsonl"], "trace"),
])
def test_simulate_bad_input_one_line(capsys, argv, field):
    code, out, err = run(capsys, "simulate", "qwen3-30b-a3b", *MACHINE, "--quant", "Q4_K_M", *argv)
    assert code == 2
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


def test_internal_error_is_one_line_unless_moesim_traceback(capsys, monkeypatch):
    """MOESIM_TRACEBACK lets an internal error raise; MOESIM_DEBUG (the bounds-checked build) does not."""
    from moesim import cli

    def boom(args):
        raise RuntimeError("boom")

    monkeypatch.setitem(cli._COMMANDS, "models", boom)
    monkeypatch.delenv("MOESIM_TRACEBACK", raising=False)
    monkeypatch.setenv("MOESIM_DEBUG", "1")
    code, out, err = run(capsys, "models")
    assert code == 3 and err == "moesim: internal error: RuntimeError: boom (set MOESIM_TRACEBACK=1 for a traceback)\n"
    monkeypatch.setenv("MOESIM_TRACEBACK", "0")
    assert run(capsys, "models")[0] == 3
    monkeypatch.setenv("MOESIM_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["models"])
