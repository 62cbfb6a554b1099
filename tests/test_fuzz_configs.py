"""Fuzzing config.json with counts: real configs with one to three fields set to hostile values (negative,
huge, NaN, wrong types) give a model whose fit is finite and non-negative, or a MoesimError naming a
field; never a bare built-in exception, a kernel error or a hang. The number of mutants comes from
conftest.fuzz_count (--long, MOESIM_FUZZ_COUNT)."""
from __future__ import annotations

import json
import math
import random

import pytest

import moesim
from conftest import bounded, fuzz_count, rewrite
from moesim import MoesimError
from test_ingest import REAL_CONFIGS

HOSTILE = [-1, -1000, 0, 1, 7, 3.5, 2**31, 2**40, 2**63, 10**6, 1e300, float("nan"), float("inf"), "x", None, [], {},
           True]


@pytest.mark.fuzz
def test_mutated_configs_give_a_sane_fit_or_a_named_error(tmp_path, tally):
    rng = random.Random("configs")
    count = fuzz_count(100, 3_000)
    for _ in range(count):
        mid = rng.choice(sorted(REAL_CONFIGS))
        cfg = json.loads(json.dumps(REAL_CONFIGS[mid]))
        keys = sorted(k for k, v in cfg.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        muts = []
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(keys)
            cfg[k] = rng.choice(HOSTILE)
            muts.append((k, cfg[k]))
        rewrite(tmp_path / "config.json", json.dumps(cfg))
        with bounded(20, (mid, muts)):
            try:
                m = moesim.Model.from_hf_config(tmp_path)
                rec = moesim.fit(m, "desktop-4090", quants=["Q4_K_M"])[0]
            except MoesimError as exc:
                assert exc.field, (mid, muts, exc)
                tally.refuse()
                continue
        for v in (rec["weights_bytes"], rec["kv_bytes_per_token"], rec["decode_tok_s"] or 1.0):
            assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (mid, muts, rec)
        assert rec["weights_bytes"] > 0, (mid, muts)
        tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count
