"""Sweep output on disk: deterministic chunk files (``part-NNNNNN.parquet`` / ``.csv`` / ``.jsonl``),
each written to a temporary name and renamed, and a ``_manifest.json``; resuming an interrupted sweep,
refusing to mix sweeps, and reading a finished one back. Every name that is not a part starts with ``_``
or ``.``, which pyarrow.dataset and pandas.read_parquet skip, so they read the folder as it is."""
from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from pathlib import Path

import numpy as np

from ... import __version__
from ..._catalog import catalog_version
from .spec import _err
from .table import CATEGORICAL, SweepTable, column_type


SCHEMA_VERSION = 1
FORMATS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}
MANIFEST = "_manifest.json"
_LEGACY_MANIFEST = "manifest.json"      # the name before the rename: such folders still read and resume in place


def manifest_path(out: Path) -> Path:
    """The manifest of sweep directory *out* (a sweep written before the rename keeps its old name)."""
    new, old = out / MANIFEST, out / _LEGACY_MANIFEST
    return old if old.exists() and not new.exists() else new


# =============================================================================== chunk files
def _chunk_path(out: Path, k: int, fmt: str) -> Path:
    return out / f"part-{k:06d}{FORMATS[fmt]}"


def _write_chunk(table: SweepTable, path: Path, fmt: str) -> int:
    """Write to a temporary name in the same directory, then rename (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            t = table.to_arrow().replace_schema_metadata(None)
            cats = [c for c in t.column_names if c in CATEGORICAL]
            pq.write_table(t, tmp, compression="zstd", compression_level=1, use_dictionary=cats,
                           write_statistics=cats + [c for c in ("context", "batch") if c in t.column_names])
        elif fmt == "csv":
            import pyarrow as pa
            import pyarrow.csv as pcsv
            t = table.to_arrow().replace_schema_metadata(None)
            t = pa.Table.from_arrays([c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c
                                      for c in t.columns], names=t.column_names)
            pcsv.write_csv(t, tmp)
        else:
            _write_jsonl(table, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return len(table)


def _write_jsonl(table: SweepTable, path: Path) -> None:
    """One JSON object per row; floats with repr precision, NaN as null."""
    names = list(table.columns)
    n = len(table)
    with open(path, "w", encoding="utf-8") as fh:
        step = 65536
        for a in range(0, n, step):
            b = min(n, a + step)
            cols = []
            for name in names:
                col = table[name][a:b]
                if name in table.categories:
                    cols.append([json.dumps(x) for x in col])
                elif col.dtype.kind == "f":
                    cols.append([repr(x) if math.isfinite(x) else "null" for x in col.tolist()])
                else:
                    cols.append([str(x) for x in col.tolist()])
            keys = [json.dumps(nm) + ":" for nm in names]
            fh.write("".join("{" + ",".join(k + v for k, v in zip(keys, row)) + "}\n" for row in zip(*cols)))


def _count_rows(path: Path, fmt: str) -> int:
    if fmt == "parquet":
        import pyarrow.parquet as pq
        return pq.read_metadata(path).num_rows
    with open(path, "rb") as fh:
        lines = sum(buf.count(b"\n") for buf in iter(lambda: fh.read(1 << 20), b""))
    return lines - 1 if fmt == "csv" else lines


# =============================================================================== one writer per directory
@contextlib.contextmanager
def locked(out: Path):
    """Hold ``out/.lock`` for the whole sweep, so a second sweep on the same directory is refused before
    it touches anything (it used to delete the first one's in-flight chunk). The lock is an advisory
    ``flock``: the kernel drops it when its process dies, so a killed sweep resumes without clean-up."""
    if out.exists() and not out.is_dir():
        raise _err("out", f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / ".lock", "a+", encoding="utf-8")
    try:
        try:
            import fcntl
        except ImportError:           # not POSIX: no advisory locks; one writer is the user's job
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                holder = fh.read().strip() or "another process"
                raise _err("out", f"another sweep ({holder}) is writing to {out}: wait for it to finish, "
                                  "or choose another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        yield
    finally:
        fh.close()


# =============================================================================== the manifest
def _manifest(plan, fmt: str, rows: dict | None) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "moesim": __version__,
        "catalog": catalog_version(),
        "spec_hash": plan.hash,
        "seed": plan.run["seed"],
        "mode": plan.mode,
        "format": fmt,
        "chunk_size": plan.chunk_size,
        "n_chunks": plan.n_chunks,
        "configurations": plan.total,
        "columns": [[c, column_type(c)] for c in plan.columns],
        "categories": {k: plan.dicts[k] for k in CATEGORICAL if k in plan.columns},
        "files": [_chunk_path(Path("."), k, fmt).name for k in range(plan.n_chunks)],
        "complete": rows is not None,
        "rows": sum(rows.values()) if rows is not None else None,
        "rows_per_file": [rows[k] for k in range(plan.n_chunks)] if rows is not None else None,
        "spec": plan.norm,
    }


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _check_manifest(out: Path, man_path: Path, plan, fmt: str) -> dict:
    """The existing manifest, refused when it belongs to another sweep."""
    try:
        old = json.loads(man_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise _err("out", f"{man_path} is unreadable: remove {out} or choose another --out") from None
    for key, mine in (("schema_version", SCHEMA_VERSION), ("moesim", __version__), ("catalog", catalog_version()),
                      ("spec_hash", plan.hash), ("format", fmt)):
        if old.get(key) != mine:
            what = {"spec_hash": "a different spec", "format": "another format"}.get(key, f"another {key}")
            raise _err("out", f"{out} holds a sweep of {what} ({key} {old.get(key)!r}, this sweep "
                              f"{mine!r}); refusing to mix them: choose another --out or remove it")
    return old


def _prepare_out(out: Path, plan, fmt: str) -> dict | None:
    """Check an existing output directory against this sweep; returns its manifest when complete."""
    man_path = manifest_path(out)
    if out.exists() and not out.is_dir():
        raise _err("out", f"{out} exists and is not a directory")
    if man_path.exists():
        old = _check_manifest(out, man_path, plan, fmt)
        if old.get("complete"):
            return old
    elif out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
        raise _err("out", f"{out} is not empty and has no {MANIFEST}: not a moesim sweep directory")
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob(".part-*.tmp-*"):
        p.unlink(missing_ok=True)
    if not man_path.exists():
        _write_json(man_path, _manifest(plan, fmt, None))
    return None


def _pending(out: Path, plan, fmt: str) -> list:
    """Chunks without a finished file."""
    return [k for k in range(plan.n_chunks) if not _chunk_path(out, k, fmt).exists()]


def _finish(out: Path, plan, fmt: str) -> dict:
    rows = {k: _count_rows(_chunk_path(out, k, fmt), fmt) for k in range(plan.n_chunks)}
    man = _manifest(plan, fmt, rows)
    _write_json(manifest_path(out), man)
    return man


# =============================================================================== reading back
def _read_file(p: Path, fmt: str):
    if fmt == "parquet":
        import pyarrow.parquet as pq
        return pq.read_table(p)
    if fmt == "csv":
        import pyarrow.csv as pcsv
        return pcsv.read_csv(p)
    import pyarrow.json as pjson
    return pjson.read_json(p) if p.stat().st_size else None


def _column_part(a, c: str, cats: dict, kind: str) -> np.ndarray:
    """One file's column c as the table holds it (categorical codes into the manifest's dictionaries)."""
    import pyarrow as pa
    if c in CATEGORICAL:
        if pa.types.is_dictionary(a.type):
            dic = a.dictionary.to_pylist()
            codes = np.asarray(a.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
            remap = np.array([cats[c].index(x) for x in dic], dtype=np.int32)
            return remap[codes] if len(dic) else codes.astype(np.int32)
        lut = {x: i for i, x in enumerate(cats[c])}
        return np.array([lut[x] for x in a.to_pylist()], dtype=np.int32)
    arr = a.to_numpy(zero_copy_only=False)
    if kind == "float64":
        arr = _nulls_to_nan(arr)
    return np.asarray(arr)


def read(out) -> SweepTable:
    """Read a finished sweep directory back as one table (loads every row: for modest sweeps)."""
    outp = Path(out)
    try:
        man = json.loads(manifest_path(outp).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise _err("out", f"{outp} has no readable {MANIFEST}: not a moesim sweep directory") from None
    if not man.get("complete"):
        raise _err("out", f"{outp} is not a finished sweep (run the same command again to finish it)")
    tables = [t for t in (_read_file(outp / name, man["format"]) for name in man["files"]) if t is not None]
    cats = man["categories"]
    cols = {}
    for c, kind in man["columns"]:
        parts = [_column_part(t.column(c).combine_chunks(), c, cats, kind) for t in tables if c in t.column_names]
        cols[c] = np.concatenate(parts) if parts else np.zeros(0)
    return SweepTable(cols, cats, {k: man[k] for k in ("moesim", "catalog", "seed", "spec_hash", "mode")})


def _nulls_to_nan(arr) -> np.ndarray:
    """Nulls (NaN written as JSON null) back to NaN."""
    if arr.dtype == object:
        return np.array([np.nan if x is None else x for x in arr], dtype=np.float64)
    return np.asarray(arr, dtype=np.float64)
