"""What ``moesim models | hardware | quants`` list: the catalog's ids with the fields worth a glance."""
from __future__ import annotations


def models() -> list:
    """One dict per catalog model: id, name, family, layers, experts, top-k, parameters, context, quant and
    the Hugging Face repo ids that name it."""
    from ..ingest import model
    from ..spec.models import hf_ids, model_ids
    rows = []
    for mid in model_ids():
        m = model(mid)
        total, active = m.param_counts()
        rows.append({"id": mid, "name": m.name, "family": m.family, "layers": m.n_layers,
                     "experts": m.n_experts, "top_k": m.top_k, "total_params": total, "active_params": active,
                     "max_context": m.max_context, "native_quant": m.native_quant,
                     "hf_ids": hf_ids(mid)})
    return rows


def hardware() -> tuple:
    """(ids per catalog section, the hardware catalog)."""
    from .. import _catalog
    from ..spec.hardware import hardware_ids
    return hardware_ids(), _catalog.load("hardware")


def quants() -> dict:
    """GGUF file types, checkpoint formats, KV dtypes and the ggml tensor types' block layouts."""
    from ..spec import quants as Q
    return {"gguf_ftypes": Q.ftype_ids(), "formats": Q.format_ids(), "kv_dtypes": Q.kv_dtype_ids(),
            "indexer_dtypes": Q.indexer_dtype_ids(), "indexer_dtype_default": Q.indexer_dtype(None),
            "ggml_types": {k: {"block": v["block"], "bytes": v["bytes"], "bpw": 8 * v["bytes"] / v["block"]}
                           for k, v in Q.ggml_types().items()}}
