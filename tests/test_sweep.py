"""Sweeps: the fast path equals simulate()/fit() point by point, C equals its Python twin bit for bit,
results do not depend on threads, chunking or dask workers, and output survives kill -9."""
import hashlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import moesim
from moesim import MoesimError
from moesim.engine import decode as KD
from moesim.engine import _kernel
from moesim.engine.lower import decode_model as LDM
from moesim.engine.lower import machine as LHW
from moesim.engine.reference import sweep as SR
from moesim.analysis.sweep import Plan, SweepTable, build_spec, machine_label, make_machine_cached, normalize_spec, read, run_chunk, run_range
from moesim.engine.lower.attention import ctx_eval, kv_read_fn, score_fn
from moesim.analysis.sweep import sweep

pa = pytest.importorskip("pyarrow")

M4090 = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 192, "name": "4090-192g"}
M4090_SMALL = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "4090-64g"}
TINY = {"gpu": "rtx-3090", "host": "ddr4-3200x2", "host_mem_gb": 32, "name": "3090-32g"}
CPU = {"host": "ddr5-4800x8", "host_mem_gb": 256, "cores": 32, "name": "epyc-256g"}
MAC = {"gpu": "m3-ultra", "name": "m3-ultra"}
MACHINES = [M4090, M4090_SMALL, TINY, CPU, MAC, "dgx-h200"]


def _plan(**kw) -> Plan:
    return Plan(normalize_spec(build_spec(**kw)))


def _row(tab, i: int) -> dict:
    return {k: tab[k][i] for k in tab.column_names}


def _close(a, b, rel=1e-9) -> bool:
    if b is None:
        return math.isnan(a)
    return a == b or abs(a - b) <= rel * abs(b)


# ------------------------------------------------------------------------------------ the fast path
def test_sweep_equals_simulate_loop():
    """A few hundred random points: every column equals moesim.simulate(mode="analytic") (decode to
    1e-9 relative; memory, fits, limits and the automatic placement exactly)."""
    axes = dict(models=["qwen3-30b-a3b", "deepseek-r1", "gpt-oss-120b", "llama-3-8b", "qwen3-next-80b-a3b",
                        "deepseek-v3.2", "llama-4-scout"],
                quants=["Q4_K_M", "Q2_K"], machines=MACHINES, runtimes=["auto", "ktransformers", "ik_llama.cpp"],
                placements=["auto", "experts-cpu", "offload-cache=16", "layers-gpu=7"],
                contexts=[1, 700, 4096, 40000, 131072, 400000], batches=[1, 3, 33, 600],
                filter={"skip_inapplicable": True, "allow_beyond_max_context": True})
    plan = _plan(**axes)
    rng = np.random.default_rng(1)
    labels = {machine_label(m): m for m in MACHINES}
    checked = 0
    for g in rng.permutation(plan.n_groups):
        if checked >= 260:
            break
        grp = plan.group(int(g))
        if grp.skip:
            continue
        cols = run_range(plan, int(g) * plan.block, (int(g) + 1) * plan.block)
        tab = SweepTable(cols, plan.dicts)
        for j in rng.choice(plan.block, 2, replace=False):
            row = _row(tab, int(j))
            ix = grp.ix
            spec_p = plan.values["placements"][ix["placements"]]
            spec_rt = plan.values["runtimes"][ix["runtimes"]]
            mach = make_machine_cached(labels[row["machine"]] if row["machine"] in labels else row["machine"])
            r = moesim.simulate(row["model"], mach, quant=row["quant"], context=int(row["context"]),
                                batch=int(row["batch"]), placement=None if spec_p == "auto" else spec_p,
                                runtime=None if spec_rt == "auto" else spec_rt, mode="analytic", seed=0,
                                allow_beyond_max_context=True)   # the sweep keeps contexts past the maximum
            mem = r.memory
            where = (row["model"], row["machine"], row["runtime"], spec_p, row["context"], row["batch"])
            assert row["placement"] == mem["placement"], where
            assert row["fits"] == mem["fits"], where
            tiers = mem["memory_by_tier"]
            exact = dict(weights_bytes=mem["weights_bytes"], kv_bytes=mem["kv_bytes"], state_bytes=mem["state_bytes"],
                         kv_bytes_per_token=mem["kv_bytes_per_token"], max_context=mem["max_context"],
                         max_batch=mem["max_batch"], gpu_bytes=tiers.get("gpu", tiers.get("unified"))["total"],
                         host_bytes=tiers["host"]["total"], storage_bytes=tiers["storage"]["total"])
            for k, v in exact.items():
                assert row[k] == v, (k, row[k], v, where)
            for k, v in (("decode_tok_s", r.decode_tok_s), ("aggregate_tok_s", r.aggregate_tok_s),
                         ("tpot_ms", r.tpot_ms["mean"]), ("prefill_tok_s", r.prefill_tok_s),
                         ("expert_hit_rate", r.expert_hit_rate)):
                assert _close(row[k], v), (k, row[k], v, where)
            br = r.breakdown["by_resource"]
            top = sorted(br.values())
            if top[-1] > top[-2] * (1 + 1e-9):
                assert row["bottleneck"] == r.bottleneck, where
            checked += 1
    assert checked >= 200


def test_sweep_agrees_with_fit():
    """`fit` rows and sweep rows agree: memory view and the decode/prefill estimate."""
    m = make_machine_cached(M4090)
    quants = ["Q2_K", "Q4_K_M", "Q8_0"]
    for model in ("deepseek-r1", "gpt-oss-120b"):
        rows = moesim.fit(model, m, quants=quants, context=8192, batch=2)
        tab = sweep(models=[model], quants=quants, machines=[M4090], contexts=[8192], batches=[2])
        for i, rec in enumerate(rows):
            assert tab["quant"][i] == rec["quant"] and tab["placement"][i] == rec["placement"]
            assert tab["fits"][i] == rec["fits"] and tab["max_context"][i] == rec["max_context"]
            assert tab["max_batch"][i] == rec["max_batch"] and tab["weights_bytes"][i] == rec["weights_bytes"]
            if rec["decode_tok_s"] is not None:
                assert _close(tab["decode_tok_s"][i], rec["decode_tok_s"])
                assert _close(tab["prefill_tok_s"][i], rec["prefill_tok_s"])


def test_context_functions_match_decode():
    """The attention context table (KV-read and score-FLOP rows, evaluated in C and Python) equals the
    per-kind formulas written out directly in engine/reference/attention.py."""
    from moesim.engine.reference import attention as REF_ATT
    from moesim.engine import _kernel
    from moesim.spec import quants as Q
    from moesim.engine.lower.memory import lower
    for mid in moesim.model_ids():
        m = moesim.model(mid)
        low = lower(m, Q.resolve("Q8_0", m))
        for kvname in ("f16", "q4_0"):
            kvb = Q.kv_dtype_bytes(kvname)
            for l in sorted({0, m.n_layers // 2, m.n_layers - 1} | set(range(min(4, m.n_layers)))):
                kf, sf = kv_read_fn(m, low, l, kvb), score_fn(m.layers[l])
                for c in (1, 3, 127, 128, 129, 2047, 2048, 2049, 4096, 65537, 1 << 20):
                    ref_kv = REF_ATT.kv_read_bytes(m, low, l, c, kvb)
                    ref_sf = REF_ATT.score_flops(m.layers[l], c)
                    for got_kv, got_sf in ((ctx_eval(kf, c), ctx_eval(sf, c)),
                                           (_kernel.ctx_eval(*kf, c), _kernel.ctx_eval(*sf, c))):
                        assert _close(got_kv, ref_kv, 1e-12), (mid, l, c, got_kv, ref_kv)
                        assert _close(got_sf, ref_sf, 1e-12), (mid, l, c, got_sf, ref_sf)


def test_kernel_equals_python_twin():
    """ms_sweep.c against moesim/sweep_reference.py, bit for bit, over automatic placement (llama.cpp,
    ktransformers), offload caches, unified memory, CPU-only machines and storage spill."""
    plan = _plan(models=["deepseek-r1", "gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v4-pro", "llama-3-8b"],
                 quants=["Q4_K_M"], machines=[M4090, M4090_SMALL, MAC, CPU], runtimes=["auto", "ktransformers"],
                 placements=["auto", "offload-cache"], contexts=[1, 100, 4096, 65536, 200000], batches=[1, 7, 64],
                 filter={"skip_inapplicable": True, "allow_beyond_max_context": True})
    n = 0
    for g in range(plan.n_groups):
        grp = plan.group(g)
        if grp.skip:
            continue
        cols = run_range(plan, g * plan.block, (g + 1) * plan.block, threads=2)
        for j, ref in enumerate(SR.segment(grp, 0, plan.block)):
            for k, v in ref.items():
                if k == "key":
                    continue
                got = cols[k][j]
                assert got == v or (math.isnan(v) and math.isnan(got)), (k, got, v, grp.labels, ref["context"])
            n += 1
    assert n > 600


@pytest.mark.skipif(not _kernel.openmp_enabled(), reason="built without OpenMP: every thread count runs serially, so the comparison would pass vacuously")
def test_threads_and_chunking_do_not_change_results():
    kw = dict(models=["qwen3-30b-a3b", "deepseek-r1"], quants=["Q4_K_M"], machines=[M4090, M4090_SMALL],
              contexts={"start": 256, "stop": 163840, "num": 4200, "log": True}, batches=[1, 2, 8, 64])
    # 16,800 rows a group: the kernels wake a second thread only for 8,192 rows or more each
    base = sweep(**kw, chunk_size=100000, threads=1)
    for threads, chunk in ((2, 100000), (2, 37), (1, 1000)):
        other = sweep(**kw, chunk_size=chunk, threads=threads)
        for k in base.column_names:
            np.testing.assert_array_equal(base.columns[k], other.columns[k], err_msg=k)


def test_montecarlo_rows_equal_kernel_runs_and_threads():
    """Monte Carlo rows: each is decode.run of its configuration with stream (seed, global index), on
    any thread count and chunking."""
    kw = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090_SMALL],
              placements=["offload-cache=16", "all-gpu"], contexts=[1000, 40000], batches=[1, 3],
              mode="montecarlo", tokens=24, seed=11)
    a = sweep(**kw, threads=1)
    b = sweep(**kw, threads=2, chunk_size=3)
    for k in a.column_names:
        np.testing.assert_array_equal(a.columns[k], b.columns[k], err_msg=k)
    plan = _plan(**kw)
    grp = plan.group(0)
    from moesim.spec.placement import parse
    m, mach = grp.m, grp.machine
    for i in range(plan.total):
        g, j = divmod(i, plan.block)
        grp = plan.group(g)
        p = parse(plan.values["placements"][grp.ix["placements"]], m, mach)
        ctx, b_ = int(a["context"][i]), int(a["batch"][i])
        dm = LDM.lower_model(m, grp.low, p, mach, grp.rt, ctx, grp.kv, b_)
        hw = LHW.lower_machine(mach, grp.rt, p, grp.kernel_mix)
        cols = dict(batch=[b_], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[24], warmup=[6],
                    policy=[0], mode=[0], seed=[11], index=[i])
        res = KD.run(dm, hw, grp.routing, cols)
        assert _close(a["tpot_ms"][i], 1e3 * res["step_mean"][0]), i
        assert _close(a["tpot_p99_ms"][i], 1e3 * res["step_p99"][0]), i
        hit = res["hit_rate"][0]
        assert (math.isnan(a["expert_hit_rate"][i]) and hit < 0) or a["expert_hit_rate"][i] == hit


# ------------------------------------------------------------------------------------ spec
def test_zip_filters_and_ranges():
    tab = sweep(models=["qwen3-30b-a3b", "deepseek-r1"], quants=["Q8_0", "Q2_K"], zip=[["models", "quants"]],
                machines=[M4090], contexts={"start": 1000, "stop": 5000, "step": 2000}, batches=[1, 2])
    assert len(tab) == 2 * 3 * 2
    assert set(zip(tab["model"], tab["quant"])) == {("qwen3-30b-a3b", "Q8_0"), ("deepseek-r1", "Q2_K")}
    assert list(tab["context"][:6]) == [1000, 1000, 3000, 3000, 5000, 5000]
    no_disk = dict(TINY, storage="none")
    fitting = sweep(models=["qwen3-30b-a3b"], quants=["Q2_K", "Q4_K_M", "Q8_0", "BF16"], machines=[no_disk],
                    contexts=[4096], filter={"fits": True})
    every = sweep(models=["qwen3-30b-a3b"], quants=["Q2_K", "Q4_K_M", "Q8_0", "BF16"], machines=[no_disk],
                  contexts=[4096])
    assert 0 < len(fitting) < len(every) and set(fitting["fits"]) - {"no"} == set(fitting["fits"])
    fast = sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090], contexts=[1024, 131072],
                 batches=[1, 64], filter={"decode_tok_s": {"min": 100.0}})
    assert len(fast) and (fast["decode_tok_s"] >= 100.0).all()
    z = sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090], contexts=[1024, 2048, 4096],
              batches=[1, 2, 4], zip=[["contexts", "batches"]])
    assert list(zip(z["context"], z["batch"])) == [(1024, 1), (2048, 2), (4096, 4)]
    logr = normalize_spec(build_spec(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090],
                                     contexts={"start": 1, "stop": 1000, "num": 50, "log": True}))
    vals = Plan(logr).contexts
    assert vals[0] == 1 and vals[-1] == 1000 and np.all(np.diff(vals) > 0)


@pytest.mark.parametrize("spec, field", [
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"], "contxts": [1]}},
     "axes.contxts"),
    ({"axes": {"models": [], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]}}, "axes.models"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"], "batches": []}},
     "axes.batches"),
    ({"axes": {"models": ["deepseek-v3x"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]}}, "axes.models[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M", "Q9_Z"], "machines": ["dgx-h200"]}},
     "axes.quants[1]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h900"]}}, "axes.machines[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": [{"gpu": "rtx-4090", "hots": "x"}]}},
     "axes.machines[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"],
               "placements": ["some-gpu"]}}, "axes.placements[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"],
               "contexts": {"start": 10, "stop": 5, "num": 3}}}, "axes.contexts.stop"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]}, "axis": {}}, "spec"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "zip": [["models", "quants", "contexts"]]}, "zip[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b", "deepseek-r1"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "zip": [["models", "quants"]]}, "zip[0]"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "filter": {"fits": "yes"}}, "filter.fits"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "run": {"mode": "exact"}}, "run.mode"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "run": {"chunk_size": 0}}, "run.chunk_size"),
    ({"axes": {"models": ["qwen3-30b-a3b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"]},
      "run": {"seeds": 1}}, "run.seeds"),
    ({"axes": {"quants": ["Q4_K_M"], "machines": ["dgx-h200"]}}, "axes.models"),
    ({"axes": {"models": ["llama-3-8b"], "quants": ["Q4_K_M"], "machines": ["dgx-h200"],
               "placements": ["experts-cpu"]}}, "axes.placements[0]"),
])
def test_bad_spec_names_the_field(spec, field):
    with pytest.raises(MoesimError) as exc:
        sweep(spec)
    assert exc.value.field == field, str(exc.value)
    assert str(exc.value).startswith(field + ":")


def test_cli_bad_spec_one_line(tmp_path, capsys):
    from moesim.cli import main
    spec = tmp_path / "bad.toml"
    spec.write_text('[axes]\nmodels = ["qwen3-30b-a3b"]\nquants = ["Q4_K_M"]\nmachines = ["dgx-h200"]\n'
                    'contexts = []\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "axes.contexts: empty axis" in err[0]
    spec.write_text("[axes\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o")]) == 2
    assert "not valid TOML" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ output
def _digest(out: Path) -> dict:
    """Every file of a sweep directory (the writer's .lock, which names its pid, is not output)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.name != ".lock"}


SPEC_TOML = """
[axes]
models = ["qwen3-30b-a3b"]
quants = ["Q4_K_M"]
machines = ["dgx-h200"]
placements = ["offload-cache=16"]
contexts = {start = 1000, stop = 40000, num = 150}
batches = [1, 2]

[run]
mode = "montecarlo"
tokens = 32
seed = 3
chunk_size = 20
"""


def test_resume_after_kill_is_identical(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML)
    ref = tmp_path / "ref"
    man = sweep(str(spec), out=ref, format="parquet")
    assert man["complete"] and man["rows"] == 300 and man["n_chunks"] == 15
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "moesim", "sweep", str(spec), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and len(list(out.glob("part-*.parquet"))) < 3 and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(out.glob("part-*.parquet")))
    assert 0 < done < 15, done        # killed part-way
    assert not json.loads((out / "_manifest.json").read_text())["complete"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _digest(out) == _digest(ref)
    # a finished sweep: running it again does nothing
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "already complete" in res.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"} == before
    # a changed spec on the same directory is refused
    spec.write_text(SPEC_TOML.replace("seed = 3", "seed = 4"))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "different spec" in res.stderr and "out:" in res.stderr


def test_formats_round_trip(tmp_path):
    kw = dict(models=["qwen3-30b-a3b", "gpt-oss-120b"], quants=["Q4_K_M"], machines=[M4090, MAC],
              contexts=[512, 70000], batches=[1, 5], chunk_size=5)
    mem = sweep(**kw)
    for fmt in ("parquet", "csv", "jsonl"):
        sweep(**kw, out=tmp_path / fmt, format=fmt)
        back = read(tmp_path / fmt)
        assert back.column_names == mem.column_names
        for k in mem.column_names:
            np.testing.assert_array_equal(back[k], mem[k], err_msg=f"{fmt} {k}")
    with pytest.raises(MoesimError, match="another format"):
        sweep(**kw, out=tmp_path / "csv", format="parquet")
    df = mem.to_pandas()
    assert str(df["model"].dtype) == "category" and len(df) == len(mem)
    t = mem.to_arrow()
    assert pa.types.is_dictionary(t.schema.field("placement").type)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(MoesimError, match="not a moesim sweep directory"):
        sweep(**kw, out=tmp_path / "junk")


def test_dask_local_cluster_output_identical(tmp_path):
    pytest.importorskip("distributed")
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML.replace("num = 150", "num = 30").replace('"montecarlo"', '"analytic"'))
    ref = tmp_path / "ref"
    sweep(str(spec), out=ref)
    out = tmp_path / "dask"
    man = sweep(str(spec), out=out, local_workers=2)
    assert man["complete"]
    assert _digest(out) == _digest(ref)


# ------------------------------------------------------------------------------------ threads
# auto placement on a 64 GB host over a wide context range: almost every small chunk meets decode
# variants (placement candidate x page-cache size x batch) its group has not lowered yet
THREADED = dict(models=["deepseek-r1"], quants=["Q4_K_M"], machines=[M4090_SMALL], placements=["auto"],
                contexts={"start": 256, "stop": 400000, "num": 300, "log": True}, batches=[1, 2, 3, 5, 8, 13, 21, 34],
                chunk_size=48)


@pytest.fixture
def fast_switching():
    """Hand the GIL over between threads as often as possible, so shared state interleaves."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _same_columns(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_threads_sharing_one_plan_equal_serial(fast_switching):
    """Six Python threads run the chunks of one Plan at once, sharing its Group while its variant table
    grows under them: every chunk equals the serial run byte for byte (before, a table re-sorted between
    one thread's lookup and its kernel call gave wrong rows or a crash)."""
    import random
    import threading
    serial_plan = _plan(**THREADED)
    serial = [run_chunk(serial_plan, k) for k in range(serial_plan.n_chunks)]
    assert len(serial_plan.group(0).table) > 100
    for trial in range(2):
        plan = _plan(**THREADED)
        order = list(range(plan.n_chunks))
        random.Random(trial).shuffle(order)
        got, errors = {}, []
        start = threading.Barrier(6)

        def work(i):
            try:
                start.wait()
                for k in order[i::6]:
                    got[k] = run_chunk(plan, k)
            except BaseException as exc:   # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        bad = [k for k in range(plan.n_chunks) if not _same_columns(serial[k], got[k])]
        assert not bad, (trial, bad)


def test_group_variant_table_grows_atomically(fast_switching):
    """Threads adding overlapping sets of new variant keys to one Group: each gets back a table that
    holds its keys, sorted, with rows equal to a serially built group's; the last table holds them all."""
    import threading
    plan = _plan(**THREADED)
    grp = plan.group(0)
    E, n_b = grp.E, plan.n_b
    keys = sorted({(j * (E + 2) + E) * n_b + bi for j in range(0, 40, 3) for bi in range(n_b)})
    sets = [keys[i::3] + keys[i + 1::5] for i in range(6)]          # overlapping
    tables, errors = [None] * len(sets), []
    start = threading.Barrier(len(sets))

    def work(i):
        try:
            start.wait()
            for part in (sets[i][::2], sets[i][1::2]):
                tables[i] = grp.add_variants(part)
                assert set(part) <= set(tables[i].keys.tolist())
        except BaseException as exc:       # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ref = _plan(**THREADED).group(0)
    ref_table = ref.add_variants(keys)
    final = grp.table
    assert final.keys.tolist() == keys == ref_table.keys.tolist()
    for t in tables + [final]:
        ks = t.keys.tolist()
        assert ks == sorted(ks) and len(t.tables["variant_f64"]) == len(ks)
        assert not t.keys.flags.writeable and not t.tables["variant_f64"].flags.writeable
        idx = [keys.index(k) for k in ks]
        assert t.tables["variant_f64"].tobytes() == ref_table.tables["variant_f64"][idx].tobytes()
        # the i32 rows index kind rows, whose order follows which placement was lowered first
        for row, k in zip(t.tables["variant_i32"], ks):
            r = ref_table.tables["variant_i32"][keys.index(k)]
            mine = t.tables["kind_f64"][row[0]:row[0] + row[1]]
            theirs = ref_table.tables["kind_f64"][r[0]:r[0] + r[1]]
            assert row[1] == r[1] and mine.tobytes() == theirs.tobytes()


def test_dask_threaded_worker_equals_serial(tmp_path, fast_switching):
    """One dask worker with four threads runs the chunks of one sweep concurrently (sharing the worker's
    Plan and Group): the files equal a serial sweep's, byte for byte."""
    pytest.importorskip("distributed")
    from distributed import LocalCluster
    from moesim.analysis.sweep import distribute
    kw = dict(THREADED, contexts=dict(THREADED["contexts"], num=120))
    sweep(**kw, out=tmp_path / "serial", threads=1)
    distribute._PLANS.clear()
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None) as cluster:
        man = sweep(**kw, out=tmp_path / "dask", scheduler=cluster.scheduler_address)
        mem = sweep(**dict(kw, chunk_size=31), scheduler=cluster.scheduler_address)
    assert man["complete"] and man["n_chunks"] > 15
    assert _digest(tmp_path / "dask") == _digest(tmp_path / "serial")
    ref = sweep(**dict(kw, chunk_size=31), threads=1)
    assert _same_columns(mem.columns, ref.columns)


# ------------------------------------------------------------------------------------ kernels
def test_candidate_weights_come_from_the_memory_kernel():
    """The weights per tier the sweep's memory tables hold are ms_memory.c's (and equal its Python twin)."""
    from moesim.analysis.sweep import candidate_weights
    from moesim.engine import memory as EMEM
    from moesim.engine.lower.memory import configure
    from moesim.engine.codes import CLASS_MTP, TIER_GPU, TIER_HOST
    plan = _plan(models=["deepseek-r1", "gpt-oss-120b", "qwen3-next-80b-a3b"], quants=["Q4_K_M"],
                 machines=[M4090, CPU, MAC], runtimes=["auto", "ktransformers"],
                 placements=["auto", "offload-cache=16", "layers-gpu=7"], filter={"skip_inapplicable": True})
    n = 0
    for g in range(plan.n_groups):
        grp = plan.group(g)
        if grp.skip:
            continue
        pl = grp.mem_tables["places"]
        cfg = configure(grp.m, grp.low, grp.machine, grp.rt, grp.cands[0], 1, 1, grp.kv, 0)
        twin = candidate_weights(grp.low, grp.cands, cfg, engine="reference")
        for j in range(0, len(grp.cands), 7):
            p = grp.cands[j]
            for k in ("w_gpu", "w_host", "routed_host", "any_gpu"):
                assert pl[k][j] == twin[k][j], (grp.labels, str(p), k)
            c = configure(grp.m, grp.low, grp.machine, grp.rt, p, 1, 1, grp.kv, 0)
            c["embed_on_gpu"], c["head_copy"] = cfg["embed_on_gpu"], cfg["head_copy"]
            bc = EMEM.evaluate(grp.low, c)["by_class"][0]
            assert pl["w_gpu"][j] == sum(float(bc[k, TIER_GPU]) for k in range(CLASS_MTP + 1))
            assert pl["w_host"][j] == sum(float(bc[k, TIER_HOST]) for k in range(CLASS_MTP + 1))
            n += 1
    assert n > 50


def _attention_split(dm: dict, hw: dict, routing: dict, b: int) -> tuple:
    """(full analytic step, step with attention zeroed + each layer's attention term as ms_decode.c times it)."""
    from moesim.analysis.sweep.variants import _zeroed
    cols = dict(batch=[b], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[256], warmup=[32], policy=[0],
                mode=[1], seed=[0], index=[0])
    full = KD.run(dm, hw, routing, cols)["step_mean"][0]
    split = KD.run(_zeroed(dm), hw, routing, cols)["step_mean"][0]
    for l in range(len(dm["attn_bytes"])):
        on = bool(dm["attn_on_gpu"][l])
        split += max(b * dm["kv_bytes"][l] / (hw["gpu_bw"] if on else hw["host_bw"]),
                     b * dm["score_flops"][l] / (hw["gpu_flops"] if on else hw["cpu_attn_flops"]))
    return full, split


def test_step_splits_into_attention_only_without_prefetch(monkeypatch):
    """The analytic variants' split (step with attention zeroed + attention terms) is the step while no
    layer prefetches, and is not once one does; a group built with prefetch on evaluates whole steps, and
    the split refuses it."""
    from moesim.errors import KernelError
    from moesim.engine.lower import routing as LR
    from moesim.analysis.sweep import check_separable
    kw = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090_SMALL], placements=["offload-cache=16"],
              contexts=[32768], batches=[4])
    grp = _plan(**kw).group(0)
    assert not np.any(grp.routing["recall"])
    p = grp.cands[0]
    dm = LDM.lower_model(grp.m, grp.low, p, grp.machine, grp.rt, 32768, grp.kv, 4)
    hw = LHW.lower_machine(grp.machine, grp.rt, p, grp.kernel_mix)
    full, split = _attention_split(dm, hw, grp.routing, 4)
    assert _close(split, full, 1e-12), (split, full)
    prefetching = dict(grp.routing, recall=np.full(len(grp.routing["recall"]), 0.8))
    full, split = _attention_split(dm, hw, prefetching, 4)
    assert not _close(split, full, 1e-6), (split, full)
    with pytest.raises(KernelError, match="prefetch"):
        check_separable(prefetching)
    orig = LR.lower
    monkeypatch.setattr(LR, "lower", lambda dims, prof, seed=0, prefetch=False, **k: orig(dims, prof, seed, True, **k))
    grp = _plan(**kw).group(0)
    assert grp.direct            # a prefetching group takes the whole-step path (sweep.direct), not the split
    from moesim.analysis.sweep.variants import DecodeVariants
    grp.direct = False
    with pytest.raises(KernelError, match="prefetch off"):
        DecodeVariants(grp)
    _plan(**kw, mode="montecarlo", tokens=16).group(0)     # Monte Carlo variants do not split the step


def test_contexts_beyond_the_model_maximum_are_dropped_unless_allowed():
    """With the README's kind of grid, rows above a model's trained maximum used to be kept as fitting."""
    kw = dict(models=["llama-2-7b", "qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090],
              contexts=[2048, 4096, 8192, 65536], batches=[1], mode="analytic")
    tab = sweep(**kw)
    ctx = {(m, int(c)) for m, c in zip(tab.to_pandas()["model"], tab["context"])}
    assert ctx == {("llama-2-7b", 2048), ("llama-2-7b", 4096), ("qwen3-30b-a3b", 2048), ("qwen3-30b-a3b", 4096),
                   ("qwen3-30b-a3b", 8192)}
    allowed = sweep(**kw, filter={"allow_beyond_max_context": True})
    assert len(allowed) == 8
    with pytest.raises(MoesimError, match="must be true or false"):
        sweep(**kw, filter={"allow_beyond_max_context": 1})


# ------------------------------------------------------------------------------------ output folders
def test_a_second_sweep_on_the_same_out_is_refused_and_the_first_finishes(tmp_path):
    """A second sweep on a busy --out used to delete the first one's in-flight chunk and kill it."""
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "moesim", "sweep", str(spec), "--out", str(out), "--no-progress"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / ".lock").exists():
        time.sleep(0.01)
    while time.time() < deadline and "pid" not in (out / ".lock").read_text():
        time.sleep(0.01)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert second.returncode == 2 and "another sweep" in second.stderr and f"pid {first.pid}" in second.stderr
    assert json.loads((out / "_manifest.json").read_text())["complete"]
    # once the first is done, the same command finds the sweep complete
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already complete" in again.stdout


def test_an_unwritable_out_is_a_clear_error(tmp_path, monkeypatch):
    from moesim.analysis.sweep import distribute
    kw = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=["dgx-h200"], contexts=[1000, 2000],
              batches=[1], mode="analytic")
    with pytest.raises(MoesimError, match="cannot write the sweep to /sys/") as exc:
        sweep(**kw, out="/sys/moesim-sweep-test")       # not permitted, even as root
    assert exc.value.field == "out"
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(MoesimError, match="not a directory"):
        sweep(**kw, out=f)

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(distribute, "_write_chunk", disk_full)
    with pytest.raises(MoesimError, match="No space left on device"):
        sweep(**kw, out=tmp_path / "full", threads=1)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_the_output_folder_reads_directly_with_pandas_and_pyarrow(tmp_path, fmt):
    """Nothing but parts is visible to a dataset reader (the manifest used to break pandas.read_parquet(DIR));
    the rows equal moesim's own reading of the folder."""
    import pandas as pd
    import pyarrow.dataset as ds
    from moesim.analysis.sweep import read
    out = tmp_path / "s"
    sweep(models=["qwen3-30b-a3b", "llama-3-8b"], quants=["Q4_K_M"], machines=[M4090], contexts=[1024, 4096],
          batches=[1, 2], out=str(out), format=fmt, chunk_size=3, progress=False)
    assert len(list(out.glob("part-*"))) == 3
    dset = ds.dataset(out, format=fmt)
    ours = read(out)
    assert dset.count_rows() == len(ours.columns["context"]) == 8
    frame = pd.read_parquet(out) if fmt == "parquet" else dset.to_table().to_pandas()
    assert list(frame["context"]) == list(ours.columns["context"])
    assert list(frame["decode_tok_s"]) == pytest.approx(list(ours.columns["decode_tok_s"]), rel=1e-12)
    assert sorted(set(frame["model"])) == ["llama-3-8b", "qwen3-30b-a3b"]


def test_a_sweep_written_with_the_old_manifest_name_still_resumes_and_reads(tmp_path):
    from moesim.analysis.sweep import read
    out = tmp_path / "s"
    kw = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[M4090], contexts=[1024, 4096], batches=[1],
              out=str(out), chunk_size=1, progress=False)
    sweep(**kw)
    man = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").unlink()
    (out / "manifest.json").write_text(json.dumps(dict(man, complete=False)))   # as if killed mid-way
    sorted(out.glob("part-*.parquet"))[-1].unlink()
    sweep(**kw)                                   # resumes the old folder in place
    assert (out / "manifest.json").exists() and not (out / "_manifest.json").exists()
    assert list(read(out).columns["context"]) == [1024, 4096]


def test_sweep_relaxes_the_collector_only_while_it_runs(monkeypatch):
    """sweep runs the cyclic collector less often (api.SWEEP_GC_THRESHOLD) and blind to the objects alive before it
    (gc.freeze) while its chunks run, and puts the caller's thresholds and unfrozen heap back, after a sweep that
    fails too. Objects the caller froze stay frozen."""
    import gc
    from moesim.analysis.sweep import api, distribute
    before = gc.get_threshold()
    inside = []
    run_chunk = distribute.run_chunk
    def watched(*a, **k):
        inside.append((gc.get_threshold(), gc.get_freeze_count() > 0, gc.isenabled()))
        return run_chunk(*a, **k)
    monkeypatch.setattr(distribute, "run_chunk", watched)
    machines = [moesim.machine(gpu="rtx-4090")]
    spec = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=machines, contexts=[4096], batches=[1],
                progress=False)
    gc.set_threshold(900, 11, 12)
    try:
        assert gc.get_freeze_count() == 0
        assert len(sweep(**spec).columns["context"]) == 1
        assert inside == [((api.SWEEP_GC_THRESHOLD, 11, 12), True, True)]
        assert gc.get_threshold() == (900, 11, 12) and gc.get_freeze_count() == 0
        with pytest.raises(MoesimError):
            sweep(**dict(spec, models=["no-such-model"]))
        assert gc.get_threshold() == (900, 11, 12) and gc.get_freeze_count() == 0
        gc.set_threshold(50_000, 11, 12)        # a caller's larger threshold is kept
        sweep(**spec)
        assert inside[-1][0] == (50_000, 11, 12) and gc.get_threshold() == (50_000, 11, 12)
        gc.freeze()                     # the caller's own frozen objects are left frozen (a few may die meanwhile)
        frozen = gc.get_freeze_count()
        sweep(**spec)
        assert gc.get_freeze_count() > frozen // 2 and gc.get_threshold() == (50_000, 11, 12)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
