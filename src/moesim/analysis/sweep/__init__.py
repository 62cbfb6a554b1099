"""Sweeps: ``moesim.sweep(...)`` and ``moesim sweep SPEC.toml --out PATH``.

A sweep is the cartesian product (with optional zipped axes) of models x quants x machines x runtimes x
KV dtypes x placements x policies x contexts x batches. Everything but context and batch forms a
*group*, lowered once (Python, per group): memory tables over layer kinds (:class:`_kernel.SweepMemory`,
candidate weights per tier from the memory kernel) and decode *variants* (placement, host page-cache
slots, batch), each the analytic kernel's step time at its batch with the attention over the cache zeroed plus
that attention per kind, whose time depends on context (:class:`_kernel.SweepDecode`; exact while prefetch is
off, which is checked). The configurations of a group then run in C loops (csrc/ms_sweep.c) with the GIL released
and OpenMP threads; nothing runs per configuration in Python.

Output is written in deterministic chunks of global configuration indices (``part-NNNNNN.parquet`` /
``.csv`` / ``.jsonl``), each to a temporary name and renamed, with a ``_manifest.json`` (schema version,
moesim and catalog versions, seed, spec hash). A sweep interrupted at any point and restarted with the
same command skips the finished chunks and ends with the same files; a finished one does nothing; a
different spec on an existing directory is refused. ``--scheduler`` / ``--local-workers`` run the
chunks on dask.distributed (each worker runs the same kernel; same files, whatever its thread count).

Modules, one concept each: :mod:`.spec` (validating a spec), :mod:`.plan` (the grid, groups,
chunks, dictionaries), :mod:`.group` (a group's lowered memory tables), :mod:`.variants` (its decode
variants and their immutable tables), :mod:`.run` (driving the kernels over a range), :mod:`.table`
(columns and :class:`SweepTable`), :mod:`.store` (chunk files, manifest, resume, :func:`read`),
:mod:`.distribute` (serial or dask execution, progress) and :mod:`.api` (:func:`sweep`).
"""
from __future__ import annotations

from .api import sweep
from ...engine.lower.placement import candidate_weights
from .group import Group
from .plan import OnceCache, Plan
from .run import _empty_columns, run_chunk, run_range
from .spec import (AXES, AXIS_DEFAULTS, FILTERABLE, REQUIRED_AXES, RUN_DEFAULTS, SECTIONS, SLOW_AXES, build_spec,
                   expand_int_axis, load_spec, machine_label, make_machine_cached, normalize_spec, spec_hash)
from .store import FORMATS, SCHEMA_VERSION, read
from .table import (CATEGORICAL, DECODE_COLUMNS, FITS_LABELS, MEMORY_COLUMNS, RESOURCES, SweepTable, column_names)
from .variants import DecodeVariants, VariantTable, check_separable, kind_row

__all__ = ["sweep", "read", "SweepTable", "Plan", "Group", "run_range", "run_chunk", "build_spec", "normalize_spec",
           "load_spec", "spec_hash", "make_machine_cached", "machine_label", "expand_int_axis", "column_names",
           "candidate_weights", "check_separable", "kind_row", "VariantTable", "DecodeVariants", "OnceCache",
           "AXES", "SLOW_AXES", "REQUIRED_AXES", "AXIS_DEFAULTS", "SECTIONS", "RUN_DEFAULTS", "FILTERABLE",
           "FORMATS", "SCHEMA_VERSION", "CATEGORICAL", "DECODE_COLUMNS", "MEMORY_COLUMNS", "FITS_LABELS", "RESOURCES",
           "_empty_columns"]
