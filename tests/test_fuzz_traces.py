"""Fuzzing the trace readers with counts: every mutated file gives a valid Trace or a MoesimError
naming the trace, never a bare built-in exception or a crash. MOESIM_FUZZ_COUNT sets the number of
mutants per format (default 300 in the suite)."""
from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from moesim import MoesimError
from moesim.ingest import traces as T

COUNT = int(os.environ.get("MOESIM_FUZZ_COUNT", "300"))


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
TOKENS = [b"-1", b"1e9", b"[]", b"{}", b"null", b"\"x\"", b"99999999999", b"\xff\xfe", b",", b"\n", b"[[1,2]]",
          b"true", b"0"]


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice(TOKENS)
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 16)]
        elif op == 3:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[min(i, j):max(i, j)][:64]
        else:
            b = b[:i]
    return bytes(b)


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


@pytest.mark.parametrize("ext", sorted(SEEDS))
def test_mutated_trace_files_never_escape_as_builtin_errors(tmp_path, ext):
    rng = random.Random(f"traces{ext}")
    seed = SEEDS[ext]()
    counts = {"valid": 0, "refused": 0}
    p = tmp_path / f"mutant{ext}"
    for _ in range(COUNT):
        p.write_bytes(_mutate(seed, rng))
        try:
            tr = T.load(p)
        except MoesimError as exc:
            assert exc.field == "trace" and str(p) in str(exc)
            counts["refused"] += 1
        else:
            _check_valid(tr)
            counts["valid"] += 1
    assert counts["refused"] > 0 and sum(counts.values()) == COUNT
