"""Never a silent wrong number: hostile or mistyped model fields are refused at the boundary, naming
the field and its bound (regressions of the never-lie issue)."""
from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.spec.limits import ARCH_BOUNDS

DS_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
    "max_position_embeddings": 163840, "torch_dtype": "bfloat16", "n_group": 1, "topk_group": 1,
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}


def _load(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return moesim.Model.from_hf_config(tmp_path)


def test_reference_configs_load(tmp_path):
    assert _load(tmp_path, DS_V2_LITE).n_experts == 64
    assert _load(tmp_path, LLAMA).n_layers == 32


@pytest.mark.parametrize("base, key, value", [
    (LLAMA, "head_dim", -1),                       # gave -768 B/token of KV and a max batch of 2**30
    (DS_V2_LITE, "n_shared_experts", -1000),       # gave -371.8 GiB of weights and -210 tok/s
    (DS_V2_LITE, "kv_lora_rank", -1),
    (DS_V2_LITE, "moe_intermediate_size", -1000),
    (LLAMA, "num_key_value_heads", -1),
])
def test_negative_sizes_are_refused_naming_the_field(tmp_path, base, key, value):
    with pytest.raises(MoesimError) as exc:
        _load(tmp_path, dict(base, **{key: value}))
    assert exc.value.field and str(value) in str(exc.value)


def test_a_million_layers_is_refused_before_any_work(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(MoesimError, match="num_hidden_layers.*plausible maximum 256"):
        _load(tmp_path, dict(LLAMA, num_hidden_layers=10**6))
    assert time.perf_counter() - t0 < 5.0


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"])
def test_implausibly_large_dims_are_refused(tmp_path, key):
    with pytest.raises(MoesimError, match=key):
        _load(tmp_path, dict(LLAMA, **{key: ARCH_BOUNDS[key] * 4}))


def test_top_k_above_the_experts_is_refused(tmp_path):
    with pytest.raises(MoesimError, match="num_experts_per_tok"):
        _load(tmp_path, dict(DS_V2_LITE, num_experts_per_tok=65))


def test_every_catalog_model_is_within_the_bounds():
    for mid in moesim.model_ids():
        m = moesim.model(mid)
        assert m.n_layers <= ARCH_BOUNDS["num_hidden_layers"]
        assert m.max_context <= ARCH_BOUNDS["max_position_embeddings"]


# ------------------------------------------------------------------------------- entry points
def test_context_beyond_the_model_maximum_is_refused_with_the_limit():
    # fit llama-2-7b --context 8192 used to say it fits and print -c 8192; the model's limit is 4096
    with pytest.raises(MoesimError, match="4,096") as exc:
        moesim.fit("llama-2-7b", "desktop-4090", quants=["Q4_K_M"], context=8192)
    assert exc.value.field == "context"
    with pytest.raises(MoesimError, match="163,840"):
        moesim.simulate("deepseek-r1", "desktop-4090", quant="Q2_K", context=1048576, mode="analytic")


def test_allow_beyond_max_context_keeps_it_and_says_so():
    rec = moesim.fit("llama-2-7b", "desktop-4090", quants=["Q4_K_M"], context=8192,
                     allow_beyond_max_context=True)[0]
    assert rec["context"] == 8192 and any("beyond llama-2-7b's trained maximum" in a for a in rec["assumptions"])
    res = moesim.simulate("llama-2-7b", "desktop-4090", quant="Q4_K_M", context=8192, mode="analytic",
                          allow_beyond_max_context=True)
    assert any("4,096" in a for a in res.memory["assumptions"])


def test_an_absurd_context_is_refused_even_when_allowed():
    # --context 1000000000000 printed decode 0.00 tok/s
    with pytest.raises(MoesimError, match="plausible maximum"):
        moesim.simulate("llama-2-7b", "desktop-4090", context=10**12, allow_beyond_max_context=True)


def test_a_machine_id_string_is_accepted_by_every_entry_point():
    # moesim.fit(model, "desktop-4090") raised a raw AttributeError
    by_id = moesim.fit("qwen3-30b-a3b", "desktop-4090", quants=["Q4_K_M"])[0]
    by_obj = moesim.fit("qwen3-30b-a3b", moesim.machine("desktop-4090"), quants=["Q4_K_M"])[0]
    assert by_id == by_obj
    a = moesim.simulate("qwen3-30b-a3b", "desktop-4090", quant="Q4_K_M", mode="analytic")
    b = moesim.simulate("qwen3-30b-a3b", moesim.machine("desktop-4090"), quant="Q4_K_M", mode="analytic")
    assert a.decode_tok_s == b.decode_tok_s
    for bad in (42, None, ["desktop-4090"]):
        with pytest.raises(MoesimError) as exc:
            moesim.fit("qwen3-30b-a3b", bad)
        assert exc.value.field == "machine"
    with pytest.raises(MoesimError, match="did you mean"):
        moesim.fit("qwen3-30b-a3b", "desktop-409")


def test_a_huge_draft_length_is_refused_at_once():
    # --mtp 2147483648 hung in a Python loop
    t0 = time.perf_counter()
    for fn in (lambda: moesim.simulate("deepseek-v3", "dgx-h200", quant="Q4_K_M", mtp=2**31, mode="analytic"),
               lambda: moesim.fit("deepseek-v3", "dgx-h200", quants=["Q4_K_M"], mtp=2**31)):
        with pytest.raises(MoesimError, match="<= 64") as exc:
            fn()
        assert exc.value.field == "mtp"
    assert time.perf_counter() - t0 < 5.0


@pytest.mark.parametrize("label, modelled", [("UD-Q2_K_XL", "IQ2_M"), ("IQ3_K", "IQ3_S"), ("Q4_K", "Q4_K_M")])
def test_a_quant_alias_is_listed_in_the_assumptions(label, modelled):
    rec = moesim.fit("deepseek-r1", "desktop-4090", quants=[label])[0]
    assert rec["quant"] == modelled
    assert any(repr(label) in a and modelled in a for a in rec["assumptions"])
    res = moesim.simulate("deepseek-r1", "desktop-4090", quant=label, mode="analytic")
    assert any(repr(label) in a for a in res.memory["assumptions"])


def test_a_plain_spelling_is_not_an_alias():
    rec = moesim.fit("deepseek-r1", "desktop-4090", quants=["q4_k_m"])[0]
    assert not any("modelled as" in a for a in rec["assumptions"])


def test_cli_refuses_beyond_max_context_unless_allowed(capsys):
    from moesim.cli import main
    args = ["fit", "llama-2-7b", "--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--quant", "Q4_K_M", "--context", "8192"]
    assert main(args) == 2
    assert "maximum context of 4,096" in capsys.readouterr().err
    assert main(args + ["--allow-beyond-max-context", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["context"] == 8192 and any("trained maximum" in a for a in rows[0]["assumptions"])


@pytest.mark.parametrize("mid, quant, host_gb", [("deepseek-r1", "Q4_K_M", 192), ("kimi-k2", "Q2_K", 64),
                                                  ("qwen3-30b-a3b", "Q8_0", 8), ("gpt-oss-120b", "MXFP4", 32)])
def test_memory_breakdown_sums_to_each_tier_total(mid, quant, host_gb):
    # fit --json's host breakdown by class used to sum to more than the host total when weights spill
    mach = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=host_gb)
    for rec in moesim.fit(mid, mach, quants=[quant]):
        tiers = rec["memory_by_tier"]
        for name, t in tiers.items():
            assert sum(t["by_class"].values()) == pytest.approx(t["total"], rel=1e-12, abs=1.0), (mid, name)
            assert all(v > 0 for v in t["by_class"].values()), (mid, name)
        if tiers["storage"]["total"]:
            assert "routed_experts" in tiers["storage"]["by_class"]


def test_a_paged_simulate_says_why_it_differs_from_fit():
    mach = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=192)
    r = moesim.simulate("deepseek-r1", mach, quant="Q4_K_M", tokens=48)
    assert r.page_cache_hit_rate is not None
    assert any("page cache starts cold" in a for a in r.memory["assumptions"])
    resident = moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", tokens=48)
    assert not any("page cache" in a for a in resident.memory["assumptions"])


@pytest.mark.parametrize("kw, match", [
    (dict(host="ddr5-6000xx"), "PARTxCHANNELS"),          # said "unknown 'ddr5-6000'; did you mean 'ddr5-6000'"
    (dict(host="ddr5-6000x99999"), r"\[1, 16\]"),          # was 3.2 PB of RAM at 4.8 PB/s
    (dict(host="ddr5-600x2"), "unknown host memory part 'ddr5-600'; did you mean"),
    (dict(gpus=4294967304), "plausible maximum 72"),      # wrapped to 8 GPUs
    (dict(gpu_mem_gb=1e300), "plausible maximum"),
    (dict(host="ddr5-6000x2", sockets=99), "plausible maximum 8"),
    (dict(host="ddr5-6000x2", host_mem_gb=1e12), "plausible maximum"),
    (dict(host="ddr5-6000x2", cores=10**9), "plausible maximum"),
])
def test_implausible_machines_are_refused(kw, match):
    with pytest.raises(MoesimError, match=match):
        moesim.machine(gpu="rtx-4090", **kw)


def test_cli_machine_flags_are_bounded(capsys):
    from moesim.cli import main
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--gpus", "4294967304", "--quant", "Q4_K_M"]) == 2
    assert "gpus" in capsys.readouterr().err


@pytest.mark.parametrize("kw, match", [
    (dict(tokens=10**10), "<= 1,048,576"),         # ended in 'internal error: MemoryError:'
    (dict(batch=2**31), "<= 65,536"),               # ended in an internal error
    (dict(tokens=1_000_000, batch=700, policy="belady"), None),
    (dict(tokens=1_000_000, batch=700), "expert choices, over the 268,435,456"),   # ran for hours
    (dict(tokens=100_000, batch=700), "use fewer tokens"),      # the int32-stamp run, hours long
])
def test_runs_too_large_to_allocate_are_refused_up_front(kw, match, monkeypatch):
    if match is None:       # a workspace over half the RAM: pretend this machine has 4 GiB
        import moesim.analysis.simulate as S
        monkeypatch.setattr(S, "this_machines_ram", lambda: 4 << 30)
        match = "GiB of workspace"
    t0 = time.perf_counter()
    with pytest.raises(MoesimError, match=match):
        moesim.simulate("mixtral-8x7b", "desktop-4090", quant="Q4_K_M", **kw)
    assert time.perf_counter() - t0 < 5.0


# ----------------------------------------------------------- max context under the best placement for it
def _fits(model, machine, quant, context, batch=1, runtime=None):
    rec = moesim.fit(model, machine, quants=[quant], context=context, batch=batch, runtime=runtime)[0]
    return rec["fits"] != "no", rec


def test_max_context_does_not_depend_on_the_context_asked():
    """The issue's case: DeepSeek-V4-Flash Q2_K on a 4090 + 128 GB said 56,576 at the default 4096 (the
    limit of n-cpu-moe=34, the placement chosen there), yet 200,000 fits with a few more layers' experts
    in RAM. max_context is now the same whatever context was asked, and 200,000 fits."""
    mach = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=128)
    answers = {c: _fits("deepseek-v4-flash", mach, "Q2_K", c)[1]["max_context"] for c in (4096, 56576, 200000)}
    assert len(set(answers.values())) == 1, answers
    assert answers[4096] >= 200000 and _fits("deepseek-v4-flash", mach, "Q2_K", 200000)[0]


def test_no_layers_on_the_gpu_is_the_last_resort_of_the_automatic_choice():
    """DeepSeek-V4-Flash Q8_0 x 16 on a 3060 + 64 GB: at its max context only -ngl 0 fits (all layers in
    RAM, the compute buffers still on the GPU; cpu-only does not fit). fit reported that max context
    and then chose experts-cpu there, which does not fit: the complete choice's last scan stopped at
    layers-gpu = 1."""
    mach = moesim.machine(gpu="rtx-3060", host="ddr5-6000x2", host_mem_gb=64)
    mc = _fits("deepseek-v4-flash", mach, "Q8_0", 4096, 16)[1]["max_context"]
    ok, rec = _fits("deepseek-v4-flash", mach, "Q8_0", mc, 16)
    # since the V4 indexer cache is counted as vLLM/llama.cpp store it (fp8 + scales) the boundary falls where one
    # layer still fits (layers-gpu=1); what matters is that the whole layers-gpu scan, down to 0, is searched
    assert ok and rec["placement"].startswith("layers-gpu=") and rec["max_context"] == mc, rec
    assert not _fits("deepseek-v4-flash", mach, "Q8_0", mc + 1, 16)[0]


_M4090_64 = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
_M3060_32 = dict(gpu="rtx-3060", host="ddr4-3200x2", host_mem_gb=32)
# each with its boundary below the model's maximum, across the placement families (n-cpu-moe,
# layers-gpu, ktransformers' gpu-experts, unified, a dense model)
_BRUTE_CASES = [("deepseek-v4-flash", _M4090_64, "Q2_K", 16, None),
                ("qwen3-30b-a3b", _M3060_32, "Q4_K_M", 16, None),
                ("qwen3-30b-a3b", _M3060_32, "Q4_K_M", 16, "ktransformers"),
                ("gpt-oss-120b", _M4090_64, "MXFP4_MOE", 64, None),
                ("deepseek-r1", _M3060_32, "Q2_K", 16, None),
                ("glm-4.5-air", _M4090_64, "Q4_K_M", 1, "ktransformers"),
                ("llama-3-70b", _M3060_32, "Q4_K_M", 16, None),
                ("qwen3-235b-a22b", dict(id="dgx-spark"), "Q3_K_M", 1, None),
                ("deepseek-r1", dict(id="dgx-h100"), "Q2_K", 64, "ktransformers")]


@pytest.mark.parametrize("mid,mkw,quant,batch,runtime", _BRUTE_CASES)
def test_max_context_is_the_largest_context_fit_finds_fitting(mid, mkw, quant, batch, runtime):
    """Brute force against fit at each context: every context up to max_context fits (fit choosing the
    placement for that context) and none beyond it does, on a grid of contexts plus both sides of the
    boundary; the answer is the same at every context asked, and a sweep reports it too."""
    mach = moesim.machine(**mkw)
    limit = moesim.model(mid).max_context
    mc = _fits(mid, mach, quant, 4096 if limit >= 4096 else limit, batch, runtime)[1]["max_context"]
    assert 0 < mc < limit, mc       # a boundary to test
    grid = sorted({1, 2, 4096, limit, *(int(limit * f) for f in (0.01, 0.1, 0.3, 0.5, 0.8))}
                  | ({mc, mc - 1} if mc > 1 else set()) | ({mc + 1} if mc < limit else set()))
    for c in (c for c in grid if c >= 1):
        ok, rec = _fits(mid, mach, quant, c, batch, runtime)
        assert ok == (c <= mc), (mid, c, mc, rec["placement"], rec["fits"])
        assert rec["max_context"] == mc, (mid, c, rec["max_context"], mc)
    from moesim.analysis.sweep import sweep
    tab = sweep(models=[mid], quants=[quant], machines=[mkw], contexts=[1, 4096], batches=[batch],
                runtimes=[runtime] if runtime else None)
    assert set(int(x) for x in tab["max_context"]) == {mc}


def test_sweep_tokens_have_the_same_bound_as_simulate():
    from moesim.analysis.sweep import sweep
    with pytest.raises(MoesimError, match="<= 1,048,576") as exc:
        sweep(models=["mixtral-8x7b"], quants=["Q4_K_M"], machines=["desktop-4090"], contexts=[4096],
              mode="montecarlo", tokens=10**10)
    assert exc.value.field == "run.tokens"


def test_an_in_memory_sweep_too_large_to_hold_is_refused_before_it_runs():
    """A grid whose table would not fit in RAM (here 4 billion rows) is refused naming out=, at once;
    it used to allocate until MemoryError."""
    from moesim.analysis.sweep import sweep
    t0 = time.perf_counter()
    with pytest.raises(MoesimError, match="give out=") as exc:
        sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=["desktop-4090"],
              contexts={"start": 1, "stop": 40960, "num": 40960}, batches=list(range(1, 100001)),
              filter={"allow_beyond_max_context": True}, progress=False)
    assert exc.value.field == "out" and time.perf_counter() - t0 < 10.0


@settings(max_examples=int(os.environ.get("MOESIM_FUZZ_COUNT", "30")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(mid=st.sampled_from(["qwen3-30b-a3b", "gpt-oss-120b", "glm-4.5-air", "deepseek-v2-lite", "llama-3-8b",
                            "mixtral-8x7b", "deepseek-v4-flash", "qwen3-next-80b-a3b"]),
       gpu=st.sampled_from(["rtx-3060", "rtx-4090", "rtx-3090"]), host_gb=st.sampled_from([16, 32, 64, 128]),
       quant=st.sampled_from(["Q2_K", "Q4_K_M", "Q8_0"]), batch=st.sampled_from([1, 3, 16, 64]),
       runtime=st.sampled_from([None, "ktransformers"]))
def test_max_context_boundary_holds_on_random_configurations(mid, gpu, host_gb, quant, batch, runtime):
    """The brute-force property on random model x machine x quant x batch x runtime: fit fits at
    max_context and not one past it (when that is below the model's maximum)."""
    mach = moesim.machine(gpu=gpu, host="ddr5-6000x2", host_mem_gb=host_gb)
    limit = moesim.model(mid).max_context
    try:
        mc = _fits(mid, mach, quant, min(4096, limit), batch, runtime)[1]["max_context"]
    except MoesimError:
        return                                    # e.g. ktransformers on a dense model
    if mc > 0:
        ok, rec = _fits(mid, mach, quant, mc, batch, runtime)
        assert ok and rec["max_context"] == mc, (mc, rec["placement"], rec["fits"])
    if mc < limit:
        ok, rec = _fits(mid, mach, quant, mc + 1, batch, runtime)
        assert not ok and rec["max_context"] == mc, (mc, rec["placement"], rec["fits"])
