"""moesim: will this mixture-of-experts model run on this machine, and how fast will it decode?"""
__version__ = "0.1.0"

from .errors import MoesimError  # noqa: E402
from .models import Model, model, model_ids  # noqa: E402
from .hardware import machine  # noqa: E402
from .fit import fit  # noqa: E402
from .decode import Result, simulate  # noqa: E402
from .sweep import SweepTable, sweep  # noqa: E402

__all__ = ["MoesimError", "Model", "model", "model_ids", "machine", "fit", "simulate", "Result", "sweep", "SweepTable",
           "__version__"]
