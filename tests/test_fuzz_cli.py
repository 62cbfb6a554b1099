"""Fuzzing the command line with counts (conftest.fuzz_count): ``moesim.cli.main(argv)`` in-process with
hostile argv for every subcommand: wrong types, NaN/inf, negatives, huge integers (2^31, 2^63, 1e300),
unknown ids and paths, unknown flags, contradictory flags. Each run exits 0 with output (JSON that
parses, without NaN, under --json), or exits 2 with moesim's one-line ``moesim: error: <field>: ...``
on stderr; never a traceback, an ``internal error`` line (exit 3) or another exit status."""
from __future__ import annotations

import contextlib
import io
import json
import random

import pytest

from conftest import bounded, fuzz_count
from moesim.cli import main
from test_fuzz_measurements import seed_csv
from test_fuzz_sweep import SEED_TOML
from test_fuzz_traces import SEEDS as TRACE_SEEDS
from test_ingest import small_gguf  # noqa: F401  (a fixture)
from test_site import SMALL_TOML

pytestmark = pytest.mark.fuzz
RANK_FAMILIES = ["family=olmoe", "family=mixtral", "family=phimoe", "family=dbrx"]
NUM = ["-1", "0", "1", "2", "7", "3.5", "nan", "inf", "-inf", "1e300", "2147483648", "9223372036854775808",
       "18446744073709551616", "x", "", "1_0", "\u0663", " 5", "0x10", "-0", "--json"]
MODELS = ["qwen3-30b-a3b", "llama-3-8b", "deepseek-v2-lite", "mixtral-8x7b", "gpt-oss-20b", "nope", "../x", ""]
MACHINE_FLAGS = {
    "--machine": ["desktop-4090", "dgx-h200", "m3-ultra-512", "nope", ""],
    "--gpu": ["rtx-4090", "h100", "m3-ultra", "rtx-9090", "none", ""], "--gpus": NUM, "--gpu-mem-gb": NUM,
    "--host": ["ddr5-6000x2", "ddr4-3200x99", "ddr5-6000xx", "ddr9-1x1", "x"], "--sockets": NUM, "--cores": NUM,
    "--host-mem-gb": NUM, "--pcie": ["gen4x16", "gen9x99", "x"], "--storage": ["nvme-gen4", "none", "floppy"],
    "--cpu": ["xeon-gold-6454s", "nope"], "--gpu-bw-gbs": NUM + ["1008", "1e-9"], "--gpu-tflops": NUM + ["165", "1e-9"],
}
MACHINE_FLAGS["--machine"] = MACHINE_FLAGS["--machine"] + ["local", "LOCAL", " local"]
BASE_MACHINES = [["--gpu", "rtx-4090"], ["--machine", "desktop-4090"], ["--machine", "dgx-h200"], ["--machine", "local"],
                 ["--gpu", "rtx-3090", "--host", "ddr4-3200x2"], ["--host", "ddr5-4800x8"], ["--gpu", "m3-ultra"]]
QUANT = ["Q4_K_M", "Q8_0", "MXFP4", "fp8", "native", "zz", ""]
SPEED = {"--parallel": ["tp2", "ep8", "tp4-ep4", "tp2147483648", "tp0", "layer-split", "zz"],
         "--policy": ["lru", "lfu", "static", "belady", "zz"], "--cache-experts": NUM,
         "--prefetch-recall": NUM, "--routing": ["qwen3", "qwen", "gpt-oss", "nope"], "--mtp-acceptance": NUM,
         "--redundant-experts": NUM}
COMMON = {"--context": NUM, "--batch": NUM, "--kv-dtype": ["f16", "q8_0", "fp8", "zz"], "--mtp": NUM,
          "--placement": ["auto", "all-gpu", "experts-cpu", "n-cpu-moe=3", "n-cpu-moe=-1", "layers-gpu=999",
                          "offload-cache", "offload-cache=x", "bogus"],
          "--runtime": ["llama.cpp", "vllm", "mlx", "ktransformers", "nope"], "--allow-beyond-max-context": None,
          "-ot": [r"\.ffn_.*_exps\.=CPU", "(=CPU", "exps=GPU9", "noequals", "=", ""], "--json": None}
FLAGS = {
    "fit": {**MACHINE_FLAGS, **COMMON, **SPEED, "--quant": ["Q4_K_M", "Q8_0", "MXFP4", "fp8", "zz", ""]},
    "simulate": {**MACHINE_FLAGS, **COMMON, **SPEED, "--quant": ["native", "Q4_K_M", "zz"], "--prompt": NUM,
                 "--tokens": ["8", "64", *NUM], "--warmup": NUM, "--seed": NUM,
                 "--mode": ["montecarlo", "analytic", "x"], "--trace": ["@trace", "/nonexistent.jsonl"]},
    "inspect": {"-ot": COMMON["-ot"], "--cpu-moe": None, "--n-cpu-moe": NUM, "-ngl": NUM,
                "--device": ["CUDA0", "CPU", ""], "--context": NUM, "--kv-dtype": COMMON["--kv-dtype"],
                "--tensors": None, "--json": None},
    "validate": {"--uncalibrated": None, "--json": None, "--plot": ["@missing/f.png", "@dir", "@f.xyz"]},
    # a calibration that runs costs 10-20 s, so calibrate gets inputs it refuses (its fit: test_validate.py)
    "calibrate": {"--no-cv": None, "--json": None, "--out": ["@missing/c.toml", "@dir", "@c.toml"]},
    "sweep": {"--format": ["parquet", "csv", "jsonl", "xml", ""], "--threads": NUM, "--json": None,
              "--local-workers": ["0", "-1", "x", "nan", "4097", "2147483648"], "--progress": None,
              "--no-progress": None},
    "models": {"--json": None}, "hardware": {"--json": None}, "quants": {"--json": None},
    # rank always carries a family filter of a few models (_argv adds one): the whole catalog is ~10 s
    "rank": {**MACHINE_FLAGS, "--by": ["speed", "context", "quality", "params", "SPEED", "zz", ""],
             "--filter": [*RANK_FAMILIES, "family=zz", "family=", "min-context=4096", "min-context=-1",
                          "min-context=1e300", "min-tps=10", "min-tps=nan", "min-tps=-inf", "family=olmoe,min-tps=1",
                          "colour=red", "noequals", ","],
             "--context": NUM, "--batch": NUM, "--runtime": COMMON["--runtime"] + ["sglang", "trtllm"],
             "--kv-dtype": COMMON["--kv-dtype"], "--limit": NUM, "--json": None},
    "compare": {**MACHINE_FLAGS, "--quant": QUANT, "--context": NUM, "--allow-beyond-max-context": None,
                "--batch": NUM, "--prompt": NUM, "--kv-dtype": COMMON["--kv-dtype"], "--placement": COMMON["--placement"],
                "--runtime": COMMON["--runtime"], "--mode": ["analytic", "montecarlo", "x"], "--json": None},
    "plan": {**MACHINE_FLAGS, "--quant": QUANT, "--kv-dtype": COMMON["--kv-dtype"], "--context": NUM,
             "--placement": COMMON["--placement"], "--runtime": COMMON["--runtime"] + ["sglang"], "--batch": NUM,
             "--json": None},
    "export-site": {"--threads": NUM, "--json": None},
    "serve-sim": {**MACHINE_FLAGS, "--quant": QUANT, "--kv-dtype": COMMON["--kv-dtype"],
                  "--placement": COMMON["--placement"], "--runtime": COMMON["--runtime"] + ["sglang", "trtllm"],
                  "--parallel": SPEED["--parallel"], "--routing": SPEED["--routing"], "--rate": NUM + ["0.5", "1e-12"],
                  "--concurrency": NUM, "--sweep-concurrency": ["1,2", "4", "0,1", "x", "", "2147483648"],
                  "--isl": NUM, "--osl": NUM, "--max-num-batched-tokens": NUM, "--max-num-seqs": NUM,
                  "--requests": NUM, "--seed": NUM, "--slo-ttft-ms": NUM, "--slo-tpot-ms": NUM,
                  "--prefix-tokens": NUM + ["48"], "--json": None},
}
INTS = ["512,4096", "4096", "0", "-1", "1,2", "x", "", ",", "512,,4096", "2147483648", "1e3", "4096,4096"]
# plot KIND: each kind's flags (--out is added by _argv: a tmp file, or now and then one that cannot be written)
PLOT = {
    "context": {**MACHINE_FLAGS, "--quant": QUANT, "--contexts": INTS, "--batch": NUM,
                "--runtime": COMMON["--runtime"] + ["auto"]},
    "heatmap": {"--models": ["qwen3-30b-a3b", "qwen3-30b-a3b,gpt-oss-20b", "nope", "", ",", "olmoe-1b-7b,,"],
                "--machines": ["desktop-4090", "desktop-4090,dgx-h200", "local", "nope", "", "local,desktop-4090"],
                "--metric": ["max_context", "decode_tok_s", "zz", ""], "--quant": QUANT, "--context": NUM,
                "--runtime": COMMON["--runtime"] + ["auto"]},
    "breakdown": {**MACHINE_FLAGS, "--placement": COMMON["--placement"], "--quant": QUANT, "--context": NUM,
                  "--runtime": COMMON["--runtime"]},
    "cache": {**MACHINE_FLAGS, "--cache-sizes": INTS, "--policy": SPEED["--policy"],
              "--mode": ["analytic", "montecarlo", "x"], "--tokens": ["8", "16", *NUM], "--quant": QUANT,
              "--context": NUM},
    "offload-cliff": {**MACHINE_FLAGS, "--quant": QUANT, "--n-cpu-moe": INTS, "--context": NUM,
                      "--runtime": COMMON["--runtime"] + ["auto"]},
    "validation": {"--uncalibrated": None},
}
# the grid each kind is cut to when the case gives no such flag (a default grid costs seconds)
PLOT_SMALL = {"context": ["--contexts", "512,4096", "--quant", "Q4_K_M"], "cache": ["--cache-sizes", "8,32"],
              "offload-cliff": ["--n-cpu-moe", "0,24"], "breakdown": ["--placement", "all-gpu"]}
PLOT_OUT = ["@plot.svg"] * 12 + ["@plot.png", "@missing/f.png", "@dir", "@f.xyz", ""]
FLAGS.update({f"plot {k}": v for k, v in PLOT.items()})
POSITIONAL = {"fit": MODELS + ["@gguf", "@config"], "simulate": MODELS + ["@gguf"],
              "inspect": ["@gguf", "@config", "@csv", "/nonexistent.gguf", "@dir", "qwen3-30b-a3b"],
              "validate": ["@csv", "@bad.csv", "@gguf", "@dir"],
              "calibrate": ["@bad.csv", "@gguf", "/nonexistent.csv", "@dir"],
              "sweep": ["@spec", "@bad.toml", "@csv", "/nonexistent.toml"],
              "compare": MODELS[:5] + ["@gguf", "@config", "nope", "qwen3-30b-a3b gpt-oss-20b", "olmoe-1b-7b olmoe-1b-7b"],
              "plan": MODELS + ["olmoe-1b-7b", "@gguf"],
              "plot context": MODELS + ["@gguf"], "plot breakdown": MODELS + ["@gguf"],
              "plot cache": MODELS + ["@config"], "plot offload-cliff": MODELS + ["@gguf"],
              "plot validation": ["@csv", "@bad.csv", "@gguf", "@dir"],
              "export-site": ["@site", "@badsite", "@spec", "@csv", "/nonexistent.toml", "@dir"],
              "serve-sim": MODELS + ["@gguf", "@config"]}
SITE_OUT = ["@site0", "@site1", "@site2"] * 4 + ["@dir", "@csv", "/proc/site", "@under-file", ""]
# (never a missing absolute folder for export-site: it makes the folder with its parents, outside the
# test's tmp folder)
CONTRADICTIONS = [["--machine", "dgx-h200", "--gpu", "rtx-4090"], ["--placement", "all-gpu", "-ot", "exps=CPU"],
                  ["--context", "999999999", "--allow-beyond-max-context"], ["--gpus", "0", "--gpu", "h100"],
                  ["--gpu", "m3-ultra", "--host", "ddr5-4800x8"], ["--cpu-moe", "--n-cpu-moe", "3"],
                  ["--scheduler", "tcp://127.0.0.1:1", "--local-workers", "2"], ["--progress", "--no-progress"]]
JUNK = ["--bogus", "-x", "--", "extra", "--json=1", "--help", "--version", "-", "\x00"]
# relative weights: fit and simulate are the interesting surface, calibrate the costly one
WEIGHTS = {"fit": 6, "simulate": 6, "inspect": 5, "validate": 2, "sweep": 3, "calibrate": 0.3, "models": 0.3,
           "hardware": 0.3, "quants": 0.3, "rank": 1, "compare": 3, "plan": 1, "plot context": 0.7,
           "plot heatmap": 0.7, "plot breakdown": 0.7, "plot cache": 0.7, "plot offload-cliff": 0.7,
           "plot validation": 0.2, "export-site": 0.7, "serve-sim": 2}


@pytest.fixture(scope="module")
def files(small_gguf, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("cli")
    (d / "m.csv").write_text(seed_csv())
    (d / "bad.csv").write_text(seed_csv().replace(",150,", ",inf,").replace("qwen3", "qwen9"))
    (d / "spec.toml").write_bytes(SEED_TOML)
    (d / "bad.toml").write_bytes(SEED_TOML.replace(b"num = 3", b"num = 9999999999"))
    (d / "trace.jsonl").write_bytes(TRACE_SEEDS[".jsonl"]())
    (d / "site.toml").write_text(SMALL_TOML)
    (d / "badsite.toml").write_text(SMALL_TOML.replace('title = "small"', 'title = "small"\ncolour = 3'))
    (d / "cfg").mkdir()
    (d / "cfg" / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 128, "intermediate_size": 512,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000, "max_position_embeddings": 4096}))
    return {"@gguf": str(small_gguf), "@config": str(d / "cfg" / "config.json"), "@csv": str(d / "m.csv"),
            "@bad.csv": str(d / "bad.csv"), "@spec": str(d / "spec.toml"), "@bad.toml": str(d / "bad.toml"),
            "@trace": str(d / "trace.jsonl"), "@dir": str(d), "@f.xyz": str(d / "f.xyz"),
            "@c.toml": str(d / "c.toml"), "@site": str(d / "site.toml"), "@badsite": str(d / "badsite.toml"),
            "@under-file": str(d / "site.toml" / "x"), "@plot.svg": str(d / "plot.svg"), "@plot.png": str(d / "plot.png"),
            **{f"@site{k}": str(d / f"site{k}") for k in range(3)}, "root": d,
            # in a folder that does not exist (inside the test's own, so no run can have made it)
            "@missing/f.png": str(d / "missing" / "f.png"), "@missing/c.toml": str(d / "missing" / "c.toml")}


def _argv(rng: random.Random, files: dict, i: int) -> list:
    cmd = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    argv = cmd.split()                    # "plot KIND" is two words
    # validate and calibrate without a CSV run on the packaged corpus (seconds to minutes): always give one
    if cmd in POSITIONAL and (rng.random() < 0.97 or cmd in ("validate", "calibrate", "plot validation")):
        argv += (rng.choice(POSITIONAL[cmd][:1]) if rng.random() < 0.5 else rng.choice(POSITIONAL[cmd])).split()
    flags = FLAGS[cmd]
    for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4))):
        flag = rng.choice(sorted(flags))
        argv.append(flag)
        if flags[flag] is not None:
            argv.append(rng.choice(flags[flag]) if rng.random() < 0.85 else rng.choice(NUM))
    if rng.random() < 0.1:
        argv += rng.choice(CONTRADICTIONS)
    if rng.random() < 0.05:
        argv.insert(rng.randrange(len(argv) + 1), rng.choice(JUNK))
    _keep_cheap(rng, cmd, argv, files, i)
    return [files.get(a, a) for a in argv]


def _keep_cheap(rng: random.Random, cmd: str, argv: list, files: dict, i: int) -> None:
    """A machine for most cases, the flags that keep one case to a fraction of a second, and the --out of
    commands that write."""
    flags = FLAGS[cmd]
    # most cases name a machine that exists, so the hostile flags reach past "give a machine"
    if "--machine" in flags and not {"--machine", "--gpu", "--host"} & set(argv) and rng.random() < 0.7:
        argv += rng.choice(BASE_MACHINES)
    if cmd == "sweep" and rng.random() < 0.95:
        argv += ["--out", str(files["root"] / f"out{i % 7}")]
    if cmd == "simulate" and "--tokens" not in argv:
        argv += ["--tokens", "32"]          # keeps a case cheap; --tokens itself is fuzzed above
    if cmd == "serve-sim":                  # a short workload unless the case fuzzes it
        for flag, value in (("--isl", "64"), ("--osl", "4"), ("--requests", "8")):
            if flag not in argv:
                argv += [flag, value]
        if not {"--rate", "--concurrency", "--sweep-concurrency"} & set(argv) and rng.random() < 0.9:
            argv += ["--concurrency", "2"]
    if cmd == "rank" and not any(a.startswith("family=") for a in argv):
        argv += ["--filter", rng.choice(RANK_FAMILIES)]
    if cmd == "plan" and "--quant" not in argv and rng.random() < 0.7:
        argv += ["--quant", "Q4_K_M"]
    small = PLOT_SMALL.get(cmd[5:], []) if cmd.startswith("plot ") else []
    for flag, value in zip(small[::2], small[1::2]):
        if flag not in argv:
            argv += [flag, value]
    if cmd.startswith("plot ") and rng.random() < 0.97:
        argv += ["--out", rng.choice(PLOT_OUT)]
    if cmd == "export-site" and rng.random() < 0.97:
        argv += ["--out", rng.choice(SITE_OUT)]
    if cmd == "export-site" and "--threads" not in argv:
        argv += ["--threads", "1"]


def _one_line_error(err: str, argv) -> None:
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("moesim: error: "), (argv, err)
    assert len([x for x in lines if x.startswith("moesim:")]) == 1, (argv, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)


def _no_nan(text: str):
    def bad(c):
        raise AssertionError(f"{c} in JSON output")
    return json.loads(text, parse_constant=bad)


def test_hostile_argv_exits_0_or_2_with_one_line(files, tally, monkeypatch):
    monkeypatch.delenv("MOESIM_TRACEBACK", raising=False)
    monkeypatch.chdir(files["root"])         # a relative --plot / --out value is written here, not in the repo
    rng = random.Random("cli")
    count = fuzz_count(300, 8_000)
    for i in range(count):
        argv = _argv(rng, files, i)
        out, err = io.StringIO(), io.StringIO()
        with bounded(120, argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:         # --help / --version
                rc = exc.code
        if rc == 2:
            _one_line_error(err.getvalue(), argv)
            tally.refuse()
            continue
        assert rc == 0, (argv, rc, err.getvalue())
        assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), (argv, err.getvalue())
        text = out.getvalue()
        assert text.strip(), argv
        if "--json" in argv and "--help" not in argv and "--version" not in argv:
            _no_nan(text)
        tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count


def test_calibrate_out_that_cannot_be_written_is_one_line(files, capsys):
    """Regression: --out naming a directory ended in an internal error (IsADirectoryError), after the
    whole fit; now refused before it."""
    for out in (files["@dir"], files["@missing/c.toml"]):
        assert main(["calibrate", files["@csv"], "--no-cv", "--out", out]) == 2
        _one_line_error(capsys.readouterr().err, out)


def test_validate_plot_that_cannot_be_written_is_one_line(files, capsys):
    """Regression: --plot into a missing folder or with a suffix matplotlib cannot write ended in an
    internal error (FileNotFoundError, ValueError)."""
    for out in (files["@missing/f.png"], files["@f.xyz"]):
        assert main(["validate", files["@csv"], "--plot", out]) == 2
        _one_line_error(capsys.readouterr().err, out)


def test_inspect_config_tensor_table_prints(files, capsys):
    """Regression: ``inspect config.json --tensors`` ended in an internal error (a config's tensor bytes
    are floats; the table formatted them as integers)."""
    assert main(["inspect", files["@config"], "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.0" in out or "blk.0" in out, out
