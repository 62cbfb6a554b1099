"""Boundary checks shared by every entry point: counts, sizes and ranges, each error naming its field."""
from __future__ import annotations

import math

import numpy as np

from ..errors import MoesimError


# --------------------------------------------------------------------------------- validation
def check_count(value, name: str, minimum: int = 1) -> int:
    """A whole number >= minimum, or a MoesimError naming the field (bools, NaN and floats refused)."""
    if isinstance(value, bool) or value is None:
        raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or int(value) != value:
            raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name)
        value = int(value)
    try:
        iv = int(value)
    except (TypeError, ValueError):
        raise MoesimError(f"must be an integer >= {minimum}, got {value!r}", name) from None
    if iv < minimum:
        raise MoesimError(f"must be >= {minimum}, got {iv}", name)
    if iv > 2**40:
        raise MoesimError(f"is implausibly large ({iv})", name)
    return iv
