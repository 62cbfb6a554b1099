"""What the measurement corpus covers: distinct GPU families, Apple chips, server and desktop CPUs and
runtime profiles over a set of rows (issue 14: >= 12 GPU families including AMD, Intel and pre-Volta
NVIDIA; 6 Apple chips; 8 server and 8 desktop CPUs; every runtime in catalog/runtimes.toml).

A row counts for a part only where that part did work in the measured run:

* **GPU family** -- the architecture of the GPU that ran the weights (a discrete GPU, or the GPU of a
  non-Apple unified chip in a ``unified`` / GPU placement): NVIDIA by compute capability (``nvidia-pascal``
  ... ``nvidia-blackwell``), AMD by LLVM target (``amd-rdna2`` gfx103x, ``amd-rdna3`` gfx110x,
  ``amd-rdna3.5`` gfx115x, ``amd-rdna4`` gfx12xx, ``amd-cdna2`` gfx90a, ``amd-cdna3`` gfx94x, ``amd-cdna4``
  gfx95x), Intel by Xe generation (``intel-alchemist`` xe-hpg, ``intel-battlemage`` xe2), other vendors by
  vendor (``qualcomm-gpu``). Apple's GPUs are counted as Apple chips instead.
* **Apple chip** -- the Apple unified chip of a row (any placement), binned variants (``m3-max-30c``) folded
  into their chip (``m3-max``).
* **server / desktop CPU** -- the catalog CPU named in ``host_cpu`` of a row whose CPU cores run weights
  (a ``cpu-only``, hybrid or offload placement; the host of an all-GPU run does not count). Server: a
  part with >= 6 memory channels per socket or a multi-socket row (Xeon, EPYC, Threadripper PRO, Grace);
  desktop: the rest (client sockets and HEDT). The CPU cores of a non-Apple unified chip (Strix Halo,
  Strix Point, Snapdragon X, Lunar Lake) in a ``cpu-only`` row count as a desktop (client) CPU; a host
  the row names only loosely ("EPYC (model not stated)") counts for nothing.
* **runtime** -- the catalog runtime profile a row is modelled by (what ``validate`` picks: an aliased
  engine such as MoE-Infinity is ``offload``; a llama.cpp build dated before June 2024 is
  ``llama.cpp-2024h1``; ktransformers v0.2/v0.3 is ``ktransformers-legacy``).

:func:`audit` returns the sets; :data:`ISSUE_MINIMUMS` the thresholds tests/test_corpus_coverage.py
asserts; ``python -m moesim.analysis.coverage [CSV]`` prints the audit.
"""
from __future__ import annotations

import csv
import re

from .._catalog import load as _load_catalog
from .intervals import _NVIDIA_ARCH, placement_kind

# issue 14 item 2: the corpus (shared calibration.csv + measurements_collected.csv) must reach these
ISSUE_MINIMUMS = {"gpu_families": 12, "apple_chips": 6, "server_cpus": 8, "desktop_cpus": 8}
REQUIRED_GPU_VENDORS = ("amd", "intel")
PRE_VOLTA = ("nvidia-pascal",)          # what the issue's "pre-Volta NVIDIA" names (Maxwell has no catalog part)

_AMD_ARCH = (("gfx103", "rdna2"), ("gfx110", "rdna3"), ("gfx115", "rdna3.5"), ("gfx12", "rdna4"),
             ("gfx90a", "cdna2"), ("gfx94", "cdna3"), ("gfx95", "cdna4"))
_INTEL_ARCH = {"xe-hpg": "alchemist", "xe2-hpg": "battlemage", "xe2-lpg": "battlemage"}
_BIN_SUFFIX = re.compile(r"-\d+c$")


def _hw() -> dict:
    return _load_catalog("hardware")


def gpu_family(gpu_id: str) -> str | None:
    """The architecture family of a catalog GPU or non-Apple unified chip (None for Apple chips, CPUs and
    ids the catalog does not know)."""
    hw = _hw()
    entry = hw["gpu"].get(gpu_id) or hw["unified"].get(gpu_id)
    if not entry:
        return None
    vendor = str(entry.get("vendor", "other"))
    if vendor == "apple":
        return None
    arch = str(entry.get("arch", ""))
    if vendor == "nvidia":
        cc = str(entry.get("compute_capability", ""))
        for prefix, name in _NVIDIA_ARCH:
            if cc == prefix or cc.startswith(prefix + "."):
                return f"nvidia-{name}"
        return "nvidia-other"
    if vendor == "amd":
        for prefix, name in _AMD_ARCH:
            if arch.startswith(prefix):
                return f"amd-{name}"
        return "amd-other"
    if vendor == "intel":
        return f"intel-{_INTEL_ARCH.get(arch, arch or 'gpu')}"
    return f"{vendor}-gpu"


def apple_chip(gpu_id: str) -> str | None:
    entry = _hw()["unified"].get(gpu_id)
    if not entry or entry.get("vendor") != "apple":
        return None
    return _BIN_SUFFIX.sub("", gpu_id)


def cpu_class(cpu_id: str, sockets: int = 1) -> str:
    """``server`` or ``desktop`` for a catalog CPU id."""
    c = _hw()["cpu"][cpu_id]
    return "server" if sockets > 1 or int(c.get("channels", 2)) >= 6 else "desktop"


def _int(text) -> int:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return 0


def row_parts(row: dict) -> dict:
    """What one row covers: {"gpu_family", "apple_chip", "server_cpu", "desktop_cpu", "runtime"} (None where
    the row says nothing, or the part did no work)."""
    from . import row_notes, validate as V       # validate imports intervals; keep this module light
    hw = _hw()
    gpu = (row.get("gpu") or "").strip().lower()
    kind = placement_kind((row.get("placement") or "").strip() or "all-gpu")
    out = dict.fromkeys(("gpu_family", "apple_chip", "server_cpu", "desktop_cpu", "runtime"))
    if gpu and gpu != "none":
        out["apple_chip"] = apple_chip(gpu)
        if kind != "cpu":
            out["gpu_family"] = gpu_family(gpu)
        elif gpu in hw["unified"] and not out["apple_chip"]:
            out["desktop_cpu"] = gpu                 # a client APU's own CPU cores ran the model
    has_gpu = bool(gpu) and gpu != "none"
    cpu_works = kind == "cpu" or (has_gpu and kind in ("hybrid", "offload")) or not has_gpu
    cpu = V._cpu_id(row.get("host_cpu") or "")
    if cpu and cpu_works and gpu not in hw["unified"]:
        out[f"{cpu_class(cpu, _int(row.get('host_sockets')) or 1)}_cpu"] = cpu
    try:
        out["runtime"] = row_notes.runtime_for(row, row.get("notes") or "", [])
    except row_notes.Skip:
        out["runtime"] = None
    return out


def audit(rows) -> dict:
    """{"gpu_families", "apple_chips", "server_cpus", "desktop_cpus", "runtimes"} -> {name: row count}
    over *rows* (dicts with the corpus columns), plus "missing_runtimes": catalog runtime profiles no row
    is modelled by."""
    keys = {"gpu_family": "gpu_families", "apple_chip": "apple_chips", "server_cpu": "server_cpus",
            "desktop_cpu": "desktop_cpus", "runtime": "runtimes"}
    out: dict = {v: {} for v in keys.values()}
    for row in rows:
        for k, v in row_parts(row).items():
            if v:
                out[keys[k]][v] = out[keys[k]].get(v, 0) + 1
    catalog = set(_load_catalog("runtimes").get("runtimes", {}))
    out["missing_runtimes"] = sorted(catalog - set(out["runtimes"]))
    return out


def shortfalls(report: dict) -> list:
    """What the issue asks for that *report* (from :func:`audit`) lacks, as sentences (empty: all met)."""
    short = [f"{key.replace('_', ' ')}: {len(report[key])} < {need}"
             for key, need in ISSUE_MINIMUMS.items() if len(report[key]) < need]
    fams = report["gpu_families"]
    for vendor in REQUIRED_GPU_VENDORS:
        if not any(f.startswith(vendor + "-") for f in fams):
            short.append(f"no {vendor} GPU family")
    if not any(f in fams for f in PRE_VOLTA):
        short.append("no pre-Volta NVIDIA GPU")
    if report["missing_runtimes"]:
        short.append("runtimes with no row: " + ", ".join(report["missing_runtimes"]))
    return short


def load(paths) -> list:
    rows = []
    for path in paths:
        with open(path, newline="", encoding="utf-8") as fh:
            rows += list(csv.DictReader(fh))
    return rows


def main(argv=None) -> int:    # pragma: no cover - a convenience printout
    import sys
    from ..ingest import packaged
    paths = (argv if argv is not None else sys.argv[1:]) or [packaged.measurements_csv()]
    rep = audit(load(paths))
    for key in ("gpu_families", "apple_chips", "server_cpus", "desktop_cpus", "runtimes"):
        need = ISSUE_MINIMUMS.get(key, "")
        print(f"{key} ({len(rep[key])}{' / ' + str(need) if need else ''}):")
        for name, n in sorted(rep[key].items()):
            print(f"  {name:28s} {n}")
    print("missing runtimes:", ", ".join(rep["missing_runtimes"]) or "none")
    short = shortfalls(rep)
    print("shortfalls:", "; ".join(short) if short else "none")
    return 1 if short else 0


if __name__ == "__main__":    # pragma: no cover
    raise SystemExit(main())
