"""Memory accounting: the C kernel against the pure-Python reference, invariants, search boundaries,
and input validation."""
from __future__ import annotations

import zlib

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from moesim import MoesimError
from moesim.spec import hardware
from moesim.engine import codes as CODES
from moesim.engine.lower import memory as mem
from moesim.engine import memory as EMEM
from moesim.engine import _kernel
from moesim import ingest as models
from moesim.spec import quants
from moesim.engine.reference import memory as reference
from moesim.engine.codes import PLACEMENT_CODES

# A spread of architectures: GQA with sliding windows and sinks (gpt-oss), GDN linear attention
# (qwen3-next), DeepSeek-V4 compressed attention (ratio terms), dense MHA (llama-2), KDA + MLA
# (kimi-linear), 8-expert Mixtral, MLA + indexer (v3.2), MTP (glm-4.5-air, minimax-m2), chunked
# attention with interleaved dense layers (llama-4-maverick), local/global windows (inkling).
DIFF_MODELS = ["gpt-oss-20b", "qwen3-next-80b-a3b", "deepseek-v4-flash", "llama-2-7b", "kimi-linear-48b-a3b",
               "mixtral-8x7b", "deepseek-v3.2", "glm-4.5-air", "minimax-m2", "llama-4-maverick", "inkling"]
_MOE_QUANTS = ["Q4_K_M", "Q2_K", "Q8_0", "BF16", "MXFP4_MOE", "fp8", "nvfp4", "mxfp4", "native"]
_DENSE_QUANTS = ["Q4_K_M", "Q2_K", "Q8_0", "BF16", "fp8", "int4", "native"]
KV_ELEM_BYTES = [0.5, 0.5625, 1.0, 1.0625, 2.0, 4.0]
GRANULARITIES = [1, 16, 32, 256]
RESULT_FLOATS = ("by_class", "tier", "gpu_per_gpu", "weights", "kv", "state", "kv_bytes_per_token")
RESULT_INTS = ("fits", "max_context", "max_batch")


def quants_for(mid: str) -> list:
    return _MOE_QUANTS if models.model(mid).n_experts else _DENSE_QUANTS


@functools.lru_cache(maxsize=None)
def lowered(mid: str, quant: str):
    return mem.lower(models.model(mid), quant)


def total_weights(low) -> float:
    return float(sum(low.weights_by_class.values()) + low.mtp)


def _arg_limit(low) -> int:
    return int(max(low.n_layers, int(low.n_experts.max()))) + 4


# ------------------------------------------------------------------------------ strategies
@st.composite
def config_row(draw, low) -> dict:
    w = total_weights(low)
    n_gpus = draw(st.integers(0, 8))
    unit = st.floats(0.0, 1.6, allow_nan=False, allow_infinity=False)
    return dict(
        context=draw(st.one_of(st.integers(1, 600), st.integers(1, low.max_context),
                               st.sampled_from([1, low.max_context]))),
        batch=draw(st.one_of(st.integers(1, 8), st.integers(1, 5000))),
        kv_bytes_per_elem=draw(st.sampled_from(KV_ELEM_BYTES)),
        placement=draw(st.integers(0, 7)),
        placement_arg=draw(st.integers(0, _arg_limit(low))),
        mtp=draw(st.integers(0, 1)),
        n_gpus=n_gpus,
        gpu_capacity=draw(unit) * w / max(1, n_gpus),
        host_capacity=draw(unit) * w,
        storage_capacity=draw(st.one_of(st.just(0.0), unit.map(lambda f: f * w))),
        storage_spill=draw(st.integers(0, 1)),
        embed_on_gpu=draw(st.integers(0, 1)),
        head_copy=draw(st.one_of(st.just(0.0), st.integers(0, 2 * 10**9).map(float))),
        kv_granularity=draw(st.sampled_from(GRANULARITIES)),
        gpu_fixed=draw(st.floats(0.0, 2e9)),
        gpu_buf0=draw(st.floats(0.0, 2e9)),
        gpu_buf_ctx=draw(st.floats(0.0, 1e6)),
        host_fixed=draw(st.floats(0.0, 2e9)),
        host_buf0=draw(st.floats(0.0, 1e9)),
        host_buf_ctx=draw(st.floats(0.0, 1e6)),
        gpu_ways=draw(gpu_ways(n_gpus)),
    )


@st.composite
def gpu_ways(draw, n_gpus: int) -> list:
    """Per-class GPU split ways: 1 on one GPU, else each class split 1..N ways (routed experts possibly
    N E / (E + R), a fraction) or all N (a layer split), as engine.lower.memory.memory_split_ways builds them."""
    n = max(1, n_gpus)
    if n == 1:
        return [1.0] * CODES.N_CLASSES
    if draw(st.booleans()):
        return [float(n)] * CODES.N_CLASSES
    ways = [float(draw(st.integers(1, n))) for _ in range(CODES.N_CLASSES)]
    e, red = draw(st.integers(8, 256)), draw(st.integers(0, 32))
    ways[CODES.CLASS_ROUTED] = n * e / (e + red)
    return ways


def random_ways(n_gpus: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """gpu_ways of n configurations (numpy): each class 1..N ways, the routed experts N E / (E + R)."""
    n = np.maximum(1, n_gpus)[:, None]
    ways = np.floor(rng.random((len(n_gpus), CODES.N_CLASSES)) * n) + 1.0
    ways[:, CODES.CLASS_ROUTED] = n[:, 0] * 256 / (256 + rng.integers(0, 33, len(n_gpus)))
    return np.where(n > 1, ways, 1.0)


def to_cols(rows: list) -> dict:
    return {f: np.array([r.get(f, [1.0] * CODES.N_CLASSES) if f == "gpu_ways" else r[f] for r in rows],
                        dtype=np.int64 if f in mem.INT_CONFIG_FIELDS else np.float64)
            for f in mem.CONFIG_FIELDS}


@st.composite
def model_and_rows(draw, n_rows: int):
    mid = draw(st.sampled_from(DIFF_MODELS))
    quant = draw(st.sampled_from(quants_for(mid)))
    low = lowered(mid, quant)
    rows = [draw(config_row(low)) for _ in range(n_rows)]
    return mid, quant, low, rows


def random_cols(low, n: int, rng: np.random.Generator) -> dict:
    """n random configurations within the valid ranges (numpy, for the large batches)."""
    w = total_weights(low)
    n_gpus = rng.integers(0, 9, n)
    return dict(
        context=np.where(rng.random(n) < 0.5, rng.integers(1, 600, n), rng.integers(1, low.max_context + 1, n)),
        batch=np.where(rng.random(n) < 0.5, rng.integers(1, 9, n), rng.integers(1, 5001, n)),
        kv_bytes_per_elem=rng.choice(KV_ELEM_BYTES, n),
        placement=rng.integers(0, 8, n),
        placement_arg=rng.integers(0, _arg_limit(low) + 1, n),
        mtp=rng.integers(0, 2, n),
        n_gpus=n_gpus,
        gpu_capacity=rng.random(n) * 1.6 * w / np.maximum(1, n_gpus),
        host_capacity=rng.random(n) * 1.6 * w,
        storage_capacity=np.where(rng.random(n) < 0.3, 0.0, rng.random(n) * 1.6 * w),
        storage_spill=rng.integers(0, 2, n),
        embed_on_gpu=rng.integers(0, 2, n),
        head_copy=np.where(rng.random(n) < 0.5, 0.0, np.floor(rng.random(n) * 2e9)),
        kv_granularity=rng.choice(GRANULARITIES, n),
        gpu_fixed=rng.random(n) * 2e9,
        gpu_buf0=rng.random(n) * 2e9,
        gpu_buf_ctx=rng.random(n) * 1e6,
        host_fixed=np.floor(rng.random(n) * 2e9),
        host_buf0=np.floor(rng.random(n) * 1e9),
        host_buf_ctx=np.floor(rng.random(n) * 1e6),
        gpu_ways=random_ways(n_gpus, rng),
    )


def assert_same_results(c: dict, r: dict, where: str = ""):
    for k in RESULT_FLOATS:
        np.testing.assert_allclose(c[k], r[k], rtol=1e-12, atol=0, err_msg=f"{k} {where}")
    for k in RESULT_INTS:
        np.testing.assert_array_equal(c[k], r[k], err_msg=f"{k} {where}")


# ------------------------------------------------------------------------------ differential
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(model_and_rows(10))
def test_c_matches_reference(case):
    mid, quant, low, rows = case
    cols = to_cols(rows)
    c = EMEM.evaluate(low, cols, engine="c")
    r = EMEM.evaluate(low, cols, engine="reference")
    assert_same_results(c, r, f"{mid} {quant}")


def test_host_bit_fractional_buffers():
    # Regression: C once subtracted the host buffer terms one at a time, so 1.1 - 1.0 - 0.1 = 8e-17 > 0
    # set the host bit in C only.
    low = lowered("gpt-oss-20b", "Q4_K_M")
    row = dict(context=1, batch=1, kv_bytes_per_elem=0.5, placement=0, placement_arg=0, mtp=0, n_gpus=1,
               gpu_capacity=1e12, host_capacity=1e12, storage_capacity=0.0, storage_spill=0, embed_on_gpu=1, head_copy=0.0,
               kv_granularity=1, gpu_fixed=0.0, gpu_buf0=0.0, gpu_buf_ctx=0.0, host_fixed=0.0, host_buf0=1.0,
               host_buf_ctx=0.1)
    cols = to_cols([row])
    c, r = EMEM.evaluate(low, cols), EMEM.evaluate(low, cols, engine="reference")
    assert r["fits"][0] == CODES.FITS_GPU      # only buffers live in host RAM
    assert_same_results(c, r)


@pytest.mark.parametrize("mid", DIFF_MODELS)
def test_c_matches_reference_numpy_random(mid):
    rng = np.random.default_rng(zlib.crc32(mid.encode()))
    for quant in ("Q4_K_M", "native"):
        low = lowered(mid, quant)
        cols = random_cols(low, 20, rng)
        assert_same_results(EMEM.evaluate(low, cols), EMEM.evaluate(low, cols, engine="reference"), f"{mid} {quant}")


def test_differential_sees_every_placement_and_outcome():
    """The random generator reaches every placement, fitting and non-fitting configs and interior searches."""
    rng = np.random.default_rng(7)
    low = lowered("mixtral-8x7b", "Q4_K_M")
    cols = random_cols(low, 400, rng)
    res = EMEM.evaluate(low, cols)
    assert set(cols["placement"]) == set(PLACEMENT_CODES.values())
    assert (res["fits"] == 0).any() and (res["fits"] != 0).any()
    assert ((res["max_context"] > 0) & (res["max_context"] < low.max_context)).any()
    assert ((res["max_batch"] > 1) & (res["max_batch"] < 2**30)).any()
    assert (res["tier"][:, 2] > 0).any(), "no configuration spilled to storage"


# ------------------------------------------------------------------------------ invariants
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_and_rows(1), st.lists(st.integers(1, 2**21), min_size=2, max_size=8))
def test_more_context_never_needs_less_memory(case, contexts):
    mid, quant, low, rows = case
    contexts = sorted(min(c, low.max_context) for c in contexts)
    cols = to_cols([dict(rows[0], context=c) for c in contexts])
    res = EMEM.evaluate(low, cols)
    totals = res["tier"].sum(axis=1)
    assert np.all(np.diff(totals) >= 0), (mid, quant, contexts, totals)
    assert np.all(np.diff(res["tier"][:, 0]) >= 0), "GPU tier shrank with more context"
    assert np.all(np.diff(res["kv"]) >= 0)
    assert np.all(np.diff(res["weights"]) == 0), "weights depend on context"
    fits = res["fits"] != 0
    assert not np.any(fits[1:] & ~fits[:-1]), "a longer context fits where a shorter one did not"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_and_rows(1), st.lists(st.floats(0.0, 3.0), min_size=2, max_size=6),
       st.sampled_from(["gpu_capacity", "host_capacity", "storage_capacity"]))
def test_more_memory_never_fits_less(case, factors, field):
    mid, quant, low, rows = case
    base = rows[0]
    scale = total_weights(low) if base[field] == 0 else base[field]
    caps = sorted(f * scale for f in factors)
    res = EMEM.evaluate(low, to_cols([dict(base, **{field: c}) for c in caps]))
    fits = res["fits"] != 0
    assert not np.any(fits[:-1] & ~fits[1:]), (mid, quant, field, caps, res["fits"])
    assert np.all(np.diff(res["max_context"]) >= 0), (field, res["max_context"])
    assert np.all(np.diff(res["max_batch"]) >= 0), (field, res["max_batch"])


def test_host_ram_one_ulp_short_of_the_spill_still_fits():
    """The case hypothesis found: host - (host - capacity) rounded one ulp above the capacity, so 65.8 GB of
    host RAM did not fit what 0 GB did (the spill to storage covers it). C, twin and oracle spill that ulp."""
    low = lowered("qwen3-next-80b-a3b", "native")
    w = total_weights(low)
    row = dict(context=1, batch=1, kv_bytes_per_elem=0.5, placement=1, placement_arg=0, mtp=0, n_gpus=1,
               gpu_capacity=159452425216.0, storage_capacity=w, storage_spill=1, embed_on_gpu=0, head_copy=0.0, kv_granularity=1,
               gpu_fixed=0.0, gpu_buf0=0.0, gpu_buf_ctx=0.0, host_fixed=0.0, host_buf0=0.0, host_buf_ctx=0.0)
    rows = [dict(row, host_capacity=c) for c in (0.0, 65837264912.43456)]
    res = EMEM.evaluate(low, to_cols(rows))
    assert np.all(res["fits"] != 0), res["fits"]
    assert res["tier"][1][1] <= rows[1]["host_capacity"]
    twin = EMEM.evaluate(low, to_cols(rows), engine="reference")
    np.testing.assert_array_equal(twin["fits"], res["fits"])


ORDERED_GGUF = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16"]


@pytest.mark.parametrize("mid", ["llama-2-7b", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b",
                                 "deepseek-v2-lite", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b"])
def test_smaller_quant_never_needs_more(mid):
    m = models.model(mid)
    sizes = [sum(nb for _t, _ty, nb in quants.assign(m, q)) for q in ORDERED_GGUF]
    for (qa, a), (qb, b) in zip(zip(ORDERED_GGUF, sizes), zip(ORDERED_GGUF[1:], sizes[1:])):
        assert a <= b, f"{mid}: {qa} {a} > {qb} {b}"
    if quants.native_expert_type(m) is None:     # gpt-oss's experts stay MXFP4 in every file type
        assert sizes[0] < sizes[-1] / 3
    # The same order through the whole memory() path.
    machine = hardware.machine("dgx-h200")
    totals = [EMEM.memory(mid, machine, q, context=4096).tier.sum() for q in ORDERED_GGUF]
    assert totals == sorted(totals), (mid, totals)


@pytest.mark.parametrize("mid,order", [
    ("deepseek-v3", ["mxfp4", "nvfp4", "fp8", "bf16"]),
    ("llama-2-7b", ["int4", "int8", "bf16"]),
    ("llama-2-7b", ["int4", "fp8", "bf16"]),     # (int8's per-row scales outweigh fp8's 128x128 blocks)
    ("qwen3-30b-a3b", ["mlx-3bit", "mlx-4bit", "mlx-6bit", "mlx-8bit", "bf16"]),
])
def test_smaller_format_never_needs_more(mid, order):
    m = models.model(mid)
    sizes = [sum(nb for _t, _ty, nb in quants.assign(m, q)) for q in order]
    assert sizes == sorted(sizes), list(zip(order, sizes))
    assert sizes[0] < sizes[-1]


# max_context / max_batch are boundaries: checked through the public memory() path.
BOUNDARY_MODELS = ["llama-2-7b", "qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b", "kimi-linear-48b-a3b",
                   "qwen3-next-80b-a3b", "deepseek-v2-lite"]


@st.composite
def boundary_case(draw):
    mid = draw(st.sampled_from(BOUNDARY_MODELS))
    quant = draw(st.sampled_from(["Q4_K_M", "Q8_0", "Q2_K"]))
    m = models.model(mid)
    w_gb = total_weights(lowered(mid, quant)) / 1e9
    gpus = draw(st.integers(1, 2))
    gpu_gb = (w_gb * draw(st.floats(0.8, 1.8)) + 3.0) / gpus
    host_gb = w_gb * draw(st.floats(0.3, 1.5)) + 3.0
    placement = "all-gpu"
    if m.n_experts and draw(st.booleans()):
        placement = f"n-cpu-moe={draw(st.integers(0, m.n_layers))}"
    batch = draw(st.integers(1, 16))
    kv = draw(st.sampled_from(["f16", "q8_0", "q4_0"]))
    runtime = draw(st.sampled_from(["llama.cpp", "sglang"]))
    machine = hardware.machine(gpu="rtx-4090", gpus=gpus, gpu_mem_gb=gpu_gb, host="ddr5-6000x2",
                               host_mem_gb=host_gb)
    return dict(model=mid, machine=machine, quant=quant, batch=batch, kv_dtype=kv, placement=placement,
                runtime=runtime)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(boundary_case())
def test_max_context_is_the_boundary(kw):
    m = models.model(kw["model"])
    r = EMEM.memory(context=1, **kw)
    mc = r.max_context
    assert 0 <= mc <= m.max_context
    if mc == 0:
        assert r.fits == "no"
        return
    assert EMEM.memory(context=mc, **kw).fits != "no", kw
    if mc < m.max_context:
        assert EMEM.memory(context=mc + 1, **kw).fits == "no", kw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(boundary_case(), st.integers(1, 2**17))
def test_max_batch_is_the_boundary(kw, context):
    m = models.model(kw["model"])
    kw = dict(kw, context=min(context, m.max_context))
    del kw["batch"]
    r = EMEM.memory(batch=1, **kw)
    mb = r.max_batch
    if mb == 0:
        assert r.fits == "no"
        return
    assert EMEM.memory(batch=mb, **kw).fits != "no", kw
    if mb < 2**30:
        assert EMEM.memory(batch=mb + 1, **kw).fits == "no", kw


def test_boundary_cases_reach_the_interior():
    """The boundary strategy is not vacuous: interior max_context/max_batch occur for fixed cases."""
    machine = hardware.machine(gpu="rtx-4090", gpus=1, gpu_mem_gb=24, host="ddr5-6000x2", host_mem_gb=64)
    r = EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=8192, batch=4, placement="n-cpu-moe=30")
    assert 0 < r.max_context < 40960 and 0 < r.max_batch < 2**30
    assert EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=r.max_context, batch=4,
                      placement="n-cpu-moe=30").fits != "no"
    assert EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=r.max_context + 1, batch=4,
                      placement="n-cpu-moe=30").fits == "no"


@pytest.mark.skipif(not _kernel.openmp_enabled(), reason="built without OpenMP: every thread count runs serially, so the comparison would pass vacuously")
def test_threads_match_serial_bit_for_bit():
    rng = np.random.default_rng(1234)
    for mid, quant in (("deepseek-v4-flash", "native"), ("mixtral-8x7b", "Q4_K_M")):
        low = lowered(mid, quant)
        cols = random_cols(low, 200, rng)
        serial = EMEM.evaluate(low, cols, n_threads=1)
        for threads in (2, 3):
            par = EMEM.evaluate(low, cols, n_threads=threads)
            for k in RESULT_FLOATS + RESULT_INTS:
                assert par[k].dtype == serial[k].dtype
                assert np.array_equal(par[k], serial[k]), (mid, threads, k)
                assert par[k].tobytes() == serial[k].tobytes(), (mid, threads, k)


# ------------------------------------------------------------------------------ brute force
def _fixed_cols(low, **over) -> dict:
    row = dict(context=1, batch=1, kv_bytes_per_elem=2.0, placement=0, placement_arg=0, mtp=0, n_gpus=1,
               gpu_capacity=0.0, host_capacity=1e15, storage_capacity=0.0, storage_spill=0, embed_on_gpu=1, head_copy=0.0,
               kv_granularity=1, gpu_fixed=3e8, gpu_buf0=1e8, gpu_buf_ctx=1024.0, host_fixed=2e8,
               host_buf0=0.0, host_buf_ctx=0.0, gpu_ways=[1.0] * CODES.N_CLASSES)
    row.update(over)
    return row


@pytest.mark.parametrize("mid,quant,gran,batch,target", [
    ("llama-2-7b", "Q4_K_M", 1, 1, 1234),
    ("llama-2-7b", "Q4_K_M", 256, 3, 1234),       # padding: the boundary lands on a multiple of 256
    ("gpt-oss-20b", "MXFP4_MOE", 1, 2, 77),       # below the 128-token window the sliding layers grow too
    ("deepseek-v4-flash", "native", 1, 1, 1500),  # C // ratio steps and capped windows
])
def test_max_context_brute_force(mid, quant, gran, batch, target):
    low = lowered(mid, quant)
    # GPU capacity: what the configuration needs at `target` tokens (C tier, itself differential-tested).
    probe = _fixed_cols(low, context=target, batch=batch, kv_granularity=gran, gpu_capacity=1e15)
    need = EMEM.evaluate(low, to_cols([probe]))["tier"][0, 0]
    row = dict(probe, gpu_capacity=need)
    cfg = {k: (int(v) if k in mem.INT_CONFIG_FIELDS else v if k == "gpu_ways" else float(v)) for k, v in row.items()}
    fits = [reference.account(low, cfg, c, batch)[6] != 0 for c in range(1, 2001)]
    last = max(c for c, ok in zip(range(1, 2001), fits) if ok)
    assert all(fits[:last]) and not any(fits[last:]), "fits is not monotone in context"
    # Every context that pads to the padded target still fits (gpu_buf_ctx > 0 makes need strictly
    # increasing in the padded context, so the next one does not).
    expected = -(-target // gran) * gran
    assert last == expected
    c = EMEM.evaluate(low, to_cols([row]))
    assert c["max_context"][0] == last
    # C's fits at each context agrees with the brute force.
    sweep = EMEM.evaluate(low, to_cols([dict(row, context=x) for x in range(1, 2001)]))
    assert list(sweep["fits"] != 0) == fits


def test_max_batch_brute_force():
    low = lowered("qwen3-30b-a3b", "Q4_K_M")
    probe = _fixed_cols(low, context=3000, batch=357, gpu_capacity=1e15, placement=PLACEMENT_CODES["experts-cpu"])
    need = EMEM.evaluate(low, to_cols([probe]))["tier"][0, 0]
    row = dict(probe, gpu_capacity=need)
    cfg = {k: (int(v) if k in mem.INT_CONFIG_FIELDS else v if k == "gpu_ways" else float(v)) for k, v in row.items()}
    fits = [reference.account(low, cfg, 3000, b)[6] != 0 for b in range(1, 1001)]
    assert fits[:357] == [True] * 357 and not any(fits[357:])
    assert EMEM.evaluate(low, to_cols([row]))["max_batch"][0] == 357
    assert EMEM.evaluate(low, to_cols([dict(row, gpu_capacity=need * (1 - 1e-9))]))["max_batch"][0] == 356


# ------------------------------------------------------------------------------ accounting spot checks
def test_placements_move_experts():
    machine = hardware.machine(gpu="rtx-4090", gpus=1, host="ddr5-6000x2", host_mem_gb=192)
    low = lowered("qwen3-30b-a3b", "Q4_K_M")
    routed = low.weights_by_class["routed_experts"]
    all_gpu = EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=4096)
    exp_cpu = EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=4096, placement="experts-cpu")
    r_idx = mem.CLASSES.index("routed_experts")
    assert all_gpu.by_class[r_idx, 0] == pytest.approx(routed, rel=1e-12) and all_gpu.by_class[r_idx, 1] == 0
    assert exp_cpu.by_class[r_idx, 1] == pytest.approx(routed, rel=1e-12) and exp_cpu.by_class[r_idx, 0] == 0
    assert exp_cpu.weights == all_gpu.weights
    half = EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=4096, placement="n-cpu-moe=24")
    assert half.by_class[r_idx, 1] == pytest.approx(routed / 2, rel=1e-9)


def test_cpu_only_machine_places_nothing_on_gpu():
    machine = hardware.machine("epyc-9654-cpu")
    r = EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=4096, placement="cpu-only")
    assert r.tier[0] == 0 and r.fits == "host"
    with pytest.raises(MoesimError) as e:
        EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", context=4096, placement="all-gpu")
    assert e.value.field == "placement"


def test_batch_multiplies_cache():
    machine = hardware.machine("dgx-h200")
    one = EMEM.memory("gpt-oss-20b", machine, "native", context=8192)
    four = EMEM.memory("gpt-oss-20b", machine, "native", context=8192, batch=4)
    assert four.kv == 4 * one.kv
    assert four.weights == one.weights


# ------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def machine():
    return hardware.machine("dgx-h200")


def _raises(field: str, fn, *words):
    with pytest.raises(MoesimError) as e:
        fn()
    assert isinstance(e.value, ValueError)
    assert e.value.field == field, (e.value.field, str(e.value))
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return e.value


def test_unknown_model_suggests_nearest(machine):
    err = _raises("model", lambda: EMEM.memory("deepseek-v3x", machine, "Q4_K_M"), "deepseek-v3x", "did you mean")
    assert str(err).index("'deepseek-v3'") < str(err).index("?")
    _raises("model", lambda: models.model("qwen3-30b-a3"), "'qwen3-30b-a3b'")


def test_unknown_quant(machine):
    _raises("quant", lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_Q"), "Q4_K_Q", "Q4_K_M")
    _raises("quant", lambda: quants.resolve("fp9"), "fp9")


@pytest.mark.parametrize("value", [0, -1, -4096, float("nan"), float("inf"), 2.5, True, None, "many"])
@pytest.mark.parametrize("field", ["context", "batch"])
def test_bad_context_and_batch(machine, field, value):
    _raises(field, lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_M", **{field: value}))


def test_mxfp4_moe_on_dense_model(machine):
    _raises("quant", lambda: EMEM.memory("llama-2-7b", machine, "MXFP4_MOE"), "MXFP4_MOE")
    _raises("quant", lambda: EMEM.memory("llama-2-7b", machine, "mxfp4"))


def test_n_cpu_moe_beyond_layers(machine):
    assert models.model("qwen3-30b-a3b").n_layers == 48
    _raises("placement", lambda: EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="n-cpu-moe=999"),
            "999", "48")
    EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="n-cpu-moe=48")  # the limit itself is fine


def test_gpu_experts_on_dense_model(machine):
    _raises("placement", lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_M", placement="gpu-experts=4"), "dense")
    _raises("placement", lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_M", placement="experts-cpu"))


def test_bad_placement_spellings(machine):
    _raises("placement", lambda: EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="n-cpu-moe"))
    _raises("placement", lambda: EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="n-cpu-moe=-1"))
    _raises("placement", lambda: EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="al-gpu"), "all-gpu")
    _raises("placement", lambda: EMEM.memory("qwen3-30b-a3b", machine, "Q4_K_M", placement="gpu-experts=129"))


def test_host_on_unified_chip():
    _raises("host", lambda: hardware.machine(gpu="m3-ultra", host="ddr5-4800x8"), "unified")


def test_gpus_zero_with_gpu():
    _raises("gpus", lambda: hardware.machine(gpu="rtx-4090", gpus=0))


def test_unknown_gpu():
    _raises("gpu", lambda: hardware.machine(gpu="rtx-4091"), "rtx-4091", "'rtx-4090'")


def test_other_machine_errors():
    _raises("gpu_mem_gb", lambda: hardware.machine(gpu="rtx-4090", gpu_mem_gb=float("nan")))
    _raises("gpu_mem_gb", lambda: hardware.machine(gpu="rtx-4090", gpu_mem_gb=-1))
    _raises("machine", lambda: hardware.machine())
    _raises("host", lambda: hardware.machine(host="ddr9-9999"))
    _raises("gpus", lambda: hardware.machine(gpu="m3-ultra", gpus=2))


def test_mtp_on_model_without_mtp(machine):
    _raises("mtp", lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_M", mtp=1))
    with_mtp = EMEM.memory("glm-4.5-air", machine, "Q4_K_M", mtp=1)
    without = EMEM.memory("glm-4.5-air", machine, "Q4_K_M")
    assert with_mtp.weights > without.weights and with_mtp.kv > without.kv


def test_unknown_kv_dtype_and_engine(machine):
    _raises("kv_dtype", lambda: EMEM.memory("llama-2-7b", machine, "Q4_K_M", kv_dtype="q9"), "q9")
    low = lowered("llama-2-7b", "Q4_K_M")
    cols = to_cols([_fixed_cols(low, gpu_capacity=1e12)])
    _raises("engine", lambda: EMEM.evaluate(low, cols, engine="fortran"))
    bad = dict(cols, batch=np.array([1, 2]))
    _raises("batch", lambda: EMEM.evaluate(low, bad))


# ------------------------------------------------------------------------------ memory per GPU (issue 16)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(model_and_rows(6))
def test_per_gpu_terms_c_matches_reference(case):
    """C == twin on the per-GPU terms (random gpu_ways): the busiest GPU's bytes are each class's GPU bytes
    over its ways, and the GPU tier fits exactly when they are within one GPU's capacity."""
    mid, quant, low, rows = case
    cols = to_cols(rows)
    c, r = EMEM.evaluate(low, cols, engine="c"), EMEM.evaluate(low, cols, engine="reference")
    np.testing.assert_array_equal(c["gpu_per_gpu"], r["gpu_per_gpu"])
    np.testing.assert_array_equal(c["fits"], r["fits"])
    np.testing.assert_array_equal(c["max_context"], r["max_context"])
    np.testing.assert_array_equal(c["max_batch"], r["max_batch"])
    one = (c["by_class"][:, :, CODES.TIER_GPU] / cols["gpu_ways"]).sum(axis=1)
    np.testing.assert_allclose(c["gpu_per_gpu"], one, rtol=1e-12)
    gpu_over = c["gpu_per_gpu"] > cols["gpu_capacity"]
    assert not (c["fits"][gpu_over] != 0).any(), "a configuration whose busiest GPU overflows fits"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_gpu_ways_is_a_kernel_error(bad):
    low = lowered("llama-2-7b", "Q4_K_M")
    row = _fixed_cols(low, gpu_capacity=1e12)
    row["gpu_ways"] = [1.0] * CODES.N_CLASSES
    row["gpu_ways"][CODES.CLASS_KV] = bad
    with pytest.raises(Exception, match="ms_memory_many"):
        EMEM.evaluate(low, to_cols([row]))
