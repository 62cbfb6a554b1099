"""engine.decode.run_variants (one kernel call over a sweep group's decode variants) equals engine.decode.run called
once per (model, machine, columns) job, configuration by configuration and bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import moesim
from moesim.analysis.sweep import variants as V
from moesim.engine import decode as D
from moesim.errors import KernelError


def _jobs(monkeypatch) -> list:
    """The (routing, jobs) of every group of a small automatic-placement sweep (several candidates per group)."""
    seen = []

    def spy(rt, jobs, n_threads=1):
        seen.append((rt, list(jobs)))
        return D.run_variants(rt, jobs, n_threads)

    monkeypatch.setattr(V, "run_variants", spy)
    moesim.sweep(models=["qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b"], quants=["Q4_K_M", "Q8_0"],
                 machines=[dict(gpu="rtx-4060-ti-16gb", host="ddr5-6000x2", host_mem_gb=128), dict(gpu="m4-pro")],
                 contexts=[4096, 131072], batches=[1, 4, 16],
                 filter={"skip_inapplicable": True, "allow_beyond_max_context": True}, progress=False)
    return seen


def test_one_call_equals_one_run_per_job(monkeypatch):
    seen = _jobs(monkeypatch)
    assert seen and any(len(jobs) > 1 for _, jobs in seen)
    for rt, jobs in seen:
        rows = D.run_variants(rt, jobs)
        assert rows.shape == (sum(len(c["batch"]) for _, _, c in jobs), 13)
        want = []
        for dm, hw, cols in jobs:
            r = D.run(dm, hw, rt, cols)
            want.append(np.column_stack([r["step_mean"], r["by_resource"], r["accepted"], np.zeros(len(r["accepted"])),
                                         r["hit_rate"], np.zeros(len(r["accepted"]))]))
        assert np.array_equal(rows, np.vstack(want))


def test_errors_name_the_entry_point(monkeypatch):
    rt, jobs = _jobs(monkeypatch)[0]
    dm, hw, cols = jobs[0]
    bad = dict(hw, gpu_bw=0.0)
    with pytest.raises(KernelError, match="ms_decode_many"):
        D.run_variants(rt, [jobs[0], (dm, bad, cols)])
    assert D.run_variants(rt, []).shape == (0, 13)
