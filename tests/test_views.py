"""`moesim rank` and `moesim compare`: rank's rows are the analytic sweep's and equal simulate/fit of
the same configuration; compare's items are fit/simulate's own dicts; sorting, filters, errors, CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import moesim
from moesim.analysis.fit import default_quant_names
from moesim.spec.runtimes import runtime as get_runtime
from moesim.analysis.views import RANK_BY, RANK_FILTERS
from moesim.cli import main

M4090 = dict(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
M4090_ARGV = ["--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "64"]
# a few models of different families and sizes: all GPU, experts offloaded, does not fit at BF16
FEW = ["qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite", "qwen3-next-80b-a3b"]


def _close(a, b, rel=1e-9) -> bool:
    return a == b or abs(a - b) <= rel * abs(b)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def machine():
    return moesim.machine(**M4090)


@pytest.fixture(scope="module")
def catalog_rank(machine):
    return moesim.rank(machine)


@pytest.fixture(scope="module")
def few_rank(machine):
    return moesim.rank(machine, models=FEW)


# ------------------------------------------------------------------------------------ rank: the numbers
def test_rank_covers_the_catalog_as_fit_does(catalog_rank, machine):
    """Every catalog model x fit's default quant that fits at the context appears once; nothing else does."""
    expected = set()
    for mid in moesim.model_ids():
        m = moesim.model(mid)
        if m.max_context and m.max_context < 4096:
            continue
        for rec in moesim.fit(mid, machine, quants=default_quant_names(m, machine), context=4096):
            if rec["fits"] != "no":
                expected.add((mid, rec["quant"]))
    got = [(r["model"], r["quant"]) for r in catalog_rank]
    assert len(got) == len(set(got))
    assert set(got) == expected
    assert [r["rank"] for r in catalog_rank] == list(range(1, len(catalog_rank) + 1))
    speeds = [r["decode_tok_s"] for r in catalog_rank]
    assert speeds == sorted(speeds, reverse=True)


def test_rank_rows_equal_simulate_and_fit(catalog_rank, machine):
    """A sample of rows over the whole catalog: decode/prefill tok/s, max context, placement and fits
    equal simulate(mode="analytic") and fit for the same configuration."""
    rng = np.random.default_rng(7)
    picks = rng.choice(len(catalog_rank), size=min(12, len(catalog_rank)), replace=False)
    for i in picks:
        row = catalog_rank[int(i)]
        where = (row["model"], row["quant"])
        r = moesim.simulate(row["model"], machine, quant=row["quant"], context=row["context"], batch=row["batch"],
                            mode="analytic")
        assert _close(row["decode_tok_s"], r.decode_tok_s), where
        assert _close(row["prefill_tok_s"], r.prefill_tok_s), where
        assert _close(row["tpot_ms"], r.tpot_ms["mean"]), where
        assert row["max_context"] == r.memory["max_context"], where
        assert row["placement"] == r.memory["placement"] and row["fits"] == r.memory["fits"], where
        assert row["runtime"] == r.memory["runtime"] and row["kv_dtype"] == r.memory["kv_dtype"], where
        rec = moesim.fit(row["model"], machine, quants=[row["quant"]], context=row["context"], batch=row["batch"])[0]
        assert _close(row["decode_tok_s"], rec["decode_tok_s"]) and _close(row["prefill_tok_s"], rec["prefill_tok_s"])
        assert row["max_context"] == rec["max_context"] and row["placement"] == rec["placement"], where
        assert row["weights_bytes"] == rec["weights_bytes"], where


def test_rank_model_fields(few_rank):
    """Parameters equal Model.param_counts (counted from the assignment's tensor list); bits per weight
    are the weights' bits over them; the family is the model's."""
    for row in few_rank:
        m = moesim.model(row["model"])
        assert (row["total_params"], row["active_params"]) == m.param_counts()
        assert row["bits_per_weight"] == pytest.approx(8 * row["weights_bytes"] / row["total_params"])
        assert row["family"] == m.family
        for name in ("decode_tok_s", "prefill_tok_s"):     # the sweep's 80 % interval (analysis.intervals)
            if row.get(f"{name}_lo") is not None:      # None until calibration.toml has [intervals]
                assert row[f"{name}_lo"] <= row[name] <= row[f"{name}_hi"]


@pytest.mark.parametrize("by", sorted(RANK_BY))
def test_rank_sorts_descending(machine, few_rank, by):
    rows = moesim.rank(machine, models=FEW, by=by)
    key = RANK_BY[by]
    values = [r[key] for r in rows]
    assert values == sorted(values, reverse=True)
    assert sorted((r["model"], r["quant"]) for r in rows) == sorted((r["model"], r["quant"]) for r in few_rank)


def test_rank_filters_and_limit(machine, few_rank):
    qwen = moesim.rank(machine, models=FEW, filter="family=qwen")
    assert qwen and {r["family"] for r in qwen} == {"qwen3_moe", "qwen3_next"}
    assert len(qwen) == sum(r["family"].startswith("qwen") for r in few_rank)
    long_ = moesim.rank(machine, models=FEW, filter=["min-context=100000"])
    assert long_ and all(r["max_context"] >= 100000 for r in long_)
    assert len(long_) == sum(r["max_context"] >= 100000 for r in few_rank)
    fast = moesim.rank(machine, models=FEW, filter={"min-tps": 100, "family": "deepseek"})
    assert fast and all(r["decode_tok_s"] >= 100 and r["model"] == "deepseek-v2-lite" for r in fast)
    top = moesim.rank(machine, models=FEW, limit=3)
    assert [(r["model"], r["quant"]) for r in top] == [(r["model"], r["quant"]) for r in few_rank[:3]]


def test_rank_context_and_batch_reach_the_sweep(machine):
    rows = moesim.rank(machine, models=["qwen3-30b-a3b", "gpt-oss-20b"], context=65536, batch=2)
    assert rows and {r["model"] for r in rows} == {"gpt-oss-20b"}       # qwen3-30b-a3b's maximum is 40960
    assert all(r["context"] == 65536 and r["batch"] == 2 for r in rows)
    rec = moesim.fit("gpt-oss-20b", machine, quants=[rows[0]["quant"]], context=65536, batch=2)[0]
    assert _close(rows[0]["decode_tok_s"], rec["decode_tok_s"]) and rows[0]["placement"] == rec["placement"]


def test_rank_serving_runtime_ranks_native_checkpoints():
    big = moesim.machine(gpu="h200", gpus=2)
    rows = moesim.rank(big, models=["qwen3-30b-a3b", "gpt-oss-20b"], runtime="vllm")
    assert {r["model"] for r in rows} == {"qwen3-30b-a3b", "gpt-oss-20b"}
    for r in rows:
        m = moesim.model(r["model"])
        native = moesim.simulate(m, big, quant="native", runtime="vllm", mode="analytic").memory["quant"]
        assert r["runtime"] == "vllm" and r["quant"] in (native, "fp8")
    assert default_quant_names(moesim.model("qwen3-30b-a3b"), big, get_runtime("vllm")) == ["native", "fp8"]
    assert [rec["quant"] for rec in moesim.fit("gpt-oss-20b", big, runtime="vllm")] == [
        r["quant"] for r in rows if r["model"] == "gpt-oss-20b"]


@pytest.mark.parametrize("kw, field, says", [
    (dict(filter="colour=red"), "filter", "family"),
    (dict(filter="min-context"), "filter", "key=value"),
    (dict(filter="min-context=lots"), "filter.min-context", "whole number"),
    (dict(filter="min-tps=nan"), "filter.min-tps", "finite"),
    (dict(filter="min-tps=-3"), "filter.min-tps", ">= 0"),
    (dict(filter="family=zz-nothing"), "filter.family", "qwen3_moe"),
    (dict(filter=[3]), "filter", "key=value"),
    (dict(by="price"), "by", "speed"),
    (dict(limit=0), "limit", ""),
    (dict(batch=0), "batch", ""),
    (dict(context=10**12), "context", ""),
    (dict(models=["nope-7b"]), "model", ""),
    (dict(runtime="nope"), "runtime", ""),
    (dict(kv_dtype="zz"), "kv_dtype", "q8_0"),
])
def test_rank_bad_arguments_name_the_field(machine, kw, field, says):
    kw.setdefault("models", FEW[:1])
    with pytest.raises(moesim.MoesimError) as e:
        moesim.rank(machine, **kw)
    assert e.value.field == field and says in str(e.value)
    if field == "filter":       # a bad key or form lists the valid keys
        assert all(k in str(e.value) for k in RANK_FILTERS)


def test_rank_cli_json_and_text(capsys, catalog_rank):
    code, out, err = run(capsys, "rank", *M4090_ARGV, "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(catalog_rank))
    code, out, err = run(capsys, "rank", *M4090_ARGV, "--by", "context", "--filter", "family=qwen",
                         "--filter", "min-tps=20,min-context=32768", "--limit", "5")
    assert code == 0, err
    lines = out.splitlines()
    assert "sorted by max context" in lines[1] and lines[-1] == "5 configurations"
    assert len(lines) == 2 + 1 + 5 + 1 and all("qwen" in line for line in lines[3:-1])
    code, _, err = run(capsys, "rank", *M4090_ARGV, "--filter", "size=big")
    assert code == 2 and err.startswith("moesim: error: filter: unknown filter 'size'")


# ------------------------------------------------------------------------------------ compare
def _same(item: dict, ref: dict) -> None:
    """An item equals the fit/simulate dict of its configuration (every field)."""
    assert item == ref


def test_compare_models_are_simulate_dicts(machine):
    items = moesim.compare(["qwen3-30b-a3b", "gpt-oss-20b"], machine)
    assert [d["model"] for d in items] == ["qwen3-30b-a3b", "gpt-oss-20b"]
    for d in items:
        _same(d, moesim.simulate(d["model"], machine, quant="Q4_K_M", mode="analytic").to_dict())
        rec = moesim.fit(d["model"], machine, quants=["Q4_K_M"])[0]
        assert _close(d["decode_tok_s"], rec["decode_tok_s"]) and _close(d["prefill_tok_s"], rec["prefill_tok_s"])
        assert all(d[k] == rec[k] for k in ("memory_by_tier", "fits", "max_context", "max_batch", "placement", "flags"))


def test_compare_quants_and_machines(machine):
    items = moesim.compare("qwen3-30b-a3b", machine, quants=["Q4_K_M", "Q8_0"], context=8192, batch=2)
    assert [d["quant"] for d in items] == ["Q4_K_M", "Q8_0"]
    for d in items:
        _same(d, moesim.simulate("qwen3-30b-a3b", machine, quant=d["quant"], context=8192, batch=2,
                                 mode="analytic").to_dict())
    m5090 = moesim.machine(gpu="rtx-5090", host="ddr5-6000x2", host_mem_gb=64)
    a, b = moesim.compare("qwen3-30b-a3b", [machine, m5090])
    assert a["machine"] == machine.describe() and b["machine"] == m5090.describe()
    _same(b, moesim.simulate("qwen3-30b-a3b", m5090, quant="Q4_K_M", mode="analytic").to_dict())
    assert b["decode_tok_s"] > a["decode_tok_s"]        # more bandwidth


def test_compare_item_that_does_not_fit_is_fits_dict():
    small = moesim.machine(gpu="rtx-4090", host_mem_gb=16, storage="none")
    ok, no = moesim.compare(["qwen3-30b-a3b", "deepseek-r1"], small)
    assert no["fits"] == "no" and no["decode_tok_s"] is None
    assert no == moesim.fit("deepseek-r1", small, quants=["Q4_K_M"])[0]
    assert ok["fits"] != "no" and ok["ttft_s"] > 0


def test_compare_bounds():
    with pytest.raises(moesim.MoesimError) as e:
        moesim.compare(["qwen3-30b-a3b"] * 9, [M4090] * 8)
    assert e.value.field == "compare" and "64" in str(e.value)
    with pytest.raises(moesim.MoesimError) as e:
        moesim.compare([], M4090)
    assert e.value.field == "models"


def test_compare_cli(capsys, machine):
    code, out, err = run(capsys, "compare", "qwen3-30b-a3b", "gpt-oss-20b", *M4090_ARGV, "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(moesim.compare(["qwen3-30b-a3b", "gpt-oss-20b"], machine)))
    code, out, err = run(capsys, "compare", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--gpu", "rtx-5090",
                         "--host", "ddr5-6000x2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("machine 1: 1x rtx-4090") and lines[1].startswith("machine 2: 1x rtx-5090")
    header = lines[2].split()
    assert header == ["machine", "1", "machine", "2"]
    decode = next(line for line in lines if line.startswith("decode tok/s")).split()[2:]
    assert len(decode) == 2 and all(math.isfinite(float(x)) for x in decode)
    # every row's cells end under the item headers (right-aligned; title rows have no cells)
    table = lines[2:lines.index("runtime flags:")]
    assert all(len(line) == len(lines[2]) for line in table if not line.endswith(("ms", "GB")))
    code, _, err = run(capsys, "compare", "qwen3-30b-a3b", "--machine", "desktop-4090", "--machine", "dgx-h200",
                       "--gpu", "rtx-4090", "--gpu", "h100")
    assert code == 2 and err.startswith("moesim: error: machine:")


@pytest.mark.parametrize("argv", [
    ["rank", *M4090_ARGV, "--context", "-1"], ["rank", *M4090_ARGV, "--context", "nan"],
    ["rank", *M4090_ARGV, "--context", "9223372036854775808"], ["rank", *M4090_ARGV, "--batch", "0"],
    ["rank", *M4090_ARGV, "--batch", "2147483648"], ["rank", *M4090_ARGV, "--limit", "0"],
    ["rank", *M4090_ARGV, "--by", "x"], ["rank", *M4090_ARGV, "--filter", ""], ["rank", *M4090_ARGV, "--filter", "="],
    ["rank", *M4090_ARGV, "--filter", "min-tps=inf"], ["rank", *M4090_ARGV, "--filter", "min-context=1e300"],
    ["rank", *M4090_ARGV, "--filter", "family="], ["rank", *M4090_ARGV, "--runtime", "nope"],
    ["rank", *M4090_ARGV, "--kv-dtype", "zz"], ["rank", "--gpu", "rtx-9090"], ["rank"], ["rank", "--json"],
    ["compare"], ["compare", "qwen3-30b-a3b"], ["compare", "qwen3-30b-a3b", *M4090_ARGV, "--quant", "zz"],
    ["compare", "qwen3-30b-a3b", *M4090_ARGV, "--context", "0"], ["compare", "nope", *M4090_ARGV],
    ["compare", "qwen3-30b-a3b", *M4090_ARGV, "--mode", "x"], ["compare", "qwen3-30b-a3b", "--machine", "nope"],
    ["compare", "qwen3-30b-a3b", *M4090_ARGV, "--placement", "bogus"], ["compare", "qwen3-30b-a3b", "--gpu", ""],
    ["compare", "qwen3-30b-a3b", *M4090_ARGV, "--gpus", "nan"],
])
def test_views_cli_refuses_bad_input_in_one_line(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out, (argv, out)
    assert err.startswith("moesim: error: ") and err.count("\n") == 1, err
