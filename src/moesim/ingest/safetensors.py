"""safetensors headers and ``model.safetensors.index.json``: tensor inventories and models; no weights read."""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, replace

from ..errors import MoesimError
from ..spec.models import Model
from ..spec.layers import StoredWeights, Tensor
from .bounded import _err, _load_json


ST_MAX_HEADER = 100_000_000         # safetensors MAX_HEADER_SIZE
ST_MAX_TENSORS = 1 << 20
ST_MAX_DIMS = 16


# ----------------------------------------------------------------------------------- safetensors
ST_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
                 "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
                 "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


@dataclass
class STTensor:
    name: str
    dtype: str
    shape: tuple          # safetensors (row-major, PyTorch) order
    nbytes: int
    file: str


def read_safetensors_header(path: str | os.PathLike) -> "tuple[list, dict]":
    """([STTensor], __metadata__) of one .safetensors file, validated like the safetensors library."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _err(path, f"file is truncated: {size} bytes is shorter than the 8-byte header length",
                           "safetensors")
            n = struct.unpack("<Q", head)[0]
            if n > ST_MAX_HEADER:
                raise _err(path, f"header length {n} exceeds the safetensors limit of {ST_MAX_HEADER} bytes "
                                 "(not a safetensors file?)", "safetensors")
            if 8 + n > size:
                raise _err(path, f"file is truncated: the header needs {n} bytes, the file has {size - 8} after "
                                 "the length", "safetensors")
            raw = fh.read(n)
        if not raw.lstrip().startswith(b"{"):
            raise _err(path, "header is not a JSON object (not a safetensors file?)", "safetensors")
        header = json.loads(raw.decode("utf-8"))
    except MoesimError:
        raise
    except OSError as exc:
        raise _err(path, f"cannot read: {exc.strerror or exc}", "safetensors") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError, struct.error) as exc:
        raise _err(path, f"header is not valid JSON ({type(exc).__name__}: {exc})", "safetensors") from None
    if not isinstance(header, dict):
        raise _err(path, "header is not a JSON object", "safetensors")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _err(path, "__metadata__ is not an object", "safetensors")
    if len(header) > ST_MAX_TENSORS:
        raise _err(path, f"header lists {len(header)} tensors (limit {ST_MAX_TENSORS})", "safetensors")
    spans = []
    out = []
    for name, info in header.items():
        where = f"tensor {name[:80]!r}"
        if len(name) > 1024:
            raise _err(path, f"{where} has a name longer than 1024 characters", "safetensors")
        if not isinstance(info, dict):
            raise _err(path, f"{where} is not an object", "safetensors")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in ST_DTYPE_BITS:
            raise _err(path, f"{where} has unknown dtype {str(dtype)[:40]!r}", "safetensors")
        if (not isinstance(shape, list) or len(shape) > ST_MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in shape)):
            raise _err(path, f"{where} has an invalid shape", "safetensors")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o for o in offs) or offs[0] > offs[1]):
            raise _err(path, f"{where} has invalid data_offsets {str(offs)[:60]}", "safetensors")
        bits = math.prod(shape) * ST_DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offs[1] - offs[0]:
            raise _err(path, f"{where}: {dtype}{shape} needs {bits / 8:g} bytes but data_offsets span "
                             f"{offs[1] - offs[0]}", "safetensors")
        spans.append((offs[0], offs[1], name))
        out.append(STTensor(name, dtype, tuple(shape), offs[1] - offs[0], path))
    spans.sort()
    end = 0
    for b, e, name in spans:
        if b != end:
            raise _err(path, f"tensor {name[:80]!r} starts at {b}, expected {end} (offsets must tile the data)",
                       "safetensors")
        end = e
    data = size - 8 - n
    if end > data:
        raise _err(path, f"file is truncated: tensor data ends at byte {end} of the data area, which has {data}",
                   "safetensors")
    if end < data:
        raise _err(path, f"{data - end} bytes follow the last tensor (not a valid safetensors file)", "safetensors")
    return out, {str(k): str(v)[:200] for k, v in list(meta.items())[:1000]}


@dataclass
class STIndex:
    path: str
    weight_map: dict
    total_size: int | None


def read_safetensors_index(path: str | os.PathLike) -> STIndex:
    path = os.fspath(path)
    d = _load_json(path, "index", "safetensors")
    if not isinstance(d, dict) or not isinstance(d.get("weight_map"), dict):
        raise _err(path, "is not a safetensors index (no weight_map object)", "safetensors")
    wm = d["weight_map"]
    if len(wm) > ST_MAX_TENSORS:
        raise _err(path, f"weight_map lists {len(wm)} tensors (limit {ST_MAX_TENSORS})", "safetensors")
    for k, v in wm.items():
        if (not isinstance(v, str) or not v or "/" in v or "\\" in v or v in (".", "..")
                or not v.endswith(".safetensors")):
            raise _err(path, f"weight_map maps {k[:80]!r} to {str(v)[:80]!r}, not a .safetensors file name "
                             "in the same directory", "safetensors")
    meta = d.get("metadata") or {}
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if total is not None:
        if isinstance(total, str) and total.isdigit():
            total = int(total)
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise _err(path, f"metadata.total_size must be a non-negative integer, got {str(total)[:40]!r}",
                       "safetensors")
    return STIndex(path, dict(wm), total)


_HF_LAYER = re.compile(r"(?:^|\.)(?:layers|blocks|h)\.(\d+)\.")
_HF_OTHER = re.compile(r"(^|\.)(vision|visual|vision_tower|vision_model|multi_modal_projector|mm_projector|"
                       r"audio|image_newline)")


def hf_tensor_class(name: str, n_main: int, layers) -> "tuple[str, int]":
    """(moesim class, layer) of a Hugging Face checkpoint tensor by its name."""
    if _HF_OTHER.search(name):
        return "embeddings", -1          # vision/audio towers: loaded with the model, outside the layers
    m = _HF_LAYER.search(name)
    if m is None:
        if "embed" in name or name.endswith(("wte.weight", "tok_embeddings.weight")):
            return "embeddings", -1
        if "lm_head" in name or "norm" in name or name.startswith("output"):
            return "lm_head", -1
        return "attention", 0
    i = int(m.group(1))
    if i >= n_main:
        return "mtp", i
    if "shared_expert" in name:
        return "shared_experts", i
    if ".experts." in name or ".experts_" in name:
        return "routed_experts", i
    if re.search(r"\.(gate|router)(\.|$)", name) or "e_score_correction_bias" in name or "latent" in name \
            or ".router." in name:
        return "router", i
    if re.search(r"\.(mlp|feed_forward|ffn|block_sparse_moe)\.", name):
        return ("dense_ffn" if layers[i].ffn.kind == "dense" else "attention"), i
    return "attention", i


def _st_dir_files(path: str):
    """(directory, index path or None, [.safetensors paths present]) for a path of any accepted kind."""
    if os.path.isdir(path):
        d = path
        idx = os.path.join(d, "model.safetensors.index.json")
        idx = idx if os.path.exists(idx) else None
    elif path.endswith(".json"):
        d, idx = os.path.dirname(path) or ".", path
    else:
        d, idx = os.path.dirname(path) or ".", None
        sib = os.path.join(d, "model.safetensors.index.json")
        if re.search(r"-\d{5}-of-\d{5}\.safetensors$", path) and os.path.exists(sib):
            idx = sib
        else:
            return d, None, [path]
    if idx is None:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))[:100_000]
        except OSError as exc:
            raise _err(d, f"cannot list: {exc.strerror or exc}", "safetensors") from None
        return d, None, [os.path.join(d, n) for n in names]
    return d, idx, []


@dataclass
class STArtifact:
    directory: str
    index: STIndex | None
    tensors: list            # [STTensor] from headers (empty when only the index is present)
    shards_present: int
    shards_total: int
    key: str


def read_safetensors(path: str | os.PathLike) -> STArtifact:
    """Headers of every shard present (checked against the index when there is one)."""
    path = os.fspath(path)
    d, idx_path, files = _st_dir_files(path)
    index = read_safetensors_index(idx_path) if idx_path else None
    if index is not None:
        shard_names = sorted(set(index.weight_map.values()))
        files = [os.path.join(d, n) for n in shard_names]
        present = [f for f in files if os.path.exists(f)]
    else:
        present = files
        if not present:
            raise _err(path, "holds no .safetensors files and no model.safetensors.index.json", "safetensors")
    tensors = []
    key_parts = []
    if index is None or len(present) == len(files):
        by_file = {}
        for f in present:
            ts, _meta = read_safetensors_header(f)
            by_file[os.path.basename(f)] = ts
            tensors.extend(ts)
            st = os.stat(f)
            key_parts.append(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns}")
        seen = {}
        for t in tensors:
            if t.name in seen:
                raise _err(t.file, f"tensor {t.name[:80]!r} is also in {os.path.basename(seen[t.name])} "
                                   "(shards disagree)", "safetensors")
            seen[t.name] = t.file
        if index is not None:
            for name, fname in index.weight_map.items():
                have = seen.get(name)
                if have is None:
                    raise _err(os.path.join(d, fname), f"lacks tensor {name[:80]!r} that {os.path.basename(index.path)} "
                                                       "maps to it (shards disagree with the index)", "safetensors")
                if os.path.basename(have) != fname:
                    raise _err(have, f"holds {name[:80]!r}, which the index maps to {fname} (shards disagree)",
                               "safetensors")
            if len(seen) != len(index.weight_map):
                extra = next(n for n in seen if n not in index.weight_map)
                raise _err(seen[extra], f"holds tensor {extra[:80]!r} that the index does not list "
                                        "(shards disagree with the index)", "safetensors")
    else:
        st = os.stat(index.path)
        key_parts.append(f"{os.path.abspath(index.path)}:{st.st_size}:{st.st_mtime_ns}")
    return STArtifact(directory=d, index=index, tensors=tensors, shards_present=len(present),
                      shards_total=len(files), key=";".join(key_parts))


def _config_for(d: str, config) -> Model:
    if config is None:
        cpath = os.path.join(d, "config.json")
        if not os.path.exists(cpath):
            raise _err(d, "has no config.json: the architecture of safetensors weights comes from the model's "
                          "config (pass config=...); `moesim inspect` still lists the tensors", "config")
        return Model.from_hf_config(d)
    if isinstance(config, Model):
        return config
    return Model.from_hf_config(config)


def safetensors_model(art: STArtifact, base: Model) -> Model:
    """*base* (from config.json) carrying the exact tensor table of the headers, when all are present."""
    if not art.tensors:
        return base
    table = []
    for t in art.tensors:
        cls, layer = hf_tensor_class(t.name, base.n_layers, base.layers)
        shape = tuple(reversed(t.shape)) or (1,)
        table.append((Tensor(t.name, shape, cls, layer), t.dtype, t.nbytes))
    stored = StoredWeights(container="safetensors", key=art.key, label=base.native_quant, table=tuple(table),
                           files=tuple(sorted({t.file for t in art.tensors})))
    return replace(base, stored=stored, source=f"safetensors headers in {art.directory} ({art.shards_present} files)")


def read_safetensors_model(path: str | os.PathLike, config=None) -> Model:
    path = os.fspath(path)
    art = read_safetensors(path)
    return safetensors_model(art, _config_for(art.directory, config))
