"""The analytic table (ms_che_table, engine.decode.che_table; issue 19): each routing layer's step counts
and GPU hit rate (Che's for LRU). The C equals its pure-Python twin on random routings, a configuration
that reads the table gives exactly what the kernel counting and solving Che itself gives (C and twin), bad input is refused with error codes / MoesimError, and a sweep
that memoises the tables across prefetch recalls and machines equals simulate. (Against Monte Carlo:
tests/test_sweep_cache_mc.py and test_routing_window.py hold the values the table holds.)"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moesim
from moesim import MoesimError
from moesim.engine import _kernel, codes, decode as KD
from moesim.engine.glue import StructError
from moesim.engine.lower import routing as LRT
from moesim.errors import KernelError
from moesim.spec import routing as R

from test_decode import RESULT_ARRAYS, RESULT_SCALARS, cols, decode_case, synthetic


def _routing(memory: bool, E=16, L=3, k=2, seed=3, scenarios=3):
    prof = R.profile("generic", zipf_s=0.8, concentration=1.0, request_tokens=50)
    if memory:
        prof = R.profile("generic", layer_recency=(0.5,), layer_coupling=(0.6,), recency_decay=0.9, history=8)
    return LRT.lower(LRT.RoutingDims(L, E, k), prof, seed, scenarios=scenarios)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(decode_case(1), st.integers(1, 40), st.integers(1, 3), st.integers(0, 30))
def test_table_kernel_equals_twin(case, batch, tps, slots):
    """ms_che_table == the twin's che_table on random routings (token memory or not, 1-3 scenarios, every
    analytic policy)."""
    _, _, rt, c0 = case
    policy = int(c0["policy"][0])
    b = np.array([batch, 1, batch + 3])
    c = KD.che_table(rt, b, tps, slots, policy)
    p = KD.che_table(rt, b, tps, slots, policy, engine="reference")
    assert c.shape == (3, rt["n_layers"], len(codes.CHE_FIELDS))
    assert np.all(c >= 0) and np.all(c[:, :, codes.CHE_HIT] <= 1)
    np.testing.assert_allclose(c, p, rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(decode_case(1))
def test_reading_the_table_equals_solving(case):
    """The analytic kernel (and its twin) reading a che row for its layers' slot count gives exactly the
    results of counting and solving Che per configuration, on every analytic policy and expert mode; a row
    for another slot count is not read."""
    dm, hw, rt, c0 = case
    b, t, pol = int(c0["batch"][0]), int(c0["tokens_per_step"][0]), int(c0["policy"][0])
    moe = [i for i, m in enumerate(dm["expert_mode"]) if m != codes.EXP_NONE]
    s = int(dm["slots"][moe[0]])
    tab = KD.che_table(rt, [b], t, s, pol, steps=int(c0["steps"][0]), warmup=int(c0["warmup"][0]))
    solved = KD.run(dm, hw, rt, c0)
    for slot_col in (s, s + 1000):
        cc = dict(c0, che=tab, che_slots=[slot_col])
        read = KD.run(dm, hw, rt, cc)
        twin = KD.run(dm, hw, rt, cc, engine="reference")
        for key in RESULT_SCALARS + RESULT_ARRAYS:
            assert np.array_equal(read[key], solved[key]), key
            np.testing.assert_allclose(twin[key], read[key], rtol=1e-9, atol=1e-12)


def test_table_is_read_not_solved():
    """A table with other values changes the hit rate (the kernel reads it) and -1 rows are ignored."""
    rt = _routing(False)
    dm, hw = synthetic(3, 16, 2, slots=6)
    c = cols(2, mode="analytic")
    base = KD.run(dm, hw, rt, c)["hit_rate"][0]
    tab = KD.che_table(rt, [2], 1, 6)
    tab[:, :, codes.CHE_HIT] = 1.0
    ones = KD.run(dm, hw, rt, dict(c, che=tab, che_slots=[6]))["hit_rate"][0]
    off = KD.run(dm, hw, rt, dict(c, che=tab, che_slots=[-1]))["hit_rate"][0]
    assert ones == pytest.approx(1.0) and base < 0.99 and off == base


@pytest.mark.parametrize("memory", [False, True])
def test_table_matches_the_independent_and_window_solutions(memory):
    """Hit rates: rising with slots, 1 when every expert fits, 0 at no slots; pinned + free = all."""
    rt = _routing(memory)
    tabs = np.array([KD.che_table(rt, [4], 1, s)[0] for s in range(17)])
    rows = tabs[:, :, codes.CHE_HIT]
    np.testing.assert_allclose(tabs[:, :, codes.CHE_PINNED_P] + tabs[:, :, codes.CHE_FREE_P],
                               tabs[:, :, codes.CHE_D], rtol=1e-12)
    assert np.all(rows[0] == 0.0) and np.all(rows[16] == 1.0)
    assert np.all(np.diff(rows, axis=0) >= -1e-12)


@pytest.mark.parametrize("kw,match", [(dict(batches=[0]), "batch"), (dict(tokens_per_step=0), "batch"),
                                      (dict(slots=-1), "slots"), (dict(slots=2.5), "slots"),
                                      (dict(policy=codes.POLICY_BELADY), "policy"), (dict(batches=[1.5]), "integers"),
                                      (dict(steps=0), "steps"), (dict(warmup=-1), "warmup"),
                                      (dict(warmup=256), "warmup"), (dict(steps=True), "steps")])
def test_bad_arguments_raise_moesim_error(kw, match):
    args = dict(batches=[1], tokens_per_step=1, slots=4, policy=codes.POLICY_LRU, steps=256, warmup=32)
    args.update(kw)
    with pytest.raises(MoesimError, match=match):
        KD.che_table(_routing(False), args["batches"], args["tokens_per_step"], args["slots"], args["policy"],
                     steps=args["steps"], warmup=args["warmup"])


def test_dense_routing_raises():
    with pytest.raises(MoesimError, match="analytic tables"):
        KD.che_table({"n_layers": 0}, [1], 1, 4)


@pytest.mark.parametrize("batch,tps,slots,policy,code", [
    (0, 1, 4, codes.POLICY_LRU, codes.ERR_BAD_SIZE), (1, 0, 4, codes.POLICY_LRU, codes.ERR_BAD_SIZE),
    (1, 1, -1, codes.POLICY_LRU, codes.ERR_BAD_SIZE), (1, 1, 4, codes.POLICY_BELADY, codes.ERR_BAD_POLICY),
    (1, 1, 4, 99, codes.ERR_BAD_POLICY)])
def test_c_refuses_bad_arguments_with_codes(batch, tps, slots, policy, code):
    rc, bad, _ = _kernel.che_table(_routing(False), [1, batch], [1, tps], slots, policy, 256, 32)
    assert rc == code and bad == (1 if batch < 1 or tps < 1 else 0)


def test_c_refuses_malformed_windows():
    rt = dict(_routing(True))
    lq = rt["win_lq"].copy()
    lq[0, 0, :] = 0.5
    rc, _, _ = _kernel.che_table(dict(rt, win_lq=lq), [1], [1], 4, codes.POLICY_LRU, 256, 32)
    assert rc == codes.ERR_BAD_ROUTING


def test_decode_refuses_bad_tables():
    rt = _routing(False)
    dm, hw = synthetic(3, 16, 2, slots=6)
    c = cols(2, mode="analytic")
    good = KD.che_table(rt, [2], 1, 6)
    for field, value in ((codes.CHE_HIT, 1.5), (codes.CHE_D, np.nan), (codes.CHE_FREE_P, -0.1),
                         (codes.CHE_REUSE, np.inf)):
        bad = good.copy()
        bad[0, 1, field] = value
        with pytest.raises(KernelError, match="routing"):
            KD.run(dm, hw, rt, dict(c, che=bad, che_slots=[6]))
    with pytest.raises(StructError, match="layers"):
        KD.run(dm, hw, rt, dict(c, che=good[:, :2].copy(), che_slots=[6]))
    with pytest.raises(StructError, match="che"):
        KD.run(dm, hw, rt, dict(c, che=good[:, :, :3].copy(), che_slots=[6]))
    with pytest.raises(StructError, match="together"):
        KD.run(dm, hw, rt, dict(c, che=good))


def test_sweep_with_memoised_tables_equals_simulate():
    """A sweep over cache sizes x LRU x prefetch recalls x two machines (the tables shared by recalls and
    machines, the variants and whole-step paths) gives simulate(mode="analytic")'s rows."""
    from test_sweep_axes import M64, M192, SKIP, _check_against_simulate
    tab = moesim.sweep(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], placements=["offload-cache"], machines=[M64, M192],
                       cache_experts=[8, 40], policies=["lru", "static"], prefetch_recall=[0.0, 0.5],
                       contexts=[4096], batches=[1, 8], filter=SKIP, progress=False)
    assert _check_against_simulate(tab, ("cache_experts", "prefetch_recall", "policy")) == 32


def test_sweep_tabulates_each_row_once(monkeypatch, tmp_path):
    """Prefetch recalls (routing objects with equal tables) and machines share the rows: one row per (slots,
    policy, batch) in a sweep, none in a later sweep of the same routing, nor in a later process (the rows
    forgotten, the persistent lowering cache holds them); a different routing profile gets its own rows (the
    fingerprint reads the tables)."""
    from test_sweep_axes import M64, M192, SKIP
    from moesim import _lowering_cache as LC
    from moesim.analysis.sweep import che as SC, variants as SV
    monkeypatch.setenv("MOESIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MOESIM_CACHE", raising=False)
    LC.reset()
    monkeypatch.setattr(SC, "_ROWS", {})
    monkeypatch.setattr(SV, "_COLS", {})         # sealed decode columns kept for the process hold the rows too
    rows = []
    real = KD.che_table

    def counted(rt, batches, *a, **k):
        rows.extend(np.atleast_1d(batches).tolist())
        return real(rt, batches, *a, **k)

    monkeypatch.setattr(KD, "che_table", counted)
    kw = dict(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], placements=["offload-cache"], machines=[M64, M192],
              cache_experts=[8], policies=["lru"], prefetch_recall=[0.0, 0.5, 1.0], contexts=[4096],
              batches=[1, 8], filter=SKIP, progress=False)
    first = moesim.sweep(**kw).columns
    assert sorted(rows) == [1, 8]
    again = moesim.sweep(**kw).columns
    assert sorted(rows) == [1, 8]
    np.testing.assert_array_equal(first["expert_hit_rate"], again["expert_hit_rate"])
    SC._ROWS.clear()
    SV._COLS.clear()
    later = moesim.sweep(**kw).columns
    assert sorted(rows) == [1, 8]
    np.testing.assert_array_equal(first["expert_hit_rate"], later["expert_hit_rate"])
    moesim.sweep(**dict(kw, routing=["generic"]))
    assert sorted(rows) == [1, 1, 8, 8]
    monkeypatch.undo()
    LC.reset()


@pytest.mark.parametrize("memory", [False, True])
def test_sealed_routing_gives_the_same_results(memory):
    """A routing checked once (glue.seal_routing, what sweeps pass) gives the results of the plain table, its
    arrays are read-only copies, and a dense routing seals too."""
    from moesim.engine.glue import seal_routing
    rt = _routing(memory)
    sealed = seal_routing(rt)
    assert seal_routing(sealed) is sealed
    assert not sealed["q"].flags.writeable and sealed["q"] is not rt["q"]
    dm, hw = synthetic(3, 16, 2, slots=6)
    c = cols(4, mode="analytic")
    a, b = KD.run(dm, hw, rt, c), KD.run(dm, hw, sealed, c)
    for key in RESULT_SCALARS + RESULT_ARRAYS:
        assert np.array_equal(a[key], b[key]), key
    np.testing.assert_array_equal(KD.che_table(sealed, [1, 4], 1, 6), KD.che_table(rt, [1, 4], 1, 6))
    assert seal_routing({"n_layers": 0, "n_experts": 0, "top_k": 0, "n_group": 0, "topk_group": 0,
                         "concentration": 0.0, "request_tokens": 0})["n_layers"] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.just(0.0) | st.floats(1e-6, 1.0)), min_size=1, max_size=40),
       st.floats(0.0, 45.0), st.integers(1, 8))
def test_lru_chain_split_is_the_integer_crossing(pf, capacity, top_k):
    """lru_chain_hits stops Newton's method early and moves k by whole steps: its hits are those of the k found by
    searching U(k) = sum 1 - (1 - p)(1 - f)^(k-1) over the integers (U(k) <= C < U(k + 1)), written out here."""
    import math

    from moesim.engine.reference.cache_rates import full_step_hits, lru_chain_hits
    p, f = [x for x, _ in pf], [y for _, y in pf]
    D = sum(p)
    got = lru_chain_hits(p, f, capacity, top_k)
    support, reach = sum(x > 0 for x in p), sum(1.0 if y > 0 else x for x, y in zip(p, f))
    if support <= capacity or reach <= capacity:
        assert got == D
        return
    if capacity <= 0.0:
        assert got == 0.0
        return
    if D >= capacity:
        both = [x - (1 - x) * y for x, y in zip(p, f)]
        assert got == pytest.approx(full_step_hits(p, both, capacity, D, top_k), rel=1e-12, abs=1e-12)
        return

    def U(k):
        return sum(1 - (1 - x) * (1 - min(y, 1 - 1e-15)) ** (k - 1) for x, y in zip(p, f))

    lo, hi = 1, 2                 # U grows with k: the largest k with U(k) <= C by doubling, then bisection
    while U(hi) <= capacity:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if U(mid) <= capacity else (lo, mid)
    k = lo
    uk, uk1 = U(k), U(k + 1)
    g = [(1 - x) * y * (1 - min(y, 1 - 1e-15)) ** (k - 1) for x, y in zip(p, f)]
    within = sum(x - z for x, z in zip(p, g))
    exact = sum(z * y for z, y in zip(g, f))
    want = within + (min(1.0, max(0.0, (capacity - uk) / (uk1 - uk))) if uk1 > uk else 0.0) * exact
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_id_order_hits_is_lru_over_id_ordered_steps(seed):
    """Below a token's picks (ms_step_hits.c id_order_hits): each expert in two consecutive steps independently
    (P(in the first) = p, P(in both) = both), the first step's C highest-id experts resident (oldest first), the
    second served in id order by an LRU that evicts the oldest expert the step no longer needs, else the oldest
    (ms_cache.c): the mean hits of that replay are the walk's."""
    from moesim.engine.reference.window import _id_order_hits
    rng = np.random.default_rng(seed)
    E, C, n = 9, int(rng.integers(1, 4)), 20000
    p = rng.uniform(0.05, 0.5, E)
    both = p * rng.uniform(0.0, 1.0, E)
    u = rng.random((n, E))
    prev = u < p                                    # [0, both): both steps; [both, p): the first only
    cur = (u < both) | ((u >= p) & (u < 2 * p - both))
    total = 0
    for a, b in zip(prev, cur):
        cache = list(np.flatnonzero(a)[-C:])        # oldest first: the first step went in id order
        need = set(np.flatnonzero(b))
        for e in sorted(need):
            need.discard(e)
            if e in cache:
                total += 1
                cache.remove(e)
            elif len(cache) >= C:
                cache.remove(next((x for x in cache if x not in need), cache[0]))
            cache.append(e)
    assert total / n == pytest.approx(_id_order_hits(list(p), list(both), C), abs=0.015)


@pytest.mark.skipif(not _kernel.openmp_enabled(), reason="built without OpenMP: one thread runs every row")
@pytest.mark.parametrize("memory", [False, True])
def test_table_rows_are_the_same_on_any_thread_count(memory):
    """che_table and page_table run their rows on up to n_threads threads, each with its own workspace: the rows are
    bit for bit those of one thread (every analytic policy), and the first bad row is the one a serial loop met."""
    rt = _routing(memory, E=24, L=4, k=3)
    b = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55])
    for policy in (codes.POLICY_LRU, codes.POLICY_LFU, codes.POLICY_STATIC):
        one = KD.che_table(rt, b, 1, 6, policy)
        for n in (2, 3, 16):
            assert np.array_equal(KD.che_table(rt, b, 1, 6, policy, n_threads=n), one)
    one = KD.page_table(rt, b, 2, 10)
    assert np.array_equal(KD.page_table(rt, b, 2, 10, n_threads=4), one)
    for table, args in ((_kernel.che_table, (6, codes.POLICY_LFU, 256, 32)), (_kernel.page_table, (10,))):
        rc, bad, _ = table(rt, [1, 2, 0, 4, 0], [1] * 5, *args, 3)
        assert rc == codes.ERR_BAD_SIZE and bad == 2


@pytest.mark.parametrize("n", [0, -1, 2.0, True, 10**6])
def test_bad_thread_counts_raise_moesim_error(n):
    with pytest.raises(MoesimError, match="n_threads"):
        KD.che_table(_routing(False), [1], 1, 4, codes.POLICY_LRU, n_threads=n)
    with pytest.raises(MoesimError, match="n_threads"):
        KD.page_table(_routing(False), [1], 1, 4, n_threads=n)
