"""GGUF container reader: header, metadata and tensor table (with ``-0000k-of-0000N`` splits); no weights read."""
from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass

from ..errors import MoesimError
from .bounded import _INT64_MAX, _err


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

_GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# GGUF value types (gguf.GGUFValueType): struct format and size of the scalar ones.
_STRING, _ARRAY = 8, 9
_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
           7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}


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
    from ..spec import quants as Q
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
    from ..spec import quants as Q
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
    version, n_tensors, n_kv = _read_preamble(cur, buf, path)
    kv, kv_types = _read_metadata(cur, n_kv, path)
    alignment = _alignment(kv, kv_types, path)
    tensors = []
    names = set()
    expected = 0
    for i in range(n_tensors):
        t = _read_tensor_info(cur, i, names, expected, path)
        expected += -(-t.nbytes // alignment) * alignment
        tensors.append(t)
    data_offset = -(-cur.pos // alignment) * alignment
    for t in tensors:
        end = data_offset + t.offset + t.nbytes
        if end > size:
            raise _err(path, f"file is truncated: data of tensor {t.name!r} ends at byte {end}, the file has "
                             f"{size} bytes", "gguf")
    return GGUFShard(path=path, size=size, version=version, kv=kv, kv_types=kv_types, tensors=tensors,
                     alignment=alignment, data_offset=data_offset)


def _read_preamble(cur: _Cursor, buf, path: str) -> tuple:
    """(version, tensor count, metadata key count) after the magic; refuses other byte orders and
    versions, and counts the rest of the file cannot hold."""
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
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int, path: str) -> tuple:
    """(values, value types) of the metadata keys, in file order; a repeated key is refused."""
    kv: dict = {}
    kv_types: dict = {}
    for i in range(n_kv):
        key = cur.text(f"metadata key {i}", GGUF_MAX_KEY, strict=True)
        if key in kv:
            raise _err(path, f"duplicate metadata key {key!r}", "gguf")
        vtype = cur.u32(f"value type of {key!r}")
        kv[key] = _read_value(cur, vtype, key)
        kv_types[key] = vtype
    return kv, kv_types


def _alignment(kv: dict, kv_types: dict, path: str) -> int:
    """general.alignment (a u32 power of two), 32 when absent."""
    if "general.alignment" not in kv:
        return 32
    a = kv["general.alignment"]
    if kv_types["general.alignment"] != 4 or not isinstance(a, int) or a <= 0 or a & (a - 1):
        raise _err(path, f"general.alignment must be a power of two (u32), got {a!r}", "gguf")
    return a


def _read_tensor_info(cur: _Cursor, i: int, names: set, expected: int, path: str) -> GGUFTensorInfo:
    """Tensor info ``i``: name (unique, shorter than GGML_MAX_NAME), shape, a known type whose blocks
    divide the rows, and the data offset, which must be ``expected`` (infos are packed in file order)."""
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
    return GGUFTensorInfo(name, type_id, tname, shape, nbytes, offset)


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
