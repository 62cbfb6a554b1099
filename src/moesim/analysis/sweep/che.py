"""The analytic LRU hit-rate tables of a sweep plan (issue 19): Che's approximation solved once per (routing
tables, GPU slots, batch, tokens per step) and passed to the analytic kernel as its ``che`` / ``che_slots``
config columns (:func:`moesim.engine.decode.che_table`), instead of being solved again for every prefetch
recall, machine, context, quant and group that shares them. The rows are memoised in the plan
(:meth:`.plan.Plan.shared`) under a fingerprint of the routing's tables, so routings lowered separately
with equal tables (one per prefetch recall) share them. Results are those of the kernel solving each
configuration itself: the table holds the values it would compute, by the same C code."""
from __future__ import annotations

import hashlib

import numpy as np

from ...engine.codes import EXP_FETCH, POLICY_LRU


def _fingerprint(plan, rt: dict) -> str:
    """A digest of what ms_che_table reads of routing ``rt`` (q, the window tables), memoised per routing
    object (the plan keeps the object, so its id stays its own)."""
    key = ("che_fp", id(rt))
    hit = plan._shared.get(key)
    if hit is not None and hit[0] is rt:
        return hit[1]
    h = hashlib.blake2b(digest_size=16)
    for name in ("q", "win_n", "win_lq"):
        a = rt.get(name)
        h.update(name.encode())
        if a is not None:
            a = np.ascontiguousarray(a, dtype=np.float64)
            h.update(repr(a.shape).encode())
            h.update(a.tobytes())
    return plan.shared(key, lambda: (rt, h.hexdigest()))[1]


def slots_of(dm: dict, policy: int, rt: dict) -> int:
    """The one GPU slot count of a lowered model's FETCH layers when the analytic kernel would solve Che
    for them (LRU, a routing with analytic tables), else -1 (no table: the kernel solves, or nothing to
    solve; per-layer slot counts that differ are solved in the kernel too)."""
    if policy != POLICY_LRU or rt.get("q") is None or not rt.get("n_layers"):
        return -1
    mode = np.asarray(dm["expert_mode"])
    fetch = mode == EXP_FETCH
    if not fetch.any():
        return -1
    s = np.asarray(dm["slots"])[fetch]
    return int(s[0]) if (s == s[0]).all() else -1


def rows(plan, rt: dict, slots: int, batches, tps: int) -> np.ndarray:
    """[len(batches), n_layers] LRU hit rates at ``slots`` slots and ``tps`` tokens per step, each row
    computed once per plan (one kernel call for the rows not yet there)."""
    from ...engine.decode import che_table
    fp = _fingerprint(plan, rt)
    keys = [("che", fp, int(slots), int(b), int(tps)) for b in batches]
    got = [plan._shared.get(k) for k in keys]
    miss = [i for i, r in enumerate(got) if r is None]
    if miss:
        tab = che_table(rt, np.array([batches[i] for i in miss], dtype=np.int64), int(tps), int(slots), POLICY_LRU)
        tab.flags.writeable = False
        for k, i in enumerate(miss):
            got[i] = plan.shared(keys[i], lambda k=k: tab[k])
    return np.stack(got) if got else np.zeros((0, int(rt["n_layers"])))


def columns(plan, rt: dict, dm: dict, policy: int, batches, tps: int) -> dict:
    """The ``che`` / ``che_slots`` config columns for these batches of one lowered model (``{}`` where the
    kernel has no LRU table to read)."""
    s = slots_of(dm, policy, rt)
    if s < 0:
        return {}
    return dict(che=rows(plan, rt, s, batches, tps), che_slots=np.full(len(batches), s, dtype=np.int32))
