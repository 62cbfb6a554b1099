"""What every result satisfies: the one set of internal-consistency checks that ``fit``, ``simulate``,
``validate`` and the sweep (before each chunk is written) apply to what they return.

Every number is finite; bytes are >= 0; each tier's classes sum to its total and the tiers to weights +
KV cache + state + buffers; ``fits`` is what the fits rule (csrc/ms_internal.h ``ms_fits_rule``) says of
the bytes per tier against the capacities; a configuration that fits has max_context >= its context
(up to the model's maximum) and max_batch >= its batch, and a positive, finite tok/s; simulate's
breakdowns sum to seconds per token, p99 >= p50 > 0, hit rates lie in [0, 1].

A failure is a moesim bug, not bad input: :class:`InconsistentResult` (a :class:`~moesim.MoesimError`,
so the CLI prints its one-line form) names the output field and the values that disagree.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from ..errors import MoesimError
from ..spec.limits import ARCH_BOUNDS


# Relative tolerance of every sum and comparison: float64 sums of a few dozen terms agree to ~1e-15;
# a real error (a class counted twice, a tier left out) is many orders of magnitude larger.
REL = 1e-9
_ABS_BYTES = 1e-6           # bytes: two sums that are both (nearly) zero agree
_TIERS = ("gpu", "host", "storage")
_WEIGHT_CLASSES = ("attention", "router", "shared_experts", "routed_experts", "dense_ffn", "embeddings", "lm_head",
                   "mtp")


class InconsistentResult(MoesimError):
    """A result that breaks one of the guarantees above (a moesim bug; the field is the output field)."""


def fail(field: str, what: str) -> InconsistentResult:
    """The error for an inconsistent output *field*; *what* names the quantities and their values."""
    return InconsistentResult(f"inconsistent result: {what}. This is a moesim bug: please report it with the "
                              "command or call that produced it", field)


def _close(a: float, b: float, scale: float = 1.0) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b)) + _ABS_BYTES * scale


# ------------------------------------------------------------------------------- every number
def check_finite(obj, field: str = "result") -> None:
    """Every number in a (nested) dict / list / tuple is finite (None means "does not apply")."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_finite(v, f"{field}.{k}" if field else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_finite(v, f"{field}[{i}]")
    elif isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
        raise fail(field, f"{field} is {obj!r}, not a finite number")


def _nonneg(value, field: str) -> float:
    if value is None or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise fail(field, f"{field} is {value!r}, expected a finite number >= 0")
    return float(value)


def _positive(value, field: str) -> float:
    if value is None or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise fail(field, f"{field} is {value!r}, expected a finite number > 0")
    return float(value)


def _fraction(value, field: str) -> None:
    if value is not None and not (0.0 <= value <= 1.0):
        raise fail(field, f"{field} is {value!r}, expected None or a number in [0, 1]")


# ------------------------------------------------------------------------------- memory record
def capacities(cfg: dict) -> dict:
    """The capacities the fits rule compares against, from a memory configuration (``configure``). The GPUs
    fit when the busiest one's bytes (each class's GPU bytes over its ``gpu_ways``) are within one GPU's
    ``gpu_one``; on the GPU tier's total that means: it fits only if the total is within ``gpu`` (largest
    ways x one GPU), and surely fits if within ``gpu_sure`` (smallest ways x one GPU). On one GPU, or a
    layer split, the two are the same: the pooled capacity."""
    one = float(cfg["gpu_capacity"])
    ways = [float(w) for w in cfg["gpu_ways"]] if int(cfg["n_gpus"]) > 0 else [0.0]
    return {"gpu": max(ways) * one, "gpu_sure": min(ways) * one, "gpu_one": one,
            "host": float(cfg["host_capacity"]), "storage": float(cfg["storage_capacity"]),
            "storage_spill": bool(cfg["storage_spill"]), "n_gpus": int(cfg["n_gpus"])}


def _tiers(rec: dict) -> dict:
    """The record's tiers under their kernel names (a unified machine's GPU-visible share is "gpu")."""
    t = rec["memory_by_tier"]
    out = {"gpu": t.get("gpu") or t.get("unified") or {"total": 0.0, "by_class": {}}}
    for name in ("host", "storage"):
        out[name] = t[name]
    return out


def _fits_tiers(fits: str) -> set:
    if fits == "no":
        return set()
    names = {"gpu" if f == "unified" else f for f in fits.split("+")}
    if not names <= set(_TIERS):
        raise fail("fits", f"fits is {fits!r}, expected 'no' or tiers joined by '+'")
    return names


def _check_sums(rec: dict, tiers: dict) -> None:
    """Each tier's classes sum to its total; the tiers to weights + KV + state + buffers; the weight
    classes to weights_bytes; the KV and state classes to kv_bytes and state_bytes."""
    per_class: dict = {}
    total = 0.0
    for name, t in tiers.items():
        tot = _nonneg(t["total"], f"memory_by_tier.{name}.total")
        parts = sum(_nonneg(v, f"memory_by_tier.{name}.by_class.{c}") for c, v in t["by_class"].items())
        if not _close(parts, tot):
            raise fail(f"memory_by_tier.{name}", f"the {name} tier's classes sum to {parts!r} bytes, its total "
                       f"is {tot!r}")
        for c, v in t["by_class"].items():
            per_class[c] = per_class.get(c, 0.0) + v
        total += tot
    weights = _nonneg(rec["weights_bytes"], "weights_bytes")
    by_w = sum(_nonneg(v, f"weights_bytes_by_class.{c}") for c, v in rec["weights_bytes_by_class"].items())
    if not _close(by_w, weights):
        raise fail("weights_bytes_by_class", f"the weight classes sum to {by_w!r} bytes, weights_bytes is {weights!r}")
    in_tiers = sum(per_class.get(c, 0.0) for c in _WEIGHT_CLASSES)
    if not _close(in_tiers, weights):
        raise fail("memory_by_tier", f"the tiers hold {in_tiers!r} bytes of weights, weights_bytes is {weights!r}")
    for cls, key in (("kv_cache", "kv_bytes"), ("state", "state_bytes")):
        v = _nonneg(rec[key], key)
        if not _close(per_class.get(cls, 0.0), v):
            raise fail(key, f"the tiers hold {per_class.get(cls, 0.0)!r} bytes of {cls}, {key} is {v!r}")
    expect = weights + rec["kv_bytes"] + rec["state_bytes"] + per_class.get("buffers", 0.0)
    if not _close(total, expect):
        raise fail("memory_by_tier", f"the tiers total {total!r} bytes, weights + KV + state + buffers is {expect!r}")
    _nonneg(rec["kv_bytes_per_token"], "kv_bytes_per_token")


def _check_fits(fits: str, tiers: dict, caps: dict) -> set:
    """``fits`` against the bytes per tier and the capacities (ms_fits_rule)."""
    names = _fits_tiers(fits)
    gpu, host, storage = (tiers[t]["total"] for t in _TIERS)
    within = gpu <= caps["gpu"] * (1 + REL) and host <= caps["host"] * (1 + REL)
    over = gpu > caps["gpu_sure"] * (1 - REL) + _ABS_BYTES or host > caps["host"] * (1 - REL) + _ABS_BYTES
    desc = (f"GPU {gpu!r} of {caps['gpu']!r} bytes, host {host!r} of {caps['host']!r}, storage {storage!r} of "
            f"{caps['storage']!r}")
    if names and not within:
        raise fail("fits", f"fits is {fits!r} but the bytes exceed a capacity ({desc})")
    if not names and not over:
        raise fail("fits", f"fits is 'no' but every tier is within its capacity ({desc})")
    if storage > caps["storage"] * (1 + REL) + _ABS_BYTES or (storage > 0 and not caps["storage_spill"]):
        raise fail("memory_by_tier.storage", f"{storage!r} bytes paged from storage, with storage_capacity "
                   f"{caps['storage']!r} and paging {'on' if caps['storage_spill'] else 'off'}")
    if names:
        # host: anything there but its buffers (or nothing placed anywhere else)
        placed = host - tiers["host"]["by_class"].get("buffers", 0.0)
        on_host = placed > REL * host + _ABS_BYTES or (gpu <= 0 and storage <= 0)
        off_host = placed <= 0 and not (gpu <= 0 and storage <= 0)
        if ("gpu" in names) != (gpu > 0 and caps["n_gpus"] > 0) or ("storage" in names) != (storage > 0) \
                or (on_host and "host" not in names) or (off_host and "host" in names):
            raise fail("fits", f"fits is {fits!r} but the tiers in use are GPU {gpu!r}, host {placed!r} (besides its "
                       f"buffers), storage {storage!r} bytes")
    return names


def check_record(rec: dict, caps: dict, model_max: int, beyond_ok: bool = False) -> dict:
    """A fit record (``records.record``; simulate's and validate's memory view too) is consistent:
    finite, bytes >= 0 and summing, ``fits`` agreeing with the capacities (:func:`capacities`),
    max_context and max_batch covering a configuration that fits, tok/s present exactly when it fits.
    *model_max*: the model's trained maximum context; *beyond_ok*: the entry point allowed a context
    beyond it. Returns *rec*."""
    check_finite({k: v for k, v in rec.items() if k not in ("flags", "assumptions")}, "")
    tiers = _tiers(rec)
    _check_sums(rec, tiers)
    names = _check_fits(rec["fits"], tiers, caps)
    context, batch = int(rec["context"]), int(rec["batch"])
    max_ctx, max_b = int(rec["max_context"]), int(rec["max_batch"])
    bound = ARCH_BOUNDS["max_position_embeddings"] if beyond_ok or model_max <= 0 else model_max
    if not 0 <= max_ctx <= bound:
        raise fail("max_context", f"max_context is {max_ctx:,}, outside [0, {bound:,}]")
    need = min(context, model_max) if model_max > 0 else context
    if names and max_ctx < need:
        raise fail("max_context", f"fits at context {context:,} but max_context is {max_ctx:,}")
    if max_b < 0 or (names and max_b < batch):
        raise fail("max_batch", f"{'fits' if names else 'does not fit'} at batch {batch} but max_batch is {max_b}")
    for key in ("decode_tok_s", "prefill_tok_s"):
        if key not in rec:
            continue
        if names:
            _positive(rec[key], key)
        elif rec[key] is not None:
            raise fail(key, f"{key} is {rec[key]!r} for a configuration that does not fit (expected None)")
    return rec


# ------------------------------------------------------------------------------- simulate
def _check_breakdown(b: dict, decode: float) -> None:
    spt = _positive(b["seconds_per_token"], "breakdown.seconds_per_token")
    for part in ("by_resource", "by_phase"):
        s = sum(_nonneg(v, f"breakdown.{part}.{k}") for k, v in b[part].items())
        if not _close(s, spt, 0.0):
            raise fail(f"breakdown.{part}", f"breakdown.{part} sums to {s!r} s, seconds_per_token is {spt!r}")
    if not _close(spt * decode, 1.0, 0.0):
        raise fail("breakdown.seconds_per_token", f"seconds_per_token {spt!r} is not 1 / decode_tok_s ({decode!r})")


def check_result(res, caps: dict, model_max: int, beyond_ok: bool = False, n_experts: int = 0):
    """A :class:`~moesim.analysis.simulate.Result` is consistent: its memory view (:func:`check_record`),
    every number finite, tok/s > 0 with aggregate = per sequence x batch, TPOT mean = 1000 / tok/s
    and p99 >= p50 > 0, breakdowns summing to seconds per token (its inverse), the bottleneck the
    largest resource, hit rates and reuse in [0, 1], bytes >= 0. Returns *res*."""
    check_record(res.memory, caps, model_max, beyond_ok)
    d = res.to_dict()
    check_finite({k: v for k, v in d.items() if k not in ("flags", "assumptions")}, "")
    dec = _positive(res.decode_tok_s, "decode_tok_s")
    agg = _positive(res.aggregate_tok_s, "aggregate_tok_s")
    if not _close(agg, dec * res.memory["batch"], 0.0):
        raise fail("aggregate_tok_s", f"aggregate_tok_s {agg!r} is not decode_tok_s {dec!r} x batch "
                   f"{res.memory['batch']}")
    _positive(res.prefill_tok_s, "prefill_tok_s")
    _positive(res.ttft_s, "ttft_s")
    t = {k: _positive(res.tpot_ms[k], f"tpot_ms.{k}") for k in ("mean", "p50", "p99")}
    if t["p99"] < t["p50"] * (1 - REL):
        raise fail("tpot_ms", f"tpot_ms p99 {t['p99']!r} is below p50 {t['p50']!r}")
    if not _close(t["mean"] * dec, 1e3, 0.0):
        raise fail("tpot_ms.mean", f"tpot_ms mean {t['mean']!r} is not 1000 / decode_tok_s ({dec!r})")
    _check_breakdown(res.breakdown, dec)
    by_res = res.breakdown["by_resource"]
    if by_res.get(res.bottleneck, -1.0) < max(by_res.values()):
        raise fail("bottleneck", f"bottleneck {res.bottleneck!r} is not the largest resource of {by_res}")
    _fraction(res.expert_hit_rate, "expert_hit_rate")
    _fraction(res.page_cache_hit_rate, "page_cache_hit_rate")
    _fraction(res.reuse, "reuse")
    distinct = _nonneg(res.distinct_experts_per_step, "distinct_experts_per_step")
    if n_experts and distinct > n_experts * (1 + REL):
        raise fail("distinct_experts_per_step", f"{distinct!r} distinct experts per layer of {n_experts}")
    for k, v in res.bytes_per_token.items():
        _nonneg(v, f"bytes_per_token.{k}")
    return res


def check_prediction(decode_tok_s, prefill_tok_s) -> None:
    """validate's predictions: positive and finite."""
    _positive(decode_tok_s, "decode_predicted")
    _positive(prefill_tok_s, "prefill_predicted")


# ------------------------------------------------------------------------------- sweep chunks
def _fits_bits(plan) -> np.ndarray:
    """Fits output code -> fits bits (1 GPU, 2 host, 4 storage), for both label sets (plan.fits_codes)."""
    codes = np.asarray(plan.fits_codes)
    lut = np.zeros(int(codes.max()) + 1, dtype=np.int8)
    for row in codes:
        lut[row] = np.arange(len(row), dtype=np.int8)
    return lut


def _group_limits(grp) -> tuple:
    """(GPU, host, storage capacity the rows may page to, model's max context, GPU total that surely fits)
    of one sweep group (:func:`capacities`: the screen holds rows to the first, the explanation to both)."""
    caps = capacities(grp.mem_tables["cfg"][0])
    return (caps["gpu"], caps["host"], caps["storage"] if caps["storage_spill"] else 0.0, int(grp.low.max_context),
            caps["gpu_sure"])


def _context_bound(plan, mmax):
    """The largest max_context a sweep row may report: the model's, or the plausible bound when the
    sweep keeps contexts beyond it."""
    return ARCH_BOUNDS["max_position_embeddings"] if plan.norm["filter"].get("allow_beyond_max_context") else mmax


def _group_scalars(segments: list) -> tuple:
    """(GPU, host, storage capacity, model's max context): scalars for one group, else one per row."""
    vals = [_group_limits(grp) for _s0, _s1, grp in segments]
    if len(segments) == 1:
        return tuple(np.float64(v) if isinstance(v, float) else np.int64(v) for v in vals[0])
    lens = [s1 - s0 for s0, s1, _ in segments]
    return tuple(np.repeat(np.array(col, dtype=np.int64 if i == 3 else np.float64), lens)
                 for i, col in enumerate(zip(*vals)))


def _rows(cols: dict, segments: list) -> dict:
    """The evaluated rows' columns: views when the segments are adjacent (no skipped group between)."""
    if all(a[1] == b[0] for a, b in zip(segments, segments[1:])):
        lo, hi = segments[0][0], segments[-1][1]
        return {k: v[lo:hi] for k, v in cols.items()}
    idx = np.concatenate([np.arange(s0, s1) for s0, s1, _ in segments])
    return {k: v[idx] for k, v in cols.items()}


_BYTE_COLUMNS = ("gpu_bytes", "host_bytes", "storage_bytes", "weights_bytes", "kv_bytes", "state_bytes")
_SCRATCH = threading.local()
_MAX_BATCH = 1 << 30        # the memory kernel's max_batch search stops there (csrc/ms_memory.c)


def _scratch(n: int) -> tuple:
    """Two float, two bool and two byte work arrays of n rows, kept per thread (chunks reuse them)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None or len(bufs[0]) < n:
        bufs = _SCRATCH.bufs = (np.empty(n), np.empty(n), np.empty(n, dtype=bool), np.empty(n, dtype=bool),
                                np.empty(n, dtype=np.int8), np.empty(n, dtype=np.int8))
    return tuple(b[:n] for b in bufs)


def _screen_fits(r: dict, got: np.ndarray, capg, caph, b0, b1, i1) -> bool:
    """True when fits (*got*: bit 0 fits, 1 the GPU tier named, 2 storage named) could disagree with
    the bytes per tier against the capacities."""
    gpu, storage = r["gpu_bytes"], r["storage_bytes"]
    np.less_equal(gpu, capg, out=b0)
    np.less_equal(r["host_bytes"], caph, out=b1)
    np.logical_and(b0, b1, out=b0)            # within every capacity: fits
    np.greater(gpu, 0.0, out=b1)
    np.logical_and(b1, b0, out=b1)
    if np.ndim(capg):
        np.logical_and(b1, capg > 0, out=b1)
    elif not capg > 0:
        b1[:] = False
    v1 = b1.view(np.int8)                     # byte adds only (AVX2 has no byte shifts or multiplies)
    np.add(v1, v1, out=i1)
    np.add(i1, b0.view(np.int8), out=i1)
    np.greater(storage, 0.0, out=b1)
    np.logical_and(b1, b0, out=b1)
    np.add(v1, v1, out=v1)
    np.add(v1, v1, out=v1)
    np.add(i1, v1, out=i1)
    return bool(np.not_equal(got, i1, out=b0).any())


def _exceeds(col: np.ndarray, bound, work: np.ndarray) -> bool:
    """Any row of *col* above *bound* (a float scalar: one reduction; else a comparison)."""
    if np.ndim(bound) == 0 and col.dtype.kind == "f":
        return bool(col.max() > bound)
    return bool(np.greater(col, bound, out=work).any())


def _screen_lut(plan) -> np.ndarray:
    bits = _fits_bits(plan)
    return ((bits != 0) | ((bits & 1) << 1) | (bits & 4)).astype(np.int8)


def check_chunk(plan, cols: dict, segments: list, threads: int = 1, engine: str = "c") -> None:
    """The sweep's rows ``cols[k][s0:s1]`` of each evaluated group ``(s0, s1, group)`` in *segments* (the
    group, or anything with its ``mem_tables["cfg"]``, ``low`` and ``kv_bytes_per_token``: a sweep passes
    its ``sweep.group.ChunkFacts``) satisfy the record guarantees: bytes finite and >= 0, tiers >= weights + KV +
    state, fits against the capacities (GPU and storage tiers included), max_context and max_batch covering what fits,
    decode figures finite and > 0 with aggregate = per sequence x batch and TPOT = 1000 / tok/s,
    p99 >= p50, hit rate NaN (does not apply) or in [0, 1].

    A screen of exact comparisons, one pass in C on up to *threads* threads (``ms_sweep_screen``;
    *engine* "python": its numpy
    twin :func:`_screen`); only a flagged chunk pays for the row-by-row explanation
    (:func:`_explain_chunk`), which raises naming the first bad row."""
    if not segments:
        return
    with np.errstate(all="ignore"):
        flag = not all(g.kv_bytes_per_token >= 0 and math.isfinite(g.kv_bytes_per_token) for _a, _b, g in segments)
        if not flag:
            flag = _screen_c(plan, cols, segments, threads) if engine == "c" else \
                _screen(plan, _rows(cols, segments), _group_scalars(segments))
        if flag:
            _explain_chunk(plan, _rows(cols, segments), _group_scalars(segments))


def _screen_c(plan, cols: dict, segments: list, threads: int = 1) -> bool:
    """ms_sweep_screen over the segments' rows: True when one could break a guarantee."""
    from ..engine import _kernel
    from ..engine.glue import handle_library_error
    segs = []
    for s0, s1, grp in segments:
        capg, caph, scap, mmax, _sure = _group_limits(grp)
        segs.append((s0, s1, capg, caph, scap, mmax, _context_bound(plan, mmax)))
    code, first = _kernel.sweep_screen(cols, segs, _screen_lut(plan), REL, _MAX_BATCH, int(threads))
    handle_library_error(code, "ms_sweep_screen")
    return first >= 0


def _screen(plan, r: dict, scalars: tuple) -> bool:
    """True when some row could break a guarantee (exact comparisons: a row at a tolerance boundary is
    flagged, and the explanation, with tolerances, decides)."""
    n = len(r["context"])
    capg, caph, scap, mmax, _sure = scalars
    f0, f1, b0, b1, i0, i1 = _scratch(n)
    np.add(r["gpu_bytes"], r["host_bytes"], out=f0)
    np.add(f0, r["storage_bytes"], out=f0)
    np.add(r["weights_bytes"], r["kv_bytes"], out=f1)
    np.add(f1, r["state_bytes"], out=f1)
    # every byte count >= 0 (NaN fails the comparison) and their sums finite: each is finite
    flag = not (min(r[k].min() for k in _BYTE_COLUMNS) >= 0 and math.isfinite(f0.sum() + f1.sum()))
    flag = flag or bool(np.less(f0, f1, out=b0).any()) or _exceeds(r["storage_bytes"], scap, b0)
    np.take(_screen_lut(plan), r["fits"], out=i0)
    flag = flag or _screen_fits(r, i0, capg, caph, b0, b1, i1)
    np.bitwise_and(i0, np.int8(1), out=i0)
    fits = i0.view(bool)
    mc, mb, ctx = r["max_context"], r["max_batch"], r["context"]
    bound = _context_bound(plan, mmax)
    # as unsigned, a negative count is huge: one comparison bounds each column on both sides
    flag = flag or _exceeds(mc.view(np.uint64), np.asarray(bound).astype(np.uint64), b0) \
        or bool(np.greater(mb.view(np.uint64), np.uint64(_MAX_BATCH), out=b0).any())
    need = ctx if np.ndim(mmax) == 0 and int(plan.contexts.max()) <= mmax else np.minimum(ctx, mmax)
    np.less(mc, need, out=b0)
    np.logical_or(b0, np.less(mb, r["batch"], out=b1), out=b0)
    flag = flag or bool(np.logical_and(b0, fits, out=b0).any())
    # decode > 0; TPOT x tok/s = 1000 and aggregate / (tok/s x batch) = 1 (so both finite and > 0)
    dec, pf = r["decode_tok_s"], r["prefill_tok_s"]
    np.multiply(r["tpot_ms"], dec, out=f0)
    np.divide(r["aggregate_tok_s"], dec, out=f1)
    np.divide(f1, r["batch"], out=f1)
    flag = flag or not (dec.min() > 0 and f0.min() >= 1e3 * (1 - REL) and f0.max() <= 1e3 * (1 + REL)
                        and f1.min() >= 1 - REL and f1.max() <= 1 + REL and pf.min() > 0 and math.isfinite(pf.sum()))
    if "tpot_p50_ms" in r:
        p50, p99 = r["tpot_p50_ms"], r["tpot_p99_ms"]
        flag = flag or not (p50.min() > 0 and math.isfinite(p99.sum())) or bool(np.less(p99, p50, out=b0).any())
    hit = r["expert_hit_rate"]
    return flag or bool(np.less(hit, 0.0, out=b0).any()) or bool(np.greater(hit, 1.0, out=b0).any())


def _explain_chunk(plan, r: dict, scalars: tuple) -> None:
    """The rows that break a guarantee, with tolerances, raising for the first (the slow path of
    :func:`check_chunk`, run only when its fast screen flags something)."""
    capg, caph, caps, mmax, sure = scalars
    bits = _fits_bits(plan)[r["fits"]]
    fits = bits != 0
    gpu, host, storage = r["gpu_bytes"], r["host_bytes"], r["storage_bytes"]
    parts = r["weights_bytes"] + r["kv_bytes"] + r["state_bytes"]
    tot = gpu + host + storage
    neg = np.zeros(len(gpu), dtype=bool)
    for k in _BYTE_COLUMNS:
        neg |= ~(r[k] >= 0) | ~np.isfinite(r[k])
    _vec("bytes", neg, r, "a byte count is negative or not finite")
    _vec("kv_bytes_per_token", ~(r["kv_bytes_per_token"] >= 0) | ~np.isfinite(r["kv_bytes_per_token"]), r,
         "kv_bytes_per_token is negative or not finite")
    _vec("gpu_bytes", tot < parts * (1 - REL) - _ABS_BYTES, r, "the tiers hold less than weights + KV + state")
    over = (gpu > capg * (1 + REL)) | (host > caph * (1 + REL))
    under = (gpu <= sure * (1 - REL)) & (host <= caph * (1 - REL))     # per GPU: surely within the busiest
    _vec("fits", np.where(fits, over, under), r, "fits disagrees with the bytes per tier against the capacities")
    _vec("storage_bytes", storage > caps * (1 + REL) + _ABS_BYTES, r, "more paged from storage than it holds")
    _vec("fits", fits & ((((bits & 1) != 0) != ((gpu > 0) & (capg > 0))) | (((bits & 4) != 0) != (storage > 0))),
         r, "fits names other tiers than those in use")
    bound = _context_bound(plan, mmax)
    mc, mb = r["max_context"], r["max_batch"]
    _vec("max_context", (mc < 0) | (mc > bound) | (fits & (mc < np.minimum(r["context"], mmax))), r,
         "max_context does not cover the context that fits, or exceeds the model's maximum")
    _vec("max_batch", (mb < 0) | (mb > _MAX_BATCH) | (fits & (mb < r["batch"])), r, "max_batch does not cover the batch that fits")
    _check_decode_columns(r)


def _check_decode_columns(r: dict) -> None:
    dec = r["decode_tok_s"]
    _vec("decode_tok_s", ~(dec > 0) | ~np.isfinite(dec + r["tpot_ms"] + r["prefill_tok_s"]) | ~(r["prefill_tok_s"] > 0),
         r, "decode_tok_s, tpot_ms or prefill_tok_s is not finite and > 0")
    _vec("aggregate_tok_s", np.abs(r["aggregate_tok_s"] - dec * r["batch"]) > REL * r["aggregate_tok_s"], r,
         "aggregate_tok_s is not decode_tok_s x batch")
    _vec("tpot_ms", np.abs(r["tpot_ms"] * dec - 1e3) > 1e3 * REL, r, "tpot_ms is not 1000 / decode_tok_s")
    if "tpot_p50_ms" in r:
        p50, p99 = r["tpot_p50_ms"], r["tpot_p99_ms"]
        _vec("tpot_p99_ms", ~(p50 > 0) | ~(p99 >= p50 * (1 - REL)) | ~np.isfinite(p99), r,
             "tpot p99 >= p50 > 0 does not hold")
    hit = r["expert_hit_rate"]
    _vec("expert_hit_rate", (hit < 0) | (hit > 1), r, "expert_hit_rate is outside [0, 1]")


_ROW_FIELDS = ("context", "batch", "fits", "gpu_bytes", "host_bytes", "storage_bytes", "weights_bytes", "kv_bytes",
               "state_bytes", "max_context", "max_batch", "decode_tok_s", "aggregate_tok_s", "tpot_ms")


def _vec(field: str, bad: np.ndarray, r: dict, what: str) -> None:
    """Raise for the first True row of *bad*, with the row's values."""
    if not bad.any():
        return
    i = int(np.argmax(bad))
    row = ", ".join(f"{k}={r[k][i]!r}" for k in _ROW_FIELDS if k in r)
    raise fail(field, f"{what} in {int(bad.sum())} sweep row(s); the first: {row}")
