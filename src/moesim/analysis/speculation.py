"""Speculative decoding's arithmetic, shared by simulate, fit, validate and the runtime advice: tokens per
verify step, and the default per-draft acceptance from the measurements in ``catalog/speculation.toml``."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .._catalog import load as _load_catalog
from ..errors import MoesimError


def accepted_per_step(drafts: int, acceptance: float) -> float:
    """Expected tokens per verify step with a chain of ``drafts`` drafts, each accepted with
    probability ``acceptance`` given its predecessor was: 1 + a + a^2 + ... + a^n."""
    return 1.0 + sum(acceptance ** i for i in range(1, drafts + 1))


def acceptance_from_length(drafts: int, accept_length: float) -> float:
    """The per-draft acceptance a with 1 + a + ... + a^drafts = accept_length (bisection; the sum
    grows with a on [0, 1])."""
    if not (1.0 <= accept_length <= drafts + 1):
        raise MoesimError(f"an accept length of {accept_length:g} is impossible with {drafts} drafts", "accept_length")
    return _rate_for(lambda a: accepted_per_step(drafts, a), accept_length)


def _rate_for(length, accept_length: float) -> float:
    """The rate in [0, 1] at which ``length`` (increasing on [0, 1]) reaches ``accept_length`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if length(mid) < accept_length else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Acceptance:
    """A per-draft acceptance and where it came from."""

    rate: float
    source: str
    dataset: str | None = None
    measured_drafts: int | None = None


def _family_table(family: str) -> dict | None:
    return _load_catalog("speculation")["speculation"].get(family)


def datasets(family: str) -> list:
    """The datasets with a measured MTP acceptance for a model family (empty: none is sourced)."""
    t = _family_table(family)
    return sorted({x["dataset"] for x in t["measurements"]}) if t else []


def default_acceptance(family: str, drafts: int, dataset: str | None = None) -> Acceptance:
    """The measured acceptance of *family*'s MTP on *dataset* (default: the family's ``default_dataset``)
    at the draft depth nearest *drafts* (ties to the deeper one), with its source."""
    t = _family_table(family)
    if t is None:
        raise MoesimError(f"no measured MTP acceptance for the {family} family in the catalog: give "
                          "--mtp-acceptance", "mtp_acceptance")
    want = t["default_dataset"] if dataset is None else str(dataset).strip().lower()
    rows = [x for x in t["measurements"] if x["dataset"] == want]
    if not rows:
        raise MoesimError(f"the {family} family has MTP measurements for {', '.join(datasets(family))}, "
                          f"not {dataset!r}", "mtp_dataset")
    best = min(rows, key=lambda x: (abs(x["drafts"] - drafts), -x["drafts"]))
    if "acceptance" in best:
        rate = float(best["acceptance"])
    else:
        rate = acceptance_from_length(int(best["drafts"]), float(best["accept_length"]))
    depth = "" if best["drafts"] == drafts else f" (measured at {best['drafts']} drafts, used for {drafts})"
    how = "" if "acceptance" in best else f", per-draft rate solved from accept length {best['accept_length']:g}"
    source = f"{family} MTP on {want}{depth}{how}: {best['source']}"
    deeper = _deeper_measurement(t, int(best["drafts"]), drafts)
    if deeper is not None:
        # the module is trained one token ahead: reused for later drafts it is accepted less often, at the decay
        # the family's deepest chain measurement shows after a first draft accepted at this dataset's rate
        decay = decay_after_first(rate, int(deeper["drafts"]), float(deeper["accept_length"]))
        length = 1.0 + rate * sum(decay ** i for i in range(drafts))
        rate = acceptance_from_length(drafts, length)
        source += (f"; drafts after the first accepted at {decay:.3f} of their predecessor (solved from accept "
                   f"length {deeper['accept_length']:g} at {deeper['drafts']} drafts, {deeper['dataset']}: "
                   f"{deeper['source']}), i.e. {length:.3f} tokens per step, a chain rate of {rate:.3f}")
    return Acceptance(rate, source, want, int(best["drafts"]))


def _deeper_measurement(t: dict, measured: int, drafts: int) -> dict | None:
    """The family's deepest accept-length measurement, where a run asks for more drafts than its dataset's
    nearest measurement has and that measurement holds more than the first draft."""
    if drafts <= measured:
        return None
    deep = [x for x in t["measurements"] if "accept_length" in x and int(x["drafts"]) >= 2]
    return max(deep, key=lambda x: int(x["drafts"])) if deep else None


def decay_after_first(first: float, drafts: int, accept_length: float) -> float:
    """The acceptance r of every draft after the first (each given its predecessor was accepted) with
    1 + first (1 + r + ... + r^(drafts - 1)) = accept_length (bisection); clipped to [0, 1]."""
    def length(r: float) -> float:
        return 1.0 + first * sum(r ** i for i in range(drafts))
    if length(0.0) >= accept_length:
        return 0.0
    if length(1.0) <= accept_length:
        return 1.0
    return _rate_for(length, accept_length)


def resolve_acceptance(family: str, drafts: int, acceptance=None, dataset: str | None = None) -> Acceptance:
    """The acceptance a run uses: the caller's (checked to be a number in [0, 1]), else the family's
    measured default (:func:`default_acceptance`); None for a run without drafts."""
    if acceptance is not None:
        if isinstance(acceptance, bool) or not isinstance(acceptance, numbers.Real) or not math.isfinite(acceptance) \
                or not (0.0 <= acceptance <= 1.0):
            raise MoesimError(f"must be a number in [0, 1], got {acceptance!r}", "mtp_acceptance")
        if dataset is not None:
            raise MoesimError("give --mtp-acceptance or --mtp-dataset, not both", "mtp_dataset")
        return Acceptance(float(acceptance), "given (--mtp-acceptance)")
    if not drafts:
        return Acceptance(0.0, "no drafts")
    return default_acceptance(family, drafts, dataset)
