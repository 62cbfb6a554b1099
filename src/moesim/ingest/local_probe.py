"""Reading this machine's hardware facts: GPU tools (``nvidia-smi``, ``rocm-smi``, ``system_profiler``),
``/proc/cpuinfo``, ``/proc/meminfo`` and ``dmidecode -t memory``.

Everything the outside world answers goes through a :class:`Probe`, whose file root and command search
path are parameters, so tests point it at fixture files and fake executables. Parsers here return plain
dicts of what was read; :mod:`moesim.ingest.local_machine` maps them to catalog parts.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass


# A tool that hangs (a wedged driver, a slow system_profiler) must not hang moesim; each call is bounded.
COMMAND_TIMEOUT_S = 20.0
_MAX_READ_BYTES = 8 * 2**20       # /proc files and tool outputs are kilobytes; refuse anything huge


@dataclass(frozen=True)
class Probe:
    """Where detection looks: ``root`` prefixes every file path (``/proc/cpuinfo`` is read as
    ``root/proc/cpuinfo``), ``path`` is the PATH searched for tools (None: the process's), ``system`` is
    ``platform.system()``'s answer (None: ask it)."""

    root: str = "/"
    path: str | None = None
    system: str | None = None

    @property
    def os_name(self) -> str:
        return self.system or platform.system()

    def read(self, rel: str) -> str | None:
        """The text of ``root/rel``, or None when it is absent or unreadable."""
        full = os.path.join(self.root, rel.lstrip("/"))
        try:
            with open(full, "rb") as fh:
                return fh.read(_MAX_READ_BYTES).decode("utf-8", "replace")
        except OSError:
            return None

    def listdir(self, rel: str) -> list:
        try:
            return sorted(os.listdir(os.path.join(self.root, rel.lstrip("/"))))
        except OSError:
            return []

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.path)

    def run(self, argv: list) -> tuple:
        """(stdout, None) of a tool that ran and succeeded, else (None, why not)."""
        exe = self.which(argv[0])
        if exe is None:
            return None, f"{argv[0]} not found"
        env = dict(os.environ, LC_ALL="C")      # C locale: numbers and units as the parsers expect
        try:
            done = subprocess.run([exe, *argv[1:]], capture_output=True, timeout=COMMAND_TIMEOUT_S, env=env,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{argv[0]} could not run ({type(exc).__name__})"
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return None, f"{argv[0]} failed (exit {done.returncode}{': ' + err[0][:120] if err else ''})"
        return done.stdout[:_MAX_READ_BYTES].decode("utf-8", "replace"), None


# ------------------------------------------------------------------------------------------ GPUs
NVIDIA_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max",
                "--format=csv,noheader,nounits"]
ROCM_QUERY = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"]
MAC_QUERY = ["system_profiler", "SPDisplaysDataType", "SPHardwareDataType", "-json"]


def _int_or_none(text) -> int | None:
    try:
        return int(float(str(text).strip()))
    except (TypeError, ValueError, OverflowError):
        return None


def parse_nvidia_smi(text: str) -> list:
    """One dict per GPU line of :data:`NVIDIA_QUERY`: name, memory in bytes (the tool's MiB), PCIe
    generation and width (None where the tool says [N/A])."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not cells or not cells[0]:
            continue
        mib = _int_or_none(cells[1]) if len(cells) > 1 else None
        gpus.append({"name": cells[0], "memory_bytes": mib * 2**20 if mib else None,
                     "pcie_gen": _int_or_none(cells[2]) if len(cells) > 2 else None,
                     "pcie_width": _int_or_none(cells[3]) if len(cells) > 3 else None, "tool": "nvidia-smi"})
    return gpus


_ROCM_NAME_KEYS = ("card series", "marketing name", "card model", "card sku")


def parse_rocm_smi(text: str) -> list:
    """One dict per ``cardN`` of rocm-smi's JSON (key spellings differ between ROCm releases, so
    names and VRAM are looked up by what the key says)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    gpus = []
    for card in sorted(k for k in data if isinstance(k, str) and k.lower().startswith("card")) if isinstance(data, dict) else []:
        fields = {str(k).strip().lower(): v for k, v in data[card].items()} if isinstance(data[card], dict) else {}
        name = next((str(fields[k]).strip() for k in _ROCM_NAME_KEYS if str(fields.get(k, "")).strip()), None)
        vram = next((_int_or_none(v) for k, v in fields.items() if "vram total memory" in k and "used" not in k), None)
        if name:
            gpus.append({"name": name, "memory_bytes": vram, "pcie_gen": None, "pcie_width": None, "tool": "rocm-smi"})
    return gpus


def _gb_text(text) -> float | None:
    """'128 GB' -> 128.0 (system_profiler's physical_memory)."""
    m = re.match(r"\s*([0-9.]+)\s*(TB|GB|MB)", str(text or ""), re.I)
    if not m:
        return None
    return float(m.group(1)) * {"tb": 1024.0, "gb": 1.0, "mb": 1 / 1024}[m.group(2).lower()]


def parse_system_profiler(text: str) -> dict:
    """chip name, GPU cores, CPU cores and memory (GB as macOS states it) from system_profiler's JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    hw = (data.get("SPHardwareDataType") or [{}])[0] if isinstance(data, dict) else {}
    disp = (data.get("SPDisplaysDataType") or [{}])[0] if isinstance(data, dict) else {}
    hw = hw if isinstance(hw, dict) else {}
    disp = disp if isinstance(disp, dict) else {}
    procs = re.match(r"proc\s+(\d+)", str(hw.get("number_processors", "")))
    return {"chip": str(hw.get("chip_type") or disp.get("sppci_model") or hw.get("cpu_type") or "").strip(),
            "gpu_cores": _int_or_none(disp.get("sppci_cores")),
            "cpu_cores": int(procs.group(1)) if procs else _int_or_none(hw.get("number_processors")),
            "memory_gb": _gb_text(hw.get("physical_memory")), "model": str(hw.get("machine_model") or "")}


# -------------------------------------------------------------------------------------- CPU, RAM
# /proc/cpuinfo flags -> the catalog's ISA names (catalog cpu.isa)
_ISA_FLAGS = (("avx2", "avx2"), ("avx512f", "avx512"), ("avx512_bf16", "avx512_bf16"),
              ("avx512_vnni", "avx512_vnni"), ("amx_tile", "amx"), ("asimd", "neon"))


def parse_cpuinfo(text: str) -> dict:
    """CPU model name, sockets, physical cores (distinct (physical id, core id) pairs; without those,
    ``cpu cores`` per socket, else one core per logical processor) and ISA extensions."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    procs = []
    for b in blocks:
        kv = {}
        for line in b.splitlines():
            k, sep, v = line.partition(":")
            if sep:
                kv[k.strip().lower()] = v.strip()
        if "processor" in kv:
            procs.append(kv)
    if not procs:
        return {}
    name = next((p[k] for p in procs for k in ("model name", "hardware", "cpu model") if p.get(k)), "")
    sockets = len({p.get("physical id", "0") for p in procs})
    pairs = {(p.get("physical id"), p.get("core id")) for p in procs if "core id" in p}
    if pairs:
        cores, how = len(pairs), "distinct physical id/core id pairs"
    elif _int_or_none(procs[0].get("cpu cores")):
        cores, how = _int_or_none(procs[0]["cpu cores"]) * sockets, "'cpu cores' x sockets"
    else:
        cores, how = len(procs), "one core per logical processor (no core ids listed)"
    flags = set((procs[0].get("flags") or procs[0].get("features") or "").split())
    return {"name": name, "sockets": sockets, "cores": cores, "cores_from": how, "logical": len(procs),
            "isa": tuple(isa for flag, isa in _ISA_FLAGS if flag in flags)}


def parse_meminfo(text: str) -> float | None:
    """MemTotal in bytes."""
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.M)
    return int(m.group(1)) * 1024.0 if m else None


def _dmi_size_bytes(text: str) -> int | None:
    m = re.match(r"\s*(\d+)\s*(TB|GB|MB|KB)", text, re.I)
    if not m:
        return None
    return int(m.group(1)) * {"tb": 2**40, "gb": 2**30, "mb": 2**20, "kb": 2**10}[m.group(2).lower()]


def _dmi_speed(text: str) -> int | None:
    """'5600 MT/s' (or old dmidecode's '3200 MHz', which means transfers) -> 5600."""
    m = re.match(r"\s*(\d+)\s*(MT/s|MHz)", text or "", re.I)
    return int(m.group(1)) if m else None


def parse_dmidecode(text: str) -> list:
    """The populated ``Memory Device`` entries: size (bytes), type, speed (configured, else rated, MT/s),
    locator and bank locator."""
    dimms = []
    for block in re.split(r"\n(?=Handle )", text):
        if "Memory Device" not in block:
            continue
        kv = {}
        for line in block.splitlines():
            k, sep, v = line.partition(":")
            if sep and line.startswith("\t") and not line.startswith("\t\t"):
                kv[k.strip().lower()] = v.strip()
        size = _dmi_size_bytes(kv.get("size", ""))
        if not size:
            continue                   # "No Module Installed"
        speed = _dmi_speed(kv.get("configured memory speed") or kv.get("configured clock speed") or "") \
            or _dmi_speed(kv.get("speed", ""))
        dimms.append({"size_bytes": size, "type": kv.get("type", "").strip().lower(), "speed": speed,
                      "locator": kv.get("locator", ""), "bank": kv.get("bank locator", "")})
    return dimms


_CHANNEL_RES = (re.compile(r"channel\s*[-_]?\s*([a-z0-9]+)", re.I),        # "P0 CHANNEL A", "ChannelA-DIMM0"
                re.compile(r"dimm\s*[-_]?\s*([a-z])\s*[-_]?\d", re.I))      # "DIMM_A1", "CPU1_DIMM_B2", "DIMMA1"
_SOCKET_RE = re.compile(r"\b(?:cpu|p|node)\s*[-_]?(\d+)", re.I)


def dimm_channels(dimms: list, sockets: int) -> tuple:
    """(populated channels per socket, how it was read): distinct channel names in the locators per
    socket when every DIMM names one, else one DIMM per channel."""
    keys = []
    for d in dimms:
        text = f"{d['bank']} {d['locator']}"
        ch = next((m.group(1).upper() for r in _CHANNEL_RES for m in [r.search(text)] if m), None)
        if ch is None:
            break
        sock = _SOCKET_RE.search(text)
        keys.append((sock.group(1) if sock else "0", ch))
    else:
        if keys:
            per_socket = {}
            for s, ch in keys:
                per_socket.setdefault(s, set()).add(ch)
            return max(len(v) for v in per_socket.values()), "channel names in the DIMM locators"
    return max(1, -(-len(dimms) // max(1, sockets))), "one DIMM per channel (the locators name no channels)"


# ---------------------------------------------------------------------------------------- storage
# PCIe link rate per lane -> generation (PCI-SIG: 8 GT/s gen3, 16 GT/s gen4, 32 GT/s gen5)
_GT_PER_GEN = {8.0: 3, 16.0: 4, 32.0: 5}


def nvme_generations(probe: Probe) -> list:
    """(device, PCIe generation) of each NVMe controller, from sysfs ``current_link_speed``."""
    out = []
    for dev in probe.listdir("/sys/class/nvme"):
        text = probe.read(f"/sys/class/nvme/{dev}/device/current_link_speed") or ""
        m = re.match(r"\s*([0-9.]+)\s*GT/s", text)
        gen = _GT_PER_GEN.get(float(m.group(1))) if m else None
        if gen:
            out.append((dev, gen))
    return out


def has_sata_ssd(probe: Probe) -> bool:
    """A non-rotating sd* disk (an SSD on SATA/SAS)."""
    return any((probe.read(f"/sys/block/{d}/queue/rotational") or "").strip() == "0"
               for d in probe.listdir("/sys/block") if d.startswith("sd"))
