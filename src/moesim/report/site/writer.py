"""Lay a site's data out into files: ``index.json``, ``machines/<id>.json``, ``models/<id>.json``, each
also as ``<name>.json.js`` (the same JSON passed to ``moesimSite.receive``, so the page can load it with
a ``<script>`` element from ``file://``, where browsers refuse ``fetch``), ``schema/*.schema.json`` and
the page's ``index.html``, ``site.js`` and ``site.css``."""
from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path

from ...errors import MoesimError


SCHEMA_VERSION = 2
KINDS = ("index", "machine", "model")
STATIC_FILES = ("index.html", "site.js", "site.css")
# Significant digits kept of each float: far below the model's own uncertainty, and it keeps files small.
FLOAT_DIGITS = 6
_SLUG = re.compile(r"[^a-z0-9._-]+")


def _package_file(*parts: str) -> bytes:
    return resources.files(__package__).joinpath(*parts).read_bytes()


def load_schema(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of one file kind: ``index``, ``machine`` or ``model``."""
    if kind not in KINDS:
        raise ValueError(f"no schema for {kind!r}; kinds: {KINDS}")
    return json.loads(_package_file("schema", f"{kind}.schema.json"))


def _slugs(ids: list) -> dict:
    """A distinct, file-name-safe name per id (``4090-192g``, ``dgx-h200``; ``a+b`` -> ``a-b``)."""
    out, used = {}, set()
    for i in ids:
        base = _SLUG.sub("-", str(i).lower()).strip("-.") or "item"
        name, n = base, 2
        while name in used:
            name, n = f"{base}-{n}", n + 1
        used.add(name)
        out[i] = name
    return out


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.{FLOAT_DIGITS}g}")
    return x


def _header(kind: str, data: dict) -> dict:
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "moesim_version": data["moesim_version"],
            "catalog_version": data["catalog_version"]}


def site_files(data: dict) -> dict:
    """Every data file of the site: relative path -> JSON-ready dict (the index, one file per machine
    and per model)."""
    fields = list(data["fields"])
    rows = [[_round(x) for x in r] for r in data["rows"]]
    by = {kind: {} for kind in ("machine", "model")}
    where = {kind: fields.index(kind) for kind in by}
    for r in rows:
        for kind, i in where.items():
            by[kind].setdefault(r[i], []).append(r)
    files, entries = {}, {}
    for kind, folder, key in (("machine", "machines", "machines"), ("model", "models", "models")):
        names = _slugs([e["id"] for e in data[key]])
        entries[key] = []
        for e in data[key]:
            mine = by[kind].get(e["id"], [])
            path = f"{folder}/{names[e['id']]}.json"
            entry = dict(e, file=path, script=path + ".js", rows=len(mine))
            entries[key].append(entry)
            files[path] = dict(_header(kind, data), **{kind: entry, "fields": fields, "rows": mine})
    files["index.json"] = dict(
        _header("index", data), title=data["site"]["title"], description=data["site"]["description"],
        sweep=data["sweep"], fields=fields, machines=entries["machines"], models=entries["models"],
        quants=data["quants"], runtimes=data["runtimes"], placement_rules=data["placement_rules"],
        contexts=data["contexts"], batches=data["batches"],
        schemas={k: f"schema/{k}.schema.json" for k in KINDS})
    return files


def check_out(out) -> None:
    """A new or empty folder, or one that holds an earlier export (its index.json): nothing else is
    overwritten."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MoesimError(f"{out} is a file; give a folder for the site", "out")
    if not out.is_dir():
        _check_creatable(out)
        return
    if not any(out.iterdir()):
        return
    try:
        kind = json.loads((out / "index.json").read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind != "index":
        raise MoesimError(f"{out} is not empty and holds no moesim site (index.json): give a new or empty "
                          "folder, or an earlier export's", "out")


def _check_creatable(out: Path) -> None:
    """A folder that does not exist yet can be made: its nearest existing ancestor is a writable folder
    (checked before the sweep, not after it)."""
    up = out.absolute().parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise MoesimError(f"cannot make {out}: {up} is a file, not a folder", "out")
    if not os.access(up, os.W_OK | os.X_OK):
        raise MoesimError(f"cannot make {out}: folder {up} is not writable", "out")


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _json_bytes(obj: dict) -> bytes:
    # ASCII only: the same bytes are valid JSON and a valid JavaScript expression, whatever the encoding
    # a browser assumes for a file:// script
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _remove_stale(out: Path, keep: set) -> None:
    """Machine and model files of an earlier export that this one no longer has."""
    for folder in ("machines", "models"):
        for p in (out / folder).glob("*.json*"):
            rel = f"{folder}/{p.name}"
            if rel not in keep and rel.removesuffix(".js") not in keep:
                p.unlink()


def write_site(data: dict, out) -> dict:
    """Write the site of *data* (:func:`moesim.analysis.site.site_data`) into folder *out*; returns a
    summary (folder, counts, bytes written)."""
    outp = Path(out)
    check_out(outp)
    files = site_files(data)
    written = 0
    try:
        for folder in ("machines", "models", "schema"):
            (outp / folder).mkdir(parents=True, exist_ok=True)
        for rel, obj in files.items():
            body = _json_bytes(obj)
            _write(outp / rel, body)
            script = b"moesimSite.receive(" + body + b");\n"
            _write(outp / (rel + ".js"), script)
            written += len(body) + len(script)
        for kind in KINDS:
            body = _package_file("schema", f"{kind}.schema.json")
            _write(outp / "schema" / f"{kind}.schema.json", body)
            written += len(body)
        for name in STATIC_FILES:
            body = _package_file("static", name)
            _write(outp / name, body)
            written += len(body)
        _remove_stale(outp, set(files))
    except OSError as exc:
        raise MoesimError(f"cannot write the site to {outp}: {exc.strerror or exc}", "out") from None
    return {"out": str(outp), "page": str(outp / "index.html"), "machines": len(data["machines"]),
            "models": len(data["models"]), "rows": len(data["rows"]),
            "files": 2 * len(files) + len(KINDS) + len(STATIC_FILES), "bytes": written}


def site_text(summary: dict, seconds: float) -> str:
    """The line ``moesim export-site`` prints."""
    return (f"site: {summary['machines']} machines, {summary['models']} models, {summary['rows']:,} rows in "
            f"{summary['files']} files ({summary['bytes'] / 2**20:.2f} MiB) in {seconds:.1f} s\n"
            f"open {summary['page']}")
