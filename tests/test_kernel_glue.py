"""The C boundary: every table is checked against its struct's declared field table before C runs (a
missing, mistyped or mis-sized field is a StructError naming the struct and field), the kernel limits
are MoesimErrors naming the field and the bound, and the C core itself returns an error code for an
exceeded limit instead of crashing (checked from a small C program)."""
from __future__ import annotations

import re
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from moesim import MoesimError
from moesim.engine import _kernel, codes, glue
from moesim.engine import decode as KD
from moesim.engine import memory as EMEM
from moesim.engine import routing as KRT
from moesim.engine.glue import StructError
from moesim.engine.lower import memory as LM
from moesim.engine.lower import routing as LRT
from moesim.errors import KernelError
from moesim.ingest import model
from moesim.spec import routing as R
from moesim.spec.hardware import machine
from moesim.spec.placement import parse
from moesim.spec.runtimes import runtime
from moesim.engine.lower.machine import DECODE_PATHS_OFF

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"


# ------------------------------------------------------------------------------- fixtures
def tables(L=3, E=8, k=2):
    dm = dict(attn_bytes=np.full(L, 1e6), attn_flops=np.full(L, 1e6), kv_bytes=np.full(L, 1e5),
              score_flops=np.full(L, 1e4), shared_bytes=np.zeros(L), shared_flops=np.zeros(L),
              expert_bytes=np.full(L, 5e6), expert_flops=np.full(L, 1e7), attn_on_gpu=np.ones(L, np.int32),
              expert_mode=np.full(L, codes.EXP_FETCH, np.int32), slots=np.full(L, 4, np.int32),
              page_slots=np.full(L, E, np.int32), moe_index=np.arange(L, dtype=np.int32), head_bytes=1e6,
              head_flops=1e6, head_on_gpu=1, draft_bytes=0.0, draft_flops=0.0, act_bytes=1e4, allreduce_bytes=0.0,
              ep_load_experts=np.ones(L), ep_load_pairs=np.ones(L), a2a_bytes=0.0,
              layer_ops=np.zeros(L), gemm_rows=np.zeros(L))
    hw = dict(gpu_bw=1e12, host_bw=5e10, pcie_bw=2.5e10, storage_bw=5e9, gpu_flops=1e14, cpu_flops=1e12,
              interconnect_bw=1e11, unified=0, overlap=1, launch_s=3e-6, sync_s=2e-5, dma_s=6e-6, allreduce_s=0.0,
              step_s=3e-4, seq_s=0.0, a2a_bw=1e11, a2a_s=0.0, moe_s=0.0, cpu_layer_s=0.0, op_s=0.0,
              cpu_op_s=0.0, graph_max_tokens=0, nograph_s=0.0, mmid_sync_s=0.0, cpu_attn_flops=1e12, **DECODE_PATHS_OFF)
    rt = LRT.lower(LRT.RoutingDims(L, E, k), R.profile("generic"), seed=0)
    return dm, hw, rt


def cols(n=1, mode="montecarlo", batch=2, steps=40, policy="lru"):
    return dict(batch=[batch] * n, tokens_per_step=[1] * n, drafts=[0] * n, accepted=[1.0] * n, steps=[steps] * n,
                warmup=[4] * n, policy=[codes.POLICIES[policy]] * n, mode=[codes.MODES[mode]] * n, seed=[1] * n,
                index=list(range(n)))


def memory_case(n=4):
    m = model("qwen3-30b-a3b")
    low = LM.lower(m, "Q4_K_M")
    mach = machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    cfg = LM.configure(m, low, mach, runtime("llama.cpp"), parse("all-gpu"), 4096, 1, "f16")
    c = LM.config_columns(cfg, n)
    return low, c


def lowered_view(low, **change):
    """A stand-in for a LoweredModel with some attributes changed (None: removed)."""
    attrs = {f: getattr(low, f) for f in ("attn", "router", "shared", "expert_one", "n_experts", "dense", "kv_elems",
                                          "kv_fixed", "kv_cap", "kv_ratio", "kv_ratio_elems", "kv_ratio_fixed",
                                          "kv_state", "embed", "head", "mtp", "mtp_layers", "max_context")}
    attrs.update(change)
    return types.SimpleNamespace(**{k: v for k, v in attrs.items() if v is not None})


def raises_struct(fn, struct, field, match=None):
    with pytest.raises(StructError) as exc:
        fn()
    assert (exc.value.struct, exc.value.field) == (struct, field), str(exc.value)
    assert f"{struct}.{field}" in str(exc.value)
    if match:
        assert re.search(match, str(exc.value)), str(exc.value)
    assert isinstance(exc.value, KernelError)
    return exc.value


# ------------------------------------------------------------------------------- the tables match the header
def header_structs() -> dict:
    """Member names of each ``typedef struct { ... } name;`` of moesim.h."""
    text = re.sub(r"/\*.*?\*/", "", (CSRC / "moesim.h").read_text(), flags=re.S)
    out = {}
    for body, name in re.findall(r"typedef struct\s*\{(.*?)\}\s*(\w+);", text, re.S):
        members = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            for part in decl.split(","):
                ident = re.findall(r"(\w+)\s*(?:\[[^\]]*\])*\s*$", part.strip())
                members.append(ident[0])
        out[name] = members
    return out


# fields the glue derives (array lengths, the templates it assembles) instead of reading them from a table
DERIVED = {
    "ms_model_t": {"n_layers"},
    "ms_decode_model_t": {"n_layers"},
    "ms_routing_t": {"n_scenarios", "trace_tokens", "trace_layers", "qbar", "lqbar", "history", "n_partners",
                     "n_window", "n_moment", "windows_checked"},       # windows_checked: set by glue.seal_routing alone
    "ms_decode_config_t": set(),
    "ms_machine_t": set(),
    "ms_sweep_place_t": set(),
}


@pytest.mark.parametrize("struct, table", [("ms_model_t", "ms_model_t"), ("ms_decode_model_t", "ms_decode_model_t"),
                                           ("ms_machine_t", "ms_machine_t"), ("ms_routing_t", "ms_routing_t"),
                                           ("ms_decode_config_t", "ms_decode_config_t[]"),
                                           ("ms_sweep_place_t", "ms_sweep_place_t[]")])
def test_field_tables_declare_every_struct_member(struct, table):
    members = set(header_structs()[struct]) - DERIVED[struct]
    declared = {f.name for f in glue.STRUCTS[table]} - {"q_tables"}
    assert members == declared, (sorted(members - declared), sorted(declared - members))


def test_mem_config_tables_declare_every_member():
    members = set(header_structs()["ms_mem_config_t"])
    assert {f.name for f in glue.STRUCTS["ms_mem_config_t[]"]} == members
    assert {f.name for f in glue.STRUCTS["ms_mem_config_t"]} == members - {"context", "batch", "placement",
                                                                           "placement_arg"}


def test_limits_mirror_the_header():
    text = (CSRC / "moesim.h").read_text()
    assert re.search(r"#define MS_MAX_MOE_LAYERS\s+256\b", text) and codes.MAX_MOE_LAYERS == 256
    assert re.search(r"#define MS_MAX_TOP_K\s+512\b", text) and codes.MAX_TOP_K == 512
    # the stack arrays the limits protect are sized by the same macros
    src = (CSRC / "ms_decode.c").read_text() + (CSRC / "ms_route.c").read_text()
    assert "caches[2 * MS_MAX_MOE_LAYERS]" in src and "picks[MS_MAX_TOP_K]" in src
    assert not re.search(r"\[\s*(256|512|2 \* 256)\s*\]", src)


# ------------------------------------------------------------------------------- missing fields
@pytest.mark.parametrize("field", ["slots", "head_on_gpu", "allreduce_bytes"])
def test_missing_decode_model_field(field):
    dm, hw, rt = tables()
    del dm[field]
    raises_struct(lambda: KD.run(dm, hw, rt, cols()), "ms_decode_model_t", field, "missing")


@pytest.mark.parametrize("field", ["seq_s", "overlap", "gpu_bw"])
def test_missing_machine_field(field):
    dm, hw, rt = tables()
    del hw[field]
    raises_struct(lambda: KD.run(dm, hw, rt, cols()), "ms_machine_t", field, "missing")


@pytest.mark.parametrize("field", ["n_group", "hot", "log_pop", "request_tokens", "q_tables"])
def test_missing_routing_field(field):
    dm, hw, rt = tables()
    del rt[field]
    raises_struct(lambda: KD.run(dm, hw, rt, cols()), "ms_routing_t", field, "missing")


def test_missing_q_table_names_the_nested_field():
    dm, hw, rt = tables()
    rt["q_tables"] = {k: v for k, v in rt["q_tables"].items() if k != "lqbar"}
    raises_struct(lambda: KD.run(dm, hw, rt, cols(mode="analytic")), "ms_routing_t.q_tables", "lqbar", "missing")


def test_missing_config_column():
    dm, hw, rt = tables()
    c = cols()
    del c["mode"]
    with pytest.raises(MoesimError) as exc:
        KD.run(dm, hw, rt, c)
    assert exc.value.field == "mode"
    raises_struct(lambda: _kernel.decode_many(dm, hw, rt, c, 1), "ms_decode_config_t[]", "mode", "missing")


def test_missing_lowered_model_field():
    low, c = memory_case()
    raises_struct(lambda: _kernel.memory_many(lowered_view(low, kv_cap=None), c, 1), "ms_model_t", "kv_cap",
                  "missing")
    del c["kv_granularity"]
    raises_struct(lambda: _kernel.memory_many(low, c, 1), "ms_mem_config_t[]", "kv_granularity", "missing")


def test_dense_model_routing_needs_no_layer_tables():
    """A dense model's routing carries only its dimensions (n_layers 0): absent per-layer tables are
    explicitly optional there, and nowhere else."""
    dm, hw, _ = tables(L=2)
    dm["expert_mode"] = np.zeros(2, np.int32)
    dm["moe_index"] = np.full(2, -1, np.int32)
    rt = LRT.lower(LRT.RoutingDims(0, 0, 0), R.profile("generic"))
    assert "hot" not in rt
    for mode, policy in (("montecarlo", "lru"), ("montecarlo", "belady"), ("analytic", "lru")):
        res = KD.run(dm, hw, rt, cols(mode=mode, policy=policy))
        assert res["step_mean"][0] > 0 and res["hit_rate"][0] == -1.0


# ------------------------------------------------------------------------------- wrong sizes and types
def test_wrong_length_decode_model_array():
    dm, hw, rt = tables(L=3)
    dm["slots"] = np.full(2, 4, np.int32)
    raises_struct(lambda: KD.run(dm, hw, rt, cols()), "ms_decode_model_t", "slots", r"n_layers=3")


def test_wrong_shape_routing_tables():
    dm, hw, rt = tables(L=3, E=8)
    bad = dict(rt, hot=rt["hot"][:, :7])
    raises_struct(lambda: KD.run(dm, hw, bad, cols()), "ms_routing_t", "hot", r"n_experts=8")
    bad = dict(rt, stickiness=np.zeros(4))
    raises_struct(lambda: KD.run(dm, hw, bad, cols()), "ms_routing_t", "stickiness", r"n_layers=3")
    bad = dict(rt, q=rt["q"][0])
    raises_struct(lambda: KD.run(dm, hw, bad, cols(mode="analytic")), "ms_routing_t", "q", "dimension")


def test_trace_must_match_top_k():
    dm, hw, rt = tables(L=2, E=8, k=2)
    bad = dict(rt, trace=np.zeros((5, 2, 3), np.int32))
    raises_struct(lambda: KD.run(dm, hw, bad, cols()), "ms_routing_t", "trace", r"top_k=2")


def test_short_memory_column():
    low, c = memory_case(n=4)
    c["host_capacity"] = c["host_capacity"][:3]
    raises_struct(lambda: _kernel.memory_many(low, c, 1), "ms_mem_config_t[]", "host_capacity", r"n=4")
    with pytest.raises(MoesimError):
        EMEM.evaluate(low, c)


def test_wrong_length_lowered_model_array():
    low, c = memory_case()
    raises_struct(lambda: _kernel.memory_many(lowered_view(low, dense=low.dense[:-1]), c, 1), "ms_model_t", "dense",
                  "n_layers")


def test_integer_fields_reject_fractions_and_overflow():
    dm, hw, rt = tables()
    raises_struct(lambda: KD.run(dm, hw, dict(rt, top_k=2.5), cols()), "ms_routing_t", "top_k", "integer")
    raises_struct(lambda: KD.run(dict(dm, slots=np.full(3, 2.5)), hw, rt, cols()), "ms_decode_model_t", "slots",
                  "integer")
    raises_struct(lambda: KD.run(dict(dm, slots=np.full(3, 2**40)), hw, rt, cols()), "ms_decode_model_t", "slots",
                  "range")
    raises_struct(lambda: KD.run(dm, dict(hw, gpu_bw="fast"), rt, cols()), "ms_machine_t", "gpu_bw", "real")
    raises_struct(lambda: KD.run(dm, hw, rt, dict(cols(), batch=[2**33])), "ms_decode_config_t[]", "batch", "range")


def test_cache_replay_arrays_checked():
    sel = np.zeros((4, 2, 3), np.int32)
    nsel = np.ones((4, 2), np.int32)
    raises_struct(lambda: _kernel.cache_replay(sel, nsel[:, :1], 8, 2, codes.POLICY_LRU, None, 0),
                  "ms_cache_replay()", "nsel", "n_layers=2")
    raises_struct(lambda: _kernel.cache_replay(sel, nsel, 8, 2, codes.POLICY_STATIC, np.zeros((2, 7), np.int32), 0),
                  "ms_cache_replay()", "hot", "n_experts=8")
    code, hits, acc = _kernel.cache_replay(sel, nsel, 8, 2, codes.POLICY_STATIC, None, 0)
    assert code == codes.ERR_NULL_ARGUMENT           # the static policy needs its pinned order: C says so
    tokens = np.zeros((5, 2, 2), np.int32)
    tokens[:, :, 1] = 1
    assert list(KRT.cache_hit_rates([tokens], 8, 2, "static")) == [1.0, 1.0]   # pinned in id order by default


def test_sweep_tables_checked():
    from moesim.analysis.sweep import Plan, build_spec, normalize_spec
    plan = Plan(normalize_spec(build_spec(models=["qwen3-30b-a3b"], quants=["Q4_K_M"],
                                          machines=[{"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64,
                                                     "name": "m"}], contexts=[4096], batches=[1])))
    grp = plan.group(0)
    t = dict(grp.mem_tables)
    _kernel.SweepMemory(t)
    raises_struct(lambda: _kernel.SweepMemory({k: v for k, v in t.items() if k != "fits_label"}), "ms_sweep_mem_t",
                  "fits_label", "missing")
    raises_struct(lambda: _kernel.SweepMemory(dict(t, ratio=list(t["ratio"]) + [0])), "ms_sweep_mem_t", "ratio",
                  "n_kinds")
    raises_struct(lambda: _kernel.SweepMemory(dict(t, cfg=t["cfg"][:1])), "ms_sweep_mem_t", "cfg")
    places = dict(t["places"], w_host=t["places"]["w_host"][:-1])
    raises_struct(lambda: _kernel.SweepMemory(dict(t, places=places)), "ms_sweep_mem_t.places", "w_host", "n_places")
    cfg0 = {k: v for k, v in t["cfg"][0].items() if k != "host_buf_ctx"}
    raises_struct(lambda: _kernel.SweepMemory(dict(t, cfg=[cfg0, t["cfg"][1]])), "ms_mem_config_t", "host_buf_ctx")
    grp.add_variants([0])
    d = dict(grp.dec_tables)
    _kernel.SweepDecode(d)
    raises_struct(lambda: _kernel.SweepDecode({k: v for k, v in d.items() if k != "prompt"}), "ms_sweep_decode_t",
                  "prompt", "missing")
    raises_struct(lambda: _kernel.SweepDecode(dict(d, variant_i32=np.zeros((len(d["variant_f64"]), 2), np.int32))),
                  "ms_sweep_decode_t", "variant_i32", "3")
    many = np.zeros((codes.SWEEP_MAX_FNS + 1, 5))
    with pytest.raises(MoesimError, match="SWEEP_MAX_FNS = 64") as exc:
        _kernel.SweepDecode(dict(d, fn_kv_f=many, fn_sf_f=many, fn_kv_c=np.zeros((65, 4), np.int64),
                                 fn_sf_c=np.zeros((65, 4), np.int64)))
    assert exc.value.field == "ms_sweep_decode_t.fn_kv_f"


def _sweep_out(n):
    return dict(decode_tok_s=np.zeros(n), aggregate_tok_s=np.zeros(n), tpot_ms=np.zeros(n), prefill_tok_s=np.zeros(n),
                expert_hit_rate=np.zeros(n), bottleneck=np.zeros(n, np.int32), tpot_p50_ms=np.zeros(n),
                tpot_p99_ms=np.zeros(n))


def test_sweep_columns_are_checked_without_memoryviews():
    """sweep_analytic and sweep_memory read their columns through _kernel._col (a data pointer after checking the
    array, where typed memoryviews were built before): a column of another dtype, shape or length, not contiguous,
    not an array, or a read-only output is refused (ValueError / TypeError) before the C runs, and good columns give
    the rows they gave."""
    from moesim.analysis.sweep import Plan, build_spec, normalize_spec
    plan = Plan(normalize_spec(build_spec(models=["qwen3-30b-a3b"], quants=["Q4_K_M"],
                                          machines=[{"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64,
                                                     "name": "m"}], contexts=[4096], batches=[1, 2])))
    grp = plan.group(0)
    grp.add_variants([0])
    dec = _kernel.SweepDecode(dict(grp.dec_tables))
    ctx, bat, var = np.array([4096, 4096], np.int64), np.array([1, 2], np.int64), np.zeros(2, np.int32)
    out = _sweep_out(2)
    assert _kernel.sweep_analytic(dec, ctx, bat, var, 1, out) == (0, -1) and out["decode_tok_s"].min() > 0
    for bad in (ctx.astype(np.int32), ctx.astype(np.float64), np.array([[4096, 4096]], np.int64),
                np.array([4096, 0, 4096, 0], np.int64)[::2], ctx.astype(ctx.dtype.newbyteorder())):
        with pytest.raises(ValueError):
            _kernel.sweep_analytic(dec, bad, bat, var, 1, _sweep_out(2))
    with pytest.raises(TypeError):
        _kernel.sweep_analytic(dec, [4096, 4096], bat, var, 1, _sweep_out(2))
    ro = _sweep_out(2)
    ro["tpot_ms"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _kernel.sweep_analytic(dec, ctx, bat, var, 1, ro)
    with pytest.raises(ValueError, match="shorter"):
        _kernel.sweep_analytic(dec, ctx, bat, var, 1, dict(_sweep_out(2), tpot_ms=np.zeros(1)))
    wide = _sweep_out(5)                # a chunk's columns, the group's rows from an offset on
    assert _kernel.sweep_analytic(dec, ctx, bat, var, 1, wide, 3) == (0, -1)
    assert wide["decode_tok_s"][3:].tolist() == out["decode_tok_s"].tolist() and not wide["decode_tok_s"][:3].any()
    for off in (4, -1):
        with pytest.raises(ValueError, match="shorter"):
            _kernel.sweep_analytic(dec, ctx, bat, var, 1, _sweep_out(5), off)
    mem = {k: np.zeros(2, np.int64) for k in ("context", "batch", "key", "max_context", "max_batch")}
    mem.update({k: np.zeros(2, np.int32) for k in ("placement", "fits")})
    mem.update({k: np.zeros(2) for k in ("weights_bytes", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
                                         "storage_bytes")})
    assert _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, False, 0, 2, 1, mem)[0] == 0
    assert mem["context"].tolist() == [4096, 4096] and mem["batch"].tolist() == [1, 2]
    wide = {k: np.zeros(4, v.dtype) for k, v in mem.items()}
    assert _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, False, 0, 2, 1, wide, 2)[0] == 0
    assert all(wide[k][2:].tolist() == mem[k].tolist() and not wide[k][:2].any() for k in mem)
    with pytest.raises(ValueError):
        _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, False, 0, 2, 1, dict(mem, fits=np.zeros(2)))
    with pytest.raises(ValueError):
        _kernel.sweep_memory(grp.mem, plan.contexts.astype(np.float64), plan.batches, False, 0, 2, 1, mem)


@pytest.mark.parametrize("mode", ["analytic", "montecarlo"])
def test_sweep_decode_bad_kind_slice_or_template_is_an_error_code(mode):
    """ms_sweep_decode_t carries n_kinds and n_templates: a variant whose kind slice runs past the kinds
    table, or whose Monte Carlo template index is past the templates, is MS_ERR_BAD_SWEEP from the C
    (before any configuration runs), never a read out of bounds."""
    from moesim.analysis.sweep import Plan, build_spec, normalize_spec
    plan = Plan(normalize_spec(build_spec(models=["qwen3-30b-a3b"], quants=["Q4_K_M"],
                                          machines=[{"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64,
                                                     "name": "m"}], contexts=[4096], batches=[1, 2], mode=mode,
                                          tokens=12)))
    grp = plan.group(0)
    grp.add_variants([0])
    d = dict(grp.dec_tables)
    n_kinds, n_var = len(d["kind_f64"]), len(d["variant_f64"])
    ctx, bat = np.array([4096, 4096], np.int64), np.array([1, 2], np.int64)
    var, idx = np.zeros(2, np.int32), np.arange(2, dtype=np.uint64)

    def run(table):
        dec = _kernel.SweepDecode(table)
        if mode == "analytic":
            return _kernel.sweep_analytic(dec, ctx, bat, var, 1, _sweep_out(2))
        return _kernel.sweep_montecarlo(dec, ctx, bat, var, idx, 1, _sweep_out(2))

    assert run(d) == (0, -1)
    vi = np.array(d["variant_i32"])
    bad_tables = []
    for col, value in ((0, n_kinds), (0, -1), (1, n_kinds + 1), (0, 2**31 - 1)):   # kind0 / n_kinds columns
        v = vi.copy()
        v[:, col] = value
        bad_tables.append(dict(d, variant_i32=v))
    if mode == "montecarlo":
        n_templates = len(d["mc"]["models"])
        for value in (n_templates, n_templates + 1000, -1):                       # the template column
            v = vi.copy()
            v[:, 2] = value
            bad_tables.append(dict(d, variant_i32=v))
    for t in bad_tables:
        code, bad = run(t)
        assert code == codes.ERR_BAD_SWEEP, (code, t["variant_i32"])
    assert n_var == 1 and run(d)[0] == 0


# ------------------------------------------------------------------------------- limits
def test_moe_layer_limit_is_a_moesim_error_before_c():
    dm, hw, rt = tables(L=3)
    big = LRT.lower(LRT.RoutingDims(codes.MAX_MOE_LAYERS + 1, 8, 2), R.profile("generic"), seed=0)
    for fn in (lambda: KD.run(dm, hw, big, cols()), lambda: KD.run(dm, hw, big, cols(mode="analytic")),
               lambda: _kernel.route_sample(big, cols())):
        with pytest.raises(MoesimError, match=r"257 MoE layers exceed the kernel limit MAX_MOE_LAYERS = 256") as exc:
            fn()
        assert exc.value.field == "ms_routing_t.n_layers"
    at_limit = LRT.lower(LRT.RoutingDims(codes.MAX_MOE_LAYERS, 8, 2), R.profile("generic"), seed=0)
    code, picks = _kernel.route_sample(at_limit, cols(steps=2, batch=1))
    assert code == 0 and picks.shape == (2, 1, 1, 256, 2)


def test_top_k_limit_is_a_moesim_error_before_c():
    dm, hw, rt = tables(L=1, E=600, k=2)
    big = dict(rt, top_k=codes.MAX_TOP_K + 1)
    for fn in (lambda: KD.run(dm, hw, big, cols()), lambda: _kernel.route_sample(big, cols())):
        with pytest.raises(MoesimError, match=r"top-513 routing exceeds the kernel limit MAX_TOP_K = 512") as exc:
            fn()
        assert exc.value.field == "ms_routing_t.top_k"
    at_limit = LRT.lower(LRT.RoutingDims(1, 600, codes.MAX_TOP_K), R.profile("generic"), seed=0)
    code, picks = _kernel.route_sample(at_limit, cols(steps=2, batch=1))
    assert code == 0 and all(len(set(p)) == 512 for p in picks.reshape(-1, 512))


C_LIMITS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "moesim.h"

/* A routing table of L MoE layers, E experts, top-k K; a one-layer model reading routing layer 0. */
static int run(int32_t L, int32_t E, int32_t K, int32_t mode)
{
    static double zeros[1 << 20], one = 1.0;
    static int32_t izero[1 << 16], hot[1 << 20];
    int32_t moe = 0, fetch = MS_EXP_GPU;
    ms_decode_model_t m;
    ms_machine_t hw;
    ms_routing_t r;
    ms_decode_config_t c;
    ms_decode_result_t out;
    int64_t wsb;
    void *ws;
    int rc;
    memset(&m, 0, sizeof(m)); memset(&hw, 0, sizeof(hw)); memset(&r, 0, sizeof(r)); memset(&c, 0, sizeof(c));
    for (int i = 0; i < (1 << 20); i++) hot[i] = i % E;
    m.n_layers = 1;
    m.attn_bytes = m.attn_flops = m.kv_bytes = m.score_flops = zeros;
    m.shared_bytes = m.shared_flops = m.expert_bytes = m.expert_flops = zeros;
    m.attn_on_gpu = m.slots = m.page_slots = izero;
    m.expert_mode = &fetch;
    m.moe_index = &moe;
    hw.gpu_bw = hw.host_bw = hw.pcie_bw = hw.storage_bw = hw.gpu_flops = hw.cpu_flops = hw.interconnect_bw = one;
    hw.cpu_attn_flops = one;
    hw.graph_max_tokens = 0; hw.nograph_s = 0.0;
    r.n_layers = L; r.n_experts = E; r.top_k = K;
    r.log_pop = r.stickiness = r.recall = zeros;
    r.hot = hot;
    r.n_scenarios = 1;
    r.q = r.qbar = r.lqbar = zeros;
    c.batch = 1; c.tokens_per_step = 1; c.accepted = 1.0; c.steps = 2; c.mode = mode;
    wsb = ms_decode_workspace_size(&m, &r, &c);
    ws = malloc((size_t) wsb);
    rc = ms_decode(&m, &hw, &r, &c, ws, wsb, &out);
    free(ws);
    return rc;
}

static int sample(int32_t L, int32_t E, int32_t K)
{
    static double zeros[1 << 20];
    ms_routing_t r;
    ms_decode_config_t c;
    ms_decode_model_t m;
    int32_t zero = 0, none = -1;
    double dz = 0.0;
    int64_t wsb;
    void *ws, *tok;
    int rc;
    memset(&r, 0, sizeof(r)); memset(&c, 0, sizeof(c)); memset(&m, 0, sizeof(m));
    r.n_layers = L; r.n_experts = E; r.top_k = K;
    r.log_pop = r.stickiness = r.recall = zeros;
    c.batch = 1; c.tokens_per_step = 1; c.steps = 1;
    m.n_layers = 1;
    m.attn_bytes = m.attn_flops = m.kv_bytes = m.score_flops = &dz;
    m.shared_bytes = m.shared_flops = m.expert_bytes = m.expert_flops = &dz;
    m.attn_on_gpu = m.expert_mode = m.slots = m.page_slots = &zero;
    m.moe_index = &none;
    wsb = ms_decode_workspace_size(&m, &r, &c);
    ws = malloc((size_t) wsb);
    tok = malloc((size_t) L * K * sizeof(int32_t));
    rc = ms_route_sample(&r, &c, tok, ws, wsb);
    free(ws);
    free(tok);
    return rc;
}

int main(void)
{
    printf("%d %d %d %d\n", run(MS_MAX_MOE_LAYERS, 8, 2, MS_MODE_MONTECARLO),
           run(MS_MAX_MOE_LAYERS + 1, 8, 2, MS_MODE_MONTECARLO), run(MS_MAX_MOE_LAYERS + 1, 8, 2, MS_MODE_ANALYTIC),
           run(1, 1024, MS_MAX_TOP_K + 1, MS_MODE_MONTECARLO));
    printf("%d %d %d\n", sample(MS_MAX_MOE_LAYERS, 8, 2), sample(MS_MAX_MOE_LAYERS + 1, 8, 2),
           sample(1, 1024, MS_MAX_TOP_K + 1));
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_c_core_returns_an_error_code_past_its_limits(tmp_path):
    """Past MS_MAX_MOE_LAYERS / MS_MAX_TOP_K the C entry points return MS_ERR_BAD_SIZE / MS_ERR_BAD_ROUTING
    (the stack arrays they size are never overrun), for callers that bypass the Python glue."""
    cc = shutil.which("cc") or shutil.which("gcc")
    src = tmp_path / "limits.c"
    src.write_text(C_LIMITS)
    exe = tmp_path / "limits"
    sources = [str(p) for p in sorted(CSRC.glob("*.c"))]
    subprocess.run([cc, "-std=c99", "-O1", "-I", str(CSRC), str(src), *sources, "-lm", "-o", str(exe)], check=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert lines[0].split() == ["0", str(codes.ERR_BAD_SIZE), str(codes.ERR_BAD_SIZE), str(codes.ERR_BAD_ROUTING)]
    assert lines[1].split() == ["0", str(codes.ERR_BAD_SIZE), str(codes.ERR_BAD_ROUTING)]


def test_dense_layer_naming_a_missing_routing_row_is_an_error_not_a_crash():
    """The kernel re-checks what could crash it: a layer without routed experts whose moe_index names a
    routing row past the table (the Monte Carlo path resets one cache per named row)."""
    dm, hw, rt = tables(L=2)
    bad = dict(dm, expert_mode=np.array([codes.EXP_NONE, codes.EXP_FETCH], np.int32),
               moe_index=np.array([7, 1], np.int32))
    with pytest.raises(KernelError, match="routing"):
        KD.run(bad, hw, rt, cols())


# ------------------------------------------------------------------------------- sealed tables
def test_sealed_tables_give_the_same_results_as_plain_ones():
    dm, hw, rt = tables()
    c = {k: np.array(v, dtype=f.kind) for k, v in cols(n=3, mode="analytic").items()
         for f in glue.DECODE_CONFIG_COLUMNS if f.name == k}
    plain = KD.run(dm, hw, rt, c)
    sealed = KD.run(dm, glue.seal("ms_machine_t", hw), rt, glue.seal("ms_decode_config_t[]", c))
    for k in ("step_mean", "by_resource", "hit_rate"):
        assert np.array_equal(plain[k], sealed[k])


def test_a_sealed_table_is_checked_once_and_kept_read_only():
    dm, hw, rt = tables()
    bad = dict(hw)
    del bad["gpu_bw"]
    raises_struct(lambda: glue.seal("ms_machine_t", bad), "ms_machine_t", "gpu_bw", "missing")   # checked when sealed
    c = {k: np.asarray(v) for k, v in cols(n=2).items()}
    s = glue.seal("ms_decode_config_t[]", c)
    c["batch"][:] = 99                      # the caller's arrays stay the caller's: the seal holds copies
    assert s["batch"].tolist() == [2, 2]
    with pytest.raises(ValueError):
        s["batch"][0] = 5                   # and its own are read-only
    with pytest.raises(TypeError):
        s["batch"] = np.ones(2)             # as is the table


def test_a_sealed_table_is_read_as_its_own_struct_only():
    dm, hw, rt = tables()
    s = glue.seal("ms_machine_t", hw)
    raises_struct(lambda: glue.check_columns("ms_decode_config_t[]", s), "ms_decode_config_t[]", "*",
                  "sealed as ms_machine_t")
    c = glue.seal("ms_decode_config_t[]", {k: np.asarray(v) for k, v in cols(n=2).items()})
    raises_struct(lambda: glue.check_columns("ms_decode_config_t[]", c, n=3), "ms_decode_config_t[]", "n",
                  "is 2, expected 3")
