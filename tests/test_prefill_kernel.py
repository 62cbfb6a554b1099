"""The prefill kernel (csrc/ms_prefill.c): equal to its pure-Python twin (engine/reference/prefill.py) on random
tables, and to engine.prefill's numpy arithmetic, bit for bit, on lowered catalog models (a sweep reads the
kernel's seconds, simulate the numpy ones, and their rows must agree)."""
from __future__ import annotations

import numpy as np
import pytest

from moesim import ingest
from moesim.analysis.simulate import routing_table
from moesim.engine import _kernel, codes
from moesim.engine import prefill as PF
from moesim.engine.glue import StructError
from moesim.engine.lower import memory as LMEM
from moesim.engine.lower.decode_model import lower_model
from moesim.engine.lower.machine import lower_machine
from moesim.engine.reference import prefill as REF
from moesim.errors import KernelError
from moesim.spec import hardware, quants as Q
from moesim.spec.placement import Placement
from moesim.spec.runtimes import runtime as get_runtime


def _random_tables(rng) -> tuple:
    """(ms_prefill_model_t, ms_prefill_machine_t) as dicts of random values that reach every branch."""
    L = int(rng.choice([1, 3, 7, 8, 9, 40, 61, 129, 300]))
    S = int(rng.integers(1, 3))
    X = int(rng.integers(0, L + 1))
    kv = bool(rng.integers(0, 2))
    lay = np.sort(rng.choice(L, X, replace=False)).astype(np.int32)
    pos = lambda *shape: rng.uniform(0.5, 2.0, shape) * 10.0 ** rng.uniform(-3, 9, shape)  # noqa: E731
    p = dict(on_gpu=rng.integers(0, 2, L).astype(np.int32), weights=pos(L), flops=pos(L), score_flops=pos(L),
             decompress_flops=np.where(rng.random(L) < 0.5, 0.0, pos(L)),
             act=np.where(rng.random(L) < 0.3, 0.0, pos(L)),
             kv_one=np.where(rng.random(L) < 0.3, 0.0, pos(L)) if kv else None,
             kv_heads=rng.integers(0, 9, L).astype(np.float64) if kv else None,
             sizes=np.array([[int(rng.integers(1, 3000)), int(rng.integers(0, 5))] for _ in range(S)], dtype=np.int64),
             size_rows=rng.choice([0.0, 1.0, 4.0, 64.0], S), size_tiled=rng.integers(0, 2, S).astype(np.int32),
             exp_layer=lay, exp_mode=rng.integers(0, codes.N_EXP_MODES, X).astype(np.int32),
             exp_share=np.where(rng.random(X) < 0.3, 1.0, rng.random(X)), exp_bytes=pos(X), exp_flops=pos(X),
             exp_layer_experts=rng.integers(1, 300, X).astype(np.float64),
             exp_distinct=np.where(rng.random((S, X)) < 0.1, 0.0, pos(S, X)),
             top_k=int(rng.integers(1, 9)), threshold=int(rng.choice([0, 1, 512, 4096])),
             offload=int(rng.integers(0, 2)), head_bytes=float(pos()), head_flops=float(pos()),
             amx_per_cycle=float(rng.choice([0.0, 1024.0])))
    h = {k: float(pos()) for k in ("gpu_bw", "host_bw", "pcie_bw", "prefill_flops", "prefill_gemm_flops",
                                   "prefill_expert_flops", "cpu_flops", "prefill_attn_flops", "cpu_prefill_attn_flops",
                                   "launch_s", "cpu_layer_s", "sync_s", "amx_flops")}
    h.update(pcie_links=float(rng.integers(1, 9)), cpu_llc_bytes=float(rng.choice([0.0, 64e6, 1e12])),
             prefill_moe_half_tokens=float(rng.choice([0.0, 16.0])),
             prefill_weight_pass_tokens=float(rng.choice([0.0, 64.0, 128.0])),
             prefill_moe_tile_tokens=float(rng.choice([0.0, 64.0, 128.0])), overlap=int(rng.integers(0, 2)),
             step_s=float(rng.choice([0.0, 4e-4])),
             gpu_moe_rowwise=int(rng.integers(0, 2)))
    return p, h


@pytest.mark.parametrize("seed", range(60))
def test_kernel_equals_twin_on_random_tables(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        p, h = _random_tables(rng)
        code, got = _kernel.prefill_seconds(_kernel.PrefillModel(p), _kernel.PrefillMachine(h))
        assert code == 0
        assert got == REF.prefill_seconds(p, h)


def test_twin_sums_as_numpy():
    rng = np.random.default_rng(1)
    for n in range(1, 400):
        a = rng.standard_normal(n) * 10.0 ** rng.uniform(-5, 5, n)
        assert REF._pairwise(list(a), 0, n) == float(a.sum())


def test_bad_tables_are_refused():
    p, h = _random_tables(np.random.default_rng(3))
    machine = _kernel.PrefillMachine(h)
    if len(p["exp_layer"]):
        bad = dict(p, exp_layer=np.full(len(p["exp_layer"]), len(p["on_gpu"]), dtype=np.int32))
        assert _kernel.prefill_seconds(_kernel.PrefillModel(bad), machine)[0] == codes.ERR_BAD_SIZE
    bad = dict(p, sizes=np.array([[0, 1]] * len(p["sizes"]), dtype=np.int64))
    assert _kernel.prefill_seconds(_kernel.PrefillModel(bad), machine)[0] == codes.ERR_BAD_SIZE
    with pytest.raises(StructError):
        _kernel.PrefillModel({k: v for k, v in p.items() if k != "weights"})
    with pytest.raises(StructError):
        _kernel.PrefillModel(dict(p, weights=p["weights"][:-1]) if len(p["weights"]) > 1 else dict(p, weights=[]))


def _cases():
    cpu = dict(cpu="ryzen-9-7950x", host="ddr5-5200x2", gpus=0)
    gpu = dict(cpu="ryzen-9-7950x", gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    return [("llama-3-8b", "BF16", cpu, "llama.cpp", "cpu-only", kv) for kv in ("f16", "q8_0")] + [
        ("qwen3-30b-a3b", "Q4_K_M", gpu, rt, place, "f16") for rt in ("llama.cpp", "ik_llama.cpp", "ktransformers")
        for place in ("experts-cpu", "n-cpu-moe=20", "all-gpu", "layers-gpu=20")] + [
        ("qwen3-30b-a3b", "Q4_K_M", dict(gpu="m3-max"), "mlx", "all-gpu", "f16"),
        ("gpt-oss-20b", "MXFP4", gpu, "llama.cpp", "offload-cache=8", "f16")]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: "-".join(str(v) for v in (c[0], c[3], c[4], c[5])))
def test_kernel_equals_numpy_on_catalog_models(case):
    mid, quant, mspec, rt_id, place, kv = case
    m = ingest.model(mid)
    low = LMEM.lower(m, quant)
    mach = hardware.machine(**mspec)
    rt = get_runtime(rt_id)
    p = Placement(place)
    rtab = routing_table(m)[0] if m.n_experts else {"n_layers": 0}
    for tokens in (1, 64):
        dm = lower_model(m, low, p, mach, rt, 1, kv, tokens, routing=rtab)
        hw = lower_machine(mach, rt, p, Q.kernel_mix(m, quant))
        for prompt, depth in ((512, 0), (3000, 0), (4096, 8192)):
            x = PF.prefill_terms(m, dm, rtab, rt, prompt, depth)
            numpy_s = PF.prefill_seconds(m, dm, hw, rtab, rt, prompt, depth)
            assert PF.prefill_seconds(m, dm, hw, rtab, rt, prompt, depth, terms=x) == numpy_s
            llc = {**hw, "cpu_llc_bytes": 0.0}
            assert PF.prefill_seconds(m, dm, llc, rtab, rt, prompt, depth, terms=x) == PF.prefill_seconds(
                m, dm, llc, rtab, rt, prompt, depth)


def test_kernel_errors_raise():
    p, h = _random_tables(np.random.default_rng(5))
    p = dict(p, sizes=np.array([[0, 1]] * len(p["sizes"]), dtype=np.int64))
    with pytest.raises(KernelError, match="ms_prefill_seconds"):
        PF._kernel_seconds({"kernel": _kernel.PrefillModel(p)}, {}, h)


def test_prefill_many_equals_one_call_per_pair():
    """_kernel.prefill_many (a sweep group's prefill times in one call) gives each (model, machine) pair's
    prefill_seconds bit for bit, deep models (> 256 layers: the heap workspace) among them, and the failing pair's
    index; engine.prefill.kernel_seconds_many equals prefill_seconds(..., terms=) per item."""
    rng = np.random.default_rng(7)
    pairs = [_random_tables(rng) for _ in range(40)]
    models = [_kernel.PrefillModel(p) for p, _ in pairs]
    machines = [_kernel.PrefillMachine(h) for _, h in pairs]
    code, bad, secs = _kernel.prefill_many(models, machines)
    assert (code, bad) == (0, -1)
    want = [_kernel.prefill_seconds(p, h) for p, h in zip(models, machines)]
    assert all(c == 0 for c, _ in want) and secs == [s for _, s in want]
    assert any(p["on_gpu"].shape[0] > 256 for p, _ in pairs)
    assert _kernel.prefill_many([], []) == (0, -1, [])
    with pytest.raises(ValueError):
        _kernel.prefill_many(models, machines[:-1])
    p, _ = pairs[3]
    broken = _kernel.PrefillModel(dict(p, sizes=np.array([[0, 1]] * len(p["sizes"]), dtype=np.int64)))
    code, bad, _ = _kernel.prefill_many(models[:3] + [broken] + models[4:6], machines[:6])
    assert code != 0 and bad == 3


def test_kernel_seconds_many_equals_terms_calls():
    m = ingest.model("qwen3-30b-a3b")
    low = LMEM.lower(m, "Q4_K_M")
    rt = get_runtime("llama.cpp")
    rtab = routing_table(m)[0]
    items, want = [], []
    for gpu in ("rtx-4090", "rtx-3060"):
        mach = hardware.machine(cpu="ryzen-9-7950x", gpu=gpu, host="ddr5-6000x2", host_mem_gb=64)
        for place in ("experts-cpu", "n-cpu-moe=20"):
            pl = Placement(place)
            dm = lower_model(m, low, pl, mach, rt, 1, "f16", 1, routing=rtab)
            hw = lower_machine(mach, rt, pl, Q.kernel_mix(m, "Q4_K_M"))
            terms = PF.prefill_terms(m, dm, rtab, rt, 512)
            items.append((terms, dm, hw))
            want.append(PF.prefill_seconds(m, dm, hw, rtab, rt, 512, terms=PF.prefill_terms(m, dm, rtab, rt, 512)))
    assert PF.kernel_seconds_many(items) == want
    assert PF.kernel_seconds_many([]) == []
