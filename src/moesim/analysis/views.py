"""Two views over the catalog: ``moesim rank`` (what runs on one machine, best first) and ``moesim
compare`` (models, quantizations or machines side by side).

``rank`` is one in-memory analytic sweep (:func:`moesim.sweep`) of every model x its default quant
ladder (:func:`.fit.default_quants`, what ``fit`` tries) on the machine, placement chosen per
configuration as the runtime would: its numbers are the sweep's, and so equal ``simulate(...,
mode="analytic")`` and ``fit(...)`` of the same configuration. Nothing runs per row in Python but
copying the sweep's columns into dicts. ``compare`` calls ``fit`` and ``simulate`` themselves, one
configuration per compared item, and returns their dicts unchanged.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..errors import MoesimError, unknown_id
from ..ingest import model as get_model
from ..spec import quants as Q
from ..spec.hardware import Machine, as_machine
from ..spec.limits import MAX_BATCH, check_context, check_count
from ..spec.models import model_ids
from ..spec.runtimes import runtime as get_runtime
from .fit import default_quant_names

# --by: the row field each ordering sorts on, descending. Bits per weight stand in for quality (more
# bits, closer to the trained weights); no quality model is claimed.
RANK_BY = {"speed": "decode_tok_s", "context": "max_context", "quality": "bits_per_weight",
           "params": "total_params"}
RANK_FILTERS = ("family", "min-context", "min-tps")
# The 80 % interval fields of DESIGN §4: carried into rank rows when the sweep's table has them.
INTERVAL_COLUMNS = ("decode_tok_s_lo", "decode_tok_s_hi", "prefill_tok_s_lo", "prefill_tok_s_hi")
_SWEEP_FIELDS = ("model", "quant", "runtime", "kv_dtype", "placement", "fits", "context", "batch", "max_context",
                 "max_batch", "decode_tok_s", "aggregate_tok_s", "tpot_ms", "prefill_tok_s", "bottleneck",
                 "expert_hit_rate", "weights_bytes", "kv_bytes", "gpu_bytes", "host_bytes", "storage_bytes")
# compare: the quant an item takes when none is given where the runtime loads GGUF files (the usual
# download); a serving runtime takes the native checkpoint its ladder holds.
COMPARE_DEFAULT_QUANT = "Q4_K_M"
# A side-by-side table wider than this is no longer a comparison; a sweep is the tool for grids.
MAX_COMPARED = 64


# ================================================================================ rank
def rank_filters(spec) -> dict:
    """The filters of ``rank``: None, a dict, ``"key=value"`` strings (comma lists allowed) or a list of
    them, into ``{"family": str, "min-context": int, "min-tps": float}`` (only the keys given)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        pairs = list(spec.items())
    else:
        items = [spec] if isinstance(spec, str) else list(spec)
        pairs = []
        for item in items:
            if not isinstance(item, str):
                raise MoesimError(f"expected key=value, got {item!r}; keys: {', '.join(RANK_FILTERS)}", "filter")
            for part in (p.strip() for p in item.split(",")):
                key, eq, value = part.partition("=")
                if not eq:
                    raise MoesimError(f"expected key=value, got {part!r}; keys: {', '.join(RANK_FILTERS)}",
                                      "filter")
                pairs.append((key, value))
    out = {}
    for key, value in pairs:
        k = str(key).strip().lower().replace("_", "-")
        if k not in RANK_FILTERS:
            raise unknown_id("filter", key, RANK_FILTERS, "filter")
        out[k] = _filter_value(k, value)
    return out


def _filter_value(key: str, value):
    where = f"filter.{key}"
    if key == "family":
        if not isinstance(value, str) or not value.strip():
            raise MoesimError(f"expected a model family (prefix), got {value!r}", where)
        return value.strip().lower().replace("-", "_")
    text = str(value).strip()
    try:
        number = float(text) if key == "min-tps" else int(text)
    except (TypeError, ValueError):
        kind = "a number of tokens/s" if key == "min-tps" else "a whole number of tokens"
        raise MoesimError(f"expected {kind}, got {value!r}", where) from None
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise MoesimError(f"must be a finite number >= 0, got {value!r}", where)
    return number


def _rank_models(models, family: str | None) -> list:
    """The catalog models rank covers (all unless *models* names some), kept to *family* (a prefix of
    the model family, e.g. ``qwen`` for qwen3_moe and qwen3_next)."""
    if models is None:
        ms = [get_model(mid) for mid in model_ids()]
    else:
        items = [models] if isinstance(models, str) else list(models)
        if not items:
            raise MoesimError("empty list: give at least one model", "models")
        ms = list({m.id: m for m in map(get_model, items)}.values())      # each model once
    if family is None:
        return ms
    kept = [m for m in ms if m.family.lower().startswith(family)]
    if not kept:
        raise unknown_id("model family", family, sorted({m.family for m in ms}), "filter.family")
    return kept


def _sweep_rows(ms: list, mach: Machine, runtime, kv_dtype, context: int, batch: int, filt: dict,
                threads, processes) -> list:
    """The sweep of every model x its ladder that runs on *mach*: one sweep per distinct ladder (the
    catalog's models share one), filtered by the sweep itself."""
    from .sweep import sweep
    ladders: dict = {}
    for m in ms:
        ladders.setdefault(tuple(_ladder(m, mach, runtime)), []).append(m.id)
    sweep_filter = {"fits": True, "skip_inapplicable": True}
    if "min-context" in filt:
        sweep_filter["max_context"] = {"min": filt["min-context"]}
    if "min-tps" in filt:
        sweep_filter["decode_tok_s"] = {"min": filt["min-tps"]}
    rows = []
    for ladder, ids in ladders.items():
        tab = sweep(models=ids, quants=list(ladder), machines=[mach], runtimes=[runtime or "auto"],
                    kv_dtypes=[kv_dtype or "auto"], contexts=[context], batches=[batch], filter=sweep_filter,
                    mode="analytic", threads=threads, processes=processes)
        cols = {c: _plain(tab[c]) for c in _SWEEP_FIELDS + INTERVAL_COLUMNS if c in tab.columns}
        rows += [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    return rows


def _plain(col) -> list:
    """A sweep column as Python values, NaN (a rate that does not apply, e.g. no expert cache) as None."""
    values = col.tolist()
    if col.dtype.kind == "f" and not np.isfinite(col).all():
        values = [v if math.isfinite(v) else None for v in values]
    return values


def _add_model_fields(rows: list, ms: list) -> None:
    """Family, parameter counts (once per model) and bits per weight per row."""
    by_id = {m.id: m for m in ms}
    params: dict = {}
    for r in rows:
        m = by_id[r["model"]]
        if m.id not in params:
            params[m.id] = m.param_counts()
        total, active = params[m.id]
        r["family"] = m.family
        r["total_params"], r["active_params"] = total, active
        r["bits_per_weight"] = 8.0 * r["weights_bytes"] / total if total else None


def rank(machine, *, models=None, runtime=None, kv_dtype: str | None = None, context: int = 4096,
         batch: int = 1, by: str = "speed", filter=None, limit: int | None = None, threads: int | None = None,
         processes: int | None = None) -> list:
    """Every catalog model x quantization that runs on *machine* (fits in GPU, host or storage), best
    first by *by*: ``speed`` (decode tok/s per sequence), ``context`` (max context), ``quality`` (bits
    per weight) or ``params`` (total parameters); ties go to the faster (under ``speed``, to the longer
    max context), then catalog order.

    Quantizations: ``fit``'s default ladder for the runtime (GGUF for llama.cpp, the default; the native
    checkpoint for a serving *runtime*). Placement: what the runtime's own fitting picks at *context*.
    *filter*: ``family=PREFIX``, ``min-context=N`` (max context at least N), ``min-tps=X`` (decode at
    least X tok/s), as a dict or ``"key=value"`` strings. *models*: catalog ids to rank instead of the
    whole catalog. Returns plain dicts (sweep columns, plus rank, family, total/active parameters and
    bits per weight); numbers are the analytic sweep's, equal to ``simulate(..., mode="analytic")``.
    *threads* and *processes*: as :func:`moesim.sweep`'s (the CLI forks one process per core, up to 4:
    the ranking is identical, and answers sooner)."""
    mach = as_machine(machine)
    context, _ = check_context(context, None)
    batch = check_count(batch, "batch", maximum=MAX_BATCH)
    if not isinstance(by, str) or by.strip().lower() not in RANK_BY:
        raise unknown_id("ranking", by, RANK_BY, "by")
    key = RANK_BY[by.strip().lower()]
    if limit is not None:
        limit = check_count(limit, "limit")
    if kv_dtype is not None:
        kv_dtype = Q.canonical_kv_dtype(kv_dtype)     # refused here, naming kv_dtype, not the sweep's axis
    filt = rank_filters(filter)
    ms = _rank_models(models, filt.get("family"))
    rows = _sweep_rows(ms, mach, runtime, kv_dtype, context, batch, filt, threads, processes)
    _add_model_fields(rows, ms)
    second = "max_context" if key == "decode_tok_s" else "decode_tok_s"
    rows.sort(key=lambda r: (-_sortable(r[key]), -_sortable(r[second])))
    rows = rows[:limit] if limit is not None else rows
    return [{"rank": i + 1, **r} for i, r in enumerate(rows)]


def _sortable(v) -> float:
    return -math.inf if v is None else float(v)


# ================================================================================ compare
def _as_list(value, where: str) -> list:
    items = [value] if isinstance(value, (str, dict, Machine)) or not hasattr(value, "__iter__") else list(value)
    if not items:
        raise MoesimError("empty list: give at least one", where)
    return items


def compare(models, machines, *, quants=None, context: int = 4096, batch: int = 1, prompt: int = 512,
            runtime=None, kv_dtype: str | None = None, placement=None, mode: str = "analytic",
            allow_beyond_max_context: bool = False) -> list:
    """Models, quantizations or machines side by side: one configuration per item of models x quants x
    machines (each a single value or a list), in that order (machines vary fastest).

    Each item is ``fit``'s dict for it where it does not fit, else ``simulate(..., mode=mode).to_dict()``
    (the fit fields plus TTFT, TPOT, breakdown, bottleneck...), unchanged. Without *quants*, each model
    takes Q4_K_M where the runtime loads GGUF files, else its native checkpoint."""
    from .fit import fit
    from .simulate import simulate
    ms = [get_model(x) for x in _as_list(models, "models")]
    machs = [as_machine(x, "machines") for x in _as_list(machines, "machines")]
    qs = None if quants is None else [str(q) for q in _as_list(quants, "quants")]
    n = len(ms) * len(machs) * (len(qs) if qs else 1)
    if n > MAX_COMPARED:
        raise MoesimError(f"{n} items to compare, more than {MAX_COMPARED}; a sweep (moesim sweep) suits grids",
                          "compare")
    out = []
    for m, q, mach in itertools.product(ms, qs or [None], machs):
        quant = q if q is not None else _default_quant(m, runtime, mach)
        rec = fit(m, mach, quants=[quant], context=context, batch=batch, kv_dtype=kv_dtype, placement=placement,
                  runtime=runtime, allow_beyond_max_context=allow_beyond_max_context)[0]
        if rec["fits"] == "no":
            out.append(rec)
            continue
        r = simulate(m, mach, quant=quant, context=context, batch=batch, placement=placement, runtime=runtime,
                     kv_dtype=kv_dtype, mode=mode, prompt=prompt, allow_beyond_max_context=allow_beyond_max_context)
        out.append(r.to_dict())
    return out


def _ladder(m, mach: Machine, runtime) -> list:
    """The quantizations fit tries for *m* on *mach* under *runtime* (an id or None), by name."""
    return default_quant_names(m, mach, get_runtime(runtime, model=m.id) if runtime is not None else None)


def _default_quant(m, runtime, mach: Machine) -> str:
    ladder = _ladder(m, mach, runtime)
    return COMPARE_DEFAULT_QUANT if COMPARE_DEFAULT_QUANT in ladder else ladder[0]
