"""Random streams against known answers from the published reference code (tests/data/rng_known_answers.json).

The vectors were produced by a standalone C program holding Blackman & Vigna's splitmix64.c and
xoshiro256starstar.c (prng.di.unimi.it); the file records how. The kernel (csrc/ms_rng.c) and its Python twin
(engine/reference/rng.py) must both reproduce them. The (seed, a, b) stream seeding of ms_rng_init is
moesim's own; it is checked against a recomputation here from a splitmix64 that first passes the vectors.
"""
import json
import pathlib

import numpy as np
import pytest

from moesim.engine import _kernel as K
from moesim.engine.reference.rng import Rng

DATA = json.loads((pathlib.Path(__file__).parent / "data" / "rng_known_answers.json").read_text())
M64 = (1 << 64) - 1


def _ints(words):
    return [int(w) for w in words]


def _raw_twin(state):
    """A twin Rng set to a raw 4-word state (the constructor's seeding then overwritten)."""
    r = Rng(0, 0, 0)
    r.s = list(state)
    return r


class RefSplitMix64:
    """splitmix64 written here from the reference's description, independent of both implementations."""

    def __init__(self, seed):
        self.x = seed & M64

    def next(self):
        self.x = (self.x + 0x9E3779B97F4A7C15) & M64
        z = self.x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


def test_file_records_its_provenance():
    prov = DATA["produced_by"]
    assert prov["splitmix64"]["source"] == "https://prng.di.unimi.it/splitmix64.c"
    assert prov["xoshiro256starstar"]["source"] == "https://prng.di.unimi.it/xoshiro256starstar.c"
    assert "generator_c" in DATA and "rotl(s[1] * 5, 7) * 9" in DATA["generator_c"]
    assert len(DATA["splitmix64"]) >= 4 and len(DATA["xoshiro256starstar"]) >= 3


def test_published_splitmix64_value_is_in_the_file():
    # the widely published test vector: splitmix64 seeded with 1234567
    pub = DATA["published_values"][0]
    assert pub["outputs"][0] == "6457827717110365317"
    gen = {e["seed"]: e["outputs"] for e in DATA["splitmix64"]}
    assert gen["1234567"][:5] == pub["outputs"]


@pytest.mark.parametrize("vec", DATA["splitmix64"], ids=lambda v: "seed=" + v["seed"])
def test_splitmix64_kernel_and_twin(vec):
    seed, want = int(vec["seed"]), _ints(vec["outputs"])
    assert [int(v) for v in K.splitmix64_outputs(seed, len(want))] == want
    x, got = seed, []
    for _ in want:
        x, z = Rng._sm(x)
        got.append(z)
    assert got == want
    ref = RefSplitMix64(seed)
    assert [ref.next() for _ in want] == want


def test_kernel_published_value_directly():
    assert int(K.splitmix64_outputs(1234567, 1)[0]) == 6457827717110365317


@pytest.mark.parametrize("vec", DATA["xoshiro256starstar"] + DATA["xoshiro256starstar_seeded_by_splitmix64"],
                         ids=lambda v: "state=" + "_".join(w[:6] for w in v["state"]))
def test_xoshiro256starstar_kernel_and_twin(vec):
    state, want = _ints(vec["state"]), _ints(vec["outputs"])
    assert [int(v) for v in K.rng_outputs(state, len(want))] == want
    twin = _raw_twin(state)
    assert [twin.next() for _ in want] == want


@pytest.mark.parametrize("vec", DATA["xoshiro256starstar_seeded_by_splitmix64"], ids=lambda v: v["splitmix64_seed"])
def test_seeded_states_follow_the_recommended_seeding(vec):
    ref = RefSplitMix64(int(vec["splitmix64_seed"]))
    assert [ref.next() for _ in range(4)] == _ints(vec["state"])


def _stream_state(seed, a, b):
    """ms_rng_init's documented scheme, recomputed from the reference splitmix64:
    x = seed; x = next(x) ^ a; x = next(x) ^ b; state = the next four outputs from x."""
    x = RefSplitMix64(seed).next() ^ (a & M64)
    x = RefSplitMix64(x).next() ^ (b & M64)
    sm = RefSplitMix64(x)
    return [sm.next() for _ in range(4)]


STREAMS = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (42, 7, 3), (1234567, 2**40 + 5, 99),
           (M64, M64, M64), (2**63, 123456789, 2**63 - 1)]


@pytest.mark.parametrize("seed,a,b", STREAMS)
def test_stream_seeding_independent_recomputation(seed, a, b):
    state = _stream_state(seed, a, b)
    n = 12
    want = [int(v) for v in K.rng_outputs(state, n)]  # the kernel's xoshiro passed the vectors above
    raw, uni = K.rng_stream(seed, a, b, n)
    assert [int(v) for v in raw] == want
    twin = Rng(seed, a, b)
    assert twin.s == state
    assert [twin.next() for _ in range(n)] == want
    # uniforms: 53 high bits, offset by half a step, strictly inside (0, 1)
    exp_u = np.array([((w >> 11) + 0.5) / 2.0 ** 53 for w in want])
    assert np.array_equal(uni, exp_u)
    assert np.all((uni > 0) & (uni < 1))
    t2 = Rng(seed, a, b)
    assert [t2.uniform() for _ in range(n)] == list(exp_u)


def test_streams_differ_by_each_name_component():
    firsts = {tuple(int(v) for v in K.rng_stream(s, a, b, 4)[0]) for s, a, b in STREAMS}
    assert len(firsts) == len(STREAMS)
