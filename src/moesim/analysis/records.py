"""The fit record: the JSON object ``moesim fit`` prints for one configuration."""
from __future__ import annotations

from ..spec.hardware import Machine
from ..engine.memory import MemoryResult
from ..spec.models import Model
from ..spec.placement import Placement
from ..spec.runtimes import Runtime
from .advice import launch
from .kvterms import kv_terms


def record(m: Model, q, kv: str, context: int, batch: int, p: Placement, rt: Runtime, machine: Machine,
           r: MemoryResult, mtp: int, notes=(), parallel: str | None = None) -> dict:
    """The fit record of one resolved configuration; *notes* are assumptions the entry point made
    (a context beyond the trained maximum, say) and are listed with the machine's and runtime's."""
    tiers = r.memory_by_tier()
    fits = r.fits
    if machine.unified:
        # one physical pool: the GPU tier is the wired (GPU-visible) share of it
        tiers = {("unified" if k == "gpu" else k): v for k, v in tiers.items()}
        fits = "+".join("unified" if t == "gpu" else t for t in fits.split("+")) if fits != "no" else fits
    return {
        "model": m.id,
        "quant": q.id,
        "quant_source": "file" if q.is_stored else ("checkpoint" if q.scheme is not None else "rules"),
        "kv_dtype": kv,
        "context": context,
        "batch": batch,
        "placement": str(p),
        "runtime": rt.id,
        "machine": machine.describe(),
        "weights_bytes": r.weights,
        "weights_bytes_by_class": r.weights_by_class(),
        "kv_bytes_per_token": r.kv_bytes_per_token,
        "kv_bytes": r.kv,
        "state_bytes": r.state,
        "kv_terms": kv_terms(m, kv, context, mtp, rt.kv_granularity),
        "memory_by_tier": tiers,
        "fits": fits,
        "max_context": r.max_context,
        "max_batch": r.max_batch,
        "flags": launch(p, rt, m, machine, q, context, kv, batch, mtp, parallel)["flags"],
        "assumptions": list(machine.assumptions) + ([rt.launch] if rt.launch else []) + list(notes),
    }


def default_notes(rt: Runtime, kv: str, runtime=None, kv_dtype=None, placement=None) -> list:
    """One short assumption line for each setting the entry point chose because the call left it out:
    the runtime (the format's default), the KV cache dtype (the runtime's), the placement (the
    runtime's own fitting)."""
    notes = []
    if runtime is None:
        notes.append(f"runtime {rt.id}: the default for this format (--runtime to choose)")
    if kv_dtype is None:
        notes.append(f"KV cache {kv}: {rt.id}'s default (--kv-dtype)")
    if placement is None or (isinstance(placement, str) and placement == "auto"):
        notes.append(f"placement: what {rt.id}'s own fitting picks (--placement to fix it)")
    return notes
