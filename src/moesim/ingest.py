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

import json
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, replace

from .errors import MoesimError
from .models import FFN, Attention, Layer, Model, StoredWeights, Tensor, _mtp_layer

# ----------------------------------------------------------------------------------- limits
GGUF_MAX_HEADER_BYTES = 64 << 20    # metadata + tensor infos; real files: ~2-12 MB (tokenizer arrays)
GGUF_MAX_KV = 65_536
GGUF_MAX_TENSORS = 1 << 20          # DeepSeek-V3 has ~1,150 tensors
GGUF_MAX_KEY = 65_535
GGUF_MAX_STRING = 16 << 20          # chat templates are tens of KB
GGUF_MAX_ARRAY = 1 << 24
GGUF_MAX_NAME = 64                  # GGML_MAX_NAME: names must be shorter than this
GGUF_MAX_DIMS = 4                   # GGML_MAX_DIMS
GGUF_MAX_SPLITS = 4096
GGUF_MAX_BLOCKS = 4096              # llama.cpp LLAMA_MAX_LAYERS is 512
KEEP_ARRAY = 65_536                 # numeric arrays up to this length are kept (per-layer hparams)
ST_MAX_HEADER = 100_000_000         # safetensors MAX_HEADER_SIZE
ST_MAX_TENSORS = 1 << 20
ST_MAX_DIMS = 16
JSON_MAX_BYTES = 64 << 20           # config.json / index.json

_GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")

# GGUF value types (gguf.GGUFValueType): struct format and size of the scalar ones.
_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
           7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_INT64_MAX = (1 << 63) - 1


def _err(path, problem: str, field: str) -> MoesimError:
    return MoesimError(f"{os.fspath(path)}: {problem}", field)


@dataclass(frozen=True)
class ArrayInfo:
    """A GGUF array value too long to keep (tokenizer vocabularies): its element type and length."""

    type: int
    count: int
    head: tuple = ()


# ----------------------------------------------------------------------------------- ggml types
def _ggml_type_table() -> dict:
    """ggml type id -> (name, block elements, bytes per block): the catalog's table (quants.md §1),
    completed by gguf-py's GGML_QUANT_SIZES for types the catalog does not list (I8, I64, F64...)."""
    from . import quants as Q
    table = {int(v["id"]): (k, int(v["block"]), int(v["bytes"])) for k, v in Q.ggml_types().items()}
    try:
        import gguf
        for t, (blk, size) in gguf.GGML_QUANT_SIZES.items():
            table.setdefault(int(t), (t.name, int(blk), int(size)))
    except ImportError:  # pragma: no cover - gguf is a declared dependency
        pass
    return table


_TYPES: dict | None = None


def ggml_type(type_id: int) -> "tuple[str, int, int] | None":
    global _TYPES
    if _TYPES is None:
        _TYPES = _ggml_type_table()
    return _TYPES.get(type_id)


def _ftype_name(file_type) -> str | None:
    from . import quants as Q
    if isinstance(file_type, bool) or not isinstance(file_type, int):
        return None
    for name, v in Q._tables()["ftypes"].items():
        if int(v["id"]) == file_type:
            return name
    try:
        import gguf
        return gguf.LlamaFileType(file_type).name.replace("MOSTLY_", "")
    except (ImportError, ValueError):
        return None


# ----------------------------------------------------------------------------------- GGUF reader
@dataclass
class GGUFTensorInfo:
    name: str
    type_id: int
    type_name: str
    shape: tuple          # ggml order: ne0 (row length) first
    nbytes: int
    offset: int           # relative to the data section


@dataclass
class GGUFShard:
    path: str
    size: int
    version: int
    kv: dict
    kv_types: dict
    tensors: list
    alignment: int
    data_offset: int
    mtime_ns: int = 0


class _Cursor:
    """Bounds-checked little-endian reads from a memory-mapped file."""

    __slots__ = ("buf", "pos", "size", "path")

    def __init__(self, buf, size: int, path: str):
        self.buf, self.pos, self.size, self.path = buf, 0, size, path

    def take(self, n: int, what: str) -> int:
        end = self.pos + n
        if n < 0 or end > self.size:
            raise _err(self.path, f"file is truncated: {what} at byte {self.pos} needs {n} bytes, "
                                  f"the file has {self.size}", "gguf")
        if end > GGUF_MAX_HEADER_BYTES:
            raise _err(self.path, f"GGUF header is larger than {GGUF_MAX_HEADER_BYTES >> 20} MiB "
                                  f"(still reading {what} at byte {self.pos})", "gguf")
        p = self.pos
        self.pos = end
        return p

    def scalar(self, fmt: str, n: int, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(n, what))[0]

    def u32(self, what):
        return self.scalar("<I", 4, what)

    def u64(self, what):
        return self.scalar("<Q", 8, what)

    def left(self) -> int:
        return self.size - self.pos

    def raw_string(self, what: str, limit: int) -> bytes:
        n = self.u64(what + " length")
        if n > limit:
            raise _err(self.path, f"{what} is {n} bytes long (limit {limit})", "gguf")
        p = self.take(n, what)
        return bytes(self.buf[p:p + n])

    def text(self, what: str, limit: int, strict: bool) -> str:
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise _err(self.path, f"{what} is not valid UTF-8", "gguf") from None


def _read_value(cur: _Cursor, vtype: int, key: str):
    if vtype in _SCALAR:
        fmt, n = _SCALAR[vtype]
        return cur.scalar(fmt, n, f"value of {key!r}")
    if vtype == _STRING:
        return cur.text(f"string value of {key!r}", GGUF_MAX_STRING, strict=False)
    if vtype != _ARRAY:
        raise _err(cur.path, f"metadata key {key!r} has unknown value type {vtype}", "gguf")
    itype = cur.u32(f"array type of {key!r}")
    count = cur.u64(f"array length of {key!r}")
    if itype == _ARRAY:
        raise _err(cur.path, f"metadata key {key!r} is a nested array (not supported by llama.cpp)", "gguf")
    if itype != _STRING and itype not in _SCALAR:
        raise _err(cur.path, f"metadata key {key!r} is an array of unknown type {itype}", "gguf")
    min_size = 8 if itype == _STRING else _SCALAR[itype][1]
    if count > GGUF_MAX_ARRAY or count * min_size > cur.left():
        raise _err(cur.path, f"metadata key {key!r} claims {count} array elements; the file has "
                             f"{cur.left()} bytes left (limit {GGUF_MAX_ARRAY} elements)", "gguf")
    if itype == _STRING:
        keep = count <= 256
        head = []
        for i in range(count):
            n = cur.u64(f"length of element {i} of {key!r}")
            if n > GGUF_MAX_STRING:
                raise _err(cur.path, f"element {i} of {key!r} is {n} bytes long (limit {GGUF_MAX_STRING})", "gguf")
            p = cur.take(n, f"element {i} of {key!r}")
            if keep:
                head.append(bytes(cur.buf[p:p + n]).decode("utf-8", errors="replace"))
        return head if keep else ArrayInfo(itype, count)
    fmt, n = _SCALAR[itype]
    p = cur.take(n * count, f"array {key!r}")
    if count <= KEEP_ARRAY:
        return list(struct.unpack_from("<" + fmt[1] * count, cur.buf, p))
    return ArrayInfo(itype, count, tuple(struct.unpack_from("<" + fmt[1] * 16, cur.buf, p)))


def read_gguf_header(path: str | os.PathLike) -> GGUFShard:
    """Parse one GGUF file's header and tensor table (bounded; see module docstring)."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
        if not os.path.isfile(path):
            raise _err(path, "is not a regular file", "gguf")
        size = st.st_size
        if size < 24:
            raise _err(path, f"file is truncated: {size} bytes is shorter than a GGUF header", "gguf")
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            shard = _parse_gguf(mm, size, path)
        shard.mtime_ns = st.st_mtime_ns
        return shard
    except MoesimError:
        raise
    except OSError as exc:
        raise _err(path, f"cannot read: {exc.strerror or exc}", "gguf") from None
    except (struct.error, ValueError, OverflowError, IndexError, KeyError, TypeError, UnicodeError,
            MemoryError, RecursionError) as exc:
        raise _err(path, f"malformed GGUF ({type(exc).__name__}: {exc})", "gguf") from None


def _parse_gguf(buf, size: int, path: str) -> GGUFShard:
    cur = _Cursor(buf, size, path)
    magic = bytes(buf[0:4])
    if magic != _GGUF_MAGIC:
        raise _err(path, f"not a GGUF file (magic {magic!r}, expected b'GGUF')", "gguf")
    cur.pos = 4
    version = cur.u32("version")
    if version & 0xFFFF == 0 and struct.unpack(">I", struct.pack("<I", version))[0] in (1, 2, 3):
        raise _err(path, "is a big-endian GGUF file (not supported)", "gguf")
    if version == 1:
        raise _err(path, "is GGUF version 1 (not supported by llama.cpp since 2023)", "gguf")
    if version not in (2, 3):
        raise _err(path, f"unsupported GGUF version {version} (expected 2 or 3)", "gguf")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata key count")
    # A KV pair takes at least 13 bytes and a tensor info at least 33 (llama.cpp formats): counts
    # the file cannot hold are refused before any loop or allocation.
    if n_kv > GGUF_MAX_KV or n_kv * 13 > cur.left():
        raise _err(path, f"claims {n_kv} metadata keys; the file has {cur.left()} bytes left "
                         f"(limit {GGUF_MAX_KV})", "gguf")
    if n_tensors > GGUF_MAX_TENSORS or n_tensors * 33 > cur.left():
        raise _err(path, f"claims {n_tensors} tensors; the file has {cur.left()} bytes left "
                         f"(limit {GGUF_MAX_TENSORS})", "gguf")
    kv: dict = {}
    kv_types: dict = {}
    for i in range(n_kv):
        key = cur.text(f"metadata key {i}", GGUF_MAX_KEY, strict=True)
        if key in kv:
            raise _err(path, f"duplicate metadata key {key!r}", "gguf")
        vtype = cur.u32(f"value type of {key!r}")
        kv[key] = _read_value(cur, vtype, key)
        kv_types[key] = vtype
    alignment = 32
    if "general.alignment" in kv:
        a = kv["general.alignment"]
        if kv_types["general.alignment"] != 4 or not isinstance(a, int) or a <= 0 or a & (a - 1):
            raise _err(path, f"general.alignment must be a power of two (u32), got {a!r}", "gguf")
        alignment = a
    tensors = []
    names = set()
    expected = 0
    for i in range(n_tensors):
        name = cur.text(f"name of tensor {i}", GGUF_MAX_KEY, strict=True)
        if len(name.encode()) >= GGUF_MAX_NAME:
            raise _err(path, f"tensor name {name[:80]!r} is too long ({len(name.encode())} >= {GGUF_MAX_NAME})", "gguf")
        if name in names:
            raise _err(path, f"duplicate tensor {name!r}", "gguf")
        names.add(name)
        n_dims = cur.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= GGUF_MAX_DIMS:
            raise _err(path, f"tensor {name!r} has {n_dims} dimensions (1 to {GGUF_MAX_DIMS} allowed)", "gguf")
        shape = tuple(cur.u64(f"dimension {j} of {name!r}") for j in range(n_dims))
        n = 1
        for d in shape:
            if d > _INT64_MAX:
                raise _err(path, f"tensor {name!r} has a negative dimension", "gguf")
            n *= d
        if n > _INT64_MAX:
            raise _err(path, f"tensor {name!r} has {n} elements (more than fit in int64)", "gguf")
        type_id = cur.u32(f"type of {name!r}")
        info = ggml_type(type_id)
        if info is None:
            raise _err(path, f"tensor {name!r} has unknown or removed ggml type id {type_id}", "gguf")
        tname, block, tsize = info
        if shape[0] % block:
            raise _err(path, f"tensor {name!r} of type {tname} has ne[0] = {shape[0]}, not a multiple of "
                             f"the block size {block}", "gguf")
        offset = cur.u64(f"data offset of {name!r}")
        nbytes = n // block * tsize
        if offset != expected:
            raise _err(path, f"tensor {name!r} has data offset {offset}, expected {expected}", "gguf")
        expected += -(-nbytes // alignment) * alignment
        tensors.append(GGUFTensorInfo(name, type_id, tname, shape, nbytes, offset))
    data_offset = -(-cur.pos // alignment) * alignment
    for t in tensors:
        end = data_offset + t.offset + t.nbytes
        if end > size:
            raise _err(path, f"file is truncated: data of tensor {t.name!r} ends at byte {end}, the file has "
                             f"{size} bytes", "gguf")
    return GGUFShard(path=path, size=size, version=version, kv=kv, kv_types=kv_types, tensors=tensors,
                     alignment=alignment, data_offset=data_offset)


# ----------------------------------------------------------------------------------- splits
def split_paths(path: str) -> "tuple[str, int] | None":
    """(first shard path, shard count) when *path* follows llama.cpp's split naming, else None."""
    m = _SPLIT_RE.match(path)
    if not m:
        return None
    count = int(m.group("count"))
    return f"{m.group('prefix')}-{1:05d}-of-{count:05d}.gguf", count


@dataclass
class GGUFArtifact:
    """One GGUF model: its shards (first shard's metadata) and every tensor in file order."""

    path: str
    shards: list
    kv: dict
    tensors: list          # [(GGUFTensorInfo, shard index)]

    @property
    def key(self) -> str:
        return ";".join(f"{os.path.abspath(s.path)}:{s.size}:{s.mtime_ns}" for s in self.shards)


def read_gguf(path: str | os.PathLike) -> GGUFArtifact:
    """Read a GGUF model, following llama.cpp split files from any shard's name."""
    path = os.fspath(path)
    named = split_paths(path)
    first_path = named[0] if named else path
    if named and first_path != path and not os.path.exists(first_path):
        raise _err(first_path, f"first shard of {os.path.basename(path)} is missing", "gguf")
    first = read_gguf_header(first_path)
    n_split = first.kv.get("split.count", 0)
    if n_split in (None, 0):
        n_split = 1
    if isinstance(n_split, bool) or not isinstance(n_split, int) or not 1 <= n_split <= GGUF_MAX_SPLITS:
        raise _err(first_path, f"split.count must be an integer in [1, {GGUF_MAX_SPLITS}], got {n_split!r}", "gguf")
    if named and n_split != named[1]:
        raise _err(first_path, f"split.count is {n_split} but the file name says {named[1]} shards", "gguf")
    if n_split > 1 and not named:
        raise _err(first_path, f"split.count is {n_split} but the name does not follow llama.cpp's "
                               "'<prefix>-00001-of-0000N.gguf' split naming, so the other shards cannot be found", "gguf")
    no = first.kv.get("split.no", 0)
    if n_split > 1 and no != 0:
        raise _err(first_path, f"split.no is {no!r} in the first shard (expected 0)", "gguf")
    shards = [first]
    prefix = _SPLIT_RE.match(first_path).group("prefix") if named else ""
    arch = first.kv.get("general.architecture")
    for k in range(1, n_split):
        p = f"{prefix}-{k + 1:05d}-of-{n_split:05d}.gguf"
        if not os.path.exists(p):
            raise _err(p, f"shard {k + 1} of {n_split} is missing", "gguf")
        s = read_gguf_header(p)
        if s.kv.get("split.no") != k:
            raise _err(p, f"split.no is {s.kv.get('split.no')!r}, expected {k} (shards disagree)", "gguf")
        if s.kv.get("split.count", n_split) != n_split:
            raise _err(p, f"split.count is {s.kv.get('split.count')!r}, the first shard says {n_split} "
                          "(shards disagree)", "gguf")
        a = s.kv.get("general.architecture")
        if a is not None and a != arch:
            raise _err(p, f"architecture {a!r} differs from the first shard's {arch!r} (shards disagree)", "gguf")
        shards.append(s)
    tensors = []
    seen: dict = {}
    for i, s in enumerate(shards):
        for t in s.tensors:
            if t.name in seen:
                raise _err(s.path, f"tensor {t.name!r} is also in {os.path.basename(shards[seen[t.name]].path)} "
                                   "(shards disagree)", "gguf")
            seen[t.name] = i
            tensors.append((t, i))
    if n_split > 1:
        want = first.kv.get("split.tensors.count")
        if want is None:
            raise _err(first_path, "split file lacks split.tensors.count", "gguf")
        if want != len(tensors):
            raise _err(first_path, f"split.tensors.count says {want} tensors but the {n_split} shards hold "
                                   f"{len(tensors)} (shards disagree or one is missing tensors)", "gguf")
    return GGUFArtifact(path=first_path, shards=shards, kv=first.kv, tensors=tensors)


# ----------------------------------------------------------------------------------- GGUF -> Model
# llama.cpp architecture name (general.architecture) -> the HF model_type moesim uses as family.
GGUF_ARCHS = {
    "llama": "llama", "mistral3": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe", "qwen3next": "qwen3_next", "deepseek2": "deepseek_v3", "glm4moe": "glm4_moe",
    "glm-dsa": "glm_moe_dsa", "gpt-oss": "gpt_oss", "llama4": "llama4", "dbrx": "dbrx",
    "ernie4_5-moe": "ernie4_5_moe", "minimax-m2": "minimax_m2", "kimi-linear": "kimi_linear",
}


def gguf_tensor_class(name: str, n_main: int) -> "tuple[str, int]":
    """(moesim tensor class, layer) of a tensor by its llama.cpp name; layer -1 for global tensors."""
    m = _BLK.match(name)
    if m is None:
        if name.startswith("token_embd"):
            return "embeddings", -1
        if name.startswith("output"):
            return "lm_head", -1
        return "attention", 0     # rope_freqs and other small global tensors: with the first layer
    i, stem = int(m.group(1)), m.group(2)
    if i >= n_main or stem.startswith("nextn."):
        return "mtp", i
    if "exps." in stem or stem.endswith("exps"):
        return "routed_experts", i
    if "_shexp" in stem:
        return "shared_experts", i
    if stem.startswith(("ffn_gate_inp", "exp_probs_b", "ffn_latent")):
        return "router", i
    if re.match(r"ffn_(gate|up|down|gate_up)(\.|$)", stem):
        return "dense_ffn", i
    return "attention", i


class _HP:
    """Typed access to a GGUF file's ``{arch}.*`` hyperparameters with errors naming file and key."""

    def __init__(self, art: GGUFArtifact, arch: str):
        self.kv, self.arch, self.path = art.kv, arch, art.path

    def get(self, key: str, layer: int | None = None, default=None, required: bool = False):
        full = f"{self.arch}.{key}"
        v = self.kv.get(full)
        if v is None:
            if required:
                raise _err(self.path, f"lacks required metadata {full!r}", full)
            return default
        if isinstance(v, list):
            if not v:
                raise _err(self.path, f"{full} is an empty array", full)
            v = v[layer] if layer is not None and layer < len(v) else (max(v) if layer is None else None)
            if v is None:
                raise _err(self.path, f"{full} has no entry for layer {layer}", full)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v > 1 << 40:
            raise _err(self.path, f"{full} must be a non-negative number, got {v!r}", full)
        return int(v)


def _shape(stems: dict, key: str):
    t = stems.get(key)
    return t.shape if t is not None else None


def _gguf_layer(art: GGUFArtifact, hp: _HP, arch: str, i: int, stems: dict, hidden: int) -> Layer:
    def bad(problem):
        return _err(art.path, f"block {i}: {problem}", "gguf")

    # --------------------------------------------------------------------------- attention
    if "attn_kv_a_mqa.weight" in stems:
        heads = hp.get("attention.head_count", i, required=True)
        rope = hp.get("rope.dimension_count", required=True)
        kv_lora = hp.get("attention.kv_lora_rank", required=True)
        if hp.get("attention.key_length_mla") is not None:    # after llama.cpp's MLA rework (#12801)
            qk = hp.get("attention.key_length_mla")
            v_dim = hp.get("attention.value_length_mla", required=True)
        else:
            qk = hp.get("attention.key_length", required=True)
            v_dim = hp.get("attention.value_length", required=True)
        shp = _shape(stems, "attn_kv_a_mqa.weight")
        if len(shp) < 2 or shp[1] != kv_lora + rope:
            raise bad(f"attn_kv_a_mqa has {shp}, expected ({hidden}, kv_lora_rank + rope = {kv_lora + rope})")
        if qk <= rope or heads == 0:
            raise bad(f"key length {qk} must exceed the rope dimension {rope}")
        att = Attention("mla", n_heads=heads, q_lora_rank=hp.get("attention.q_lora_rank", default=0)
                        if "attn_q_a.weight" in stems else 0,
                        kv_lora_rank=kv_lora, qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=v_dim,
                        index_heads=hp.get("attention.indexer.head_count", default=0),
                        index_head_dim=hp.get("attention.indexer.key_length", default=0),
                        own_indexer="indexer.attn_k.weight" in stems, output_gate="attn_gate.weight" in stems)
    elif arch == "qwen3next" and any(k.startswith("ssm_") for k in stems):
        k_heads = hp.get("ssm.group_count", required=True)
        v_heads = hp.get("ssm.time_step_rank", required=True)
        inner = hp.get("ssm.inner_size", required=True)
        if not (k_heads and v_heads) or inner % v_heads:
            raise bad(f"ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")
        att = Attention("gdn", n_heads=v_heads, lin_k_heads=k_heads, lin_v_heads=v_heads,
                        lin_k_dim=hp.get("ssm.state_size", required=True), lin_v_dim=inner // v_heads,
                        conv_kernel=hp.get("ssm.conv_kernel", default=4))
    elif arch == "kimi-linear" and any(k.startswith("ssm_") for k in stems):
        beta = _shape(stems, "ssm_beta.weight")
        heads = beta[1] if beta and len(beta) > 1 else hp.get("attention.head_count", i, required=True)
        hd = hp.get("kda.head_dim") or (_shape(stems, "attn_q.weight") or (0, 0))[-1] // max(1, heads)
        if not heads or not hd:
            raise bad("cannot tell the KDA head count and head dimension")
        att = Attention("kda", n_heads=heads, lin_k_heads=heads, lin_v_heads=heads, lin_k_dim=hd, lin_v_dim=hd,
                        conv_kernel=hp.get("ssm.conv_kernel", default=4), full_rank_gate="ssm_f.weight" in stems)
    else:
        heads = hp.get("attention.head_count", i, required=True)
        kv = hp.get("attention.head_count_kv", i, default=heads)
        if not heads or not kv or heads % kv:
            raise bad(f"attention.head_count_kv {kv} must divide attention.head_count {heads}")
        head_dim = hp.get("attention.key_length") or hidden // heads
        window = chunk = 0
        if arch == "gpt-oss":
            # llama.cpp LLM_ARCH_OPENAI_MOE: set_swa_pattern(2) -> sliding on even layers (il % 2 < 1)
            if i % 2 == 0:
                window = hp.get("attention.sliding_window", required=True)
        elif arch == "llama4":
            # llama.cpp LLM_ARCH_LLAMA4: chunked attention, n_swa = 8192, set_swa_pattern(4) (3 chunked,
            # 1 full) unless the file sets attention.sliding_window = 0
            sw = hp.get("attention.sliding_window")
            if sw != 0 and i % 4 < 3:
                chunk = 8192
        q = _shape(stems, "attn_q.weight")
        gate = bool(q and len(q) > 1 and q[1] == 2 * heads * head_dim)   # qwen3next gated attention
        att = Attention("gqa", n_heads=heads, n_kv_heads=kv, head_dim=head_dim, window=window, chunk=chunk,
                        bias="attn_q.bias" in stems, qk_norm="attn_q_norm.weight" in stems,
                        output_gate=gate, sinks="attn_sinks.weight" in stems)
    # --------------------------------------------------------------------------- FFN
    if "ffn_gate_inp.weight" in stems:
        exps = next((stems[k] for k in ("ffn_down_exps.weight", "ffn_up_exps.weight", "ffn_gate_up_exps.weight")
                     if k in stems), None)
        if exps is None or len(exps.shape) != 3:
            raise bad("has a router (ffn_gate_inp) but no stacked expert tensors")
        n_exp = exps.shape[2]
        meta_exp = hp.get("expert_count", default=n_exp)
        if meta_exp != n_exp:
            raise bad(f"{arch}.expert_count is {meta_exp} but the expert tensors hold {n_exp}")
        if "ffn_down_exps.weight" in stems:
            ff, width = exps.shape[0], exps.shape[1]
        elif "ffn_up_exps.weight" in stems:
            width, ff = exps.shape[0], exps.shape[1]
        else:
            width, ff = exps.shape[0], exps.shape[1] // 2
        top_k = hp.get("expert_used_count", required=True)
        if not 1 <= top_k <= n_exp:
            raise bad(f"{arch}.expert_used_count {top_k} is not in [1, {n_exp}]")
        n_shared, shared_ff = 0, 0
        sh = _shape(stems, "ffn_down_shexp.weight") or _shape(stems, "ffn_up_shexp.weight")
        if sh is not None:
            total = sh[0] if "ffn_down_shexp.weight" in stems else sh[1]
            n_shared = hp.get("expert_shared_count", default=1) or 1
            if total % n_shared:
                raise bad(f"shared-expert width {total} is not a multiple of expert_shared_count {n_shared}")
            shared_ff = total // n_shared
        ffn = FFN("moe", n_experts=n_exp, top_k=top_k, expert_intermediate=ff, n_shared=n_shared,
                  shared_intermediate=shared_ff, latent_dim=width if width != hidden else 0,
                  n_group=hp.get("expert_group_count", default=1) or 1,
                  topk_group=hp.get("expert_group_used_count", default=1) or 1,
                  expert_bias=any(k.startswith(("ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"))
                                  for k in stems),
                  router_bias="exp_probs_b.bias" in stems, shared_gate="ffn_gate_inp_shexp.weight" in stems)
    else:
        up = _shape(stems, "ffn_up.weight")
        down = _shape(stems, "ffn_down.weight")
        ff = (up[1] if up and len(up) > 1 else None) or (down[0] if down else None) \
            or hp.get("feed_forward_length", i, required=True)
        ffn = FFN("dense", intermediate=ff)
    return Layer(i, att, ffn)


def _model_id(path: str) -> str:
    base = os.path.basename(path)
    m = _SPLIT_RE.match(base)
    if m:
        base = m.group("prefix")
    return re.sub(r"\.gguf$", "", base, flags=re.I) or "model"


def gguf_model(art: GGUFArtifact) -> Model:
    """The :class:`Model` a GGUF artifact describes, carrying its exact tensor table."""
    path = art.path
    arch = art.kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _err(path, "lacks general.architecture", "architecture")
    if arch not in GGUF_ARCHS:
        raise _err(path, f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(GGUF_ARCHS))}",
                   "architecture")
    hp = _HP(art, arch)
    n_blocks = hp.get("block_count", required=True)
    if not 1 <= n_blocks <= GGUF_MAX_BLOCKS:
        raise _err(path, f"{arch}.block_count {n_blocks} is not in [1, {GGUF_MAX_BLOCKS}]", f"{arch}.block_count")
    nextn = hp.get("nextn_predict_layers", default=0)
    if nextn >= n_blocks:
        raise _err(path, f"{arch}.nextn_predict_layers {nextn} leaves no main layers of {n_blocks}", "gguf")
    n_main = n_blocks - nextn
    hidden = hp.get("embedding_length", required=True)
    per_block: list = [dict() for _ in range(n_blocks)]
    table = []
    for t, _shard in art.tensors:
        m = _BLK.match(t.name)
        if m:
            b = int(m.group(1))
            if b >= n_blocks:
                raise _err(path, f"tensor {t.name!r} is in block {b} but {arch}.block_count is {n_blocks}", "gguf")
            per_block[b][m.group(2)] = t
        cls, layer = gguf_tensor_class(t.name, n_main)
        table.append((Tensor(t.name, tuple(int(d) for d in t.shape), cls, layer), t.type_name, int(t.nbytes)))
    names = {t.name: t for t, _ in art.tensors}
    emb = names.get("token_embd.weight")
    if emb is None or len(emb.shape) != 2:
        raise _err(path, "has no 2-D token_embd.weight", "gguf")
    if emb.shape[0] != hidden:
        raise _err(path, f"token_embd.weight has rows of {emb.shape[0]}, {arch}.embedding_length is {hidden}", "gguf")
    layers = []
    for i in range(n_main):
        if not per_block[i]:
            raise _err(path, f"block {i} has no tensors", "gguf")
        layers.append(_gguf_layer(art, hp, arch, i, per_block[i], hidden))
    family = GGUF_ARCHS[arch]
    has_moe = any(l.ffn.kind == "moe" for l in layers)
    if arch == "deepseek2" and not any(l.ffn.router_bias for l in layers):
        family = "deepseek_v2"              # V2 routes by softmax, V3/R1/Kimi-K2 add the noaux_tc bias
    if arch == "llama" and has_moe:
        family = "mixtral"
    ftype = _ftype_name(art.kv.get("general.file_type"))
    label = ftype or _dominant_type(table)
    name = art.kv.get("general.name")
    mid = _model_id(path)
    stored = StoredWeights(container="gguf", key=art.key, label=label, table=tuple(table),
                           files=tuple(s.path for s in art.shards), metadata=_summary(art))
    return Model(id=mid, name=name if isinstance(name, str) and name else mid, family=family, hidden=hidden,
                 vocab=emb.shape[1], tie_embeddings="output.weight" not in names, layers=tuple(layers),
                 max_context=hp.get("context_length", required=True) or 1, mtp_layers=nextn,
                 mtp_layer=_mtp_layer(layers, hidden) if nextn else None, native_quant=label,
                 source=f"GGUF {path}" + (f" ({len(art.shards)} shards)" if len(art.shards) > 1 else ""),
                 stored=stored)


def _dominant_type(table) -> str:
    by = {}
    for t, typ, nb in table:
        if len(t.shape) >= 2:
            by[typ] = by.get(typ, 0) + nb
    return max(by, key=by.get) if by else "F32"


def _summary(art: GGUFArtifact) -> dict:
    """Metadata worth showing: scalars and short arrays, never tokenizer vocabularies."""
    out = {}
    for k, v in art.kv.items():
        if k.startswith("tokenizer.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            if isinstance(v, (list, ArrayInfo)):
                out[k + ".length"] = v.count if isinstance(v, ArrayInfo) else len(v)
            continue
        if isinstance(v, ArrayInfo):
            out[k] = f"<array of {v.count}>"
        elif isinstance(v, str) and len(v) > 200:
            out[k] = v[:200] + "..."
        elif isinstance(v, list) and len(v) > 64:
            out[k] = f"<array of {len(v)}>"
        else:
            out[k] = v
    return out


def read_gguf_model(path: str | os.PathLike) -> Model:
    path = os.fspath(path)
    art = read_gguf(path)
    try:
        return gguf_model(art)
    except MoesimError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError) as exc:
        raise _err(path, f"malformed GGUF metadata ({type(exc).__name__}: {exc})", "gguf") from None


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
    return Model.from_hf_config(path)


# ----------------------------------------------------------------------------------- inspect
def inspect(path: str | os.PathLike, overrides=(), n_gpu_layers: int | None = None, gpu: str = "CUDA0",
            context: int = 4096, kv_dtype: str | None = None, tensors: bool = False) -> dict:
    """What an artifact describes: architecture, bytes per tensor class and type, what fitting it needs,
    and (with llama.cpp ``-ot`` *overrides*) bytes per device."""
    from . import quants as Q
    from .memory import check_count
    from .overrides import assign_devices, by_device, equivalent_placement
    path = os.fspath(path)
    context = check_count(context, "context")
    kind = artifact_kind(path)
    notes = []
    index_info = None
    if kind == "safetensors":
        art = read_safetensors(path)
        try:
            base = _config_for(art.directory, None)
        except MoesimError as exc:
            if not art.tensors:
                raise
            return _inspect_tensors_only(path, art, str(exc))
        m = safetensors_model(art, base)
        if art.index is not None:
            index_info = {"path": art.index.path, "tensors": len(art.index.weight_map),
                          "total_size": art.index.total_size, "shards": art.shards_total,
                          "shards_present": art.shards_present}
            if not art.tensors:
                notes.append(f"{art.shards_present} of {art.shards_total} shards present: per-tensor bytes are "
                             f"derived from the config's quantization, not read from headers")
            elif art.index.total_size is not None:
                hdr = sum(t.nbytes for t in art.tensors)
                if hdr != art.index.total_size:
                    notes.append(f"index total_size {art.index.total_size} differs from the headers' {hdr} bytes")
    elif kind == "gguf":
        m = read_gguf_model(path)
    else:
        m = Model.from_hf_config(path)
    q = Q.native_quant(m)
    if m.stored is None and kind != "gguf" and q.kind == "gguf":
        # a checkpoint described by its config: its own dtype, not llama.cpp's BF16 file rules
        q = Q.Quant(m.native_quant if m.native_quant in Q.format_ids() else "bf16", "format")
    entries = Q.assign(m, q, include_mtp=True)
    by_class: dict = {}
    by_type: dict = {}
    formats: dict = {}
    for t, typ, nb in entries:
        by_class[t.cls] = by_class.get(t.cls, 0) + nb
        bt = by_type.setdefault(typ, {"tensors": 0, "bytes": 0})
        bt["tensors"] += 1
        bt["bytes"] += nb
        fc = formats.setdefault(t.cls, {})
        fc[typ] = fc.get(typ, 0) + nb
    total = sum(nb for _t, _typ, nb in entries)
    main = total - by_class.get("mtp", 0)
    params_total, params_active = m.param_counts()
    kinds: dict = {}
    for l in m.layers:
        kinds[l.attention.kind] = kinds.get(l.attention.kind, 0) + 1
    kv = Q.canonical_kv_dtype(kv_dtype or ("f16" if q.is_gguf else "bf16"))
    kvb = Q.kv_dtype_bytes(kv)
    per_token = state = 0.0
    kv_at = 0.0
    for l in m.layers:
        tm = m.kv_terms(l)
        tokens = min(context, tm.cap) if tm.cap else context
        kv_at += (tm.elems * kvb + tm.fixed_bytes) * tokens
        if tm.ratio:
            kv_at += (context // tm.ratio) * (tm.ratio_elems * kvb + tm.ratio_fixed_bytes)
        if not tm.cap:
            per_token += tm.elems * kvb + tm.fixed_bytes
        if tm.ratio:
            per_token += (tm.ratio_elems * kvb + tm.ratio_fixed_bytes) / tm.ratio
        state += tm.state_bytes
    moe = m.moe_layers
    arch = {
        "family": m.family, "name": m.name, "layers": m.n_layers, "hidden": m.hidden, "vocab": m.vocab,
        "tie_embeddings": m.tie_embeddings, "max_context": m.max_context, "attention": kinds,
        "moe_layers": len(moe), "experts": m.n_experts, "top_k": m.top_k,
        "shared_experts": moe[0].ffn.n_shared if moe else 0, "mtp_layers": m.mtp_layers,
        "total_params": params_total, "active_params": params_active,
    }
    out = {
        "path": path, "format": kind, "model": m.id, "architecture": arch, "quant": q.id,
        "exact": m.stored is not None,
        "files": list(m.stored.files) if m.stored else ([path] if kind != "safetensors" else []),
        "tensors": len(entries),
        "weights_bytes": main, "weights_bytes_by_class": by_class, "mtp_bytes": by_class.get("mtp", 0),
        "bytes_by_type": by_type, "formats_by_class": formats,
        "kv_dtype": kv, "kv_bytes_per_token": per_token, "state_bytes_per_sequence": state,
        "fit_needs": {"context": context, "weights_bytes": main, "kv_bytes": kv_at, "state_bytes": state,
                      "total_bytes": main + kv_at + state},
        "notes": notes,
    }
    if index_info:
        out["index"] = index_info
    if m.stored is not None and m.stored.metadata:
        out["metadata"] = m.stored.metadata
    if overrides or n_gpu_layers is not None:
        placed = assign_devices(m, overrides, n_gpu_layers=n_gpu_layers, gpu=gpu, quant=q)
        out["placement"] = {
            "overrides": [str(o) for o in overrides], "n_gpu_layers": n_gpu_layers,
            "by_device": by_device(placed),
            "equivalent": (lambda p: str(p) if p is not None else None)(
                equivalent_placement(m, placed, gpu=gpu) if n_gpu_layers is None else None),
        }
        if tensors:
            out["placement"]["tensors"] = {t.name: dev for t, _typ, _nb, dev in placed}
    if tensors:
        out["tensor_table"] = [{"name": t.name, "type": typ, "shape": list(t.shape), "bytes": nb, "class": t.cls,
                                "layer": t.layer} for t, typ, nb in entries]
    return out


def _inspect_tensors_only(path: str, art: STArtifact, why: str) -> dict:
    """A safetensors artifact without a config: tensors, dtypes and bytes only."""
    by_type: dict = {}
    for t in art.tensors:
        bt = by_type.setdefault(t.dtype, {"tensors": 0, "bytes": 0})
        bt["tensors"] += 1
        bt["bytes"] += t.nbytes
    return {"path": path, "format": "safetensors", "model": None, "architecture": None, "exact": True,
            "files": sorted({t.file for t in art.tensors}), "tensors": len(art.tensors),
            "weights_bytes": sum(t.nbytes for t in art.tensors), "weights_bytes_by_class": None,
            "bytes_by_type": by_type, "notes": [why]}
