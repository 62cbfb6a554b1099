"""A Hugging Face ``config.json`` on disk (a path or a directory holding one) read into a Model."""
from __future__ import annotations

import os
from typing import Mapping

from ..errors import MoesimError
from ..spec.models import Model
from .bounded import _load_json


def read_hf_config(config: str | os.PathLike, id: str | None = None, **meta) -> Model:
    """The model a ``config.json`` describes (with NVIDIA ModelOpt's ``hf_quant_config.json`` beside it
    when the config has no ``quantization_config``); errors name the file."""
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise MoesimError(f"{path}: no such file", "config")
    cfg = _load_json(path, "config.json", "config")
    if isinstance(cfg, dict) and cfg.get("quantization_config") is None:
        extra = os.path.join(os.path.dirname(path), "hf_quant_config.json")
        if os.path.exists(extra):
            q = _load_json(extra, "hf_quant_config.json", "config")
            if isinstance(q, dict) and isinstance(q.get("quantization"), Mapping):
                cfg = dict(cfg, quantization_config={"quant_method": "modelopt", **q["quantization"]})
    if id is None:
        id = os.path.basename(os.path.dirname(os.path.abspath(path))) or "model"
    meta.setdefault("source", f"config.json at {path}")
    if not isinstance(cfg, Mapping):
        raise MoesimError(f"{path}: a config must be a JSON object", "config")
    try:
        return Model.from_hf_config(cfg, id, **meta)
    except MoesimError as exc:
        msg = str(exc)
        if exc.field and msg.startswith(f"{exc.field}: "):
            msg = msg[len(exc.field) + 2:]
        raise MoesimError(f"{path}: {msg}", exc.field) from None   # name the file
