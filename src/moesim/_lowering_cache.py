"""A persistent cache of moesim's machine-independent lowering, shared by every process of one user.

What it holds: values that are pure functions of the catalog's files (their parsed TOML), a catalog entry, a quantization, a KV or indexer dtype,
a routing profile and seed, and moesim's own code -- parsed catalog models, parameter counts, per-layer
byte arrays (``engine.lower.memory``), kernel mixes (``spec.quants``), routing tables
(``engine.lower.routing``), the weights per tier of a lowering's placement candidates
(``engine.lower.placement``: a placement's split of the weights depends on no machine) and the analytic
expert-cache and page-cache table rows (``analysis.sweep.che``: a routing's digest, slots and batch). Never a machine's numbers: those change with every command. A new process
loads these instead of lowering the catalog again (``moesim cache build`` fills it ahead of time).

Where: ``$MOESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/moesim``, else ``~/.cache/moesim``;
``MOESIM_CACHE=off`` (or ``0``, ``no``, ``false``) turns it off. One folder per fingerprint (moesim's
version, the catalog's data files, the source files whose code makes the values, Python's and numpy's
versions), one file per namespace in it, read on first use. A file is trusted only when it carries the
magic line, this fingerprint and the checksum of its payload, and belongs to this user: anything else
(truncated, corrupt, another version's, another user's) is ignored and rebuilt. New entries are written
at exit (or by :func:`flush`), merged with what other processes wrote meanwhile, to a temporary file that
then replaces the old one (``os.replace``): readers see a whole old or a whole new file, and a lost
race loses entries, never correctness. A folder that cannot be written leaves the process to run
without it: a cache never fails a user's command.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.machinery
import os
import pickle
import sys
import threading
import zlib
from pathlib import Path

MAGIC = b"moesim-lowering-cache 1\n"
# namespace -> the most entries one file keeps (user-supplied profiles and seeds cannot grow it unbounded)
NAMESPACES = {"catalog": 64, "model": 1024, "params": 1024, "layer_params": 1024, "lowered": 8192, "kernel_mix": 8192, "routing": 512, "window": 128,
              "tier_weights": 8192, "che_rows": 8192, "page_rows": 16384}
KEEP_FINGERPRINTS = 4          # folders of other fingerprints (other versions, edited code) kept beside this one
_PKG = Path(__file__).resolve().parent
# the files whose contents make the cached values: the catalog, the spec layer (parsing, quantization
# rules), the lowering, the error and catalog helpers, the compiled kernel (routing's q_tables, the analytic
# tables) and the code that asks it for the analytic tables and keys them
_SOURCES = ("catalog/*.toml", "spec/*.py", "engine/lower/*.py", "engine/codes.py", "_catalog.py", "errors.py",
            "_lowering_cache.py", "engine/decode.py", "analysis/sweep/che.py")

_MISSING = object()
_LOCK = threading.RLock()
_STATE: dict = {}              # on, dir, fp, tables / dirty ({ns: {key: value}}), hits / misses, atexit


def _env_off() -> bool:
    return os.environ.get("MOESIM_CACHE", "").strip().lower() in ("off", "0", "no", "false")


def cache_dir() -> Path:
    """The folder the cache lives in (whether or not it exists)."""
    env = os.environ.get("MOESIM_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "moesim"


def _source_files() -> list:
    files = [p for pat in _SOURCES for p in _PKG.glob(pat)]
    files += [p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in _PKG.glob(f"engine/_kernel*{suffix}")]
    return sorted(set(files))


def compute_fingerprint() -> str:
    """blake2b over moesim's version, Python's and numpy's versions and the bytes of every source file
    (:data:`_SOURCES`, each with its path): a change to any of them names a new cache."""
    import numpy as np
    from . import __version__
    h = hashlib.blake2b(digest_size=32)
    h.update(f"moesim {__version__}\0{sys.implementation.cache_tag}\0numpy {np.__version__}\0".encode())
    for p in _source_files():
        h.update(p.relative_to(_PKG).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _state() -> dict:
    """The process's cache state, set up on first use (MOESIM_CACHE and the folder read then)."""
    st = _STATE
    if "on" not in st:
        with _LOCK:
            if "on" not in _STATE:
                on, fp, folder = not _env_off(), "", Path(".")
                if on:
                    try:
                        folder = cache_dir()
                        fp = compute_fingerprint()
                    except (OSError, RuntimeError, KeyError):     # no home folder, an unreadable source
                        on = False
                _STATE.update(on=on, dir=folder, fp=fp, tables={}, dirty={}, hits={}, misses={})
                if on and not _STATE.get("atexit"):
                    atexit.register(flush)
                    _STATE["atexit"] = True
    return _STATE


def enabled() -> bool:
    return _state()["on"]


def fingerprint() -> str:
    """This process's fingerprint ("" when the cache is off)."""
    return _state()["fp"]


def _folder(st: dict) -> Path:
    return st["dir"] / "lowering" / st["fp"][:24]


def _path(st: dict, ns: str) -> Path:
    return _folder(st) / f"{ns}.pkl"


def _digest(payload) -> bytes:
    """The payload's CRC-32 as 8 hex digits: catches a torn or bit-flipped file (the owner check and the
    fingerprint keep out foreign ones)."""
    return b"%08x" % zlib.crc32(payload)


def _read(path: Path, fp: str) -> dict:
    """The entries of one namespace file, {} when it is absent, foreign, corrupt or of another fingerprint."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
                return {}
            data = f.read()
    except OSError:
        return {}
    head = MAGIC + fp.encode() + b"\n"
    if not data.startswith(head) or data[len(head) + 8:len(head) + 9] != b"\n":
        return {}
    payload = memoryview(data)[len(head) + 9:]
    if _digest(payload) != data[len(head):len(head) + 8]:
        return {}
    try:
        entries = pickle.loads(payload)
    except Exception:              # a payload that passed its digest but not unpickling: another build's classes
        return {}
    return entries if type(entries) is dict else {}


def _table(st: dict, ns: str) -> dict:
    tab = st["tables"].get(ns)
    if tab is None:
        with _LOCK:
            tab = st["tables"].get(ns)
            if tab is None:
                tab = st["tables"][ns] = _read(_path(st, ns), st["fp"])
    return tab


def get(ns: str, key):
    """The cached value of *key* in namespace *ns*, or None (off, absent or unreadable)."""
    st = _state()
    if not st["on"]:
        return None
    hit = _table(st, ns).get(key)
    st["hits" if hit is not None else "misses"][ns] = st["hits" if hit is not None else "misses"].get(ns, 0) + 1
    return hit


def put(ns: str, key, value) -> None:
    """Remember *value* for *key* (written at exit or by :func:`flush`); a full namespace keeps what it has."""
    st = _state()
    if not st["on"]:
        return
    with _LOCK:
        tab = _table(st, ns)
        if key not in tab and len(tab) < NAMESPACES[ns]:
            tab[key] = value
            st["dirty"].setdefault(ns, {})[key] = value


def memo(ns: str, key, build):
    """The cached value of *key*, else ``build()`` (remembered). *key* None: not cacheable, built."""
    if key is None:
        return build()
    hit = get(ns, key)
    if hit is not None:
        return hit
    value = build()
    put(ns, key, value)
    return value


def flush() -> int:
    """Write every namespace with new entries (merged with the file as it is now); the number written.
    Any OS error (a read-only or full disk, a missing permission) leaves the cache as it was."""
    st = _state()
    if not st["on"]:
        return 0
    with _LOCK:
        dirty, st["dirty"] = st["dirty"], {}
    written = 0
    for ns, new in dirty.items():
        try:
            _write(st, ns, new)
            written += 1
        except Exception as exc:       # a full or read-only disk, an unpicklable value: never the user's command
            st["error"] = f"{_path(st, ns)}: {type(exc).__name__}: {exc}"
    if written:
        _prune(st)
    return written


def _write(st: dict, ns: str, new: dict) -> None:
    path = _path(st, ns)
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = _read(path, st["fp"])
    for k, v in new.items():
        if len(merged) < NAMESPACES[ns] or k in merged:
            merged[k] = v
    payload = pickle.dumps(merged, protocol=5)
    digest = _digest(payload)
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=f".{ns}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + st["fp"].encode() + b"\n" + digest + b"\n" + payload)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prune(st: dict) -> None:
    """Keep the KEEP_FINGERPRINTS most recently written folders of other fingerprints; remove the rest."""
    here = _folder(st)
    try:
        others = sorted((p for p in here.parent.iterdir() if p.is_dir() and p != here),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    import shutil
    for p in others[KEEP_FINGERPRINTS:]:
        shutil.rmtree(p, ignore_errors=True)


def stats() -> dict:
    """This process's lookups so far: {"hits": {namespace: n}, "misses": {namespace: n}}."""
    st = _state()
    return {"hits": dict(st["hits"]), "misses": dict(st["misses"])}


def last_error() -> "str | None":
    """What the last failed write said (None when every write so far succeeded)."""
    return _state().get("error")


def info() -> dict:
    """Where the cache is, this process's fingerprint, and per namespace its entries and bytes on disk."""
    st = _state()
    out = {"enabled": st["on"], "dir": str(st["dir"]) if st["on"] else _dir_or_none(), "fingerprint": st["fp"],
           "namespaces": {}, "bytes": 0, "other_fingerprints": 0}
    if not st["on"]:
        return out
    for ns in NAMESPACES:
        path = _path(st, ns)
        try:
            size = path.stat().st_size
        except OSError:
            continue
        out["namespaces"][ns] = {"entries": len(_read(path, st["fp"])), "bytes": size, "path": str(path)}
        out["bytes"] += size
    try:
        out["other_fingerprints"] = sum(1 for p in (st["dir"] / "lowering").iterdir()
                                        if p.is_dir() and p != _folder(st))
    except OSError:
        pass
    return out


def _dir_or_none() -> str:
    try:
        return str(cache_dir())
    except (RuntimeError, KeyError):
        return ""


def clear() -> int:
    """Remove every fingerprint's cache folder (whether or not the cache is on) and forget this process's
    entries; the folders removed."""
    st = _state()
    with _LOCK:
        st["tables"], st["dirty"] = {}, {}
    folder = _dir_or_none()
    if not folder:
        return 0
    try:
        folders = [p for p in (Path(folder) / "lowering").iterdir() if p.is_dir()]
    except OSError:
        return 0
    import shutil
    for p in folders:
        shutil.rmtree(p, ignore_errors=True)
    return len(folders)


def reset() -> None:
    """Forget the process's cache state (the environment is read again on next use): for tests."""
    with _LOCK:
        registered = _STATE.get("atexit", False)
        _STATE.clear()
        if registered:
            _STATE["atexit"] = True
