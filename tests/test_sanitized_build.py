"""The Python test suite (a subset) against an instrumented build of the extension.

One build, in a temporary copy of the source tree (never the checkout, never the installed package):
``MOESIM_SANITIZE=1 MOESIM_DEBUG=1 python setup.py build_ext --inplace``, i.e. the C core and the
Cython-generated glue under gcc's AddressSanitizer + UndefinedBehaviorSanitizer (-O1 -g,
-fno-sanitize-recover=undefined) with Cython's bounds checks on (an out-of-range index in the glue raises
IndexError; one past a buffer in C stops the run with an ASan report). The subset in ``SUBSET`` then
runs in a subprocess against that build, the interpreter preloading gcc's libasan: the C-vs-Python twins
of every kernel, Monte Carlo and analytic decode, routing sampling and trace replay, the four cache
policies, sweeps and auto placement, OpenMP thread counts 1-4, the glue's refusals and error codes, and
the API fuzzing. Every entry point of ``moesim.engine._kernel`` must be reached, and the subprocess checks
that the kernel it imported is the instrumented one. Skips without gcc, libasan, Linux or Cython.
Run alone: ``python -m pytest -q tests/test_sanitized_build.py`` (see docs/design.md, Tests)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GCC = shutil.which("gcc")
# the flags MOESIM_SANITIZE=1 gives in setup.py, for the canary below
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-O1", "-g"]

# Kept to ~1 min under the sanitizers on two cores; the slow hypothesis differentials (300 examples)
# stay in the ordinary run. test_leaks is left out: ASan's quarantine and shadow memory make RSS meaningless.
SUBSET = [
    "tests/test_rng.py",
    "tests/test_kernel_glue.py",
    "tests/test_decode.py::test_kernel_matches_reference",
    "tests/test_decode.py::test_analytic_agrees_with_montecarlo_under_independent_routing[4-64-6-0.2]",
    "tests/test_decode.py::test_analytic_agrees_with_montecarlo_under_independent_routing[4-32-4-0.6]",
    "tests/test_decode.py::test_group_limited_routing_stays_in_groups",
    "tests/test_decode.py::test_same_seed_same_result_on_any_thread_count",
    "tests/test_decode.py::test_trace_replay_through_kernel_matches_cache_replay",
    "tests/test_decode.py::test_kernel_rejects_inconsistent_tables_without_crashing",
    "tests/test_memory.py::test_c_matches_reference_numpy_random",
    "tests/test_memory.py::test_differential_sees_every_placement_and_outcome",
    "tests/test_memory.py::test_threads_match_serial_bit_for_bit",
    "tests/test_memory.py::test_max_batch_brute_force",
    "tests/test_routing.py::test_belady_is_the_offline_optimum",
    "tests/test_routing_window.py",
    "tests/test_sweep.py::test_kernel_equals_python_twin",
    "tests/test_metal_decode_paths.py::test_c_kernel_paths_equal_the_python_twins",
    # the sweep's prepared decode jobs and batched prefill: the per-call entry points they replaced are reached here
    "tests/test_decode_variants.py::test_one_call_equals_one_run_per_job",
    "tests/test_prefill_kernel.py::test_prefill_many_equals_one_call_per_pair",
    "tests/test_sweep.py::test_context_functions_match_decode",
    "tests/test_sweep.py::test_montecarlo_rows_equal_kernel_runs_and_threads",
    "tests/test_sweep.py::test_threads_sharing_one_plan_equal_serial",
    "tests/test_twins.py::test_auto_placement_kernel_equals_python_twin_of_choose",
    "tests/test_twins.py::test_auto_placement_reaches_every_branch",
    "tests/test_twins.py::test_auto_placement_kernel_rejects_bad_input",
    "tests/test_twins.py::test_auto_max_context_kernel_equals_python_twin",
    "tests/test_consistency.py::test_the_c_screen_flags_exactly_what_its_numpy_twin_flags",
    "tests/test_consistency.py::test_each_chunk_check_fires",
    "tests/test_fuzz_api.py",
    "tests/test_serve.py::test_c_scheduler_matches_python_twin",
    "tests/test_serve.py::test_small_pool_preempts_and_recomputes",
    "tests/test_serve.py::test_pool_too_small_for_one_chunk_is_an_error",
    "tests/test_serve.py::test_bad_table_is_a_kernel_error_not_a_crash",
]
# Compiles and runs a C program of its own (tests/test_c_core.py runs the C core under ASan already).
DESELECT = ["tests/test_kernel_glue.py::test_c_core_returns_an_error_code_past_its_limits"]
MIN_PASSED = 94  # of 105 (three skip without OpenMP)
SUBSET_ENV = {"MOESIM_DIFF_EXAMPLES": "25", "MOESIM_FUZZ_COUNT": "15"}

# Runs in the subprocess: refuse any kernel but the instrumented one, count the calls of every entry point
# of the extension module (the Python layers look them up on the module at call time), run pytest.
BOOT = r"""
import json, os, sys
import moesim.engine._kernel as k
build, report = os.path.realpath(sys.argv[1]), sys.argv[2]
if not os.path.realpath(k.__file__).startswith(build + os.sep):
    sys.exit(f"imported {k.__file__}, not the instrumented build under {build}")
calls = {}
def counted(name, fn):
    def call(*a, **kw):
        calls[name] = calls.get(name, 0) + 1
        return fn(*a, **kw)
    return call
names = [n for n, f in vars(k).items() if callable(f) and not isinstance(f, type) and not n.startswith("_")
         and getattr(f, "__module__", None) == k.__name__]
for n in names:
    setattr(k, n, counted(n, getattr(k, n)))
import pytest
rc = pytest.main(sys.argv[3:])
with open(report, "w") as fh:
    json.dump({"kernel": k.__file__, "entry_points": names, "calls": calls}, fh)
sys.exit(int(rc))
"""


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the sanitizer build runs on Linux only"
    if GCC is None:
        return "needs gcc (AddressSanitizer + UBSan)"
    if importlib.util.find_spec("Cython") is None:
        return "needs Cython to build the extension (pip install '.[test]')"
    if importlib.util.find_spec("setuptools") is None:
        return "needs setuptools to build the extension (pip install '.[test]')"
    if not Path(_libasan()).is_file():
        return "gcc has no libasan (AddressSanitizer runtime)"
    return None


def _libasan() -> str:
    res = subprocess.run([GCC, "-print-file-name=libasan.so"], capture_output=True, text=True)
    return os.path.realpath(res.stdout.strip()) if res.returncode == 0 else ""


SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _sanitizer_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASAN_", "UBSAN_", "MOESIM_"))}
    env.update(LD_PRELOAD=_libasan(),
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", **extra)
    return env


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """The instrumented build in a copy of the tree; returns its src/ (what PYTHONPATH names)."""
    tree = tmp_path_factory.mktemp("sanitized")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    shutil.copytree(ROOT / "src" / "moesim", tree / "src" / "moesim",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.o", "_kernel.c", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOESIM_")}
    env.update(MOESIM_SANITIZE="1", MOESIM_DEBUG="1", CC=GCC)
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, "instrumented build failed:\n" + res.stdout[-3000:] + res.stderr[-6000:]
    return tree / "src"


def _kernel_so(src: Path) -> Path:
    found = sorted((src / "moesim" / "engine").glob("_kernel*.so"))
    assert len(found) == 1, found
    return found[0]


def test_build_is_instrumented(build):
    """The sanitizers are compiled in (their runtime calls are in the extension's symbol table) and the
    glue is bounds-checked (Cython emits its index check on every memoryview access; a release build has none)."""
    blob = _kernel_so(build).read_bytes()
    assert b"__asan_report_load" in blob and b"__asan_init" in blob
    assert b"__ubsan_handle_" in blob
    generated = (build / "moesim" / "engine" / "_kernel.c").read_text()
    assert generated.count("__Pyx_RaiseBufferIndexError(") > 20


CANARY = r"""
#include <stdlib.h>
int heap_overflow(int n) { char *p = malloc((size_t)n); int v = p[n]; free(p); return v; }
int signed_overflow(int a) { return a + 1; }
"""


@pytest.mark.parametrize("call,report", [("heap_overflow(16)", "heap-buffer-overflow"),
                                         ("signed_overflow(2147483647)", "signed integer overflow")])
def test_the_run_environment_stops_on_a_report(tmp_path, call, report):
    """A canary built with the same flags, loaded under the same interpreter settings as the subset: an
    ASan finding and a UBSan finding each end the process with the report (no silent recovery)."""
    src = tmp_path / "canary.c"
    src.write_text(CANARY)
    lib = tmp_path / "libcanary.so"
    res = subprocess.run([GCC, *SANITIZE, "-fPIC", "-shared", str(src), "-o", str(lib)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    code = f"import ctypes; print(ctypes.CDLL({str(lib)!r}).{call}); print('survived')"
    res = subprocess.run([sys.executable, "-c", code], env=_sanitizer_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "survived" not in res.stdout, res.stdout + res.stderr[-3000:]
    assert report in res.stderr, res.stderr[-3000:]


@pytest.fixture(scope="module")
def subset_run(build, tmp_path_factory):
    """Runs SUBSET against the build (-v names the test a sanitizer report stops; --capture=sys leaves
    file descriptor 2 alone, so the report itself reaches stderr instead of dying in pytest's capture)."""
    report = tmp_path_factory.mktemp("sanitized_report") / "calls.json"
    args = [sys.executable, "-c", BOOT, str(build), str(report), "-x", "-v", "--capture=sys", "-p", "no:cacheprovider",
            *SUBSET, *(f"--deselect={node}" for node in DESELECT)]
    path = os.pathsep.join([str(build)] + [p for p in [os.environ.get("PYTHONPATH")] if p])  # the build first
    res = subprocess.run(args, cwd=ROOT, env=_sanitizer_env(PYTHONPATH=path, **SUBSET_ENV),
                         capture_output=True, text=True, timeout=1800)
    calls = json.loads(report.read_text()) if report.is_file() else None
    return res, calls, build


def _report(res) -> str:
    """The end of the test log and the sanitizer's report from its first line (ASan's stack and shadow
    map would push it out of a plain tail)."""
    err = res.stderr
    first = min((i for i in (err.find("ERROR: AddressSanitizer"), err.find("runtime error:")) if i >= 0), default=0)
    return res.stdout[-4000:] + "\n" + err[max(0, first - 200):][:8000]


def test_subset_passes_under_sanitizers_and_bounds_checks(subset_run):
    res, calls, build = subset_run
    out = _report(res)
    assert res.returncode == 0, out
    summary = res.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= MIN_PASSED, summary
    assert not re.search(r"\d+ (failed|error)", summary), summary
    assert calls is not None and Path(calls["kernel"]).is_relative_to(build), out


def test_subset_reaches_every_kernel_entry_point(subset_run):
    """Every function of moesim.engine._kernel is called through the glue at least once by the subset
    (a new entry point needs a test in SUBSET)."""
    res, calls, _ = subset_run
    assert calls is not None, _report(res)
    assert len(calls["entry_points"]) >= 10, calls["entry_points"]
    missing = sorted(set(calls["entry_points"]) - set(calls["calls"]))
    assert not missing, f"not reached under the sanitizers: {missing}"
