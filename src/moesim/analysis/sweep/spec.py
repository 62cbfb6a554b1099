"""The sweep spec: axes, zips, filters and run options, validated into one canonical dict (its hash
names the sweep), and the machines it names, built once per process."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import threading
from pathlib import Path

import numpy as np

from ...engine.codes import MODES, POLICIES
from ...errors import MoesimError, unknown_id
from ...ingest import model as get_model
from ...spec import quants as Q
from ...spec.hardware import Machine, machine as make_machine
from ...spec.limits import MAX_STEPS, check_count
from ...spec.placement import parse as parse_placement
from ...spec.runtimes import runtime as get_runtime


# simulate()'s options as axes (issue 19). A sweep that leaves one out runs simulate's default (None: no
# expert cache, no prefetch, no drafts, the family's acceptance, the runtime's layout, the family's routing);
# the normalized spec (and its hash) and the output columns hold only those the spec gives, so a sweep that
# gives none is the one it was before they existed. ``prompt`` (prompt tokens; as an axis it replaces
# run.prompt) and ``ubatch`` (llama.cpp -ub; the llama.cpp family only) set what prefill reads.
OPTION_AXES = ("cache_experts", "prefetch_recall", "mtp", "mtp_acceptance", "parallel", "routing", "prompt",
               "ubatch")
AXES = ("models", "quants", "machines", "runtimes", "kv_dtypes", "placements", "policies") + OPTION_AXES + (
    "contexts", "batches")
SLOW_AXES = AXES[:-2]
REQUIRED_AXES = ("models", "quants", "machines")
AXIS_DEFAULTS = {"runtimes": ["auto"], "kv_dtypes": ["auto"], "placements": ["auto"], "policies": ["lru"],
                 "contexts": [4096], "batches": [1]}
OPTION_DEFAULT = [None]
SECTIONS = ("axes", "zip", "filter", "run")
RUN_DEFAULTS = {"mode": "analytic", "seed": 0, "chunk_size": 1 << 19, "prompt": 512, "tokens": 256,
                "warmup": None}
FILTERABLE = ("context", "batch", "weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes",
              "host_bytes", "storage_bytes", "max_context", "max_batch", "decode_tok_s", "aggregate_tok_s",
              "tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "prefill_tok_s", "expert_hit_rate")


# Points of one contexts/batches axis: a million depths or batch sizes is far past any useful grid, and
# bounds the arrays a range expands into (8 MB) before they are allocated.
MAX_AXIS_POINTS = 1 << 20
# Kernel threads and local dask workers: the kernel takes a C int, and thousands of either is far past
# any machine (the largest sockets have a few hundred hardware threads).
MAX_THREADS = 1 << 12


def _err(where: str, message: str) -> MoesimError:
    return MoesimError(message, where)


def _as_list(value, where: str) -> list:
    if isinstance(value, (str, dict, Machine)) or not hasattr(value, "__iter__"):
        value = [value]
    out = list(value)
    if not out:
        raise _err(where, "empty axis: give at least one value")
    return out


def _count(value, where: str, minimum: int = 1, maximum: int = 2**40) -> int:
    try:
        return check_count(value, where, minimum, maximum)
    except MoesimError as exc:
        raise _err(where, str(exc).split(": ", 1)[-1]) from None


# =============================================================================== integer axes
def _int_range(value: dict, where: str) -> dict:
    """A range table {start, stop, num[, log]} / {start, stop, step}, checked."""
    known = {"start", "stop", "num", "log", "step"}
    bad = sorted(set(value) - known)
    if bad:
        raise _err(f"{where}.{bad[0]}", "unknown range key; use start, stop and num (log = true for "
                                        "log spacing) or step")
    if "start" not in value or "stop" not in value:
        raise _err(where, "a range needs start and stop")
    start, stop = _count(value["start"], f"{where}.start"), _count(value["stop"], f"{where}.stop")
    if stop < start:
        raise _err(f"{where}.stop", f"must be >= start ({start}), got {stop}")
    if ("num" in value) == ("step" in value):
        raise _err(where, "a range takes exactly one of num and step")
    log = value.get("log", False)
    if not isinstance(log, bool):
        raise _err(f"{where}.log", f"must be true or false, got {log!r}")
    if "num" in value:
        num = _count(value["num"], f"{where}.num")
        if num > MAX_AXIS_POINTS:
            raise _err(f"{where}.num", f"must be <= {MAX_AXIS_POINTS:,} points, got {num:,}")
        return {"start": start, "stop": stop, "num": num, "log": log}
    if log:
        raise _err(f"{where}.log", "log spacing takes num, not step")
    step = _count(value["step"], f"{where}.step")
    if (stop - start) // step + 1 > MAX_AXIS_POINTS:
        raise _err(f"{where}.step", f"gives {(stop - start) // step + 1:,} points, more than {MAX_AXIS_POINTS:,}")
    return {"start": start, "stop": stop, "step": step}


def _int_axis(value, where: str) -> "list | dict":
    """A list of positive integers, or a range table {start, stop, num[, log]} / {start, stop, step}."""
    if isinstance(value, dict):
        return _int_range(value, where)
    return [_count(v, f"{where}[{i}]") for i, v in enumerate(_as_list(value, where))]


def expand_int_axis(v) -> np.ndarray:
    """The integers of a normalized contexts/batches axis (ranges rounded, duplicates dropped)."""
    if isinstance(v, list):
        return np.asarray(v, dtype=np.int64)
    if "step" in v:
        return np.arange(v["start"], v["stop"] + 1, v["step"], dtype=np.int64)
    if v["num"] == 1:
        return np.asarray([v["start"]], dtype=np.int64)
    pts = (np.geomspace(v["start"], v["stop"], v["num"]) if v["log"]
           else np.linspace(v["start"], v["stop"], v["num"]))
    vals = np.rint(pts).astype(np.int64)
    vals[0], vals[-1] = v["start"], v["stop"]
    _, first = np.unique(vals, return_index=True)
    return vals[np.sort(first)]


def _axis_len(v) -> int:
    return len(expand_int_axis(v)) if isinstance(v, dict) else len(v)


# =============================================================================== machines
def _machine_value(v, where: str):
    """A catalog machine id, or a table of moesim.machine() arguments (optional `name` labels it)."""
    if isinstance(v, Machine):
        d = dataclasses.asdict(v)
        return {"__machine__": json.loads(json.dumps(d, sort_keys=True, default=list))}
    if isinstance(v, str):
        make_machine_cached(v, where)
        return v.strip().lower()
    if isinstance(v, dict) and set(v) == {"__machine__"}:
        make_machine_cached(v, where)
        return v
    if isinstance(v, dict):
        args = {k: v[k] for k in sorted(v)}
        allowed = set(make_machine.__code__.co_varnames[:make_machine.__code__.co_argcount
                                                         + make_machine.__code__.co_kwonlyargcount]) | {"name"}
        bad = sorted(set(args) - allowed)
        if bad:
            raise unknown_id("machine argument", bad[0], sorted(allowed), where)
        if "name" in args and (not isinstance(args["name"], str) or not args["name"].strip()):
            raise _err(f"{where}.name", "must be a non-empty string")
        make_machine_cached(args, where)
        return args
    raise _err(where, f"expected a catalog machine id or a table of machine() arguments, got {v!r}")


def _machine_build(v) -> Machine:
    if isinstance(v, str):
        return make_machine(v)
    if "__machine__" in v:
        d = dict(v["__machine__"])
        for k in ("cpu_isa", "assumptions"):
            d[k] = tuple(d.get(k) or ())
        return Machine(**d)
    args = {k: x for k, x in v.items() if k != "name"}
    return make_machine(args.pop("id", None), **args)


_MACHINES: dict = {}
_MACHINES_LOCK = threading.Lock()


def make_machine_cached(v, where: str = "machines") -> Machine:
    """The Machine of a normalized machines-axis value, built once per process (every thread gets the
    same object)."""
    key = json.dumps(v, sort_keys=True)
    hit = _MACHINES.get(key)
    if hit is not None:
        return hit
    try:
        built = _machine_build(v)
    except MoesimError as exc:
        raise _err(where, str(exc)) from None
    except TypeError as exc:
        raise _err(where, f"bad machine arguments: {exc}") from None
    with _MACHINES_LOCK:
        return _MACHINES.setdefault(key, built)


def machine_label(v) -> str:
    if isinstance(v, str):
        return v
    if "__machine__" in v:
        return str(v["__machine__"]["id"])
    if "name" in v:
        return v["name"].strip()
    return ",".join(f"{k}={v[k]}" for k in sorted(v))


# =============================================================================== string axes
def _resolves(q: str, model_id: str) -> bool:
    try:
        Q.resolve(q, get_model(model_id))
        return True
    except MoesimError:
        return False


def _model_value(s: str, models) -> str:
    return get_model(s).id


def _quant_value(s: str, models) -> str:
    if s.lower() != "native":
        try:
            Q.resolve(s)
        except MoesimError:
            # a model's own checkpoint label resolves only against that model
            if not any(_resolves(s, mid) for mid in models):
                raise
    return s


def _runtime_value(s: str, models) -> str:
    s = s.lower()
    return s if s == "auto" else get_runtime(s).id


def _kv_value(s: str, models) -> str:
    s = s.lower()
    return s if s == "auto" else Q.canonical_kv_dtype(s)


def _placement_value(s: str, models) -> str:
    s = s.lower()
    return s if s == "auto" else str(parse_placement(s)).replace("=-1", "")


def _policy_value(s: str, models) -> str:
    s = s.lower()
    if s not in POLICIES:
        raise unknown_id("cache policy", s, POLICIES, "policy")
    return s


def _parallel_value(s: str, models) -> str:
    from ..resolve import _PARALLEL_RE
    s = s.lower()
    if s != "auto" and not _PARALLEL_RE.match(s):
        raise _err("parallel", f"unknown layout {s!r}: use auto, tpN, epN, tpN-epM[-attn-dp], layer-split, "
                               "row-split or pipeline")
    return s


def _routing_value(s: str, models) -> str:
    from ...spec import routing as R
    s = s.lower()
    return s if s == "auto" else R.profile(s).id


_STRING_AXES = {"models": _model_value, "quants": _quant_value, "runtimes": _runtime_value, "kv_dtypes": _kv_value,
                "placements": _placement_value, "policies": _policy_value, "parallel": _parallel_value,
                "routing": _routing_value}


def _number(v, where: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)
    if not ok or not (lo < v if lo_open else lo <= v) or v > hi:
        raise _err(where, f"must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _option_axis(name: str, value, where: str) -> list:
    """cache_experts (GPU expert-cache slots, ints >= 0), prefetch_recall ([0, 1]), mtp (drafts, 0..64),
    mtp_acceptance ((0, 1]), prompt (tokens >= 1), ubatch (1..MAX_UBATCH): simulate's checks, naming
    axes.<name>[i] and the value."""
    from ...spec.limits import MAX_DRAFTS, MAX_UBATCH
    out = []
    for i, v in enumerate(_as_list(value, where)):
        w = f"{where}[{i}]"
        if name in ("cache_experts", "mtp"):
            out.append(_count(v, w, 0, MAX_DRAFTS if name == "mtp" else 2**31 - 1))
        elif name in ("prompt", "ubatch"):
            out.append(_count(v, w, 1, MAX_UBATCH) if name == "ubatch" else _count(v, w))
        else:
            out.append(_number(v, w, 0.0, 1.0, lo_open=name == "mtp_acceptance"))
    return out


def _normalize_axis(name: str, value, models=()) -> "list | dict":
    where = f"axes.{name}"
    if name in ("contexts", "batches"):
        return _int_axis(value, where)
    if name in ("cache_experts", "prefetch_recall", "mtp", "mtp_acceptance", "prompt", "ubatch"):
        return _option_axis(name, value, where)
    out = []
    for i, v in enumerate(_as_list(value, where)):
        w = f"{where}[{i}]"
        if name == "machines":
            out.append(_machine_value(v, w))
            continue
        if not isinstance(v, str) or not v.strip():
            raise _err(w, f"expected a non-empty string, got {v!r}")
        try:
            out.append(_STRING_AXES[name](v.strip(), models))
        except MoesimError as exc:
            raise _err(w, str(exc)) from None
    return out


# =============================================================================== sections
def _normalize_axes(spec: dict) -> dict:
    axes_in = spec.get("axes", {})
    if not isinstance(axes_in, dict):
        raise _err("axes", "expected a table of axes")
    for k in axes_in:
        if k not in AXES:
            raise unknown_id("axis", k, AXES, f"axes.{k}")
    for k in REQUIRED_AXES:
        if k not in axes_in:
            raise _err(f"axes.{k}", "missing: models, quants and machines are required")
    axes = {}
    for name in AXES:
        if name in OPTION_AXES and name not in axes_in:
            continue
        axes[name] = _normalize_axis(name, axes_in[name] if name in axes_in else AXIS_DEFAULTS[name],
                                     axes.get("models", ()))
    labels = [machine_label(v) for v in axes["machines"]]
    if len(set(labels)) != len(labels):
        dup = next(x for x in labels if labels.count(x) > 1)
        raise _err("axes.machines", f"two machines share the label {dup!r}: give inline tables a distinct `name`")
    return axes


def _normalize_zip(zin, axes: dict) -> list:
    if isinstance(zin, dict):
        bad = sorted(set(zin) - {"groups"})
        if bad:
            raise _err(f"zip.{bad[0]}", "unknown key; [zip] takes groups = [[\"models\", \"quants\"], ...]")
        zin = zin.get("groups", [])
    if not isinstance(zin, list) or any(not isinstance(g, (list, tuple)) for g in zin):
        raise _err("zip", "expected a list of axis lists, e.g. [[\"models\", \"quants\"]]")
    zips, seen = [], set()
    for gi, grp in enumerate(zin):
        where = f"zip[{gi}]"
        if len(grp) < 2:
            raise _err(where, "a zipped group needs at least two axes")
        for a in grp:
            if a not in AXES:
                raise unknown_id("axis", a, AXES, where)
            if a in seen:
                raise _err(where, f"axis {a!r} is in two zipped groups")
            seen.add(a)
        lens = {a: _axis_len(axes.get(a, OPTION_DEFAULT)) for a in grp}
        if len(set(lens.values())) != 1:
            raise _err(where, "zipped axes must have equal lengths, got "
                       + ", ".join(f"{a}={n}" for a, n in lens.items()))
        fast = {"contexts", "batches"} & set(grp)
        if fast and set(grp) != {"contexts", "batches"}:
            raise _err(where, "contexts and batches may be zipped only with each other")
        zips.append(sorted(grp, key=AXES.index))
    return zips


# fits: keep rows that fit (true) or do not (false); skip_inapplicable: drop combinations that cannot
# run instead of refusing the spec; allow_beyond_max_context: keep contexts above a model's trained
# maximum (dropped by default, as fit and simulate refuse them).
_BOOL_FILTERS = ("fits", "skip_inapplicable", "allow_beyond_max_context")


def _normalize_filter(fin) -> dict:
    if not isinstance(fin, dict):
        raise _err("filter", "expected a table")
    filt = {}
    for k, v in fin.items():
        where = f"filter.{k}"
        if k in _BOOL_FILTERS:
            if not isinstance(v, bool):
                raise _err(where, f"must be true or false, got {v!r}")
            filt[k] = v
        elif k in FILTERABLE:
            if not isinstance(v, dict) or not v or set(v) - {"min", "max"}:
                raise _err(where, "expected {min = X} and/or {max = Y}")
            for b, x in v.items():
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                    raise _err(f"{where}.{b}", f"must be a finite number, got {x!r}")
            filt[k] = {b: float(v[b]) for b in sorted(v)}
        else:
            raise unknown_id("filter", k, _BOOL_FILTERS + FILTERABLE, where)
    return filt


def _normalize_run(rin, axes: dict) -> dict:
    if not isinstance(rin, dict):
        raise _err("run", "expected a table")
    for k in rin:
        if k not in RUN_DEFAULTS:
            raise unknown_id("run option", k, RUN_DEFAULTS, f"run.{k}")
    if rin.get("prompt") is not None and "prompt" in axes:
        raise _err("run.prompt", "the prompt is an axis of this spec (axes.prompt): give it there alone")
    run = dict(RUN_DEFAULTS)
    run.update({k: v for k, v in rin.items() if v is not None})
    if not isinstance(run["mode"], str) or run["mode"].lower() not in MODES:
        raise unknown_id("mode", run["mode"], MODES, "run.mode")
    run["mode"] = run["mode"].lower()
    run["seed"] = _count(run["seed"], "run.seed", 0)
    run["chunk_size"] = _count(run["chunk_size"], "run.chunk_size")
    run["prompt"] = _count(run["prompt"], "run.prompt")
    run["tokens"] = _count(run["tokens"], "run.tokens", maximum=MAX_STEPS)
    if run["warmup"] is None:
        run["warmup"] = min(32, run["tokens"] // 4)
    run["warmup"] = _count(run["warmup"], "run.warmup", 0)
    if run["warmup"] >= run["tokens"]:
        raise _err("run.warmup", f"must be smaller than tokens ({run['tokens']}), got {run['warmup']}")
    if run["mode"] == "analytic" and "belady" in axes["policies"]:
        raise _err("axes.policies", "belady is an offline bound that needs the future: use run.mode = "
                                    "\"montecarlo\"")
    if run["mode"] == "montecarlo":
        for name, off in (("mtp", 0), ("prefetch_recall", 0.0)):
            if any(x != off for x in axes.get(name, ())):
                raise _err(f"axes.{name}", "a sweep runs drafts and prefetch on the analytic path only: use "
                                           "run.mode = \"analytic\" (or moesim.simulate for Monte Carlo)")
    if run["mode"] == "analytic":
        run["tokens"], run["warmup"] = RUN_DEFAULTS["tokens"], min(32, RUN_DEFAULTS["tokens"] // 4)
    return run


def normalize_spec(spec: dict) -> dict:
    """Validate a sweep spec (the TOML's tables as a dict) into its canonical form; a MoesimError names
    the offending field (``axes.quants[2]: ...``)."""
    if not isinstance(spec, dict):
        raise _err("spec", f"expected a table, got {type(spec).__name__}")
    for k in spec:
        if k not in SECTIONS:
            raise unknown_id("section", k, SECTIONS, "spec")
    axes = _normalize_axes(spec)
    zips = _normalize_zip(spec.get("zip", []), axes)
    filt = _normalize_filter(spec.get("filter", {}))
    run = _normalize_run(spec.get("run", {}), axes)
    return {"axes": axes, "zip": zips, "filter": filt, "run": run}


def spec_hash(norm: dict) -> str:
    text = json.dumps(norm, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# =============================================================================== files and keywords
def load_spec(path) -> dict:
    """Read a sweep spec TOML file."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise _err("spec", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _err("spec", f"{path} is not UTF-8 text (TOML): {exc.reason} at byte {exc.start}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _err("spec", f"{path} is not valid TOML: {exc}") from None


def build_spec(spec=None, **kw) -> dict:
    """Merge a spec (TOML path or dict) with keyword axes / options into one spec dict."""
    if spec is None:
        s = {}
    elif isinstance(spec, (str, os.PathLike)):
        s = load_spec(spec)
    elif isinstance(spec, dict):
        try:
            s = json.loads(json.dumps(spec, default=_jsonable))
        except (TypeError, ValueError, RecursionError) as exc:     # a set, an object, a table holding itself
            raise _err("spec", f"expected tables of TOML values: {exc}") from None
    else:
        raise _err("spec", f"expected a TOML path or a dict, got {type(spec).__name__}")
    for k in SECTIONS:
        s.setdefault(k, {} if k != "zip" else [])
    prompt = kw.get("prompt")
    if isinstance(prompt, (list, tuple, np.ndarray)):
        s["axes"]["prompt"] = list(prompt)      # several prompt lengths: the prompt axis
        kw = dict(kw, prompt=None)
    for a in AXES:
        if a != "prompt" and kw.get(a) is not None:       # one prompt length is the run option
            s["axes"][a] = kw[a]
    if kw.get("zip") is not None:
        s["zip"] = [list(g) for g in kw["zip"]]
    if kw.get("filter") is not None:
        s["filter"] = dict(kw["filter"])
    for k in RUN_DEFAULTS:
        if kw.get(k) is not None:
            s["run"][k] = kw[k]
    if not s["zip"]:
        s.pop("zip")
    return s


def _jsonable(x):
    if isinstance(x, Machine):
        return {"__machine__": json.loads(json.dumps(dataclasses.asdict(x), sort_keys=True, default=list))}
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not serialisable: {x!r}")
