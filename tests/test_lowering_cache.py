"""The persistent lowering cache (moesim._lowering_cache): results with it populated are bit-for-bit the
results without it; a fingerprint change, a corrupt, truncated or foreign file and an unwritable folder
each leave it out (rebuilt where it can be written); the ``moesim cache`` verb.

Every test here points MOESIM_CACHE_DIR at its own tmp_path (conftest gives the session one too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moesim
from moesim import MoesimError
from moesim import _lowering_cache as LC

# The subprocesses import the moesim this test process imported (the tree or the installed copy: CI
# installs it, and only the installed copy carries the built kernel there).
SRC = str(Path(moesim.__file__).resolve().parents[1])

# One process's results, printed as JSON (floats as repr: exact): rank over the whole catalog, simulate
# and fit of a few configurations, a sweep table; and the cache's hits and misses.
SCRIPT = r"""
import json, sys
import moesim
from moesim import _lowering_cache as LC
mach = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
out = {"rank": moesim.rank(mach)}
out["simulate"] = [moesim.simulate(m, mach, quant=q, mode=mode, tokens=64).to_dict()
                   for m, q, mode in (("qwen3-30b-a3b", "Q4_K_M", "analytic"), ("gpt-oss-20b", "native", "montecarlo"),
                                      ("deepseek-v2-lite", "Q8_0", "analytic"))]
out["fit"] = [moesim.fit(m, mach) for m in ("olmoe-1b-7b", "glm-4.5-air")]
tab = moesim.sweep(models=["qwen3-30b-a3b", "deepseek-v2-lite", "gemma-2-9b"], quants=["Q4_K_M", "Q6_K"],
                   machines=[mach, "dgx-spark"], contexts=[4096, 32768], batches=[1, 4], mode="analytic")
out["sweep"] = {c: tab[c].tolist() for c in tab.columns}
out["stats"] = LC.stats()
print(json.dumps(out, sort_keys=True, default=str))
"""


def _run(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOESIM_CACHE")}
    env.update(env_extra, PYTHONPATH=SRC)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_populated_cache_gives_identical_results(tmp_path):
    off = _run({"MOESIM_CACHE": "off"})
    cold = _run({"MOESIM_CACHE_DIR": str(tmp_path)})        # empty: lowers, then writes at exit
    warm = _run({"MOESIM_CACHE_DIR": str(tmp_path)})        # populated: loads
    assert off["stats"] == {"hits": {}, "misses": {}}
    assert not cold["stats"]["hits"] and cold["stats"]["misses"]["lowered"] > 100
    assert warm["stats"]["hits"]["lowered"] > 100 and warm["stats"]["hits"]["model"] > 100
    assert not any(warm["stats"]["misses"].values()), warm["stats"]["misses"]
    # the window tables of the token-memory profiles (seconds of sampling each) are kept too
    assert cold["stats"]["misses"]["window"] >= 2 and warm["stats"]["hits"]["window"] >= 2
    assert len(off["rank"]) > 100 and off["sweep"]["decode_tok_s"]
    for part in ("rank", "simulate", "fit", "sweep"):
        assert json.dumps(cold[part], sort_keys=True) == json.dumps(off[part], sort_keys=True), part
        assert json.dumps(warm[part], sort_keys=True) == json.dumps(off[part], sort_keys=True), part
    assert len(list(tmp_path.glob("lowering/*/*.pkl"))) >= 5


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache state over its own folder; the session's state is restored afterwards."""
    monkeypatch.setenv("MOESIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MOESIM_CACHE", raising=False)
    LC.reset()
    yield tmp_path / "cache"
    LC.reset()


def _files(folder: Path) -> list:
    return sorted(folder.glob("lowering/*/*.pkl"))


def test_round_trip_and_off(cache, monkeypatch):
    assert LC.get("params", "x") is None
    LC.put("params", "x", (1.0, 2.0))
    assert LC.flush() == 1 and len(_files(cache)) == 1
    LC.reset()
    assert LC.get("params", "x") == (1.0, 2.0)
    monkeypatch.setenv("MOESIM_CACHE", "off")
    LC.reset()
    assert not LC.enabled() and LC.get("params", "x") is None
    LC.put("params", "y", 1)
    assert LC.flush() == 0 and LC.memo("params", "y", lambda: 7) == 7


def test_fingerprint_change_invalidates(cache, monkeypatch):
    LC.put("params", "x", (1.0, 2.0))
    LC.flush()
    monkeypatch.setattr(LC, "compute_fingerprint", lambda: "f" * 64)
    LC.reset()
    assert LC.get("params", "x") is None                  # another fingerprint: another folder, empty
    LC.put("params", "x", (3.0, 4.0))
    LC.flush()
    assert len({p.parent for p in _files(cache)}) == 2
    monkeypatch.undo()
    monkeypatch.setenv("MOESIM_CACHE_DIR", str(cache))
    LC.reset()
    assert LC.get("params", "x") == (1.0, 2.0)


def test_fingerprint_reads_sources_and_catalog(monkeypatch, tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    monkeypatch.setattr(LC, "_PKG", tmp_path)
    monkeypatch.setattr(LC, "_source_files", lambda: [f])
    one = LC.compute_fingerprint()
    f.write_text("x = 2\n")
    assert LC.compute_fingerprint() != one
    monkeypatch.undo()
    names = {p.relative_to(LC._PKG).as_posix() for p in LC._source_files()}
    assert {"catalog/models.toml", "catalog/quants.toml", "spec/models.py", "spec/gguf_types.py",
            "engine/lower/memory.py", "engine/lower/routing.py"} <= names
    assert any(n.startswith("engine/_kernel") and not n.endswith(".py") for n in names)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "magic"])
def test_corrupt_file_ignored_and_rebuilt(cache, damage):
    LC.put("kernel_mix", ("m", "q"), {"a": [1.5] * 100})
    LC.flush()
    path, = _files(cache)
    data = path.read_bytes()
    bad = {"truncate": data[:len(data) // 2], "flip": data[:-20] + bytes([data[-20] ^ 1]) + data[-19:],
           "garbage": os.urandom(len(data)), "empty": b"", "magic": b"X" + data[1:]}[damage]
    path.write_bytes(bad)
    LC.reset()
    assert LC.get("kernel_mix", ("m", "q")) is None
    LC.put("kernel_mix", ("m", "q2"), 2.0)
    LC.flush()                                            # rebuilt: a whole, valid file again
    LC.reset()
    assert LC.get("kernel_mix", ("m", "q2")) == 2.0 and LC.get("kernel_mix", ("m", "q")) is None


def test_foreign_file_ignored(cache):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    LC.put("params", "x", 1)
    LC.flush()
    path, = _files(cache)
    os.chown(path, 54321, -1)
    LC.reset()
    assert LC.get("params", "x") is None


def test_writers_merge(cache):
    assert LC.get("params", "a") is None                  # this process read the (empty) file
    st = LC._state()
    LC._write(st, "params", {"b": 2})                     # another process writes meanwhile
    LC.put("params", "a", 1)
    LC.flush()
    LC.reset()
    assert LC.get("params", "a") == 1 and LC.get("params", "b") == 2
    assert not list(Path(cache).glob("lowering/*/.*.tmp"))


def test_namespace_cap(cache, monkeypatch):
    monkeypatch.setitem(LC.NAMESPACES, "params", 3)
    for i in range(10):
        LC.put("params", i, i)
    LC.flush()
    LC.reset()
    assert [LC.get("params", i) for i in range(5)] == [0, 1, 2, None, None]


def test_unwritable_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MOESIM_CACHE_DIR", str(blocker / "cache"))
    LC.reset()
    try:
        LC.put("params", "x", 1)
        assert LC.flush() == 0 and "NotADirectoryError" in LC.last_error()
        assert LC.get("params", "x") == 1                 # the process keeps what it computed
    finally:
        LC.reset()
    env = {**os.environ, "PYTHONPATH": SRC, "MOESIM_CACHE_DIR": str(blocker / "cache")}
    env.pop("MOESIM_CACHE", None)
    fit = subprocess.run([sys.executable, "-m", "moesim", "fit", "olmoe-1b-7b", "--gpu", "rtx-4090", "--json"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert fit.returncode == 0 and json.loads(fit.stdout), fit.stderr
    build = subprocess.run([sys.executable, "-m", "moesim", "cache", "build", "--model", "olmoe-1b-7b"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 2 and "MOESIM_CACHE_DIR" in build.stderr, build.stderr


def test_lowering_survives_a_corrupt_cache(cache):
    """A real lowering through a damaged file: equal to the lowering without the cache."""
    import numpy as np
    from moesim.engine.lower import memory as M
    from moesim.spec import quants as Q
    from moesim.spec.models import catalog_model
    m = catalog_model("deepseek-v2-lite")
    q = Q.resolve("Q4_K_M", m)
    M._lower_cached.cache_clear()
    first = M.lower(m, q)
    LC.flush()
    path = next(p for p in _files(cache) if p.name == "lowered.pkl")
    path.write_bytes(path.read_bytes()[:-7])
    for damaged in (True, False):                         # the damaged file, then the rebuilt one
        LC.reset()
        M._lower_cached.cache_clear()
        low = M.lower(m, q)
        assert low is not first
        for f in ("attn", "router", "shared", "expert_one", "dense", "n_experts") + M.KV_COLUMNS:
            a, b = getattr(low, f), getattr(first, f)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f
        assert (low.embed, low.head, low.mtp, low.weights_by_class) == (first.embed, first.head, first.mtp,
                                                                        first.weights_by_class)
        assert not low.kv_elems.flags.writeable
        assert LC.stats()["hits"].get("lowered", 0) == (0 if damaged else 1)
        LC.flush()
    M._lower_cached.cache_clear()


def test_cache_verb(cache, capsys):
    from moesim.cli import main
    assert main(["cache", "build", "--model", "olmoe-1b-7b", "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["models"] == 1 and built["configurations"] >= 7
    assert built["cache"]["namespaces"]["lowered"]["entries"] == built["configurations"]
    assert main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert str(cache) in text and LC.fingerprint()[:24] in text and "lowered" in text
    assert main(["cache", "clear"]) == 0 and "removed 1" in capsys.readouterr().out
    assert not _files(cache)
    assert main(["cache", "purge"]) == 2 and "action" in capsys.readouterr().err
    assert main(["cache"]) == 2 and "action" in capsys.readouterr().err
    assert main(["cache", "info", "--model", "olmoe-1b-7b"]) == 2 and "--model" in capsys.readouterr().err
    assert main(["cache", " INFO ", "--json"]) == 0 and json.loads(capsys.readouterr().out)["enabled"] is True
    assert main(["cache", "build", "--model", "no-such-model"]) == 2
    assert "model" in capsys.readouterr().err


def test_cache_build_refuses_when_off(monkeypatch):
    from moesim.analysis.lowering_build import build
    monkeypatch.setenv("MOESIM_CACHE", "off")
    LC.reset()
    try:
        with pytest.raises(MoesimError) as exc:
            build(["olmoe-1b-7b"])
        assert exc.value.field == "MOESIM_CACHE"
    finally:
        LC.reset()


def _same_tables(a: dict, b: dict) -> None:
    import numpy as np
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], dict):
            _same_tables(a[k], b[k])
        elif isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert type(a[k]) is type(b[k]) and a[k] == b[k], k


@pytest.mark.parametrize("mid", ["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "gemma-2-9b"])
def test_routing_tables_round_trip(mid, cache):
    """The routing tables as stored (derived tables left out, computed again) equal the lowering's."""
    import pickle
    from moesim.analysis.simulate import routing_profile
    from moesim.engine.lower import routing as R
    from moesim.spec.models import catalog_model
    m = catalog_model(mid)
    dims, prof = R.RoutingDims.of(m), routing_profile(m)
    for seed, prefetch in ((0, False), (7, True)):
        rt = R._lower_tables(dims, prof, seed, prefetch, 4)
        _same_tables(R._unpack(pickle.loads(pickle.dumps(R._pack(rt), protocol=5)), dims.top_k), rt)


def test_concurrent_writers_leave_a_whole_file(tmp_path):
    """Processes writing one namespace at once: the file is always one writer's whole (merged) file,
    never a torn one, and no temporary file is left behind."""
    code = ("import sys\nfrom moesim import _lowering_cache as LC\nfor r in range(20):\n"
            "    LC.put('params', (sys.argv[1], r), list(range(2000)))\n    LC.flush()\n")
    env = {**os.environ, "PYTHONPATH": SRC, "MOESIM_CACHE_DIR": str(tmp_path)}
    env.pop("MOESIM_CACHE", None)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], env=env) for i in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    path, = tmp_path.glob("lowering/*/params.pkl")
    entries = LC._read(path, path.read_bytes()[len(LC.MAGIC):len(LC.MAGIC) + 64].decode())
    assert entries and all(v == list(range(2000)) for v in entries.values())
    assert {k[0] for k in entries} <= {"0", "1", "2", "3"} and len(entries) >= 20
    assert not list(tmp_path.glob("lowering/*/.*.tmp"))


def test_tier_weights_kept_under_the_lowering(cache):
    """The weights per tier of llama.cpp's automatic placement candidates (engine.lower.placement) are kept
    under the lowering's key, never a machine's: ``cache build`` fills them, a sweep on a machine the build
    never saw loads them, and they are the memory kernel's bit for bit. A multi-GPU split (gpu_ways > 1)
    is not kept."""
    from moesim.analysis.lowering_build import build
    from moesim.analysis.sweep import Plan
    from moesim.analysis.sweep.spec import build_spec, normalize_spec
    from moesim.engine.lower import placement as P
    P._candidate_weights.cache_clear()
    built = build(["olmoe-1b-7b"])
    assert built["cache"]["namespaces"]["tier_weights"]["entries"] >= 7
    LC.reset()
    P._candidate_weights.cache_clear()
    plan = Plan(normalize_spec(build_spec(models=["olmoe-1b-7b"], quants=["Q4_K_M", "Q2_K", "Q8_0"],
                                          machines=[dict(gpu="rtx-3090", host="ddr4-3200x2", host_mem_gb=32),
                                                    dict(gpu="h200", gpus=4)],
                                          runtimes=["llama.cpp"], contexts=[4096], batches=[1])))
    n = 0
    for g in range(plan.n_groups):
        grp = plan.group(g)
        full, _ = grp.plan.shared(("mem_cfg", grp.ix["models"], grp.ix["machines"], id(grp.rt), grp.kv, 0), None)
        rest = tuple(sorted((k, tuple(v) if k == "gpu_ways" else v) for k, v in full[0].items()
                            if k not in P._PROBE_KEYS))
        kernel = P._kernel_weights(grp.low, P._placed(tuple(grp.cands)), rest, 0, "c")
        for k, v in kernel.items():
            assert np.array_equal(grp.mem_tables["places"][k], v), (grp.labels, k)
        n += 1
    assert n == 6
    hits, misses = LC.stats()["hits"].get("tier_weights", 0), LC.stats()["misses"].get("tier_weights", 0)
    assert hits == 3 and misses == 0          # the 4-GPU machine's split is computed, not kept
