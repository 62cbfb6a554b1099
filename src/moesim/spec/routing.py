"""Routing profiles: the parameters of the generative model of expert choice (``catalog/routing.toml``)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace

import numpy as np

from .. import _catalog
from ..errors import MoesimError, unknown_id


N_SCENARIOS = 16  # request draws averaged by the analytic path when profiles have per-request skew
PHASES = ("prefill", "decode")
# fields a prefill regime may set (the routing model's; not the request length, recall or provenance)
REGIME_FIELDS = ("zipf_s", "jitter", "concentration", "stickiness", "first_stickiness", "last_stickiness",
                 "layer_zipf_s", "layer_stickiness_fit", "layer_recency", "layer_coupling", "recency_decay",
                 "recency_power", "history", "n_partners")


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
    # Fitted per-layer shapes (by relative depth, resampled to a model's MoE layer count; empty = the
    # scalar fields above): Zipf exponent, stickiness, recency copy probability, cross-layer follow probability.
    layer_zipf_s: tuple = ()
    layer_stickiness_fit: tuple = ()
    layer_recency: tuple = ()
    layer_coupling: tuple = ()
    recency_decay: float = 0.9     # geometric recency kernel over lags 2 .. history + 1
    recency_power: float = 0.0     # times d^-power (0: purely geometric; > 0 a power-law kernel)
    history: int = 32
    n_partners: int = 0            # next-layer partners per expert (0 = top-k)
    # The prefill regime: ((field, value), ...) that prompt tokens route by instead (a prompt-fitted skew);
    # empty = prompt tokens route as decode tokens. Prefill costing (the expert union of a ubatch) reads it.
    prefill: tuple = ()
    fitted_phase: str = ""         # the tokens the decode fields were fitted to: "decode", "prompt", "" (presets)
    # The workload mix: the per-workload profiles this one pools, and each statistic's range across
    # their real traces ((statistic, min, max), ...).
    workloads: tuple = ()
    spread: tuple = ()

    def layer_stickiness(self, n_layers: int) -> np.ndarray:
        if self.layer_stickiness_fit:
            return per_layer(self.layer_stickiness_fit, n_layers)
        p = np.full(n_layers, float(self.stickiness))
        if n_layers > 1:
            p[-1] = self.last_stickiness
        p[0] = self.first_stickiness
        return p

    def regime(self, phase: str) -> "RoutingProfile":
        """The profile prompt tokens ("prefill") or generated tokens ("decode") route by."""
        if phase not in PHASES:
            raise MoesimError(f"must be one of {', '.join(PHASES)}, got {phase!r}", "phase")
        if phase == "decode" or not self.prefill:
            return self
        return replace(self, id=f"{self.id}/prefill", prefill=(), **dict(self.prefill))

    def spread_dict(self) -> dict:
        """{statistic: (min, max)} across the profile's workloads."""
        return {name: (lo, hi) for name, lo, hi in self.spread}

    def recency_tables(self, n_layers: int):
        """(per-layer copy probability [n_layers], lag distribution [history] over lags d = 2 .. history + 1,
        proportional to recency_decay^(d - 2) d^-recency_power), or None without multi-lag memory."""
        if not self.layer_recency or not any(self.layer_recency):
            return None
        d = self.recency_decay ** np.arange(self.history)
        if self.recency_power:
            d = d * (np.arange(self.history) + 2.0) ** -float(self.recency_power)
        return per_layer(self.layer_recency, n_layers), d / d.sum()


def per_layer(values, n_layers: int) -> np.ndarray:
    """A per-layer shape fitted on len(values) layers, linearly resampled by relative depth to n_layers."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == n_layers:
        return v.copy()
    if len(v) == 1:
        return np.full(n_layers, v[0])
    return np.interp(np.linspace(0.0, 1.0, n_layers), np.linspace(0.0, 1.0, len(v)), v)


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
        base = replace(base, **{k: _frozen(k, v) for k, v in overrides.items()})
    _check(base)
    return base


@functools.lru_cache(maxsize=None)
def _catalog_profile(key: str) -> RoutingProfile:
    """The catalog's profile *key* (its defaults filled in), built and checked once per process."""
    t = _table()
    entry = dict(t["defaults"])
    entry.update(t["profiles"][key])
    names = {f.name for f in fields(RoutingProfile)}
    p = RoutingProfile(id=key, **{k: _frozen(k, v) for k, v in entry.items() if k in names and k != "id"})
    _check(p)
    return p


def _frozen(name: str, v):
    """A catalog or keyword value as the frozen field holds it: lists as tuples, the prefill table as
    sorted (field, value) pairs, the spread table as (statistic, min, max) triples."""
    if name == "prefill" and isinstance(v, dict):
        return tuple(sorted((str(k), _frozen(k, x)) for k, x in v.items()))
    if name == "spread" and isinstance(v, dict):
        try:
            return tuple(sorted((str(k), float(x[0]), float(x[1])) for k, x in v.items()))
        except (TypeError, ValueError, IndexError, KeyError):
            raise MoesimError("each statistic's spread must be [min, max]", "spread") from None
    return tuple(v) if isinstance(v, list) else v


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
    for name in ("layer_zipf_s", "layer_stickiness_fit", "layer_recency", "layer_coupling"):
        v = getattr(p, name)
        if not isinstance(v, tuple) or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in v):
            raise MoesimError(f"must be a list of finite numbers >= 0, got {v!r}", name)
    for name in ("layer_stickiness_fit", "layer_recency", "layer_coupling"):
        if any(x > 1 for x in getattr(p, name)):
            raise MoesimError("must hold probabilities in [0, 1]", name)
    if not (isinstance(p.recency_decay, (int, float)) and 0 < p.recency_decay <= 1):
        raise MoesimError(f"must be in (0, 1], got {p.recency_decay!r}", "recency_decay")
    if not (isinstance(p.recency_power, (int, float)) and math.isfinite(p.recency_power) and 0 <= p.recency_power <= 8):
        raise MoesimError(f"must be a number in [0, 8], got {p.recency_power!r}", "recency_power")
    for name, hi in (("history", 256), ("n_partners", 64)):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or not (name == "n_partners" or v >= 1) or v < 0 or v > hi:
            raise MoesimError(f"must be an integer in [{0 if name == 'n_partners' else 1}, {hi}], got {v!r}", name)
    if isinstance(p.request_tokens, bool) or not isinstance(p.request_tokens, int) or p.request_tokens < 0:
        raise MoesimError(f"must be an integer >= 0, got {p.request_tokens!r}", "request_tokens")
    _check_mix(p)


def _check_mix(p: RoutingProfile) -> None:
    """The prefill regime (known fields, itself a valid profile), the fitted phase, workloads and spread."""
    if not isinstance(p.prefill, tuple) or not all(isinstance(x, tuple) and len(x) == 2 for x in p.prefill):
        raise MoesimError("must be a table of routing fields", "prefill")
    for name, _v in p.prefill:
        if name not in REGIME_FIELDS:
            raise MoesimError(f"a prefill regime sets {', '.join(REGIME_FIELDS)}; got {name!r}", f"prefill.{name}")
    if p.prefill:
        try:
            _check(p.regime("prefill"))
        except MoesimError as exc:
            raise MoesimError(str(exc).split(": ", 1)[-1], f"prefill.{exc.field}" if getattr(exc, "field", None)
                              else "prefill") from None
    if p.fitted_phase not in ("", "decode", "prompt"):
        raise MoesimError(f"must be 'decode', 'prompt' or empty, got {p.fitted_phase!r}", "fitted_phase")
    if not isinstance(p.workloads, tuple) or not all(isinstance(w, str) for w in p.workloads):
        raise MoesimError("must be a list of profile ids", "workloads")
    for name, lo, hi in p.spread:
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise MoesimError(f"{name}: must be [min, max] with min <= max, got [{lo}, {hi}]", f"spread.{name}")
