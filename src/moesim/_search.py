"""Bisection for the largest argument at which a monotone (true-then-false) predicate holds."""
from __future__ import annotations


def largest_true(pred, lo: int, hi: int) -> int | None:
    """Largest x in [lo, hi] with pred(x), for pred true up to some point and false after; None if none."""
    if not pred(lo):
        return None
    if pred(hi):
        return hi
    while hi - lo > 1:  # invariant: pred(lo) and not pred(hi)
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo
