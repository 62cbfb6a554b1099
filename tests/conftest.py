"""Shared test machinery: the fuzzers' counts and tallies, and the session's own lowering cache.

The whole session (and every ``python -m moesim`` it starts) keeps its persistent lowering cache
(moesim._lowering_cache) in a temporary folder of its own, removed at the end: tests never read or
write the user's real cache.

Every fuzz test (marker ``fuzz``) takes its number of inputs from :func:`fuzz_count`: a modest count in
the ordinary suite (the whole fuzz set costs about a minute on two cores), the ``--long`` count under
``pytest --long`` (over all fuzzers at least 1,000,000 inputs; see docs/robustness.md), or
MOESIM_FUZZ_COUNT when that is set (the same count for every fuzzer, as before). Each fuzzer records
what became of its inputs in a :class:`Tally`; a ``--long`` session ends with one line per fuzzer
(inputs, accepted, refused with a MoesimError) and the total.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import time

import pytest

_STATE = {"long": False}
TALLIES: dict = {}


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="run every fuzzer with its long count (>= 1,000,000 inputs over all fuzzers)")


def pytest_configure(config):
    _STATE["long"] = bool(config.getoption("--long", default=False))
    # before collection: modules that build catalog models at import time use the cache already
    _STATE["cache_dir"] = tempfile.mkdtemp(prefix="moesim-test-cache-")
    os.environ["MOESIM_CACHE_DIR"] = _STATE["cache_dir"]


def pytest_unconfigure(config):
    folder = _STATE.pop("cache_dir", None)
    if folder is None:
        return
    os.environ["MOESIM_CACHE"] = "off"        # nothing is written at exit into the folder removed here
    import sys
    lc = sys.modules.get("moesim._lowering_cache")
    if lc is not None:
        lc.reset()
    shutil.rmtree(folder, ignore_errors=True)


def fuzz_count(ci: int, long: int) -> int:
    """The number of inputs a fuzzer runs: *ci* in the suite, *long* under --long, MOESIM_FUZZ_COUNT
    when set (overrides both)."""
    env = os.environ.get("MOESIM_FUZZ_COUNT", "").strip()
    if env:
        return max(1, int(env))
    return long if _STATE["long"] else ci


class Tally:
    """What became of one fuzzer's inputs: accepted (a valid result) or refused (a MoesimError)."""

    def __init__(self, name: str):
        self.name = name
        self.accepted = 0
        self.refused = 0
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        TALLIES[name] = self

    @property
    def inputs(self) -> int:
        return self.accepted + self.refused

    def ok(self) -> None:
        self.accepted += 1
        self.seconds = time.perf_counter() - self.t0

    def refuse(self) -> None:
        self.refused += 1
        self.seconds = time.perf_counter() - self.t0


@pytest.fixture
def tally(request):
    """A Tally named after the test (parametrized ids included)."""
    return Tally(request.node.name)


class Hang(Exception):
    """One fuzz case ran past its time bound."""


def _alarm(*_):
    raise Hang


@contextlib.contextmanager
def bounded(seconds: int, what):
    """Run the block under a SIGALRM bound; a hang fails the test naming *what* (no-op without SIGALRM)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    except Hang:
        pytest.fail(f"{what!r} took over {seconds} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rewrite(path, data) -> None:
    """Overwrite *path* with *data* in place: write, then cut to length (truncating to zero first makes
    ext4 flush the file on close, ~3 ms a file, most of a cheap reader's case)."""
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def fuzz_file(tally, path, make, count: int, seconds: int, read, field: str, check) -> None:
    """*count* mutated files (each ``make()`` written to *path*) through *read*, each under a *seconds*
    bound: a MoesimError must name *field* and the file; what reads goes to *check*, which returns False
    when it refused the input itself (having tallied that). Every input is tallied once."""
    from moesim import MoesimError
    for i in range(count):
        rewrite(path, make())
        with bounded(seconds, f"{path.name} mutant {i}"):
            try:
                got = read(path)
            except MoesimError as exc:
                assert exc.field == field and str(path) in str(exc), exc
                tally.refuse()
                continue
            if check(got) is not False:
                tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count


# byte strings a mutation splices in: numbers out of range, other JSON types, bad UTF-8, separators
SPLICE = [b"-1", b"1e9", b"[]", b"{}", b"null", b"\"x\"", b"99999999999", b"\xff\xfe", b",", b"\n", b"[[1,2]]",
          b"true", b"0", b"1e400", b"NaN", b"-0"]


def mutate_bytes(data: bytes, rng: random.Random, splice=SPLICE, max_ops: int = 4) -> bytes:
    """One to *max_ops* random edits of *data*: a byte set, a token spliced in, a span deleted or
    duplicated, or the tail cut."""
    b = bytearray(data)
    for _ in range(rng.randint(1, max_ops)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice(splice)
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 16)]
        elif op == 3:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[min(i, j):max(i, j)][:64]
        else:
            b = b[:i]
    return bytes(b)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLIES or not (_STATE["long"] or os.environ.get("MOESIM_FUZZ_COUNT")):
        return
    tr = terminalreporter
    tr.section("fuzz inputs")
    tot = [0, 0, 0, 0.0]
    for name in sorted(TALLIES):
        t = TALLIES[name]
        tr.write_line(f"{name:<66} inputs {t.inputs:>9,}  accepted {t.accepted:>9,}  refused {t.refused:>9,}  "
                      f"{t.seconds:8.1f} s")
        for i, v in enumerate((t.inputs, t.accepted, t.refused, t.seconds)):
            tot[i] += v
    tr.write_line(f"{'TOTAL':<66} inputs {tot[0]:>9,}  accepted {tot[1]:>9,}  refused {tot[2]:>9,}  "
                  f"{tot[3]:8.1f} s")
