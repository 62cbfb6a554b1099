"""What every command shares: the one-line usage error, number parsing, the machine flags, tensor
overrides and JSON printing."""
from __future__ import annotations

import argparse
import json
import math
import os

from ..errors import MoesimError


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in moesim's one-line form."""

    def error(self, message):
        raise MoesimError(message, "usage")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return v


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _writable(path: str, field: str) -> str:
    """An output file path whose folder exists (checked before the work that ends in writing it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise MoesimError(f"{path} is a directory; give a file name", field)
    if not os.path.isdir(folder):
        raise MoesimError(f"cannot write {path}: no such folder {folder}", field)
    if not os.access(folder, os.W_OK):
        raise MoesimError(f"cannot write {path}: folder {folder} is not writable", field)
    return path


def _add_machine_flags(p, repeatable: bool = False):
    """The machine flags; *repeatable*: --machine and --gpu may be given several times (compare), each
    value one machine with the other parts."""
    g = p.add_argument_group("machine (a catalog id, or composed from parts; parts override the id)")
    many = {"action": "append"} if repeatable else {}
    again = " (repeatable: one machine each)" if repeatable else ""
    g.add_argument("--machine", help="catalog machine id (moesim hardware), or 'local': detect this machine" + again,
                   **many)
    g.add_argument("--gpu", help="GPU id, or a unified-memory chip id such as m3-ultra or dgx-spark" + again, **many)
    g.add_argument("--gpus", type=_positive_int, help="number of GPUs")
    g.add_argument("--gpu-mem-gb", type=_number, help="memory per GPU in GB (e.g. 48 for a modded 4090)")
    g.add_argument("--gpu-bw-gbs", type=_number, help="GPU memory bandwidth in GB/s: overrides --gpu's, or with "
                   "--gpu-mem-gb and --gpu-tflops describes an unlisted GPU")
    g.add_argument("--gpu-tflops", type=_number, help="dense 16-bit tensor TFLOP/s per GPU: overrides --gpu's "
                   "(every dtype scaled alike), or describes an unlisted GPU")
    g.add_argument("--host", help="host memory part x channels, e.g. ddr5-4800x8")
    g.add_argument("--sockets", type=_positive_int)
    g.add_argument("--cores", type=_positive_int)
    g.add_argument("--host-mem-gb", type=_number, help="host RAM in GB")
    g.add_argument("--pcie", help="gen3x16 | gen4x16 | gen5x16 | ...")
    g.add_argument("--storage", help="nvme-gen4 | nvme-gen5 | sata-ssd | none")
    g.add_argument("--cpu", help="CPU id (sets channels/ISA defaults)")


def _machine_parts(args) -> dict:
    return dict(gpus=args.gpus, gpu_mem_gb=args.gpu_mem_gb, gpu_bw_gbs=args.gpu_bw_gbs, gpu_tflops=args.gpu_tflops,
                host=args.host, sockets=args.sockets, cores=args.cores, host_mem_gb=args.host_mem_gb, pcie=args.pcie,
                storage=args.storage, cpu=args.cpu)


def _machine_from(args):
    return _one_machine(args.machine, args.gpu, args)


def _one_machine(machine_id, gpu, args):
    """A catalog or composed machine, or with ``local`` this one detected (the part flags replace parts)."""
    from ..spec.hardware import machine
    if (machine_id or "").strip().lower() == "local":
        from ..ingest.local_machine import local_machine
        return local_machine(gpu=gpu, **_machine_parts(args))
    return machine(machine_id, gpu=gpu, **_machine_parts(args))


def _machines_from(args) -> list:
    """The machines of repeatable --machine / --gpu flags: one per value, the other parts shared; several
    of one with one (or none) of the other."""
    ids, gpus = args.machine or [None], args.gpu or [None]
    if len(ids) > 1 and len(gpus) > 1:
        raise MoesimError("give several --machine or several --gpu, not both (each is one machine)", "machine")
    return [_one_machine(i, g, args) for i in ids for g in gpus]


class _TensorOverride(argparse.Action):
    """Collect llama.cpp tensor overrides (-ot, --cpu-moe, --n-cpu-moe) in command-line order, as
    llama.cpp appends them to tensor_buft_overrides in the order it parses them."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ..spec import overrides as O
        acc = list(getattr(namespace, self.dest, None) or [])
        if self.const == "cpu-moe":
            acc.append(O.cpu_moe())
        elif self.const == "n-cpu-moe":
            try:
                n = int(values)
            except ValueError:
                raise MoesimError(f"expected an integer, got {values!r}", "--n-cpu-moe") from None
            acc.extend(O.n_cpu_moe(n))
        else:
            acc.extend(O.parse_overrides(values, "--override-tensor"))
        setattr(namespace, self.dest, acc)


_MODEL_HELP = ("catalog model id, or a path: a GGUF file (any shard of a split), a config.json or its "
               "directory, a model.safetensors.index.json or .safetensors file")
_OT_HELP = ("llama.cpp tensor override PATTERN=DEVICE (repeatable, comma lists allowed), e.g. "
            "'\\.ffn_.*_exps\\.=CPU'; mapped to the equivalent placement")


def _print_json(data, **kw) -> int:
    print(json.dumps(data, indent=1, **kw))
    return 0
