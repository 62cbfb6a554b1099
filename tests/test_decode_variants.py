"""engine.decode.run_variants (one kernel call over a sweep group's decode variants) equals engine.decode.run called
once per (model, machine, columns) job, configuration by configuration and bit for bit; engine.decode.run_prepared
(the sweep's call: the same jobs checked and filled into their C structs once) equals run_variants."""
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
        # the sweep's prepared jobs as the tables they were prepared from (each prepared object holds its table)
        seen.append((rt.table, [tuple(x.table for x in job) for job in jobs], rt, list(jobs)))
        return D.run_prepared(rt, jobs, n_threads)

    monkeypatch.setattr(V, "run_prepared", spy)
    moesim.sweep(models=["qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b"], quants=["Q4_K_M", "Q8_0"],
                 machines=[dict(gpu="rtx-4060-ti-16gb", host="ddr5-6000x2", host_mem_gb=128), dict(gpu="m4-pro")],
                 contexts=[4096, 131072], batches=[1, 4, 16],
                 filter={"skip_inapplicable": True, "allow_beyond_max_context": True}, progress=False)
    return seen


def test_one_call_equals_one_run_per_job(monkeypatch):
    seen = _jobs(monkeypatch)
    assert seen and any(len(jobs) > 1 for _, jobs, _, _ in seen)
    for rt, jobs, prt, prepared in seen:
        rows = D.run_variants(rt, jobs)
        assert np.array_equal(rows, D.run_prepared(prt, prepared))
        assert np.array_equal(rows, D.run_prepared(D.prepare(rt=rt), [
            (D.prepare(dm=dm), D.prepare(hw=hw), D.prepare(cols=cols)) for dm, hw, cols in jobs]))
        assert rows.shape == (sum(len(c["batch"]) for _, _, c in jobs), 13)
        want = []
        for dm, hw, cols in jobs:
            r = D.run(dm, hw, rt, cols)
            want.append(np.column_stack([r["step_mean"], r["by_resource"], r["accepted"], np.zeros(len(r["accepted"])),
                                         r["hit_rate"], np.zeros(len(r["accepted"]))]))
        assert np.array_equal(rows, np.vstack(want))


def test_errors_name_the_entry_point(monkeypatch):
    rt, jobs, prt, prepared = _jobs(monkeypatch)[0]
    dm, hw, cols = jobs[0]
    bad = dict(hw, gpu_bw=0.0)
    with pytest.raises(KernelError, match="ms_decode_many"):
        D.run_variants(rt, [jobs[0], (dm, bad, cols)])
    with pytest.raises(KernelError, match="ms_decode_many"):
        D.run_prepared(prt, [prepared[0], (prepared[0][0], D.prepare(hw=bad), prepared[0][2])])
    assert D.run_variants(rt, []).shape == (0, 13)
    assert D.run_prepared(prt, []).shape == (0, 13)


def test_prepared_checks_the_tables(monkeypatch):
    """prepare checks each table as run_variants does (glue.StructError names the struct and field), and
    run_prepared refuses analytic table columns of another routing's layer count."""
    from moesim.engine.glue import StructError
    rt, jobs, prt, prepared = _jobs(monkeypatch)[0]
    dm, hw, cols = jobs[0]
    with pytest.raises(StructError, match="gpu_bw"):
        D.prepare(hw={k: v for k, v in hw.items() if k != "gpu_bw"})
    with pytest.raises(StructError, match="attn_bytes"):
        D.prepare(dm={k: v for k, v in dm.items() if k != "attn_bytes"})
    with pytest.raises(StructError, match=r"ms_decode_config_t\[\]"):
        D.prepare(cols=dict(cols, batch=np.zeros(len(cols["batch"]) + 1, dtype=np.int32)))
    with pytest.raises(moesim.MoesimError):
        D.prepare(dm=dm, hw=hw)
    tabled = next((c for _, _, c in (j for _, js, _, _ in _jobs(monkeypatch) for j in js)
                   if c.get("che") is not None), None)
    if tabled is not None:
        short = dict(tabled, che=np.ascontiguousarray(tabled["che"][:, :-1]))
        with pytest.raises(StructError, match="layers"):
            D.run_prepared(prt, [(prepared[0][0], prepared[0][1], D.prepare(cols=short))])
