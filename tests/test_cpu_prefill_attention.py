"""CPU prefill attention reads the KV cache as the runtime's kernel does: mainline llama.cpp's ggml-cpu
flash attention on a quantized cache (the one_chunk path) walks every KV row once per query row and head,
its tiled path (F16/F32 K and V, >= 64 rows) once per 64-row tile, ik_llama.cpp's tiled kernels once per
ubatch; the walks after the first come from DRAM only for the share of a layer's KV beyond the CPU's
last-level cache (hardware.toml l3_mb). GPU-resident attention is unchanged."""
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


def _seconds(rt_id, kv, prompt, depth, place="cpu-only", rows=None, llc=0.0, parts=None):
    """Prompt seconds; ``llc``: the CPU's last-level cache in bytes (0: none, every re-read from DRAM; None: the
    catalog's, the 7950X's 64 MB); ``parts`` receives the phases (engine.prefill.PREFILL_PHASES)."""
    m, dm, hw, rt = _setup(rt_id, kv, place, rows)
    if llc is not None:
        hw = {**hw, "cpu_llc_bytes": llc}
    return PF.prefill_seconds(m, dm, hw, {"n_layers": 0}, rt, prompt, depth, parts=parts), hw


def _kv_seconds(rt_id, kv, prompt, depth, rows=None, llc=0.0):
    """Seconds of the DRAM reads of the KV (engine.prefill._kv_reads over the prompt's ubatches, before the walk's
    arithmetic hides them) and the lowered machine."""
    m, dm, hw, rt = _setup(rt_id, kv, "cpu-only", rows)
    llc = hw["cpu_llc_bytes"] if llc is None else llc
    x = PF.prefill_terms(m, dm, {"n_layers": 0}, rt, prompt, depth)
    reads = sum(count * float(PF._kv_reads(dm, x["kv"], n_tok, llc).sum()) for n_tok, count in x["sizes"])
    return reads / hw["host_bw"], hw


def test_catalog_rows_per_read():
    assert get_runtime("llama.cpp").decode.cpu_fa_query_rows == 1.0
    assert get_runtime("ik_llama.cpp").decode.cpu_fa_query_rows == 0.0
    assert get_runtime("vllm").decode.cpu_fa_query_rows == 0.0


def test_per_row_reads_by_hand():
    """q8_0 cache (34 bytes per 32 values), one 512-token ubatch at depth 4096: the mean context is
    4096 + 256; each of 512 rows x 4 query heads per KV head reads the layer's whole K and V once."""
    prompt, depth = 512, 4096
    per_row, hw = _kv_seconds("llama.cpp", "q8_0", prompt, depth)
    once, _ = _kv_seconds("llama.cpp", "q8_0", prompt, depth, rows=0.0)
    kv_per_token = 8 * 128 * 2 * 34 / 32              # K and V of 8 KV heads, q8_0
    one_read = 32 * kv_per_token * (depth + prompt // 2)
    assert math.isclose(once, one_read / hw["host_bw"], rel_tol=1e-9)
    assert math.isclose(per_row - once, (512 * 4 - 1) * one_read / hw["host_bw"], rel_tol=1e-9)


def test_f16_cache_takes_the_64_row_tiles():
    prompt, depth = 512, 4096
    tiled, hw = _kv_seconds("llama.cpp", "f16", prompt, depth)
    once, _ = _kv_seconds("llama.cpp", "f16", prompt, depth, rows=0.0)
    one_read = 32 * 8 * 128 * 2 * 2.0 * (depth + prompt // 2)
    assert math.isclose(tiled - once, (512 // 64 * 4 - 1) * one_read / hw["host_bw"], rel_tol=1e-9)


def test_short_ubatch_falls_back_to_rows_on_f16():
    """Under 64 query rows ggml-cpu takes the one_chunk path whatever the cache type."""
    short, hw = _kv_seconds("llama.cpp", "f16", 32, 4096)
    once, _ = _kv_seconds("llama.cpp", "f16", 32, 4096, rows=0.0)
    one_read = 32 * 8 * 128 * 2 * 2.0 * (4096 + 16)
    assert math.isclose(short - once, (32 * 4 - 1) * one_read / hw["host_bw"], rel_tol=1e-9)


def test_re_reads_come_from_the_last_level_cache_while_a_layer_fits():
    """hardware.toml l3_mb (the 7950X: 64 MB): a layer's K and V at 4k of q8_0 depth (9.3 MB) fit, so DRAM sees one
    read per ubatch; at 256k (0.56 GB per layer) all but the cache's share of every walk comes from DRAM again."""
    assert _setup("llama.cpp", "q8_0")[2]["cpu_llc_bytes"] == 64 * 2**20
    cached, hw = _kv_seconds("llama.cpp", "q8_0", 512, 4096, llc=None)
    once, _ = _kv_seconds("llama.cpp", "q8_0", 512, 4096, rows=0.0, llc=None)
    assert math.isclose(cached, once, rel_tol=1e-12)
    depth = 256 * 1024
    one = 32 * 8 * 128 * 2 * 34 / 32 * (depth + 256) / 32      # one layer's K and V, bytes
    spilled, _ = _kv_seconds("llama.cpp", "q8_0", 512, depth, llc=None)
    want = 32 * one * (1 + (512 * 4 - 1) * (1 - 64 * 2**20 / one)) / hw["host_bw"]
    assert math.isclose(spilled, want, rel_tol=1e-9)
    assert spilled < _kv_seconds("llama.cpp", "q8_0", 512, depth)[0]


def test_the_walks_arithmetic_hides_the_reads_it_streams():
    """A CPU layer's attention costs the larger of its KV reads and its scoring (a roofline), so the prompt's
    time is the reads-free time plus only the reads beyond the arithmetic."""
    parts: dict = {}
    _seconds("llama.cpp", "q8_0", 512, 8192, parts=parts)
    reads, _ = _kv_seconds("llama.cpp", "q8_0", 512, 8192)
    assert parts["cpu_kv_reads"] == pytest.approx(max(reads - parts["attention"], 0.0), rel=1e-9, abs=1e-12)


def test_per_row_walks_score_at_their_share_and_tiles_at_the_matmul_rate():
    """runtimes.toml cpu_prefill_attn_eff: mainline's per-row walks (a q8_0 cache) at 6.7 % of the fp32 vector peak,
    derived from three 7950X depth sweeps; its tiled path (an f16 cache, >= 64 rows) at the matmul rate."""
    d = get_runtime("llama.cpp").decode
    assert d.cpu_prefill_attn_eff == 0.067
    _, _, hw, _ = _setup("llama.cpp", "q8_0")
    assert hw["cpu_prefill_attn_flops"] < 0.2 * hw["cpu_flops"]
    q8, f16 = ({}, {})
    _seconds("llama.cpp", "q8_0", 512, 8192, parts=q8)
    _seconds("llama.cpp", "f16", 512, 8192, parts=f16)
    assert q8["attention"] == pytest.approx(f16["attention"] * hw["cpu_flops"] / hw["cpu_prefill_attn_flops"])


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
