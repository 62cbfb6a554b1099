"""``moesim validate --explain ID``: why one validation row is predicted as it is.

One row's configuration as :func:`~.validate.build` makes it (with every assumption), the measured and
predicted decode / prefill with the error (the same prediction :func:`~.validate.evaluate_rows` gives),
the decode step's time per token by resource and by phase (``simulate``'s breakdown,
:func:`~.simulate.breakdown_of`), the bytes each memory tier and link moves per token, and the decode
parameters of the row's runtime: each with its value, its sourced prior (runtimes.toml) and where the
value came from (calibration.toml [params] or [runtime.<family>], or the prior).
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from importlib import resources

import numpy as np

from .._catalog import load as _load_catalog
from ..engine.codes import EXP_CPU
from ..engine.decode import LINKS
from ..engine.lower.machine import backend_terms, kernel_clock_scale, lower_machine
from ..engine.prefill import prefill_seconds
from ..errors import MoesimError
from ..spec.runtimes import FAMILIES, calibration, decode_priors
from .simulate import breakdown_of
from .validate import Skip, load_rows, predict_measured, row_class, _err

_KEY_COMMENT = re.compile(r"^\s*([A-Za-z0-9_]+)\s*=\s*[^#]*#\s*(.*)$")
_TABLE = re.compile(r"^\s*\[([^\]]+)\]\s*$")


def _find_row(rows: list, row_id: str) -> dict:
    for row in rows:
        if row["id"] == row_id:
            return row
    ids = [r["id"] for r in rows]
    close = difflib.get_close_matches(str(row_id), ids, n=5, cutoff=0.5)
    hint = f"; close ids: {', '.join(close)}" if close else f"; ids run {ids[0]} .. {ids[-1]}" if ids else ""
    raise MoesimError(f"no row with id {row_id!r} in the measurements{hint}", "--explain")


def _prior_sources(runtime_id: str) -> dict:
    """{decode parameter: the comment that sources its prior} from runtimes.toml: the runtime's own
    [runtimes."<id>".decode] table (and its base's) over the [decode] defaults."""
    text = resources.files("moesim.catalog").joinpath("runtimes.toml").read_text(encoding="utf-8")
    table, by_table = "", {}
    for line in text.splitlines():
        t = _TABLE.match(line)
        if t:
            table = t.group(1).replace('"', "")
            continue
        kc = _KEY_COMMENT.match(line)
        if kc:
            by_table.setdefault(table, {})[kc.group(1)] = kc.group(2).strip()
    chain, key, rts = [], runtime_id, _load_catalog("runtimes")["runtimes"]
    while key and key not in chain:
        chain.append(key)
        key = rts.get(key, {}).get("base")
    out = dict(by_table.get("decode", {}))
    for rid in reversed(chain):
        out.update({k: f"{v} (runtimes.toml [runtimes.{rid}.decode])"
                    for k, v in by_table.get(f"runtimes.{rid}.decode", {}).items()})
    return out


def parameters(rt, calibrated: bool = True) -> list:
    """The decode parameters of runtime *rt*: [{name, value, prior, source, prior_source}], the calibrated
    ones first. ``source`` says which table set the value."""
    prior = decode_priors(rt.id)
    family = FAMILIES.get(rt.id, rt.id)
    cal = calibration() if calibrated else {}
    glob, own = cal.get("params", {}), cal.get("runtime", {}).get(family, {})
    support = cal.get("support", {})
    notes = _prior_sources(rt.id)
    out = []

    def fitted_on(key: str) -> str:
        s = support.get(key)
        return f", fitted on {s['rows']} rows of {s['sources']} sources" if s else ""

    for name, value in dataclasses.asdict(rt.decode).items():
        if name in own:
            src = f"calibration.toml [runtime.{family}]{fitted_on(f'{family}.{name}')}"
        elif name in glob:
            src = f"calibration.toml [params]{fitted_on(name)}"
        elif name in prior and prior[name] == value:
            src = "prior (runtimes.toml)"
        else:
            src = rt.launch or "launch setting / row"
        out.append({"name": name, "value": value, "prior": prior.get(name), "source": src,
                    "prior_source": notes.get(name, "")})
    out.sort(key=lambda p: not p["source"].startswith("calibration"))
    return out


def _configuration(cfg, pr) -> dict:
    mach = cfg.machine
    return {"model": cfg.model, "quant": cfg.quant, "machine": str(getattr(mach, "id", "") or mach),
            "runtime": pr.rt.id, "placement": str(pr.p), "parallel": cfg.parallel, "context": cfg.context,
            "prompt": cfg.prompt, "prompt_depth": cfg.prompt_depth, "batch": cfg.batch, "mtp": cfg.mtp,
            "kv_dtype": cfg.kv_dtype, "assumed": list(cfg.assumed)}


def explain(path, row_id: str, calibrated: bool = True) -> dict:
    """Everything that sets row *row_id*'s prediction (see the module docstring); a row that cannot be
    predicted gives {id, source, source_url, skipped: the reason}."""
    row = _find_row(load_rows(path), row_id)
    head = {"id": row["id"], "class": row_class(row), "quality": row.get("quality", ""),
            "source": row.get("source", ""), "source_url": row.get("source_url", "")}
    try:
        meas_d, meas_p, cfg, pr, pred = predict_measured(row, calibrated)
    except Skip as exc:
        return {**head, "skipped": str(exc)}
    res, pf, ttft = pr.steps()
    acc = float(res["accepted"][0])
    per_token = cfg.batch * acc
    return {**head, "configuration": _configuration(cfg, pr),
            "decode": {"measured": meas_d, "predicted": pred.decode, "err": _err(pred.decode, meas_d),
                       "step_predicted": pred.step_decode, "roofline": pr.roofline_tok_s,
                       "by_serve_sim": pred.serving is not None},
            "prefill": {"measured": meas_p, "predicted": pf, "err": _err(pf, meas_p), "ttft_s": ttft,
                        "by_phase_s": _prefill_phases(cfg, pr)},
            "breakdown": breakdown_of(res, 0),
            "bytes_per_token": {name: float(res["bytes"][0][k]) / per_token for k, name in enumerate(LINKS)},
            "distinct_experts_per_step": float(res["distinct"][0]),
            "serving": pred.serving, "rates": _rates(cfg, pr), "parameters": parameters(pr.rt, calibrated)}


def _prefill_phases(cfg, pr) -> dict:
    """The prompt's seconds by phase (engine.prefill.PREFILL_PHASES), as the prediction computes them."""
    parts: dict = {}
    hw = lower_machine(cfg.machine, pr.rt, pr.p, pr.kernel_mix)
    prefill_seconds(pr.m, pr.dm, hw, pr.rtab, pr.rt, cfg.prompt, cfg.prompt_depth, parts=parts)
    return parts


def _rates(cfg, pr) -> dict:
    """The lowered rates that set prefill and decode (engine/lower/machine.py), and the llama.cpp backend's
    terms on the card (runtimes.toml [backends.*]): which peak its GEMMs use, the MUL_MAT_ID and decode
    shares it measurably reaches."""
    hw = lower_machine(cfg.machine, pr.rt, pr.p, pr.kernel_mix)
    hw_tables = _load_catalog("hardware")
    g = hw_tables["unified" if cfg.machine.unified else "gpu"].get(cfg.machine.gpu or "", {})
    out = {k: float(hw[k]) for k in ("gpu_bw", "prefill_gemm_flops", "prefill_expert_flops", "prefill_attn_flops",
                                     "prefill_moe_half_tokens", "prefill_weight_pass_tokens", "prefill_moe_tile_tokens") if k in hw}
    cpu_attention = not np.asarray(pr.dm["attn_on_gpu"]).all()
    if cpu_attention or (np.asarray(pr.dm["expert_mode"]) == EXP_CPU).any():
        # the CPU's rates where it runs part of the model: its matmuls and, for attention, its kernel's own
        keys = ("host_bw", "cpu_flops") + (("cpu_attn_flops", "cpu_prefill_attn_flops") if cpu_attention else ())
        out.update({k: float(hw[k]) for k in keys})
    # Apple chips run Metal's own path (machine.py _lower_unified): no backend table's terms, no clock scaling
    if not g or g.get("vendor") == "apple":
        return out
    if cfg.machine.n_gpus:
        # the GPU's kernel latencies (kernel_us, moe_layer_us) scaled to its clock (runtimes.toml kernel_ref_mhz)
        out["kernel_latency_x"] = kernel_clock_scale(pr.rt.decode, g)
    terms = backend_terms(pr.rt, g)
    if terms:
        out["backend"] = terms
    return out
