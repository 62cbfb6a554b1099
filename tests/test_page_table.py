"""The host page-cache table (ms_page_table, engine.decode.page_table; issue 19): each routing layer's
page-cache hit rate at a page-slot count (Che's approximation on the window tables, else on the step's
inclusion probabilities). The C equals its pure-Python twin on random routings, a configuration that reads
the table gives exactly what the kernel solving Che itself gives (C and twin), bad input is refused with
error codes / MoesimError, and a sweep of models paged from storage (windowed routing and not), which reads
the tables, equals simulate."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.engine import _kernel, codes, decode as KD
from moesim.engine.glue import StructError
from moesim.errors import KernelError

from test_che_table import _routing
from test_decode import RESULT_ARRAYS, RESULT_SCALARS, cols, decode_case, synthetic

PAGED_MODES = (codes.EXP_CPU, codes.EXP_SPLIT, codes.EXP_FETCH)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(decode_case(1), st.integers(1, 40), st.integers(1, 3), st.integers(0, 30))
def test_table_kernel_equals_twin(case, batch, tps, page_slots):
    """ms_page_table == the twin's page_table on random routings (token memory or not, 1-3 scenarios)."""
    _, _, rt, _ = case
    b = np.array([batch, 1, batch + 3])
    c = KD.page_table(rt, b, tps, page_slots)
    p = KD.page_table(rt, b, tps, page_slots, engine="reference")
    assert c.shape == (3, rt["n_layers"])
    assert np.all(c >= 0) and np.all(c <= 1)
    np.testing.assert_allclose(c, p, rtol=1e-9, atol=1e-12)


def _paged(dm: dict, E: int, draw_ps: int) -> tuple:
    """dm with at least one paged MoE layer (page slots < E, experts read from host memory), and the page
    slots of its first paged layer."""
    dm = dict(dm, page_slots=list(dm["page_slots"]), expert_mode=list(dm["expert_mode"]))
    paged = [i for i, l in enumerate(dm["moe_index"])
             if l >= 0 and dm["expert_mode"][i] in PAGED_MODES and dm["page_slots"][i] < E]
    if not paged:
        i = next(i for i, l in enumerate(dm["moe_index"]) if l >= 0)
        dm["expert_mode"][i] = codes.EXP_CPU
        dm["page_slots"][i] = min(draw_ps, E - 1)
        paged = [i]
    return dm, dm["page_slots"][paged[0]]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(decode_case(1), st.integers(0, 23))
def test_reading_the_table_equals_solving(case, draw_ps):
    """The analytic kernel (and its twin) reading a page table for its paged layers' page slots gives exactly
    the results of solving Che per configuration, on every analytic policy and expert mode, with or without
    a che table beside it; a table for another page-slot count is not read."""
    dm, hw, rt, c0 = case
    dm, ps = _paged(dm, rt["n_experts"], draw_ps)
    b, t, pol = int(c0["batch"][0]), int(c0["tokens_per_step"][0]), int(c0["policy"][0])
    tab = KD.page_table(rt, [b], t, ps)
    moe = [i for i, m in enumerate(dm["expert_mode"]) if m != codes.EXP_NONE]
    che = dict(che=KD.che_table(rt, [b], t, int(dm["slots"][moe[0]]), pol, steps=int(c0["steps"][0]),
                                warmup=int(c0["warmup"][0])), che_slots=[int(dm["slots"][moe[0]])])
    for extra in ({}, che):
        solved = KD.run(dm, hw, rt, dict(c0, **extra))     # (a paged layer may read nothing from host memory)
        for slot_col in (ps, ps + 1000):
            cc = dict(c0, page_hit=tab, page_hit_slots=[slot_col], **extra)
            read = KD.run(dm, hw, rt, cc)
            twin = KD.run(dm, hw, rt, cc, engine="reference")
            for key in RESULT_SCALARS + RESULT_ARRAYS:
                assert np.array_equal(read[key], solved[key]), key
                np.testing.assert_allclose(twin[key], read[key], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("memory", [False, True])
def test_table_is_read_not_solved(memory):
    """A table of ones makes every host read a page hit (nothing from storage; C and twin); -1 rows and
    other page-slot counts are ignored."""
    rt = _routing(memory)
    dm, hw = synthetic(3, 16, 2, mode=codes.EXP_CPU, page=5)
    c = cols(2, mode="analytic")
    base = KD.run(dm, hw, rt, c)
    ones = np.ones((1, 3))
    for engine in ("c", "reference"):
        read = KD.run(dm, hw, rt, dict(c, page_hit=ones, page_hit_slots=[5]), engine=engine)
        assert read["page_hit_rate"][0] == pytest.approx(1.0) and read["bytes"][0][codes.BYTES_STORAGE] == 0.0
    for slot_col in (-1, 6):
        off = KD.run(dm, hw, rt, dict(c, page_hit=ones, page_hit_slots=[slot_col]))
        assert off["page_hit_rate"][0] == base["page_hit_rate"][0] < 0.99
    assert base["bytes"][0][codes.BYTES_STORAGE] > 0


@pytest.mark.parametrize("memory", [False, True])
def test_table_rises_with_page_slots(memory):
    """Hit rates: 0 at no page slots, 1 when every expert fits, non-decreasing in between."""
    rt = _routing(memory)
    rows = np.array([KD.page_table(rt, [4], 1, s)[0] for s in range(17)])
    assert np.all(rows[0] == 0.0) and np.all(rows[16] == 1.0)
    assert np.all(np.diff(rows, axis=0) >= -1e-12)


@pytest.mark.parametrize("kw,match", [(dict(batches=[0]), "batch"), (dict(tokens_per_step=0), "batch"),
                                      (dict(page_slots=-1), "page_slots"), (dict(page_slots=2.5), "page_slots"),
                                      (dict(batches=[1.5]), "integers")])
def test_bad_arguments_raise_moesim_error(kw, match):
    args = dict(batches=[1], tokens_per_step=1, page_slots=4)
    args.update(kw)
    with pytest.raises(MoesimError, match=match):
        KD.page_table(_routing(False), args["batches"], args["tokens_per_step"], args["page_slots"])
    with pytest.raises(MoesimError, match="analytic tables"):
        KD.page_table({"n_layers": 0}, [1], 1, 4)


@pytest.mark.parametrize("batch,tps,page_slots,code", [
    (0, 1, 4, codes.ERR_BAD_SIZE), (1, 0, 4, codes.ERR_BAD_SIZE), (1, 1, -1, codes.ERR_BAD_SIZE)])
def test_c_refuses_bad_arguments_with_codes(batch, tps, page_slots, code):
    rc, bad, _ = _kernel.page_table(_routing(False), [1, batch], [1, tps], page_slots)
    assert rc == code and bad == (1 if batch < 1 or tps < 1 else 0)


def test_c_refuses_malformed_windows():
    rt = dict(_routing(True))
    lq = rt["win_lq"].copy()
    lq[0, 0, :] = 0.5
    rc, _, _ = _kernel.page_table(dict(rt, win_lq=lq), [1], [1], 4)
    assert rc == codes.ERR_BAD_ROUTING


def test_decode_refuses_bad_tables():
    rt = _routing(False)
    dm, hw = synthetic(3, 16, 2, mode=codes.EXP_CPU, page=5)
    c = cols(2, mode="analytic")
    good = KD.page_table(rt, [2], 1, 5)
    for value in (1.5, -0.1, np.nan, np.inf):
        bad = good.copy()
        bad[0, 1] = value
        with pytest.raises(KernelError, match="routing"):
            KD.run(dm, hw, rt, dict(c, page_hit=bad, page_hit_slots=[5]))
    with pytest.raises(StructError, match="layers"):
        KD.run(dm, hw, rt, dict(c, page_hit=good[:, :2].copy(), page_hit_slots=[5]))
    with pytest.raises(StructError, match="together"):
        KD.run(dm, hw, rt, dict(c, page_hit=good))


def test_sweep_reading_page_tables_equals_simulate(monkeypatch):
    """deepseek-r1 (independent picks) and gpt-oss-120b (windowed routing; its Q2_K file is 58 GiB, its experts
    staying MXFP4) at Q2_K on a 4090 + 48 GB, experts on the CPU and n-cpu-moe: both paged from storage, so the
    sweep reads page tables (checked), and every row equals simulate(mode="analytic")'s, which solves per
    configuration."""
    from moesim.analysis.sweep import che
    from test_sweep_axes import M64, MACHINES, SKIP, _check_against_simulate
    m48 = dict(M64, host_mem_gb=48, name="4090-48g")
    monkeypatch.setitem(MACHINES, m48["name"], m48)
    seen = set()
    orig = che.page_rows

    def page_rows(plan, rt, page_slots, batches, tps):
        seen.add(rt.get("win_lq") is not None)
        return orig(plan, rt, page_slots, batches, tps)

    monkeypatch.setattr(che, "page_rows", page_rows)
    che._ROWS.clear()
    n = 0
    for placement in ("experts-cpu", "n-cpu-moe=10"):
        tab = moesim.sweep(models=["deepseek-r1", "gpt-oss-120b"], quants=["Q2_K"], machines=[m48],
                           placements=[placement], contexts=[4096], batches=[1, 8], filter=SKIP, progress=False)
        n += _check_against_simulate(tab, (), placement=placement)
    assert seen == {False, True} and n == 8
