"""Fuzzing the trace readers with counts: every mutated file gives a valid Trace or a MoesimError
naming the trace, never a bare built-in exception or a crash. The number of mutants per format comes
from conftest.fuzz_count (--long, MOESIM_FUZZ_COUNT)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from conftest import bounded, fuzz_count, mutate_bytes, rewrite
from moesim import MoesimError
from moesim.ingest import traces as T

COUNT = {".jsonl": (1500, 100_000), ".csv": (1500, 100_000), ".json": (1500, 100_000)}


def _jsonl() -> bytes:
    rows = [{"type": "meta", "num_experts": 8}]
    for tok in range(3):
        for layer in range(2):
            rows.append({"type": "route", "req_id": "r0", "token_idx": tok, "layer": layer, "topk_ids": [tok % 8, 7]})
            rows.append({"problem_id": 1, "layer": layer, "experts": [1, 2], "token_idx": tok})
    return "\n".join(json.dumps(r) for r in rows[:1] + rows[1::2]).encode()


def _csv() -> bytes:
    lines = ["Layer ID,Batch Number,Token,Activated Expert IDs"]
    for layer in range(2):
        for tok in range(3):
            lines.append(f'{layer},0,{tok},"[{tok}, {(tok + 3) % 6}]"')
    return ("\n".join(lines) + "\n").encode()


def _gptoss() -> bytes:
    rd = [{f"token_{t}": {f"layer_{l}": {"selected_experts": [t, l + 4]} for l in range(2)}} for t in range(3)]
    return json.dumps({"router_data": rd}).encode()


SEEDS = {".jsonl": _jsonl, ".csv": _csv, ".json": _gptoss}
def _check_valid(tr: T.Trace):
    assert tr.requests and 1 <= tr.top_k <= T._MAX_TOP_K and 1 <= tr.n_experts <= T._MAX_EXPERTS
    for r in tr.requests:
        assert r.dtype == np.int32 and r.ndim == 3 and r.shape[1] == len(tr.layers) and r.shape[2] == tr.top_k
        assert r.min() >= 0 and r.max() < tr.n_experts


@pytest.mark.parametrize("ext", sorted(SEEDS))
def test_seed_files_load(tmp_path, ext):
    p = tmp_path / f"seed{ext}"
    p.write_bytes(SEEDS[ext]())
    _check_valid(T.load(p))


@pytest.mark.fuzz
@pytest.mark.parametrize("ext", sorted(SEEDS))
def test_mutated_trace_files_never_escape_as_builtin_errors(tmp_path, ext, tally):
    rng = random.Random(f"traces{ext}")
    seed = SEEDS[ext]()
    count = fuzz_count(*COUNT[ext])
    p = tmp_path / f"mutant{ext}"
    for i in range(count):
        rewrite(p, mutate_bytes(seed, rng))
        with bounded(10, f"{ext} mutant {i}"):
            try:
                tr = T.load(p)
            except MoesimError as exc:
                assert exc.field == "trace" and str(p) in str(exc)
                tally.refuse()
                continue
        _check_valid(tr)
        tally.ok()
    assert tally.refused > 0 and tally.inputs == count


@pytest.mark.parametrize("field", ["token_idx", "layer"])
def test_infinite_token_or_layer_is_refused(tmp_path, field):
    """Regression (found by the --long run): 1e400 parses as inf, and int(inf) escaped as OverflowError."""
    p = tmp_path / "t.jsonl"
    p.write_text(_jsonl().decode().replace(f'"{field}": 1', f'"{field}": 1e400', 1))
    with pytest.raises(MoesimError, match="lacks integer") as ei:
        T.load(p)
    assert ei.value.field == "trace"
