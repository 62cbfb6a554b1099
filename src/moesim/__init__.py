"""moesim: will this mixture-of-experts model run on this machine, and how fast will it decode?

Layers import downward only: ``spec`` -> ``ingest`` -> ``engine`` -> ``analysis`` -> ``cli``
(``errors``, ``_catalog`` and ``_search`` sit under all of them).
"""
__version__ = "0.1.0"

from .errors import MoesimError  # noqa: E402
from .spec.models import Model, model_ids  # noqa: E402
from .ingest import model  # noqa: E402
from .spec.hardware import machine  # noqa: E402
from .ingest.local_machine import local_machine  # noqa: E402
from .analysis.fit import fit  # noqa: E402
from .analysis.plan import plan  # noqa: E402
from .analysis.simulate import Result, simulate  # noqa: E402
from .analysis.sweep import SweepTable, sweep  # noqa: E402
from .analysis.validate import validate  # noqa: E402
from .analysis.serve import ServeResult, serve_sim  # noqa: E402
from .analysis.views import compare, rank  # noqa: E402

__all__ = ["MoesimError", "Model", "model", "model_ids", "machine", "local_machine", "fit", "plan", "simulate", "Result",
           "sweep", "SweepTable", "validate", "rank", "compare", "serve_sim", "ServeResult",
           "__version__"]
