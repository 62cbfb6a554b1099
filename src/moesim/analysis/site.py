"""The data of a static site (``moesim export-site``): a sweep spec, with an optional ``[site]`` table of
titles, run through the sweep engine, one row per configuration with the runtime flags that realise it,
and what a page needs to describe each machine and model. ``report.site`` writes it into files.

Rows keep the sweep's numbers; the only thing added per row is the flag line
(:func:`moesim.analysis.advice.launch`, as ``fit`` prints it) and the placement *rule* the row
came from (``auto`` or a fixed placement of the spec's ``placements`` axis), which a row's resolved
placement alone cannot tell apart (``auto`` may resolve to ``experts-cpu``)."""
from __future__ import annotations

import copy
import math
import os

import numpy as np

from .. import __version__
from .._catalog import catalog_version
from ..errors import MoesimError, unknown_id
from ..ingest import model as get_model
from ..spec.hardware import GB
from ..spec import quants as Q
from ..spec.placement import parse as parse_placement
from .advice import launch
from ..spec.runtimes import runtime as get_runtime
from .sweep import build_spec, expand_int_axis, load_spec, machine_label, make_machine_cached, normalize_spec, \
    spec_hash, sweep

# The [site] table: page texts, nothing that changes a number.
SITE_KEYS = ("title", "description")
SITE_DEFAULTS = {"title": "moesim: what runs on this machine, and how fast",
                 "description": "Mixture-of-experts models on these machines, as moesim's sweep predicts them."}
# One exported row, in order (report/site/schema/*.schema.json describe each field; a change here is a
# schema change: bump report.site.SCHEMA_VERSION).
ROW_FIELDS = ("model", "quant", "machine", "runtime", "kv_dtype", "placement_rule", "placement", "policy", "batch",
              "context", "fits", "weights_bytes", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
              "storage_bytes", "max_context", "max_batch", "decode_tok_s", "aggregate_tok_s", "tpot_ms",
              "tpot_p99_ms", "prefill_tok_s", "decode_tok_s_lo", "decode_tok_s_hi", "prefill_tok_s_lo",
              "prefill_tok_s_hi", "expert_hit_rate", "bottleneck", "flags")
_INT_FIELDS = frozenset(("batch", "context", "max_context", "max_batch", "weights_bytes", "kv_bytes", "state_bytes",
                         "gpu_bytes", "host_bytes", "storage_bytes"))
_KEY_FIELDS = ("model", "quant", "machine", "runtime", "kv_dtype", "placement_rule", "policy", "batch", "context")


def split_site_spec(spec) -> tuple:
    """(the sweep spec dict, the [site] options) of a site spec: a TOML path or a dict."""
    if isinstance(spec, dict):
        raw = copy.deepcopy(spec)
    elif isinstance(spec, (str, os.PathLike)):
        raw = load_spec(spec)
    else:
        raise MoesimError(f"expected a TOML path or a dict, got {type(spec).__name__}", "spec")
    site_in = raw.pop("site", {})
    if not isinstance(site_in, dict):
        raise MoesimError("expected a table of page texts (title, description)", "site")
    site = dict(SITE_DEFAULTS)
    for k, v in site_in.items():
        if k not in SITE_KEYS:
            raise unknown_id("site option", k, SITE_KEYS, f"site.{k}")
        if not isinstance(v, str) or not v.strip():
            raise MoesimError(f"must be a non-empty string, got {v!r}", f"site.{k}")
        site[k] = v.strip()
    return raw, site


def _placement_rules(norm: dict) -> list:
    """The placement rules to sweep one at a time (each row then knows the rule it came from)."""
    rules = norm["axes"]["placements"]
    if len(rules) > 1 and any("placements" in g for g in norm["zip"]):
        raise MoesimError("a site export sweeps one placement rule at a time, so placements cannot be zipped "
                          "with another axis: list them unzipped or export one site per placement", "zip")
    return rules


def machine_entry(value) -> dict:
    """What a page shows and picks a machine by: a normalized machines-axis value, described."""
    m = make_machine_cached(value)
    ram = m.gpu_mem_bytes if m.unified else m.host_mem_bytes
    return {"id": machine_label(value), "description": m.describe(), "gpu": m.gpu, "gpus": m.n_gpus,
            "unified": bool(m.unified), "gpu_mem_gb": _gb(m.gpu_mem_bytes) if m.n_gpus else 0.0,
            "gpu_bw_gbs": float(m.gpu_bw_gbs), "ram_gb": _gb(ram), "host_memory": m.host_memory,
            "channels": int(m.channels), "sockets": int(m.sockets), "host_bw_gbs": float(m.host_bw_gbs),
            "pcie": m.pcie if m.n_gpus and not m.unified else None, "storage": m.storage}


def model_entry(model_id: str) -> dict:
    m = get_model(model_id)
    total, active = m.param_counts()
    return {"id": m.id, "name": m.name, "family": m.family, "total_params": int(total),
            "active_params": int(active), "layers": int(m.n_layers), "experts": int(m.n_experts),
            "top_k": int(m.top_k), "max_context": int(m.max_context)}


def _gb(b: float) -> float:
    return round(float(b) / GB, 3)


class _Flags:
    """The runtime flag line of each row, with the parsed objects built once per combination."""

    def __init__(self, machines: dict):
        self.machines = machines
        self._objs: dict = {}
        self._parts: dict = {}

    def _part(self, key: tuple, build):
        hit = self._parts.get(key)
        if hit is None:
            hit = self._parts[key] = build()
        return hit

    def __call__(self, r: dict) -> str:
        key = (r["model"], r["quant"], r["machine"], r["runtime"], r["placement"])
        objs = self._objs.get(key)
        if objs is None:
            m = self._part(("model", r["model"]), lambda: get_model(r["model"]))
            mach = self.machines[r["machine"]]
            # the runtime profile and quant read the model alone, not the machine or placement: one per pair (an
            # automatic placement's rows hold dozens of n-cpu-moe counts per model and machine)
            objs = (m, self._part(("quant", r["quant"], m.id), lambda: Q.resolve(r["quant"], m)), mach,
                    self._part(("runtime", r["runtime"], m.id), lambda: get_runtime(r["runtime"], model=m.id)),
                    parse_placement(r["placement"], m, mach))
            self._objs[key] = objs
        m, q, mach, rt, p = objs
        return launch(p, rt, m, mach, q, r["context"], r["kv_dtype"], r["batch"])["flags"]


def _value(name: str, x):
    if isinstance(x, str) or x is None:
        return x
    x = float(x)
    if not math.isfinite(x):
        return None
    return int(round(x)) if name in _INT_FIELDS else x


def _column(name: str, a) -> list:
    """:func:`_value` of every element of a sweep table's column, whole numeric columns at once (the same values:
    np.rint rounds half to even as round does)."""
    a = np.asarray(a)
    if a.dtype.kind not in "biuf":
        return [_value(name, x) for x in a.tolist()]
    x = a.astype(np.float64)
    finite = np.isfinite(x)
    vals = np.rint(x[finite]).astype(np.int64).tolist() if name in _INT_FIELDS else x[finite].tolist()
    if finite.all():
        return vals
    out = [None] * len(x)
    for i, v in zip(np.flatnonzero(finite).tolist(), vals):
        out[i] = v
    return out


def _rows_of(table, rule: str, flags: _Flags, seen: set) -> list:
    """The exported rows of one sweep table (a configuration listed twice by the spec, once)."""
    names = list(table.column_names)
    cols = [_column(name, table[name]) for name in names]
    out = []
    for values in zip(*cols):
        r = dict(zip(names, values))
        r["placement_rule"] = rule
        r.setdefault("tpot_p99_ms", None)
        key = tuple(r[k] for k in _KEY_FIELDS)
        if key in seen:
            continue
        seen.add(key)
        r["flags"] = flags(r)
        out.append([r[f] for f in ROW_FIELDS])
    return out


def _distinct(rows: list, field: str) -> list:
    i = ROW_FIELDS.index(field)
    return list(dict.fromkeys(r[i] for r in rows))


def site_data(spec, threads: int | None = None, processes: int | None = None) -> dict:
    """Run a site spec's sweep (one sweep per placement rule; ``threads`` and ``processes`` as sweep's, never
    changing a row) and return the site's data: page texts, versions, the machines and models it covers, the
    grid's values and every row (:data:`ROW_FIELDS`)."""
    raw, site = split_site_spec(spec)
    norm = normalize_spec(build_spec(raw))
    machines = {machine_label(v): make_machine_cached(v) for v in norm["axes"]["machines"]}
    flags, seen, rows = _Flags(machines), set(), []
    for rule in _placement_rules(norm):
        sub = copy.deepcopy(raw)
        sub.setdefault("axes", {})["placements"] = [rule]
        rows += _rows_of(sweep(sub, threads=threads, processes=processes, progress=False), rule, flags, seen)
    return {"site": site, "moesim_version": __version__, "catalog_version": catalog_version(),
            "sweep": {"spec_hash": spec_hash(norm), "mode": norm["run"]["mode"], "seed": norm["run"]["seed"]},
            "machines": [machine_entry(v) for v in norm["axes"]["machines"]],
            "models": [model_entry(mid) for mid in dict.fromkeys(norm["axes"]["models"])],
            "quants": _distinct(rows, "quant"), "runtimes": _distinct(rows, "runtime"),
            "placement_rules": list(norm["axes"]["placements"]),
            "contexts": [int(c) for c in expand_int_axis(norm["axes"]["contexts"])],
            "batches": [int(b) for b in expand_int_axis(norm["axes"]["batches"])],
            "fields": list(ROW_FIELDS), "rows": rows}
