"""``moesim.local_machine()``: this computer as a :class:`~moesim.spec.hardware.Machine`.

Detection reads the outside world (GPU tools, ``/proc``, ``dmidecode``; see :mod:`.local_probe`), maps
what it finds to catalog parts -- GPU and CPU names to catalog ids by their model-number tokens, the DIMMs'
type and speed to a host memory part -- and builds the machine the spec layer would build from the same
flags. Each fact it read and each thing it had to assume lands in the Machine's ``assumptions``
("local machine, detected: ..." / "local machine, assumed: ..."), so every report that prints a machine's assumptions says where its
numbers came from. Flags given alongside (``--machine local --host ddr5-6000x2``) replace what detection
found for that part; when detection cannot name a part, the error says which flag supplies it.
"""
from __future__ import annotations

import dataclasses
import re

from .. import _catalog
from ..errors import MoesimError
from ..spec.hardware import GB, Machine, machine as make_machine
from . import local_probe as P


_FLAGS_HINT = ("describe the machine with flags instead: --gpu ID --gpus N (or --gpus 0 for CPU only), "
               "--host PARTxCHANNELS (e.g. ddr5-5600x2), --host-mem-gb GB, --cores N (ids: moesim hardware)")
# Words that make a different product of the same model number ("RTX 3060 Ti" is not an "RTX 3060"):
# a candidate must agree with the detected name on each of them.
_VARIANT_WORDS = frozenset({"ti", "super", "xt", "xtx", "laptop", "mobile", "max", "pro", "ultra"})
_MACHINE_KEYS = ("gpu", "gpus", "gpu_mem_gb", "gpu_bw_gbs", "gpu_tflops", "host", "sockets", "cores", "host_mem_gb", "pcie", "storage", "cpu")
_SERVER_CPU = re.compile(r"xeon|epyc|threadripper|grace", re.I)
_SERVER_CHANNELS = 8        # a server socket of the catalog's era populates 8 DDR5 channels (hardware.md §4)


def _tokens(text: str) -> set:
    text = re.sub(r"\((?:r|tm)\)", " ", str(text).lower())
    text = text.replace("max-q", "maxq")
    return set(t for t in re.split(r"[^a-z0-9]+", text) if t)


def _model_tokens(tokens) -> set:
    return {t for t in tokens if re.search(r"\d", t)}


def match_catalog(name: str, table: dict, memory_bytes: float | None = None) -> tuple:
    """(catalog id, ids that tied) for a product name: every model-number token of the id (or, for ids
    without one, of the catalog name) must be in the name, variant words must agree, then the most shared
    words win, then the memory size closest to *memory_bytes*. (None, []) when nothing matches."""
    got = _tokens(name)
    scored = []
    for order, (cid, entry) in enumerate(table.items()):
        id_tokens, name_tokens = _tokens(cid), _tokens(entry.get("name", ""))
        cat_tokens = id_tokens | name_tokens
        need = _model_tokens(id_tokens) or _model_tokens(cat_tokens)
        if not need or not need <= got:
            continue
        if (cat_tokens & _VARIANT_WORDS) != (got & _VARIANT_WORDS):
            continue
        # words of the full name the detected one lacks ("sxm5"); the id's short forms would count twice
        shared, missing = len(cat_tokens & got), len((name_tokens or id_tokens) - got)
        mem = entry.get("memory_bytes")
        gap = abs(mem - memory_bytes) if mem and memory_bytes else 0.0
        scored.append((-(shared - 0.5 * missing), gap, order, cid))
    if not scored:
        return None, []
    scored.sort()                 # a tie goes to the catalog's first entry (its mainstream variant)
    best = scored[0]
    return best[3], [s[3] for s in scored[1:] if s[:2] == best[:2]]


# ----------------------------------------------------------------------------------------- GPUs
def _detect_gpus(probe: P.Probe, notes: list) -> list:
    """GPU dicts from nvidia-smi, else rocm-smi (each tool's failure noted, not raised)."""
    for query, parse in ((P.NVIDIA_QUERY, P.parse_nvidia_smi), (P.ROCM_QUERY, P.parse_rocm_smi)):
        if probe.which(query[0]) is None:
            continue
        out, why = probe.run(query)
        gpus = parse(out) if out is not None else []
        if gpus:
            return gpus
        notes.append(f"local machine, assumed: no GPU from {query[0]} ({why or 'it listed none'})")
    return []


def _gpu_parts(gpus: list, hw: dict, notes: list) -> dict:
    """machine() keywords for the detected GPUs: the catalog id of the largest group of one model,
    the count, a memory size when it differs from the stock card's, and the PCIe link."""
    table = dict(hw["gpu"], **hw["unified"])
    groups = {}
    for g in gpus:
        gid, ties = match_catalog(g["name"], table, g["memory_bytes"])
        if gid is None:
            raise MoesimError(f"{g['tool']} reports a {g['name']!r}, which matches no catalog GPU; "
                              + _FLAGS_HINT, "machine")
        if ties:
            notes.append(f"local machine, assumed: {g['name']!r} matches {', '.join([gid] + ties)} equally; chose {gid} "
                         "(--gpu picks another)")
        groups.setdefault(gid, []).append(g)
    gid = max(groups, key=lambda k: sum(g["memory_bytes"] or 0 for g in groups[k]))
    chosen = groups[gid]
    notes.append(f"local machine, detected: {len(chosen)}x {chosen[0]['name']} via {chosen[0]['tool']} -> catalog gpu {gid}")
    for other, gs in groups.items():
        if other != gid:
            notes.append(f"local machine, assumed: {len(gs)}x {other} left out (a machine models one GPU model; "
                         f"{gid} has the most memory)")
    if gid in hw["unified"]:
        return {"gpu": gid}
    parts = {"gpu": gid, "gpus": len(chosen)}
    mem = min((g["memory_bytes"] for g in chosen if g["memory_bytes"]), default=None)
    stock = float(table[gid].get("memory_bytes", 0.0))
    if mem and stock and abs(mem - stock) > 0.1 * stock:
        parts["gpu_mem_gb"] = mem / GB
        notes.append(f"local machine, detected: {mem / 2**30:.0f} GiB per GPU, not the stock {stock / 2**30:.0f} GiB")
    link = _pcie_link(chosen[0], hw)
    if link:
        parts["pcie"] = link
        notes.append(f"local machine, detected: PCIe {link} (the GPU's maximum link)")
    return parts


def _pcie_link(g: dict, hw: dict) -> str | None:
    if not (g.get("pcie_gen") and g.get("pcie_width")):
        return None
    link = f"gen{g['pcie_gen']}x{g['pcie_width']}"
    return link if link in hw["link"] else None


# ---------------------------------------------------------------------------------- host memory
def _host_part(kind: str, speed: int | None, hw: dict, notes: list) -> str:
    """The catalog part for a DIMM type and speed: exact, else the next slower of that type."""
    parts = {k: v for k, v in hw["host_memory"].items() if v.get("kind") == kind and k != kind}
    if not parts:
        raise MoesimError(f"dmidecode reports {kind.upper() or 'an unnamed'} memory, which has no catalog part; "
                          + _FLAGS_HINT, "machine")
    if speed is None:
        notes.append(f"local machine, assumed: {kind.upper()} speed not reported: {kind} ({hw['host_memory'][kind]['mt_s']} MT/s)")
        return kind if kind in hw["host_memory"] else min(parts, key=lambda k: parts[k]["mt_s"])
    exact = f"{kind}-{speed}"
    if exact in parts:
        return exact
    slower = [k for k in parts if parts[k]["mt_s"] <= speed]
    pick = max(slower, key=lambda k: parts[k]["mt_s"]) if slower else min(parts, key=lambda k: parts[k]["mt_s"])
    notes.append(f"local machine, assumed: {kind.upper()}-{speed} is not a catalog part; modelled as {pick}")
    return pick


def _host_parts(probe: P.Probe, cpu: dict, cpu_id, hw: dict, notes: list) -> dict:
    """host (PARTxCHANNELS) and host_mem_gb from dmidecode, else MemTotal and stated defaults."""
    sockets = cpu.get("sockets") or 1
    out, why = probe.run(["dmidecode", "-t", "memory"])
    dimms = P.parse_dmidecode(out) if out else []
    if dimms:
        kinds = sorted({d["type"] for d in dimms})
        speed = min((d["speed"] for d in dimms if d["speed"]), default=None)
        part = _host_part(kinds[0], speed, hw, notes)
        channels, how = P.dimm_channels(dimms, sockets)
        total = sum(d["size_bytes"] for d in dimms)
        notes.append(f"local machine, detected: {len(dimms)} DIMMs {'/'.join(k.upper() for k in kinds)}"
                     f"{'-' + str(speed) if speed else ''}, {total / 2**30:.0f} GiB, {channels} channel(s) "
                     f"per socket ({how}) via dmidecode -> {part}x{channels}")
        return {"host": f"{part}x{channels}", "host_mem_gb": total / GB}
    parts = {}
    mem = P.parse_meminfo(probe.read("/proc/meminfo") or "")
    if mem:
        parts["host_mem_gb"] = mem / GB
        notes.append(f"local machine, detected: {mem / GB:.1f} GB MemTotal in /proc/meminfo (a little under what is installed)")
    server = bool(_SERVER_CPU.search(cpu.get("name", "")))
    if cpu_id:
        default = hw["cpu"][cpu_id]
        parts["host"] = f"{default.get('memory') or 'ddr5'}x{default.get('channels') or 2}"
        notes.append(f"local machine, assumed: no DIMM details ({why or 'no memory devices listed'}; dmidecode needs root): "
                     f"{cpu_id}'s {parts['host']} from the catalog; --host sets it")
    elif server:
        parts["host"] = f"ddr5x{_SERVER_CHANNELS}"
        notes.append(f"local machine, assumed: no DIMM details ({why or 'no memory devices listed'}; dmidecode needs root): "
                     f"ddr5 (4800 MT/s) x {_SERVER_CHANNELS} channels, a server socket; --host sets it")
    else:
        parts["host"] = "ddr5x2"
        notes.append(f"local machine, assumed: no DIMM details ({why or 'no memory devices listed'}; dmidecode needs root): "
                     "ddr5 (4800 MT/s) x 2 channels, a desktop; --host sets it")
    return parts


def _storage_part(probe: P.Probe, hw: dict, notes: list) -> dict:
    """storage: the fastest NVMe link in sysfs (the model file's drive is not known), else a SATA SSD."""
    gens = P.nvme_generations(probe)
    if gens:
        dev, gen = max(gens, key=lambda g: g[1])
        part = f"nvme-gen{min(max(gen, 3), 5)}"
        if part in hw["storage"]:
            notes.append(f"local machine, detected: NVMe {dev} on a PCIe gen{gen} link -> {part} (assumed to "
                         "hold the model file; --storage sets it)")
            return {"storage": part}
    if P.has_sata_ssd(probe) and "sata-ssd" in hw["storage"]:
        notes.append("local machine, detected: a SATA SSD and no NVMe -> sata-ssd (--storage sets it)")
        return {"storage": "sata-ssd"}
    return {}


# ------------------------------------------------------------------------------------ machines
def _cpu_parts(probe: P.Probe, hw: dict, notes: list) -> tuple:
    """(cpuinfo dict, catalog CPU id or None, machine() keywords)."""
    cpu = P.parse_cpuinfo(probe.read("/proc/cpuinfo") or "")
    if not cpu:
        raise MoesimError("cannot read /proc/cpuinfo to detect this machine; " + _FLAGS_HINT, "machine")
    cpu_id, _ = match_catalog(cpu["name"], hw["cpu"])
    notes.append(f"local machine, detected: CPU {cpu['name'] or '(unnamed)'}, {cpu['sockets']} socket(s), {cpu['cores']} "
                 f"physical cores ({cpu['cores_from']}), {cpu['logical']} logical"
                 + (f" -> catalog cpu {cpu_id}" if cpu_id else " (not a catalog CPU; ISA from its flags)"))
    parts = {"cores": cpu["cores"], "sockets": cpu["sockets"]}
    if cpu_id:
        parts["cpu"] = cpu_id
    return cpu, cpu_id, parts


def _mac_parts(probe: P.Probe, hw: dict, notes: list) -> dict:
    out, why = probe.run(P.MAC_QUERY)
    info = P.parse_system_profiler(out) if out else {}
    if not info.get("chip"):
        raise MoesimError(f"cannot read this Mac's chip ({why or 'system_profiler named none'}); " + _FLAGS_HINT,
                          "machine")
    chip, _ = match_catalog(info["chip"], hw["unified"])
    if chip is None:
        raise MoesimError(f"system_profiler reports {info['chip']!r}, which matches no catalog chip "
                          "(an Intel Mac, or a chip newer than the catalog); " + _FLAGS_HINT, "machine")
    notes.append(f"local machine, detected: {info['chip']} ({info.get('gpu_cores') or '?'} GPU cores, {info.get('cpu_cores') or '?'}"
                 f" CPU cores, {info.get('memory_gb') or '?'} GB) via system_profiler -> catalog chip {chip}")
    listed = hw["unified"][chip].get("gpu_cores")
    if info.get("gpu_cores") and listed and info["gpu_cores"] != listed:
        notes.append(f"local machine, assumed: the catalog's {chip} is the {listed}-GPU-core part; this one has "
                     f"{info['gpu_cores']} (bandwidth and TFLOPS are the catalog's)")
    parts = {"gpu": chip}
    if info.get("memory_gb"):
        parts["host_mem_gb"] = info["memory_gb"]
    if info.get("cpu_cores"):
        parts["cores"] = info["cpu_cores"]
    return parts


def _detected_parts(probe: P.Probe, given: dict, hw: dict, notes: list) -> tuple:
    """(machine() keywords, ISA flags to keep or None) from what this machine reports; parts the caller
    gives are not probed."""
    if probe.os_name == "Darwin":
        return ({} if "gpu" in given else _mac_parts(probe, hw, notes)), None
    if probe.os_name != "Linux":
        raise MoesimError(f"detecting a {probe.os_name} machine is not supported (Linux and macOS are); "
                          + _FLAGS_HINT, "machine")
    cpu, cpu_id, parts = _cpu_parts(probe, hw, notes)
    if "gpu" not in given and given.get("gpus") != 0:
        gpus = _detect_gpus(probe, notes)
        if gpus:
            parts.update(_gpu_parts(gpus, hw, notes))
        else:
            notes.append("local machine, detected: no GPU (neither nvidia-smi nor rocm-smi answered), a CPU-only machine")
    if parts.get("gpu") in hw["unified"]:        # a unified chip on Linux (DGX Spark): one pool, no DIMMs
        mem = P.parse_meminfo(probe.read("/proc/meminfo") or "")
        parts = {"gpu": parts["gpu"], "cores": parts["cores"], **({"host_mem_gb": mem / GB} if mem else {})}
        return parts, None
    if "host" not in given:
        parts.update(_host_parts(probe, cpu, cpu_id, hw, notes))
    if "storage" not in given:
        parts.update(_storage_part(probe, hw, notes))
    return parts, (None if cpu_id else cpu.get("isa", ()))


def local_machine(*, root: str = "/", path: str | None = None, system: str | None = None, **given) -> Machine:
    """This machine, detected (see the module doc); keyword arguments of :func:`moesim.machine` (``gpu``,
    ``host``, ``host_mem_gb``, ...) replace the detected part. ``root``, ``path`` and ``system`` point
    detection elsewhere (a fixture tree, a PATH of fake tools, ``"Darwin"``)."""
    bad = sorted(set(given) - set(_MACHINE_KEYS))
    if bad:
        raise MoesimError(f"unknown machine part {bad[0]!r}; known: {', '.join(_MACHINE_KEYS)}", "machine")
    given = {k: v for k, v in given.items() if v is not None}
    hw = _catalog.load("hardware")
    notes = []
    parts, isa = _detected_parts(P.Probe(root=root, path=path, system=system), given, hw, notes)
    if "gpu" in given or given.get("gpus") == 0:
        parts = {k: v for k, v in parts.items() if k not in ("gpu", "gpus", "gpu_mem_gb", "pcie")}
    if "host" in given:
        parts.pop("host", None)
    parts.update(given)
    if given:
        notes.append("local machine, given: " + ", ".join(f"{k}={v}" for k, v in given.items()) + " (in place of detection)")
    built = make_machine(None, **parts)
    if isa is not None and not built.unified:
        built = dataclasses.replace(built, cpu_isa=tuple(isa))
    return dataclasses.replace(built, id="local", assumptions=tuple(notes) + tuple(built.assumptions))
