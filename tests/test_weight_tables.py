"""The vectorised weight tables equal the plain walk over every tensor they replace.

spec.gguf_types.gguf_type_index walks only the tensors whose type depends on llama.cpp's counters or
their layer and gives the rest their (role, shape)'s type; spec.quants.weight_table and the lowering
sum bytes with numpy. Each is held here against the straightforward per-tensor loop it replaced (one
walk over every tensor in file order; Python sums per class, layer and type), value for value."""
from __future__ import annotations

import math

import numpy as np
import pytest

import moesim
from moesim.engine.lower.memory import lower
from moesim.spec import gguf_types as GT
from moesim.spec import quants as Q
from moesim.spec.models import model_ids

# a spread of architectures: GQA and MLA, dense and MoE, shared experts, MTP modules, tied embeddings,
# hybrid linear attention, 8 experts (llama.cpp's special cases), sliding windows
SAMPLE = ["deepseek-r1", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b", "glm-4.5-air", "llama-3.1-70b",
          "qwen3-next-80b-a3b", "kimi-k2", "gemma-2-2b", "granite-4.0-h-tiny", "deepseek-v4-flash", "glm-4.5"]


def _sample_models() -> list:
    ids = set(model_ids())
    return [m for m in SAMPLE if m in ids] or sorted(ids)[:6]


def _plain_walk(model, ftype: str, base: str, types: dict, include_mtp: bool, native=None) -> list:
    """llama.cpp's walk as one loop over every tensor in file order (the algorithm gguf_type_index
    shortcuts): counters advance on each quantized tensor in turn; routed experts stored in a ggml type
    by the checkpoint (*native*) keep it."""
    tensors = model.tensors(include_mtp)
    plan = GT._WalkPlan(model, include_mtp)
    s = GT._GGUFState(model, plan, types)
    mixture = types[base]["block"] > 1
    out = []
    for t in tensors:
        quantizable = GT._quantizable(t)
        if not quantizable or not mixture:
            typ = base if quantizable else "F32"
        else:
            typ = GT._gguf_type(ftype, base, t, s, types)
        if native is not None and quantizable and t.cls == "routed_experts":
            typ = native
        info = types[typ]
        out.append((t, typ, math.prod(t.shape) // info["block"] * info["bytes"]))
    return out


@pytest.mark.parametrize("mid", _sample_models())
def test_gguf_types_equal_the_walk_over_every_tensor(mid):
    m = moesim.model(mid)
    types, ftypes = Q.ggml_types(), Q._tables()["ftypes"]
    native = Q.native_expert_type(m)
    for ftype in sorted(ftypes):
        for include_mtp in (False, True):
            want = _plain_walk(m, ftype, ftypes[ftype]["base"], types, include_mtp, native)
            got = GT.gguf_assign(m, ftype, ftypes[ftype]["base"], types, include_mtp, native)
            assert [(t.name, typ, nb) for t, typ, nb in got] == [(t.name, typ, nb) for t, typ, nb in want], ftype


def _plain_lowering(m, q) -> tuple:
    """Per-layer and per-class bytes summed tensor by tensor (the lowering's former loop)."""
    n = m.n_layers
    per = {k: np.zeros(n) for k in ("attention", "router", "shared_experts", "routed_experts", "dense_ffn")}
    by_class = {c: 0.0 for c in Q.WEIGHT_CLASS_NAMES}
    by_class_type: dict = {}
    for t, typ, nb in Q.assign(m, q, include_mtp=True):
        by_class[t.cls] += nb
        if t.cls in per:
            per[t.cls][t.layer] += nb
    for t, typ, nb in Q.assign(m, q):
        by_class_type[(t.cls, typ)] = by_class_type.get((t.cls, typ), 0.0) + nb
    return per, by_class, by_class_type


@pytest.mark.parametrize("mid", _sample_models())
def test_lowered_bytes_equal_the_loop_over_tensors(mid):
    m = moesim.model(mid)
    for qname in Q.ftype_ids()[::3] + ["Q4_K_M"] + Q.format_ids()[:4]:
        try:
            q = Q.resolve(qname, m)
            low = lower(m, q)
        except moesim.MoesimError:
            continue
        per, by_class, by_class_type = _plain_lowering(m, q)
        for k, arr in (("attention", low.attn), ("router", low.router), ("shared_experts", low.shared),
                       ("dense_ffn", low.dense)):
            assert arr.tolist() == per[k].tolist(), (qname, k)
        assert low.expert_one.tolist() == np.divide(per["routed_experts"], np.maximum(low.n_experts, 1)).tolist()
        assert low.weights_by_class == {c: v for c, v in by_class.items() if c != "mtp"}
        assert low.mtp == by_class["mtp"] and low.embed == by_class["embeddings"] and low.head == by_class["lm_head"]
        wt = Q.weight_table(m, q)
        pair = wt.cls * len(wt.types) + wt.type_of
        seen = [(Q.WEIGHT_CLASS_NAMES[p // len(wt.types)], wt.types[p % len(wt.types)])
                for p in dict.fromkeys(pair.tolist())]
        assert seen == list(by_class_type), qname      # first-seen order, as kernel_mix's shares add them
        sums = np.bincount(pair, weights=wt.nbytes)
        assert [float(sums[p]) for p in dict.fromkeys(pair.tolist())] == list(by_class_type.values())


def test_tensors_without_mtp_are_the_full_list_less_the_mtp_modules():
    for mid in _sample_models():
        m = moesim.model(mid)
        full = m.tensors(include_mtp=True)
        assert m.tensors(include_mtp=False) == [t for t in full if t.cls != "mtp"]
        assert m._tensors(False) == m.tensors(include_mtp=False)
