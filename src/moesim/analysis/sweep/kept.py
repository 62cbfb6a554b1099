"""Lowered tables a sweep keeps for the process, not only for its plan (issue 19): a decode model lowered for a
(model, quant, runtime, GPU count, placement candidate, lowering key), its zeroed and paged forms, the prefill
terms and kind table read from it, a machine's sealed rates. Each depends on its inputs alone, so a later sweep
(a server's or a notebook's next grid) that lowers the same inputs gets the same objects instead of lowering,
sealing and packing them again; the results computed from them (prefill seconds, decode rows) stay per plan.

A key holds the ids of the objects it was built from (a lowered model, a routing, a machine, the process's one
object per runtime value) and the entry holds those objects: while an entry lives, no other object can take one
of its ids. The plan makes its runtime profiles the process's one object per value (:func:`runtime`), so their ids
are stable keys; a routing, a new dict per plan around the lowering's memoised arrays, is keyed by those arrays'
ids and its scalars (:func:`routing_key`)."""
from __future__ import annotations

import numpy as np

_KEPT: dict = {}
# bounded by entries like the other process memos (cleared whole when full): the 59-machine website grid keeps
# ~160k; a process that sweeps more only lowers again
_MAX_KEPT = 1 << 18


def kept(key: tuple, build, *holds):
    """``build()``, kept for the process under ``key``; ``holds``: the objects whose ids ``key`` holds, kept
    alive with the value so their ids stay theirs. A race builds equal values twice; one is kept."""
    hit = _KEPT.get(key)
    if hit is None:
        if len(_KEPT) >= _MAX_KEPT:
            _KEPT.clear()
        hit = _KEPT.setdefault(key, (build(), holds))
    return hit[0]


def runtime(rt):
    """The process's one object equal to runtime profile ``rt`` (a frozen dataclass, equal by value), so that
    lowered tables keyed on a runtime's id are found again by a later plan's equal profile."""
    return _RUNTIMES.setdefault(rt, rt)


_RUNTIMES: dict = {}         # a handful of profiles per process (runtime x ubatch x parallel layout)


def routing_key(plan, rt: dict) -> tuple:
    """Routing ``rt`` as a key: its scalars by value, its tables by identity (each plan lowers a new dict around
    the same memoised arrays, as sweep.che's sealed routing notes), computed once per routing object of the plan.
    A kept entry under this key holds ``rt``, and with it the arrays whose ids the key holds."""
    key = ("routing_key", id(rt))
    hit = plan._shared.get(key)
    if hit is None or hit[0] is not rt:
        hit = plan.shared(key, lambda: (rt, tuple((k, ("id", id(v)) if isinstance(v, (np.ndarray, dict)) else v)
                                                  for k, v in rt.items())))
    return hit[1]


def clear() -> None:
    """Forget the kept tables (tests that count lowering calls per sweep start from none)."""
    _KEPT.clear()
