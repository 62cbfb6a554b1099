"""CPU-side physics of unified AMD chips from sources: Strix Halo's CPU cores read the shared LPDDR5X pool
through two CCD fabric links (32 bytes per cycle of read bandwidth each at FCLK), so CPU-only decode sees
about half the 256 GB/s bus, not the whole pool."""
from __future__ import annotations

import math
import pathlib

import pytest

import moesim
from moesim import _catalog
from moesim.engine.lower.machine import lower_machine
from moesim.spec import quants as Q
from moesim.spec.placement import parse as parse_placement
from moesim.spec.runtimes import runtime

GB = 1e9
STRIX_HALO = ("ryzen-ai-max-plus-395", "ryzen-ai-max-390")


@pytest.mark.parametrize("uid", STRIX_HALO)
def test_strix_halo_cpu_ceiling_is_catalogued_from_the_ccd_links(uid):
    chip = _catalog.load("hardware")["unified"][uid]
    assert 0 < chip["cpu_bw_gbs"] < chip["mem_bw_gbs"]
    # hand computation: 2 CCDs x 32 B/cycle read x 2.0 GHz FCLK
    assert chip["cpu_bw_gbs"] == pytest.approx(2 * 32 * 2.0)


def test_strix_halo_ceiling_source_is_recorded_in_the_catalog_text():
    text = (pathlib.Path(moesim.__file__).parent / "catalog" / "hardware.toml").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("cpu_bw_gbs = 128.0")]
    assert len(lines) == len(STRIX_HALO)
    for ln in lines:
        assert "chipsandcheese.com" in ln and "32 bytes per cycle of read bandwidth" in ln


@pytest.mark.parametrize("uid", STRIX_HALO)
def test_strix_halo_cpu_only_host_bandwidth_stops_at_the_ceiling(uid):
    m = moesim.model("gpt-oss-120b")
    q = Q.resolve("MXFP4", m)
    mach = moesim.machine(gpu=uid)
    rt = runtime("ik_llama.cpp")
    hw = lower_machine(mach, rt, parse_placement("cpu-only", m, mach), Q.kernel_mix(m, q))
    d = rt.decode
    want = min(256.0 * GB * d.gddr_bw_eff, 128.0 * GB * d.host_bw_eff_desktop)
    assert want == 128.0 * GB * d.host_bw_eff_desktop      # the CCD links, not the bus, bind
    assert math.isclose(hw["host_bw"], want)


def test_strix_halo_cpu_only_memory_time_scales_with_the_ceiling():
    """gpt-oss-120b CPU-only decode: the host-memory time is the pool-wide time x pool / ceiling (the same
    bytes per token read at the CCD-link rate instead of the whole pool's)."""
    mach = moesim.machine(gpu="ryzen-ai-max-plus-395")
    kw = dict(quant="MXFP4", runtime="ik_llama.cpp", placement="cpu-only", tokens=16, mode="analytic")
    t = moesim.simulate("gpt-oss-120b", mach, **kw).breakdown["by_resource"]["host_memory"]
    d = runtime("ik_llama.cpp").decode
    ratio = (256.0 * d.gddr_bw_eff) / (128.0 * d.host_bw_eff_desktop)
    # hand computation: 5.1 B active params x ~4.25 bits + attention/head bytes ~ 3.6 GB per token
    bytes_per_token = t * 128.0 * GB * d.host_bw_eff_desktop
    assert 3.0e9 < bytes_per_token < 4.2e9
    assert ratio > 2.0                                   # the whole pool would read it over twice as fast
