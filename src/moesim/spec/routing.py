"""Routing profiles: the parameters of the generative model of expert choice (``catalog/routing.toml``)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace

import numpy as np

from .. import _catalog
from ..errors import MoesimError, unknown_id


N_SCENARIOS = 4   # request draws averaged by the analytic path when profiles have per-request skew


@dataclass(frozen=True)
class RoutingProfile:
    id: str
    zipf_s: float
    jitter: float
    concentration: float
    stickiness: float
    first_stickiness: float
    last_stickiness: float
    request_tokens: int
    recall: float
    source: str = ""

    def layer_stickiness(self, n_layers: int) -> np.ndarray:
        p = np.full(n_layers, float(self.stickiness))
        if n_layers > 1:
            p[-1] = self.last_stickiness
        p[0] = self.first_stickiness
        return p


def _table() -> dict:
    return _catalog.load("routing")


def profile_ids() -> list:
    return sorted(_table()["profiles"])


def profile(id_or_profile=None, family: str | None = None, **overrides) -> RoutingProfile:
    """A profile by id, or the one the model family uses; keyword arguments override fields."""
    if isinstance(id_or_profile, RoutingProfile):
        base = id_or_profile
    else:
        t = _table()
        key = id_or_profile
        if key is None:
            key = t["families"].get(family or "", "generic")
        key = str(key).strip().lower()
        if key not in t["profiles"]:
            raise unknown_id("routing profile", key, t["profiles"], "routing")
        base = _catalog_profile(key)
        if not overrides:
            return base                  # checked when built
    if overrides:
        base = replace(base, **overrides)
    _check(base)
    return base


@functools.lru_cache(maxsize=None)
def _catalog_profile(key: str) -> RoutingProfile:
    """The catalog's profile *key* (its defaults filled in), built and checked once per process."""
    t = _table()
    entry = dict(t["defaults"])
    entry.update(t["profiles"][key])
    names = {f.name for f in fields(RoutingProfile)}
    p = RoutingProfile(id=key, **{k: v for k, v in entry.items() if k in names and k != "id"})
    _check(p)
    return p


def _check(p: RoutingProfile) -> None:
    for name in ("zipf_s", "jitter", "concentration"):
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise MoesimError(f"must be a finite number >= 0, got {v!r}", name)
    if p.jitter >= 1:
        raise MoesimError(f"must be < 1, got {p.jitter}", "jitter")
    for name in ("stickiness", "first_stickiness", "last_stickiness", "recall"):
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or not (0.0 <= v <= 1.0):
            raise MoesimError(f"must be a probability in [0, 1], got {v!r}", name)
    if isinstance(p.request_tokens, bool) or not isinstance(p.request_tokens, int) or p.request_tokens < 0:
        raise MoesimError(f"must be an integer >= 0, got {p.request_tokens!r}", "request_tokens")
