"""80 % prediction intervals on decode and prefill tok/s, from out-of-sample residuals.

The residuals are log(measured / predicted) of rows the calibration never saw: the collected corpus
predicted with the shipped calibration (:mod:`.intervals_build`, the shipped table), or the
leave-one-source-out rows of ``moesim calibrate`` with cross-validation. :func:`build_table` turns them
into their 10 % and 90 % quantiles per *regime* — device class x placement kind x runtime family
(:func:`regime`) — stored in catalog/calibration.toml ``[intervals]``. :func:`interval` maps a
prediction to its regime and returns (lo, hi, basis). A regime with fewer than ``min_rows`` rows
falls back on its device class, then on all rows, ``widen`` times wider per level it falls; every
level is also scaled by 1 + ``small_sample`` / sqrt(n) (the basis says which data the interval stands
on). The interval always contains the point estimate.
"""
from __future__ import annotations

import math

import numpy as np

from .._catalog import load as _load_catalog
from ..spec.runtimes import calibration

METRICS = ("decode", "prefill")
GLOBAL = "*"
LEVEL = 0.80                # central coverage of the interval: quantiles (1 - LEVEL) / 2 and (1 + LEVEL) / 2
MIN_ROWS = 8                # fewer LOSO rows than this: the regime's quantiles are not trusted, fall back
# per fallback level, the log-quantiles are scaled by this. derived: a pooled coarser regime mixes rows of
# other placements / runtimes, so its spread understates this regime's uncertainty; 1.5 per level is the
# documented rule (chosen so the leave-one-source-out coverage of the thin regimes stays >= LEVEL)
WIDEN = 1.5
# every level's log-quantiles are also scaled by 1 + small_sample / sqrt(n): a sample quantile's error
# shrinks as 1/sqrt(n), and a new machine is a new source. small_sample is chosen by report() when the
# table is built: the smallest step of SMALL_SAMPLE_GRID for which the out-of-sample coverage, each
# source's interval built without that source's rows (coverage(..., nested=True)), reaches LEVEL on every
# metric; calibration.toml keeps the chosen value. SMALL_SAMPLE is the default for a table without one.
SMALL_SAMPLE = 2.0
SMALL_SAMPLE_GRID = tuple(i / 4 for i in range(17))      # 0, 0.25, ..., 4
_PLACEMENT_KIND = {"all-gpu": "gpu", "unified": "gpu", "experts-cpu": "hybrid", "n-cpu-moe": "hybrid",
                   "gpu-experts": "hybrid", "layers-gpu": "hybrid", "cpu-only": "cpu", "offload-cache": "offload"}
FIELDS = ("decode_tok_s_lo", "decode_tok_s_hi", "prefill_tok_s_lo", "prefill_tok_s_hi")


def device_class(machine) -> str:
    """unified | cpu | hbm | gddr: what bounds a machine's weight reads."""
    if machine.unified:
        return "unified"
    if not machine.gpu or machine.n_gpus == 0:
        return "cpu"
    g = _load_catalog("hardware").get("gpu", {}).get(machine.gpu, {})
    kind = str(g.get("memory_type", ""))
    if kind:
        return "hbm" if kind.startswith("hbm") else "gddr"
    return "hbm" if machine.gpu_bw_gbs >= 1500 else "gddr"


# NVIDIA architectures by compute capability (CUDA C Programming Guide, "Compute Capabilities" table)
_NVIDIA_ARCH = (("6", "pascal"), ("7.0", "volta"), ("7.2", "volta"), ("7.5", "turing"), ("8.9", "ada"),
                ("8", "ampere"), ("9", "hopper"), ("10", "blackwell"), ("11", "blackwell"), ("12", "blackwell"))


def device_family(machine, placement=None) -> str:
    """The device family a machine's weight reads run on, for leave-one-device-family-out checks: an
    NVIDIA architecture (``nvidia-ada``, ``nvidia-pascal`` ...), ``amd-rdna`` / ``amd-cdna`` (gfx9 is
    CDNA), ``intel-gpu``, a unified chip's vendor (``apple-gpu``, ``amd-apu`` ...), or, where the CPU cores
    run everything (no GPU, or a cpu-only placement), ``apple-cpu`` / ``cpu-server`` / ``cpu-desktop``."""
    cpu_only = placement_kind(placement) == "cpu" if placement is not None else False
    hw = _load_catalog("hardware")
    if machine.unified:
        vendor = str(hw.get("unified", {}).get(machine.gpu, {}).get("vendor", "other"))
        if cpu_only:
            return f"{vendor}-cpu"
        return {"amd": "amd-apu", "nvidia": "nvidia-unified"}.get(vendor, f"{vendor}-gpu")
    if cpu_only or not machine.gpu or machine.n_gpus == 0:
        server = machine.sockets > 1 or machine.channels >= 6
        return "cpu-server" if server else "cpu-desktop"
    g = hw.get("gpu", {}).get(machine.gpu, {})
    vendor = str(g.get("vendor", "other"))
    if vendor == "nvidia":
        cc = str(g.get("compute_capability") or machine.compute_capability or "")
        for prefix, arch in _NVIDIA_ARCH:
            if cc == prefix or cc.startswith(prefix + "."):
                return f"nvidia-{arch}"
        return "nvidia-other"
    if vendor == "amd":
        return "amd-cdna" if str(g.get("arch", "")).startswith("gfx9") else "amd-rdna"
    return f"{vendor}-gpu"


def placement_kind(placement) -> str:
    """gpu | hybrid | cpu | offload for a Placement or placement name."""
    kind = getattr(placement, "kind", None) or str(placement or "all-gpu").split("=", 1)[0]
    return _PLACEMENT_KIND.get(kind, "hybrid")


def regime(machine, placement, runtime) -> str:
    """``device/placement/family``, e.g. ``hbm/gpu/served``."""
    family = getattr(runtime, "family", None) or str(runtime)
    return f"{device_class(machine)}/{placement_kind(placement)}/{family}"


def _levels(key: str) -> list:
    return [key, key.split("/", 1)[0], GLOBAL]


def _quantiles(values) -> dict:
    a = np.asarray(values, dtype=float)
    lo, hi = np.quantile(a, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"lo": float(lo), "hi": float(hi), "n": int(a.size)}


def build_table(rows) -> dict:
    """``{metric: {key: {lo, hi, n}}}`` from rows ``{"regime", "decode_log", "prefill_log"}`` (log
    measured/predicted, absent where not measured), for regimes, device classes and all rows."""
    table: dict = {}
    for metric in METRICS:
        groups: dict = {}
        for r in rows:
            v = r.get(f"{metric}_log")
            if v is None or not math.isfinite(v):
                continue
            for key in _levels(r["regime"]):
                groups.setdefault(key, []).append(v)
        table[metric] = {k: _quantiles(v) for k, v in sorted(groups.items())}
    return table


def lookup(table: dict, metric: str, key: str, min_rows: int = MIN_ROWS, widen: float = WIDEN,
           small_sample: float = SMALL_SAMPLE):
    """(log lo, log hi, basis) of *key*'s interval: the first level with >= *min_rows* rows, widened
    by *widen* per level fallen and by 1 + *small_sample* / sqrt(n); None where the table has nothing
    for *metric*."""
    entries = table.get(metric, {})
    for depth, k in enumerate(_levels(key)):
        e = entries.get(k)
        if e and (e["n"] >= min_rows or k == GLOBAL):
            f = widen ** depth * (1.0 + small_sample / math.sqrt(e["n"]))
            lo, hi = min(0.0, e["lo"]) * f, max(0.0, e["hi"]) * f
            if depth == 0:
                basis = f"regime {k} ({e['n']} rows)"
            else:
                what = "all rows" if k == GLOBAL else f"device class {k}"
                basis = f"{what} ({e['n']} rows; regime {key} has {entries.get(key, {}).get('n', 0)}), x{f:.2f} wider"
            return lo, hi, basis
    return None


def _lookup_catalog(t: dict, metric: str, key: str):
    """lookup with the rule constants stored beside the table (so a table and its rule travel together)."""
    return lookup(t, metric, key, int(t.get("min_rows", MIN_ROWS)), float(t.get("widen", WIDEN)),
                  float(t.get("small_sample", SMALL_SAMPLE)))


def _catalog_table() -> dict:
    return calibration().get("intervals", {})


def interval(point: "float | None", metric: str, key: str, table: "dict | None" = None) -> tuple:
    """(lo, hi, basis) around *point* tok/s for regime *key*; (None, None, reason) without a point or table."""
    t = _catalog_table() if table is None else table
    if point is None or not math.isfinite(point) or point <= 0:
        return None, None, "no prediction"
    got = _lookup_catalog(t, metric, key)
    if got is None:
        return None, None, "no intervals in calibration.toml (run moesim calibrate with cross-validation)"
    lo, hi, basis = got
    return point * math.exp(lo), point * math.exp(hi), basis


def fields(decode: "float | None", prefill: "float | None", key: str, table: "dict | None" = None) -> dict:
    """The four JSON fields plus ``interval_basis`` (decode's basis; prefill's where it differs)."""
    dlo, dhi, dbasis = interval(decode, "decode", key, table)
    plo, phi, pbasis = interval(prefill, "prefill", key, table)
    basis = dbasis if dbasis == pbasis else f"decode: {dbasis}; prefill: {pbasis}"
    return {"decode_tok_s_lo": dlo, "decode_tok_s_hi": dhi, "prefill_tok_s_lo": plo, "prefill_tok_s_hi": phi,
            "interval_regime": key, "interval_basis": basis}


def widen_for_workloads(fields_: dict, ratios: dict, workloads: tuple) -> dict:
    """*fields_* (:func:`fields`') widened by the routing's spread across the workloads its profile pools (issue 15):
    ``ratios`` {metric: (min, max)} of each workload's tok/s over the pooled profile's, the same run otherwise.
    The calibrated interval is the model's error under the pooled routing; which workload a user runs is a second,
    independent uncertainty, so each bound moves out by its side's extreme ratio (bounds never move in)."""
    out = dict(fields_)
    notes = []
    for metric in METRICS:
        lo, hi = ratios.get(metric, (1.0, 1.0))
        klo, khi = f"{metric}_tok_s_lo", f"{metric}_tok_s_hi"
        if out.get(klo) is None or out.get(khi) is None:
            continue
        out[klo] *= min(1.0, lo)
        out[khi] *= max(1.0, hi)
        notes.append(f"{metric} x{lo:.3f}..{hi:.3f}")
    if notes:
        out["interval_basis"] = (f"{out['interval_basis']}; widened by the routing's workloads "
                                 f"({', '.join(workloads)}: {', '.join(notes)} of the pooled profile's tok/s)")
    return out


def widen_columns(cols: dict, rows, ratios: dict) -> None:
    """:func:`widen_for_workloads` of sweep columns: the interval columns' ``rows`` of ``cols`` widened in place by
    ``ratios`` {metric: (min ratios, max ratios)}, arrays over those rows (bounds never move in)."""
    for metric in METRICS:
        if metric in ratios:
            lo, hi = ratios[metric]
            cols[f"{metric}_tok_s_lo"][rows] *= np.minimum(1.0, lo)
            cols[f"{metric}_tok_s_hi"][rows] *= np.maximum(1.0, hi)


def columns(key: str, table: "dict | None" = None) -> dict:
    """Multipliers ``{field: exp(log bound)}`` for one regime (NaN where none): a sweep group's whole
    columns are its tok/s columns times these."""
    t = _catalog_table() if table is None else table
    out = {}
    for metric in METRICS:
        got = _lookup_catalog(t, metric, key)
        lo, hi = (math.exp(got[0]), math.exp(got[1])) if got else (math.nan, math.nan)
        out[f"{metric}_tok_s_lo"], out[f"{metric}_tok_s_hi"] = lo, hi
    return out


def coverage(rows, table: dict, min_rows: int = MIN_ROWS, widen: float = WIDEN, nested: bool = False,
             small_sample: float = SMALL_SAMPLE) -> dict:
    """Share of rows whose log-ratio lies in its interval, per metric. ``nested``: each row's interval
    is built without its own source group (``rows[i]["group"]``), so the check is out of sample."""
    out = {}
    for metric in METRICS:
        hit = n = 0
        for r in rows:
            v = r.get(f"{metric}_log")
            if v is None:
                continue
            t = build_table([q for q in rows if q.get("group") != r.get("group")]) if nested else table
            got = lookup(t, metric, r["regime"], min_rows, widen, small_sample)
            if got is None:
                continue
            n += 1
            hit += got[0] - 1e-12 <= v <= got[1] + 1e-12
        out[metric] = {"covered": hit / n if n else None, "n": n}
    return out


def text(point: "float | None", lo: "float | None", hi: "float | None", unit: str = "tok/s") -> str:
    """``12.3 tok/s (9.8–15.1)``."""
    if point is None:
        return "—"
    if lo is None or hi is None:
        return f"{point:.1f} {unit}"
    return f"{point:.1f} {unit} ({lo:.1f}–{hi:.1f})"


def loso_rows(cv_rows) -> list:
    """calibrate's cross-validated rows (``decode_err`` = predicted / measured - 1) as log(measured /
    predicted) per regime and source group."""
    out = []
    for r in cv_rows:
        rec = {"id": r["id"], "group": r["group"], "regime": r["regime"]}
        for metric in METRICS:
            err = r.get(f"{metric}_err")
            if err is not None and err > -1:
                rec[f"{metric}_log"] = -math.log1p(err)
        out.append(rec)
    return out


def choose_small_sample(rows) -> float:
    """The smallest step of SMALL_SAMPLE_GRID whose nested (out-of-sample) coverage reaches LEVEL on every
    metric with rows (the grid's last step if none does)."""
    for s in SMALL_SAMPLE_GRID:
        cov = coverage(rows, None, nested=True, small_sample=s)
        if all(c["covered"] is None or c["covered"] >= LEVEL for c in cov.values()):
            return s
    return SMALL_SAMPLE_GRID[-1]


def report(cv_rows) -> dict:
    """The [intervals] calibrate writes: quantile table, the chosen small-sample factor, coverage (in and
    out of sample) and the rows."""
    rows = loso_rows(cv_rows)
    table = build_table(rows)
    small = choose_small_sample(rows)
    return {"table": table, "small_sample": small, "coverage": coverage(rows, table, small_sample=small),
            "coverage_nested": coverage(rows, table, nested=True, small_sample=small), "rows": rows}


def toml_lines(rep: dict, command: str) -> list:
    """calibration.toml ``[intervals]`` for :func:`report`'s output."""
    cov, nested = rep["coverage"], rep["coverage_nested"]
    lines = ["", "# 80 % prediction intervals: quantiles of log(measured / predicted) over out-of-sample predictions",
             "# (the command below), per regime device/placement/runtime family (analysis/intervals.py).", "[intervals]",
             f'command = "{command}"', f"level = {LEVEL}", f"min_rows = {MIN_ROWS}",
             f"widen = {WIDEN}    # derived: per fallback level (intervals.WIDEN)",
             f"small_sample = {rep.get('small_sample', SMALL_SAMPLE)}    # chosen: quantiles x (1 + this / sqrt(n)), the smallest "
             "step of intervals.SMALL_SAMPLE_GRID whose nested coverage reaches the level on every metric"]
    for metric in METRICS:
        lines.append(f"coverage_{metric} = {nested[metric]['covered'] or 0:.4f}    # of {nested[metric]['n']} held-out "
                     f"rows, each source's interval built without it ({cov[metric]['covered'] or 0:.4f} in sample)")
    for metric in METRICS:
        for key, e in rep["table"][metric].items():
            lines += ["", f'[intervals.{metric}."{key}"]', f"lo = {e['lo']:.6g}", f"hi = {e['hi']:.6g}",
                      f"n = {e['n']}"]
    return lines


def fill_sweep(cols: dict, s0: int, s1: int, machine, runtime, placement_labels) -> None:
    """A sweep group's rows [s0, s1): the four interval columns from its tok/s columns, vectorised.
    The regime varies only with the placement (the group fixes machine and runtime): one multiplier
    per placement code the rows hold (labels *placement_labels*), indexed by each row's code."""
    place = cols["placement"][s0:s1]
    codes = sorted(set(place.tolist()))          # np.unique imports numpy.ma
    if len(codes) == 1:
        # one placement in the group's rows (most groups): its multipliers as scalars, the same products
        mult = _code_multipliers(machine, runtime, placement_labels[codes[0]])
        for f, point in zip(FIELDS, _POINTS):
            np.multiply(cols[point][s0:s1], mult[f], out=cols[f][s0:s1])
        return
    lut = _multipliers(machine, runtime, placement_labels, codes)
    for f, point in zip(FIELDS, _POINTS):
        np.multiply(cols[point][s0:s1], lut[f][place], out=cols[f][s0:s1])


_POINTS = tuple(f.rsplit("_", 1)[0] for f in FIELDS)        # each interval column's tok/s column


def fill_sweep_chunk(cols: dict, groups: list, placement_labels) -> None:
    """:func:`fill_sweep` of every group of a sweep chunk at once: ``groups`` each evaluated group's (first row, end
    row, machine, runtime). The regime varies with the (machine, runtime) and the row's placement code: one multiplier
    per such triple the rows hold (found once, :func:`_code_multipliers`), gathered per row, and the same products as
    group by group. Codes outside the labels (none are written) take the group by group path."""
    if not groups:
        return
    pairs: dict = {}                # (id(machine), id(runtime)) -> (index, machine, runtime), the chunk's pairs
    pair_ids = []
    for _, _, machine, runtime in groups:
        hit = pairs.get((id(machine), id(runtime)))
        if hit is None:
            hit = pairs[(id(machine), id(runtime))] = (len(pairs), machine, runtime)
        pair_ids.append(hit[0])
    starts = np.array([g[0] for g in groups], dtype=np.int64)
    lens = np.array([g[1] - g[0] for g in groups], dtype=np.int64)
    n = int(lens.sum())
    # the groups' rows in order (they tile the chunk but for skipped groups' rows): a slice when they tile [0, n)
    tiled = int(starts[0]) == 0 and bool(np.all(starts[1:] == starts[:-1] + lens[:-1]))
    rows = slice(0, n) if tiled else np.arange(n, dtype=np.int64) + np.repeat(starts - (np.cumsum(lens) - lens), lens)
    place = cols["placement"][rows]
    n_codes = len(placement_labels)
    if place.size and (place.min() < 0 or place.max() >= n_codes):
        for s0, s1, machine, runtime in groups:
            fill_sweep(cols, s0, s1, machine, runtime, placement_labels)
        return
    # each row's (machine, runtime, placement code) as one index into a small table of the triples' multipliers
    combo = np.repeat(np.array(pair_ids, dtype=np.int64) * n_codes, lens)
    combo += place
    present = np.flatnonzero(np.bincount(combo, minlength=len(pairs) * n_codes))
    by_pair = {i: (m, r) for i, m, r in pairs.values()}
    mults = [_code_multipliers(*by_pair[p], placement_labels[c]) for p, c in (divmod(u, n_codes) for u in present.tolist())]
    table = np.empty(len(pairs) * n_codes)
    for f, point in zip(FIELDS, _POINTS):
        table[present] = [m[f] for m in mults]
        if tiled:
            np.multiply(cols[point][rows], table[combo], out=cols[f][rows])
        else:
            cols[f][rows] = cols[point][rows] * table[combo]


def _multipliers(machine, runtime, placement_labels, codes: list) -> dict:
    """Per interval column, the multiplier of each placement code in *codes* (NaN elsewhere), memoised on
    the machine and runtime objects and the codes' labels: a sweep's groups share a few."""
    table = _catalog_table()
    key = (id(machine), id(runtime), id(table), tuple((c, placement_labels[c]) for c in codes))
    hit = _MULTIPLIERS.get(key)
    if hit is not None and hit[0] is machine and hit[1] is runtime and hit[2] is table:
        return hit[3]
    n = codes[-1] + 1 if codes else 1
    lut = {f: np.full(n, np.nan) for f in FIELDS}
    for code in codes:
        mult = _code_multipliers(machine, runtime, placement_labels[code])
        for f in FIELDS:
            lut[f][code] = mult[f]
    for a in lut.values():
        a.flags.writeable = False
    # bounded like _CODE_MULTIPLIERS: the 59-machine website grid asks for ~6,700 sets per sweep, which a bound of
    # 1,024 cleared over and over (every set then rebuilt from its regimes again)
    if len(_MULTIPLIERS) > 65536:
        _MULTIPLIERS.clear()
    _MULTIPLIERS[key] = (machine, runtime, table, lut)      # holds them, so their ids stay theirs
    return lut


def _code_multipliers(machine, runtime, label: str) -> dict:
    """Per interval column, the multiplier of one placement label on this machine and runtime (the
    regime's), memoised on the machine and runtime objects: each (machine, placement) pair of a sweep asks
    once, where :func:`_multipliers`' sets of codes differ from group to group."""
    table = _catalog_table()
    key = (id(machine), id(runtime), id(table), label)
    hit = _CODE_MULTIPLIERS.get(key)
    if hit is not None and hit[0] is machine and hit[1] is runtime and hit[2] is table:
        return hit[3]
    mult = _regime_columns(regime(machine, label, runtime), table)
    if len(_CODE_MULTIPLIERS) > 65536:
        _CODE_MULTIPLIERS.clear()
    _CODE_MULTIPLIERS[key] = (machine, runtime, table, mult)      # holds them, so their ids stay theirs
    return mult


_MULTIPLIERS: dict = {}
_CODE_MULTIPLIERS: dict = {}
_COLUMNS_CACHE: dict = {}


def _regime_columns(key: str, table: dict) -> dict:
    """:func:`columns` memoised per (table, regime): a sweep asks for the same few regimes per group."""
    hit = _COLUMNS_CACHE.get((id(table), key))
    if hit is None or hit[0] is not table:
        hit = _COLUMNS_CACHE[(id(table), key)] = (table, columns(key, table))
    return hit[1]
