"""Fuzzing config.json with counts: real configs with one to three fields set to hostile values (negative,
huge, NaN, wrong types) give a model whose fit is finite and non-negative, or a MoesimError naming a
field; never a bare built-in exception, a kernel error or a hang. MOESIM_FUZZ_COUNT sets the number of
mutants (default 150 in the suite)."""
from __future__ import annotations

import json
import math
import os
import random
import signal

import pytest

import moesim
from moesim import MoesimError
from test_ingest import REAL_CONFIGS

COUNT = int(os.environ.get("MOESIM_FUZZ_COUNT", "150"))
HOSTILE = [-1, -1000, 0, 1, 7, 3.5, 2**31, 2**40, 10**6, 1e300, float("nan"), "x", None, [], {}, True]


class _Hang(Exception):
    pass


def _alarm(*_):
    raise _Hang


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM to bound each case")
def test_mutated_configs_give_a_sane_fit_or_a_named_error(tmp_path):
    rng = random.Random("configs")
    counts = {"fit": 0, "refused": 0}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for _ in range(COUNT):
            mid = rng.choice(sorted(REAL_CONFIGS))
            cfg = json.loads(json.dumps(REAL_CONFIGS[mid]))
            keys = sorted(k for k, v in cfg.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            muts = []
            for _ in range(rng.randint(1, 3)):
                k = rng.choice(keys)
                cfg[k] = rng.choice(HOSTILE)
                muts.append((k, cfg[k]))
            (tmp_path / "config.json").write_text(json.dumps(cfg))
            signal.alarm(20)
            try:
                m = moesim.Model.from_hf_config(tmp_path)
                rec = moesim.fit(m, "desktop-4090", quants=["Q4_K_M"])[0]
            except MoesimError as exc:
                assert exc.field, (mid, muts, exc)
                counts["refused"] += 1
                continue
            except _Hang:
                pytest.fail(f"{mid} with {muts} took over 20 s")
            finally:
                signal.alarm(0)
            for v in (rec["weights_bytes"], rec["kv_bytes_per_token"], rec["decode_tok_s"] or 1.0):
                assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (mid, muts, rec)
            assert rec["weights_bytes"] > 0, (mid, muts)
            counts["fit"] += 1
    finally:
        signal.signal(signal.SIGALRM, old)
    assert counts["refused"] > 0 and counts["fit"] > 0 and sum(counts.values()) == COUNT
