"""The measurement corpus covers what issue 14 asks for (over the shared calibration.csv plus the project's
measurements_collected.csv, i.e. the packaged measurements.csv): >= 250 quality A/B collected rows with a
source address and a date; >= 12 GPU families including AMD, Intel and pre-Volta NVIDIA; >= 6 Apple chips;
>= 8 server and >= 8 desktop CPUs; a row for every runtime profile in catalog/runtimes.toml."""
from __future__ import annotations

import csv
from pathlib import Path

from moesim.analysis import coverage as C
from moesim.ingest import packaged

COLLECTED = Path(packaged.measurements_csv()).with_name("measurements_collected.csv")


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_collected_rows_are_many_graded_sourced_and_dated():
    rows = _rows(COLLECTED)
    good = [r for r in rows if r["quality"] in ("A", "B")]
    assert len(good) >= 250
    for r in rows:
        assert r["source_url"].startswith("https://"), r["id"]
        assert r["date"][:2] == "20" and len(r["date"]) in (7, 10), (r["id"], r["date"])


def test_combined_corpus_meets_the_issue_minimums():
    rep = C.audit(_rows(packaged.measurements_csv()))
    assert C.shortfalls(rep) == [], C.shortfalls(rep)
    assert len(rep["gpu_families"]) >= 12 and len(rep["apple_chips"]) >= 6
    assert len(rep["server_cpus"]) >= 8 and len(rep["desktop_cpus"]) >= 8
    assert any(f.startswith("amd-") for f in rep["gpu_families"])
    assert any(f.startswith("intel-") for f in rep["gpu_families"])
    assert "nvidia-pascal" in rep["gpu_families"]
    assert rep["missing_runtimes"] == []


def test_the_audit_can_fail():
    rows = _rows(packaged.measurements_csv())
    no_intel = [r for r in rows if not r["gpu"].startswith("arc-")]
    assert any("intel" in s for s in C.shortfalls(C.audit(no_intel)))
    no_mlx = [r for r in rows if r["runtime"] not in ("mlx", "omlx")]
    assert "mlx" in C.audit(no_mlx)["missing_runtimes"]
    assert C.shortfalls(C.audit(rows[:10]))


def test_what_a_row_counts_for():
    base = {"gpu": "none", "host_cpu": "Ryzen 9 7950X", "placement": "cpu-only", "runtime": "llama.cpp",
            "notes": "", "host_sockets": ""}
    assert C.row_parts(base)["desktop_cpu"] == "ryzen-9-7950x"
    assert C.row_parts(dict(base, host_cpu="EPYC 9654"))["server_cpu"] == "epyc-9654"
    assert C.row_parts(dict(base, host_cpu="EPYC (model not stated)"))["server_cpu"] is None
    gpu_host = dict(base, gpu="rtx-4090", placement="all-gpu")          # the host of an all-GPU run did no work
    parts = C.row_parts(gpu_host)
    assert parts["desktop_cpu"] is None and parts["gpu_family"] == "nvidia-ada"
    assert C.row_parts(dict(gpu_host, placement="n-cpu-moe=20"))["desktop_cpu"] == "ryzen-9-7950x"
    assert C.row_parts(dict(base, gpu="m3-max-30c", placement="unified", host_cpu=""))["apple_chip"] == "m3-max"
    apu = C.row_parts(dict(base, gpu="ryzen-ai-max-plus-395", host_cpu=""))
    assert apu["desktop_cpu"] == "ryzen-ai-max-plus-395" and apu["gpu_family"] is None
    assert C.row_parts(dict(base, runtime="llama.cpp", notes="May 2024 build"))["runtime"] == "llama.cpp-2024h1"
    assert C.row_parts(dict(base, runtime="moe-infinity"))["runtime"] == "offload"
    assert C.gpu_family("rx-6800-xt") == "amd-rdna2" and C.gpu_family("mi300x") == "amd-cdna3"
    assert C.gpu_family("arc-b580") == "intel-battlemage" and C.gpu_family("tesla-p40") == "nvidia-pascal"
    assert C.gpu_family("m2-max") is None
