"""simulate's options as sweep axes (issue 19): cache_experts, prefetch_recall, mtp, mtp_acceptance, parallel,
routing, prompt and ubatch. Every row of a sweep over random points equals ``simulate(mode="analytic")`` of the same
configuration; a spec without them gives the table it gave before; bad values name axes.<name>[i]."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.analysis.sweep import build_spec, column_names, normalize_spec, spec_hash, sweep

CHEAP = ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"]
MTP_MODELS = ["glm-4.5-air"]                        # has MTP modules (CHEAP models do not)
M64 = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "4090-64g"}
M192 = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 192, "name": "4090-192g"}
H200X8 = {"gpu": "h200", "gpus": 8, "name": "h200x8"}
MACHINES = {"4090-64g": M64, "4090-192g": M192, "h200x8": H200X8}
SKIP = {"skip_inapplicable": True, "allow_beyond_max_context": True}
SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _close(a, b, rel=1e-9) -> bool:
    return a == b or abs(a - b) <= rel * abs(b)


def _machine(label: str):
    return moesim.machine(**{k: v for k, v in MACHINES[label].items() if k != "name"})


def _check_against_simulate(tab, options: tuple, runtime=None, placement=None) -> int:
    """Every row of tab equals simulate(mode="analytic") of its configuration (the option columns as
    simulate's keywords; "auto" = None). Returns the rows checked."""
    rows = tab.to_dicts()
    for row in rows:
        kw = {a: (None if row[a] == "auto" else row[a]) for a in options}
        for a in ("cache_experts", "mtp", "prompt", "ubatch"):
            if a in kw:
                kw[a] = int(kw[a])
        r = moesim.simulate(row["model"], _machine(row["machine"]), quant=row["quant"], context=int(row["context"]),
                            batch=int(row["batch"]), runtime=runtime, placement=placement, mode="analytic", seed=0,
                            allow_beyond_max_context=True, **kw)
        where = {k: row[k] for k in ("model", "machine", "placement", "context", "batch") + options}
        assert row["placement"] == r.memory["placement"], where
        assert row["fits"] == r.memory["fits"], where
        assert row["max_context"] == r.memory["max_context"], where
        assert _close(row["decode_tok_s"], r.decode_tok_s), (row["decode_tok_s"], r.decode_tok_s, where)
        assert _close(row["prefill_tok_s"], r.prefill_tok_s), (row["prefill_tok_s"], r.prefill_tok_s, where)
        hit = r.expert_hit_rate
        assert (math.isnan(row["expert_hit_rate"]) if hit is None else _close(row["expert_hit_rate"], hit)), where
    return len(rows)


def _grid(draw, models=CHEAP, machines=("4090-64g", "4090-192g")) -> dict:
    return dict(models=draw(st.lists(st.sampled_from(models), min_size=1, max_size=2, unique=True)),
                quants=[draw(st.sampled_from(["Q4_K_M", "Q8_0"]))],
                machines=[MACHINES[m] for m in draw(st.lists(st.sampled_from(machines), min_size=1, max_size=2,
                                                             unique=True))],
                contexts=draw(st.lists(st.sampled_from([1, 512, 4096, 32768]), min_size=1, max_size=2, unique=True)),
                batches=draw(st.lists(st.sampled_from([1, 2, 5, 16]), min_size=1, max_size=2, unique=True)),
                filter=SKIP, progress=False)


# ------------------------------------------------------------------------------ defaults
def test_defaults_reproduce_the_old_table():
    """A spec without option axes keeps the old columns and hash; the option axes at simulate's defaults
    (no prefetch, no drafts, auto layout and routing) give the same numbers, plus their columns."""
    base = dict(models=CHEAP, quants=["Q4_K_M"], machines=[M64, H200X8], contexts=[512, 8192], batches=[1, 8],
                filter=SKIP, progress=False)
    plain = sweep(**base)
    assert plain.column_names == list(column_names("analytic"))
    norm = normalize_spec(build_spec(**{k: v for k, v in base.items() if k != "progress"}))
    assert not {"cache_experts", "prefetch_recall", "mtp", "mtp_acceptance", "parallel", "routing"} & set(norm["axes"])
    assert plain.metadata["spec_hash"] == spec_hash(norm)
    same = sweep(**base, prefetch_recall=[0.0], mtp=[0], parallel=["auto"], routing=["auto"])
    assert same.column_names == list(column_names("analytic", ("prefetch_recall", "mtp", "parallel", "routing")))
    assert len(same) == len(plain) > 0
    for c in plain.column_names:
        a, b = np.asarray(plain[c]), np.asarray(same[c])
        assert (np.array_equal(a, b, equal_nan=True) if a.dtype.kind == "f" else np.array_equal(a, b)), c


# ------------------------------------------------------------------------------ sweep == simulate
@SETTINGS
@given(st.data())
def test_cache_experts_equals_simulate(data):
    kw = _grid(data.draw)
    ce = data.draw(st.lists(st.integers(0, 160), min_size=1, max_size=2, unique=True))
    placements = [data.draw(st.sampled_from(["auto", "offload-cache=4"]))]
    tab = sweep(**kw, cache_experts=ce, placements=placements)
    assert set(tab["cache_experts"].tolist()) <= set(ce)
    assert _check_against_simulate(tab, ("cache_experts",)) > 0


@SETTINGS
@given(st.data())
def test_prefetch_recall_equals_simulate(data):
    kw = _grid(data.draw)
    recall = data.draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=2, unique=True))
    ce = data.draw(st.sampled_from([None, [8]]))         # an expert cache is where prefetch matters
    tab = sweep(**kw, prefetch_recall=recall, cache_experts=ce)
    assert _check_against_simulate(tab, ("prefetch_recall",) + (("cache_experts",) if ce else ())) > 0


@SETTINGS
@given(st.data())
def test_mtp_equals_simulate(data):
    kw = _grid(data.draw, models=MTP_MODELS + CHEAP[:1])
    mtp = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=2, unique=True))
    acc = data.draw(st.sampled_from([None, [0.55], [1.0, 0.3]]))
    tab = sweep(**kw, mtp=mtp, mtp_acceptance=acc)
    # the model without MTP modules keeps only its mtp = 0 rows (skip_inapplicable)
    assert not np.any((tab["model"] == CHEAP[0]) & (tab["mtp"] > 0))
    if acc and MTP_MODELS[0] in kw["models"] and max(mtp) > 0:   # glm4_moe has no measured acceptance
        assert np.any(tab["mtp"] > 0)
    assert _check_against_simulate(tab, ("mtp",) + (("mtp_acceptance",) if acc else ())) > 0 or min(mtp) > 0


@SETTINGS
@given(st.data())
def test_parallel_equals_simulate(data):
    kw = _grid(data.draw, machines=("h200x8",))
    par = data.draw(st.lists(st.sampled_from(["auto", "tp2", "tp8", "ep8", "ep4", "tp4-ep2", "tp8-ep8-attn-dp",
                                              "layer-split", "tp16"]), min_size=1, max_size=3, unique=True))
    tab = sweep(**kw, runtimes=["vllm"], parallel=par)
    assert "tp16" not in set(tab["parallel"].tolist())        # 16 GPUs on an 8-GPU machine: dropped
    n = _check_against_simulate(tab, ("parallel",), runtime="vllm")
    assert n > 0 or par == ["tp16"]


@SETTINGS
@given(st.data())
def test_routing_equals_simulate(data):
    kw = _grid(data.draw)
    routing = data.draw(st.lists(st.sampled_from(["auto", "generic", "mixtral", "qwen", "gpt-oss:pooled"]),
                                 min_size=1, max_size=2, unique=True))
    ce = data.draw(st.sampled_from([None, [16]]))
    tab = sweep(**kw, routing=routing, cache_experts=ce)
    assert _check_against_simulate(tab, ("routing",) + (("cache_experts",) if ce else ())) > 0


@SETTINGS
@given(st.data())
def test_prompt_and_ubatch_equal_simulate(data):
    """The prefill axes: prompt lengths and llama.cpp physical batches, under hybrid and GPU placements
    (the ubatch sets each pass's expert union and, with op offload, the experts copied per pass)."""
    kw = _grid(data.draw)
    prompt = data.draw(st.lists(st.sampled_from([1, 100, 512, 4096, 20000]), min_size=1, max_size=2, unique=True))
    ub = data.draw(st.lists(st.sampled_from([1, 31, 32, 128, 512, 2048, 8192]), min_size=1, max_size=2, unique=True))
    placements = [data.draw(st.sampled_from(["auto", "n-cpu-moe=8", "experts-cpu"]))]
    tab = sweep(**kw, prompt=prompt, ubatch=ub, placements=placements)
    assert set(tab["prompt"].tolist()) <= set(prompt) and set(tab["ubatch"].tolist()) <= set(ub)
    fixed = None if placements == ["auto"] else placements[0]
    assert _check_against_simulate(tab, ("prompt", "ubatch"), placement=fixed) > 0


def test_ubatch_changes_prefill_not_decode_and_drops_serving_runtimes():
    """A larger physical batch reads each expert once for more tokens: hybrid prefill rises with it up to
    the prompt, decode does not move; runtimes without the setting are inapplicable (dropped with skip)."""
    tab = sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M64], placements=["n-cpu-moe=30"],
                runtimes=["llama.cpp", "vllm"], prompt=[8192], ubatch=[64, 512, 4096, 16384],
                filter={"skip_inapplicable": True}, progress=False)
    assert set(tab["runtime"].tolist()) == {"llama.cpp"}
    pf = dict(zip(tab["ubatch"].tolist(), tab["prefill_tok_s"].tolist()))
    assert pf[64] < pf[512] < pf[4096] <= pf[16384] * (1 + 1e-9)
    assert len(set(np.round(tab["decode_tok_s"], 9).tolist())) == 1
    # one prompt length is the run option (no column, as before); a list is the axis
    assert "prompt" not in sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M64], prompt=1024,
                                 progress=False).column_names
    with pytest.raises(MoesimError, match="axes.prompt"):
        sweep({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": [M64], "prompt": [512]},
               "run": {"prompt": 512}}, progress=False)


def test_simulate_ubatch_sets_the_launch_line_and_refuses_serving_runtimes():
    r = moesim.simulate("qwen3-30b-a3b", _machine("4090-64g"), quant="Q4_K_M", placement="n-cpu-moe=30",
                        prompt=8192, ubatch=4096, mode="analytic")
    assert "-ub 4096 -b 4096" in " ".join(r.memory["advice"]["args"])
    base = moesim.simulate("qwen3-30b-a3b", _machine("4090-64g"), quant="Q4_K_M", placement="n-cpu-moe=30",
                           prompt=8192, mode="analytic")
    assert r.prefill_tok_s > base.prefill_tok_s and _close(r.decode_tok_s, base.decode_tok_s)
    with pytest.raises(MoesimError, match="ubatch"):
        moesim.simulate("qwen3-30b-a3b", "dgx-h200", quant="fp8", runtime="vllm", ubatch=256, mode="analytic")
    with pytest.raises(MoesimError, match="ubatch"):
        moesim.simulate("qwen3-30b-a3b", _machine("4090-64g"), ubatch=0, mode="analytic")


def test_zipped_option_axes_and_directory(tmp_path):
    """Option axes zip with other slow axes, and a sweep directory keeps their columns."""
    kw = dict(models=["qwen3-30b-a3b", "mixtral-8x7b"], quants=["Q4_K_M"], machines=[M64], routing=["qwen", "mixtral"],
              cache_experts=[16, 4], zip=[["models", "routing", "cache_experts"]], progress=False)
    tab = sweep(**kw)
    assert [(r["model"], r["routing"], r["cache_experts"], r["placement"]) for r in tab.to_dicts()] == [
        ("qwen3-30b-a3b", "qwen", 16, "offload-cache=16"), ("mixtral-8x7b", "mixtral", 4, "offload-cache=4")]
    sweep(**kw, out=tmp_path / "s", format="parquet")
    back = moesim.analysis.sweep.read(tmp_path / "s")
    assert back["routing"].tolist() == ["qwen", "mixtral"] and back["cache_experts"].tolist() == [16, 4]


# ------------------------------------------------------------------------------ bad values
@pytest.mark.parametrize("kw, where, value", [
    (dict(cache_experts=[-1]), "axes.cache_experts[0]", "-1"),
    (dict(cache_experts=[8, "x"]), "axes.cache_experts[1]", "'x'"),
    (dict(cache_experts=[4], placements=["experts-cpu"]), "axes.cache_experts[0]", "experts-cpu"),
    (dict(prefetch_recall=[1.5]), "axes.prefetch_recall[0]", "1.5"),
    (dict(prefetch_recall=[True]), "axes.prefetch_recall[0]", "True"),
    (dict(prefetch_recall=[float("nan")]), "axes.prefetch_recall[0]", "nan"),
    (dict(mtp=[65]), "axes.mtp[0]", "65"),
    (dict(mtp=[2]), "axes.mtp[0]", "mtp = 2"),                      # qwen3-30b-a3b has no MTP modules
    (dict(mtp_acceptance=[0.0]), "axes.mtp_acceptance[0]", "0.0"),
    (dict(mtp_acceptance=[1.01]), "axes.mtp_acceptance[0]", "1.01"),
    (dict(parallel=["zz3"]), "axes.parallel[0]", "zz3"),
    (dict(parallel=["auto", "tp16"], machines=[H200X8]), "axes.parallel[1]", "tp16"),
    (dict(routing=["nope"]), "axes.routing[0]", "nope"),
    (dict(routing=[3]), "axes.routing[0]", "3"),
    (dict(mtp=[], ), "axes.mtp", "empty"),
    (dict(mtp=[1], models=MTP_MODELS, mode="montecarlo"), "axes.mtp", "analytic"),
    (dict(prefetch_recall=[0.5], mode="montecarlo"), "axes.prefetch_recall", "analytic"),
    (dict(prompt=[512, 0]), "axes.prompt[1]", "0"),
    (dict(ubatch=[1 << 18]), "axes.ubatch[0]", "262,144"),
    (dict(ubatch=[256], runtimes=["vllm"], machines=[H200X8]), "axes.ubatch[0]", "llama.cpp family"),
])
def test_bad_values_name_the_axis(kw, where, value):
    args = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M64], progress=False)
    args.update(kw)
    with pytest.raises(MoesimError) as e:
        sweep(**args)
    assert where in str(e.value) and value in str(e.value), str(e.value)


def test_inapplicable_parallel_is_dropped_with_skip():
    tab = sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[H200X8], runtimes=["vllm"],
                parallel=["tp16", "ep8"], filter={"skip_inapplicable": True}, progress=False)
    assert tab["parallel"].tolist() == ["ep8"]
