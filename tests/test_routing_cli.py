"""``moesim routing stats|fit`` on the synthetic step-list fixture, and the public sampler
``moesim.routing.sample``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moesim import MoesimError
from moesim import routing as MR
from moesim.cli import main
from moesim.ingest import model as get_model

DUMP = Path(__file__).resolve().parent / "data" / "steplist_router_dump.json"


def test_routing_stats_reports_prompt_and_decode_apart(capsys):
    assert main(["routing", "stats", str(DUMP), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["phase"] == "decode"
    assert out["decode"]["tokens"] == 5 and out["prompt"]["tokens"] == 3
    assert out["decode"]["layers"] == 2 and out["decode"]["top_k"] == 2
    # layer 1 picks of the decode steps: [3,1] [7,3] [2,6] [0,5] [0,2]: lag-1 overlaps 1, 0, 0, 1 of 2 each
    assert out["decode"]["per_layer"]["reuse_lag1"][0] == pytest.approx(2 / 8, abs=1e-4)
    assert main(["routing", "stats", str(DUMP)]) == 0
    text = capsys.readouterr().out
    assert "decode: 1 requests, 5 tokens" in text and "prompt: 1 requests, 3 tokens" in text


def test_routing_fit_fits_each_workload_and_the_pool(tmp_path, capsys):
    rng = np.random.default_rng(0)
    paths = []
    for w in range(2):
        steps = [{"0": [rng.choice(8, 2, replace=False).tolist() for _ in range(4)], "1": None,
                  "2": [rng.choice(8, 2, replace=False).tolist() for _ in range(4)]}]
        steps += [{"0": [rng.choice(8, 2, replace=False).tolist()], "1": None,
                   "2": [rng.choice(8, 2, replace=False).tolist()]} for _ in range(40)]
        paths.append(tmp_path / f"w{w}.json")
        paths[-1].write_text(json.dumps(steps))
    assert main(["routing", "fit", *map(str, paths), "--iterations", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["workloads"]) == 2 and "pooled" in out
    prof = out["pooled"]["profile"]
    assert len(prof["layer_stickiness_fit"]) == 2 and prof["history"] >= 1
    assert MR.profile(MR.RoutingProfile(id="x", zipf_s=0.3, jitter=0.0, concentration=1.0, stickiness=0.0,
                                        first_stickiness=0.0, last_stickiness=0.0, request_tokens=0, recall=0.8),
                      **{k: tuple(v) if isinstance(v, list) else v for k, v in prof.items()})
    for key in ("reuse_lag1", "gini"):
        s = out["spread"][key]
        assert s["min"] <= s["max"] and s["relative"] >= 0


def test_routing_without_an_action_is_an_input_error(capsys):
    assert main(["routing"]) == 2
    assert "routing stats" in capsys.readouterr().err


def test_public_sampler_shapes_and_reproducibility():
    m = get_model("gpt-oss-20b")
    reqs = MR.sample("gpt-oss-20b", lengths=[5, 17], seed=3)
    assert [r.shape for r in reqs] == [(5, len(m.moe_layers), 4), (17, len(m.moe_layers), 4)]
    assert all(r.dtype == np.int32 for r in reqs)
    again = MR.sample("gpt-oss-20b", lengths=[17], seed=3)
    assert np.array_equal(again[0][:5], reqs[0])   # request 0 is stream (seed, 0), whatever the lengths
    assert np.array_equal(MR.sample("gpt-oss-20b", lengths=[5], seed=3)[0], reqs[0])
    assert not np.array_equal(MR.sample("gpt-oss-20b", lengths=[5], seed=4)[0], reqs[0])
    assert (np.diff(np.sort(reqs[1], axis=2), axis=2) > 0).all()


@pytest.mark.parametrize("kw,field", [(dict(lengths=[]), "lengths"), (dict(lengths=[0]), "lengths"),
                                      (dict(lengths=5), "lengths"), (dict(seed=-1), "seed"),
                                      (dict(profile="nope"), "routing")])
def test_public_sampler_bad_input_names_the_field(kw, field):
    with pytest.raises(MoesimError) as exc:
        MR.sample("gpt-oss-20b", **kw)
    assert exc.value.field == field
