"""CPU prefill attention reads the KV cache as the runtime's kernel does: mainline llama.cpp's ggml-cpu
flash attention on a quantized cache (the one_chunk path) walks every KV row once per query row and head,
its tiled path (F16/F32 K and V, >= 64 rows) once per 64-row tile, ik_llama.cpp's tiled kernels once per
ubatch. GPU-resident attention is unchanged."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from moesim import ingest
from moesim.engine import prefill as PF
from moesim.engine.lower import memory as LMEM
from moesim.engine.lower.decode_model import lower_model
from moesim.engine.lower.machine import lower_machine
from moesim.spec import hardware, quants as Q
from moesim.spec.placement import Placement
from moesim.spec.runtimes import runtime as get_runtime

MID, QUANT = "llama-3-8b", "BF16"       # 32 layers, 32 query heads over 8 KV heads of 128 dims


def _setup(rt_id: str, kv: str, place: str = "cpu-only", rows: float | None = None):
    m = ingest.model(MID)
    low = LMEM.lower(m, QUANT)
    mach = hardware.machine(cpu="ryzen-9-7950x", host="ddr5-5200x2", gpu="rtx-4090" if place != "cpu-only" else None,
                            gpus=1 if place != "cpu-only" else 0)
    rt = get_runtime(rt_id)
    if rows is not None:
        rt = dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, cpu_fa_query_rows=rows))
    p = Placement(place)
    dm = lower_model(m, low, p, mach, rt, 1, kv, 1)
    hw = lower_machine(mach, rt, p, Q.kernel_mix(m, QUANT))
    return m, dm, hw, rt


def _seconds(rt_id, kv, prompt, depth, place="cpu-only", rows=None):
    m, dm, hw, rt = _setup(rt_id, kv, place, rows)
    return PF.prefill_seconds(m, dm, hw, {"n_layers": 0}, rt, prompt, depth), hw


def test_catalog_rows_per_read():
    assert get_runtime("llama.cpp").decode.cpu_fa_query_rows == 1.0
    assert get_runtime("ik_llama.cpp").decode.cpu_fa_query_rows == 0.0
    assert get_runtime("vllm").decode.cpu_fa_query_rows == 0.0


def test_per_row_reads_by_hand():
    """q8_0 cache (34 bytes per 32 values), one 512-token ubatch at depth 4096: the mean context is
    4096 + 256; each of 512 rows x 4 query heads per KV head reads the layer's whole K and V once."""
    prompt, depth = 512, 4096
    per_row, hw = _seconds("llama.cpp", "q8_0", prompt, depth)
    once, _ = _seconds("llama.cpp", "q8_0", prompt, depth, rows=0.0)
    kv_per_token = 8 * 128 * 2 * 34 / 32              # K and V of 8 KV heads, q8_0
    one_read = 32 * kv_per_token * (depth + prompt // 2)
    want = (512 * 4 - 1) * one_read / hw["host_bw"]
    assert math.isclose(per_row - once, want, rel_tol=1e-9)


def test_f16_cache_takes_the_64_row_tiles():
    prompt, depth = 512, 4096
    tiled, hw = _seconds("llama.cpp", "f16", prompt, depth)
    once, _ = _seconds("llama.cpp", "f16", prompt, depth, rows=0.0)
    one_read = 32 * 8 * 128 * 2 * 2.0 * (depth + prompt // 2)
    assert math.isclose(tiled - once, (512 // 64 * 4 - 1) * one_read / hw["host_bw"], rel_tol=1e-9)


def test_short_ubatch_falls_back_to_rows_on_f16():
    """Under 64 query rows ggml-cpu takes the one_chunk path whatever the cache type."""
    short, hw = _seconds("llama.cpp", "f16", 32, 4096)
    once, _ = _seconds("llama.cpp", "f16", 32, 4096, rows=0.0)
    one_read = 32 * 8 * 128 * 2 * 2.0 * (4096 + 16)
    assert math.isclose(short - once, (32 * 4 - 1) * one_read / hw["host_bw"], rel_tol=1e-9)


@pytest.mark.parametrize("depth", [0, 8192])
def test_the_per_row_cost_grows_with_depth_and_tiled_kernels_do_not_pay_it(depth):
    main, _ = _seconds("llama.cpp", "q8_0", 512, depth)
    ik_like, _ = _seconds("llama.cpp", "q8_0", 512, depth, rows=0.0)
    assert main > ik_like
    if depth:
        shallow_gap = _seconds("llama.cpp", "q8_0", 512, 0)[0] - _seconds("llama.cpp", "q8_0", 512, 0, rows=0.0)[0]
        assert main - ik_like > 10 * shallow_gap


def test_gpu_attention_is_unchanged():
    a, _ = _seconds("llama.cpp", "q8_0", 512, 4096, place="all-gpu")
    b, _ = _seconds("llama.cpp", "q8_0", 512, 4096, place="all-gpu", rows=0.0)
    assert a == b


def test_recurrent_layers_read_their_state_once():
    m = ingest.model("qwen3-next-80b-a3b")
    from moesim.engine.lower.attention import prefill_kv_read
    low = LMEM.lower(m, "Q4_K_M")
    fns, heads = prefill_kv_read(m, low, 2.0)
    kinds = np.array([layer.attention.kind for layer in m.layers])
    assert (heads[kinds == "gdn"] == 0).all() and (heads[kinds == "gqa"] > 1).all()
    assert len(fns) == m.n_layers


def _row(**kw):
    base = dict(id="T-1", quality="B", model="qwen3-30b-a3b", quant="Q4_K_M", kv_dtype="q8_0", runtime="llama.cpp",
                gpu="none", gpus="0", host_cpu="Ryzen 9 7950X", host_mem="ddr5", host_channels="2", host_cores="16",
                placement="cpu-only", prompt_tokens="512", depth_tokens="8192", batch="1", mtp="0",
                decode_tok_s="10", prefill_tok_s="50", source="test", notes="")
    base.update(kw)
    return base


@pytest.mark.parametrize("notes,date,off", [
    ("sweep-bench; -fa", "2025-04-29", False),          # turned on explicitly
    ("sweep-bench; no FA", "2025-09-04", True),         # turned off explicitly
    ("llama-bench fa 0", "", True),
    ("sweep-bench", "2025-04-29", True),                # before the auto default, not turned on
    ("sweep-bench", "2025-09-04", False),               # auto default: on
    ("Jan 2025 layer split", "", True),                 # dated by the notes
    ("", "", False),                                    # undated: today's default
])
def test_flash_attention_from_notes_and_date(notes, date, off):
    from moesim.analysis import validate as V
    cfg = V.build(_row(notes=notes, date=date))
    assert cfg.no_flash is off
    prep = V.prepare(cfg)
    assert (prep.rt.decode.cpu_fa_query_rows == 0.0) is off


def test_decode_reads_the_kv_once_per_query_head_under_per_row_flash_attention():
    """qwen3-30b-a3b: 32 query heads over 4 KV heads; a one-token decode step under mainline's CPU flash
    attention walks each KV head's rows once per query head of its group: 8x the cache bytes."""
    from moesim.analysis import validate as V
    on, off = (V.prepare(V.build(_row(notes=n, date="2025-09-04"))) for n in ("", "no FA"))
    assert np.allclose(on.dm["kv_bytes"], 8.0 * off.dm["kv_bytes"])
    assert on.predict()[0] < off.predict()[0]
