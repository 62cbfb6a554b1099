"""moesim: will this mixture-of-experts model run on this machine, and how fast will it decode?"""
from .errors import MoesimError
from .models import Model, model, model_ids

__version__ = "0.1.0"

__all__ = ["MoesimError", "Model", "model", "model_ids", "__version__"]
