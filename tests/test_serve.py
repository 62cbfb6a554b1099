"""Serving under load (``moesim.serve_sim``): the C scheduler against its Python twin, the concurrency-1
identity with ``simulate``, and the invariants of issue 16 (throughput, prefix cache, prompt length, seed)."""
from __future__ import annotations

import functools
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.analysis.serve import serve_sim, sweep_concurrency
from moesim.analysis.simulate import simulate
from moesim.engine import serve as ESERVE
from moesim.engine.reference import serve as RSERVE

H100 = moesim.machine(gpu="h100-sxm", gpus=1)
DIFF_EXAMPLES = int(os.environ.get("MOESIM_DIFF_EXAMPLES", "150"))   # 25 under the sanitized build
SMALL = dict(model="gpt-oss-20b", machine=H100)


# ------------------------------------------------------------------------------ C == twin
def _grid(draw, n_max, lo, hi):
    n = draw(st.integers(1, n_max))
    pts = sorted(set(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))))
    return [float(p) for p in pts]


@st.composite
def serve_inputs(draw):
    gb, gc = _grid(draw, 5, 1, 64), _grid(draw, 4, 1, 3000)
    gp, gd = _grid(draw, 5, 1, 4096), _grid(draw, 4, 0, 3000)
    val = st.floats(1e-4, 1.0, allow_nan=False)
    table = dict(grid_b=gb, grid_c=gc, grid_p=gp, grid_d=gd, forward_s=draw(st.floats(0.0, 0.01)),
                 decode_s=[[draw(val) for _ in gc] for _ in gb], prefill_s=[[draw(val) for _ in gd] for _ in gp])
    isl, osl = draw(st.integers(1, 300)), draw(st.integers(1, 40))
    bs = draw(st.sampled_from([1, 4, 16]))
    closed = draw(st.booleans())
    need = math.ceil((isl + osl) / bs)
    cfg = dict(closed_loop=closed, concurrency=draw(st.integers(1, 12)), rate=draw(st.floats(0.1, 500.0)),
               n_requests=draw(st.integers(1, 24)), isl=isl, osl=osl,
               max_num_batched_tokens=draw(st.integers(1, 512)), max_num_seqs=draw(st.integers(1, 16)),
               block_size=bs, state_blocks=draw(st.integers(0, 2)), prefix_blocks=draw(st.integers(0, 20)),
               snapshot_blocks=draw(st.integers(0, 3)), max_steps=10**6)
    cfg["n_blocks"] = need + cfg["state_blocks"] + cfg["snapshot_blocks"] + draw(st.integers(0, 3 * need))
    return table, cfg, draw(st.integers(0, 2**32))


@settings(max_examples=DIFF_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(serve_inputs())
def test_c_scheduler_matches_python_twin(inputs):
    """Bit-identical event times and counters from the C core and the twin on random tables and workloads
    (small KV pools included, so preemption and recomputation are exercised)."""
    table, cfg, seed = inputs
    c_out = ESERVE.run(table, cfg, seed, 3)
    r_out = ESERVE.run(table, cfg, seed, 3, engine="reference")
    for key in ("arrival_s", "first_token_s", "finish_s", "preemptions"):
        assert list(c_out[key]) == list(r_out[key]), key
    for key in ("steps", "preempted", "max_running", "peak_blocks", "busy_s"):
        assert c_out[key] == r_out[key], key
    assert np.all(np.asarray(c_out["finish_s"]) >= np.asarray(c_out["first_token_s"]))
    assert np.all(np.asarray(c_out["first_token_s"]) >= np.asarray(c_out["arrival_s"]))


def _tiny_table():
    return dict(grid_b=[1.0, 8.0], grid_c=[1.0, 1000.0], decode_s=[[0.01, 0.02], [0.02, 0.04]],
                grid_p=[1.0, 512.0], grid_d=[0.0, 1000.0], prefill_s=[[0.01, 0.02], [0.1, 0.2]], forward_s=0.01)


def _cfg(**kw):
    cfg = dict(closed_loop=True, concurrency=8, rate=0.0, n_requests=32, isl=100, osl=50,
               max_num_batched_tokens=256, max_num_seqs=8, block_size=16, n_blocks=1000, state_blocks=0,
               prefix_blocks=0, snapshot_blocks=0, max_steps=10**6)
    cfg.update(kw)
    return cfg


def test_small_pool_preempts_and_recomputes():
    """A pool that holds two whole requests but not eight forces preemption (recompute); every request
    still completes, and C and twin agree."""
    cfg = _cfg(n_blocks=20)
    out = ESERVE.run(_tiny_table(), cfg)
    assert out["preempted"] > 0 and out["peak_blocks"] <= 20
    assert np.all(np.asarray(out["finish_s"]) > 0)
    ref = ESERVE.run(_tiny_table(), cfg, engine="reference")
    assert list(ref["finish_s"]) == list(out["finish_s"])


def test_pool_too_small_for_one_chunk_is_an_error():
    with pytest.raises(MoesimError) as e:
        ESERVE.run(_tiny_table(), _cfg(n_blocks=3))
    assert e.value.field == "kv"


def test_bad_table_is_a_kernel_error_not_a_crash():
    bad = dict(_tiny_table(), grid_b=[8.0, 1.0])
    with pytest.raises(moesim.errors.KernelError):
        ESERVE.run(bad, _cfg())


def test_interpolation_hits_grid_points_and_clamps():
    t = _tiny_table()
    assert RSERVE.interp(t["grid_b"], t["grid_c"], t["decode_s"], 8.0, 1000.0) == 0.04
    assert RSERVE.interp(t["grid_b"], t["grid_c"], t["decode_s"], 100.0, 5000.0) == 0.04
    assert RSERVE.interp(t["grid_b"], t["grid_c"], t["decode_s"], 4.5, 1.0) == pytest.approx(0.015)


# ------------------------------------------------------------------------------ the model
@functools.lru_cache(maxsize=None)
def _serve(**kw):
    args = dict(SMALL, isl=512, osl=64, requests=8)
    args.update(kw)
    return serve_sim(**args)


def test_concurrency_one_reproduces_simulate():
    """Issue 16: at concurrency 1 TTFT is the prompt's prefill and TPOT simulate's (analytic) within 1 %."""
    r = _serve(concurrency=1, requests=3)
    s = simulate("gpt-oss-20b", H100, context=512 + 32, prompt=512, mode="analytic", tokens=8)
    assert r.ttft_ms["p50"] == pytest.approx(s.ttft_s * 1e3, rel=1e-3)
    assert r.tpot_ms["mean"] == pytest.approx(s.tpot_ms["mean"], rel=0.01)
    assert r.scheduler["max_running"] == 1 and r.scheduler["preemptions"] == 0


def test_throughput_non_decreasing_in_concurrency_until_saturation():
    levels = [1, 2, 4, 8, 16, 32]
    agg = [_serve(concurrency=c, requests=4 * c).aggregate_tok_s for c in levels]
    assert all(b >= a * 0.999 for a, b in zip(agg, agg[1:])), agg
    assert agg[-1] > 4 * agg[0]


def test_sweep_concurrency_marks_pareto_points():
    curve = sweep_concurrency("gpt-oss-20b", H100, [1, 4, 16], isl=256, osl=32)
    pts = curve["points"]
    assert [p["concurrency"] for p in pts] == [1, 4, 16]
    assert any(p["pareto"] for p in pts)
    # the fastest per user and the most per GPU are both on the frontier
    assert max(pts, key=lambda p: p["per_user_tok_s"])["pareto"]
    assert max(pts, key=lambda p: p["per_gpu_tok_s"])["pareto"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 48))
def test_more_concurrency_never_below_concurrency_one(c):
    assert _serve(concurrency=c, requests=2 * c).aggregate_tok_s >= _serve(concurrency=1, requests=2).aggregate_tok_s


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 512), st.integers(1, 8))
def test_prefix_cache_never_increases_ttft(prefix, c):
    plain = _serve(concurrency=c, requests=3 * c)
    cached = _serve(concurrency=c, requests=3 * c, prefix_tokens=prefix)
    assert cached.ttft_ms["mean"] <= plain.ttft_ms["mean"] * (1 + 1e-12)
    assert cached.kv["peak_blocks"] <= plain.kv["peak_blocks"]


def test_prefix_cache_lowers_ttft_of_later_requests():
    r = _serve(concurrency=1, requests=4, prefix_tokens=480)
    plain = _serve(concurrency=1, requests=4)
    assert r.kv["prefix_blocks"] == 480 // 16
    short = _serve(concurrency=1, requests=4, isl=32)
    # later requests prefill only the 32 tokens past the prefix (on top of its 480 cached ones)
    assert short.ttft_ms["p50"] <= r.ttft_ms["p50"] < 0.7 * plain.ttft_ms["p50"]
    assert r.ttft_ms["p99"] == pytest.approx(plain.ttft_ms["p99"], rel=0.02)   # the first request pays it


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(16, 2000), st.integers(1, 500))
def test_longer_prompts_never_lower_ttft(isl, extra):
    a = _serve(isl=isl, concurrency=2, requests=4)
    b = _serve(isl=isl + extra, concurrency=2, requests=4)
    assert b.ttft_ms["mean"] >= a.ttft_ms["mean"]


def test_same_seed_same_result_poisson():
    a = _serve(rate=20.0, requests=24, seed=5).to_dict()
    b = serve_sim(**SMALL, isl=512, osl=64, requests=24, rate=20.0, seed=5).to_dict()
    c = serve_sim(**SMALL, isl=512, osl=64, requests=24, rate=20.0, seed=6).to_dict()
    assert a == b
    assert a["e2e_s"] != c["e2e_s"]


def test_goodput_counts_requests_within_slo():
    r = _serve(concurrency=8, requests=16, slo_ttft_ms=1e9, slo_tpot_ms=1e9)
    assert r.goodput["fraction"] == 1.0 and r.goodput["tok_s"] == pytest.approx(r.aggregate_tok_s)
    tight = _serve(concurrency=8, requests=16, slo_tpot_ms=1e-6)
    assert tight.goodput["fraction"] == 0.0 and tight.goodput["req_s"] == 0.0


def test_linear_attention_prefix_keeps_state_snapshots():
    """qwen3-next (Gated DeltaNet + attention) under vLLM: a page holds one layer's whole recurrent state, so
    the block is 16 x ceil(2,146,304 / (16 x 2,048)) = 1,056 tokens (per GDN layer 32 heads x 128 x 128 fp32
    + a 3 x 8,192 bf16 conv state; per attention layer 2 KV heads x 256 x 2 x 2 B per token); each cached
    block boundary keeps one state snapshot, counted against the pool. SGLang keeps one per cached prefix
    (its radix-tree node), at its page of 1 token. A model without recurrent state keeps none."""
    m = moesim.machine(gpu="h200", gpus=2)
    kw = dict(quant="fp8", isl=3000, osl=16, concurrency=2, requests=4, prefix_tokens=2500)
    kv = serve_sim("qwen3-next-80b-a3b", m, **kw).kv
    assert kv["block_size"] == 1056 and kv["state_bytes_per_seq"] == 36 * 2146304
    assert kv["prefix_blocks"] == 2 and kv["snapshots"] == 2 and kv["state_blocks"] >= 1
    assert kv["snapshot_bytes"] == 2 * kv["state_bytes_per_seq"]
    assert kv["snapshot_blocks"] == math.ceil(kv["snapshot_bytes"] / kv["bytes_per_block"])
    short = serve_sim("qwen3-next-80b-a3b", m, **dict(kw, prefix_tokens=800)).kv
    assert short["prefix_blocks"] == 0 and short["snapshot_blocks"] == 0     # shorter than a block: no hit
    sg = serve_sim("qwen3-next-80b-a3b", m, runtime="sglang", **kw).kv
    assert sg["block_size"] == 1 and sg["prefix_blocks"] == 2500 and sg["snapshots"] == 1
    assert _serve(concurrency=2, prefix_tokens=256).kv["snapshot_blocks"] == 0


@pytest.mark.parametrize("kw, field", [
    (dict(rate=1.0, concurrency=2), "rate"), (dict(), "rate"), (dict(concurrency=0), "concurrency"),
    (dict(concurrency=2, prefix_tokens=600), "prefix_tokens"), (dict(concurrency=2, isl=0), "isl"),
    (dict(rate=-1.0), "rate"), (dict(concurrency=2, slo_tpot_ms=float("nan")), "slo_tpot_ms"),
])
def test_bad_workload_names_the_field(kw, field):
    with pytest.raises(MoesimError) as e:
        serve_sim(**dict(SMALL, isl=kw.pop("isl", 512), osl=64, requests=4, **kw))
    assert e.value.field == field


# ------------------------------------------------------------------------------ serving rows in validate
def test_serving_workload_reads_the_row_not_a_fit():
    from moesim.analysis.serving_rows import serving_workload
    row = {"notes": "attention-DP; max_batch 896; max_num_tokens 2048; concurrency 7168; OSL 2048 synthetic"}
    assert serving_workload(row, 7168, 1024, 8) == dict(concurrency=7168, isl=1024, osl=2048, max_num_seqs=7168,
                                                        max_num_batched_tokens=16384, per_user=True)
    row = {"notes": "random 512 in/1024 out; max concurrency 32; decode = aggregate/batch"}
    assert serving_workload(row, 32, 512, 1)["osl"] == 1024
    assert serving_workload(row, 32, 512, 1)["per_user"] is False
    assert serving_workload({"notes": "concurrency not stated"}, 10, 512, 1) is None
    assert serving_workload({"notes": "concurrency 32"}, 32, 512, 1) is None          # no output length


def test_validate_predicts_serving_rows_with_serve_sim():
    from moesim.analysis.validate import evaluate_rows, load_rows, summarise
    from moesim.ingest.packaged import measurements_csv
    from moesim.report.text import validate_text
    rows = [r for r in load_rows(measurements_csv()) if r["id"] in ("DC-05", "DC-15", "DC-01")]
    _, records, skipped = evaluate_rows(rows)
    by_id = {r["id"]: r for r in records}
    assert by_id["DC-01"]["serving"] is None
    for rid, conc, osl in (("DC-05", 1024, 2048), ("DC-15", 32, 1024)):
        r = by_id[rid]
        assert r["serving"]["workload"]["concurrency"] == conc and r["serving"]["workload"]["osl"] == osl
        assert r["decode_predicted"] == r["serving"]["decode"] != r["decode_step_predicted"]
        assert r["aggregate_err"] is not None
    s = summarise(records, skipped)
    assert s["serving"]["decode"]["n"] == 2 and s["serving"]["rows"] == ["DC-05", "DC-15"]
    assert "serving rows (serve-sim" in validate_text({"summary": s, "rows": records})


# ------------------------------------------------------------------------------ command line
def test_cli_serve_sim_text_and_json(capsys):
    import json
    from moesim.cli import main
    base = ["serve-sim", "gpt-oss-20b", "--gpu", "h100-sxm", "--isl", "256", "--osl", "16"]
    assert main(base + ["--concurrency", "4", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50",
                        "--prefix-tokens", "128"]) == 0
    text = capsys.readouterr().out
    assert "TTFT ms" in text and "goodput" in text and "prefix cache 8 blocks shared" in text
    assert main(base + ["--rate", "5", "--requests", "20", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["workload"]["rate"] == 5.0 and d["workload"]["requests"] == 20 and d["kv"]["n_blocks"] > 0
    assert main(base + ["--sweep-concurrency", "1,4", "--json"]) == 0
    assert [p["concurrency"] for p in json.loads(capsys.readouterr().out)["points"]] == [1, 4]
    assert main(base + ["--sweep-concurrency", "1,4"]) == 0
    assert "Pareto point" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    ([], "give --rate, --concurrency or --sweep-concurrency"),
    (["--rate", "1", "--concurrency", "2"], "not allowed with"),
    (["--sweep-concurrency", "1,x"], "comma-separated integers"),
    (["--concurrency", "2", "--isl", "200000"], "isl"),
])
def test_cli_serve_sim_errors_are_one_line(capsys, extra, message):
    from moesim.cli import main
    assert main(["serve-sim", "gpt-oss-20b", "--gpu", "h100-sxm", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


_HOSTILE = st.sampled_from([None, 0, 1, 3, -1, 2.5, float("nan"), float("inf"), True, "7", 10**12])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["rate", "concurrency", "isl", "osl", "max_num_batched_tokens", "max_num_seqs",
                                        "requests", "seed", "slo_ttft_ms", "slo_tpot_ms", "prefix_tokens"]),
                       _HOSTILE, max_size=4))
def test_hostile_arguments_give_a_result_or_a_moesim_error(kw):
    args = dict(SMALL, isl=64, osl=4, concurrency=2, requests=4)
    args.update(kw)
    if args.get("requests") == 10**12 or args.get("isl") == 10**12:
        args["concurrency"] = None if args.get("rate") is not None else args.get("concurrency")
    try:
        r = serve_sim(**args)
    except MoesimError as exc:
        assert exc.field
        return
    assert r.aggregate_tok_s > 0 and r.ttft_ms["p50"] >= 0


def test_kv_saturation_preempts_and_caps_the_running_batch():
    """Long prompts on a 24 GB card: at 16 clients everything fits; at 64 the KV pool runs out, requests
    are preempted and recomputed, the running batch is capped by KV, and throughput falls back from its
    peak (thrashing) but stays above one client's."""
    m = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    kw = dict(isl=8192, osl=1024, runtime="vllm", quant="MXFP4", requests=96)
    one, fits, over = (serve_sim("gpt-oss-20b", m, concurrency=c, **kw) for c in (1, 16, 64))
    assert fits.scheduler["preemptions"] == 0 and fits.kv["peak_fraction"] < 1
    assert over.scheduler["preemptions"] > 0 and over.kv["peak_blocks"] <= over.kv["n_blocks"]
    assert over.scheduler["max_running"] < 64
    assert one.aggregate_tok_s < over.aggregate_tok_s <= fits.aggregate_tok_s


def test_reference_engine_gives_the_same_serving_result():
    """The whole serve_sim through the twin: the same figures to the last bit on a real step table."""
    kw = dict(SMALL, isl=300, osl=12, rate=40.0, requests=24, seed=3, prefix_tokens=100)
    assert serve_sim(**kw).to_dict() == serve_sim(**kw, engine="reference").to_dict()
