"""Memory evaluation: lowered model + configuration columns through the C kernel (or its twin)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec import quants as Q
from ..errors import MoesimError
from .glue import handle_library_error
from ..spec.hardware import Machine
from ..spec.placement import parse as parse_placement
from ..spec.runtimes import check_runtime_applies, default_runtime, runtime as get_runtime
from .lower.memory import CLASSES, CONFIG_FIELDS, INT_CONFIG_FIELDS, LoweredModel, TIERS, WEIGHT_CLASSES, configure, default_kv_dtype, lower
from .codes import FITS_GPU, FITS_HOST, FITS_STORAGE
from ..spec.limits import check_count


# --------------------------------------------------------------------------------- results
@dataclass
class MemoryResult:
    """Memory of one configuration. Bytes are floats (exact integers below 2**53)."""

    by_class: np.ndarray            # [len(CLASSES), len(TIERS)]
    tier: np.ndarray                # [len(TIERS)]
    gpu_per_gpu: float              # the busiest GPU's bytes (gpu_ways), what the fit holds to one GPU's capacity
    weights: float
    kv: float
    state: float
    kv_bytes_per_token: float
    fits_bits: int
    max_context: int
    max_batch: int

    @property
    def fits(self) -> str:
        if not self.fits_bits:
            return "no"
        return "+".join(t for t, bit in zip(TIERS, (FITS_GPU, FITS_HOST, FITS_STORAGE)) if self.fits_bits & bit)

    def weights_by_class(self) -> dict:
        return {c: float(self.by_class[i].sum()) for i, c in enumerate(WEIGHT_CLASSES)}

    def memory_by_tier(self) -> dict:
        """Bytes per tier, split by class. Weights paged from storage (mmap beyond host RAM) leave the
        host's classes and appear under storage, routed experts first (the decode model pages routed
        experts: page_slots), then the other weight classes in class order; each tier's classes sum
        to its total."""
        spill = float(self.tier[TIERS.index("storage")])
        host_j = TIERS.index("host")
        order = [CLASSES.index("routed_experts")] + [i for i, c in enumerate(CLASSES)
                                                      if c in WEIGHT_CLASSES and c != "routed_experts"]
        moved = np.zeros(len(CLASSES))
        left = spill
        for i in order:
            take = min(left, float(self.by_class[i, host_j]))
            moved[i], left = take, left - take
        out = {}
        for j, tier in enumerate(TIERS):
            if tier == "storage":
                classes = {c: float(moved[i]) for i, c in enumerate(CLASSES) if moved[i]}
            else:
                col = self.by_class[:, j] - (moved if j == host_j else 0.0)
                classes = {c: float(col[i]) for i, c in enumerate(CLASSES) if col[i]}
            out[tier] = {"total": float(self.tier[j]), "by_class": classes}
        return out


def _result_from_arrays(res: dict, i: int) -> MemoryResult:
    return MemoryResult(by_class=res["by_class"][i].copy(), tier=res["tier"][i].copy(),
                        gpu_per_gpu=float(res["gpu_per_gpu"][i]), weights=float(res["weights"][i]),
                        kv=float(res["kv"][i]), state=float(res["state"][i]),
                        kv_bytes_per_token=float(res["kv_bytes_per_token"][i]), fits_bits=int(res["fits"][i]),
                        max_context=int(res["max_context"][i]), max_batch=int(res["max_batch"][i]))


def evaluate(low: LoweredModel, cfgs: dict, n_threads: int = 1, engine: str = "c") -> dict:
    """Evaluate configurations given as equal-length arrays per CONFIG_FIELDS; returns result arrays."""
    cols = {}
    n = None
    for f in CONFIG_FIELDS:
        arr = np.asarray(cfgs[f], dtype=np.int64 if f in INT_CONFIG_FIELDS else np.float64)
        arr = np.atleast_2d(arr) if f == "gpu_ways" else np.atleast_1d(arr)     # [n, N_CLASSES]
        n = len(arr) if n is None else n
        if len(arr) != n:
            raise MoesimError(f"config column {f} has {len(arr)} rows, expected {n}", f)
        cols[f] = np.ascontiguousarray(arr)
    if engine == "reference":
        from .reference import memory as reference
        return reference.memory_many(low, cols)
    if engine != "c":
        raise MoesimError(f"engine must be 'c' or 'reference', got {engine!r}", "engine")
    from . import _kernel
    code, bad, res = _kernel.memory_many(low, cols, int(n_threads))
    handle_library_error(code, "ms_memory_many", bad)
    return res


def memory(model, machine: Machine, quant="native", context: int = 4096, batch: int = 1, kv_dtype: str | None = None,
           placement="all-gpu", runtime=None, mtp: int = 0, engine: str = "c") -> MemoryResult:
    """Memory of one configuration (validated); see :func:`moesim.fit` for the automatic placement."""
    from ..ingest import model as get_model
    m = get_model(model)
    q = Q.resolve(quant, m)
    rt = get_runtime(runtime, model=m.id) if runtime is not None else default_runtime(q, machine)
    context = check_count(context, "context")
    batch = check_count(batch, "batch")
    mtp = check_count(mtp, "mtp", minimum=0)
    if mtp and not m.mtp_layers:
        raise MoesimError(f"{m.id} has no MTP modules", "mtp")
    kv = Q.canonical_kv_dtype(kv_dtype or default_kv_dtype(q, rt, m))
    p = parse_placement(placement, m, machine)
    check_runtime_applies(rt, machine, p.kind)
    low = lower(m, q, kv)
    cfg = configure(m, low, machine, rt, p, context, batch, kv, mtp)
    return _result_from_arrays(evaluate(low, cfg, engine=engine), 0)
