"""``moesim inspect``: what an artifact describes, and what fitting it needs."""
from __future__ import annotations

import os

from ..errors import MoesimError
from ..spec.models import Model
from ..ingest.safetensors import STArtifact, _config_for, read_safetensors, safetensors_model
from ..ingest import artifact_kind
from ..ingest.gguf_model import read_gguf_model
from .kvterms import kv_terms, kv_terms_total


# ----------------------------------------------------------------------------------- inspect
def inspect(path: str | os.PathLike, overrides=(), n_gpu_layers: int | None = None, gpu: str = "CUDA0",
            context: int = 4096, kv_dtype: str | None = None, tensors: bool = False) -> dict:
    """What an artifact describes: architecture, bytes per tensor class and type, what fitting it needs,
    and (with llama.cpp ``-ot`` *overrides*) bytes per device."""
    from ..spec import quants as Q
    from ..spec.limits import check_count
    path = os.fspath(path)
    context = check_count(context, "context")
    kind = artifact_kind(path)
    notes = []
    index_info = None
    if kind == "safetensors":
        art = read_safetensors(path)
        try:
            base = _config_for(art.directory, None)
        except MoesimError as exc:
            if not art.tensors:
                raise
            return _inspect_tensors_only(path, art, str(exc))
        m = safetensors_model(art, base)
        index_info = _index_info(art, notes)
    elif kind == "gguf":
        m = read_gguf_model(path)
    else:
        m = Model.from_hf_config(path)
    q = Q.native_quant(m)
    if m.stored is None and kind != "gguf" and q.kind == "gguf":
        # a checkpoint described by its config: its own dtype, not llama.cpp's BF16 file rules
        q = Q.Quant(m.native_quant if m.native_quant in Q.format_ids() else "bf16", "format")
    entries = Q.assign(m, q, include_mtp=True)
    by_class, by_type, formats = _byte_tables(entries)
    total = sum(nb for _t, _typ, nb in entries)
    main = total - by_class.get("mtp", 0)
    kv = Q.canonical_kv_dtype(kv_dtype or ("f16" if q.is_gguf else "bf16"))
    terms = kv_terms(m, kv, context)
    per_token = sum(t["layers"] * t["bytes_per_token"] for t in terms if not t["window"])
    state = sum(t["bytes_at_context"] for t in terms if t["fixed_bytes"])
    kv_at = kv_terms_total(terms) - state
    out = {
        "path": path, "format": kind, "model": m.id, "architecture": _architecture(m), "quant": q.id,
        "exact": m.stored is not None,
        "files": list(m.stored.files) if m.stored else ([path] if kind != "safetensors" else []),
        "tensors": len(entries),
        "weights_bytes": main, "weights_bytes_by_class": by_class, "mtp_bytes": by_class.get("mtp", 0),
        "bytes_by_type": by_type, "formats_by_class": formats,
        "kv_dtype": kv, "kv_bytes_per_token": per_token, "state_bytes_per_sequence": state, "kv_terms": terms,
        "fit_needs": {"context": context, "weights_bytes": main, "kv_bytes": kv_at, "state_bytes": state,
                      "total_bytes": main + kv_at + state},
        "notes": notes,
    }
    if index_info:
        out["index"] = index_info
    if m.stored is not None and m.stored.metadata:
        out["metadata"] = m.stored.metadata
    if overrides or n_gpu_layers is not None:
        out["placement"] = _placement(m, q, overrides, n_gpu_layers, gpu, tensors)
    if tensors:
        out["tensor_table"] = [{"name": t.name, "type": typ, "shape": list(t.shape), "bytes": nb, "class": t.cls,
                                "layer": t.layer} for t, typ, nb in entries]
    return out


def _index_info(art: STArtifact, notes: list) -> dict | None:
    """A safetensors index's summary (None without an index); what it disagrees on goes to *notes*."""
    if art.index is None:
        return None
    if not art.tensors:
        notes.append(f"{art.shards_present} of {art.shards_total} shards present: per-tensor bytes are "
                     f"derived from the config's quantization, not read from headers")
    elif art.index.total_size is not None:
        hdr = sum(t.nbytes for t in art.tensors)
        if hdr != art.index.total_size:
            notes.append(f"index total_size {art.index.total_size} differs from the headers' {hdr} bytes")
    return {"path": art.index.path, "tensors": len(art.index.weight_map), "total_size": art.index.total_size,
            "shards": art.shards_total, "shards_present": art.shards_present}


def _byte_tables(entries) -> tuple:
    """(bytes per class, {type: tensors, bytes}, bytes per class per type) of assigned tensors."""
    by_class: dict = {}
    by_type: dict = {}
    formats: dict = {}
    for t, typ, nb in entries:
        by_class[t.cls] = by_class.get(t.cls, 0) + nb
        bt = by_type.setdefault(typ, {"tensors": 0, "bytes": 0})
        bt["tensors"] += 1
        bt["bytes"] += nb
        fc = formats.setdefault(t.cls, {})
        fc[typ] = fc.get(typ, 0) + nb
    return by_class, by_type, formats


def _architecture(m: Model) -> dict:
    params_total, params_active = m.param_counts()
    kinds: dict = {}
    for l in m.layers:
        kinds[l.attention.kind] = kinds.get(l.attention.kind, 0) + 1
    moe = m.moe_layers
    return {
        "family": m.family, "name": m.name, "layers": m.n_layers, "hidden": m.hidden, "vocab": m.vocab,
        "tie_embeddings": m.tie_embeddings, "max_context": m.max_context, "attention": kinds,
        "moe_layers": len(moe), "experts": m.n_experts, "top_k": m.top_k,
        "shared_experts": moe[0].ffn.n_shared if moe else 0, "mtp_layers": m.mtp_layers,
        "total_params": params_total, "active_params": params_active,
    }


def _placement(m: Model, q, overrides, n_gpu_layers, gpu: str, tensors: bool) -> dict:
    """Bytes per device as llama.cpp places the tensors under *overrides* / -ngl, and moesim's equivalent."""
    from ..spec.overrides import assign_devices, by_device, equivalent_placement
    placed = assign_devices(m, overrides, n_gpu_layers=n_gpu_layers, gpu=gpu, quant=q)
    equivalent = equivalent_placement(m, placed, gpu=gpu) if n_gpu_layers is None else None
    out = {"overrides": [str(o) for o in overrides], "n_gpu_layers": n_gpu_layers, "by_device": by_device(placed),
           "equivalent": str(equivalent) if equivalent is not None else None}
    if tensors:
        out["tensors"] = {t.name: dev for t, _typ, _nb, dev in placed}
    return out


def _inspect_tensors_only(path: str, art: STArtifact, why: str) -> dict:
    """A safetensors artifact without a config: tensors, dtypes and bytes only."""
    by_type: dict = {}
    for t in art.tensors:
        bt = by_type.setdefault(t.dtype, {"tensors": 0, "bytes": 0})
        bt["tensors"] += 1
        bt["bytes"] += t.nbytes
    return {"path": path, "format": "safetensors", "model": None, "architecture": None, "exact": True,
            "files": sorted({t.file for t in art.tensors}), "tensors": len(art.tensors),
            "weights_bytes": sum(t.nbytes for t in art.tensors), "weights_bytes_by_class": None,
            "bytes_by_type": by_type, "notes": [why]}
