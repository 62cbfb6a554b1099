"""Leak check (msprime's stress_lowlevel): thousands of kernel calls through the glue, good and bad
input alike, keep the resident set flat. Linux only (reads /proc/self/statm)."""
from __future__ import annotations

import gc
import os

import pytest

import moesim
from moesim import MoesimError

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def _flat(call, warm: int = 300, n: int = 3000, slack: int = 6 << 20) -> None:
    for _ in range(warm):
        call()
    before = _rss()
    for _ in range(n):
        call()
    grown = _rss() - before
    assert grown < slack, f"resident set grew {grown / 2**20:.1f} MiB over {n} calls"


def test_simulate_and_memory_calls_do_not_leak():
    mach = moesim.machine("desktop-4090")
    from moesim.engine.memory import memory
    _flat(lambda: memory("qwen3-30b-a3b", mach, "Q4_K_M", context=4096, placement="experts-cpu"))
    _flat(lambda: moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", mode="analytic"), n=1500)
    _flat(lambda: moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", tokens=8, warmup=0,
                                  placement="offload-cache=8"), n=800)


def test_refused_calls_do_not_leak():
    """Calls refused at the boundary (decode_many used to leak its buffers when filling them raised)."""
    mach = moesim.machine("desktop-4090")

    def bad():
        with pytest.raises(MoesimError):
            moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", mode="analytic", batch=-1)
        with pytest.raises(MoesimError):
            moesim.simulate("qwen3-30b-a3b", mach, quant="Q4_K_M", mode="analytic", policy="nope")
    _flat(bad, n=2000)
