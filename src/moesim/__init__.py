"""moesim: will this mixture-of-experts model run on this machine, and how fast will it decode?

Layers import downward only: ``spec`` -> ``ingest`` -> ``engine`` -> ``analysis`` -> ``cli``
(``errors``, ``_catalog`` and ``_search`` sit under all of them).

The public API is imported on first use (PEP 562 ``__getattr__``): ``import moesim`` stays cheap, so a
CLI command pays only for the modules it runs, and ``moesim.fit`` and the rest work as before.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

from .errors import MoesimError  # noqa: E402

# public name -> the module that defines it
_PUBLIC = {
    "Model": ".spec.models", "model_ids": ".spec.models", "model": ".ingest", "machine": ".spec.hardware",
    "local_machine": ".ingest.local_machine", "fit": ".analysis.fit", "plan": ".analysis.plan",
    "Result": ".analysis.simulate", "simulate": ".analysis.simulate", "SweepTable": ".analysis.sweep",
    "sweep": ".analysis.sweep", "validate": ".analysis.validate", "rank": ".analysis.views",
    "compare": ".analysis.views", "serve_sim": ".analysis.serve", "ServeResult": ".analysis.serve",
}
# the subpackages, reachable as attributes (moesim.analysis...) without importing them first
_SUBPACKAGES = {"spec", "ingest", "engine", "analysis", "report", "cli", "errors", "routing", "_catalog", "_search"}

__all__ = ["MoesimError", "Model", "model", "model_ids", "machine", "local_machine", "fit", "plan", "simulate", "Result",
           "sweep", "SweepTable", "validate", "rank", "compare", "serve_sim", "ServeResult",
           "__version__"]


def __getattr__(name: str):
    where = _PUBLIC.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where, __name__), name)
        globals()[name] = value            # later lookups skip this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__) | _SUBPACKAGES)
