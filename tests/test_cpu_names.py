"""CPUs as people, spec sheets and lscpu name them resolve to the catalog entry (spec.hardware.catalog_cpu_id,
hardware.toml [cpu_names]); both `--cpu` and a measurement's host_cpu read them; other names give None."""
from __future__ import annotations

import pytest

import moesim
from moesim import _catalog
from moesim.spec.hardware import catalog_cpu_id


@pytest.mark.parametrize("name,cpu", [
    ("AMD EPYC 9654 96-Core Processor", "epyc-9654"),                   # lscpu
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz", "xeon-platinum-8480c"),
    ("Intel(R) Core(TM) i9-14900K", "core-i9-14900k"),
    ("i9-13900K", "core-i9-13900k"),
    ("Ryzen Threadripper PRO 5975WX 32-Cores", "threadripper-pro-5975wx"),
    ("AMD Ryzen 9 7950X3D", "ryzen-9-7950x"),
    ("Xeon Platinum 8592+", "xeon-platinum-8592-plus"),
    ("NVIDIA Grace", "nvidia-grace"),
    ("epyc-7763", "epyc-7763"),
])
def test_names_resolve(name, cpu):
    assert catalog_cpu_id(name) == cpu


@pytest.mark.parametrize("name", ["M2 Ultra", "EPYC 1234", "Core i9", "ryzen"])
def test_other_names_resolve_to_none(name):
    assert catalog_cpu_id(name) is None


def test_cpu_flag_takes_such_a_name_and_unknown_cpus_still_error():
    m = moesim.machine(host="ddr5-4800x12", cpu="AMD EPYC 9654 96-Core Processor")
    assert m.cpu == "epyc-9654" and m.cores == 96
    with pytest.raises(moesim.MoesimError, match="CPU"):
        moesim.machine(host="ddr5", cpu="EPYC 1234")


def test_every_cpu_name_points_at_a_catalog_cpu():
    h = _catalog.load("hardware")
    for alias, target in h["cpu_names"].items():
        assert target in h["cpu"] and alias not in h["cpu"], alias


@pytest.mark.parametrize("host,gbs", [("ddr5-7200x2", 115.2), ("ddr5-8000x2", 128.0), ("ddr4-2400x8", 153.6)])
def test_unlisted_dimm_speeds_derive_their_bandwidth(host, gbs):
    m = moesim.machine(host=host)
    assert m.host_bw_gbs == pytest.approx(gbs)
    assert any("derived from its rate" in a for a in m.assumptions)


@pytest.mark.parametrize("host", ["ddr3-1600x2", "ddr5-99999x2", "ddr5-800x2"])
def test_other_memory_parts_still_error(host):
    with pytest.raises(moesim.MoesimError, match="host memory part"):
        moesim.machine(host=host)
