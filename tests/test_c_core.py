"""The C core on its own: tests/c/test_core.c calls every entry point of csrc/moesim.h directly, built
with the strict warning set (-Wall -Wextra -Werror -Wshadow -Wconversion, the core's own files too)
under AddressSanitizer + UndefinedBehaviorSanitizer (gcc's, on the CI machine; LeakSanitizer comes
with ASan on Linux). Skips only where no C compiler exists."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wconversion"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
CC = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None or sys.platform == "win32", reason="needs a C compiler (gcc or cc)")


def _build(tmp_path: Path, flags: list, name: str) -> Path:
    exe = tmp_path / name
    sources = [str(ROOT / "tests" / "c" / "test_core.c")] + sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
    cmd = [CC, *STRICT, "-O1", "-g", *flags, f"-I{ROOT / 'csrc'}", *sources, "-lm", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, "strict build failed:\n" + res.stderr[-6000:]
    return exe


def _run(exe: Path) -> str:
    """Run the harness; returns its stamp digest line after checking the pass / fail count."""
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    lines = res.stdout.strip().splitlines()
    passed, failed = (int(x.split()[0]) for x in lines[-1].split(", "))
    assert failed == 0 and passed > 1000, lines[-1]
    digest = [ln for ln in lines if ln.startswith("stamp digest ")]
    assert len(digest) == 1, lines[-5:]
    return digest[0].split()[2]


@pytest.fixture(scope="module")
def asan_digest(tmp_path_factory):
    return _run(_build(tmp_path_factory.mktemp("asan"), SANITIZE, "test_core_asan"))


def test_core_under_asan_and_ubsan(asan_digest):
    assert len(asan_digest) == 16


def test_stamp_restart_changes_no_result(tmp_path, asan_digest):
    """The int32 stamps (ms_cache_t.stamp, the routing sampler's) restart at MS_STAMP_MAX instead of
    overflowing. Built with MS_STAMP_MAX = 2 they restart every other step / token, thousands of times in
    the harness's Monte Carlo decodes, samples and cache replays; every answer (the digest of them all)
    must equal the default build's, where INT32_MAX is never reached. (Dropping the marks' clearing at a
    restart, in the cache or in the sampler, changes the digest.)"""
    assert _run(_build(tmp_path, [*SANITIZE, "-DMS_STAMP_MAX=2"], "test_core_stamp2")) == asan_digest


def test_core_with_openmp_threads(tmp_path, asan_digest):
    """The same harness with OpenMP on (its thread-count checks then compare 1 and 2 real threads)."""
    probe = subprocess.run([CC, "-fopenmp", "-x", "c", "-", "-o", str(tmp_path / "omp")], input="int main(void){return 0;}",
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the compiler has no OpenMP")
    assert _run(_build(tmp_path, ["-fopenmp", "-DMOESIM_HAVE_OPENMP=1", "-DMS_THREAD_GRAIN=0"], "test_core_omp")) == asan_digest
