"""Independent twins: the memory oracle (sums per tensor) against the C kernel, and hand-worked lowerings.

The reference twins in engine/reference transliterate the C and would share its modelling slips;
these tests check the kernel against computations that share neither its per-layer arrays nor its
code: ``reference/oracle.py`` walks the tensor inventory under the placement rules, and the hand-worked
cases below write the architecture's formulas from the catalog's published config numbers.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from moesim import MoesimError
from moesim import ingest
from moesim.engine import codes as CODES
from moesim.engine import memory as EMEM
from moesim.engine.lower import memory as LMEM
from moesim.engine.reference import oracle
from moesim.spec import hardware, models as M, quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import default_runtime, runtime as get_runtime
from moesim._catalog import load as load_catalog
from moesim._search import largest_true
from moesim.analysis import resolve as RES
from moesim.engine.lower.placement import memory_tables
from moesim.engine import prefill as PF
from moesim.engine.codes import EXP_CPU, EXP_FETCH, EXP_GPU, EXP_NONE, EXP_SPLIT
from moesim.engine.codes import SWEEP_FIXED
from moesim.engine.lower.decode_model import lower_model
from moesim.engine.lower.machine import lower_machine
from moesim.engine.lower.placement import placement_candidates
from moesim.engine.reference import sweep as SREF
from moesim.spec.placement import Placement

# ---------------------------------------------------------------------------------------- machines
_MACHINE_SPECS = {
    "desktop-4090": dict(id="desktop-4090"),
    "xeon-6454s-4090": dict(id="xeon-6454s-4090"),
    "dgx-h100": dict(id="dgx-h100"),
    "epyc-9654-cpu": dict(id="epyc-9654-cpu"),
    "mac-m3-ultra-512": dict(id="mac-studio-m3-ultra-512"),
    "dgx-spark": dict(id="dgx-spark"),
    "4090-small-host": dict(gpu="rtx-4090", gpus=1, host="ddr5-6000x2", host_mem_gb=32),
    "2x3090": dict(gpu="rtx-3090", gpus=2, host="ddr4-3200x4", host_mem_gb=128),
    "rtx3060-tiny": dict(gpu="rtx-3060", gpus=1, host="ddr4-3200x2", host_mem_gb=16),
}


@functools.lru_cache(maxsize=None)
def _machine(name):
    return hardware.machine(**_MACHINE_SPECS[name])


TIER_INDEX = {t: i for i, t in enumerate(LMEM.TIERS)}
CLASS_INDEX = {c: i for i, c in enumerate(LMEM.CLASSES)}
FITS_BITS = {"gpu": CODES.FITS_GPU, "host": CODES.FITS_HOST, "storage": CODES.FITS_STORAGE}
QUANTS = ["native", "Q4_K_M", "Q2_K", "Q8_0", "IQ2_XXS", "Q6_K", "BF16", "MXFP4_MOE", "fp8", "nvfp4", "mxfp4",
          "int4", "mlx-4bit"]
RUNTIMES = [None, "llama.cpp", "vllm", "sglang", "ktransformers", "mlx", "offload"]


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-3)


@st.composite
def placements(draw, model):
    kinds = ["all-gpu", "cpu-only", "unified", "layers-gpu"]
    if model.n_experts:
        kinds += ["experts-cpu", "n-cpu-moe", "gpu-experts", "offload-cache"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("n-cpu-moe", "layers-gpu"):
        return f"{kind}={draw(st.integers(0, model.n_layers))}"
    if kind == "gpu-experts":
        return f"{kind}={draw(st.integers(0, model.n_experts))}"
    if kind == "offload-cache":
        return draw(st.sampled_from(["offload-cache", f"offload-cache={draw(st.integers(0, model.n_experts + 3))}"]))
    return kind


@st.composite
def configurations(draw):
    mid = draw(st.sampled_from(M.model_ids()))
    m = ingest.model(mid)
    quant = draw(st.sampled_from(QUANTS))
    machine = _machine(draw(st.sampled_from(sorted(_MACHINE_SPECS))))
    place = draw(placements(m))
    context = draw(st.one_of(st.integers(1, 512), st.integers(1, m.max_context), st.sampled_from([1, m.max_context])))
    batch = draw(st.one_of(st.integers(1, 4), st.integers(1, 256)))
    kv = draw(st.sampled_from([None, "f16", "bf16", "fp8", "q8_0", "q4_0", "fp4"]))
    rt = draw(st.sampled_from(RUNTIMES))
    mtp = draw(st.integers(0, 1)) if m.mtp_layers else 0
    return mid, quant, machine, place, context, batch, kv, rt, mtp


def _setup(mid, quant, machine, place, context, batch, kv, rt, mtp):
    """Both sides' inputs exactly as engine.memory.memory builds them; None when not applicable."""
    m = ingest.model(mid)
    try:
        q = Q.resolve(quant, m)
        Q.assign(m, q)
        runtime = get_runtime(rt, model=m.id) if rt is not None else default_runtime(q, machine)
        p = parse_placement(place, m, machine)
        kv_dtype = Q.canonical_kv_dtype(kv or LMEM.default_kv_dtype(q, runtime, m))
    except MoesimError:
        return None
    low = LMEM.lower(m, q)
    cfg = LMEM.configure(m, low, machine, runtime, p, context, batch, kv_dtype, mtp)
    return m, q, runtime, p, kv_dtype, cfg


def _fits_set(bits):
    return {t for t, b in FITS_BITS.items() if bits & b}


def _near_boundary(o, cfg):
    """True when a capacity comparison is within float rounding (the verdict may then differ)."""
    near = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)  # noqa: E731
    return (near(o["gpu_per_gpu"], cfg["gpu_capacity"]) or near(o["tier"]["host"], cfg["host_capacity"])
            or near(o["tier"]["host"] - o["by_class"][("buffers", "host")], 0.0))


def _check_against_kernel(case):
    setup = _setup(*case)
    if setup is None:
        return None
    mid, quant, machine, place, context, batch, kv, rt, mtp = case
    m, q, runtime, p, kv_dtype, cfg = setup
    r = EMEM.memory(mid, machine, quant, context=context, batch=batch, kv_dtype=kv_dtype, placement=place,
                    runtime=runtime, mtp=mtp)
    o = oracle.memory(m, q, p, cfg)
    where = f"{mid} {quant} {place} ctx={context} b={batch} kv={kv_dtype} rt={runtime.id} mtp={mtp}"
    for (cls, tier), v in o["by_class"].items():
        if tier == "storage":
            continue
        got = float(r.by_class[CLASS_INDEX[cls], TIER_INDEX[tier]])
        assert _close(got, v), f"{cls}/{tier}: kernel {got!r}, oracle {v!r} ({where})"
    for tier, v in o["tier"].items():
        got = float(r.tier[TIER_INDEX[tier]])
        assert _close(got, v), f"tier {tier}: kernel {got!r}, oracle {v!r} ({where})"
    assert _close(r.weights, o["weights"]), where
    assert _close(r.kv, o["kv"]) and _close(r.state, o["state"]), where
    if not (mtp and m.mtp_layers):
        assert _close(r.kv_bytes_per_token, o["kv_bytes_per_token"]), where
    if not _near_boundary(o, cfg):
        assert _fits_set(r.fits_bits) == o["fits"], f"fits: kernel {r.fits}, oracle {sorted(o['fits'])} ({where})"
    # the kernel's largest context and batch sit on the oracle's fits boundary
    if r.max_context:
        assert oracle.memory(m, q, p, cfg, context=r.max_context)["fits"], where
        if r.max_context < m.max_context:
            assert not oracle.memory(m, q, p, cfg, context=r.max_context + 1)["fits"], where
    else:
        assert not oracle.memory(m, q, p, cfg, context=1)["fits"], where
    if r.max_batch:
        assert oracle.memory(m, q, p, cfg, batch=r.max_batch)["fits"], where
        if r.max_batch < 2**30:
            assert not oracle.memory(m, q, p, cfg, batch=r.max_batch + 1)["fits"], where
    else:
        assert not oracle.memory(m, q, p, cfg, batch=1)["fits"], where
    return o


# ------------------------------------------------------------------------------- memory oracle
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(configurations())
def test_oracle_agrees_with_kernel(case):
    assume(_check_against_kernel(case) is not None)


@pytest.mark.parametrize("place", ["all-gpu", "experts-cpu", "n-cpu-moe=10", "gpu-experts=3", "layers-gpu=7",
                                   "cpu-only", "offload-cache", "offload-cache=0"])
@pytest.mark.parametrize("mid", ["mixtral-8x7b", "deepseek-v3.2", "qwen3-next-80b-a3b", "gpt-oss-20b",
                                 "deepseek-v4-flash", "glm-4.5-air", "kimi-linear-48b-a3b", "llama-4-maverick"])
def test_oracle_agrees_on_every_placement(mid, place):
    m = ingest.model(mid)
    ran = 0
    for machine, rt in (("4090-small-host", None), ("dgx-h100", "vllm"), ("xeon-6454s-4090", "ktransformers")):
        for ctx, b, mtp in ((1, 1, 0), (4096, 3, 1), (m.max_context, 1, 1), (100_000, 64, 0)):
            ran += _check_against_kernel((mid, "Q4_K_M", _machine(machine), place, min(ctx, m.max_context), b,
                                          None, rt, mtp if m.mtp_layers else 0)) is not None
    assert ran


@pytest.mark.parametrize("mid", ["llama-3-8b", "llama-2-7b", "llama-3-70b", "gemma-3-4b"])   # gemma: a tied head
@pytest.mark.parametrize("place", ["all-gpu", "layers-gpu=0", "layers-gpu=12", "cpu-only"])
def test_oracle_agrees_dense(mid, place):
    for machine in ("desktop-4090", "rtx3060-tiny", "epyc-9654-cpu", "mac-m3-ultra-512"):
        for ctx, b in ((1, 1), (8192, 4), (ingest.model(mid).max_context, 16)):
            _check_against_kernel((mid, "Q4_K_M", _machine(machine), place, ctx, b, "q8_0", None, 0))


def test_oracle_comparison_sees_every_outcome():
    """The agreement above covers every verdict: GPU only, GPU + host, host only, weights spilled to
    storage, and configurations that do not fit."""
    verdicts = set()
    cases = [("qwen3-30b-a3b", "dgx-h100", "all-gpu", 4096, 1, "vllm"),
             ("deepseek-r1", "xeon-6454s-4090", "experts-cpu", 4096, 1, None),
             ("llama-3-8b", "epyc-9654-cpu", "cpu-only", 8192, 4, None),
             ("deepseek-r1", "4090-small-host", "experts-cpu", 4096, 1, None),
             ("kimi-k2", "rtx3060-tiny", "experts-cpu", 4096, 1, "vllm"),
             ("deepseek-r1", "desktop-4090", "all-gpu", 4096, 1, None)]
    for mid, mach, place, ctx, b, rt in cases:
        o = _check_against_kernel((mid, "Q4_K_M", _machine(mach), place, ctx, b, None, rt, 0))
        verdicts.add("+".join(sorted(o["fits"])) or "no")
    assert {"gpu", "gpu+host", "host", "no"} <= verdicts and any("storage" in v for v in verdicts), verdicts


def test_oracle_weights_are_the_tensor_sum():
    """Placement moves bytes between tiers, never creates them: all-gpu and cpu-only hold the same total."""
    m = ingest.model("qwen3-30b-a3b")
    mach = _machine("desktop-4090")
    tot = []
    for place in ("all-gpu", "cpu-only", "experts-cpu", "n-cpu-moe=20", "gpu-experts=17", "layers-gpu=9"):
        _m, q, _rt, p, _kv, cfg = _setup("qwen3-30b-a3b", "Q4_K_M", mach, place, 1, 1, None, None, 0)
        tot.append(oracle.memory(m, q, p, cfg)["weights"])
    want = sum(nb for t, _typ, nb in Q.assign(m, "Q4_K_M") if t.cls != "mtp")
    assert all(_close(t, want) for t in tot)


@pytest.mark.parametrize("mid", ["glm-4.5-air", "minimax-m2", "deepseek-v3"])
def test_kv_bytes_per_token_counts_mtp_modules(mid):
    """Found by the oracle: ms_memory.c added the MTP modules' KV to kv but not to kv_bytes_per_token."""
    mach = _machine("dgx-h100")
    m, q, _rt, p, _kv, cfg = _setup(mid, "Q4_K_M", mach, "all-gpu", 4096, 1, "bf16", "vllm", 1)
    r = EMEM.memory(mid, mach, "Q4_K_M", context=4096, kv_dtype="bf16", runtime="vllm", mtp=1)
    o = oracle.memory(m, q, p, cfg)
    # uncapped attention: the cache is exactly kv_bytes_per_token x context
    assert _close(o["kv"], o["kv_bytes_per_token"] * 4096)
    assert _close(r.kv_bytes_per_token, o["kv_bytes_per_token"])


# ------------------------------------------------------------------- automatic placement, implemented once


def _old_auto_placement(m, low, machine, rt, context, batch, kv, mtp=0):
    """The Python bisection analysis/resolve.py used before fit called the C choose(), kept as a test
    oracle (each candidate evaluated by the per-layer memory kernel, ms_memory), with choose()'s last
    resort: where the search order reaches nothing that fits (a small host), the first candidate that does."""
    if machine.unified:
        return Placement("unified")
    if machine.n_gpus == 0:
        return Placement("cpu-only")

    def fits(p):
        cfg = LMEM.configure(m, low, machine, rt, p, context, batch, kv, mtp)
        return int(EMEM.evaluate(low, cfg)["fits"][0]) != 0

    def first_fitting(order, otherwise):
        return next((p for p in order if fits(p)), otherwise)

    if rt.family == "ktransformers" and m.n_experts:
        n = largest_true(lambda k: fits(Placement("gpu-experts", k)), 0, m.n_experts)
        if n is None and not fits(Placement("experts-cpu")):
            return first_fitting([Placement("gpu-experts", k) for k in range(m.n_experts, 0, -1)],
                                 Placement("experts-cpu"))
        return Placement("gpu-experts", n) if n else Placement("experts-cpu")
    if fits(Placement("all-gpu")):
        return Placement("all-gpu")
    if not rt.llama_cpp_family:
        return Placement("all-gpu")
    L = m.n_layers
    if m.n_experts:
        n_gpu_layers = largest_true(lambda k: fits(Placement("n-cpu-moe", L - k)), 0, L)
        if n_gpu_layers is not None:
            return Placement("n-cpu-moe", L - n_gpu_layers) if n_gpu_layers < L else Placement("all-gpu")
    k = largest_true(lambda k: fits(Placement("layers-gpu", k)), 0, L)
    if k:
        return Placement("layers-gpu", k)
    if fits(Placement("cpu-only")):
        return Placement("cpu-only")
    # complete: when the search order reaches nothing that fits, the first candidate that does
    order = [Placement("n-cpu-moe", n) for n in range(1, L)] if m.n_experts else []
    order += [Placement("layers-gpu", k) for k in range(L, -1, -1)]
    order += [Placement("experts-cpu")] if m.n_experts else []
    return first_fitting(order, Placement("experts-cpu") if m.n_experts else Placement("all-gpu"))


_AUTO_MACHINES = ["desktop-4090", "4090-small-host", "rtx3060-tiny", "2x3090", "xeon-6454s-4090", "dgx-h100",
                  "epyc-9654-cpu", "dgx-spark"]
_AUTO_CONTEXTS = [1, 4096, 32768, 131072, 10**6]


def _auto_case(mid, quant, machine, runtime, context, batch, mtp):
    m = ingest.model(mid)
    q = Q.resolve(quant, m)
    rt = get_runtime(runtime, model=m.id) if runtime is not None else default_runtime(q, machine)
    kv = Q.canonical_kv_dtype(LMEM.default_kv_dtype(q, rt, m))
    low = LMEM.lower(m, q)
    return m, low, rt, kv


@pytest.mark.parametrize("mid", M.model_ids())
def test_auto_placement_identical_to_the_old_bisection(mid):
    """fit's automatic placement (the C choose()) equals the former Python bisection on every catalog
    model x machines x contexts x batches x runtimes (llama.cpp, ktransformers, vLLM) x MTP."""
    m = ingest.model(mid)
    seen = set()
    n = 0
    for mname in _AUTO_MACHINES:
        machine = _machine(mname)
        for runtime in (None, "ktransformers", "vllm"):
            for mtp in ((0, 1) if m.mtp_layers else (0,)):
                mm, low, rt, kv = _auto_case(mid, "Q4_K_M", machine, runtime, 1, 1, mtp)
                for ctx in _AUTO_CONTEXTS:
                    for b in (1, 8):
                        want = _old_auto_placement(mm, low, machine, rt, ctx, b, kv, mtp)
                        got = RES.auto_placement(mm, low, machine, rt, ctx, b, kv, mtp)
                        assert got == want, (mid, mname, rt.id, mtp, ctx, b, str(got), str(want))
                        seen.add(want.kind)
                        n += 1
    assert n >= 80 and len(seen) >= 2


@pytest.mark.parametrize("quant", ["Q2_K", "Q8_0", "BF16", "native", "IQ2_XXS"])
@pytest.mark.parametrize("mid", ["qwen3-30b-a3b", "deepseek-r1", "gpt-oss-120b", "llama-3-70b", "glm-4.5-air",
                                 "qwen3-next-80b-a3b", "deepseek-v4-flash"])
def test_auto_placement_identical_across_quants(mid, quant):
    m = ingest.model(mid)
    for mname in ("desktop-4090", "4090-small-host", "2x3090"):
        machine = _machine(mname)
        for runtime in (None, "ktransformers"):
            try:
                mm, low, rt, kv = _auto_case(mid, quant, machine, runtime, 1, 1, 0)
            except MoesimError:
                continue
            for ctx in (1, 8192, 65536, m.max_context):
                for b in (1, 3, 64):
                    want = _old_auto_placement(mm, low, machine, rt, ctx, b, kv)
                    assert RES.auto_placement(mm, low, machine, rt, ctx, b, kv) == want, (mname, rt.id, ctx, b)


def test_auto_placement_reaches_every_branch():
    """The comparison above is not vacuous: it sees all-gpu, n-cpu-moe, layers-gpu, gpu-experts,
    experts-cpu, cpu-only and unified answers."""
    kinds = set()
    cases = [("qwen3-30b-a3b", "rtx3060-tiny", None), ("deepseek-r1", "desktop-4090", None),
             ("deepseek-r1", "rtx3060-tiny", None), ("llama-3-70b", "desktop-4090", None),
             ("qwen3-30b-a3b", "desktop-4090", "ktransformers"), ("deepseek-r1", "4090-small-host", "ktransformers"),
             ("llama-3-8b", "epyc-9654-cpu", None), ("qwen3-30b-a3b", "dgx-spark", None),
             ("qwen3-30b-a3b", "desktop-4090", None), ("kimi-k2", "rtx3060-tiny", None)]
    for mid, mname, runtime in cases:
        machine = _machine(mname)
        m, low, rt, kv = _auto_case(mid, "Q4_K_M", machine, runtime, 1, 1, 0)
        for ctx in (1, 4096, 131072):
            kinds.add(RES.auto_placement(m, low, machine, rt, ctx, 1, kv).kind)
    assert {"all-gpu", "n-cpu-moe", "layers-gpu", "gpu-experts", "experts-cpu", "cpu-only", "unified"} <= kinds, kinds


def test_auto_placement_kernel_equals_python_twin_of_choose():
    """The same tables through engine/reference/sweep.py choose() (the Python twin) pick the same candidate."""
    for mid, mname, runtime, mtp in (("deepseek-r1", "desktop-4090", None, 1), ("qwen3-30b-a3b", "rtx3060-tiny", None, 0),
                                     ("glm-4.5-air", "4090-small-host", "ktransformers", 1),
                                     ("llama-3-70b", "2x3090", None, 0)):
        machine = _machine(mname)
        m, low, rt, kv = _auto_case(mid, "Q4_K_M", machine, runtime, 1, 1, mtp)
        cands, rule = placement_candidates(m, machine, rt, "auto")
        assert rule != SWEEP_FIXED
        t = memory_tables(m, low, machine, rt, kv, cands, rule, mtp=mtp)
        for ctx in (1, 2048, 40000, m.max_context):
            for b in (1, 5):
                got = RES.auto_placement(m, low, machine, rt, ctx, b, kv, mtp)
                assert cands[SREF.choose(t, ctx, b)] == got, (mid, ctx, b)


def test_auto_max_context_kernel_equals_python_twin():
    """ms_auto_max_context (fit's max_context) equals the twin's plain maximum over every candidate's own
    bisection, and it is at least the chosen placement's own limit."""
    from moesim.engine import _kernel
    for mid, mname, runtime in (("deepseek-r1", "desktop-4090", None), ("qwen3-30b-a3b", "rtx3060-tiny", None),
                                ("glm-4.5-air", "4090-small-host", "ktransformers"), ("llama-3-70b", "2x3090", None),
                                ("deepseek-coder-v2-lite", "rtx3060-tiny", None)):
        machine = _machine(mname)
        m, low, rt, kv = _auto_case(mid, "Q4_K_M", machine, runtime, 1, 1, 0)
        cands, rule = placement_candidates(m, machine, rt, "auto")
        t = memory_tables(m, low, machine, rt, kv, cands, rule)
        mem = _kernel.SweepMemory(t)
        for b in (1, 7, 64):
            code, got = _kernel.auto_max_context(mem, b)
            assert code == 0 and got == SREF.auto_max_context(t, b), (mid, mname, b)
            assert got >= max(SREF.max_context(t, SREF.choose(t, c, b), b) for c in (1, 4096)), (mid, b)


def test_auto_placement_kernel_rejects_bad_input():
    from moesim.engine import _kernel
    from moesim.errors import KernelError
    machine = _machine("desktop-4090")
    m, low, rt, kv = _auto_case("qwen3-30b-a3b", "Q4_K_M", machine, None, 1, 1, 0)
    cands, rule = placement_candidates(m, machine, rt, "auto")
    mem = _kernel.SweepMemory(memory_tables(m, low, machine, rt, kv, cands, rule))
    assert _kernel.auto_placement(mem, 0, 1)[0] == CODES.ERR_BAD_CONTEXT
    assert _kernel.auto_placement(mem, 1, 0)[0] == CODES.ERR_BAD_SIZE
    t = memory_tables(m, low, machine, rt, kv, cands, rule)
    t["i_layers_gpu"] = len(cands)                            # candidate index out of range
    code, _ = _kernel.auto_placement(_kernel.SweepMemory(t), 1, 1)
    assert code == CODES.ERR_BAD_SWEEP
    with pytest.raises(KernelError):
        RES.handle_library_error(code, "ms_auto_placement")


# ------------------------------------------------------------------- hand-worked lowerings
# Written from the architectures' formulas and the published config numbers of
# src/moesim/catalog/models.toml, not by calling the code under test. GGUF conventions (llama.cpp
# quantize): 1-D tensors (norms) and the router ffn_gate_inp stay F32; BF16 is 2 bytes per weight;
# Q8_0 is 32 weights in a 34-byte block (int8 + an fp16 scale).


BPW = {"BF16": 2.0, "Q8_0": 34.0 / 32.0}   # bytes per weight of the 2-D/3-D tensors
F32 = 4.0

# name: (hidden, layers, vocab, heads, kv heads, head dim, q/k norm, experts, top-k, FFN width)
HAND = {
    # mixtral-8x7b: hidden_size 4096, 32 layers, vocab 32000, 32 heads, 8 KV heads (head dim 4096/32),
    # 8 local experts, 2 per token, intermediate_size 14336
    "mixtral-8x7b": (4096, 32, 32000, 32, 8, 128, False, 8, 2, 14336),
    # qwen3-30b-a3b: hidden 2048, 48 layers, vocab 151936, 32 heads, 4 KV heads, head_dim 128 (q/k norms),
    # 128 experts, 8 per token, moe_intermediate_size 768
    "qwen3-30b-a3b": (2048, 48, 151936, 32, 4, 128, True, 128, 8, 768),
    # llama-3-8b (dense): hidden 4096, 32 layers, vocab 128256, 32 heads, 8 KV heads, intermediate 14336
    "llama-3-8b": (4096, 32, 128256, 32, 8, 128, False, 0, 0, 14336),
}


def hand(mid, quant):
    h, L, V, H, KV, hd, qkn, E, k, F = HAND[mid]
    bpw = BPW[quant]
    attn_w = h * (H * hd) + 2 * h * (KV * hd) + (H * hd) * h      # q, k, v, o projections
    norms = 2 * h + (2 * hd if qkn else 0)                        # attn_norm, ffn_norm (+ q_norm, k_norm)
    router = h * E
    ffn = 3 * h * F                                               # gate, up, down of one expert / the dense MLP
    return dict(
        L=L, E=E, k=k, h=h,
        attn_bytes=attn_w * bpw + norms * F32, attn_params=attn_w + norms,
        router_bytes=router * F32, router_params=router,
        expert_bytes=ffn * bpw if E else 0.0, expert_params=ffn if E else 0.0,
        dense_bytes=0.0 if E else ffn * bpw, dense_params=0 if E else ffn,
        head_bytes=h * V * bpw + h * F32, head_params=h * V + h,  # output.weight + output_norm
        embed_bytes=h * V * bpw,
        kv_elems=2 * KV * hd,                                     # K and V per token per layer
        score_per_token=4.0 * H * hd,                             # QK^T and AV, 2 FLOPs per MAC
        act_bytes=_hand_act(h, H * hd, KV * hd, qkn, E, k, F),
    )


def _hand_act(h, q, kv, qkn, E, k, F):
    """Activation bytes one prompt token's ggml ops move per layer (engine.lower.activations), restated: f32
    rows read and written, MMQ's q8_1 copy (36 bytes per 32 values) of each matmul input."""
    quant = 4.0 + 36 / 32
    attn = (8 * h + 3 * quant * h + 4 * (q + 2 * kv) + 8 * (q + kv) * (2 if qkn else 1) + 12 * kv + 8 * q
            + quant * q + 4 * h + 12 * h)
    mlp = lambda inter: 2 * quant * h + 8 * inter + 12 * inter + quant * inter + 4 * h  # noqa: E731
    ffn = 20 * h + (mlp(F) if not E else 4 * h + 4 * E + k * mlp(F) + 8 * k * h + 12 * (k - 1) * h)
    return attn + ffn


@pytest.mark.parametrize("quant", ["BF16", "Q8_0"])
@pytest.mark.parametrize("mid", list(HAND))
def test_lower_memory_by_hand(mid, quant):
    m = ingest.model(mid)
    x = hand(mid, quant)
    low = LMEM.lower(m, quant)
    assert low.n_layers == x["L"]
    np.testing.assert_array_equal(low.attn, np.full(x["L"], x["attn_bytes"]))
    np.testing.assert_array_equal(low.router, np.full(x["L"], x["router_bytes"]))
    np.testing.assert_array_equal(low.expert_one, np.full(x["L"], x["expert_bytes"]))
    np.testing.assert_array_equal(low.n_experts, np.full(x["L"], x["E"]))
    np.testing.assert_array_equal(low.dense, np.full(x["L"], x["dense_bytes"]))
    np.testing.assert_array_equal(low.shared, np.zeros(x["L"]))
    np.testing.assert_array_equal(low.kv_elems, np.full(x["L"], float(x["kv_elems"])))
    assert not low.kv_cap.any() and not low.kv_ratio.any() and not low.kv_state.any()
    assert low.head == x["head_bytes"] and low.embed == x["embed_bytes"]
    # KV bytes per token at f16: 2 bytes per element over every layer
    r = EMEM.memory(mid, _machine("dgx-h100"), quant, context=1024, batch=3, kv_dtype="f16", runtime="llama.cpp")
    assert r.kv_bytes_per_token == x["L"] * x["kv_elems"] * 2
    assert r.kv == 3 * 1024 * x["L"] * x["kv_elems"] * 2 and r.state == 0.0
    # q8_0 KV: 34 bytes per 32 elements
    r8 = EMEM.memory(mid, _machine("dgx-h100"), quant, context=1024, kv_dtype="q8_0", runtime="llama.cpp")
    assert r8.kv_bytes_per_token == x["L"] * x["kv_elems"] * 34 / 32
    want_w = x["L"] * (x["attn_bytes"] + x["router_bytes"] + x["E"] * x["expert_bytes"] + x["dense_bytes"]) \
        + x["head_bytes"] + x["embed_bytes"]
    assert r.weights == want_w


def test_hand_expert_sizes_match_published_formula():
    """The worked numbers themselves: a Mixtral expert is 3 x 4096 x 14336 weights, 352 MB in BF16."""
    assert hand("mixtral-8x7b", "BF16")["expert_bytes"] == 352_321_536
    assert hand("qwen3-30b-a3b", "BF16")["expert_bytes"] == 9_437_184
    assert hand("mixtral-8x7b", "Q8_0")["expert_bytes"] == 187_170_816
    # total parameters against the catalog's published counts (46.7B Mixtral, 30.5B Qwen3, 8.03B Llama 3)
    for mid, published in (("mixtral-8x7b", 46.7e9), ("qwen3-30b-a3b", 30.5e9), ("llama-3-8b", 8.03e9)):
        x = hand(mid, "BF16")
        total = (x["L"] * (x["attn_params"] + x["router_params"] + x["E"] * x["expert_params"] + x["dense_params"])
                 + x["head_params"] + x["embed_bytes"] / 2)
        assert abs(total / published - 1) < 0.01, (mid, total)


@pytest.mark.parametrize("mid", list(HAND))
def test_lower_model_by_hand(mid):
    m = ingest.model(mid)
    x = hand(mid, "BF16")
    low = LMEM.lower(m, "BF16")
    mach = _machine("desktop-4090")
    rt = get_runtime("llama.cpp")
    C = 4096
    places = [Placement("all-gpu"), Placement("layers-gpu", 10), Placement("cpu-only")]
    if x["E"]:
        places += [Placement("experts-cpu"), Placement("n-cpu-moe", 5), Placement("gpu-experts", 3),
                   Placement("offload-cache", 4)]
    for p in places:
        dm = lower_model(m, low, p, mach, rt, C, "f16", 1)
        L = x["L"]
        np.testing.assert_array_equal(dm["attn_bytes"], np.full(L, x["attn_bytes"] + x["router_bytes"]))
        np.testing.assert_array_equal(dm["attn_flops"], np.full(L, 2.0 * (x["attn_params"] + x["router_params"])))
        # llama.cpp's CPU flash attention (one_chunk) walks each KV head once per query head of its group
        a = m.layers[0].attention
        group = np.where(dm["attn_on_gpu"], 1.0, a.n_heads / a.n_kv_heads)
        np.testing.assert_array_equal(dm["kv_bytes"], x["kv_elems"] * 2.0 * C * group)
        np.testing.assert_array_equal(dm["score_flops"], np.full(L, x["score_per_token"] * C))
        np.testing.assert_array_equal(dm["shared_bytes"], np.full(L, x["dense_bytes"]))
        np.testing.assert_array_equal(dm["shared_flops"], np.full(L, 2.0 * x["dense_params"]))
        np.testing.assert_array_equal(dm["expert_bytes"], np.full(L, x["expert_bytes"]))
        np.testing.assert_array_equal(dm["expert_flops"], np.full(L, 2.0 * x["expert_params"]))
        assert dm["head_bytes"] == x["head_bytes"] and dm["head_flops"] == 2.0 * x["head_params"]
        cpu = p.kind == "cpu-only"
        # hidden state in f32 each way plus k expert ids and weights (8 bytes each) per token
        assert dm["act_bytes"] == (0.0 if cpu else 2 * x["h"] * 4 + 8 * max(1, x["k"]))
        on = [0 if cpu else (1 if p.kind != "layers-gpu" or l >= L - 10 else 0) for l in range(L)]
        assert list(dm["attn_on_gpu"]) == on
        assert dm["head_on_gpu"] == (0 if cpu else 1)
        want_mode = {
            "all-gpu": [EXP_GPU] * L, "cpu-only": [EXP_CPU] * L, "experts-cpu": [EXP_CPU] * L,
            "layers-gpu": [EXP_GPU if o else EXP_CPU for o in on],
            "n-cpu-moe": [EXP_CPU] * 5 + [EXP_GPU] * (L - 5), "gpu-experts": [EXP_SPLIT] * L,
            "offload-cache": [EXP_FETCH] * L}[p.kind]
        assert list(dm["expert_mode"]) == (want_mode if x["E"] else [EXP_NONE] * L), p
        if p.kind in ("gpu-experts", "offload-cache"):
            assert list(dm["slots"]) == [p.arg] * L
        assert dm["draft_bytes"] == 0.0 and dm["allreduce_bytes"] == 0.0


def test_lower_machine_by_hand():
    """desktop-4090 under llama.cpp, from the catalog's published part numbers and the runtime's
    efficiencies: RTX 4090 1008 GB/s GDDR6X and 165.2 / 660.6 TFLOPS bf16 / int8; DDR5-6000 x 2
    channels; PCIe 4.0 x16 with 23.9 GB/s measured pinned; Ryzen 9 7950X 16 cores at 4.5 GHz base, Zen 4
    (AVX-512 on two 256-bit FMA pipes)."""
    hw_cat = load_catalog("hardware")
    gpu = hw_cat["gpu"]["rtx-4090"]
    cpu = hw_cat["cpu"]["ryzen-9-7950x"]
    mach = _machine("desktop-4090")
    rt = get_runtime("llama.cpp")
    d = rt.decode
    m = ingest.model("mixtral-8x7b")
    got = lower_machine(mach, rt, Placement("all-gpu"), Q.kernel_mix(m, "BF16"))
    assert gpu["mem_bw_gbs"] == 1008.0 and gpu["tflops"]["bf16"] == 165.2 and gpu["tflops"]["int8"] == 660.6
    assert math.isclose(got["gpu_bw"], 1008e9 * d.gddr_bw_eff, rel_tol=1e-12)            # GDDR, not HBM
    assert math.isclose(got["gpu_flops"], 165.2e12 * d.gpu_flops_eff, rel_tol=1e-12)
    # llama.cpp prefills through int8 MMQ tensor-core kernels; BF16 weights: no K-quant / MXFP4 factor
    assert math.isclose(got["prefill_flops"], 660.6e12 * d.prefill_flops_eff, rel_tol=1e-12)
    ddr = 6000e6 * 8 * 2                                                                # MT/s x 8 bytes x channels
    assert math.isclose(got["host_bw"], min(ddr * d.host_bw_eff_desktop, 16 * d.core_bw_gbs * 1e9), rel_tol=1e-12)
    assert math.isclose(got["pcie_bw"], 23.9e9 * d.pcie_pageable, rel_tol=1e-12)       # pageable host buffers
    # all 16 cores busy run at the base clock; Zen 4 double-pumps AVX-512 on two 256-bit FMA pipes:
    # 2 x 8 lanes x 2 = 32 fp32 FLOPs per cycle per core
    assert cpu["cores"] == 16 and cpu["base_ghz"] == 4.5 and cpu["core"] == "zen4"
    assert math.isclose(got["cpu_flops"], 16 * 4.5e9 * 32 * d.cpu_flops_eff * d.cpu_kernel_speedup, rel_tol=1e-12)
    assert got["interconnect_bw"] == 31.5e9                                             # PCIe 4.0 x16 raw
    # 15 graph-replayed kernels per layer at AIC's 3 us each (runtimes.toml layer_kernels, kernel_us), counted in
    # cycles of the 1980 MHz reference clock: x 1980 / 2520 at the 4090's boost (kernel_ref_mhz, boost_mhz)
    assert gpu["boost_mhz"] == 2520
    assert got["launch_s"] == pytest.approx(15 * 3.0e-6 * 1980 / 2520) and got["sync_s"] == d.sync_us * 1e-6
    assert got["unified"] == 0 and got["pcie_links"] == 1 and got["allreduce_s"] == 0.0
    cpu_only = lower_machine(mach, rt, Placement("cpu-only"), Q.kernel_mix(m, "BF16"))
    assert cpu_only["gpu_bw"] == got["host_bw"] and cpu_only["gpu_flops"] == got["cpu_flops"]
    assert cpu_only["launch_s"] == 0.0


def _hand_hw():
    d = get_runtime("llama.cpp").decode
    gemm = 660.6e12 * d.prefill_flops_eff
    # the prompt's flash attention: ggml-cuda's MMA kernels at their share of the 4090's fp16 tensor rate
    # (GeForce, fp32 accumulate: 165.2 TFLOPS), where that is under the GEMM rate
    fa = load_catalog("runtimes")["backends"]["cuda"]["fa_fp16_share"]["nvidia"]
    return dict(gpu_bw=1008e9 * d.gddr_bw_eff, pcie_bw=23.9e9 * d.pcie_pageable, gemm=gemm,
                attn=min(gemm, fa * 165.2e12), launch=d.layer_kernels * d.kernel_us * 1980 / 2520 * 1e-6,
                step=d.step_us * 1e-6)    # the host's step before the prompt's first graph runs


def test_prefill_dense_by_hand():
    """llama-3-8b BF16 all on the 4090 under llama.cpp, a 512-token prompt: one 512-token ubatch reads
    every layer's weights once per 128-token tile (4 passes: [backends.cuda] weight_pass_tokens) and runs 512
    tokens of GEMMs plus attention over an average depth of 256, and of activation traffic."""
    m = ingest.model("llama-3-8b")
    x = hand("llama-3-8b", "BF16")
    mach, rt = _machine("desktop-4090"), get_runtime("llama.cpp")
    low = LMEM.lower(m, "BF16")
    p = Placement("all-gpu")
    dm = lower_model(m, low, p, mach, rt, 1, "f16", 1)
    hw = lower_machine(mach, rt, p, Q.kernel_mix(m, "BF16"))
    tok_s, ttft = PF.prefill(m, dm, hw, {"n_layers": 0}, rt, 512, 1)
    h = _hand_hw()
    per_layer_w = x["attn_bytes"] + x["router_bytes"] + x["dense_bytes"]
    per_tok = 2.0 * (x["attn_params"] + x["router_params"] + x["dense_params"]) / h["gemm"] \
        + x["score_per_token"] * 256 / h["attn"]
    t = x["L"] * (per_layer_w * 4 / h["gpu_bw"] + 512 * per_tok + 512 * x["act_bytes"] / h["gpu_bw"] + h["launch"]) \
        + x["head_bytes"] / h["gpu_bw"] + 2.0 * x["head_params"] / h["gemm"] + h["step"]
    assert math.isclose(ttft, t, rel_tol=1e-9)
    assert math.isclose(tok_s, 512 / t, rel_tol=1e-9)


@pytest.mark.parametrize("place", ["all-gpu", "experts-cpu"])
def test_prefill_moe_by_hand(place):
    """mixtral-8x7b BF16, 512-token prompt, uniform routing (each expert picked with probability k/E = 1/4
    per token): a ubatch of n tokens uses 8 (1 - (3/4)^n) distinct experts per layer. All on the GPU they
    are read once per 128-token tile of their tokens (n k / distinct / 128 + 1/2 times, the last tile half
    full; the dense weights 4 times) and multiplied for n x k token-expert pairs; in host RAM llama.cpp copies
    the used experts over PCIe (op offload, ubatch >= 32) and computes them on the GPU, copy then compute."""
    m = ingest.model("mixtral-8x7b")
    x = hand("mixtral-8x7b", "BF16")
    mach, rt = _machine("desktop-4090"), get_runtime("llama.cpp")
    low = LMEM.lower(m, "BF16")
    p = Placement(place)
    dm = lower_model(m, low, p, mach, rt, 1, "f16", 1)
    hw = lower_machine(mach, rt, p, Q.kernel_mix(m, "BF16"))
    rtab = {"n_layers": x["L"], "top_k": 2, "q": np.full((1, x["L"], 8), 0.25)}
    tok_s, ttft = PF.prefill(m, dm, hw, rtab, rt, 512, 1)
    h = _hand_hw()
    n = 512
    distinct = 8 * (1 - 0.75 ** n)
    pairs = n * 2
    per_tok = 2.0 * (x["attn_params"] + x["router_params"]) / h["gemm"] + x["score_per_token"] * 256 / h["attn"]
    dense = (x["attn_bytes"] + x["router_bytes"]) * 4 / h["gpu_bw"] + n * per_tok + n * x["act_bytes"] / h["gpu_bw"] \
        + h["launch"]
    passes = max(pairs / distinct / 128 + 0.5, 1.0)
    compute = distinct * passes * x["expert_bytes"] / h["gpu_bw"] + pairs * 2.0 * x["expert_params"] / h["gemm"]
    experts = compute if place == "all-gpu" else distinct * x["expert_bytes"] / h["pcie_bw"] + compute
    t = x["L"] * (dense + experts) + x["head_bytes"] / h["gpu_bw"] + 2.0 * x["head_params"] / h["gemm"] + h["step"]
    assert math.isclose(ttft, t, rel_tol=1e-9)
    assert math.isclose(tok_s, n / t, rel_tol=1e-9)
