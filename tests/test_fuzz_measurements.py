"""Fuzzing the measurement CSVs that ``validate`` and ``calibrate`` read, with counts
(conftest.fuzz_count): a small CSV written here (not ../shared's) with cells set to hostile values
(NaN, inf, negative, huge, unknown ids, wrong types), rows cut or lengthened, columns renamed, and its
bytes mutated. Each file gives rows that build into a configuration or are skipped with a reason, and a
report whose numbers are finite; or a MoesimError naming ``data``. Never a bare built-in exception,
an internal error or a kernel error."""
from __future__ import annotations

import csv
import io
import math
import random

import pytest

from conftest import fuzz_count, fuzz_file, mutate_bytes
from moesim.analysis import validate as V

COLUMNS = ["id", "quality", "model", "quant", "kv_dtype", "runtime", "gpu", "gpus", "gpu_mem_gb", "host_cpu",
           "host_mem", "host_channels", "host_sockets", "host_cores", "host_mem_gb", "measured_host_bw_gbs", "pcie",
           "parallel", "placement", "prompt_tokens", "depth_tokens", "batch", "mtp", "decode_tok_s",
           "aggregate_tok_s", "prefill_tok_s", "source", "notes"]
# made-up runs in the format of docs/validation.md (the numbers are plausible, not measurements)
ROWS = [
    "LC-01,A,qwen3-30b-a3b,Q4_K_M,,llama.cpp,rtx-4090,1,,,ddr5,2,1,16,64,,gen4x16,,all-gpu,512,,1,0,150,,3000,"
    "example.org/a,tg128 4 threads; ub 512",
    "LC-02,B,qwen3-30b-a3b,Q4_K_M,q8_0,llama.cpp,rtx-4090,1,,Ryzen 9 7950X,ddr5,2,1,16,64,,gen4x16,,n-cpu-moe=20,"
    "512,4096,1,0,40,,900,example.org/a,May 2024",
    "CPU-01,B,qwen3-30b-a3b,Q8_0,,ik_llama.cpp,,,,Xeon Gold 6454S,ddr5,8,1,32,512,200,,,cpu-only,512,4096,1,0,20,,"
    "100,example.org/b,AVX2",
    "AP-01,A,gpt-oss-20b,MXFP4,,llama.cpp,m3-ultra,1,,,,,,,512,,,,all-gpu,512,,1,0,80,,900,example.org/c,",
    "KT-01,A,deepseek-v2-lite,Q4_K_M,,ktransformers,rtx-4090,1,,,ddr5,8,1,32,256,,gen4x16,,experts-cpu,2048,,1,0,"
    "30,,400,example.org/d,v0.3; prefill threshold 2048; chunked prefill 4096",
    "DC-01,A,mixtral-8x7b,fp8,,vllm,h100,2,,,ddr5,8,1,32,1024,,gen5x16,tp2,all-gpu,1024,1024,8,0,60,480,,"
    "example.org/e,",
    "REF-01,C,llama-3-8b,Q8_0,,llama.cpp,rtx-4090,1,,,,,,,,,,,all-gpu,512,,1,0,,,,example.org/f,aggregate only",
]
HOSTILE = ["", "-1", "0", "1", "nan", "inf", "-inf", "1e300", "1e-300", "2147483648", "9223372036854775808",
           "x", "None", "[]", "Q4_K_M", "nope", "all-gpu", "tp8", "ep99", "disagg", "exo", "m3-ultra",
           "n-cpu-moe=99", "tg128 0 threads", "ub 99999999999999999999", "prefill threshold 0", "\x00", "é",
           "\"", ",", "\n"]


def seed_csv(rows=ROWS) -> str:
    return ",".join(COLUMNS) + "\n" + "\n".join(rows) + "\n"


def _table(text: str) -> list:
    return list(csv.reader(io.StringIO(text)))


def _mutate_cells(rng: random.Random) -> bytes:
    """Hostile cells, cut or lengthened rows, renamed or dropped columns, or raw byte edits."""
    if rng.random() < 0.2:
        return mutate_bytes(seed_csv().encode(), rng)
    table = _table(seed_csv())
    for _ in range(rng.randint(1, 4)):
        r = rng.randrange(len(table))
        op = rng.random()
        if op < 0.75 and table[r]:
            c = rng.randrange(len(table[r]))
            donor = table[rng.randrange(len(table))]
            table[r][c] = rng.choice(HOSTILE) if rng.random() < 0.8 or c >= len(donor) else donor[c]
        elif op < 0.85:
            table[r] = table[r][:rng.randrange(len(table[r]) + 1)]
        elif op < 0.95:
            table[r] = table[r] + [rng.choice(HOSTILE) for _ in range(rng.randint(1, 3))]
        else:
            table.insert(rng.randrange(1, len(table) + 1), list(table[rng.randrange(1, len(table))]))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    return out.getvalue().encode("utf-8", "surrogatepass")


def _finite(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))


def _check_built(cfg: V.RowConfig) -> None:
    assert cfg.context >= 1 and cfg.prompt >= 1 and cfg.batch >= 1 and cfg.mtp >= 0, cfg
    m = cfg.machine
    for v in (m.gpu_bw_gbs, m.host_bw_gbs, m.gpu_mem_bytes, m.host_mem_bytes, m.pcie_gbs):
        assert _finite(v) and v >= 0, (cfg.row, m)


def _check_report(rep: dict) -> None:
    s = rep["summary"]
    for k in ("median_abs_pct_err", "p90_abs_pct_err"):
        assert _finite(s[k]), s
    assert s["rows_evaluated"] == len(rep["rows"])
    for rec in rep["rows"]:
        for k in ("decode_predicted", "prefill_predicted", "decode_err", "prefill_err", "roofline_predicted"):
            assert _finite(rec[k]), (k, rec)
        for k in ("decode_predicted", "prefill_predicted"):
            assert rec[k] is None or rec[k] > 0, (k, rec)


def test_seed_csv_validates(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text(seed_csv())
    rep = V.validate(p)
    _check_report(rep)
    assert rep["summary"]["rows_evaluated"] >= 5, rep["summary"]["rows_skipped"]


@pytest.mark.parametrize("column, value", [("batch", "inf"), ("depth_tokens", "-inf"), ("mtp", "1e400"),
                                           ("decode_tok_s", "abc"), ("prefill_tok_s", "nan"),
                                           ("decode_tok_s", "inf"), ("measured_host_bw_gbs", "-200"),
                                           ("measured_host_bw_gbs", "inf"), ("gpus", "nan"), ("host_cores", "inf"),
                                           ("batch", "-1"), ("batch", "1e300"), ("batch", "2147483648"),
                                           ("mtp", "65"), ("depth_tokens", "1e12"),
                                           ("measured_host_bw_gbs", "1e300")])
def test_hostile_cells_skip_the_row_with_a_reason(tmp_path, column, value):
    """Regression: inf in an integer column raised OverflowError, a non-numeric measurement escaped as an
    internal error, a NaN/inf measurement put NaN in the report, a negative measured bandwidth reached
    the kernel (KernelError), as did a negative batch; a batch of 2^31 failed the kernel's int32 check, a
    measured bandwidth of 1e300 GB/s gave an infinite roofline."""
    table = _table(seed_csv())
    c = COLUMNS.index(column)
    for row in table[1:]:
        row[c] = value
    p = tmp_path / "m.csv"
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    p.write_text(out.getvalue())
    rep = V.validate(p)
    _check_report(rep)
    reasons = " ".join(s["reason"] for s in rep["summary"]["rows_skipped"])
    assert column in reasons, rep["summary"]["rows_skipped"]


def test_short_rows_and_reordered_columns_are_skipped_not_crashed(tmp_path):
    """Regression: a row shorter than the header left None in its last columns ('runtime'.strip())."""
    cols = ["decode_tok_s"] + [c for c in COLUMNS if c != "decode_tok_s"]
    p = tmp_path / "m.csv"
    p.write_text(",".join(cols) + "\n150,LC-9,A\n")
    rep = V.validate(p)
    _check_report(rep)
    assert [s["id"] for s in rep["summary"]["rows_skipped"]] == ["LC-9"]


def _check_rows(rows) -> None:
    for row in rows:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in row.items()), row
        try:
            V.measurements(row)
            _check_built(V.build(row))
        except V.Skip as exc:
            assert str(exc), row


@pytest.mark.fuzz
def test_mutated_measurement_rows_build_or_are_skipped(tmp_path, tally):
    """The reader proper (load_rows, then build per row): cheap, so most of the --long inputs."""
    rng = random.Random("measurement rows")
    fuzz_file(tally, tmp_path / "m.csv", lambda: _mutate_cells(rng), fuzz_count(1500, 60_000), 10, V.load_rows,
              "data", _check_rows)


@pytest.mark.fuzz
def test_mutated_measurements_validate_to_finite_reports(tmp_path, tally):
    rng = random.Random("measurements validate")
    fuzz_file(tally, tmp_path / "m.csv", lambda: _mutate_cells(rng), fuzz_count(60, 2_000), 30, V.validate,
              "data", _check_report)


def test_empty_runtime_is_the_default_runtime(tmp_path):
    """Regression: an empty runtime cell crashed reading the notes (None.startswith)."""
    table = _table(seed_csv())
    table[1][COLUMNS.index("runtime")] = ""
    cfg = V.build(dict(zip(COLUMNS, table[1])))
    assert cfg.runtime is None
    _check_built(cfg)
