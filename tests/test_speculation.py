"""MTP acceptance defaults from the catalog's measurements (catalog/speculation.toml), named in the output,
and the verdict on whether speculation pays (analysis.simulate.speculation_fields)."""
import json

import pytest

import moesim
from moesim import MoesimError
from moesim.analysis.speculation import (accepted_per_step, acceptance_from_length, datasets, default_acceptance,
                                         resolve_acceptance)
from moesim._catalog import load
from moesim.cli import main

DGX = "dgx-h200"
# DeepSeek-V3 Q4_K_M with its routed experts in host RAM under KTransformers: the CPU's expert matmuls
# bind the step (bottleneck cpu_compute), so two tokens per sequence cost ~1.96x the step for 1.85 tokens.
OFFLOAD = dict(gpu="rtx-4090", host="ddr5-4800x8", host_mem_gb=768)


def test_every_measurement_has_a_source_dataset_and_a_number():
    table = load("speculation")["speculation"]
    assert table
    for family, t in table.items():
        assert t["default_dataset"] in {x["dataset"] for x in t["measurements"]}, family
        for x in t["measurements"]:
            assert x["source"] and x["dataset"] and x["drafts"] >= 1
            assert ("acceptance" in x) != ("accept_length" in x), x
            if "acceptance" in x:
                assert 0 < x["acceptance"] <= x.get("acceptance_high", x["acceptance"]) <= 1


def test_accept_length_inverts_the_chain_model():
    a = acceptance_from_length(7, 3.20)          # nebius: original DeepSeek-V3 MTP, K = 7
    assert accepted_per_step(7, a) == pytest.approx(3.20, abs=1e-9)
    assert 0.70 < a < 0.71
    with pytest.raises(MoesimError):
        acceptance_from_length(2, 3.5)


def test_default_is_the_family_measurement_nearest_the_depth():
    one = default_acceptance("deepseek_v3", 1)
    assert one.rate == 0.85 and one.dataset == "generation-topics" and "2412.19437" in one.source
    deep = default_acceptance("deepseek_v3", 6, "mt-bench+humaneval+gsm8k")
    assert deep.measured_drafts == 7 and "used for 6" in deep.source and "nebius" in deep.source
    assert default_acceptance("deepseek_v4", 1).rate == 0.90
    assert set(datasets("deepseek_v3")) == {"generation-topics", "unstated", "mt-bench+humaneval+gsm8k"}


def test_drafts_past_the_first_reuse_the_module_at_the_deeper_measurements_decay():
    """A one-draft measurement used for more drafts: drafts after the first are accepted at the decay the
    family's deepest accept-length measurement shows (nebius K = 7: 3.20 tokens per step after a first draft
    accepted at 0.85 gives 0.63), so tokens per step level off as the TensorRT-LLM MTP 1..5 ladder does
    (DeepSeek-R1 on 8x B200: 198, 250, 253, 245, 239 tok/s) instead of growing as 1 + a + ... + a^n."""
    from moesim.analysis.speculation import decay_after_first
    r = decay_after_first(0.85, 7, 3.20)
    assert 1 + 0.85 * sum(r ** i for i in range(7)) == pytest.approx(3.20, abs=1e-9) and 0.62 < r < 0.64
    steps = [accepted_per_step(d, default_acceptance("deepseek_v3", d).rate) for d in range(1, 8)]
    assert steps[0] == pytest.approx(1.85)
    assert steps[1] == pytest.approx(1 + 0.85 * (1 + r))
    assert steps[-1] == pytest.approx(3.20, abs=1e-6)
    assert all(b > a for a, b in zip(steps, steps[1:]))                       # more drafts never fewer tokens
    assert steps[2] < accepted_per_step(3, 0.85) - 0.4                         # but far fewer than the constant chain
    assert "0.629 of their predecessor" in default_acceptance("deepseek_v3", 3).source
    assert decay_after_first(0.85, 3, 1.5) == 0.0 and decay_after_first(0.5, 3, 3.9) == 1.0


def test_simulate_uses_and_names_the_default():
    d = moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic").to_dict()
    assert d["mtp_acceptance"] == 0.85 and d["mtp_dataset"] == "generation-topics"
    assert "DeepSeek-V3 technical report" in d["mtp_acceptance_source"]
    given = moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic",
                            mtp_acceptance=0.85).to_dict()
    assert given["decode_tok_s"] == pytest.approx(d["decode_tok_s"], rel=1e-12)
    assert given["mtp_acceptance_source"].startswith("given")
    other = moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic",
                            mtp_dataset="unstated").to_dict()
    assert other["mtp_acceptance"] == 0.81 and other["decode_tok_s"] < d["decode_tok_s"]
    plain = moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mode="analytic").to_dict()
    assert "mtp_acceptance_source" not in plain


def test_cli_text_and_json_name_the_source(capsys):
    args = ["simulate", "deepseek-v4-flash", "--machine", "dgx-b200", "--runtime", "vllm", "--mtp", "1",
            "--mode", "analytic"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "MTP acceptance 0.900 per draft; source: deepseek_v4 MTP on unstated: KTransformers" in out
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mtp_acceptance"] == 0.90 and "KTransformers" in d["mtp_acceptance_source"]


def test_not_paying_line_for_cpu_experts_at_batch_not_for_all_gpu_batch_1(capsys):
    off = moesim.simulate("deepseek-v3", moesim.machine(**OFFLOAD), quant="Q4_K_M", runtime="ktransformers",
                          placement="experts-cpu", batch=16, mtp=1, mode="analytic").to_dict()
    assert off["bottleneck"] == "cpu_compute"
    # 1 + 0.85 tokens per step against a step ~1.9x as long (the CPU's FLOPs bind at 32 tokens a step;
    # at batch 8 the step is still host-bandwidth-bound and MTP pays a little): the drafts lose
    assert off["speculation_speedup"] < 0.97
    assert off["speculation_note"].startswith("MTP does not pay here")
    gpu = moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", batch=1, mtp=1, mode="analytic").to_dict()
    # all on the GPU at batch 1 the step is bandwidth-bound and barely grows with a second token
    assert gpu["speculation_speedup"] > 1.3
    assert "does not pay" not in gpu["speculation_note"]
    # the same verdicts in the CLI's text
    base = ["simulate", "deepseek-v3", "--mtp", "1", "--mode", "analytic"]
    assert main(base + ["--gpu", "rtx-4090", "--host", "ddr5-4800x8", "--host-mem-gb", "768", "--quant", "Q4_K_M",
                        "--runtime", "ktransformers", "--placement", "experts-cpu", "--batch", "16"]) == 0
    assert "MTP does not pay here" in capsys.readouterr().out
    assert main(base + ["--machine", DGX, "--quant", "fp8", "--runtime", "vllm"]) == 0
    assert "MTP does not pay here" not in capsys.readouterr().out


def test_speedup_is_the_ratio_of_the_two_analytic_runs():
    kw = dict(quant="fp8", runtime="vllm", batch=4, mode="analytic")
    with_mtp = moesim.simulate("deepseek-v3", DGX, mtp=2, **kw).to_dict()
    without = moesim.simulate("deepseek-v3", DGX, **kw).to_dict()
    assert with_mtp["speculation_speedup"] == pytest.approx(with_mtp["decode_tok_s"] / without["decode_tok_s"],
                                                            rel=1e-9)


def test_fit_reports_the_default_and_the_verdict():
    rec = moesim.fit("deepseek-v3", DGX, quants=["native"], runtime="vllm", mtp=1)[0]
    assert rec["mtp_acceptance"] == 0.85 and rec["speculation_speedup"] > 1


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), float("inf"), "0.8", True])
def test_bad_acceptance_names_the_field(bad):
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic", mtp_acceptance=bad)
    assert e.value.field == "mtp_acceptance"
    with pytest.raises(MoesimError) as e:
        resolve_acceptance("deepseek_v3", 1, bad)
    assert e.value.field == "mtp_acceptance"


def test_no_measurement_and_bad_dataset_are_refused_by_name():
    with pytest.raises(MoesimError) as e:
        moesim.simulate("glm-4.5-air", DGX, quant="native", runtime="vllm", mtp=1, mode="analytic")
    assert e.value.field == "mtp_acceptance" and "glm4_moe" in str(e.value)
    ok = moesim.simulate("glm-4.5-air", DGX, quant="native", runtime="vllm", mtp=1, mode="analytic",
                         mtp_acceptance=0.7).to_dict()
    assert ok["mtp_acceptance"] == 0.7
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic", mtp_dataset="nope")
    assert e.value.field == "mtp_dataset"
    with pytest.raises(MoesimError) as e:
        moesim.simulate("deepseek-v3", DGX, quant="fp8", runtime="vllm", mtp=1, mode="analytic",
                        mtp_acceptance=0.8, mtp_dataset="unstated")
    assert e.value.field == "mtp_dataset"
