"""CPU FLOP rate from the core's vector datapath (catalog [cpu_core]): fp32 FLOP per cycle = FMA pipes x
lanes x 2, where the lanes are the width an FMA pipe executes per cycle, not the widest instruction the ISA
decodes. Zen 4 double-pumps AVX-512 on 256-bit pipes, desktop/server Zen 5 has 512-bit pipes, mobile Zen 5
(Strix Point) keeps 256-bit ones."""
from __future__ import annotations

import dataclasses
import re

import pytest

import moesim
from moesim import _catalog
from moesim.engine.lower.machine import flops_per_cycle

SOURCE_MARK = re.compile(r"https?://|assumed|derived|HW §|RT §")


def _hw() -> dict:
    return _catalog.load("hardware")


def test_every_core_entry_has_a_datapath_and_a_source():
    cores = _hw()["cpu_core"]
    assert {"zen3", "zen4", "zen5", "zen5-mobile", "isa-avx512", "isa-avx2", "isa-neon", "isa-other"} <= set(cores)
    for cid, c in cores.items():
        assert int(c["fma_units"]) >= 1 and int(c["vector_bits"]) in (128, 256, 512), cid
        assert SOURCE_MARK.search(c["source"]), cid


def test_every_named_core_exists():
    hw = _hw()
    named = [(f"cpu.{k}", v["core"]) for k, v in hw["cpu"].items() if "core" in v]
    named += [(f"unified.{k}", v["cpu_core"]) for k, v in hw["unified"].items() if "cpu_core" in v]
    assert len(named) >= 10
    for where, core in named:
        assert core in hw["cpu_core"], where


@pytest.mark.parametrize("parts,want", [
    (dict(cpu="ryzen-9-7950x", host="ddr5-5200x2"), 32.0),        # Zen 4: 2 x 256-bit FMA
    (dict(cpu="epyc-9654", host="ddr5-4800x12"), 32.0),           # Zen 4 server, same core
    (dict(cpu="epyc-9355", host="ddr5-6400x12"), 64.0),           # Zen 5 Turin: 2 x 512-bit
    (dict(cpu="xeon-6980p", host="ddr5-6400x12"), 64.0),          # Intel: two AVX-512 FMA ports
    (dict(cpu="ryzen-7-5800x", host="ddr4-3200x2"), 32.0),        # Zen 3: AVX2
    (dict(gpu="ryzen-ai-max-plus-395"), 64.0),                    # Strix Halo: desktop Zen 5 CCDs
    (dict(gpu="ryzen-ai-9-hx-370"), 32.0),                        # Strix Point: mobile Zen 5
    (dict(gpu="m2-ultra"), 32.0),                                 # Arm: 4 x 128-bit
])
def test_flops_per_cycle_by_core(parts, want):
    mach = moesim.machine(**parts)
    assert flops_per_cycle(mach) == want


def test_zen4_runs_at_half_of_zen5_at_equal_cores_and_clock():
    z4 = moesim.machine(cpu="ryzen-9-7950x", host="ddr5-5200x2")
    z5 = dataclasses.replace(z4, cpu="epyc-9355")
    assert flops_per_cycle(z5) == 2.0 * flops_per_cycle(z4)


def test_an_avx2_build_caps_a_512_bit_core_at_256_bits():
    mach = moesim.machine(gpu="ryzen-ai-max-plus-395")
    avx2 = dataclasses.replace(mach, cpu_isa=("avx2",))
    assert flops_per_cycle(mach) == 64.0 and flops_per_cycle(avx2) == 32.0


def test_a_part_without_a_core_uses_its_isa():
    mach = moesim.machine(cpu="ryzen-9-7950x", host="ddr5-5200x2")
    bare = dataclasses.replace(mach, cpu=None)
    assert flops_per_cycle(bare) == 64.0                     # isa-avx512: the Intel two-port figure
    assert flops_per_cycle(dataclasses.replace(bare, cpu_isa=("sse4",))) == 16.0
    assert flops_per_cycle(dataclasses.replace(bare, cpu_isa=())) == 32.0
