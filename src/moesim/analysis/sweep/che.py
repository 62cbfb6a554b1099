"""The analytic tables of a sweep plan (issue 19): each routing layer's step counts and GPU hit rate (Che's
approximation for LRU) computed once per (routing tables, GPU slots, policy, batch, tokens per step) and
passed to the analytic kernel as its ``che`` / ``che_slots`` config columns
(:func:`moesim.engine.decode.che_table`), instead of being counted and solved again for every prefetch
recall, machine, context, quant and group that shares them; likewise the host page cache's hit rate per
(routing tables, page slots, batch, tokens per step) as the ``page_hit`` / ``page_hit_slots`` columns
(:func:`moesim.engine.decode.page_table`; models paged from storage, whose every placement and machine with
the same page slots shares it). The rows are memoised for the process, and in the persistent lowering
cache for later processes, under a fingerprint of the routing's tables (memoised per routing object in the
plan), so routings lowered separately with equal tables (one per prefetch recall), later sweeps and later
commands share them. Results are those of
the kernel counting each configuration itself: the table holds the values it would compute, by the same
C code."""
from __future__ import annotations

import hashlib

import numpy as np

from ...engine.codes import EXP_CPU, EXP_FETCH, EXP_NONE, EXP_SPLIT, POLICY_LFU, POLICY_LRU, POLICY_STATIC


def fingerprint(plan, rt: dict) -> str:
    """A digest of what ms_che_table reads of routing ``rt`` (q, the stickiness of the LRU chain and the reuse
    statistic, the window tables), memoised per routing object (the plan keeps the object, so its id stays its
    own) and per set of table arrays: each lowering hands out a new dict around the same memoised arrays, so one
    process hashes each set of arrays once."""
    key = ("che_fp", id(rt))
    hit = plan._shared.get(key)
    if hit is not None and hit[0] is rt:
        return hit[1]
    arrays = tuple(rt.get(name) for name in _FP_TABLES)
    akey = tuple(map(id, arrays))
    known = _FP_BY_ARRAYS.get(akey)
    if known is None or any(a is not b for a, b in zip(known[0], arrays)):
        h = hashlib.blake2b(digest_size=16)
        for name, a in zip(_FP_TABLES, arrays):
            h.update(name.encode())
            if a is not None:
                a = np.ascontiguousarray(a, dtype=np.float64)
                h.update(repr(a.shape).encode())
                h.update(a.tobytes())
        if len(_FP_BY_ARRAYS) > 4096:
            _FP_BY_ARRAYS.clear()
        known = _FP_BY_ARRAYS[akey] = (arrays, h.hexdigest())    # the arrays held: their ids stay theirs
    return plan.shared(key, lambda: (rt, known[1]))[1]


# (ids of the _FP_TABLES arrays) -> (those arrays, their digest), for the process
_FP_BY_ARRAYS: dict = {}
_FP_TABLES = ("q", "stickiness", "win_n", "win_lq", "win_m", "win_var", "win_cov")


def sealed_routing(plan, rt: dict):
    """``rt`` checked once for the kernel (engine.glue.seal_routing), memoised per routing object in the plan:
    the analytic calls of every group that shares the routing skip the glue's routing checks."""
    key = ("sealed_routing", id(rt))
    hit = plan._shared.get(key)
    if hit is not None and hit[0] is rt:
        return hit[1]
    return plan.shared(key, lambda: (rt, _sealed_for_process(rt)))[1]


def _sealed_for_process(rt: dict):
    """seal_routing(rt), memoised for the process on rt's items (tables by identity, scalars by value), as
    :func:`fingerprint` is: each plan lowers a new dict around the same memoised routing tables, and sealing
    copies them (megabytes for the window tables), so a later sweep of the same routing reuses the copy."""
    from ...engine.glue import seal_routing
    tables = tuple(v for v in rt.values() if isinstance(v, (np.ndarray, dict)))
    ident = tuple((k, id(v) if isinstance(v, (np.ndarray, dict)) else v) for k, v in rt.items())
    known = _SEALED.get(ident)
    if known is None or any(a is not b for a, b in zip(known[0], tables)):
        if len(_SEALED) > 256:
            _SEALED.clear()
        known = _SEALED[ident] = (tables, seal_routing(rt))       # the tables held: their ids stay theirs
    return known[1]


# (each routing item: key and id or value) -> (the tables, the sealed routing), for the process
_SEALED: dict = {}


def slots_of(dm: dict, policy: int, rt: dict) -> int:
    """The one GPU slot count of a lowered model's MoE layers when the analytic kernel would read a table for
    them (lru, lfu or static; a routing with analytic tables), else -1 (the kernel counts for itself; so do
    layers whose slot counts differ from the first MoE layer's)."""
    if policy not in (POLICY_LRU, POLICY_LFU, POLICY_STATIC) or rt.get("q") is None or not rt.get("n_layers"):
        return -1
    moe = (np.asarray(dm["expert_mode"]) != EXP_NONE) & (np.asarray(dm["moe_index"]) >= 0)
    if not moe.any():
        return -1
    return int(np.asarray(dm["slots"])[moe][0])


# Rows by (routing fingerprint, slots, batch, tokens per step), kept for the process like the lowered routing
# tables they come from (a later sweep of the same routing reads them); cleared past _MAX_BYTES.
_ROWS: dict = {}
_MAX_BYTES = 64 << 20
_bytes = [0]


def _memoised(keys: list, compute, ns: str) -> np.ndarray:
    """The rows of these _ROWS keys stacked, those not there yet read from the persistent lowering cache's
    namespace ``ns`` (keys of routing digests and counts: pure functions of the tables and the kernel, which
    the cache's fingerprint covers) or computed by one ``compute(indices)`` call (an array of their rows in
    that order), and kept."""
    from ... import _lowering_cache
    got = [_ROWS.get(k) for k in keys]
    for i, r in enumerate(got):
        if r is None:
            hit = _lowering_cache.get(ns, keys[i])
            if hit is not None:
                _bytes[0] += hit.nbytes
                got[i] = _ROWS.setdefault(keys[i], hit)
    miss = [i for i, r in enumerate(got) if r is None]
    if miss:
        tab = compute(miss)
        tab.flags.writeable = False
        for k, i in enumerate(miss):
            _lowering_cache.put(ns, keys[i], tab[k].copy())
        if _bytes[0] + tab.nbytes > _MAX_BYTES:
            _ROWS.clear()
            _bytes[0] = 0
        _bytes[0] += tab.nbytes
        for k, i in enumerate(miss):
            got[i] = _ROWS.setdefault(keys[i], tab[k])
    return np.stack(got)


def rows(plan, rt: dict, slots: int, policy: int, batches, tps: int) -> np.ndarray:
    """[len(batches), n_layers, CHE_FIELDS] table rows at ``slots`` slots, ``policy`` and ``tps`` tokens per
    step, each computed once (one kernel call for the rows not yet there)."""
    from ...engine.decode import che_table
    fp = fingerprint(plan, rt)
    steps, warmup = int(plan.run["tokens"]), int(plan.run["warmup"])
    keys = [(fp, int(slots), int(policy), int(b), int(tps), steps, warmup) for b in batches]
    return _memoised(keys, lambda miss: che_table(sealed_routing(plan, rt), np.array([batches[i] for i in miss],
                                                  dtype=np.int64), int(tps), int(slots), int(policy),
                                                  steps=steps, warmup=warmup, n_threads=plan.table_threads), "che_rows")


def page_rows(plan, rt: dict, page_slots: int, batches, tps: int) -> np.ndarray:
    """[len(batches), n_layers] host page-cache hit rates at ``page_slots`` page slots and ``tps`` tokens per
    step (engine.decode.page_table), each computed once for the process like :func:`rows`."""
    from ...engine.decode import page_table
    fp = fingerprint(plan, rt)
    keys = [(fp, "page", int(page_slots), int(b), int(tps)) for b in batches]
    return _memoised(keys, lambda miss: page_table(sealed_routing(plan, rt), np.array([batches[i] for i in miss],
                                                   dtype=np.int64), int(tps), int(page_slots),
                                                   n_threads=plan.table_threads), "page_rows")


def page_slots_of(dm: dict, rt: dict) -> int:
    """The host page-slot count of a lowered model's paged MoE layers (fewer page slots than experts, experts
    read from host memory) when the analytic kernel would read a page table for them (a routing with analytic
    tables), else -1 (layers whose page slots differ from the first paged layer's solve for themselves)."""
    E = rt.get("n_experts")
    ps = np.asarray(dm["page_slots"])
    if rt.get("q") is None or not rt.get("n_layers") or not E or not (ps < E).any():
        return -1
    mode = np.asarray(dm["expert_mode"])
    host = (mode == EXP_CPU) | (mode == EXP_SPLIT) | (mode == EXP_FETCH)
    paged = (ps < E) & host & (np.asarray(dm["moe_index"]) >= 0)
    return int(ps[paged][0]) if paged.any() else -1


def columns(plan, rt: dict, dm: dict, policy: int, batches, tps: int) -> dict:
    """The ``che`` / ``che_slots`` and ``page_hit`` / ``page_hit_slots`` config columns for these batches of
    one lowered model (either pair absent, ``{}`` for both, where the kernel has no table to read); read-only
    arrays, the same ones for every group of the plan that asks."""
    s, ps = slots_of(dm, policy, rt), page_slots_of(dm, rt)
    if s < 0 and ps < 0:
        return {}
    key = ("che_cols", fingerprint(plan, rt), s, ps, int(policy), tuple(int(b) for b in batches), int(tps))
    hit = plan._shared.get(key)
    if hit is None:
        cols = {}
        if s >= 0:
            cols.update(che=rows(plan, rt, s, policy, batches, tps), che_slots=np.full(len(batches), s, dtype=np.int32))
        if ps >= 0:
            cols.update(page_hit=page_rows(plan, rt, ps, batches, tps),
                        page_hit_slots=np.full(len(batches), ps, dtype=np.int32))
        for v in cols.values():
            v.flags.writeable = False
        hit = plan.shared(key, lambda: cols)
    return hit
