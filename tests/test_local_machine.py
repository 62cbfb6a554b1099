"""``--machine local``: detection on this machine and on fixture machines (fake tools on a PATH of their
own, fake /proc and dmidecode output under a root directory)."""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from moesim import MoesimError
from moesim.cli import main
from moesim.ingest import local_probe as P
from moesim.ingest.local_machine import local_machine, match_catalog
from moesim._catalog import load


def _cpuinfo(name: str, sockets: int, cores: int, flags: str) -> str:
    blocks, n = [], 0
    for s in range(sockets):
        for c in range(cores):
            for _ in range(2):                      # two hyperthreads per core
                blocks.append(f"processor\t: {n}\nmodel name\t: {name}\nphysical id\t: {s}\ncore id\t\t: {c}\n"
                              f"cpu cores\t: {cores}\nflags\t\t: {flags}\n")
                n += 1
    return "\n".join(blocks)


def _dimm(size: str, kind: str, speed: int, locator: str, bank: str) -> str:
    return (f"Handle 0x00{locator[-2:]}, DMI type 17, 92 bytes\nMemory Device\n\tSize: {size}\n\tForm Factor: DIMM\n"
            f"\tLocator: {locator}\n\tBank Locator: {bank}\n\tType: {kind}\n\tSpeed: 6000 MT/s\n"
            f"\tConfigured Memory Speed: {speed} MT/s\n")


EMPTY_SLOT = "Handle 0x0040, DMI type 17, 92 bytes\nMemory Device\n\tSize: No Module Installed\n\tLocator: DIMM_C1\n"


def _tool(bindir, name: str, stdout: str, rc: int = 0) -> None:
    out = bindir / f"{name}.out"
    out.write_text(stdout)
    script = bindir / name
    script.write_text(f"#!/bin/sh\ncat '{out}'\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def gpu_box(tmp_path):
    """2x RTX 4090, Ryzen 9 7950X, 4x 32 GB DDR5-5600 on two channels (2 DIMMs per channel)."""
    root, bindir = tmp_path / "root", tmp_path / "bin"
    (root / "proc").mkdir(parents=True)
    bindir.mkdir()
    (root / "proc" / "cpuinfo").write_text(_cpuinfo("AMD Ryzen 9 7950X 16-Core Processor", 1, 16,
                                                    "fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni"))
    (root / "proc" / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:  1000 kB\n")
    nvme = root / "sys" / "class" / "nvme" / "nvme0" / "device"
    nvme.mkdir(parents=True)
    (nvme / "current_link_speed").write_text("32.0 GT/s PCIe\n")
    _tool(bindir, "nvidia-smi", "NVIDIA GeForce RTX 4090, 24564, 4, 16\nNVIDIA GeForce RTX 4090, 24564, 4, 16\n")
    _tool(bindir, "dmidecode", "# dmidecode 3.5\n" + "".join(
        _dimm("32 GB", "DDR5", 5600, loc, "BANK 0") for loc in ("DIMM_A1", "DIMM_A2", "DIMM_B1", "DIMM_B2"))
        + EMPTY_SLOT)
    return dict(root=str(root), path=str(bindir), system="Linux")


M3_MAX_PROFILE = {
    "SPDisplaysDataType": [{"_name": "Apple M3 Max", "sppci_model": "Apple M3 Max", "sppci_cores": "40",
                            "spdisplays_vendor": "sppci_vendor_Apple"}],
    "SPHardwareDataType": [{"_name": "hardware_overview", "chip_type": "Apple M3 Max", "machine_model": "Mac15,9",
                            "number_processors": "proc 16:12:4", "physical_memory": "128 GB"}],
}


@pytest.fixture
def mac(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "system_profiler", json.dumps(M3_MAX_PROFILE))
    return dict(root=str(tmp_path), path=str(bindir), system="Darwin")


def test_this_machine_is_detected_without_a_gpu_tool(tmp_path):
    if not sys.platform.startswith("linux") or not os.path.exists("/proc/cpuinfo"):
        pytest.skip("detection of this machine is tested on Linux")
    m = local_machine(path=str(tmp_path))            # an empty PATH: no nvidia-smi, rocm-smi or dmidecode
    assert m.id == "local" and m.gpu is None and m.n_gpus == 0
    assert m.cores >= 1 and m.host_mem_bytes > 0 and m.host_bw_gbs > 0
    notes = " | ".join(m.assumptions)
    assert "detected: CPU" in notes and "no GPU" in notes and "no DIMM details" in notes


def test_gpu_box_maps_to_catalog_parts(gpu_box):
    m = local_machine(**gpu_box)
    assert (m.gpu, m.n_gpus, m.pcie) == ("rtx-4090", 2, "gen4x16")
    assert (m.host_memory, m.channels, m.cpu) == ("ddr5-5600", 2, "ryzen-9-7950x")
    assert m.host_mem_bytes == pytest.approx(128 * 2**30)           # the DIMMs' sum, not MemTotal
    assert m.host_bw_gbs == pytest.approx(2 * 44.8)
    assert m.cores == 16 and m.sockets == 1
    assert m.storage == "nvme-gen5"                                  # the NVMe's 32 GT/s link
    assert m.gpu_mem_bytes == load("hardware")["gpu"]["rtx-4090"]["memory_bytes"]   # stock card: catalog size
    notes = " | ".join(m.assumptions)
    assert "2x NVIDIA GeForce RTX 4090 via nvidia-smi -> catalog gpu rtx-4090" in notes
    assert "4 DIMMs DDR5-5600, 128 GiB, 2 channel(s)" in notes


def test_given_parts_replace_detection(gpu_box):
    m = local_machine(**gpu_box, host="ddr5-6000x2", gpus=0)
    assert m.gpu is None and m.n_gpus == 0 and m.host_memory == "ddr5-6000"
    assert any("given: " in a for a in m.assumptions)


def test_modded_card_memory_and_mixed_gpus(gpu_box, tmp_path):
    _tool(tmp_path / "bin", "nvidia-smi", "NVIDIA GeForce RTX 4090, 49140, 4, 16\nNVIDIA GeForce RTX 3060, 12288, 4, 16\n")
    m = local_machine(**gpu_box)
    assert (m.gpu, m.n_gpus) == ("rtx-4090", 1)
    assert m.gpu_mem_bytes == pytest.approx(49140 * 2**20)
    notes = " | ".join(m.assumptions)
    assert "1x rtx-3060 left out" in notes and "48 GiB per GPU" in notes


def test_unknown_gpu_and_failed_tool(gpu_box, tmp_path):
    _tool(tmp_path / "bin", "nvidia-smi", "NVIDIA GeForce GTX 1650, 4096, 3, 16\n")
    with pytest.raises(MoesimError, match=r"GTX 1650.*matches no catalog GPU.*--gpu ID.*--host"):
        local_machine(**gpu_box)
    _tool(tmp_path / "bin", "nvidia-smi", "", rc=9)   # the driver is not loaded
    m = local_machine(**gpu_box)
    assert m.gpu is None and any("nvidia-smi failed (exit 9" in a for a in m.assumptions)


def test_without_dmidecode_the_cpu_part_supplies_memory(gpu_box, tmp_path):
    os.remove(tmp_path / "bin" / "dmidecode")
    m = local_machine(**gpu_box)
    assert (m.host_memory, m.channels) == ("ddr5-5200", 2)          # the catalog's Ryzen 9 7950X default
    assert m.host_mem_bytes == pytest.approx(131072000 * 1024)
    assert any("no DIMM details (dmidecode not found" in a for a in m.assumptions)


def test_mac_m3_max(mac):
    m = local_machine(**mac)
    assert m.unified and m.gpu == "m3-max" and m.cores == 16
    assert m.gpu_mem_bytes == pytest.approx(128e9) and m.gpu_bw_gbs == 400.0
    assert any("Apple M3 Max (40 GPU cores" in a for a in m.assumptions)


def test_detection_failures_name_the_flags(tmp_path, mac):
    with pytest.raises(MoesimError, match="cannot read /proc/cpuinfo.*--gpu ID.*--host-mem-gb"):
        local_machine(root=str(tmp_path), path=str(tmp_path), system="Linux")
    with pytest.raises(MoesimError, match="Windows.*not supported.*--gpu ID"):
        local_machine(root=str(tmp_path), path=str(tmp_path), system="Windows")
    with pytest.raises(MoesimError, match="system_profiler not found"):
        local_machine(root=str(tmp_path), path=str(tmp_path), system="Darwin")
    with pytest.raises(MoesimError, match="unknown machine part 'gpu_bw'"):
        local_machine(**mac, gpu_bw=1)


@pytest.mark.parametrize("name, table, want", [
    ("NVIDIA A100-SXM4-80GB", "gpu", "a100-sxm-80gb"), ("NVIDIA GeForce RTX 3060 Ti", "gpu", "rtx-3060-ti"),
    ("NVIDIA A100-PCIE-40GB", "gpu", "a100-pcie-40gb"),
    ("NVIDIA H100 PCIe", "gpu", "h100-pcie"), ("NVIDIA RTX 6000 Ada Generation", "gpu", "rtx-6000-ada"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "gpu", "rtx-pro-6000"),
    ("Quadro RTX 6000", "gpu", "quadro-rtx-6000"), ("AMD Radeon RX 7900 XTX", "gpu", "rx-7900-xtx"),
    ("Tesla P40", "gpu", "tesla-p40"), ("Apple M3", "unified", "m3"), ("Apple M2 Ultra", "unified", "m2-ultra"),
    ("Intel(R) Xeon(R) Platinum 8480C", "cpu", "xeon-platinum-8480c"), ("AMD EPYC 9654 96-Core Processor", "cpu",
                                                                         "epyc-9654"),
    ("13th Gen Intel(R) Core(TM) i9-13900K", "cpu", "core-i9-13900k"),
    ("12th Gen Intel(R) Core(TM) i7-12700K", "cpu", None), ("AMD EPYC", "cpu", None),
])
def test_names_match_catalog_ids(name, table, want):
    assert match_catalog(name, load("hardware")[table])[0] == want


def test_h100_without_a_variant_word_is_a_stated_tie():
    gid, ties = match_catalog("NVIDIA H100 80GB HBM3", load("hardware")["gpu"], 80 * 2**30)
    assert {gid, *ties} == {"h100-sxm", "h100-pcie"}


def test_parsers_on_tool_formats():
    rocm = json.dumps({"card0": {"Card series": "AMD Instinct MI300X OAM", "VRAM Total Memory (B)": "205822885888"}})
    assert P.parse_rocm_smi(rocm) == [{"name": "AMD Instinct MI300X OAM", "memory_bytes": 205822885888,
                                        "pcie_gen": None, "pcie_width": None, "tool": "rocm-smi"}]
    assert P.parse_nvidia_smi("NVIDIA H200, 143771, [N/A], [N/A]\n")[0]["pcie_gen"] is None
    dimms = [{"locator": "DIMM 0", "bank": f"P0 CHANNEL {c}"} for c in "ABCDEFGH"]
    assert P.dimm_channels(dimms, 1)[0] == 8
    assert P.dimm_channels([{"locator": f"Slot{i}", "bank": ""} for i in range(4)], 2)[0] == 2
    arm = "processor\t: 0\nFeatures\t: fp asimd\n\nprocessor\t: 1\nFeatures\t: fp asimd\n"
    assert P.parse_cpuinfo(arm)["cores"] == 2 and P.parse_cpuinfo(arm)["isa"] == ("neon",)


def test_cli_fit_on_the_local_machine(capsys, tmp_path, monkeypatch):
    if not sys.platform.startswith("linux") or not os.path.exists("/proc/cpuinfo"):
        pytest.skip("detection of this machine is tested on Linux")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert main(["fit", "qwen3-30b-a3b", "--machine", "local", "--quant", "Q4_K_M", "--host", "ddr5-4800x2"]) == 0
    out = capsys.readouterr().out
    assert "local machine, detected: CPU" in out and "given: host=ddr5-4800x2" in out


def test_dgx_spark_on_linux_is_one_unified_pool(gpu_box, tmp_path):
    _tool(tmp_path / "bin", "nvidia-smi", "NVIDIA GB10, [N/A], [N/A], [N/A]\n")
    m = local_machine(**gpu_box)
    assert m.unified and m.gpu == "dgx-spark" and m.cores == 16
    assert m.gpu_mem_bytes == pytest.approx(131072000 * 1024)            # the pool is MemTotal, no DIMMs asked


def test_public_api_name():
    import moesim
    assert moesim.local_machine is local_machine


def test_storage_from_sysfs(tmp_path):
    probe = P.Probe(root=str(tmp_path))
    assert P.nvme_generations(probe) == [] and not P.has_sata_ssd(probe)
    q = tmp_path / "sys" / "block" / "sda" / "queue"
    q.mkdir(parents=True)
    (q / "rotational").write_text("0\n")
    assert P.has_sata_ssd(probe)
    d = tmp_path / "sys" / "class" / "nvme" / "nvme1" / "device"
    d.mkdir(parents=True)
    (d / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    assert P.nvme_generations(probe) == [("nvme1", 4)]
