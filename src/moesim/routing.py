"""``moesim.routing``: the routing model in one place for users — profiles, sampling, trace statistics and
profile fitting (``moesim routing stats TRACE`` and ``moesim routing fit TRACE...`` on the command line)."""
from __future__ import annotations

import numpy as np

from .analysis.routing_fit import fit_profile, fit_workloads, trace_stats
from .analysis.routing_stats import summary as statistics
from .engine.lower.routing import RoutingDims, inclusion_probabilities, lower, lower_trace
from .engine.routing import cache_hit_rates, reuse, sample_requests, step_unions
from .errors import MoesimError
from .spec.limits import MAX_STEPS
from .spec.routing import N_SCENARIOS, RoutingProfile, profile, profile_ids

__all__ = ["N_SCENARIOS", "RoutingDims", "RoutingProfile", "cache_hit_rates", "fit_profile", "fit_workloads",
           "inclusion_probabilities", "lower", "lower_trace", "profile", "profile_ids", "reuse", "sample",
           "sample_requests", "statistics", "step_unions", "trace_stats"]


def sample(model, profile=None, lengths=(256,), seed: int = 0) -> list:
    """One int32 array [tokens, MoE layers, k] of sampled expert ids per request, a request per entry of
    *lengths*, for *model* (a catalog id or a Model) under *profile* (an id such as ``"gpt-oss:mmlu"``, a
    RoutingProfile, or None for the model family's). Request i is stream (seed, i): the same seed gives
    the same requests, and a request does not depend on the others' lengths."""
    from .ingest import model as get_model
    from .spec import routing as R
    m = get_model(model)
    dims = RoutingDims.of(m)
    if dims.n_layers == 0:
        raise MoesimError(f"{m.id} is dense: it routes nothing", "model")
    if isinstance(lengths, (int, np.integer)) or not len(lengths):
        raise MoesimError("must be a non-empty list of token counts", "lengths")
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_STEPS for n in lengths):
        raise MoesimError(f"token counts must be integers in [1, {MAX_STEPS}]", "lengths")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise MoesimError(f"must be an integer >= 0, got {seed!r}", "seed")
    prof = profile if isinstance(profile, R.RoutingProfile) else R.profile(profile, family=m.family)
    longest = sample_requests(dims, prof, len(lengths), int(max(lengths)), int(seed))
    return [r[:int(n)].copy() for r, n in zip(longest, lengths)]
