"""Reading the four real routing-trace formats (skips without ../shared/traces) and malformed input."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from moesim import MoesimError
from moesim.ingest.traces import load

# ../shared/traces next to the checkout; MOESIM_TRACES points elsewhere (a worktree one level deeper)
TRACES = Path(os.environ.get("MOESIM_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))
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


DATA = Path(__file__).resolve().parent / "data"


def test_steplist_router_dump_splits_prompt_and_decode():
    # tests/data/steplist_router_dump.json: 4 layers (0 and 2 dense, null), 8 experts, top-2, a 3-token
    # prompt in step 0 and 5 one-token decode steps
    t = load(DATA / "steplist_router_dump.json")
    assert t.layers == [1, 3] and t.top_k == 2 and t.phase == "decode"
    assert t.n_tokens == 5 and t.n_prompt_tokens == 3
    steps = json.loads((DATA / "steplist_router_dump.json").read_text())
    assert t.prompts[0][:, 0].tolist() == steps[0]["1"] and t.prompts[0][:, 1].tolist() == steps[0]["3"]
    assert t.requests[0][:, 1].tolist() == [s["3"][0] for s in steps[1:]]


def test_steplist_flat_decode_ids_and_directory(tmp_path):
    steps = [{"layer_0": [[1, 2], [3, 4]], "layer_1": None}, {"layer_0": [5, 6], "layer_1": None}]
    for i in range(2):
        (tmp_path / f"{i}.json").write_text(json.dumps(steps))
    t = load(tmp_path)
    assert len(t.requests) == 2 and t.requests[0].tolist() == [[[5, 6]]] and t.n_prompt_tokens == 4


@pytest.mark.parametrize("steps, msg", [
    ([], "empty step list"),
    ([{"0": None}], "routes no layer"),
    ([{"0": [[1, 2]]}, {"1": [[1, 2]]}], "step 1 routes layers"),
    ([{"0": [[1, 2]], "1": [[1, 2], [3, 4]]}], "disagree on the number of tokens"),
    ([{"x": [[1, 2]]}], "not a layer id"),
    ([{"0": "nope"}], "per-token expert lists"),
    (["step"], "must map layer ids"),
])
def test_steplist_malformed(tmp_path, steps, msg):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(steps))
    with pytest.raises(MoesimError, match=msg):
        load(f)


@need_traces
def test_formats_say_which_phase_they_hold():
    assert load(TRACES / "gpt-oss-20b").phase == "decode"
    assert load(TRACES / "deepseek-v2-lite").phase == "prompt"
