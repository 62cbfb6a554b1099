"""Ingest real model artifacts: GGUF files (with splits), safetensors headers and indexes, HF configs.

Nothing here reads weights. Every reader is bounded: counts and lengths read from a file are checked
against fixed limits *and* against the bytes the file actually has before anything is allocated or
looped over, and every problem becomes a :class:`~moesim.errors.MoesimError` that names the file.

GGUF
    The header (magic, version, KV metadata, tensor infos) is parsed by a small reader written after
    llama.cpp's own ``ggml/src/gguf.cpp`` (``gguf_init_from_file_impl``) and checked the way llama.cpp
    checks it: tensor names shorter than ``GGML_MAX_NAME`` (64), at most ``GGML_MAX_DIMS`` (4) dims,
    non-negative dims whose product fits int64, a known type whose block size divides ``ne[0]``,
    data offsets that follow one another at the file's alignment (``tensor has offset X, expected Y``),
    and tensor data inside the file (llama-model-loader: "tensor data is not within the file bounds").
    Type ids, names and block sizes come from the ``gguf`` package (llama.cpp's gguf-py: it is the
    reference for the format, and tests cross-check this reader against its ``GGUFReader``). That
    reader is not used on user files because it memory-maps and walks arrays with counts taken from
    the file without limits and needs all tensor data present.

    Splits follow llama.cpp: ``split.count`` in the first file; the others are
    ``{prefix}-{k:05d}-of-{n:05d}.gguf`` (``llama_split_path``), each with ``split.no == k-1``; tensor
    names are unique across shards and their total equals ``split.tensors.count``
    (llama-model-loader: "corrupted model: %d tensors expected but %d found").

safetensors
    8-byte little-endian header length (capped at 100 MB, the safetensors library's own limit), a JSON
    header of ``{name: {dtype, shape, data_offsets}}`` whose offsets must tile the data area exactly;
    ``model.safetensors.index.json`` gives ``weight_map`` (tensor -> shard) and ``total_size``.
"""
from __future__ import annotations

import os
import re

from ..errors import MoesimError
from ..spec import models as _models
from ..spec.models import Model, catalog_model, is_catalog_id
from .bounded import _err


# The readers load on first use: a catalog model (every CLI run that names no file) never needs them.
def read_gguf_model(*args, **kwargs) -> Model:
    from .gguf_model import read_gguf_model as read
    return read(*args, **kwargs)


def read_safetensors_model(*args, **kwargs) -> Model:
    from .safetensors import read_safetensors_model as read
    return read(*args, **kwargs)


def read_hf_config(*args, **kwargs) -> Model:
    from .hf_config import read_hf_config as read
    return read(*args, **kwargs)



# ----------------------------------------------------------------------------------- dispatch
def artifact_kind(path: str) -> str:
    """``gguf``, ``safetensors`` or ``config`` for a path (by name, then by magic bytes)."""
    low = path.lower()
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "model.safetensors.index.json")) or any(
                n.endswith(".safetensors") for n in _listdir(path)):
            return "safetensors"
        if os.path.exists(os.path.join(path, "config.json")):
            return "config"
        ggufs = [n for n in _listdir(path) if n.lower().endswith(".gguf")]
        if ggufs:
            raise _err(path, "is a directory of GGUF files; pass the .gguf file (the first shard of a split)", "model")
        raise _err(path, "holds no config.json, safetensors or GGUF file", "model")
    if not os.path.exists(path):
        raise _err(path, "no such file or directory", "model")
    if low.endswith(".gguf"):
        return "gguf"
    if low.endswith(".safetensors") or low.endswith(".safetensors.index.json"):
        return "safetensors"
    if low.endswith(".json"):
        return "config"
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise _err(path, f"cannot read: {exc.strerror or exc}", "model") from None
    from .gguf import _GGUF_MAGIC
    if head == _GGUF_MAGIC:
        return "gguf"
    raise _err(path, "is not a GGUF file, a safetensors file/index or a config.json", "model")


def _listdir(d: str) -> list:
    try:
        return os.listdir(d)[:100_000]
    except OSError:
        return []


def load(path: str | os.PathLike) -> Model:
    """A :class:`Model` from any supported artifact path (see :func:`moesim.models.model`)."""
    path = os.fspath(path)
    kind = artifact_kind(path)
    if kind == "gguf":
        return read_gguf_model(path)
    if kind == "safetensors":
        return read_safetensors_model(path)
    return read_hf_config(path)


_ARTIFACT_SUFFIXES = (".gguf", ".json", ".safetensors")


def looks_like_path(text: str) -> bool:
    """Is *text* meant as a file path (an existing path, a path separator or an artifact suffix)?"""
    return (os.path.exists(text) or os.sep in text or (os.altsep or os.sep) in text
            or text.lower().endswith(_ARTIFACT_SUFFIXES))


def model(id_or_model: "str | os.PathLike | Model") -> Model:
    """A catalog model by id (``moesim.model("deepseek-v3")``), or a model read from a path wherever an id
    is accepted: a GGUF file (first or any shard), a ``config.json`` or a directory holding one (with
    safetensors headers/index beside it when present), a ``model.safetensors.index.json`` or a
    ``.safetensors`` file. A Model passes through."""
    if isinstance(id_or_model, Model):
        return id_or_model
    if isinstance(id_or_model, os.PathLike):
        return load(id_or_model)
    if not isinstance(id_or_model, str):
        raise MoesimError(f"expected a model id string, got {type(id_or_model).__name__}", "model")
    text = id_or_model.strip()
    if text and looks_like_path(text):
        # an 'org/name' is a local snapshot when that directory exists, else a Hugging Face id
        if os.path.exists(text) if looks_like_hf_id(text) else not is_catalog_id(text):
            return load(text)
    # a catalog id, a Hugging Face id the catalog lists (hf_ids), or an unknown one: catalog_model
    # then names the nearest catalog and Hugging Face ids
    return catalog_model(id_or_model)


_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_hf_id(text: str) -> bool:
    """Is *text* shaped like a Hugging Face repo id ('org/name', no artifact suffix)?"""
    return bool(_HF_ID.fullmatch(text)) and not text.lower().endswith(_ARTIFACT_SUFFIXES)


_models.ARTIFACT_READERS.update(gguf=read_gguf_model, safetensors=read_safetensors_model, config=read_hf_config)
