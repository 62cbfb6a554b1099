"""moesim.sweep(processes=N): an in-memory sweep forked into worker processes gives the serial sweep's
table exactly, passes a worker's error to the caller, and is refused where it does not apply."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import moesim
from moesim.analysis.sweep import distribute
from moesim.errors import MoesimError

pytestmark = pytest.mark.skipif(not distribute.can_fork(), reason="forked sweep workers need Linux")

# models of different sizes (so slices cost differently), placements that change per group, small chunks
# (slices cut at chunk boundaries) and a filter (rows dropped inside slices)
GRID = dict(models=["qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b", "deepseek-r1"], quants=["Q4_K_M", "Q8_0"],
            machines=[{"gpu": "rtx-4090", "host_mem_gb": 128}, {"gpu": "rtx-3090", "host_mem_gb": 64}],
            contexts=[4096, 32768], batches=[1, 4], placements=["auto", "experts-cpu", "n-cpu-moe=4"],
            mode="analytic", filter={"skip_inapplicable": True, "fits": True}, chunk_size=37)


def _equal_tables(a, b) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in a.columns:
        x, y = np.asarray(a[c]), np.asarray(b[c])
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), c


@pytest.fixture(scope="module")
def serial():
    return moesim.sweep(**GRID)


@pytest.mark.parametrize("processes", [2, 3, 7])
def test_forked_sweep_equals_serial(serial, processes):
    assert len(serial) > 0
    _equal_tables(serial, moesim.sweep(**GRID, processes=processes))


def test_calling_process_takes_each_share_in_turn(serial, monkeypatch):
    """Successive forked sweeps hand this process a different share each call (so a long-lived process lowers every
    share and its later workers inherit them): its slices rotate through every share, and every call's table is the
    serial one."""
    parent, inner, mine = os.getpid(), distribute.run_range, []

    def spy(plan, a, b, threads=1, buffers=None):
        if os.getpid() == parent:
            mine[-1].add(a)
        return inner(plan, a, b, threads, buffers)

    monkeypatch.setattr(distribute, "run_range", spy)
    for _ in range(3):
        mine.append(set())
        _equal_tables(serial, moesim.sweep(**GRID, processes=3))
    assert all(mine) and len({frozenset(m) for m in mine}) == 3
    assert not (mine[0] & mine[1]) and not (mine[1] & mine[2]) and not (mine[0] & mine[2])


def test_more_processes_than_groups():
    kw = dict(GRID, models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[GRID["machines"][0]], placements=["auto"])
    _equal_tables(moesim.sweep(**kw), moesim.sweep(**kw, processes=8))


def test_rank_forked_equals_serial():
    m = moesim.machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    few = ["qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite", "gemma-3-1b"]
    assert moesim.rank(m, models=few, processes=2) == moesim.rank(m, models=few)


def test_worker_error_reaches_the_caller(monkeypatch):
    """A worker's MoesimError is raised in the calling process, its field kept; the caller's own slices
    succeed, so the error can only come from a worker."""
    parent, inner = os.getpid(), distribute.run_range

    def failing_in_workers(plan, a, b, threads):
        if os.getpid() != parent:
            raise MoesimError("raised in a worker", "models")
        return inner(plan, a, b, threads)

    monkeypatch.setattr(distribute, "run_range", failing_in_workers)
    with pytest.raises(MoesimError) as e:
        moesim.sweep(**GRID, processes=2)
    assert e.value.field == "models" and str(e.value) == "models: raised in a worker"


def test_moesim_error_pickles_whole():
    e = pickle.loads(pickle.dumps(MoesimError("not in the catalog", "quant")))
    assert type(e) is MoesimError and e.field == "quant" and str(e) == "quant: not in the catalog"


@pytest.mark.parametrize("kw, says", [({"processes": 0}, "processes"), ({"processes": 2, "out": "x"}, "in-memory"),
                                       ({"processes": 2, "local_workers": 2}, "in-memory")])
def test_bad_processes_name_the_field(kw, says, tmp_path):
    if "out" in kw:
        kw = dict(kw, out=str(tmp_path / "out"))
    with pytest.raises(MoesimError) as e:
        moesim.sweep(**GRID, **kw)
    assert e.value.field == "processes" and says in str(e.value)


def test_fork_after_threaded_kernels_does_not_hang():
    """OpenMP's thread pool does not survive a fork: workers run one thread each, so a process that ran
    multi-threaded kernels first still completes (in a subprocess, under a timeout)."""
    code = textwrap.dedent(f"""
        import moesim
        grid = {GRID!r}
        a = moesim.sweep(**grid, threads=2)
        b = moesim.sweep(**grid, threads=2, processes=2)
        assert len(a) == len(b) > 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
