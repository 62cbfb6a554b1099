"""Serving rows of the measurement corpus: benchmarks of a server under a fixed concurrency (their notes
say "concurrency N"), predicted by ``serve_sim`` at the row's concurrency, prompt and output lengths
instead of as one isolated decode step of batch N (``moesim validate`` reports them as their own line).

What a row states is read, nothing is fitted: the concurrency is the row's ``batch``; the prompt is
``prompt_tokens``; the output length comes from the notes ("OSL 2048", "512 in/1024 out"); a stated
TensorRT-LLM ``max_batch`` / ``max_num_tokens`` is per attention-DP rank (each rank schedules its own
share), so it is multiplied by the ranks. The measured decode figure is the source's per-user value
(1 / TPOT), or the aggregate over the concurrency where the notes say "decode = aggregate/batch".
"""
from __future__ import annotations

import re

from ..errors import MoesimError

SERVING_NOTE = re.compile(r"\bconcurrency\s+(\d+)")
_OSL_NOTE = re.compile(r"\bOSL\s+(\d+)")
_IN_OUT_NOTE = re.compile(r"\b(\d+)\s+in\s*/\s*(\d+)\s+out\b")
_MAX_BATCH_NOTE = re.compile(r"\bmax_batch\s+(\d+)")
_MAX_TOKENS_NOTE = re.compile(r"\bmax_num_tokens\s+(\d+)")
_AGGREGATE_NOTE = re.compile(r"decode\s*=\s*aggregate\s*/\s*batch")


def serving_workload(row: dict, batch: int, prompt: int, dp: int) -> "dict | None":
    """The serve-sim workload a row describes, or None when it is not a serving benchmark (no stated
    concurrency equal to its batch, or no output length)."""
    notes = row.get("notes", "") or ""
    conc = SERVING_NOTE.search(notes)
    if not conc or int(conc.group(1)) != batch or batch < 2:
        return None
    osl = _OSL_NOTE.search(notes)
    in_out = _IN_OUT_NOTE.search(notes)
    if osl:
        osl = int(osl.group(1))
    elif in_out:
        osl = int(in_out.group(2))
    else:
        return None
    seqs, tokens = _MAX_BATCH_NOTE.search(notes), _MAX_TOKENS_NOTE.search(notes)
    return dict(concurrency=batch, isl=prompt, osl=osl,
                max_num_seqs=int(seqs.group(1)) * dp if seqs else None,
                max_num_batched_tokens=int(tokens.group(1)) * dp if tokens else None,
                per_user=not _AGGREGATE_NOTE.search(notes))


def predict_serving(pr, wl: dict, rt=None, requests: "int | None" = None) -> dict:
    """serve-sim's decode (per user, or aggregate / concurrency as the row measured) and aggregate tok/s
    for a prepared validation row *pr* (validate.Prepared) under workload *wl*, with runtime *rt* (default
    the row's own) and *requests* requests (default serve-sim's closed-loop count)."""
    from .serve import serve_sim
    cfg = pr.cfg
    try:
        r = serve_sim(pr.m, cfg.machine, quant=cfg.quant, isl=wl["isl"], osl=wl["osl"], concurrency=wl["concurrency"],
                      runtime=rt or pr.rt, kv_dtype=cfg.kv_dtype, placement=cfg.placement, parallel=cfg.parallel,
                      max_num_batched_tokens=wl["max_num_batched_tokens"], max_num_seqs=wl["max_num_seqs"],
                      requests=requests)
    except MoesimError as exc:
        return dict(error=str(exc))
    decode = r.per_user_tok_s if wl["per_user"] else r.aggregate_tok_s / wl["concurrency"]
    return dict(decode=decode, aggregate=r.aggregate_tok_s, ttft_ms_p50=r.ttft_ms["p50"],
                tpot_ms_p50=r.tpot_ms["p50"], preemptions=r.scheduler["preemptions"],
                max_running=r.scheduler["max_running"], kv_blocks=r.kv["n_blocks"])


def serving_prediction(pr, rt=None, requests: "int | None" = None) -> "dict | None":
    """serve-sim's prediction for a prepared row that is a serving benchmark (its workload and
    :func:`predict_serving`'s figures), None for any other row."""
    rt = rt or pr.rt
    wl = serving_workload(pr.cfg.row, pr.cfg.batch, pr.cfg.prompt, max(1, rt.decode.data_parallel))
    if wl is None:
        return None
    return dict(workload=wl, **predict_serving(pr, wl, rt, requests))
