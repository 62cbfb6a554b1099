"""Serving scheduler driver: the call into C (csrc/ms_serve.c) or its pure-Python twin."""
from __future__ import annotations

from ..errors import MoesimError
from .codes import ERR_KV_TOO_SMALL
from .glue import handle_library_error

TABLE_FIELDS = ("grid_b", "grid_c", "decode_s", "grid_p", "grid_d", "prefill_s", "forward_s")
CONFIG_FIELDS = ("closed_loop", "concurrency", "rate", "n_requests", "isl", "osl", "max_num_batched_tokens",
                 "max_num_seqs", "block_size", "n_blocks", "state_blocks", "prefix_blocks", "snapshot_blocks",
                 "max_steps")


def run(table: dict, cfg: dict, seed: int = 0, stream: int = 0, engine: str = "c") -> dict:
    """Per-request arrival, first-token and finish times (seconds) and preemptions, and the run's counters.
    A KV pool that cannot hold one prompt chunk is a MoesimError on ``kv``; any other code is a moesim bug."""
    for names, what in ((TABLE_FIELDS, table), (CONFIG_FIELDS, cfg)):
        missing = [f for f in names if f not in what]
        if missing:
            raise MoesimError(f"serving fields {missing} missing", missing[0])
    if engine == "reference":
        from .reference import serve as reference
        code, out = reference.serve(table, cfg, seed, stream)
    elif engine == "c":
        from . import _kernel
        code, out = _kernel.serve(table, cfg, int(seed), int(stream))
    else:
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    if code == ERR_KV_TOO_SMALL:
        raise MoesimError("the KV cache left after the weights cannot hold one request's first prompt chunk", "kv")
    handle_library_error(code, "ms_serve")
    return out
