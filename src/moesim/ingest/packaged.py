"""Data files shipped inside the package (``src/moesim/data/``): the measurement corpus that
``moesim validate`` and ``moesim calibrate`` use when given no CSV, and a small sample routing trace
(``--trace sample``). See ``src/moesim/data/README.md`` for where each comes from."""
from __future__ import annotations

from importlib import resources

from ..errors import MoesimError


MEASUREMENTS = "measurements.csv"
SAMPLE_TRACE = "sample_trace_gpt-oss-20b.jsonl"
SAMPLE_TRACE_NAME = "sample"          # what --trace accepts for the packaged trace


def data_path(name: str) -> str:
    """The file system path of a packaged data file (the package is installed as files, not zipped)."""
    ref = resources.files("moesim").joinpath("data").joinpath(name)
    if not ref.is_file():
        raise MoesimError(f"the packaged data file {name} is missing from this installation of moesim "
                          "(reinstall it, or give a path)", "data")
    return str(ref)


def measurements_csv() -> str:
    return data_path(MEASUREMENTS)


def collected_measurements_csv() -> str:
    """The project's own collected rows alone (also appended to measurements.csv): the shipped
    calibration was fitted without them, so they are its held-out corpus (analysis/intervals.py)."""
    return data_path("measurements_collected.csv")


def sample_trace() -> str:
    return data_path(SAMPLE_TRACE)


def trace_path(value):
    """``--trace`` as given, with ``sample`` standing for the packaged trace."""
    if isinstance(value, str) and value.strip().lower() == SAMPLE_TRACE_NAME:
        return sample_trace()
    return value
