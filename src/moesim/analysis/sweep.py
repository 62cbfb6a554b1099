"""Sweeps: ``moesim.sweep(...)`` and ``moesim sweep SPEC.toml --out PATH``.

A sweep is the cartesian product (with optional zipped axes) of models x quants x machines x runtimes x
KV dtypes x placements x policies x contexts x batches. Everything but context and batch forms a
*group*, lowered once (Python, per group): memory tables over layer kinds (:class:`_kernel.SweepMemory`)
and decode *variants* (placement, host page-cache slots, batch), each the analytic kernel's step time
with attention zeroed plus the attention kinds whose time depends on context
(:class:`_kernel.SweepDecode`). The configurations of a group then run in C loops (csrc/ms_sweep.c)
with the GIL released and OpenMP threads; nothing runs per configuration in Python.

Output is written in deterministic chunks of global configuration indices (``part-NNNNNN.parquet`` /
``.csv`` / ``.jsonl``), each to a temporary name and renamed, with a ``manifest.json`` (schema version,
moesim and catalog versions, seed, spec hash). A sweep interrupted at any point and restarted with the
same command skips the finished chunks and ends with the same files; a finished one does nothing; a
different spec on an existing directory is refused. ``--scheduler`` / ``--local-workers`` run the
chunks on dask.distributed (each worker runs the same kernel; same files).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import __version__
from ..spec import quants as Q
from .._catalog import catalog_version
from ..errors import KernelError, MoesimError, unknown_id
from ..spec.hardware import Machine, machine as make_machine
from ..spec.limits import check_count
from ..engine.lower.memory import configure, default_kv_dtype, lower
from ..engine.memory import evaluate
from ..engine.glue import handle_library_error
from ..ingest import model as get_model
from ..spec.placement import Placement, parse as parse_placement
from ..spec.runtimes import default_runtime, runtime as get_runtime
from ..engine.codes import MODES, POLICIES, SWEEP_AUTO_KT, SWEEP_AUTO_LLAMA, SWEEP_FIXED, placement_code
from ..engine.lower.attention import kv_read_fn, score_fn
from ..engine.lower.placement import placement_candidates


SCHEMA_VERSION = 1
AXES = ("models", "quants", "machines", "runtimes", "kv_dtypes", "placements", "policies", "contexts", "batches")
SLOW_AXES = AXES[:-2]
REQUIRED_AXES = ("models", "quants", "machines")
AXIS_DEFAULTS = {"runtimes": ["auto"], "kv_dtypes": ["auto"], "placements": ["auto"], "policies": ["lru"],
                 "contexts": [4096], "batches": [1]}
SECTIONS = ("axes", "zip", "filter", "run")
RUN_DEFAULTS = {"mode": "analytic", "seed": 0, "chunk_size": 1 << 19, "prompt": 512, "tokens": 256,
                "warmup": None}
FORMATS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}
RESOURCES = ("gpu_memory", "gpu_compute", "host_memory", "cpu_compute", "pcie", "storage", "latency",
             "interconnect")
_TIERS = ("gpu", "host", "storage")
FITS_LABELS = tuple("+".join(t for i, t in enumerate(_TIERS) if b >> i & 1) or "no" for b in range(8)) + tuple(
    "+".join(("unified" if t == "gpu" else t) for i, t in enumerate(_TIERS) if b >> i & 1) for b in range(1, 8))
CATEGORICAL = ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy", "fits", "bottleneck")
MEMORY_COLUMNS = ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
                  "storage_bytes", "max_context", "max_batch")
DECODE_COLUMNS = ("decode_tok_s", "aggregate_tok_s", "tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "prefill_tok_s",
                  "expert_hit_rate", "bottleneck")
FILTERABLE = ("context", "batch", "weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes",
              "host_bytes", "storage_bytes", "max_context", "max_batch", "decode_tok_s", "aggregate_tok_s",
              "tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "prefill_tok_s", "expert_hit_rate")
_INT_COLUMNS = {"context", "batch", "max_context", "max_batch"}


def column_names(mode: str) -> tuple:
    """Output columns, in order, for a sweep of this mode."""
    dec = DECODE_COLUMNS if mode == "montecarlo" else tuple(c for c in DECODE_COLUMNS
                                                             if c not in ("tpot_p50_ms", "tpot_p99_ms"))
    return ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy", "context", "batch",
            "fits") + MEMORY_COLUMNS + dec


# =============================================================================== the spec
def _err(where: str, message: str) -> MoesimError:
    return MoesimError(message, where)


def _as_list(value, where: str) -> list:
    if isinstance(value, (str, dict, Machine)) or not hasattr(value, "__iter__"):
        value = [value]
    out = list(value)
    if not out:
        raise _err(where, "empty axis: give at least one value")
    return out


def _count(value, where: str, minimum: int = 1) -> int:
    try:
        return check_count(value, where, minimum)
    except MoesimError as exc:
        raise _err(where, str(exc).split(": ", 1)[-1]) from None


def _int_axis(value, where: str) -> "list | dict":
    """A list of positive integers, or a range table {start, stop, num[, log]} / {start, stop, step}."""
    if isinstance(value, dict):
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
            if num > 10**9:
                raise _err(f"{where}.num", f"is implausibly large ({num})")
            return {"start": start, "stop": stop, "num": num, "log": log}
        if log:
            raise _err(f"{where}.log", "log spacing takes num, not step")
        return {"start": start, "stop": stop, "step": _count(value["step"], f"{where}.step")}
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


def make_machine_cached(v, where: str = "machines") -> Machine:
    key = json.dumps(v, sort_keys=True)
    if key not in _MACHINES:
        try:
            _MACHINES[key] = _machine_build(v)
        except MoesimError as exc:
            raise _err(where, str(exc)) from None
        except TypeError as exc:
            raise _err(where, f"bad machine arguments: {exc}") from None
    return _MACHINES[key]


def machine_label(v) -> str:
    if isinstance(v, str):
        return v
    if "__machine__" in v:
        return str(v["__machine__"]["id"])
    if "name" in v:
        return v["name"].strip()
    return ",".join(f"{k}={v[k]}" for k in sorted(v))


def _normalize_axis(name: str, value, models=()) -> "list | dict":
    where = f"axes.{name}"
    if name in ("contexts", "batches"):
        return _int_axis(value, where)
    vals = _as_list(value, where)
    out = []
    for i, v in enumerate(vals):
        w = f"{where}[{i}]"
        if name == "machines":
            out.append(_machine_value(v, w))
            continue
        if not isinstance(v, str) or not v.strip():
            raise _err(w, f"expected a non-empty string, got {v!r}")
        s = v.strip()
        try:
            if name == "models":
                s = get_model(s).id
            elif name == "quants":
                if s.lower() != "native":
                    try:
                        Q.resolve(s)
                    except MoesimError:
                        # a model's own checkpoint label resolves only against that model
                        if not any(_resolves(s, mid) for mid in models):
                            raise
            elif name == "runtimes":
                s = s.lower()
                if s != "auto":
                    s = get_runtime(s).id
            elif name == "kv_dtypes":
                s = s.lower()
                if s != "auto":
                    s = Q.canonical_kv_dtype(s)
            elif name == "placements":
                s = s.lower()
                if s != "auto":
                    s = str(parse_placement(s)).replace("=-1", "")
            elif name == "policies":
                s = s.lower()
                if s not in POLICIES:
                    raise unknown_id("cache policy", s, POLICIES, "policy")
        except MoesimError as exc:
            raise _err(w, str(exc)) from None
        out.append(s)
    return out


def normalize_spec(spec: dict) -> dict:
    """Validate a sweep spec (the TOML's tables as a dict) into its canonical form; a MoesimError names
    the offending field (``axes.quants[2]: ...``)."""
    if not isinstance(spec, dict):
        raise _err("spec", f"expected a table, got {type(spec).__name__}")
    for k in spec:
        if k not in SECTIONS:
            raise unknown_id("section", k, SECTIONS, "spec")
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
        axes[name] = _normalize_axis(name, axes_in[name] if name in axes_in else AXIS_DEFAULTS[name],
                                     axes.get("models", ()))
    labels = [machine_label(v) for v in axes["machines"]]
    if len(set(labels)) != len(labels):
        dup = next(x for x in labels if labels.count(x) > 1)
        raise _err("axes.machines", f"two machines share the label {dup!r}: give inline tables a distinct `name`")

    zin = spec.get("zip", [])
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
        lens = {a: _axis_len(axes[a]) for a in grp}
        if len(set(lens.values())) != 1:
            raise _err(where, "zipped axes must have equal lengths, got "
                       + ", ".join(f"{a}={n}" for a, n in lens.items()))
        fast = {"contexts", "batches"} & set(grp)
        if fast and set(grp) != {"contexts", "batches"}:
            raise _err(where, "contexts and batches may be zipped only with each other")
        zips.append(sorted(grp, key=AXES.index))

    fin = spec.get("filter", {})
    if not isinstance(fin, dict):
        raise _err("filter", "expected a table")
    filt = {}
    for k, v in fin.items():
        where = f"filter.{k}"
        if k in ("fits", "skip_inapplicable"):
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
            raise unknown_id("filter", k, ("fits", "skip_inapplicable") + FILTERABLE, where)

    rin = spec.get("run", {})
    if not isinstance(rin, dict):
        raise _err("run", "expected a table")
    for k in rin:
        if k not in RUN_DEFAULTS:
            raise unknown_id("run option", k, RUN_DEFAULTS, f"run.{k}")
    run = dict(RUN_DEFAULTS)
    run.update({k: v for k, v in rin.items() if v is not None})
    if not isinstance(run["mode"], str) or run["mode"].lower() not in MODES:
        raise unknown_id("mode", run["mode"], MODES, "run.mode")
    run["mode"] = run["mode"].lower()
    run["seed"] = _count(run["seed"], "run.seed", 0)
    run["chunk_size"] = _count(run["chunk_size"], "run.chunk_size")
    run["prompt"] = _count(run["prompt"], "run.prompt")
    run["tokens"] = _count(run["tokens"], "run.tokens")
    if run["warmup"] is None:
        run["warmup"] = min(32, run["tokens"] // 4)
    run["warmup"] = _count(run["warmup"], "run.warmup", 0)
    if run["warmup"] >= run["tokens"]:
        raise _err("run.warmup", f"must be smaller than tokens ({run['tokens']}), got {run['warmup']}")
    if run["mode"] == "analytic" and "belady" in axes["policies"]:
        raise _err("axes.policies", "belady is an offline bound that needs the future: use run.mode = "
                                    "\"montecarlo\"")
    if run["mode"] == "analytic":
        run["tokens"], run["warmup"] = RUN_DEFAULTS["tokens"], min(32, RUN_DEFAULTS["tokens"] // 4)
    return {"axes": axes, "zip": zips, "filter": filt, "run": run}


def _resolves(q: str, model_id: str) -> bool:
    try:
        Q.resolve(q, get_model(model_id))
        return True
    except MoesimError:
        return False


def _axis_len(v) -> int:
    return len(expand_int_axis(v)) if isinstance(v, dict) else len(v)


def spec_hash(norm: dict) -> str:
    text = json.dumps(norm, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _err("spec", f"{path} is not valid TOML: {exc}") from None


# =============================================================================== the plan
class Plan:
    """The grid of a normalized spec: dimensions (zips vary together), groups, chunks, dictionaries."""

    def __init__(self, norm: dict):
        self.norm = norm
        self.hash = spec_hash(norm)
        ax = norm["axes"]
        self.run = norm["run"]
        self.mode = self.run["mode"]
        self.contexts = expand_int_axis(ax["contexts"])
        self.batches = expand_int_axis(ax["batches"])
        if self.batches.max() > 2**30:
            raise _err("axes.batches", f"batch {int(self.batches.max())} exceeds 2^30")
        self.values = {a: ax[a] for a in SLOW_AXES}
        zipped = {a: tuple(g) for g in norm["zip"] for a in g}
        dims, done = [], set()
        for a in SLOW_AXES:
            if a in done:
                continue
            grp = zipped.get(a, (a,))
            done.update(grp)
            dims.append((grp, len(self.values[grp[0]])))
        self.dims = dims
        self.n_groups = int(np.prod([n for _, n in dims], dtype=np.int64)) if dims else 1
        self.fast_zipped = "contexts" in zipped
        self.n_c, self.n_b = len(self.contexts), len(self.batches)
        if self.fast_zipped and self.n_c != self.n_b:
            raise _err("zip", f"zipped contexts ({self.n_c}) and batches ({self.n_b}) differ in length "
                              "after expanding ranges")
        self.block = self.n_c if self.fast_zipped else self.n_c * self.n_b
        self.total = self.n_groups * self.block
        self.chunk_size = self.run["chunk_size"]
        self.n_chunks = max(1, -(-self.total // self.chunk_size))
        self.columns = column_names(self.mode)
        self._groups: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._check_combinations()

    # ---------------------------------------------------------------- indices
    def group_axes(self, g: int) -> dict:
        """Axis index per slow axis of group g (last dimension fastest)."""
        idx = {}
        rest = g
        for grp, n in reversed(self.dims):
            rest, i = divmod(rest, n)
            for a in grp:
                idx[a] = i
        return idx

    # ---------------------------------------------------------------- combinations and dictionaries
    def _check_combinations(self):
        """Resolve every (model, quant), (model, machine, placement) and runtime/KV combination once:
        inapplicable ones are errors naming them, or skipped with filter.skip_inapplicable."""
        skip = self.norm["filter"].get("skip_inapplicable", False)
        v = self.values
        self.bad: dict = {}
        self.dicts = {k: [] for k in CATEGORICAL}
        self._codes = {k: {} for k in CATEGORICAL}
        self.resolved: dict = {}
        for mi, mid in enumerate(v["models"]):
            m = get_model(mid)
            self._code("model", m.id)
            for qi, qname in enumerate(v["quants"]):
                try:
                    q = Q.resolve(qname, m)
                    lower(m, q)
                except MoesimError as exc:
                    self._bad(("mq", mi, qi), skip, f"axes.quants[{qi}]",
                              f"{qname!r} does not apply to {m.id}: {exc}")
                    continue
                self.resolved[("q", mi, qi)] = q
                self._code("quant", q.id)
                for hi, hv in enumerate(v["machines"]):
                    mach = make_machine_cached(hv)
                    for ri, rname in enumerate(v["runtimes"]):
                        rt = default_runtime(q, mach) if rname == "auto" else get_runtime(rname, model=m.id)
                        self.resolved[("rt", mi, qi, hi, ri)] = rt
                        self._code("runtime", rt.id)
                        for ki, kname in enumerate(v["kv_dtypes"]):
                            kv = Q.canonical_kv_dtype(default_kv_dtype(q, rt, m) if kname == "auto" else kname)
                            self.resolved[("kv", mi, qi, hi, ri, ki)] = kv
                            self._code("kv_dtype", kv)
                        for pi, pname in enumerate(v["placements"]):
                            key = ("p", mi, hi, pi, rt.id)
                            if key in self.resolved or ("mhp", mi, hi, pi) in self.bad:
                                continue
                            try:
                                cands, rule = placement_candidates(m, mach, rt, pname)
                            except MoesimError as exc:
                                self._bad(("mhp", mi, hi, pi), skip, f"axes.placements[{pi}]",
                                          f"{pname!r} on {m.id} / {machine_label(hv)}: {exc}")
                                continue
                            self.resolved[key] = (cands, rule)
                            for p in cands:
                                self._code("placement", str(p))
        for hv in v["machines"]:
            self._code("machine", machine_label(hv))
        for p in v["policies"]:
            self._code("policy", p)
        for lab in FITS_LABELS:
            self._code("fits", lab)
        self.fits_codes = np.array([[self._codes["fits"][FITS_LABELS[b]] for b in range(8)],
                                    [self._codes["fits"][FITS_LABELS[7 + b] if b else "no"] for b in range(8)]],
                                   dtype=np.int32)
        for r in RESOURCES:
            self._code("bottleneck", r)

    def _bad(self, key, skip: bool, where: str, message: str):
        if not skip:
            raise _err(where, message + " (set filter.skip_inapplicable = true to drop such combinations)")
        self.bad[key] = message

    def _code(self, col: str, value: str) -> int:
        codes = self._codes[col]
        if value not in codes:
            codes[value] = len(self.dicts[col])
            self.dicts[col].append(value)
        return codes[value]

    def skipped(self, ix: dict) -> bool:
        return (("mq", ix["models"], ix["quants"]) in self.bad
                or ("mhp", ix["models"], ix["machines"], ix["placements"]) in self.bad)

    # ---------------------------------------------------------------- groups
    def group(self, g: int) -> "Group":
        with self._lock:
            if g in self._groups:
                self._groups.move_to_end(g)
                return self._groups[g]
        grp = Group(self, g)
        with self._lock:
            self._groups[g] = grp
            while len(self._groups) > 8:
                self._groups.popitem(last=False)
        return grp


# =============================================================================== one group
_MEM_CFG_KEYS = ("kv_bytes_per_elem", "mtp", "n_gpus", "gpu_capacity", "host_capacity", "storage_capacity",
                 "storage_spill", "embed_on_gpu", "kv_granularity", "gpu_fixed", "gpu_buf0", "gpu_buf_ctx",
                 "host_fixed", "host_buf0", "host_buf_ctx")


class Group:
    """One group's lowered tables: memory (SweepMemory) and decode variants (SweepDecode), grown on demand."""

    def __init__(self, plan: Plan, g: int):
        from ..engine.lower import routing as R_routing
        from ..spec import routing as R
        self.plan = plan
        self.g = g
        ix = plan.group_axes(g)
        self.ix = ix
        self.skip = plan.skipped(ix)
        v = plan.values
        self.labels = {"model": None, "machine": machine_label(v["machines"][ix["machines"]]),
                       "policy": v["policies"][ix["policies"]]}
        if self.skip:
            return
        m = self.m = get_model(v["models"][ix["models"]])
        self.q = plan.resolved[("q", ix["models"], ix["quants"])]
        self.machine = make_machine_cached(v["machines"][ix["machines"]])
        self.rt = plan.resolved[("rt", ix["models"], ix["quants"], ix["machines"], ix["runtimes"])]
        self.kv = plan.resolved[("kv", ix["models"], ix["quants"], ix["machines"], ix["runtimes"], ix["kv_dtypes"])]
        self.cands, self.rule = plan.resolved[("p", ix["models"], ix["machines"], ix["placements"], self.rt.id)]
        self.policy = POLICIES[self.labels["policy"]]
        self.low = lower(m, self.q)
        self.kernel_mix = Q.kernel_mix(m, self.q)
        self.kvb = Q.kv_dtype_bytes(self.kv)
        self.labels.update(model=m.id, quant=self.q.id, runtime=self.rt.id, kv_dtype=self.kv)
        self.codes = {k: plan._codes[k][self.labels[k]] for k in ("model", "quant", "machine", "runtime",
                                                                   "kv_dtype", "policy")}
        self.place_codes = np.array([plan._codes["placement"][str(p)] for p in self.cands], dtype=np.int32)
        self.E = m.n_experts
        self.mem_tables = self._memory_tables()
        from ..engine import _kernel
        self.mem = _kernel.SweepMemory(self.mem_tables)
        cfg = configure(m, self.low, self.machine, self.rt, self.cands[0], 1, 1, self.kv, 0)
        self.kv_bytes_per_token = float(evaluate(self.low, cfg)["kv_bytes_per_token"][0])
        self.routing = R_routing.lower(R_routing.RoutingDims.of(m), R.profile(None, family=m.family), plan.run["seed"])
        self.layer_kv = [kv_read_fn(m, self.low, l, self.kvb) for l in range(m.n_layers)]
        self.layer_sf = [score_fn(layer) for layer in m.layers]
        fns: dict = {}
        self.layer_fn = np.array([fns.setdefault((kf, sf), len(fns)) for kf, sf in zip(self.layer_kv, self.layer_sf)],
                                 dtype=np.int32)
        self.fns = list(fns)
        self.keys: list = []
        self.variants: list = []        # (f64[13], i32[3]) rows of ms_sweep_variant_t
        self.kind_rows: list = []       # (f64[5], i32[3]) rows of ms_sweep_kind_t
        self.mc_models: list = []
        self.mc_machines: list = []
        self._dm: dict = {}
        self._hw: dict = {}
        self._kinds: dict = {}
        self._prefill: dict = {}
        self.table_keys = np.zeros(0, dtype=np.int64)
        self.table_index = np.zeros(0, dtype=np.int32)
        self.dec = None

    # ---------------------------------------------------------------- memory
    def _memory_tables(self) -> dict:
        m, low, mach, rt = self.m, self.low, self.machine, self.rt
        L, kvb = m.n_layers, self.kvb
        kinds, kind_of = {}, np.empty(L, dtype=np.int64)
        for l in range(L):
            key = (float(low.kv_elems[l] * kvb + low.kv_fixed[l]), int(low.kv_cap[l]), int(low.kv_ratio[l]),
                   float(low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]), float(low.kv_state[l]))
            kind_of[l] = kinds.setdefault(key, len(kinds))
        K = len(kinds)
        rows = list(kinds)
        count = np.bincount(kind_of, minlength=K).astype(np.int32)
        gpu_count = np.zeros((L + 3, K), dtype=np.int32)
        gpu_count[0] = count                                  # layout 0: every layer on the GPU
        for k in range(L + 1):                                # layout 2 + k: layers-gpu = k
            gpu_count[2 + k] = np.bincount(kind_of[L - k:], minlength=K) if k else 0
        cfgs = []
        for p in (Placement("all-gpu"), Placement("cpu-only")):
            c = configure(m, low, mach, rt, p, 1, 1, self.kv, 0)
            cfgs.append({k: c[k] for k in _MEM_CFG_KEYS})
        pl = {k: [] for k in ("code", "arg", "layout", "cfg", "any_gpu", "label", "w_gpu", "w_host", "routed_host")}
        idx = {"all-gpu": -1, "n-cpu-moe": -1, "layers-gpu": -1, "cpu-only": -1, "experts-cpu": -1,
               "gpu-experts": -1}
        cfg_gpu = cfgs[0]
        for j, p in enumerate(self.cands):
            if idx.get(p.kind, 0) == -1:
                idx[p.kind] = j
            w = place_weights(m, low, p, bool(cfg_gpu["embed_on_gpu"]))
            cpu_only = p.kind == "cpu-only" or mach.n_gpus == 0
            pl["code"].append(placement_code(p))
            pl["arg"].append(max(0, p.arg))
            pl["layout"].append(1 if p.kind == "cpu-only" else (2 + p.arg if p.kind == "layers-gpu" else 0))
            pl["cfg"].append(1 if cpu_only else 0)
            pl["label"].append(int(self.place_codes[j]))
            for k in ("any_gpu", "w_gpu", "w_host", "routed_host"):
                pl[k].append(w[k])
        return dict(per_token=[r[0] for r in rows], cap=[r[1] for r in rows], ratio=[r[2] for r in rows],
                    ratio_bytes=[r[3] for r in rows], state=[r[4] for r in rows], count=count,
                    gpu_count=gpu_count, max_context=int(low.max_context), cfg=cfgs, places=pl, rule=self.rule,
                    n_layers=L, n_experts=self.E, i_all_gpu=idx["all-gpu"], i_n_cpu_moe=idx["n-cpu-moe"],
                    i_layers_gpu=idx["layers-gpu"], i_cpu_only=idx["cpu-only"], i_experts_cpu=idx["experts-cpu"],
                    i_gpu_experts=idx["gpu-experts"], fits_label=self.plan.fits_codes[1 if mach.unified else 0])

    # ---------------------------------------------------------------- decode variants
    def decode_key(self, key: int) -> tuple:
        n_b = self.plan.n_b
        rest, bi = divmod(int(key), n_b)
        j, ps = divmod(rest, self.E + 2)
        return j, ps, bi

    def _op_offload(self, p: Placement, tokens_per_step: int) -> bool:
        """decode.lower_model's choice to copy CPU experts to the GPU at this step size (the one thing
        about a placement's lowered model that depends on the batch)."""
        from ..engine.lower.decode_model import op_offload_threshold
        cpu_only = p.kind == "cpu-only" or self.machine.n_gpus == 0
        return not cpu_only and tokens_per_step >= op_offload_threshold(self.rt, self.m)

    def _lowered(self, j: int, b: int) -> tuple:
        from ..engine.lower.machine import lower_machine
        from ..engine.lower.decode_model import lower_model
        p = self.cands[j]
        flag = self._op_offload(p, b)
        if (j, flag) not in self._dm:
            self._dm[(j, flag)] = lower_model(self.m, self.low, p, self.machine, self.rt, 1, self.kv, b)
        if j not in self._hw:
            self._hw[j] = lower_machine(self.machine, self.rt, p, self.kernel_mix)
        return self._dm[(j, flag)], self._hw[j], flag

    @staticmethod
    def _zeroed(dm: dict) -> dict:
        z = dict(dm)
        for k in ("attn_bytes", "attn_flops", "kv_bytes", "score_flops", "shared_bytes", "shared_flops"):
            z[k] = np.zeros_like(np.asarray(dm[k], dtype=np.float64))
        return z

    def _kind_slice(self, j: int, dm: dict, hw: dict) -> tuple:
        if j in self._kinds:
            return self._kinds[j]
        on_gpu = np.asarray(dm["attn_on_gpu"])
        table: dict = {}
        for l in range(self.m.n_layers):
            g = bool(on_gpu[l])
            key = (g, float(dm["attn_bytes"][l] + dm["shared_bytes"][l]),
                   float(dm["attn_flops"][l] + dm["shared_flops"][l]), int(self.layer_fn[l]))
            table[key] = table.get(key, 0) + 1
        start = len(self.kind_rows)
        for (g, ab, af, fn), n in table.items():
            self.kind_rows.append(kind_row(n, g, ab, af, fn, hw))
        self._kinds[j] = (start, len(table))
        return self._kinds[j]

    def add_variants(self, keys) -> None:
        """Lower the decode variants of these keys (one analytic kernel run per placement and page-cache size)."""
        from ..engine.prefill import prefill
        from ..engine.decode import run
        todo: dict = {}
        for key in sorted(set(int(k) for k in keys) - set(self.keys)):
            j, ps, bi = self.decode_key(key)
            if not (0 <= j < len(self.cands)) or not (0 <= bi < self.plan.n_b):
                raise KernelError(f"sweep: bad variant key {key}")
            b = int(self.plan.batches[bi])
            dm, hw, flag = self._lowered(j, b)
            todo.setdefault((j, flag, ps), []).append((key, b))
        mc = self.plan.mode == "montecarlo"
        run_cfg = self.plan.run
        for (j, flag, ps), items in todo.items():
            dm, hw, _ = self._lowered(j, items[0][1])
            dm = dict(dm)
            dm["page_slots"] = np.full(self.m.n_layers, ps, dtype=np.int32)
            dm0 = self._zeroed(dm)
            if (j, flag) not in self._prefill:
                # the prompt is prefilled from an empty cache, so its time does not depend on the swept context
                self._prefill[(j, flag)] = prefill(self.m, dm, hw, self.routing, self.rt, run_cfg["prompt"], 1)[1]
            pf0 = self._prefill[(j, flag)]
            kind0, nk = self._kind_slice(j, dm, hw)
            res = None
            if not mc:
                bs = [b for _, b in items]
                n = len(bs)
                cols = dict(batch=bs, tokens_per_step=[1] * n, drafts=[0] * n, accepted=[1.0] * n,
                            steps=[run_cfg["tokens"]] * n, warmup=[run_cfg["warmup"]] * n, policy=[self.policy] * n,
                            mode=[1] * n, seed=[run_cfg["seed"]] * n, index=[0] * n)
                res = run(dm0, hw, self.routing, cols)
            mc_index = -1
            if mc:
                mc_index = len(self.mc_models)
                self.mc_models.append(dm)
                self.mc_machines.append(hw)
            for i, (key, b) in enumerate(items):
                f64 = np.zeros(13)
                if res is not None:
                    f64[0] = res["step_mean"][i]
                    f64[1:9] = res["by_resource"][i]
                    f64[9] = res["accepted"][i]
                    f64[11] = res["hit_rate"][i]
                else:
                    f64[9] = 1.0
                    f64[11] = -1.0
                f64[10] = 1e3 / f64[9]
                f64[12] = pf0
                self.keys.append(key)
                self.variants.append((f64, np.array([kind0, nk, mc_index], dtype=np.int32)))
        order = np.argsort(np.asarray(self.keys, dtype=np.int64), kind="stable")
        self.table_keys = np.asarray(self.keys, dtype=np.int64)[order]
        self.table_index = order.astype(np.int32)
        self._build_decode()

    def _build_decode(self) -> None:
        from ..engine import _kernel
        # the kernel indexes variants in sorted-key order
        vf = np.array([self.variants[i][0] for i in self.table_index]).reshape(-1, 13)
        vi = np.array([self.variants[i][1] for i in self.table_index]).reshape(-1, 3)
        kr = self.kind_rows
        t = dict(variant_f64=vf, variant_i32=vi,
                 kind_f64=np.array([r[0] for r in kr]).reshape(-1, 5),
                 kind_i32=np.array([r[1] for r in kr], dtype=np.int32).reshape(-1, 3),
                 fn_kv_f=np.array([f[0][0] for f in self.fns]).reshape(-1, 5),
                 fn_kv_c=np.array([f[0][1] for f in self.fns], dtype=np.int64).reshape(-1, 4),
                 fn_sf_f=np.array([f[1][0] for f in self.fns]).reshape(-1, 5),
                 fn_sf_c=np.array([f[1][1] for f in self.fns], dtype=np.int64).reshape(-1, 4),
                 prompt=float(self.plan.run["prompt"]))
        if self.plan.mode == "montecarlo":
            run_cfg = self.plan.run
            t["mc"] = dict(layer_fn=self.layer_fn, models=self.mc_models, machines=self.mc_machines, routing=self.routing,
                           steps=run_cfg["tokens"], warmup=run_cfg["warmup"], policy=self.policy,
                           seed=run_cfg["seed"])
        self.dec_tables = t
        self.dec = _kernel.SweepDecode(t)

    def resolve_variants(self, keys: np.ndarray, variant: np.ndarray) -> None:
        from ..engine import _kernel
        for _ in range(1000):
            unknown, missing = _kernel.sweep_lookup(keys, self.table_keys, variant)
            if unknown == 0:
                return
            self.add_variants(missing)
        raise KernelError("sweep: variant lookup did not converge")


def kind_row(n: int, on_gpu: bool, ab: float, af: float, fn: int, hw: dict) -> tuple:
    """Precomputed decode coefficients of one attention kind (ms_sweep_kind_t; ab: attention + shared
    weight bytes, af: their FLOPs per token)."""
    bw = hw["gpu_bw"] if on_gpu else hw["host_bw"]
    fl = hw["gpu_flops"] if on_gpu else hw["cpu_flops"]
    f64 = [float(n), ab / bw, 1.0 / bw, af / fl, 1.0 / fl]
    return f64, [0, 1, fn] if on_gpu else [2, 3, fn]


def place_weights(m, low, p: Placement, embed_on_gpu: bool) -> dict:
    """Weight bytes per tier of placement p, summed as ms_memory.c account() does (exact integers)."""
    L = m.n_layers
    w_gpu = w_host = routed_host = 0.0
    any_gpu = False
    for l in range(L):
        if p.kind == "cpu-only":
            on = False
        elif p.kind == "layers-gpu":
            on = l >= L - p.arg
        else:
            on = True
        base = float(low.attn[l] + low.router[l] + low.shared[l] + low.dense[l])
        any_gpu |= on
        if on:
            w_gpu += base
        else:
            w_host += base
        e = int(low.n_experts[l])
        if not e:
            continue
        ge = he = 0
        if p.kind in ("all-gpu", "unified"):
            ge = e
        elif p.kind in ("experts-cpu", "cpu-only"):
            he = e
        elif p.kind == "n-cpu-moe":
            he, ge = (e, 0) if l < p.arg else (0, e)
        elif p.kind == "gpu-experts":
            ge = min(p.arg, e)
            he = e - ge
        elif p.kind == "layers-gpu":
            ge, he = (e, 0) if on else (0, e)
        elif p.kind == "offload-cache":
            ge, he = min(p.arg, e), e
        eo = float(low.expert_one[l])
        if ge > 0:
            any_gpu = True
        w_gpu += ge * eo
        w_host += he * eo
        routed_host += he * eo
    head_gpu = not (p.kind == "cpu-only" or (p.kind == "layers-gpu" and p.arg == 0))
    emb_gpu = embed_on_gpu and head_gpu
    if head_gpu:
        w_gpu += float(low.head)
        any_gpu = True
    else:
        w_host += float(low.head)
    if emb_gpu:
        w_gpu += float(low.embed)
    else:
        w_host += float(low.embed)
    return {"w_gpu": w_gpu, "w_host": w_host, "routed_host": routed_host, "any_gpu": int(any_gpu)}


# =============================================================================== running chunks
def _empty_columns(plan: Plan, n: int) -> dict:
    """Uninitialised output columns (every row is written by the kernels or dropped)."""
    out = {}
    for c in ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy", "fits", "bottleneck"):
        out[c] = np.empty(n, dtype=np.int32)
    for c in ("context", "batch", "max_context", "max_batch"):
        out[c] = np.empty(n, dtype=np.int64)
    for c in ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
              "storage_bytes") + DECODE_COLUMNS[:-1]:
        if plan.mode == "montecarlo" or c not in ("tpot_p50_ms", "tpot_p99_ms"):
            out[c] = np.empty(n, dtype=np.float64)
    out["_key"] = np.empty(n, dtype=np.int64)
    out["_variant"] = np.empty(n, dtype=np.int32)
    return out


def run_range(plan: Plan, start: int, end: int, threads: int = 1, buffers: dict | None = None) -> dict:
    """Columns of global configurations [start, end) (rows dropped by filters removed). With
    ``buffers`` (from :func:`_empty_columns`, at least end - start rows, reused across chunks so the
    kernels write into memory already mapped) the columns returned are views into them."""
    from ..engine import _kernel
    n = end - start
    if buffers is None:
        buffers = _empty_columns(plan, n)
    cols = {k: v[:n] for k, v in buffers.items()}
    keep = None
    key = cols.pop("_key")
    variant = cols.pop("_variant")
    mc = plan.mode == "montecarlo"
    g0, g1 = start // plan.block, (end - 1) // plan.block
    for g in range(g0, g1 + 1) if n > 0 else ():
        a = max(start, g * plan.block)
        b = min(end, (g + 1) * plan.block)
        s0, s1 = a - start, b - start
        grp = plan.group(g)
        if grp.skip:
            if keep is None:
                keep = np.ones(n, dtype=bool)
            keep[s0:s1] = False
            continue
        for k, v in grp.codes.items():
            cols[k][s0:s1] = v
        view = {k: cols[k][s0:s1] for k in _kernel.MEM_OUT_I32 + _kernel.MEM_OUT_I64 + _kernel.MEM_OUT_F64
                if k != "key"}
        view["key"] = key[s0:s1]
        code, bad = _kernel.sweep_memory(grp.mem, plan.contexts, plan.batches, plan.fast_zipped, a - g * plan.block,
                                         b - a, threads, view)
        handle_library_error(code, "ms_sweep_memory", start + s0 + max(bad, 0))
        cols["kv_bytes_per_token"][s0:s1] = grp.kv_bytes_per_token
        var = variant[s0:s1]
        grp.resolve_variants(view["key"], var)
        dview = {k: cols[k][s0:s1] for k in DECODE_COLUMNS if mc or k not in ("tpot_p50_ms", "tpot_p99_ms")}
        if not mc:
            code, bad = _kernel.sweep_analytic(grp.dec, view["context"], view["batch"], var, threads, dview)
        else:
            idx = np.arange(a, b, dtype=np.uint64)
            code, bad = _kernel.sweep_montecarlo(grp.dec, view["context"], view["batch"], var, idx, threads, dview)
        handle_library_error(code, "ms_sweep_analytic" if not mc else "ms_sweep_montecarlo", start + s0 + max(bad, 0))
    filt = plan.norm["filter"]
    for k, bounds in filt.items():
        if k == "skip_inapplicable":
            continue
        if keep is None:
            keep = np.ones(n, dtype=bool)
        if k == "fits":
            keep &= (cols["fits"] != plan.fits_codes[0][0]) == bounds
            continue
        if "min" in bounds:
            keep &= cols[k] >= bounds["min"]
        if "max" in bounds:
            keep &= cols[k] <= bounds["max"]
    names = plan.columns
    if keep is None or keep.all():
        return {c: cols[c] for c in names}
    return {c: cols[c][keep] for c in names}


def run_chunk(plan: Plan, k: int, threads: int = 1, buffers: dict | None = None) -> dict:
    start = k * plan.chunk_size
    return run_range(plan, start, min(plan.total, start + plan.chunk_size), threads, buffers)


# =============================================================================== the table
class SweepTable:
    """Sweep results as numpy columns; categorical columns hold int32 codes into ``categories[name]``.

    ``table["decode_tok_s"]`` is a numpy array (strings for categorical columns), ``len(table)`` the row
    count, ``table.to_arrow()`` a pyarrow Table (dictionary-encoded categoricals) and ``table.to_pandas()``
    a DataFrame (pandas categoricals)."""

    def __init__(self, columns: dict, categories: dict, metadata: dict | None = None):
        self.columns = columns
        self.categories = {k: list(v) for k, v in categories.items() if k in columns}
        self.metadata = dict(metadata or {})

    @property
    def column_names(self) -> list:
        return list(self.columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.columns:
            raise KeyError(name)
        if name in self.categories:
            return np.asarray(self.categories[name], dtype=object)[self.columns[name]]
        return self.columns[name]

    def codes(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __repr__(self) -> str:
        return f"SweepTable({len(self)} rows x {len(self.columns)} columns)"

    def to_arrow(self):
        import pyarrow as pa
        arrays, fields = [], []
        for name, col in self.columns.items():
            if name in self.categories:
                arr = pa.DictionaryArray.from_arrays(pa.array(col, type=pa.int32()),
                                                     pa.array(self.categories[name], type=pa.string()))
            else:
                arr = pa.array(col)
            arrays.append(arr)
            fields.append(pa.field(name, arr.type))
        meta = {b"moesim": json.dumps(self.metadata, sort_keys=True).encode()} if self.metadata else None
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=meta))

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    def to_dicts(self) -> list:
        """Rows as dicts (small tables)."""
        cols = {k: self[k].tolist() for k in self.columns}
        return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


def _concat(parts: list, names: tuple) -> dict:
    if not parts:
        return {c: np.zeros(0) for c in names}
    return {c: np.concatenate([p[c] for p in parts]) for c in names}


# =============================================================================== writing
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


def _manifest(plan: Plan, fmt: str, rows: dict | None) -> dict:
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
        "columns": [[c, "category" if c in CATEGORICAL else ("int64" if c in _INT_COLUMNS else "float64")]
                    for c in plan.columns],
        "categories": {k: plan.dicts[k] for k in CATEGORICAL},
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


def _prepare_out(out: Path, plan: Plan, fmt: str) -> dict | None:
    """Check an existing output directory against this sweep; returns its manifest when complete."""
    man_path = out / "manifest.json"
    if out.exists() and not out.is_dir():
        raise _err("out", f"{out} exists and is not a directory")
    if man_path.exists():
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
        if old.get("complete"):
            return old
    elif out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
        raise _err("out", f"{out} is not empty and has no manifest.json: not a moesim sweep directory")
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob(".part-*.tmp-*"):
        p.unlink(missing_ok=True)
    if not man_path.exists():
        _write_json(man_path, _manifest(plan, fmt, None))
    return None


def _finish(out: Path, plan: Plan, fmt: str) -> dict:
    rows = {k: _count_rows(_chunk_path(out, k, fmt), fmt) for k in range(plan.n_chunks)}
    man = _manifest(plan, fmt, rows)
    _write_json(out / "manifest.json", man)
    return man


# =============================================================================== distributed
_PLANS: dict = {}


def _plan_for(norm: dict) -> Plan:
    h = spec_hash(norm)
    if h not in _PLANS:
        if len(_PLANS) > 4:
            _PLANS.clear()
        _PLANS[h] = Plan(norm)
    return _PLANS[h]


def _dask_chunk(k: int, norm: dict, out: str | None, fmt: str, threads: int):
    """One chunk on a dask worker: the same kernel; writes its file (out) or returns its columns."""
    plan = _plan_for(norm)
    cols = run_chunk(plan, k, threads)
    n_cfg = min(plan.total, (k + 1) * plan.chunk_size) - k * plan.chunk_size
    if out is None:
        return k, n_cfg, cols
    rows = _write_chunk(SweepTable(cols, plan.dicts), _chunk_path(Path(out), k, fmt), fmt)
    return k, n_cfg, rows


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="cfg", unit_scale=True, dynamic_ncols=True, smoothing=0.1,
                            desc="moesim sweep", file=sys.stderr)

    def update(self, n: int):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _run_chunks(plan: Plan, pending: list, out: Path | None, fmt: str, threads: int, scheduler, local_workers,
                progress: _Progress) -> dict:
    """Run pending chunks serially (writing overlapped with the next chunk) or on dask.distributed."""
    results: dict = {}
    if scheduler is not None or local_workers:
        try:
            from distributed import Client, LocalCluster, as_completed
        except ImportError:
            raise _err("scheduler", "dask.distributed is not installed (pip install \"moesim[dask]\")") from None
        cluster = None
        if scheduler is not None:
            client = Client(scheduler, timeout="30s")
        else:
            cluster = LocalCluster(n_workers=int(local_workers), threads_per_worker=max(1, threads),
                                   processes=True, dashboard_address=None)
            client = Client(cluster)
        try:
            futs = client.map(_dask_chunk, pending, norm=plan.norm, out=str(out) if out else None, fmt=fmt,
                              threads=threads, pure=False)
            for fut in as_completed(futs):
                k, n_cfg, res = fut.result()
                results[k] = res
                progress.update(n_cfg)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
        return results
    if out is None:
        for k in pending:
            results[k] = run_chunk(plan, k, threads)
            progress.update(min(plan.total, (k + 1) * plan.chunk_size) - k * plan.chunk_size)
        return results
    from concurrent.futures import ThreadPoolExecutor
    # writers encode finished chunks (pyarrow releases the GIL) while the kernels fill the next column
    # set; a set is reused once its chunk is on disk, so memory stays at (writers + 1) chunks
    writers = max(1, min(threads, 4))
    size = min(plan.chunk_size, plan.total)
    sets = [_empty_columns(plan, size) for _ in range(writers + 1)]
    busy: list = [None] * len(sets)
    with ThreadPoolExecutor(max_workers=writers) as pool:
        for i, k in enumerate(pending):
            slot = i % len(sets)
            if busy[slot] is not None:
                kk, f = busy[slot]
                results[kk] = f.result()
            cols = run_chunk(plan, k, threads, sets[slot])
            busy[slot] = (k, pool.submit(_write_chunk, SweepTable(cols, plan.dicts), _chunk_path(out, k, fmt), fmt))
            progress.update(min(plan.total, (k + 1) * plan.chunk_size) - k * plan.chunk_size)
        for item in busy:
            if item is not None:
                results[item[0]] = item[1].result()
    return results


# =============================================================================== public API
def build_spec(spec=None, **kw) -> dict:
    """Merge a spec (TOML path or dict) with keyword axes / options into one spec dict."""
    if spec is None:
        s = {}
    elif isinstance(spec, (str, os.PathLike)):
        s = load_spec(spec)
    elif isinstance(spec, dict):
        s = json.loads(json.dumps(spec, default=_jsonable))
    else:
        raise _err("spec", f"expected a TOML path or a dict, got {type(spec).__name__}")
    for k in SECTIONS:
        s.setdefault(k, {} if k != "zip" else [])
    for a in AXES:
        if kw.get(a) is not None:
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


def sweep(spec=None, *, models=None, quants=None, machines=None, runtimes=None, kv_dtypes=None, placements=None,
          policies=None, contexts=None, batches=None, zip=None, filter=None, mode=None, seed=None, chunk_size=None,
          prompt=None, tokens=None, warmup=None, out=None, format: str = "parquet", threads: int | None = None,
          scheduler: str | None = None, local_workers: int | None = None, progress: bool | None = None):
    """Evaluate a grid of configurations (DESIGN §4 ``moesim.sweep``).

    Axes (lists; contexts/batches also ``{start, stop, num, log}`` ranges): ``models``, ``quants``,
    ``machines`` (catalog ids or dicts of :func:`moesim.machine` arguments, or Machine objects),
    ``runtimes``, ``kv_dtypes``, ``placements`` (``"auto"`` = what the runtime's own fitting picks, per
    configuration), ``policies``, ``contexts``, ``batches``; ``zip=[["models", "quants"]]`` varies axes
    together; ``filter={"fits": True}`` keeps configurations that fit. ``mode`` is ``"analytic"`` or
    ``"montecarlo"`` (stream (seed, global index) per configuration).

    Without ``out``: returns a :class:`SweepTable`. With ``out``: writes chunk files and a manifest to
    that directory (resumable; see the module docstring) and returns the manifest dict. ``threads``
    (default: every core; one per dask worker) never changes results, nor do ``scheduler`` /
    ``local_workers`` (dask.distributed)."""
    if machines is not None and isinstance(machines, Machine):
        machines = [machines]
    s = build_spec(spec, models=models, quants=quants, machines=machines, runtimes=runtimes, kv_dtypes=kv_dtypes,
                   placements=placements, policies=policies, contexts=contexts, batches=batches, zip=zip,
                   filter=filter, mode=mode, seed=seed, chunk_size=chunk_size, prompt=prompt, tokens=tokens,
                   warmup=warmup)
    if format not in FORMATS:
        raise unknown_id("format", format, FORMATS, "format")
    distributed = scheduler is not None or bool(local_workers)
    threads = _count(threads, "threads") if threads is not None else (1 if distributed else os.cpu_count() or 1)
    if scheduler is not None and local_workers:
        raise _err("scheduler", "give either a scheduler address or local_workers, not both")
    if local_workers is not None:
        local_workers = _count(local_workers, "local_workers", 0)
    norm = normalize_spec(s)
    plan = Plan(norm)
    if progress is None:
        progress = bool(out) and sys.stderr.isatty() and plan.total > plan.chunk_size
    if out is None:
        bar = _Progress(plan.total, progress)
        try:
            res = _run_chunks(plan, list(range(plan.n_chunks)), None, format, threads, scheduler, local_workers, bar)
        finally:
            bar.close()
        cols = _concat([res[k] for k in range(plan.n_chunks)], plan.columns)
        return SweepTable(cols, plan.dicts, {"moesim": __version__, "catalog": catalog_version(),
                                             "seed": plan.run["seed"], "spec_hash": plan.hash, "mode": plan.mode})
    outp = Path(out)
    done = _prepare_out(outp, plan, format)
    if done is not None:
        return dict(done, already_complete=True)
    pending = [k for k in range(plan.n_chunks) if not _chunk_path(outp, k, format).exists()]
    bar = _Progress(plan.total, progress)
    bar.update(sum(min(plan.total, (k + 1) * plan.chunk_size) - k * plan.chunk_size
                   for k in range(plan.n_chunks) if k not in set(pending)))
    try:
        _run_chunks(plan, pending, outp, format, threads, scheduler, local_workers, bar)
    finally:
        bar.close()
    return _finish(outp, plan, format)


def read(out) -> SweepTable:
    """Read a finished sweep directory back as one table (loads every row: for modest sweeps)."""
    outp = Path(out)
    man = json.loads((outp / "manifest.json").read_text(encoding="utf-8"))
    if not man.get("complete"):
        raise _err("out", f"{outp} is not a finished sweep (run the same command again to finish it)")
    import pyarrow as pa
    fmt = man["format"]
    tables = []
    for name in man["files"]:
        p = outp / name
        if fmt == "parquet":
            import pyarrow.parquet as pq
            tables.append(pq.read_table(p))
        elif fmt == "csv":
            import pyarrow.csv as pcsv
            tables.append(pcsv.read_csv(p))
        else:
            import pyarrow.json as pjson
            if p.stat().st_size:
                tables.append(pjson.read_json(p))
    cats = man["categories"]
    types = dict(man["columns"])
    cols = {}
    for c, _ in man["columns"]:
        parts = []
        for t in tables:
            if c not in t.column_names:
                continue
            a = t.column(c).combine_chunks()
            if c in CATEGORICAL:
                if pa.types.is_dictionary(a.type):
                    dic = a.dictionary.to_pylist()
                    codes = np.asarray(a.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
                    remap = np.array([cats[c].index(x) for x in dic], dtype=np.int32)
                    parts.append(remap[codes] if len(dic) else codes.astype(np.int32))
                else:
                    lut = {x: i for i, x in enumerate(cats[c])}
                    parts.append(np.array([lut[x] for x in a.to_pylist()], dtype=np.int32))
            else:
                arr = a.to_numpy(zero_copy_only=False)
                if types[c] == "float64":
                    arr = _nulls_to_nan(arr)
                parts.append(np.asarray(arr))
        cols[c] = np.concatenate(parts) if parts else np.zeros(0)
    return SweepTable(cols, cats, {k: man[k] for k in ("moesim", "catalog", "seed", "spec_hash", "mode")})


def _nulls_to_nan(arr) -> np.ndarray:
    """Nulls (NaN written as JSON null) back to NaN."""
    if arr.dtype == object:
        return np.array([np.nan if x is None else x for x in arr], dtype=np.float64)
    return np.asarray(arr, dtype=np.float64)
