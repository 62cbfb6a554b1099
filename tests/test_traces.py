"""Reading the four real routing-trace formats (skips without ../shared/traces) and malformed input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moesim import MoesimError
from moesim.ingest.traces import load

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
need_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")


@need_traces
@pytest.mark.parametrize("name, experts, k, n_layers", [
    ("olmoe-1b-7b_gsm8k_layer0.jsonl", 64, 8, 1),
    ("mixtral-8x7b_humaneval.jsonl", 8, 2, 32),
    ("deepseek-v2-lite", 64, 6, 26),
    ("gpt-oss-20b", 32, 4, 24),
])
def test_real_traces_canonical(name, experts, k, n_layers):
    t = load(TRACES / name)
    assert t.top_k == k and len(t.layers) == n_layers
    assert t.n_experts <= experts or name.startswith("olmoe")
    for r in t.requests:
        assert r.dtype == np.int32 and r.shape[1:] == (n_layers, k)
        assert r.min() >= 0 and r.max() < experts
        # top-k picks distinct experts in every (token, layer)
        s = np.sort(r, axis=2)
        assert (np.diff(s, axis=2) > 0).all()
    assert t.n_tokens > 100


@need_traces
def test_olmoe_profiling_rows_dropped():
    t = load(TRACES / "olmoe-1b-7b_gsm8k_layer0.jsonl")
    first = t.requests[0][0, 0]
    assert sorted(first.tolist()) != list(range(8))  # the uniform-weight profiling rows are gone


def test_malformed(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"type": "route", "token_idx": 0, "layer": 0}\n')
    with pytest.raises(MoesimError, match="x.jsonl"):
        load(bad)
    bad.write_text("not json\n")
    with pytest.raises(MoesimError, match="not JSON"):
        load(bad)
    csvf = tmp_path / "p.csv"
    csvf.write_text("a,b\n1,2\n")
    with pytest.raises(MoesimError, match="moe-beyond"):
        load(csvf)
    js = tmp_path / "g.json"
    js.write_text(json.dumps({"router_data": [{"token_0": {"layer_0": {"selected_experts": [-1, 2]}}}]}))
    with pytest.raises(MoesimError, match="non-negative"):
        load(js)
    with pytest.raises(MoesimError, match="no such trace"):
        load(tmp_path / "missing.jsonl")
