"""``moesim.routing``: the routing model in one place for users — profiles, sampling, trace statistics and
profile fitting. ``python -m moesim.routing fit TRACE`` fits a profile to a recorded trace."""
from __future__ import annotations

import sys

from .analysis.routing_fit import FIT_GRID, _main, fit_profile, trace_stats
from .engine.lower.routing import RoutingDims, inclusion_probabilities, lower, lower_trace
from .engine.routing import cache_hit_rates, reuse, sample_requests, step_unions
from .spec.routing import N_SCENARIOS, RoutingProfile, profile, profile_ids

__all__ = ["FIT_GRID", "N_SCENARIOS", "RoutingDims", "RoutingProfile", "cache_hit_rates", "fit_profile",
           "inclusion_probabilities", "lower", "lower_trace", "profile", "profile_ids", "reuse", "sample_requests",
           "step_unions", "trace_stats"]

if __name__ == "__main__":
    # `python -m moesim.routing` runs this file as __main__, a second copy of the module: run the package's
    # own entry point so every class is the one the rest of moesim checks against.
    sys.exit(_main())
