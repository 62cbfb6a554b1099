"""Machines composed from catalog parts: GPUs (or a unified-memory chip), host DRAM, CPU, PCIe, storage.

``machine("desktop-4090")`` takes a catalog machine; ``machine(gpu="rtx-4090", host="ddr5-6000x2",
host_mem_gb=192)`` composes one, and flags given with a catalog id override its parts.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from .. import _catalog
from ..errors import MoesimError, unknown_id


GB = 1e9


def _hw() -> dict:
    return _catalog.load("hardware")


def gpu_ids() -> list:
    return sorted(_hw()["gpu"])


def unified_ids() -> list:
    return sorted(_hw()["unified"])


def machine_ids() -> list:
    return sorted(_hw()["machine"])


def hardware_ids() -> dict:
    h = _hw()
    return {k: sorted(h[k]) for k in ("machine", "gpu", "unified", "cpu", "host_memory", "link", "storage")}


@dataclass(frozen=True)
class Machine:
    """A concrete machine. Capacities in bytes, bandwidths in GB/s (1e9 B/s)."""

    id: str
    gpu: str | None                 # GPU or unified-chip id; None for CPU-only
    n_gpus: int
    gpu_mem_bytes: float            # per GPU (for unified: the whole pool)
    gpu_bw_gbs: float
    gpu_tflops: dict = field(default_factory=dict, compare=False)
    compute_capability: str | None = None
    flash_attention: object = True
    unified: bool = False
    gpu_working_set_fraction: float = 1.0
    host_memory: str | None = None  # DRAM part id (ddr5-4800 ...)
    channels: int = 0               # populated channels per socket
    sockets: int = 1
    cores: int = 0                  # physical cores used (0 = unknown)
    cpu: str | None = None
    cpu_isa: tuple = ()
    host_mem_bytes: float = 0.0
    host_bw_gbs: float = 0.0        # peak: MT/s x 8 B x channels x sockets
    pcie: str | None = None
    pcie_gbs: float = 0.0
    pcie_pinned_gbs: float = 0.0
    storage: str | None = None
    storage_read_gbs: float = 0.0
    storage_bytes: float = 0.0
    assumptions: tuple = field(default=(), compare=False)
    datacenter: bool = False        # several datacenter GPUs: served (vLLM, native checkpoint) by default


    def describe(self) -> str:
        if self.unified:
            return (f"{self.gpu} unified {self.gpu_mem_bytes / GB:.0f} GB @ {self.gpu_bw_gbs:.0f} GB/s")
        parts = []
        if self.n_gpus:
            parts.append(f"{self.n_gpus}x {self.gpu} ({self.gpu_mem_bytes / 2**30:.0f} GiB, {self.gpu_bw_gbs:.0f} GB/s)")
        if self.host_memory:
            parts.append(f"{self.host_mem_bytes / GB:.0f} GB {self.host_memory} x{self.channels}"
                         f"{' x' + str(self.sockets) + ' sockets' if self.sockets > 1 else ''}"
                         f" ({self.host_bw_gbs:.0f} GB/s)")
        if self.pcie and self.n_gpus:
            parts.append(f"PCIe {self.pcie}")
        return ", ".join(parts)


_HOST_RE = re.compile(r"^([a-z0-9][a-z0-9-]*?)(?:x([0-9]+))?$")   # part id, then optional xCHANNELS


# Plausibility bounds on composed machines, each well past the largest real one: 12 DDR5 channels per
# socket (EPYC 9004/9005, Xeon 6; hardware.md §4), 8 sockets (Xeon Platinum's largest glueless
# topology), 72 GPUs in one NVLink domain (GB200 NVL72), 288 GB per GPU today (B300, MI355X), a few
# TB of RAM per socket, a few hundred cores per socket.
# A GPU's bandwidth and 16-bit tensor rate: ten times the B300's (7,750 GB/s, 2,250 TFLOPS dense).
MACHINE_BOUNDS = {"channels": 16, "sockets": 8, "gpus": 72, "gpu_mem_gb": 1024.0, "host_mem_gb": 65536.0,
                  "cores": 2048, "gpu_bw_gbs": 80000.0, "gpu_tflops": 25000.0}

CUSTOM_GPU = "custom"               # the GPU id of a card described only by --gpu-mem-gb/--gpu-bw-gbs/--gpu-tflops
# The host a multi-GPU datacenter GPU gets when no --host/--cpu/--machine says otherwise and no catalog
# DGX/HGX machine carries that GPU: the DGX H100's (2x Xeon 8480C, 16 x DDR5-4800, 2 TB).
SERVER_DEFAULT_MACHINE = "dgx-h100"


def _positive(value, field_name: str, integer: bool = False, allow_zero: bool = False):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise MoesimError(f"must be a number, got {value!r}", field_name) from None
    if value != value or math.isinf(value):
        raise MoesimError(f"must be finite, got {value!r}", field_name)
    if value < 0 or (value == 0 and not allow_zero):
        raise MoesimError(f"must be {'>= 0' if allow_zero else 'positive'}, got {value!r}", field_name)
    bound = MACHINE_BOUNDS.get(field_name)
    if bound is not None and value > bound:
        raise MoesimError(f"{value:g} is above the plausible maximum {bound:g}", field_name)
    if integer:
        if int(value) != value:
            raise MoesimError(f"must be a whole number, got {value!r}", field_name)
        return int(value)
    return float(value)


# a DDR4 / DDR5 DIMM part the catalog does not list: its bandwidth follows from its transfer rate alone
_DIMM_PART = re.compile(r"^(ddr[45])-(\d{4,5})$")
_DIMM_MT_S = {"ddr4": (1600, 5600), "ddr5": (3200, 12800)}     # JEDEC and overclocked kits, generously


def memory_part(part) -> "dict | None":
    """The [host_memory] entry of a DRAM part, or for an unlisted DDR4/DDR5 speed (ddr5-7200) one derived
    as the catalog derives its own: MT/s x 8 B per 64-bit channel; None for anything else."""
    parts = _hw()["host_memory"]
    if part in parts:
        return parts[part]
    m = _DIMM_PART.match(str(part or ""))
    if m is None:
        return None
    kind, mt_s = m.group(1), int(m.group(2))
    lo, hi = _DIMM_MT_S[kind]
    if not lo <= mt_s <= hi:
        return None
    return {"kind": kind, "mt_s": mt_s, "channel_gbs": mt_s * 8 / 1000,
            "source": "derived from its rate: MT/s x 8 B per 64-bit channel (HW §4 formula)"}


def parse_host(spec: str) -> tuple:
    """``ddr5-4800x8`` -> (part id, channels or None)."""
    if not isinstance(spec, str):
        raise MoesimError(f"expected a memory part like ddr5-4800x8, got {spec!r}", "host")
    text = spec.strip().lower()
    m = _HOST_RE.match(text)
    parts = _hw()["host_memory"]
    if not m or memory_part(m.group(1)) is None:
        # the longest known part the text starts with: "ddr5-6000xx" is ddr5-6000 with a bad channel count
        known = [p for p in parts if text.startswith(p + "x")]
        part = max(known, key=len) if known else (text.rsplit("x", 1)[0] if "x" in text else text)
        if known:
            raise MoesimError(f"expected PART or PARTxCHANNELS with a whole number of channels (ddr5-4800x8), "
                              f"got {spec!r}", "host")
        raise unknown_id("host memory part", part, parts, "host")
    ch = int(m.group(2)) if m.group(2) else None
    if ch is not None and not 1 <= ch <= MACHINE_BOUNDS["channels"]:
        raise MoesimError(f"channels per socket must be in [1, {MACHINE_BOUNDS['channels']}], got {ch}", "host")
    return m.group(1), ch


def machine(id: str | None = None, *, gpu: str | None = None, gpus: int | None = None,
            gpu_mem_gb: float | None = None, gpu_bw_gbs: float | None = None, gpu_tflops: float | None = None,
            host: str | None = None, sockets: int | None = None,
            cores: int | None = None, host_mem_gb: float | None = None, pcie: str | None = None,
            storage: str | None = None, cpu: str | None = None) -> Machine:
    """Build a machine from a catalog id and/or parts (the CLI's machine flags, same names).

    *gpu_bw_gbs* (GB/s) and *gpu_tflops* (dense 16-bit tensor TFLOP/s) override a catalog card's
    numbers, or, with *gpu_mem_gb* and no *gpu*, describe an unlisted card."""
    h = _hw()
    base = _catalog_machine(h, id)
    gpus = _positive(gpus, "gpus", integer=True, allow_zero=True)
    gpu_mem_gb = _positive(gpu_mem_gb, "gpu_mem_gb")
    custom = {"gpu_bw_gbs": _positive(gpu_bw_gbs, "gpu_bw_gbs"), "gpu_tflops": _positive(gpu_tflops, "gpu_tflops")}
    sockets = _positive(sockets, "sockets", integer=True)
    cores = _positive(cores, "cores", integer=True)
    host_mem_gb = _positive(host_mem_gb, "host_mem_gb")
    gpu_id, named = _named_card(h, _gpu_id(h, gpu, base), gpu_mem_gb)
    m = _build_machine(h, id, base, gpu_id, gpu=gpu, gpus=gpus, gpu_mem_gb=gpu_mem_gb, custom=custom, host=host,
                       sockets=sockets, cores=cores, host_mem_gb=host_mem_gb, pcie=pcie, storage=storage, cpu=cpu)
    return m if named is None else replace(m, assumptions=(named,) + tuple(m.assumptions))


def _named_card(h: dict, gpu_id, gpu_mem_gb) -> tuple:
    """(catalog id, the assumption it took or None) for a name the catalog lists as several cards
    (hardware.toml [gpu_names]): the first listed, or with *gpu_mem_gb* the one whose memory is nearest."""
    entry = h.get("gpu_names", {}).get(gpu_id) if gpu_id is not None else None
    if entry is None:       # a catalog id, or no name of several cards (a [gpu_names] key is never an id)
        return gpu_id, None
    cards = list(entry["cards"])
    chosen = cards[0]
    if gpu_mem_gb is not None:
        chosen = min(cards, key=lambda c: abs(_card_memory_gb(h, c) - gpu_mem_gb))
    if len(cards) == 1:
        return chosen, f"gpu {gpu_id!r} is the catalog's {chosen}"
    why = f"nearest {gpu_mem_gb:g} GB" if gpu_mem_gb is not None else "the usual one"
    others = ", ".join(c for c in cards if c != chosen)
    return chosen, f"gpu {gpu_id!r} taken as {chosen} ({why}; also listed: {others}; --gpu ID to choose)"


def _card_memory_gb(h: dict, card: str) -> float:
    if card in h["unified"]:
        return float(h["unified"][card].get("default_memory_gb", 0.0))
    return float(h["gpu"][card].get("memory_bytes", 0.0)) / 2 ** 30     # nominal GB are GiB on cards


def _build_machine(h: dict, id, base: dict, gpu_id, *, gpu, gpus, gpu_mem_gb, custom: dict, host, sockets, cores,
                   host_mem_gb, pcie, storage, cpu) -> Machine:
    """:func:`machine` once its arguments are checked and the GPU named by its catalog id."""
    if gpu_id == CUSTOM_GPU or (gpu_id is None and (custom["gpu_bw_gbs"] or custom["gpu_tflops"]) and gpus != 0):
        gpu_id = _custom_gpu(gpu_mem_gb, custom)
    if id is None and gpu_id is None and host is None:
        raise MoesimError("give a catalog machine (--machine ID) or its parts (--gpu and/or --host)", "machine")
    if gpu_id is not None and gpu_id in h["unified"]:
        if custom["gpu_bw_gbs"] or custom["gpu_tflops"]:
            field_name = "gpu_bw_gbs" if custom["gpu_bw_gbs"] else "gpu_tflops"
            raise MoesimError(f"{gpu_id} is a unified-memory chip: --gpu-bw-gbs/--gpu-tflops describe a discrete GPU",
                              field_name)
        return _unified_machine(h, id, gpu_id, base, gpus=gpus, gpu_mem_gb=gpu_mem_gb, host=host, cores=cores,
                                host_mem_gb=host_mem_gb, storage=storage)
    if gpu_id is not None and gpu_id != CUSTOM_GPU and gpu_id not in h["gpu"]:
        raise unknown_id("GPU", gpu_id, list(h["gpu"]) + list(h["unified"]), "gpu")
    return _discrete_machine(h, id, gpu_id, base, gpu=gpu, gpus=gpus, gpu_mem_gb=gpu_mem_gb, host=host,
                             sockets=sockets, cores=cores, host_mem_gb=host_mem_gb, pcie=pcie, storage=storage,
                             cpu=cpu, custom=custom)


def _custom_gpu(gpu_mem_gb, custom: dict) -> str:
    """An unlisted GPU needs all three numbers: memory, bandwidth and compute."""
    for name, value in (("gpu_mem_gb", gpu_mem_gb), ("gpu_bw_gbs", custom["gpu_bw_gbs"]),
                        ("gpu_tflops", custom["gpu_tflops"])):
        if value is None:
            raise MoesimError("an unlisted GPU is described by --gpu-mem-gb, --gpu-bw-gbs and --gpu-tflops together "
                              f"(or name a catalog card with --gpu ID); {name.replace('_', '-')} is missing", name)
    return CUSTOM_GPU


def _gpu_numbers(g: dict, gpu_id, custom: dict, assumptions: list) -> tuple:
    """(bandwidth GB/s, TFLOP/s per dtype) of the GPU: the catalog card's, overridden by the flags. A
    --gpu-tflops on a catalog card scales every dtype by the same factor (its 16-bit peak becomes the flag)."""
    bw = custom.get("gpu_bw_gbs") or float(g.get("mem_bw_gbs", 0.0))
    tflops = dict(g.get("tflops", {}))
    new_peak = custom.get("gpu_tflops")
    if gpu_id == CUSTOM_GPU:
        tflops = {"fp16": new_peak, "bf16": new_peak}
        assumptions.append(f"custom GPU: {bw:g} GB/s, {new_peak:g} dense 16-bit TFLOP/s; modelled as a GDDR card "
                           "with CUDA graphs and without the catalog's tensor-core/HBM prefill rates")
    elif new_peak:
        peak = max(tflops.get("bf16", 0.0), tflops.get("fp16", 0.0), tflops.get("fp32", 0.0))
        scale = new_peak / peak if peak else 1.0
        tflops = {k: v * scale for k, v in tflops.items()} if peak else {"fp16": new_peak, "bf16": new_peak}
        assumptions.append(f"--gpu-tflops {new_peak:g}: {gpu_id}'s rates scaled by {scale:.3g} (every dtype)")
    if gpu_id != CUSTOM_GPU and custom.get("gpu_bw_gbs"):
        assumptions.append(f"--gpu-bw-gbs {bw:g}: replaces {gpu_id}'s {float(g.get('mem_bw_gbs', 0.0)):g} GB/s")
    return bw, tflops


def gpu_segment(g: dict) -> str:
    """consumer | workstation | datacenter: the catalog's ``segment``, else datacenter for HBM parts."""
    seg = g.get("segment")
    if seg:
        return str(seg)
    return "datacenter" if str(g.get("memory_type", "")).startswith("hbm") else "consumer"


def _server_host(h: dict, gpu_id: str, assumptions: list) -> dict:
    """The host parts of the catalog DGX/HGX machine carrying *gpu_id* (DGX first), else the
    SERVER_DEFAULT_MACHINE's; the assumption says which."""
    names = sorted(k for k, v in h["machine"].items() if v.get("gpu") == gpu_id and k.startswith(("dgx-", "hgx-")))
    source = names[0] if names else SERVER_DEFAULT_MACHINE
    entry = h["machine"][source]
    keys = ("cpu", "sockets", "host_memory", "channels", "host_mem_gb", "storage") + (("pcie",) if names else ())
    host = {k: entry[k] for k in keys if k in entry}
    how = f"the {source} host" if names else f"no catalog server carries {gpu_id}: the {source} host"
    assumptions.append(f"host not given for several datacenter GPUs: {how} ({host.get('sockets', 1)}x {host.get('cpu')}, "
                       f"{host.get('channels')} x {host.get('host_memory')} per socket, {host.get('host_mem_gb')} GB; "
                       "--host/--cpu/--machine to choose)")
    return host


def _catalog_machine(h: dict, id) -> dict:
    """The catalog entry that flags given with ``id`` override ({} when composing from parts)."""
    if id is None:
        return {}
    key = str(id).strip().lower()
    if key not in h["machine"]:
        raise unknown_id("machine", id, h["machine"], "machine")
    return dict(h["machine"][key])


def _gpu_id(h: dict, gpu, base: dict) -> "str | None":
    """The GPU (or unified chip) id: the flag over the catalog's; 'none' or '' mean no GPU."""
    gpu_id = (gpu if gpu is not None else base.get("gpu"))
    return None if gpu_id in (None, "none", "") else str(gpu_id).strip().lower()


def _unified_machine(h: dict, id, gpu_id: str, base: dict, *, gpus, gpu_mem_gb, host, cores, host_mem_gb,
                     storage) -> Machine:
    """A unified-memory chip: one pool serves as GPU and host memory, so host/GPU-count flags are refused."""
    chip = h["unified"][gpu_id]
    if host is not None:
        raise MoesimError(f"{gpu_id} is a unified-memory chip: its memory is the pool, so --host "
                          "does not apply (use --gpu-mem-gb or --host-mem-gb for the pool size)", "host")
    if gpus not in (None, 1):
        raise MoesimError(f"a unified-memory machine has one {gpu_id}, got --gpus {gpus}", "gpus")
    if gpu_mem_gb is not None and host_mem_gb is not None and gpu_mem_gb != host_mem_gb:
        raise MoesimError("on a unified-memory chip --gpu-mem-gb and --host-mem-gb name the same pool "
                          "and disagree", "gpu_mem_gb")
    assumptions = []
    pool_gb = gpu_mem_gb or host_mem_gb or base.get("host_mem_gb") or chip["default_memory_gb"]
    if pool_gb not in chip.get("memory_options_gb", [pool_gb]):
        assumptions.append(f"{pool_gb:g} GB is not a listed {gpu_id} option "
                           f"({', '.join(str(x) for x in chip.get('memory_options_gb', []))})")
    st = storage if storage is not None else base.get("storage")
    st_info = _storage(st)
    return Machine(
        id=id or gpu_id, gpu=gpu_id, n_gpus=1, gpu_mem_bytes=pool_gb * GB, gpu_bw_gbs=float(chip["mem_bw_gbs"]),
        gpu_tflops={k[len("gpu_tflops_"):]: float(v) for k, v in chip.items() if k.startswith("gpu_tflops_")},
        unified=True,
        gpu_working_set_fraction=float(chip.get("gpu_working_set_fraction", 0.75)),
        host_memory="unified", channels=0, sockets=1, cores=cores or chip.get("cpu_cores", 0),
        cpu=gpu_id, cpu_isa=("neon",) if chip.get("vendor") == "apple" else tuple(chip.get("cpu_isa", ())),
        host_mem_bytes=pool_gb * GB, host_bw_gbs=float(chip["mem_bw_gbs"]),
        storage=st, storage_read_gbs=st_info[0], storage_bytes=st_info[1],
        assumptions=tuple(assumptions))


def _discrete_machine(h: dict, id, gpu_id, base: dict, *, gpu, gpus, gpu_mem_gb, host, sockets, cores,
                      host_mem_gb, pcie, storage, cpu, custom) -> Machine:
    """Discrete GPUs (or none) plus host DRAM; every part not given is taken from the catalog machine,
    else (several datacenter GPUs) the matching server's host, else the CPU part, else a stated assumption."""
    assumptions = []
    n_gpus, gpu_id = _gpu_count(gpu_id, base, gpu=gpu, gpus=gpus, gpu_mem_gb=gpu_mem_gb, custom=custom)
    g = h["gpu"].get(gpu_id, {}) if gpu_id else {}
    gpu_mem = gpu_mem_gb * GB if gpu_mem_gb is not None else float(g.get("memory_bytes", 0.0))
    bw, tflops = _gpu_numbers(g, gpu_id, custom, assumptions) if gpu_id else (0.0, {})
    datacenter = bool(g) and n_gpus > 1 and gpu_segment(g) == "datacenter"
    if datacenter and not base and host is None and cpu is None:
        base = _server_host(h, gpu_id, assumptions)
    cpu_id, cpu_info = _cpu_part(h, cpu or base.get("cpu"))
    part, channels = _host_memory(h, host, base, cpu_info, assumptions)
    n_sockets = sockets or int(base.get("sockets", 1))
    if cpu_info and n_sockets > int(cpu_info.get("max_sockets", n_sockets)):
        raise MoesimError(f"{cpu_id} supports at most {cpu_info['max_sockets']} sockets", "sockets")
    host_gb = host_mem_gb or base.get("host_mem_gb")
    if not host_gb:
        host_gb = 32.0 * channels * n_sockets
        assumptions.append(f"host RAM not given: assumed one 32 GB DIMM per channel = {host_gb:g} GB")
    n_cores = cores or (int(cpu_info.get("cores", 0)) * n_sockets)
    link, link_info = _pcie_link(h, pcie or base.get("pcie") or g.get("host_link"))
    st = storage if storage is not None else base.get("storage")
    if st is None:
        st = "nvme-gen4"
        assumptions.append("storage not given: assumed the model file sits on a PCIe 4.0 NVMe SSD (nvme-gen4)")
    st_info = _storage(st)
    return Machine(
        id=id or "+".join(x for x in (f"{n_gpus}x{gpu_id}" if gpu_id else None, f"{part}x{channels}") if x),
        gpu=gpu_id, n_gpus=n_gpus, gpu_mem_bytes=gpu_mem, gpu_bw_gbs=float(bw),
        gpu_tflops=tflops, compute_capability=g.get("compute_capability"), datacenter=datacenter,
        flash_attention=g.get("flash_attention", True), unified=False,
        host_memory=part, channels=int(channels), sockets=n_sockets, cores=n_cores, cpu=cpu_id,
        cpu_isa=tuple(cpu_info.get("isa", ())), host_mem_bytes=host_gb * GB,
        host_bw_gbs=float(memory_part(part)["channel_gbs"]) * channels * n_sockets,
        pcie=link, pcie_gbs=float(link_info.get("gbs", 0.0)), pcie_pinned_gbs=float(link_info.get("pinned_h2d_gbs", 0.0)),
        storage=st, storage_read_gbs=st_info[0], storage_bytes=st_info[1], assumptions=tuple(assumptions))


def _gpu_count(gpu_id, base: dict, *, gpu, gpus, gpu_mem_gb, custom) -> tuple:
    """(GPU count, GPU id): --gpus 0 drops a catalog machine's GPU, but contradicts an explicit --gpu."""
    n_gpus = gpus if gpus is not None else int(base.get("gpus", 1 if gpu_id else 0))
    if gpu_id is None and n_gpus:
        raise MoesimError(f"--gpus {n_gpus} without a GPU model (--gpu ID)", "gpus")
    if gpu_id is not None and n_gpus == 0:
        if gpu is not None or gpu_mem_gb is not None:
            raise MoesimError(f"--gpus 0 contradicts --gpu {gpu_id}", "gpus")
        gpu_id = None
    if gpu_id is None:
        for name, value in (("gpu_mem_gb", gpu_mem_gb), *custom.items()):
            if value is not None:
                raise MoesimError(f"--{name.replace('_', '-')} given for a machine without GPUs", name)
    return n_gpus, gpu_id


def _catalog_part(table: dict, value, kind: str, field: str) -> tuple:
    """(normalised id, its catalog entry) of an optional part, or (falsy, {}) when none is given."""
    if not value:
        return value, {}
    key = str(value).strip().lower()
    if key not in table:
        raise unknown_id(kind, key, table, field)
    return key, table[key]


def _cpu_part(h: dict, cpu_id) -> tuple:
    """(CPU id, its catalog entry); the entry supplies channel, core, socket and ISA defaults."""
    return _catalog_part(h["cpu"], (cpu_id and catalog_cpu_id(str(cpu_id))) or cpu_id, "CPU", "cpu")


def catalog_cpu_id(name: str) -> "str | None":
    """The catalog CPU a name means, as people, spec sheets and lscpu write it ("AMD EPYC 9654 96-Core
    Processor", "Intel(R) Core(TM) i9-13900K", "Ryzen Threadripper PRO 7965WX", "Xeon Platinum 8480+"),
    through hardware.toml [cpu_names] for variants modelled as another entry; None when it names none."""
    full = re.sub(r"\((?:r|tm)\)|[®™]", "", name.strip().lower())
    full = re.sub(r"@.*$|\b\d+-cores?\b|\bprocessor\b|\bcpu\b", "", full).strip()
    h = _hw()
    for key in (re.sub(r"^(?:intel|amd|nvidia)\s+", "", full), full):
        key = key.replace("ryzen threadripper", "threadripper").replace("+", " plus")
        key = re.sub(r"^(?:core\s+)?(i[3579])[\s-]", r"core-\1-", key)
        key = re.sub(r"[\s_]+", "-", key.strip())
        hit = key if key in h["cpu"] else h.get("cpu_names", {}).get(key)
        if hit:
            return hit
    return None


def _host_memory(h: dict, host, base: dict, cpu_info: dict, assumptions: list) -> tuple:
    """(DRAM part id, channels per socket): the flag, then the catalog machine, then the CPU part,
    then the desktop defaults (recorded in ``assumptions``)."""
    if host is not None:
        part, ch = parse_host(host)
    else:
        part, ch = base.get("host_memory"), None
    if part is None:
        part = cpu_info.get("memory") or "ddr5"
        assumptions.append(f"host memory part not given: assumed {part}")
    entry = memory_part(part)
    if entry is None:
        raise unknown_id("host memory part", part, h["host_memory"], "host")
    if part not in h["host_memory"]:
        assumptions.append(f"{part}: {entry['channel_gbs']:g} GB/s per channel, {entry['source']}")
    channels = ch or base.get("channels") or cpu_info.get("channels")
    if not channels:
        channels = 2
        assumptions.append("memory channels not given: assumed 2 (desktop platform, hardware.md §4)")
    return part, channels


def _pcie_link(h: dict, link) -> tuple:
    """(PCIe link id, its catalog entry), or (falsy, {}) when no link is known."""
    return _catalog_part(h["link"], link, "PCIe link", "pcie")


def _storage(st) -> tuple:
    """(read GB/s, capacity bytes) of a storage id; capacity is what mmap may page from."""
    if st in (None, "", "none"):
        return 0.0, 0.0
    h = _hw()
    key = str(st).strip().lower()
    if key not in h["storage"]:
        raise unknown_id("storage", st, h["storage"], "storage")
    info = h["storage"][key]
    # Capacity: consumer drives hold the model file; treat storage as large enough (4 TB default).
    return float(info.get("rand_read_gbs", info.get("seq_read_gbs", 0.0))), float(info.get("capacity_bytes", 4e12))


def as_machine(value, field: str = "machine") -> Machine:
    """The one rule every entry point applies: a :class:`Machine`, a catalog machine id, or a dict of
    :func:`machine` keywords; anything else is a MoesimError naming *field*."""
    if isinstance(value, Machine):
        return value
    if isinstance(value, str):
        return machine(value)
    if isinstance(value, dict):
        try:
            return machine(**value)
        except TypeError as exc:
            raise MoesimError(f"not a machine description: {exc}", field) from None
    raise MoesimError(f"expected a moesim.machine(...), a catalog machine id or a dict of machine keywords, "
                      f"got {type(value).__name__}", field)
