"""Decode kernel driver: result layout (resources, phases, links) and the call into C or its twin."""
from __future__ import annotations

from ..errors import MoesimError
from .glue import handle_library_error


RESOURCES = ("gpu_memory", "gpu_compute", "host_memory", "cpu_compute", "pcie", "storage", "latency",
             "interconnect")
PHASES = ("attention", "experts", "transfer", "sync_launch", "head_drafts", "step_overhead", "all_to_all")
LINKS = ("gpu_memory", "host_memory", "pcie", "storage")
CONFIG_FIELDS = ("batch", "tokens_per_step", "drafts", "accepted", "steps", "warmup", "policy", "mode", "seed",
                 "index")


# ------------------------------------------------------------------------------- running
def run(dm: dict, hw: dict, rt: dict, cols: dict, n_threads: int = 1, engine: str = "c") -> dict:
    """Evaluate configurations (columns of CONFIG_FIELDS) on lowered tables; returns result arrays."""
    missing = [f for f in CONFIG_FIELDS if f not in cols]
    if missing:
        raise MoesimError(f"config columns {missing} missing", missing[0])
    n = len(cols["batch"])
    for f in CONFIG_FIELDS:
        if len(cols[f]) != n:
            raise MoesimError(f"config column {f} has {len(cols[f])} rows, expected {n}", f)
    if engine == "reference":
        from .reference import decode as reference
        return reference.decode_many(dm, hw, rt, cols)
    if engine != "c":
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    from . import _kernel
    code, bad, res = _kernel.decode_many(dm, hw, rt, cols, int(n_threads))
    handle_library_error(code, "ms_decode_many", bad)
    return res
