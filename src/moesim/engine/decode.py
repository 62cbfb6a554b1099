"""Decode kernel driver: result layout (resources, phases, links) and the call into C or its twin."""
from __future__ import annotations

from ..errors import MoesimError
from .glue import Sealed, handle_library_error, kernel_module


RESOURCES = ("gpu_memory", "gpu_compute", "host_memory", "cpu_compute", "pcie", "storage", "latency",
             "interconnect")
PHASES = ("attention", "experts", "transfer", "sync_launch", "head_drafts", "step_overhead", "all_to_all")
LINKS = ("gpu_memory", "host_memory", "pcie", "storage")
CONFIG_FIELDS = ("batch", "tokens_per_step", "drafts", "accepted", "steps", "warmup", "policy", "mode", "seed",
                 "index")
# optional columns: "che" [n, routing layers, CHE_FIELDS] and "che_slots" [n] (che_table's rows; -1: none);
# "page_hit" [n, routing layers] and "page_hit_slots" [n] (page_table's rows; -1: none)


# ------------------------------------------------------------------------------- running
def run(dm: dict, hw: dict, rt: dict, cols: dict, n_threads: int = 1, engine: str = "c") -> dict:
    """Evaluate configurations (columns of CONFIG_FIELDS) on lowered tables; returns result arrays."""
    if type(cols) is not Sealed:       # sealed columns were checked whole, their lengths included
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


def run_variants(rt: dict, jobs: list, n_threads: int = 1):
    """:func:`run` of several (decode model, machine, config columns) jobs that share routing ``rt``, in one kernel
    call (a sweep group's decode variants: the routing filled once, no result dict per job): one
    ``[configurations, 13]`` array, a row per configuration in job order holding step_mean, by_resource (8),
    accepted, 0, hit_rate, 0 (ms_sweep_variant_t's layout; the caller fills the zeros)."""
    from . import _kernel
    code, job, bad, rows = _kernel.decode_variants(rt, list(jobs), int(n_threads))
    handle_library_error(code, "ms_decode_many", bad)
    return rows


def prepare(dm: dict = None, hw: dict = None, cols: dict = None, rt: dict = None):
    """The C structs of a decode model, machine, config columns or routing, each checked (engine.glue) and filled
    once: what :func:`run_prepared` takes in the place of :func:`run_variants`' tables (give exactly one)."""
    given = [(k, v) for k, v in (("dm", dm), ("hw", hw), ("cols", cols), ("rt", rt)) if v is not None]
    if len(given) != 1:
        raise MoesimError("prepare: give exactly one of dm, hw, cols, rt", "prepare")
    kind, table = given[0]
    k = kernel_module()
    return {"dm": k.DecodeModel, "hw": k.DecodeMachine, "cols": k.DecodeConfigs, "rt": k.DecodeRouting}[kind](table)


def run_prepared(rt, jobs: list, n_threads: int = 1):
    """:func:`run_variants` of prepared jobs (:func:`prepare`'s decode model, machine and config columns, and its
    routing ``rt``): the same kernel calls and rows, without checking and filling the tables again per call (a sweep
    runs each lowered model, machine and column set in many calls)."""
    code, job, bad, rows = kernel_module().decode_prepared(rt, jobs, int(n_threads))
    handle_library_error(code, "ms_decode_many", bad)
    return rows


# ------------------------------------------------------------------------------- analytic tables
def che_table(rt: dict, batches, tokens_per_step, slots: int, policy: int = 0, engine: str = "c", steps: int = 256,
              warmup: int = 32, n_threads: int = 1):
    """The analytic path's expected counts of every routing layer's step, one ``[n_layers, len(CHE_FIELDS)]``
    row per (batches[i], tokens_per_step[i]) at ``slots`` GPU expert slots under ``policy`` (a POLICIES code,
    not Belady): distinct experts, the pinned (hottest ``slots``) and free selection / inclusion mass, the GPU
    hit rate (LRU: the sticky chain in whole steps of recency, ms_cache_rates.c lru_chain_hits; LFU: counts since
    the run began, averaged over steps [warmup, steps) of a run, lfu_hit_rate; static: the pinned share) and the
    reuse statistic (codes.CHE_FIELDS). They depend on the routing's tables, batch, tokens per step, slots,
    policy and (LFU) the run's steps and warmup only, so a sweep computes them once and passes them as the
    ``che`` / ``che_slots`` config columns of every configuration that shares them (prefetch recalls,
    machines, contexts, quants); the kernel then reads them instead of counting experts and solving. The rows
    run on up to ``n_threads`` threads (the same rows on any count). Bad arguments raise MoesimError."""
    import numpy as np
    from .codes import CHE_FIELDS, POLICY_BELADY, POLICIES
    b, t = _table_args(rt, batches, tokens_per_step, slots, "che_table", "slots", n_threads)
    if policy not in POLICIES.values() or policy == POLICY_BELADY:
        raise MoesimError(f"che_table: policy must be the code of lru, lfu or static, got {policy!r}", "policy")
    for name, v, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not low <= int(v) <= 2**62:
            raise MoesimError(f"che_table: {name} must be an integer >= {low}, got {v!r}", name)
    if warmup >= steps:
        raise MoesimError(f"che_table: warmup ({warmup}) must be smaller than steps ({steps})", "warmup")
    if engine == "reference":
        from .reference import decode as reference
        rows = [reference.che_table(rt, int(x), int(y), int(slots), int(policy), int(steps), int(warmup))
                for x, y in zip(b, t)]
        return np.array(rows, dtype=np.float64).reshape(len(b), int(rt["n_layers"]), len(CHE_FIELDS))
    if engine != "c":
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    from . import _kernel
    code, bad, out = _kernel.che_table(rt, b, t, int(slots), int(policy), int(steps), int(warmup), int(n_threads))
    handle_library_error(code, "ms_che_table", bad)
    return out


def _table_args(rt: dict, batches, tokens_per_step, slots, name: str, what: str, n_threads: int) -> tuple:
    """(batches, tokens per step) of an analytic table call as integer arrays, its slot count, thread count and
    routing checked (MoesimError naming ``name``)."""
    import numpy as np
    if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)) or not 1 <= n_threads <= 4096:
        raise MoesimError(f"{name}: n_threads must be an integer in [1, 4096], got {n_threads!r}", "n_threads")
    b = np.atleast_1d(np.asarray(batches))
    t = np.broadcast_to(np.asarray(tokens_per_step), b.shape) if b.ndim == 1 else None
    if t is None or b.dtype.kind not in "iu" or t.dtype.kind not in "iu":
        raise MoesimError(f"{name}: batches and tokens_per_step must be integers (one row each)", "batches")
    if b.size and (b.min() < 1 or b.max() > 2**31 - 1 or t.min() < 1 or t.max() > 2**31 - 1):
        raise MoesimError(f"{name}: batch and tokens per step must be in [1, 2**31 - 1]", "batches")
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or not 0 <= int(slots) <= 2**31 - 1:
        raise MoesimError(f"{name}: {what} must be an integer >= 0, got {slots!r}", what)
    if not rt.get("n_layers") or rt.get("q") is None:
        raise MoesimError(f"{name}: the routing has no analytic tables (a dense model or a trace)", "rt")
    return b, t


def page_table(rt: dict, batches, tokens_per_step, page_slots: int, engine: str = "c", n_threads: int = 1):
    """The analytic path's host page-cache hit rate of every routing layer, one ``[n_layers]`` row per
    (batches[i], tokens_per_step[i]) at ``page_slots`` page slots (Che's approximation on the window tables
    under token memory, else on the step's inclusion probabilities; 0 for a step without experts). It
    depends on the routing's tables, batch, tokens per step and page slots only (not the placement, GPU
    slots, policy, machine or context), so a sweep computes it once and passes it as the ``page_hit`` /
    ``page_hit_slots`` config columns of every configuration that shares it; the kernel's paged layers of
    that many page slots then read it instead of solving Che. Rows on up to ``n_threads`` threads as
    :func:`che_table`'s. Bad arguments raise MoesimError."""
    import numpy as np
    b, t = _table_args(rt, batches, tokens_per_step, page_slots, "page_table", "page_slots", n_threads)
    if engine == "reference":
        from .reference import decode as reference
        rows = [reference.page_table(rt, int(x), int(y), int(page_slots)) for x, y in zip(b, t)]
        return np.array(rows, dtype=np.float64).reshape(len(b), int(rt["n_layers"]))
    if engine != "c":
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    from . import _kernel
    code, bad, out = _kernel.page_table(rt, b, t, int(page_slots), int(n_threads))
    handle_library_error(code, "ms_page_table", bad)
    return out
