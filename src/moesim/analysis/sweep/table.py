"""The sweep's result table: its columns (names, order, types, categorical dictionaries) and
:class:`SweepTable`, numpy columns with arrow and pandas views."""
from __future__ import annotations

import json

import numpy as np


RESOURCES = ("gpu_memory", "gpu_compute", "host_memory", "cpu_compute", "pcie", "storage", "latency",
             "interconnect")
_TIERS = ("gpu", "host", "storage")
FITS_LABELS = tuple("+".join(t for i, t in enumerate(_TIERS) if b >> i & 1) or "no" for b in range(8)) + tuple(
    "+".join(("unified" if t == "gpu" else t) for i, t in enumerate(_TIERS) if b >> i & 1) for b in range(1, 8))
CATEGORICAL = ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy", "fits", "bottleneck",
               "parallel", "routing")
MEMORY_COLUMNS = ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
                  "storage_bytes", "max_context", "max_batch")
DECODE_COLUMNS = ("decode_tok_s", "aggregate_tok_s", "tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "prefill_tok_s",
                  "expert_hit_rate", "bottleneck")
# 80 % prediction interval of decode and prefill tok/s (analysis.intervals), after the decode columns
INTERVAL_COLUMNS = ("decode_tok_s_lo", "decode_tok_s_hi", "prefill_tok_s_lo", "prefill_tok_s_hi")
_INT_COLUMNS = {"context", "batch", "max_context", "max_batch", "cache_experts", "mtp", "prompt", "ubatch"}
_MC_ONLY = ("tpot_p50_ms", "tpot_p99_ms")


def decode_columns(mode: str) -> tuple:
    """The decode columns a sweep of this mode writes (percentiles only from Monte Carlo)."""
    return DECODE_COLUMNS if mode == "montecarlo" else tuple(c for c in DECODE_COLUMNS if c not in _MC_ONLY)


def column_names(mode: str, options: tuple = ()) -> tuple:
    """Output columns, in order, for a sweep of this mode; *options*: the option axes the spec gives
    (spec.OPTION_AXES: cache_experts, prefetch_recall, mtp, mtp_acceptance, parallel, routing, prompt,
    ubatch), a column each after policy."""
    return ("model", "quant", "machine", "runtime", "kv_dtype", "placement", "policy") + tuple(options) + (
        "context", "batch", "fits") + MEMORY_COLUMNS + decode_columns(mode) + INTERVAL_COLUMNS


def column_type(name: str) -> str:
    """A column's type as the manifest records it."""
    return "category" if name in CATEGORICAL else ("int64" if name in _INT_COLUMNS else "float64")


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
