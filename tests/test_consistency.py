"""What every result satisfies (moesim.analysis.consistency): each check fires on a deliberately
inconsistent record, result or sweep chunk (doctored copies of real ones, or a monkeypatched kernel
result); it never fires on real results over random catalog models x machines x quants x contexts
(hypothesis); and the CLI reports a failure in its one-line form."""
from __future__ import annotations

import copy
import dataclasses
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim._catalog import load as load_catalog
from moesim.analysis import consistency as K
from moesim.analysis import fit as F
from moesim.analysis import resolve as R
from moesim.analysis import simulate as S
from moesim.analysis import validate as V
from moesim.analysis.sweep import run as SR
from moesim.cli import main
from moesim.errors import MoesimError

EXAMPLES = int(os.environ.get("MOESIM_FUZZ_COUNT", "25"))
HYBRID = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64}
SMALL = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 16}
MODELS = sorted(load_catalog("models")["models"])
MACHINES = sorted(load_catalog("hardware")["machine"])


# ------------------------------------------------------------------------------ captured real inputs
def _capture(monkeypatch, module, name):
    """Calls of module.name recorded (args deep-copied) and passed through to the real check."""
    real, calls = getattr(module, name), []

    def spy(*args, **kw):
        calls.append(copy.deepcopy((args, kw)))
        return real(*args, **kw)
    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.fixture
def fitted(monkeypatch):
    """(record, capacities, model max) of a real fit that fits with experts in host RAM, and of one
    that pages weights from storage, and of one that does not fit."""
    calls = _capture(monkeypatch, F, "check_record")
    F.fit("qwen3-30b-a3b", HYBRID, quants=["Q4_K_M"], context=8192)
    F.fit("qwen3-30b-a3b", SMALL, quants=["BF16"], context=8192)
    F.fit("qwen3-30b-a3b", SMALL, quants=["BF16"], context=8192, placement="all-gpu")
    (ok, _), (paged, _), (no, _) = calls
    assert ok[0]["fits"] == "gpu+host" and "storage" in paged[0]["fits"] and no[0]["fits"] == "no"
    return ok[:3], paged[:3], no[:3]


def _raises(field, fn, *args, **kw):
    with pytest.raises(K.InconsistentResult) as exc:
        fn(*args, **kw)
    assert exc.value.field == field and "moesim bug" in str(exc.value), str(exc.value)
    assert isinstance(exc.value, MoesimError)
    return exc.value


def test_real_records_pass(fitted):
    for rec, caps, mmax in fitted:
        assert K.check_record(rec, caps, mmax) is rec


def _tier(rec, name="gpu"):
    return rec["memory_by_tier"][name]


@pytest.mark.parametrize("doctor,field", [
    (lambda r: r.update(weights_bytes=float("nan")), "weights_bytes"),
    (lambda r: r.update(state_bytes=-1.0), "state_bytes"),
    (lambda r: r.update(kv_bytes_per_token=float("inf")), "kv_bytes_per_token"),
    (lambda r: _tier(r)["by_class"].update(attention=_tier(r)["by_class"]["attention"] + 1e6), "memory_by_tier.gpu"),
    (lambda r: _tier(r, "host").update(total=_tier(r, "host")["total"] * 1.001), "memory_by_tier.host"),
    (lambda r: r["weights_bytes_by_class"].update(lm_head=r["weights_bytes_by_class"]["lm_head"] + 4096.0),
     "weights_bytes_by_class"),
    (lambda r: r.update(kv_bytes=r["kv_bytes"] * 1.5), "kv_bytes"),
    (lambda r: (_tier(r)["by_class"].update(other=1e9), _tier(r).update(total=_tier(r)["total"] + 1e9)),
     "memory_by_tier"),
    (lambda r: r.update(fits="gpu+host+cloud"), "fits"),
    (lambda r: r.update(fits="gpu"), "fits"),                   # host holds experts: named tiers must match
    (lambda r: r.update(fits="no", decode_tok_s=None, prefill_tok_s=None), "fits"),
    (lambda r: r.update(max_context=r["context"] - 1), "max_context"),
    (lambda r: r.update(max_context=10**9), "max_context"),
    (lambda r: r.update(max_batch=0), "max_batch"),
    (lambda r: r.update(decode_tok_s=None), "decode_tok_s"),
    (lambda r: r.update(prefill_tok_s=-3.0), "prefill_tok_s"),
    (lambda r: r.update(decode_tok_s=float("inf")), "decode_tok_s"),
])
def test_each_record_check_fires(fitted, doctor, field):
    rec, caps, mmax = copy.deepcopy(fitted[0])
    doctor(rec)
    _raises(field, K.check_record, rec, caps, mmax)


def test_fits_against_capacities(fitted):
    (rec, caps, mmax), (paged, pcaps, pmax), (no, ncaps, nmax) = copy.deepcopy(fitted)
    gpu = _tier(rec)["total"]
    e = _raises("fits", K.check_record, rec, dict(caps, gpu=gpu * 0.99), mmax)
    assert "exceed" in str(e) and repr(gpu) in str(e)
    _raises("fits", K.check_record, no, dict(ncaps, gpu=1e15, gpu_sure=1e15, host=1e15), nmax)       # 'no' yet within
    _raises("memory_by_tier.storage", K.check_record, paged, dict(pcaps, storage_spill=False), pmax)
    _raises("memory_by_tier.storage", K.check_record, paged, dict(pcaps, storage=1.0), pmax)
    no["decode_tok_s"] = 5.0
    _raises("decode_tok_s", K.check_record, no, ncaps, nmax)                          # tok/s where it does not fit
    # within the tolerance of the comparison: not an error
    assert K.check_record(rec, dict(caps, gpu=gpu * (1 - 1e-12)), mmax) is rec


def test_max_context_under_either_definition(fitted):
    rec, caps, mmax = copy.deepcopy(fitted[0])
    # fitted at c: max_context >= c (the per-placement and the best-placement definitions both satisfy it)
    for mc in (rec["context"], mmax):
        K.check_record(dict(rec, max_context=mc), caps, mmax)
    # beyond the trained maximum, allowed: max_context covers the maximum, may exceed it only when allowed
    beyond = dict(rec, context=mmax * 2, max_context=mmax)
    K.check_record(beyond, caps, mmax, beyond_ok=True)
    K.check_record(dict(beyond, max_context=mmax * 2), caps, mmax, beyond_ok=True)
    _raises("max_context", K.check_record, dict(beyond, max_context=mmax * 2), caps, mmax)
    _raises("max_context", K.check_record, dict(beyond, max_context=mmax - 1), caps, mmax, beyond_ok=True)


def test_check_finite_walks_nested_values():
    K.check_finite({"a": [1.0, {"b": None, "c": "text"}], "d": (2, np.float64(3.0))})
    e = _raises("x.a[1].c", K.check_finite, {"a": [1.0, {"c": np.float64("nan")}]}, "x")
    assert "nan" in str(e)


# ------------------------------------------------------------------------------ simulate
@pytest.fixture(scope="module")
def simulated():
    """A real Monte Carlo result with an expert cache, and its check arguments."""
    mp = pytest.MonkeyPatch()
    calls = _capture(mp, S, "check_result")
    try:
        S.simulate("qwen3-30b-a3b", HYBRID, quant="Q4_K_M", runtime="offload", placement="offload-cache",
                   cache_experts=32, tokens=48, seed=2)
    finally:
        mp.undo()
    (args, kw), = calls
    return args, kw


def _sim(simulated, **changes):
    (res, *rest), kw = copy.deepcopy(simulated)
    return (dataclasses.replace(res, **changes), *rest), kw


def test_real_result_passes(simulated):
    args, kw = copy.deepcopy(simulated)
    assert K.check_result(*args, **kw) is args[0]
    assert args[0].expert_hit_rate is not None


def _doctor_dict(attr, key, factor):
    def apply(res):
        d = copy.deepcopy(getattr(res, attr))
        d[key] = d[key] * factor
        return {attr: d}
    return apply


@pytest.mark.parametrize("make,field", [
    (lambda r: {"aggregate_tok_s": r.aggregate_tok_s * 1.01}, "aggregate_tok_s"),
    (lambda r: {"decode_tok_s": -r.decode_tok_s}, "decode_tok_s"),
    (lambda r: {"prefill_tok_s": float("nan")}, "prefill_tok_s"),
    (lambda r: {"ttft_s": 0.0}, "ttft_s"),
    (lambda r: {"tpot_ms": dict(r.tpot_ms, p99=r.tpot_ms["p50"] * 0.5)}, "tpot_ms"),
    (lambda r: {"tpot_ms": dict(r.tpot_ms, p50=0.0)}, "tpot_ms.p50"),
    (_doctor_dict("tpot_ms", "mean", 1.001), "tpot_ms.mean"),
    (lambda r: {"breakdown": dict(r.breakdown, by_resource=dict(r.breakdown["by_resource"], pcie=1.0))},
     "breakdown.by_resource"),
    (lambda r: {"breakdown": dict(r.breakdown, by_phase={k: 2 * v for k, v in r.breakdown["by_phase"].items()})},
     "breakdown.by_phase"),
    (lambda r: {"bottleneck": min(r.breakdown["by_resource"], key=r.breakdown["by_resource"].get)}, "bottleneck"),
    (lambda r: {"expert_hit_rate": 1.5}, "expert_hit_rate"),
    (lambda r: {"page_cache_hit_rate": -0.1}, "page_cache_hit_rate"),
    (lambda r: {"reuse": 1.01}, "reuse"),
    (lambda r: {"distinct_experts_per_step": 1e6}, "distinct_experts_per_step"),
    (lambda r: {"bytes_per_token": dict(r.bytes_per_token, pcie=-1.0)}, "bytes_per_token.pcie"),
    (lambda r: {"memory": dict(r.memory, max_batch=0)}, "max_batch"),
])
def test_each_result_check_fires(simulated, make, field):
    res = simulated[0][0]
    args, kw = _sim(simulated, **make(res))
    _raises(field, K.check_result, *args, **kw)


def test_seconds_per_token_is_the_inverse_of_tok_s(simulated):
    res = simulated[0][0]
    b = copy.deepcopy(res.breakdown)
    scale = 1.01
    b = {"by_phase": {k: v * scale for k, v in b["by_phase"].items()},
         "by_resource": {k: v * scale for k, v in b["by_resource"].items()},
         "seconds_per_token": b["seconds_per_token"] * scale}
    args, kw = _sim(simulated, breakdown=b)
    _raises("breakdown.seconds_per_token", K.check_result, *args, **kw)


def test_a_doctored_kernel_result_makes_simulate_raise(monkeypatch):
    real = S.run

    def run(*args, **kw):
        res = real(*args, **kw)
        res["step_p99"] = res["step_p50"] * 0.5
        return res
    monkeypatch.setattr(S, "run", run)
    _raises("tpot_ms", S.simulate, "qwen3-30b-a3b", HYBRID, quant="Q4_K_M", tokens=16)


# ------------------------------------------------------------------------------ sweep chunks
def _sweep_capture(monkeypatch, **kw):
    real, calls = SR.check_chunk, []

    def spy(plan, cols, segments, threads=1):
        calls.append((plan, {k: v.copy() for k, v in cols.items()}, list(segments)))
        return real(plan, cols, segments, threads)
    monkeypatch.setattr(SR, "check_chunk", spy)
    moesim.sweep(**kw)
    monkeypatch.setattr(SR, "check_chunk", real)
    return calls


@pytest.fixture
def chunk(monkeypatch):
    """A real Monte Carlo sweep chunk over two groups: rows that fit on the GPU, with experts in RAM,
    paged from storage, and rows that do not fit."""
    (plan, cols, segs), = _sweep_capture(
        monkeypatch, models=["qwen3-30b-a3b"], quants=["Q4_K_M", "BF16"], machines=[SMALL],
        contexts=[2048, 30000], batches=[1, 4], placements=["auto", "all-gpu"], mode="montecarlo", tokens=8,
        runtimes=["llama.cpp"])
    labels = np.asarray(plan.dicts["fits"], dtype=object)[cols["fits"]]
    assert {"no", "gpu+host", "gpu+host+storage"} <= set(labels), set(labels)
    assert len(segs) == 4
    return plan, cols, segs, labels


def test_real_chunk_passes(chunk):
    plan, cols, segs, _ = chunk
    K.check_chunk(plan, cols, segs)
    K._explain_chunk(plan, cols, K._group_scalars(segs))       # the slow path agrees


def _first(labels, want):
    return int(np.flatnonzero(labels == want)[0])


@pytest.mark.parametrize("doctor,field", [
    (lambda c, L, cap: c["gpu_bytes"].__setitem__(0, np.nan), "bytes"),
    (lambda c, L, cap: c["kv_bytes"].__setitem__(1, -1.0), "bytes"),
    (lambda c, L, cap: c["weights_bytes"].__setitem__(2, c["weights_bytes"][2] * 100), "gpu_bytes"),
    (lambda c, L, cap: c["gpu_bytes"].__setitem__(_first(L, "gpu+host"), cap * 1.01), "fits"),
    (lambda c, L, cap: c["fits"].__setitem__(_first(L, "gpu+host"), c["fits"][_first(L, "no")]), "fits"),
    (lambda c, L, cap: c["fits"].__setitem__(_first(L, "gpu+host+storage"), c["fits"][_first(L, "gpu+host")]),
     "fits"),
    (lambda c, L, cap: c["max_context"].__setitem__(_first(L, "gpu+host"), 1), "max_context"),
    (lambda c, L, cap: c["max_context"].__setitem__(0, 10**8), "max_context"),
    (lambda c, L, cap: c["max_batch"].__setitem__(_first(L, "gpu+host"), 0), "max_batch"),
    (lambda c, L, cap: c["decode_tok_s"].__setitem__(3, -1.0), "decode_tok_s"),
    (lambda c, L, cap: c["prefill_tok_s"].__setitem__(3, np.inf), "decode_tok_s"),
    (lambda c, L, cap: c["aggregate_tok_s"].__setitem__(5, c["aggregate_tok_s"][5] * 1.01), "aggregate_tok_s"),
    (lambda c, L, cap: c["tpot_ms"].__setitem__(6, c["tpot_ms"][6] * 1.01), "tpot_ms"),
    (lambda c, L, cap: c["tpot_p99_ms"].__setitem__(7, c["tpot_p50_ms"][7] * 0.9), "tpot_p99_ms"),
    (lambda c, L, cap: c["expert_hit_rate"].__setitem__(4, 1.5), "expert_hit_rate"),
])
def test_each_chunk_check_fires(chunk, doctor, field):
    plan, cols, segs, labels = chunk
    cols = {k: v.copy() for k, v in cols.items()}
    cap = K._group_scalars(segs)[0][0]
    doctor(cols, labels, cap)
    e = _raises(field, K.check_chunk, plan, cols, segs)
    assert "sweep row" in str(e)


def test_chunk_tolerance_and_storage(chunk):
    plan, cols, segs, labels = chunk
    cols = {k: v.copy() for k, v in cols.items()}
    i = _first(labels, "gpu+host")
    cap = K._group_scalars(segs)[0][i]
    cols["gpu_bytes"][i] = cap * (1 + 1e-12)       # the screen flags it, the tolerant explanation keeps it
    cols["host_bytes"][i] -= cap * 1e-12 + 1.0
    K.check_chunk(plan, cols, segs)
    j = _first(labels, "gpu+host+storage")
    nospill = [(a, b, g) for a, b, g in segs]
    grp = nospill[0][2]
    cfg0 = dict(grp.mem_tables["cfg"][0], storage_spill=0)
    fake = type("G", (), {"mem_tables": {"cfg": [cfg0]}, "low": grp.low, "kv_bytes_per_token": grp.kv_bytes_per_token})
    segs2 = [(a, b, fake if a <= j < b else g) for a, b, g in segs]
    _raises("storage_bytes", K.check_chunk, plan, cols, segs2)


def test_a_doctored_kernel_result_stops_the_sweep_before_writing(monkeypatch, tmp_path, capsys):
    from moesim.engine import _kernel
    real = _kernel.sweep_analytic

    def analytic(*args):
        code, bad = real(*args)
        # (dec, context, batch, variant, threads, out[, offset]): the group's first row of the chunk's columns
        args[5]["decode_tok_s"][args[6] if len(args) > 6 else 0] = float("nan")
        return code, bad
    monkeypatch.setattr(_kernel, "sweep_analytic", analytic)
    spec = tmp_path / "spec.toml"
    spec.write_text('[axes]\nmodels = ["qwen3-30b-a3b"]\nquants = ["Q4_K_M"]\nmachines = ["dgx-h200"]\n'
                    'contexts = [4096, 8192]\nbatches = [1]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moesim: error: decode_tok_s: inconsistent result") and err.count("\n") == 1
    assert "moesim bug" in err and not list(out.glob("part-*"))


# ------------------------------------------------------------------------------ the CLI's one line
def test_cli_fit_reports_a_doctored_kernel_result_in_one_line(monkeypatch, capsys):
    real = R.memory_of      # fit's memory view, through resolve.configure_run (shared with simulate)

    def doctored(*args, **kw):
        r = real(*args, **kw)
        r.by_class[0, 0] += 1e6          # attention bytes on the GPU no longer sum to the GPU tier
        return r
    monkeypatch.setattr(R, "memory_of", doctored)
    rc = main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "64",
               "--quant", "Q4_K_M"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out
    assert err.startswith("moesim: error: memory_by_tier.gpu: inconsistent result: the gpu tier's classes sum")
    assert err.count("\n") == 1 and "please report it" in err


def test_cli_simulate_reports_a_failed_check_in_one_line(monkeypatch, capsys):
    real = S.run

    def run(*args, **kw):
        res = real(*args, **kw)
        res["hit_rate"][0] = 2.0
        return res
    monkeypatch.setattr(S, "run", run)
    rc = main(["simulate", "qwen3-30b-a3b", "--machine", "dgx-h200", "--quant", "Q4_K_M", "--tokens", "16", "--json"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out
    assert err.startswith("moesim: error: expert_hit_rate: inconsistent result") and err.count("\n") == 1


# ------------------------------------------------------------------------------ validate
VROW = {"id": "LC-99", "quality": "A", "model": "qwen3-30b-a3b", "quant": "Q4_K_M", "runtime": "llama.cpp",
        "gpu": "rtx-4090", "gpus": "1", "placement": "experts-cpu", "batch": "1", "mtp": "0", "decode_tok_s": "30",
        "source": "test"}


def test_validate_checks_each_prediction(monkeypatch):
    _, recs, skipped = V.evaluate_rows([dict(VROW)])
    assert len(recs) == 1 and not skipped
    assert any("placement" not in a and "KV cache f16" in a for a in recs[0]["assumed"])
    monkeypatch.setattr(V.Prepared, "predict", lambda self, rt=None: (float("nan"), 100.0))
    _raises("decode_predicted", V.evaluate_rows, [dict(VROW)])


def test_validate_checks_the_memory_view(monkeypatch):
    real = V.memory_of

    def doctored(*args, **kw):
        r = real(*args, **kw)
        r.kv = r.kv * 2
        return r
    monkeypatch.setattr(V, "memory_of", doctored)
    _raises("kv_bytes", V.evaluate_rows, [dict(VROW)])


def test_validate_applies_the_context_rule():
    """A measured run deeper than the trained maximum is kept (it ran) with the assumption in its row,
    as fit and simulate do with allow_beyond_max_context; past the plausible bound it is skipped."""
    _, recs, skipped = V.evaluate_rows([dict(VROW, depth_tokens="60000")])     # qwen3-30b-a3b: 40,960
    assert recs[0]["context"] == 60000 and not skipped
    assert any("beyond qwen3-30b-a3b's trained maximum" in a for a in recs[0]["assumed"])
    _, recs, skipped = V.evaluate_rows([dict(VROW, depth_tokens=str(1 << 29))])
    assert not recs and "268,435,456" in skipped[0]["reason"]         # the bound named, as the reader checks it


# ------------------------------------------------------------------------------ assumptions listed
def test_defaults_are_listed_once_each():
    rec, = moesim.fit("qwen3-30b-a3b", HYBRID, quants=["UD-Q2_K_XL"])
    a = rec["assumptions"]
    for needle in ("modelled as", "runtime llama.cpp", "KV cache f16", "placement: what llama.cpp"):
        assert sum(needle in x for x in a) == 1, (needle, a)
    given_all, = moesim.fit("qwen3-30b-a3b", HYBRID, quants=["Q4_K_M"], runtime="llama.cpp", kv_dtype="q8_0",
                            placement="experts-cpu")
    assert not any(x.startswith(("runtime ", "KV cache", "placement")) for x in given_all["assumptions"])
    r = moesim.simulate("qwen3-30b-a3b", HYBRID, quant="Q4_K_M", mode="analytic")
    assert any(x.startswith("routing: qwen") for x in r.memory["assumptions"])
    r = moesim.simulate("qwen3-30b-a3b", HYBRID, quant="Q4_K_M", mode="analytic", routing="generic")
    assert not any(x.startswith("routing") for x in r.memory["assumptions"])


def test_fit_text_lists_per_quant_assumptions(capsys):
    assert main(["fit", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "64",
                 "--quant", "UD-Q2_K_XL", "--quant", "Q4_K_M"]) == 0
    out = capsys.readouterr().out
    assert "  assumed: KV cache f16: llama.cpp's default" in out
    assert "  assumed (IQ2_M): quant 'UD-Q2_K_XL' is modelled as IQ2_M" in out
    assert out.count("KV cache f16") == 1


# ------------------------------------------------------------------------------ the invariant
QUANTS = st.sampled_from(["native", "Q2_K", "Q4_K_M", "Q8_0", "BF16", "fp8", "MXFP4", "UD-Q2_K_XL"])
MACHINE = st.one_of(st.sampled_from(MACHINES), st.fixed_dictionaries({
    "gpu": st.sampled_from(["rtx-4090", "rtx-3090", "h100-sxm", "a100-80g"]), "gpus": st.integers(1, 4),
    "host": st.sampled_from(["ddr5-6000x2", "ddr4-3200x8"]), "host_mem_gb": st.sampled_from([16, 64, 256, 1024])}))
CONTEXT = st.one_of(st.integers(1, 2048), st.integers(2048, 1 << 20))


def _or_input_error(fn, *args, **kw):
    """The call's result, or None for a MoesimError that is about the input (not a failed check)."""
    try:
        return fn(*args, **kw)
    except K.InconsistentResult:
        raise
    except MoesimError:
        return None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(MODELS), machine=MACHINE, quant=QUANTS, context=CONTEXT, batch=st.integers(1, 64))
def test_checks_never_fire_on_real_fits(model, machine, quant, context, batch):
    recs = _or_input_error(moesim.fit, model, machine, quants=[quant], context=context, batch=batch,
                           allow_beyond_max_context=True)
    for rec in recs or ():
        assert (rec["decode_tok_s"] is None) == (rec["fits"] == "no")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(MODELS), machine=MACHINE, quant=QUANTS, context=CONTEXT, batch=st.integers(1, 16),
       mode=st.sampled_from(["analytic", "montecarlo"]), policy=st.sampled_from(["lru", "lfu"]),
       placement=st.sampled_from([None, "offload-cache=8", "experts-cpu", "cpu-only"]))
def test_checks_never_fire_on_real_simulations(model, machine, quant, context, batch, mode, policy, placement):
    r = _or_input_error(moesim.simulate, model, machine, quant=quant, context=context, batch=batch, mode=mode,
                        policy=policy, placement=placement, tokens=12, allow_beyond_max_context=True)
    if r is not None:
        assert math.isfinite(r.decode_tok_s) and r.decode_tok_s > 0


@settings(max_examples=max(3, EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck))
@given(models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True),
       machines=st.lists(st.sampled_from(MACHINES), min_size=1, max_size=2, unique=True),
       quants=st.lists(st.sampled_from(["Q2_K", "Q4_K_M", "BF16"]), min_size=1, max_size=2, unique=True),
       contexts=st.lists(CONTEXT, min_size=1, max_size=3, unique=True), mode=st.sampled_from(["analytic", "montecarlo"]))
def test_checks_never_fire_on_real_sweeps(models, machines, quants, contexts, mode):
    t = _or_input_error(moesim.sweep, models=models, machines=machines, quants=quants, contexts=contexts,
                        batches=[1, 3], mode=mode, tokens=8, threads=1,
                        filter={"skip_inapplicable": True, "allow_beyond_max_context": True})
    if t is not None and len(t):
        assert np.all(t["decode_tok_s"] > 0)


_NUMERIC = ("gpu_bytes", "host_bytes", "storage_bytes", "weights_bytes", "kv_bytes", "state_bytes", "max_context",
            "max_batch", "decode_tok_s", "aggregate_tok_s", "tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "prefill_tok_s",
            "expert_hit_rate")


@settings(max_examples=4 * EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(col=st.sampled_from(_NUMERIC), row=st.integers(0, 31),
       factor=st.sampled_from([-1.0, 0.0, 0.5, 0.999, 1 + 1e-6, 1.001, 2.0, 1e6, float("nan"), float("inf")]))
def test_the_fast_screen_misses_nothing_the_explanation_finds(chunk_once, col, row, factor):
    """check_chunk screens with reductions and exact comparisons and explains only what it flags:
    whatever the row-by-row explanation rejects, the screen must have flagged."""
    plan, cols, segs = chunk_once
    cols = {k: v.copy() for k, v in cols.items()}
    c, i = cols[col], row % len(cols[col])
    with np.errstate(all="ignore"):
        c[i] = c[i] * factor if c.dtype.kind == "f" else (int(c[i] * max(factor, 0)) if math.isfinite(factor) else 0)
    try:
        K._explain_chunk(plan, cols, K._group_scalars(segs))
    except K.InconsistentResult:
        with pytest.raises(K.InconsistentResult):
            K.check_chunk(plan, cols, segs)


@pytest.fixture(scope="module")
def chunk_once():
    mp = pytest.MonkeyPatch()
    try:
        (plan, cols, segs), = _sweep_capture(
            mp, models=["qwen3-30b-a3b"], quants=["Q4_K_M", "BF16"], machines=[SMALL], contexts=[2048, 30000],
            batches=[1, 4], placements=["auto", "all-gpu"], mode="montecarlo", tokens=8, runtimes=["llama.cpp"])
    finally:
        mp.undo()
    return plan, cols, segs


@settings(max_examples=4 * EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(col=st.sampled_from(_NUMERIC), row=st.integers(0, 31),
       factor=st.sampled_from([-1.0, 0.0, 0.5, 0.999, 1 + 1e-12, 1 + 1e-6, 1.001, 2.0, 1e6, float("nan"),
                               float("inf")]), skip_first=st.booleans())
def test_the_c_screen_flags_exactly_what_its_numpy_twin_flags(chunk_once, col, row, factor, skip_first):
    """ms_sweep_screen (one C pass) against consistency._screen (numpy), on doctored chunks and on
    segments with a gap between them (a skipped group)."""
    plan, cols, segs = chunk_once
    cols = {k: v.copy() for k, v in cols.items()}
    c, i = cols[col], row % len(cols[col])
    with np.errstate(all="ignore"):
        c[i] = c[i] * factor if c.dtype.kind == "f" else (int(c[i] * max(factor, 0)) if math.isfinite(factor) else 0)
        part = segs[1:] if skip_first else segs
        want = K._screen(plan, K._rows(cols, part), K._group_scalars(part))
    assert K._screen_c(plan, cols, part) == want, (col, i, factor, skip_first)