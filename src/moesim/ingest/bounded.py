"""Bounded reads shared by the artifact readers: every length is checked before anything is allocated."""
from __future__ import annotations

import json
import os

from ..errors import MoesimError


JSON_MAX_BYTES = 64 << 20           # config.json / index.json
_INT64_MAX = (1 << 63) - 1


def _err(path, problem: str, field: str) -> MoesimError:
    return MoesimError(f"{os.fspath(path)}: {problem}", field)


def _load_json(path: str, what: str, field: str):
    try:
        size = os.path.getsize(path)
        if size > JSON_MAX_BYTES:
            raise _err(path, f"{what} is {size} bytes (limit {JSON_MAX_BYTES})", field)
        with open(path, "rb") as fh:
            raw = fh.read(JSON_MAX_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except MoesimError:
        raise
    except OSError as exc:
        raise _err(path, f"cannot read: {exc.strerror or exc}", field) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise _err(path, f"{what} is not valid JSON ({type(exc).__name__}: {exc})", field) from None
