"""simulate's options as sweep axes (issue 19): cache_experts, prefetch_recall, mtp, mtp_acceptance, parallel
and routing. Every row of a sweep over random points equals ``simulate(mode="analytic")`` of the same
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
        for a in ("cache_experts", "mtp"):
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
