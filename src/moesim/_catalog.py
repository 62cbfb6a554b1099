"""Loading the packaged catalog data files (TOML, every number with a source)."""
from __future__ import annotations

import functools
import sys
from importlib import resources


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
    """Parse ``catalog/<name>.toml`` once per process."""
    text = resources.files("moesim").joinpath("catalog").joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def catalog_version() -> str:
    """One version string for the whole catalog (all files carry the same stamp)."""
    return load("models")["catalog_version"]
