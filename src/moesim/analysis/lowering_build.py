"""``moesim cache build``: lower the whole catalog into the persistent lowering cache
(:mod:`moesim._lowering_cache`) ahead of time, so that the first ``moesim rank`` -- and fit, simulate or
sweep of a catalog model -- in a new process loads its lowering instead of computing it.

What is lowered is what those commands ask for by default and depends on no machine: the catalog's
parsed data files, every catalog model's parsed spec and parameter counts, its lowering and kernel mix under each quantization of the
default ladders (llama.cpp's GGUF ladder, the published checkpoint, fp8 where the checkpoint is 16-bit:
:func:`moesim.analysis.fit.default_quants` over a consumer and a datacenter machine), and its family's
routing tables at the default seed.
"""
from __future__ import annotations

import time

from .. import _catalog, _lowering_cache
from ..errors import MoesimError
from ..spec import quants as Q
from ..spec.models import catalog_model, model_ids
from .fit import DEFAULT_FIT_QUANTS
from .resolve import checkpoint_quant


def _ladder(m) -> list:
    """The quantizations rank, fit and compare try for *m* on any machine and default runtime."""
    names = [q for q in DEFAULT_FIT_QUANTS if q != "MXFP4_MOE" or m.n_experts] + ["native"]
    out = []
    for name in names:
        try:
            out.append(Q.resolve(name, m))
        except MoesimError:
            continue
    out.append(checkpoint_quant(m))
    if Q.native_quant(m).id.lower() in ("bf16", "f16", "fp16"):
        out.append(Q.resolve("fp8", m))
    return list(dict.fromkeys(out))


def _tier_weights(m, q, low) -> None:
    """The weights per tier of llama.cpp's automatic placement candidates (engine.lower.placement), which
    rank's memory tables read for every GGUF quant: they depend on no machine (a one-GPU machine only
    supplies the probe's configuration)."""
    from ..engine.lower.memory import default_kv_dtype
    from ..engine.lower.placement import _weights, memory_configs, placement_candidates
    from ..spec.hardware import machine
    from ..spec.runtimes import default_runtime
    mach = _PROBE_MACHINE.get("m")
    if mach is None:
        mach = _PROBE_MACHINE["m"] = machine(gpu="rtx-4090", host="ddr5-6000x2", host_mem_gb=64)
    rt = default_runtime(q, mach)
    if not rt.llama_cpp_family:
        return
    kv = Q.canonical_kv_dtype(default_kv_dtype(q, rt, m))
    if Q.indexer_dtype_bytes(kv) != Q.indexer_dtype_bytes(None):
        return                          # another lowering than the one built (an fp4 indexer cache)
    cands, _ = placement_candidates(m, mach, rt, "auto")
    full, _ = memory_configs(m, low, mach, rt, kv, 0)
    _weights(low, tuple(cands), full[0], 0)


_PROBE_MACHINE: dict = {}


def build(models=None) -> dict:
    """Lower *models* (catalog ids; default: the whole catalog) and write the cache; returns what was
    done: models, configurations lowered, seconds, and :func:`moesim._lowering_cache.info`. A MoesimError
    (field ``MOESIM_CACHE``) when the cache is off, since nothing could be kept."""
    from ..engine.lower.decode_model import _params
    from ..engine.lower.memory import lower
    from .simulate import routing_table
    if not _lowering_cache.enabled():
        raise MoesimError("the lowering cache is off (MOESIM_CACHE=off): nothing to build", "MOESIM_CACHE")
    t0 = time.perf_counter()
    for name in _catalog.names():
        _catalog.load(name)
    ids = model_ids() if models is None else list(models)
    configs = 0
    for mid in ids:
        m = catalog_model(mid)
        m.param_counts()
        _params(m)
        routing_table(m, None, None, 0)
        for q in _ladder(m):
            try:
                Q.check_applicable(m, q)
            except MoesimError:
                continue
            low = lower(m, q)
            Q.kernel_mix(m, q)
            _tier_weights(m, q, low)
            configs += 1
    written = _lowering_cache.flush()
    return {"models": len(ids), "configurations": configs, "files_written": written,
            "seconds": time.perf_counter() - t0, "cache": _lowering_cache.info()}
