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
    """Parse ``catalog/<name>.toml`` once per process (a new process loads the parse from the persistent
    lowering cache, whose fingerprint covers the catalog files)."""
    from . import _lowering_cache
    return _lowering_cache.memo("catalog", name, lambda: _parse(name))


def names() -> list:
    """The catalog's data files, by the name :func:`load` takes."""
    folder = resources.files("moesim").joinpath("catalog")
    return sorted(p.name[:-len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _parse(name: str) -> dict:
    text = resources.files("moesim").joinpath("catalog").joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def catalog_version() -> str:
    """One version string for the whole catalog (all files carry the same stamp)."""
    return load("models")["catalog_version"]
