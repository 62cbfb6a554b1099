"""The routing model's multi-lag memory (recency kernel) and cross-layer coupling: the C sampler equals its
pure-Python twin (engine/reference/route.py) pick for pick, the memory does what it claims, and
malformed tables are refused with the field named."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from moesim.engine import _kernel
from moesim.engine import routing as KRT
from moesim.engine.glue import handle_library_error
from moesim.engine.lower import routing as LRT
from moesim.engine.reference.route import route
from moesim.errors import MoesimError
from moesim.spec import routing as R


def memory_profile(draw, L):
    layer = st.lists(st.floats(0.0, 0.9), min_size=1, max_size=4).map(tuple)
    return R.RoutingProfile(
        id="t", zipf_s=draw(st.floats(0.0, 1.2)), jitter=0.2, concentration=draw(st.sampled_from([0.0, 0.5, 2.0])),
        stickiness=0.2, first_stickiness=0.1, last_stickiness=0.2, request_tokens=draw(st.sampled_from([0, 3, 7])),
        recall=0.8, layer_zipf_s=draw(st.sampled_from([(), (0.3, 0.9)])),
        layer_stickiness_fit=draw(st.sampled_from([(), (0.0, 0.5), (0.3,)])),
        layer_recency=draw(st.one_of(st.just(()), layer)), layer_coupling=draw(st.one_of(st.just(()), layer)), recency_decay=draw(st.floats(0.3, 1.0)),
        recency_power=draw(st.sampled_from([0.0, 1.0, 2.5])), history=draw(st.integers(1, 6)),
        n_partners=draw(st.integers(0, 3)))


@st.composite
def sampler_case(draw):
    E = draw(st.sampled_from([4, 8, 12, 16]))
    k = draw(st.integers(1, min(4, E)))
    L = draw(st.integers(1, 4))
    grouped = draw(st.booleans()) and E % 4 == 0 and E >= 8
    dims = LRT.RoutingDims(L, E, k, 4 if grouped else 0, draw(st.integers(max(1, -(-k // (E // 4))), 3)) if grouped else 0)
    rt = LRT.lower(dims, memory_profile(draw, L), draw(st.integers(0, 2**32)), window=False)
    steps = draw(st.integers(1, 14))
    cols = dict(batch=[draw(st.integers(1, 3))], tokens_per_step=[draw(st.integers(1, 2))], drafts=[0],
                accepted=[1.0], steps=[steps], warmup=[0], policy=[0], mode=[0], seed=[draw(st.integers(0, 2**40))],
                index=[draw(st.integers(0, 100))])
    return rt, cols


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sampler_case())
def test_c_sampler_equals_python_twin_with_memory(case):
    rt, cols = case
    code, picks = _kernel.route_sample(rt, cols)
    handle_library_error(code, "ms_route_sample")
    c = {k: v[0] for k, v in cols.items()}
    *_, twin = route(rt, c)
    assert np.array_equal(picks, np.array(twin, dtype=np.int32))


def _profile(**kw):
    base = dict(id="m", zipf_s=0.3, jitter=0.0, concentration=0.0, stickiness=0.0, first_stickiness=0.0,
                last_stickiness=0.0, request_tokens=0, recall=0.8)
    return R.profile(R.RoutingProfile(**base), **kw)


def _reuse_at(reqs, lag):
    num = den = 0
    for r in reqs:
        a, b = r[lag:], r[:-lag]
        num += np.sum(np.any(a[..., :, None] == b[..., None, :], axis=-1))
        den += a.size
    return num / den


def test_recency_raises_reuse_at_longer_lags_not_only_the_next_token():
    dims = LRT.RoutingDims(2, 32, 2)
    flat = KRT.sample_requests(dims, _profile(), 8, 200, 3)
    mem = KRT.sample_requests(dims, _profile(layer_recency=(0.6,), recency_decay=0.95, history=16), 8, 200, 3)
    for lag in (2, 8):
        assert _reuse_at(mem, lag) > 1.5 * _reuse_at(flat, lag)


def test_power_kernel_shape_and_what_it_does_to_reuse():
    # P(lag d) ~ decay^(d - 2) d^-power over d = 2 .. history + 1; power 0 is the geometric kernel as before
    geo = _profile(layer_recency=(0.6,), recency_decay=0.9, history=8).recency_tables(1)[1]
    assert np.allclose(geo, 0.9 ** np.arange(8) / np.sum(0.9 ** np.arange(8)))
    pw = _profile(layer_recency=(0.6,), recency_decay=1.0, recency_power=2.0, history=8).recency_tables(1)[1]
    d = np.arange(2, 10.0)
    assert np.allclose(pw, d ** -2 / np.sum(d ** -2))
    # a steeper kernel moves reuse from long lags to lag 2
    dims = LRT.RoutingDims(2, 32, 2)
    flat = KRT.sample_requests(dims, _profile(layer_recency=(0.6,), recency_decay=1.0, history=32), 8, 300, 3)
    steep = KRT.sample_requests(dims, _profile(layer_recency=(0.6,), recency_decay=1.0, recency_power=3.0, history=32),
                                8, 300, 3)
    assert _reuse_at(steep, 2) > _reuse_at(flat, 2) + 0.05
    assert _reuse_at(steep, 16) < _reuse_at(flat, 16)


def test_requests_of_their_own_lengths_are_prefixes_of_common_length_ones():
    dims = LRT.RoutingDims(3, 16, 2)
    prof = _profile(layer_recency=(0.5,), layer_coupling=(0.0, 0.6, 0.6), concentration=1.0, stickiness=0.2)
    full = KRT.sample_requests(dims, prof, 4, 50, 9)
    own = KRT.sample_requests(dims, prof, 4, [50, 1, 17, 0], 9)
    assert [len(r) for r in own] == [50, 1, 17, 0]
    assert all(np.array_equal(a[:len(b)], b) for a, b in zip(full, own))


def test_coupling_makes_the_next_layer_predictable_from_this_one():
    dims = LRT.RoutingDims(3, 32, 2)

    def recall(reqs):
        t = np.zeros((32, 32))
        for r in reqs:
            for i in range(2):
                for j in range(2):
                    np.add.at(t, (r[:, 0, i], r[:, 1, j]), 1)
        hit = tot = 0
        for r in reqs:
            pred = np.argsort(-t[r[:, 0]].sum(axis=1), axis=1)[:, :2]
            hit += np.sum(np.any(pred[:, :, None] == r[:, 1, None, :], axis=2))
            tot += pred.size
        return hit / tot

    flat = KRT.sample_requests(dims, _profile(), 8, 200, 5)
    coupled = KRT.sample_requests(dims, _profile(layer_coupling=(0.0, 0.8, 0.8), n_partners=1), 8, 200, 5)
    assert recall(coupled) > recall(flat) + 0.2


def test_without_memory_fields_the_sampler_is_unchanged():
    # the new tables are absent for a profile without them, so older seeds give the same picks
    rt = LRT.lower(LRT.RoutingDims(3, 16, 2), _profile(stickiness=0.3), 1)
    assert "recency" not in rt and "coupling" not in rt


@pytest.mark.parametrize("kw,field", [
    (dict(layer_recency=(1.5,)), "layer_recency"), (dict(layer_coupling=(-1.0,)), "layer_coupling"), (dict(layer_coupling=(1.5,)), "layer_coupling"),
    (dict(history=0), "history"), (dict(recency_decay=0.0), "recency_decay"),
    (dict(recency_power=-1.0), "recency_power"), (dict(recency_power=float("inf")), "recency_power"), (dict(n_partners=99), "n_partners"),
    (dict(layer_zipf_s=(float("nan"),)), "layer_zipf_s")])
def test_bad_memory_parameters_name_the_field(kw, field):
    with pytest.raises(MoesimError) as exc:
        _profile(**kw)
    assert exc.value.field == field


def test_glue_refuses_out_of_range_partner_ids():
    rt = LRT.lower(LRT.RoutingDims(2, 8, 2), _profile(layer_coupling=(0.5,)), 1)
    rt["partners"] = rt["partners"].copy()
    rt["partners"][0, 0, 0] = 99
    cols = dict(batch=[1], tokens_per_step=[1], drafts=[0], accepted=[1.0], steps=[4], warmup=[0], policy=[0],
                mode=[0], seed=[0], index=[0])
    with pytest.raises(MoesimError) as exc:
        _kernel.route_sample(rt, cols)
    assert exc.value.field == "ms_routing_t.partners"
