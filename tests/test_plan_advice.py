"""fit takes simulate's memory/speed options; `moesim plan` (the Pareto front, computed by the sweep);
the runtime advice, whose llama.cpp flags place tensors exactly as the simulated placement."""
from __future__ import annotations

import json
import math
import shlex

import numpy as np
import pytest

import moesim
from moesim.cli import main
from moesim.errors import MoesimError
from moesim.spec import overrides as O
from moesim.spec.placement import parse as parse_placement

M4090 = dict(gpu="rtx-4090", host="ddr5-5600x2", host_mem_gb=96)
M3090X2 = dict(gpu="rtx-3090", gpus=2, host="ddr4-3200x8", host_mem_gb=256)
H200X8 = dict(gpu="h200", gpus=8, host="ddr5-4800x12", host_mem_gb=1536)
# the fit record's memory fields (records.record), which fit and simulate must agree on
MEMORY_FIELDS = ("model", "quant", "quant_source", "kv_dtype", "context", "batch", "placement", "runtime", "machine",
                 "weights_bytes", "weights_bytes_by_class", "kv_bytes_per_token", "kv_bytes", "state_bytes",
                 "memory_by_tier", "fits", "max_context", "max_batch", "flags", "advice")
WEIGHT_CLASSES = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn", "embeddings", "lm_head",
                  "mtp")


def _close(a, b, rel=1e-9):
    return a == b or abs(a - b) <= rel * abs(b)


def _outcome(fn):
    try:
        return fn(), None
    except MoesimError as exc:
        return None, (exc.field, str(exc))


# ------------------------------------------------------------------------------------ fit = simulate
def _random_options(rng) -> dict:
    model = rng.choice(["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "glm-4.5-air", "llama-3-8b"])
    mach = [M4090, M3090X2, H200X8][rng.integers(3)]
    o = dict(model=str(model), machine=mach, quant=str(rng.choice(["Q4_K_M", "Q2_K", "Q8_0", "native"])),
             context=int(rng.choice([512, 4096, 32768])), batch=int(rng.choice([1, 2, 8])))
    if rng.random() < 0.4:
        o["runtime"] = str(rng.choice(["llama.cpp", "ik_llama.cpp", "ollama", "vllm", "ktransformers"]))
    if rng.random() < 0.4:
        o["placement"] = str(rng.choice(["experts-cpu", "n-cpu-moe=5", "layers-gpu=10", "all-gpu", "cpu-only",
                                         "offload-cache=8"]))
    if rng.random() < 0.4:
        o["parallel"] = str(rng.choice(["tp2", "tp8", "ep8", "layer-split", "tp2-ep2-attn-dp"]))
    if rng.random() < 0.3:
        o["mtp"] = int(rng.integers(1, 4))
        o["mtp_acceptance"] = float(rng.choice([0.5, 0.9]))
    if rng.random() < 0.3:
        o["cache_experts"] = int(rng.choice([0, 4, 16]))
    if rng.random() < 0.3:
        o["policy"] = str(rng.choice(["lru", "lfu", "static"]))
    if rng.random() < 0.3:
        o["prefetch_recall"] = float(rng.choice([0.0, 0.9]))
    if rng.random() < 0.2:
        o["routing"] = "generic"
    return o


def test_fit_memory_and_speed_equal_simulate_for_random_options():
    """For random option combinations fit's record equals simulate's memory fields (and its analytic
    decode / prefill estimate simulate(mode="analytic")), or both refuse with the same error."""
    rng = np.random.default_rng(7)
    agreed = refused = 0
    for _ in range(50):
        o = _random_options(rng)
        model, quant = o.pop("model"), o.pop("quant")
        f, f_err = _outcome(lambda: moesim.fit(model, quants=[quant], **o)[0])
        s, s_err = _outcome(lambda: moesim.simulate(model, quant=quant, mode="analytic", tokens=8, **o))
        where = (model, quant, o)
        assert (f_err is None) == (s_err is None), (where, f_err, s_err)
        if f_err is not None:
            assert f_err == s_err, where
            refused += 1
            continue
        d = s.to_dict()
        for k in MEMORY_FIELDS:
            assert f[k] == d[k], (k, where)
        if f["decode_tok_s"] is not None:
            assert _close(f["decode_tok_s"], d["decode_tok_s"]), where
            assert _close(f["prefill_tok_s"], d["prefill_tok_s"]), where
        agreed += 1
    assert agreed >= 18 and refused >= 4, (agreed, refused)


def test_fit_cli_takes_the_simulate_options(capsys):
    argv = ["fit", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "--quant", "Q4_K_M", "--parallel", "tp8",
            "--mtp", "2", "--mtp-acceptance", "0.7", "--policy", "lfu", "--prefetch-recall", "0.5",
            "--routing", "generic", "--json"]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)[0]
    ref = moesim.fit("deepseek-v3", dict(gpu="h200", gpus=8), quants=["Q4_K_M"], parallel="tp8", mtp=2,
                     mtp_acceptance=0.7, policy="lfu", prefetch_recall=0.5, routing="generic")[0]
    assert rec["decode_tok_s"] == ref["decode_tok_s"] and rec["memory_by_tier"] == ref["memory_by_tier"]
    assert "--spec-type draft-mtp --spec-draft-n-max 2" in rec["flags"] and "-sm tensor" in rec["flags"]
    assert any("MTP: 2 draft tokens" in o for o in rec["advice"]["options"])
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "with MTP: 2 draft tokens" in out and "with multi-GPU layout tp8" in out
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--parallel", "tp8"]) == 2
    assert "parallel" in capsys.readouterr().err
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--policy", "belady"]) == 2
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--quant", "Q4_K_M", "--cache-experts", "8",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["placement"] == "offload-cache=8"


# ------------------------------------------------------------------------------------ flags -> tensors
BIG_HOST = dict(gpu="rtx-4090", host="ddr5-4800x8", host_mem_gb=4096)


def _llama_args_to_overrides(args: list) -> tuple:
    """(overrides in command-line order, -ngl) of llama-server argv, as llama.cpp's arg parser reads them."""
    ovs, ngl, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "-ngl":
            ngl, i = int(args[i + 1]), i + 2
        elif a == "-ot":
            ovs.extend(O.parse_overrides(args[i + 1]))
            i += 2
        elif a == "--n-cpu-moe":
            ovs.extend(O.n_cpu_moe(int(args[i + 1])))
            i += 2
        elif a == "--cpu-moe":
            ovs.append(O.cpu_moe())
            i += 1
        else:
            i += 1
    return ovs, ngl


def _tiers_from_tensors(m, ovs, ngl, quant) -> dict:
    """Weight bytes per (tier, class) where llama.cpp would put each tensor (CPU = host, any GPU = gpu)."""
    out = {}
    for dev, v in O.by_device(O.assign_devices(m, ovs, n_gpu_layers=ngl, quant=quant)).items():
        tier = "host" if dev == O.CPU else "gpu"
        for cls, b in v["by_class"].items():
            out[(tier, cls)] = out.get((tier, cls), 0) + b
    return {k: v for k, v in out.items() if v}


def _tiers_from_record(rec) -> dict:
    out = {}
    for tier, t in rec["memory_by_tier"].items():
        for cls, b in t["by_class"].items():
            if cls in WEIGHT_CLASSES and b:
                out[(tier, cls)] = b
    return out


def _effective(p, m):
    """The placement's plainest name: n-cpu-moe=k that moves no MoE layer is all-gpu, one that moves all
    of them experts-cpu; layers-gpu of every layer is all-gpu."""
    from moesim.spec.placement import Placement
    moe = [l.index for l in m.layers if l.ffn.kind == "moe"]
    if p.kind == "n-cpu-moe" and not any(i < p.arg for i in moe):
        return Placement("all-gpu")
    if p.kind == "n-cpu-moe" and all(i < p.arg for i in moe):
        return Placement("experts-cpu")
    if p.kind == "layers-gpu" and p.arg == m.n_layers:
        return Placement("all-gpu")
    return p


def _placements_for(m) -> list:
    L = m.n_layers
    out = ["all-gpu", "cpu-only", f"layers-gpu={L // 3}", f"layers-gpu={L - 1}"]
    if m.n_experts:
        out += ["experts-cpu", f"n-cpu-moe={L // 2}", "n-cpu-moe=1", f"n-cpu-moe={L - 1}"]
    return out


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "glm-4.5-air", "llama-4-scout",
                                   "llama-3-8b"])
@pytest.mark.parametrize("runtime", ["llama.cpp", "ik_llama.cpp"])
def test_llama_flags_place_tensors_as_simulated(model, runtime):
    """The printed llama.cpp flags, fed back through llama.cpp's tensor-name rules, give the simulated
    placement and the same weight bytes per tier and class."""
    m = moesim.model(model)
    quant = "Q4_K_M"
    for spec in _placements_for(m):
        rec = moesim.fit(model, BIG_HOST, quants=[quant], placement=spec, runtime=runtime)[0]
        assert rec["advice"]["exact"], (model, spec)
        ovs, ngl = _llama_args_to_overrides(shlex.split(rec["flags"]))
        assert _tiers_from_tensors(m, ovs, ngl, quant) == _tiers_from_record(rec), (model, spec, rec["flags"])
        back = moesim.analysis.resolve.placement_from_overrides(m, ovs, quant, n_gpu_layers=ngl)
        assert back == _effective(parse_placement(spec, m), m), (model, spec, back)


def test_ollama_settings_place_tensors_as_simulated():
    """Ollama's num_gpu (-ngl) and llama-server's LLAMA_ARG_* variables give the same placement; a layout
    Ollama cannot set (the output layer by -ot) is marked approximate."""
    m = moesim.model("qwen3-30b-a3b")
    for spec in ("all-gpu", "experts-cpu", "n-cpu-moe=20", "cpu-only"):
        adv = moesim.fit("qwen3-30b-a3b", BIG_HOST, quants=["Q4_K_M"], placement=spec, runtime="ollama")[0]["advice"]
        assert adv["exact"] and adv["args"] == [] and "-ngl" not in adv["flags"]
        args = ["-ngl", str(adv["modelfile"]["num_gpu"])]
        args += ["--cpu-moe"] if adv["env"].get("LLAMA_ARG_CPU_MOE") == "1" else []
        args += ["--n-cpu-moe", adv["env"]["LLAMA_ARG_N_CPU_MOE"]] if "LLAMA_ARG_N_CPU_MOE" in adv["env"] else []
        ovs, ngl = _llama_args_to_overrides(args)
        assert moesim.analysis.resolve.placement_from_overrides(m, ovs, "Q4_K_M", n_gpu_layers=ngl) == \
            parse_placement(spec, m)
        assert adv["modelfile"]["num_ctx"] == 4096
    rec = moesim.fit("qwen3-30b-a3b", BIG_HOST, quants=["Q4_K_M"], placement="layers-gpu=10", runtime="ollama",
                     kv_dtype="q8_0", batch=4)[0]
    adv = rec["advice"]
    assert not adv["exact"] and adv["modelfile"]["num_gpu"] == 10
    assert adv["env"] == {"OLLAMA_NUM_PARALLEL": "4", "OLLAMA_FLASH_ATTENTION": "1", "OLLAMA_KV_CACHE_TYPE": "q8_0"}


def test_served_runtimes_get_their_own_flags():
    rec = moesim.fit("deepseek-v3", H200X8, quants=["native"], kv_dtype="fp8", mtp=1)[0]
    assert rec["runtime"] == "vllm" and rec["advice"]["exact"]
    args = rec["advice"]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8" and "--quantization" not in args
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert '"num_speculative_tokens":1' in rec["flags"]
    online = moesim.fit("qwen3-30b-a3b", H200X8, quants=["fp8"], runtime="sglang", parallel="tp8-ep8-attn-dp")[0]
    a = online["advice"]["args"]
    assert a[a.index("--quantization") + 1] == "fp8" and "--enable-dp-attention" in a and "--dp" in a
    assert a[a.index("--context-length") + 1] == "4096"
    gguf = moesim.fit("qwen3-30b-a3b", H200X8, quants=["Q4_K_M"], runtime="vllm")[0]["advice"]
    assert not gguf["exact"] and any("checkpoint's own format" in w for w in gguf["why"])
    # without quants a served runtime defaults to the checkpoint's own format
    assert [r["quant"] for r in moesim.fit("deepseek-v3", H200X8, runtime="vllm")] == ["fp8"]


def test_overflow_names_the_tier_and_the_gigabytes(capsys):
    small = dict(gpu="rtx-4090", host="ddr5-4800x2", host_mem_gb=16, storage="none")
    rec = moesim.fit("qwen3-30b-a3b", small, quants=["BF16"], placement="experts-cpu")[0]
    assert rec["fits"] == "no"
    (o,) = rec["advice"]["overflow"]
    host = rec["memory_by_tier"]["host"]["total"]
    assert o["tier"] == "host" and math.isclose(o["need_gb"], host / 1e9) and math.isclose(o["have_gb"], 16.0)
    assert math.isclose(o["over_gb"], o["need_gb"] - o["have_gb"])
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--host-mem-gb", "16", "--storage", "none",
                 "--quant", "BF16", "--placement", "experts-cpu"]) == 0
    assert f"does not fit: host RAM needs {o['need_gb']:.1f} GB of 16.0 GB ({o['over_gb']:.1f} GB over)" \
        in capsys.readouterr().out
    fits = moesim.fit("qwen3-30b-a3b", small, quants=["Q2_K"])[0]
    assert fits["fits"] != "no" and fits["advice"]["overflow"] == []


def test_simulate_text_names_settings_and_speed_options(capsys):
    assert main(["simulate", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "--quant", "native", "--mtp", "1",
                 "--mode", "analytic", "--parallel", "tp8", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "vllm serve deepseek-v3 --tensor-parallel-size 8" in out and "with MTP: 1 draft tokens" in out
    assert "why: the checkpoint's own format (fp8)" in out



# ------------------------------------------------------------------------------------ plan
def _dominates(q, p, keys) -> bool:
    return all(q[k] >= p[k] for k in keys) and any(q[k] > p[k] for k in keys)


@pytest.fixture(scope="module")
def small_plan():
    return moesim.plan("qwen3-30b-a3b", M4090, quants=["Q4_K_M", "Q6_K", "Q8_0"], contexts=[4096, 32768, 40960])


def test_plan_points_equal_simulate_analytic(small_plan):
    """Each point's numbers are simulate(mode="analytic")'s for its configuration, and its flags are the
    advice simulate gives that configuration."""
    pts = small_plan["points"]
    assert len(pts) >= 5
    for p in pts:
        r = moesim.simulate("qwen3-30b-a3b", M4090, quant=p["quant"], context=p["context"], kv_dtype=p["kv_dtype"],
                            placement=p["placement"], runtime=p["runtime"], mode="analytic", tokens=8)
        d = r.to_dict()
        tiers = d["memory_by_tier"]
        assert _close(p["decode_tok_s"], r.decode_tok_s) and _close(p["prefill_tok_s"], r.prefill_tok_s), p
        assert p["fits"] == d["fits"] != "no"
        for k in ("weights_bytes", "kv_bytes"):
            assert p[k] == d[k], (k, p)
        assert p["gpu_bytes"] == tiers["gpu"]["total"] and p["host_bytes"] == tiers["host"]["total"]
        assert p["flags"] == d["flags"] and p["advice"]["args"] == d["advice"]["args"]


def test_plan_is_the_pareto_front_of_the_sweep(small_plan):
    """Brute force over the same grid: no configuration that fits dominates a point, and every one that
    fits is matched or dominated by a point."""
    g = small_plan["grid"]
    tab = moesim.sweep(models=["qwen3-30b-a3b"], quants=g["quants"], machines=[moesim.machine(**M4090)],
                       kv_dtypes=g["kv_dtypes"], placements=g["placements"], contexts=g["contexts"],
                       filter={"fits": True, "skip_inapplicable": True}, mode="analytic")
    params = moesim.model("qwen3-30b-a3b").param_counts()[0]
    from moesim.spec import quants as Q
    rows = [dict(decode_tok_s=float(tab["decode_tok_s"][i]), context=int(tab["context"][i]),
                 bits_per_weight=8.0 * float(tab["weights_bytes"][i]) / params,
                 kv_bits=8.0 * Q.kv_dtype_bytes(str(tab["kv_dtype"][i]))) for i in range(len(tab))]
    assert small_plan["fitting"] == len(rows) > len(small_plan["points"])
    keys = small_plan["objectives"]
    pts = small_plan["points"]
    for p in pts:
        assert not any(_dominates(r, p, keys) for r in rows), p
    for r in rows:
        assert any(all(p[k] >= r[k] for k in keys) for p in pts), r
    assert [p["decode_tok_s"] for p in pts] == sorted((p["decode_tok_s"] for p in pts), reverse=True)


def test_plan_flags_realise_each_point(small_plan):
    m = moesim.model("qwen3-30b-a3b")
    for p in small_plan["points"]:
        ovs, ngl = _llama_args_to_overrides(shlex.split(p["flags"]))
        back = moesim.analysis.resolve.placement_from_overrides(m, ovs, p["quant"], n_gpu_layers=ngl)
        assert back == _effective(parse_placement(p["placement"], m), m), p
        assert f"-c {p['context']}" in p["flags"] and (p["kv_dtype"] == "f16") == ("-ctk" not in p["flags"])


def test_plan_on_served_runtime_and_cli(capsys):
    d = moesim.plan("deepseek-v3", H200X8, runtime="vllm", contexts=[8192, 163840])
    assert {p["quant"] for p in d["points"]} == {"fp8"} and {p["placement"] for p in d["points"]} == {"all-gpu"}
    assert all("--tensor-parallel-size 8" in p["flags"] and f"--max-model-len {p['context']}" in p["flags"]
               for p in d["points"])
    assert max(p["context"] for p in d["points"]) == 163840
    argv = ["plan", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--quant", "Q4_K_M", "--context", "8192",
            "--kv-dtype", "f16", "--kv-dtype", "q8_0"]
    assert main(argv + ["--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["points"] and all("flags" in p and "advice" in p for p in j["points"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and j["points"][0]["flags"] in out
    assert main(["plan", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--context", "999999"]) == 2
    assert "context" in capsys.readouterr().err


def test_a_gguf_file_gets_its_own_path_and_its_own_tensors(tmp_path):
    """A model read from a GGUF file: -m names the file, and the flags place the file's tensors (as stored)
    where the simulated placement has them; plan (the sweep engine) takes catalog models only, and says so."""
    from test_ingest import write_tiny_moe
    path = write_tiny_moe(tmp_path / "tiny.gguf")
    m = moesim.model(path)
    for spec in ("experts-cpu", "n-cpu-moe=1", "layers-gpu=1", "cpu-only"):
        rec = moesim.fit(path, BIG_HOST, placement=spec)[0]
        args = shlex.split(rec["flags"])
        assert args[args.index("-m") + 1] == path
        ovs, ngl = _llama_args_to_overrides(args)
        assert _tiers_from_tensors(m, ovs, ngl, "native") == _tiers_from_record(rec), spec
    with pytest.raises(MoesimError, match="catalog models") as exc:
        moesim.plan(path, BIG_HOST, contexts=[4096])
    assert exc.value.field == "model"
