"""``moesim validate``: predictions against published measurements (../shared/validation format).

Each CSV row describes a measured run (model, quant, machine parts, runtime, placement, parallel
layout, depth, batch, MTP). :func:`build` turns it into the configuration ``simulate`` needs —
filling fields the row leaves empty with documented platform defaults (:data:`DEFAULTS`) — or
says why it cannot. :func:`validate` predicts decode tok/s per sequence (analytic path) and
prefill tok/s, and summarises |error| overall and per class (the id prefix), next to a naive
roofline (active weight bytes per token / peak bandwidth) so the gain is visible.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..spec import quants as Q
from ..engine.lower import routing as R_routing
from ..engine.lower.decode_model import head_read_bytes
from ..spec import routing as R
from ..spec.runtimes import runtime as get_runtime
from ..engine.codes import MODES, POLICIES
from ..engine.decode import run
from ..engine.lower.decode_model import lower_model
from ..engine.lower.machine import lower_machine
from ..engine.lower.memory import configure
from ..engine.prefill import prefill
from .consistency import capacities, check_prediction, check_record
from .intervals import device_family
from .records import default_notes, record
from .row_notes import (Skip, delta_net_fused, flash_month, graph_max_batch, graphs_min_cc, nax_gather_block,
                        note_settings, runtime_for)
from .resolve import memory_of, resolve
from .speculation import accepted_per_step, default_acceptance
from .._catalog import load as _load_catalog
from ..errors import MoesimError
from ..spec.hardware import GB, Machine, catalog_cpu_id, machine as make_machine
from ..spec.limits import ARCH_BOUNDS, MAX_BATCH, MAX_DRAFTS
from ..ingest import model as get_model
from ..spec.limits import check_context


REQUIRED_COLUMNS = ("id", "quality", "model", "quant", "runtime", "gpu", "gpus", "placement", "batch",
                    "decode_tok_s", "prefill_tok_s", "source")
CLASSES = ("DC", "KT", "LC", "AP", "CPU", "REF")

# What a row leaves empty, and what we assume instead (each reported in the row's `assumed`).
DEFAULTS = {
    "channels_desktop": 2,          # desktop platforms populate 2 channels (hardware.md §4)
    "channels_server": 8,           # server sockets of the rows' era: 8 DDR5 channels (hardware.md §4)
    "host_mem_gb": 2048,            # the run was measured, so its weights fit RAM: no storage paging
    "context": 512,                 # depth when neither depth nor prompt is given
    "mtp_acceptance": 0.85,         # a family without a measurement (catalog/speculation.toml): DeepSeek-V3's
    "stream_fraction": 0.85,        # a measured STREAM/MLC bandwidth is ~85 % of the DRAM peak (assumed)
}
_SERVER_CPU = re.compile(r"xeon|epyc|threadripper|grace", re.I)
# a CPU build limited to AVX2 ("July 2024; AVX2"): no AVX-512 / AMX kernels whatever the CPU has
_AVX2_BUILD_NOTE = re.compile(r"\bAVX2\b")


@dataclass
class RowConfig:
    """Everything ``simulate`` needs for one row, plus what was assumed."""

    row: dict
    model: str
    quant: str
    machine: Machine
    runtime: str | None
    placement: str | None
    parallel: str | None
    context: int
    prompt: int
    batch: int
    mtp: int
    kv_dtype: str | None
    assumed: list = field(default_factory=list)
    prompt_depth: int = 0           # tokens already cached when the prompt was processed (llama-bench -d)
    ubatch: int = 0                 # physical batch the notes state (llama.cpp -ub); 0: the runtime's default
    kt_threshold: int = 0           # ktransformers' GPU prefill threshold the notes state; 0: the profile's
    kt_chunk: int = 0               # ktransformers' chunked-prefill size the notes state; 0: the profile's
    decode_threads: int = 0         # threads of the decode run when the notes give it apart from the prompt's
    no_flash: bool = False          # the notes say flash attention was off: CPU attention runs as mul_mat
    delta_net_fused: bool | None = None  # the build's Gated DeltaNet recurrence fused or not (None: the profile's)
    graph_max_batch: int | None = None   # the most tokens per step the build replayed as a CUDA graph (None: profile's)
    graphs_min_cc: float | None = None   # the build replayed CUDA graphs only from this compute capability (None: profile's)
    nax_gather_block: float | None = None  # MLX's M5 expert gather block of the run's date (None: profile's)
    repacked_cpu_weights: bool = False   # ik -rtr: CPU weights repacked, so large batches are not offloaded
    swa_full: bool = False               # llama.cpp --swa-full: sliding-window layers keep (and a GPU walks) all


def load_rows(path) -> list:
    """The rows of a validation CSV, checked for the columns this module reads."""
    path = os.fspath(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            # a short row leaves None in its last columns, a long one puts its extras under None
            rows = [{k: v if isinstance(v, str) else "" for k, v in r.items() if k is not None} for r in reader]
            header = reader.fieldnames or []
    except OSError as exc:
        raise MoesimError(f"cannot read {path}: {exc.strerror}", "data") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise MoesimError(f"{path} is not a readable CSV ({exc})", "data") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise MoesimError(f"{path} lacks column(s) {', '.join(missing)} (see validation/README.md)", "data")
    return rows


def row_class(row: dict) -> str:
    return row["id"].split("-", 1)[0]


_MAX_COUNT = 2**40      # integer columns (GPUs, channels, tokens, batch): far above any measured run
_MAX_BW_GBS = 1e5       # a measured host bandwidth: 100 TB/s is far above any DRAM system


def _num(row, col, kind=float, maximum: int = _MAX_COUNT):
    v = (row.get(col) or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise Skip(f"column {col} is not a number: {v!r}") from None
    if not math.isfinite(x):
        raise Skip(f"column {col} is not a finite number: {v!r}")
    if kind is int and not 0 <= x <= maximum:
        raise Skip(f"column {col} must be a count in [0, {maximum:,}], got {v!r}")
    return int(x) if kind is int else x


def measurements(row) -> tuple:
    """(decode tok/s, prefill tok/s) a row measured (None where not given); :class:`Skip` if unreadable."""
    return _num(row, "decode_tok_s"), _num(row, "prefill_tok_s")


def _cpu_id(name: str) -> str | None:
    """Catalog CPU id for a CPU named in the data ("Xeon Gold 6454S" -> xeon-gold-6454s)."""
    return catalog_cpu_id(name) if name else None


def _parallel_for(row: dict) -> str | None:
    par = (row.get("parallel") or "").strip() or None
    if par and ("disagg" in par or re.match(r"^ep(\d+)", par) and int(re.match(r"^ep(\d+)", par).group(1)) > 8):
        raise Skip(f"parallel layout {par}: multi-node expert parallelism / prefill-decode disaggregation "
                   "is not modelled")
    return par


def _host_parts(row: dict, cpu: str | None, hw: dict, gpu: bool, assumed: list) -> dict:
    """machine() keywords for a discrete host: memory part x channels, CPU, sockets, cores, RAM, PCIe."""
    kw: dict = {}
    part = (row.get("host_mem") or "").strip().lower()
    cpu_info = hw["cpu"].get(cpu or "", {})
    if not part:
        part = cpu_info.get("memory") or "ddr5"
        assumed.append(f"host memory type not stated: {part}")
    channels = _num(row, "host_channels", int) or cpu_info.get("channels")
    if not channels:
        server = bool(_SERVER_CPU.search(row.get("host_cpu", ""))) or (_num(row, "host_sockets", int) or 1) > 1
        channels = DEFAULTS["channels_server" if server else "channels_desktop"]
        assumed.append(f"memory channels not stated: {channels} ({'server' if server else 'desktop'} platform)")
    kw["host"] = f"{part}x{channels}"
    if cpu:
        kw["cpu"] = cpu
    if row.get("host_sockets"):
        kw["sockets"] = _num(row, "host_sockets", int)
    if row.get("host_cores"):
        kw["cores"] = _num(row, "host_cores", int)
    host_gb = _num(row, "host_mem_gb")
    if not host_gb:
        host_gb = DEFAULTS["host_mem_gb"]
        assumed.append("host RAM not stated: enough that weights do not page from storage")
    kw["host_mem_gb"] = host_gb
    if row.get("pcie") and gpu:
        kw["pcie"] = row["pcie"].strip().lower()
    return kw


def _machine_for(row: dict, notes: str, assumed: list) -> Machine:
    """The machine a row's GPU and host columns describe (defaults recorded in *assumed*)."""
    gpu = (row["gpu"] or "").strip().lower()
    gpus = _num(row, "gpus", int)
    hw = _load_catalog("hardware")
    kw: dict = {}
    unified = gpu in hw["unified"]
    if gpu and gpu != "none":
        kw["gpu"] = gpu
        if not unified:
            kw["gpus"] = gpus if gpus else 1
        elif gpus and gpus > 1:
            raise Skip(f"{gpus} networked {gpu} machines (multi-machine) are not modelled")
        if row.get("gpu_mem_gb") and not unified:
            kw["gpu_mem_gb"] = _num(row, "gpu_mem_gb")
    if unified:
        pool = _num(row, "host_mem_gb") or _num(row, "gpu_mem_gb")
        if pool:
            kw["gpu_mem_gb"] = pool
    else:
        kw.update(_host_parts(row, _cpu_id(row.get("host_cpu", "")), hw, bool(kw.get("gpu")), assumed))
    if not kw:
        raise Skip("no GPU and no host memory described")
    try:
        mach = make_machine(**kw)
    except MoesimError as exc:
        raise Skip(str(exc)) from None
    if _AVX2_BUILD_NOTE.search(notes) and any(i.startswith("avx512") or i == "amx" for i in mach.cpu_isa):
        mach = dataclasses.replace(mach, cpu_isa=tuple(i for i in mach.cpu_isa
                                                       if not (i.startswith("avx512") or i == "amx")))
        assumed.append("an AVX2 build (notes): no AVX-512 / AMX kernels")
    measured_bw = _num(row, "measured_host_bw_gbs")
    if measured_bw is not None and not 0 <= measured_bw <= _MAX_BW_GBS:
        raise Skip(f"column measured_host_bw_gbs must be in [0, {_MAX_BW_GBS:g}] GB/s, got {measured_bw:g}")
    if measured_bw and not mach.unified:
        mach = dataclasses.replace(mach, host_bw_gbs=measured_bw / DEFAULTS["stream_fraction"])
        assumed.append(f"host bandwidth from the measured {measured_bw:g} GB/s (STREAM ~"
                       f"{DEFAULTS['stream_fraction']:.0%} of peak)")
    return mach


def build(row: dict) -> RowConfig:
    """The configuration a row describes (raises :class:`Skip` with the reason when it cannot)."""
    assumed = []
    notes = row.get("notes", "") or ""
    runtime = runtime_for(row, notes, assumed)
    par = _parallel_for(row)
    try:
        m = get_model(row["model"])
        Q.resolve(row["quant"], m)
    except MoesimError as exc:
        raise Skip(str(exc)) from None
    mach = _machine_for(row, notes, assumed)
    placement = (row.get("placement") or "").strip() or None
    if placement == "all-gpu" and mach.unified:
        placement = "unified"
    depth = _num(row, "depth_tokens", int, ARCH_BOUNDS["max_position_embeddings"])
    prompt = _num(row, "prompt_tokens", int, ARCH_BOUNDS["max_position_embeddings"])
    context = depth if depth else (prompt or DEFAULTS["context"])
    if not depth:
        assumed.append(f"decode depth not stated: {context} tokens")
    batch = _num(row, "batch", int, MAX_BATCH) or 1
    mtp = _num(row, "mtp", int, MAX_DRAFTS) or 0
    if mtp and not m.mtp_layers:
        raise Skip(f"{m.id} has no MTP modules but the row used {mtp} drafts")
    kv = (row.get("kv_dtype") or "").strip() or None
    try:    # fit's and simulate's context rule; a measured run beyond the trained maximum is kept, noted
        context, beyond = check_context(max(1, context), m, allow_beyond_max_context=True)
    except MoesimError as exc:
        raise Skip(str(exc)) from None
    assumed += beyond
    # depth_tokens is the decode depth; server logs put it at about the prompt length (the prompt was
    # prefilled from empty). A depth beyond the prompt is llama-bench -d: the prompt too ran on top of it.
    prompt_depth = depth if (depth and prompt and depth > prompt) else 0
    return RowConfig(row=row, model=m.id, quant=row["quant"], machine=mach, runtime=runtime, placement=placement,
                     parallel=par, context=max(1, context), prompt=max(1, prompt or context or 512), batch=batch,
                     mtp=mtp, kv_dtype=kv, assumed=assumed, prompt_depth=prompt_depth,
                     delta_net_fused=delta_net_fused(m, row, notes, runtime, assumed),
                     graph_max_batch=graph_max_batch(row, notes, runtime, batch * (1 + mtp), assumed),
                     graphs_min_cc=graphs_min_cc(row, notes, runtime, mach.compute_capability, assumed),
                     nax_gather_block=nax_gather_block(row, notes, runtime, assumed),
                     **note_settings(notes, runtime, assumed, flash_month(row, notes, runtime)))


# ------------------------------------------------------------------------------- prediction
@dataclass
class Prepared:
    """A row lowered once; :meth:`predict` re-evaluates it for any runtime parameters (calibration)."""

    cfg: RowConfig
    m: object
    low: object
    p: object
    rt: object
    dm: dict
    rtab: dict
    cols: dict
    mem: object
    roofline_tok_s: float
    kernel_mix: object

    def predict(self, rt=None) -> tuple:
        """(decode tok/s per sequence, prefill tok/s) with runtime ``rt`` (default: as built)."""
        res, pf, _ = self.steps(rt)
        return float(res["accepted"][0] / res["step_mean"][0]), pf

    def steps(self, rt=None) -> tuple:
        """(the decode step's kernel result, prefill tok/s, time to first token) with runtime ``rt``."""
        rt = rt or self.rt
        hw = lower_machine(self.cfg.machine, rt, self.p, self.kernel_mix)
        hw_dec = hw
        if self.cfg.decode_threads:
            # each decode thread streams at most core_bw_gbs: the run's own thread count caps host bandwidth
            mach = dataclasses.replace(self.cfg.machine, cores=self.cfg.decode_threads)
            hw_dec = lower_machine(mach, rt, self.p, self.kernel_mix)
        res = run(self.dm, hw_dec, self.rtab, self.cols)
        pf, ttft = prefill(self.m, self.dm, hw, self.rtab, rt, self.cfg.prompt, 1, depth=self.cfg.prompt_depth)
        return res, pf, ttft


def row_decode_settings(cfg: RowConfig, d) -> dict:
    """The runtime's decode parameters the row's notes or date set (no flash attention: its CPU attention path
    and rates; its build's CUDA-graph and delta-net behaviour; -rtr's repacked CPU weights, never offloaded;
    --swa-full; ktransformers' prefill threshold and chunk). calibrate keeps them over the priors it varies."""
    out = {}
    if cfg.no_flash:
        out["cpu_fa_query_rows"] = 0.0
        out["cpu_attn_eff"], out["cpu_prefill_attn_eff"] = d.cpu_attn_eff_nofa, d.cpu_prefill_attn_eff_nofa
    if cfg.graph_max_batch is not None:
        out["graph_max_batch"] = cfg.graph_max_batch
    if cfg.graphs_min_cc is not None:
        out["graphs_min_cc"] = cfg.graphs_min_cc
    if cfg.nax_gather_block is not None:
        out["moe_half_tokens_matrix"] = cfg.nax_gather_block
    if cfg.delta_net_fused is not None:
        out["delta_net_ops"] = 0.0 if cfg.delta_net_fused else d.delta_net_unfused_ops
    if cfg.repacked_cpu_weights:
        out["op_offload_min_batch"] = 0
    if cfg.swa_full:
        out["swa_full"] = True
    if cfg.kt_threshold:
        out["layerwise_prefill_tokens"] = cfg.kt_threshold
    if cfg.kt_chunk:
        out["layerwise_chunk_tokens"] = cfg.kt_chunk
    return out


def prepare(cfg: RowConfig, calibrated: bool = True) -> Prepared:
    m = get_model(cfg.model)
    try:
        rt = get_runtime(cfg.runtime, calibrated=calibrated, model=cfg.model) if cfg.runtime else None
        if rt is not None and cfg.ubatch:
            rt = dataclasses.replace(rt, ubatch=cfg.ubatch)
        if rt is not None:
            rt = dataclasses.replace(rt, decode=dataclasses.replace(rt.decode, **row_decode_settings(cfg, rt.decode)))
        q, rt, kv, low, p = resolve(m, cfg.quant, cfg.machine, rt, cfg.placement, cfg.context, cfg.batch,
                                    cfg.kv_dtype, cfg.mtp, cfg.parallel)
        mem_cfg = configure(m, low, cfg.machine, rt, p, cfg.context, cfg.batch, kv, cfg.mtp)
        mem = memory_of(m, low, cfg.machine, rt, p, cfg.context, cfg.batch, kv, cfg.mtp, cfg=mem_cfg)
    except MoesimError as exc:
        raise Skip(str(exc)) from None
    cfg.assumed += [a for a in default_notes(rt, kv, cfg.runtime, cfg.kv_dtype, cfg.placement) if a not in cfg.assumed]
    check_record(record(m, q, kv, cfg.context, cfg.batch, p, rt, cfg.machine, mem, cfg.mtp), capacities(mem_cfg),
                 m.max_context, beyond_ok=cfg.context > m.max_context)
    tps = 1 + cfg.mtp
    rtab = R_routing.lower(R_routing.RoutingDims.of(m), R.profile(None, family=m.family), 0)
    dm = lower_model(m, low, p, cfg.machine, rt, cfg.context, kv, cfg.batch * tps, mem.by_class, mem.tier,
                     routing=rtab)
    cols = dict(batch=[cfg.batch], tokens_per_step=[tps], drafts=[cfg.mtp],
                accepted=[accepted_per_step(cfg.mtp, _row_acceptance(m, cfg))], steps=[1], warmup=[0],
                policy=[POLICIES["lru"]], mode=[MODES["analytic"]], seed=[0], index=[0])
    return Prepared(cfg=cfg, m=m, low=low, p=p, rt=rt, dm=dm, rtab=rtab, cols=cols, mem=mem,
                    roofline_tok_s=roofline(m, low, p, cfg.machine), kernel_mix=Q.kernel_mix(m, q))


def _row_acceptance(m, cfg: RowConfig) -> float:
    """A row's MTP acceptance: its family's measured one (catalog/speculation.toml), else DEFAULTS'."""
    if not cfg.mtp:
        return 0.0
    try:
        acc = default_acceptance(m.family, cfg.mtp)
        rate, note = acc.rate, f"MTP acceptance {acc.rate:g}: {acc.source.split(':')[0]}"
    except MoesimError:
        rate = DEFAULTS["mtp_acceptance"]
        note = f"MTP acceptance {rate:g}: no measurement for {m.family}, DeepSeek-V3's"
    if note not in cfg.assumed:
        cfg.assumed.append(note)
    return rate


def roofline(m, low, p, mach: Machine) -> float:
    """The one-line estimate peers use: active weight bytes per token / peak bandwidth of where
    they live (GPU memory, summed over GPUs; host DRAM for CPU experts), no batch, no overheads."""
    k = m.top_k
    gpu_bytes = host_bytes = 0.0
    n_gpus = max(1, mach.n_gpus)
    for l in range(m.n_layers):
        dense = low.attn[l] + low.router[l] + low.shared[l] + low.dense[l]
        experts = k * low.expert_one[l] if low.n_experts[l] else 0.0
        cpu_layer = p.kind == "cpu-only" or (p.kind == "layers-gpu" and l < m.n_layers - p.arg)
        cpu_experts = cpu_layer or p.kind in ("experts-cpu", "offload-cache") or (p.kind == "n-cpu-moe" and l < p.arg)
        if p.kind == "gpu-experts" and low.n_experts[l]:
            frac = min(1.0, p.arg / low.n_experts[l])
            gpu_bytes += experts * frac
            host_bytes += experts * (1 - frac)
            experts = 0.0
        if cpu_layer:
            host_bytes += dense + experts
        elif cpu_experts:
            gpu_bytes += dense
            host_bytes += experts
        else:
            gpu_bytes += dense + experts
    gpu_bytes += head_read_bytes(m, low)       # a tied head reads the embedding matrix
    if mach.unified or mach.n_gpus == 0:
        bw = mach.host_bw_gbs if mach.n_gpus == 0 else mach.gpu_bw_gbs
        return bw * GB / (gpu_bytes + host_bytes)
    if p.kind == "offload-cache":
        t = gpu_bytes / (mach.gpu_bw_gbs * GB * n_gpus) + host_bytes / (max(mach.pcie_gbs, 1e-3) * GB)
    else:
        t = gpu_bytes / (mach.gpu_bw_gbs * GB * n_gpus) + host_bytes / (mach.host_bw_gbs * GB)
    return 1.0 / t


# ------------------------------------------------------------------------------- report
def _err(pred, meas):
    return None if (pred is None or meas is None or meas <= 0) else pred / meas - 1.0


def _stats(errs: list) -> dict:
    a = np.abs(np.array([e for e in errs if e is not None], dtype=float))
    if a.size == 0:
        return {"n": 0, "median_abs_pct_err": None, "p90_abs_pct_err": None}
    return {"n": int(a.size), "median_abs_pct_err": float(100 * np.median(a)),
            "p90_abs_pct_err": float(100 * np.percentile(a, 90))}


@dataclass
class RowPrediction:
    """What :func:`predict_row` gives for one row: the decode figure compared with the measurement
    (serve-sim's for a serving row, else the isolated step's), prefill, the step's decode, serve-sim's
    record (None for a row that is not a serving benchmark)."""

    decode: float
    prefill: float
    step_decode: float
    serving: "dict | None"


def predict_row(pr: Prepared, rt=None, serving_requests: "int | None" = None) -> RowPrediction:
    """The prediction of one prepared row with runtime *rt* (default: as built): the one function
    ``validate`` and ``calibrate`` both use. A serving row (:mod:`.serving_rows`) is run through serve-sim
    with *serving_requests* requests (default serve-sim's closed-loop count)."""
    from .serving_rows import serving_prediction
    rt = rt or pr.rt
    step, pf = pr.predict(rt)
    serving = serving_prediction(pr, rt, serving_requests)
    dec = serving["decode"] if serving and serving.get("decode") is not None else step
    return RowPrediction(decode=dec, prefill=pf, step_decode=step, serving=serving)


def predict_measured(row: dict, calibrated: bool = True) -> tuple:
    """(measured decode, measured prefill, RowConfig, Prepared, RowPrediction) of one row; raises
    Skip where the row has nothing to predict or describes what moesim does not model."""
    meas_d, meas_p = measurements(row)
    if meas_d is None and meas_p is None:
        raise Skip("no decode or prefill measurement (aggregate only)")
    cfg = build(row)
    pr = prepare(cfg, calibrated=calibrated)
    pred = predict_row(pr)
    check_prediction(pred.step_decode, pred.prefill)
    return meas_d, meas_p, cfg, pr, pred


def evaluate_rows(rows: list, calibrated: bool = True) -> tuple:
    """(prepared rows, per-row records, skipped [{id, reason}])."""
    prepared, records, skipped = [], [], []
    for row in rows:
        try:
            meas_d, meas_p, cfg, pr, pred = predict_measured(row, calibrated)
        except Skip as exc:
            skipped.append({"id": row["id"], "reason": str(exc)})
            continue
        dec, pf, step_dec, serving = pred.decode, pred.prefill, pred.step_decode, pred.serving
        rec = {"id": row["id"], "class": row_class(row), "quality": row["quality"], "model": cfg.model,
               "quant": cfg.quant, "runtime": pr.rt.id, "placement": str(pr.p), "batch": cfg.batch,
               "context": cfg.context, "decode_measured": meas_d, "decode_predicted": dec if meas_d else None,
               "decode_err": _err(dec, meas_d) if meas_d else None,
               "roofline_predicted": pr.roofline_tok_s if meas_d else None,
               "roofline_err": _err(pr.roofline_tok_s, meas_d) if meas_d else None,
               "prefill_measured": meas_p, "prefill_predicted": pf if meas_p else None,
               "prefill_err": _err(pf, meas_p) if meas_p else None, "source": row["source"],
               "assumed": cfg.assumed, "serving": serving, "device_family": device_family(cfg.machine, pr.p)}
        if serving is not None:
            agg = _num(row, "aggregate_tok_s")
            rec.update(decode_step_predicted=step_dec, decode_step_err=_err(step_dec, meas_d) if meas_d else None,
                       aggregate_measured=agg, aggregate_predicted=serving.get("aggregate"),
                       aggregate_err=_err(serving.get("aggregate"), agg))
        prepared.append(pr)
        records.append(rec)
    return prepared, records, skipped


def _serving_summary(head: list) -> dict:
    rows = [r for r in head if r.get("serving")]
    return {"decode": _stats([r["decode_err"] for r in rows]),
            "decode_as_batch_step": _stats([r["decode_step_err"] for r in rows]),
            "aggregate": _stats([r["aggregate_err"] for r in rows]),
            "rows": [r["id"] for r in rows],
            "note": "rows benchmarked at a stated concurrency, predicted by serve-sim (decode_as_batch_step: the "
                    "same rows as one isolated decode step of batch = concurrency, the prediction before serve-sim)"}


def summarise(records: list, skipped: list) -> dict:
    """Headline numbers over quality A+B rows (C rows counted separately), per class and overall."""
    head = [r for r in records if r["quality"] in ("A", "B")]
    by_class = {}
    for c in CLASSES:
        rows = [r for r in head if r["class"] == c]
        if rows:
            by_class[c] = {"decode": _stats([r["decode_err"] for r in rows]),
                           "prefill": _stats([r["prefill_err"] for r in rows]),
                           "roofline_decode": _stats([r["roofline_err"] for r in rows])}
    dec = _stats([r["decode_err"] for r in head])
    fam = [r.get("device_family") or "unknown" for r in head]
    by_family = {f: {"decode": _stats([r["decode_err"] for r, g in zip(head, fam) if g == f]),
                     "prefill": _stats([r["prefill_err"] for r, g in zip(head, fam) if g == f])}
                 for f in sorted(set(fam))}
    return {
        "median_abs_pct_err": dec["median_abs_pct_err"], "p90_abs_pct_err": dec["p90_abs_pct_err"],
        "decode": dec, "prefill": _stats([r["prefill_err"] for r in head]),
        "roofline_decode": _stats([r["roofline_err"] for r in head]), "by_class": by_class,
        "by_device_family": by_family, "serving": _serving_summary(head),
        "quality_c": {"decode": _stats([r["decode_err"] for r in records if r["quality"] == "C"]),
                      "note": "quality C rows (anecdotal) are reported here, not in the headline"},
        "rows_evaluated": len(records), "rows_skipped": skipped,
    }


def validate(path, calibrated: bool = True) -> dict:
    rows = load_rows(path)
    _, records, skipped = evaluate_rows(rows, calibrated)
    return {"summary": summarise(records, skipped), "rows": records}
