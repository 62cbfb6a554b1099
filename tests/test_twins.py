"""Independent twins: the memory oracle (sums per tensor) against the C kernel, and hand-worked lowerings.

The reference twins in engine/reference transliterate the C and would share its modelling slips;
these tests check the kernel against computations that share neither its per-layer arrays nor its
code: ``reference/oracle.py`` walks the tensor inventory under the placement rules, and the hand-worked
cases below write the architecture's formulas from the catalog's published config numbers.
"""
from __future__ import annotations

import functools
import math

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
    cap = cfg["n_gpus"] * cfg["gpu_capacity"]
    near = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)  # noqa: E731
    return (near(o["tier"]["gpu"], cap) or near(o["tier"]["host"], cfg["host_capacity"])
            or near(o["tier"]["host"] - o["by_class"][("buffers", "host")], 0.0))


def _check_against_kernel(case):
    setup = _setup(*case)
    if setup is None:
        return False
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
    return True


# ------------------------------------------------------------------------------- memory oracle
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(configurations())
def test_oracle_agrees_with_kernel(case):
    assume(_check_against_kernel(case))


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
                                          None, rt, mtp if m.mtp_layers else 0))
    assert ran


@pytest.mark.parametrize("mid", ["llama-3-8b", "llama-2-7b", "llama-3-70b"])
@pytest.mark.parametrize("place", ["all-gpu", "layers-gpu=0", "layers-gpu=12", "cpu-only"])
def test_oracle_agrees_dense(mid, place):
    for machine in ("desktop-4090", "rtx3060-tiny", "epyc-9654-cpu", "mac-m3-ultra-512"):
        for ctx, b in ((1, 1), (8192, 4), (ingest.model(mid).max_context, 16)):
            _check_against_kernel((mid, "Q4_K_M", _machine(machine), place, ctx, b, "q8_0", None, 0))


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


@pytest.mark.xfail(strict=True, reason="kernel disagreement found by the oracle: ms_memory.c account() adds the MTP "
                   "modules' KV to kv (and by_class) but not to kv_bytes_per_token, so with MTP on the reported "
                   "KV bytes per token is below the actual per-token growth of the cache")
@pytest.mark.parametrize("mid", ["glm-4.5-air", "minimax-m2", "deepseek-v3"])
def test_kv_bytes_per_token_counts_mtp_modules(mid):
    mach = _machine("dgx-h100")
    m, q, _rt, p, _kv, cfg = _setup(mid, "Q4_K_M", mach, "all-gpu", 4096, 1, "bf16", "vllm", 1)
    r = EMEM.memory(mid, mach, "Q4_K_M", context=4096, kv_dtype="bf16", runtime="vllm", mtp=1)
    o = oracle.memory(m, q, p, cfg)
    # uncapped attention: the cache is exactly kv_bytes_per_token x context
    assert _close(o["kv"], o["kv_bytes_per_token"] * 4096)
    assert _close(r.kv_bytes_per_token, o["kv_bytes_per_token"])
