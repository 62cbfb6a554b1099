"""Plain-text renderings of ``moesim rank`` (one line per configuration) and ``moesim compare`` (one
column per compared item), from the same dicts their ``--json`` prints."""
from __future__ import annotations

GiB = 2**30


def _table(header: list, rows: list, right: set) -> list:
    """Lines of an aligned table: columns as wide as their widest cell; the columns in *right* (indices)
    right-aligned, the others left-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    out = []
    for cells in [header] + rows:
        out.append("  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    return out


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _gib(b) -> str:
    """Bytes as GiB, or MiB under one GiB (a router's few MiB stay visible); "-" for none."""
    if not b:
        return "-"
    return f"{b / GiB:.1f} GiB" if b >= GiB else f"{b / 2**20:.0f} MiB"


# ------------------------------------------------------------------------------ rank
_RANK_BY_LABEL = {"speed": "decode tok/s", "context": "max context", "quality": "bits per weight",
                  "params": "total parameters"}


def _interval(r: dict, name: str) -> str:
    lo, hi = r.get(f"{name}_lo"), r.get(f"{name}_hi")
    return "-" if lo is None or hi is None else f"{lo:.1f}-{hi:.1f}"


def rank_text(rows: list, machine: str, context: int, batch: int, by: str) -> str:
    """``rank``'s table: one line per model x quantization that runs on *machine* (its description),
    best first by *by*; interval columns only where the rows carry them."""
    head = [f"what runs on {machine}", f"context {context}, batch {batch}; sorted by {_RANK_BY_LABEL.get(by, by)}, "
                                       f"best first; placement as the runtime would fit it"]
    if not rows:
        return "\n".join(head + ["nothing runs on this machine at this context and batch (with these filters)"])
    intervals = [n for n in ("decode_tok_s", "prefill_tok_s") if any(f"{n}_lo" in r for r in rows)]
    header = ["#", "model", "quant", "runtime", "placement", "fits", "max ctx", "decode tok/s"]
    header += ["decode 80%"] * ("decode_tok_s" in intervals) + ["prefill tok/s"]
    header += ["prefill 80%"] * ("prefill_tok_s" in intervals) + ["bottleneck", "bpw", "params"]
    body = []
    for r in rows:
        cells = [r["rank"], r["model"], r["quant"], r["runtime"], r["placement"], r["fits"], r["max_context"],
                 _num(r["decode_tok_s"], ".1f")]
        cells += [_interval(r, "decode_tok_s")] * ("decode_tok_s" in intervals) + [_num(r["prefill_tok_s"], ".0f")]
        cells += [_interval(r, "prefill_tok_s")] * ("prefill_tok_s" in intervals)
        cells += [r["bottleneck"], _num(r["bits_per_weight"], ".2f"), f"{r['total_params'] / 1e9:.1f}B"]
        body.append(cells)
    right = {i for i, h in enumerate(header) if h in ("#", "max ctx", "bpw", "params") or "tok/s" in h or "80%" in h}
    return "\n".join(head + _table(header, body, right) + [f"{len(rows)} configurations"])


# ------------------------------------------------------------------------------ compare
def _item_headers(items: list) -> tuple:
    """(a header per item from what varies among them: model, quant, machine; legend lines naming
    the machines when they vary)."""
    vary = [k for k in ("model", "quant", "machine") if len({d[k] for d in items}) > 1]
    machines = list(dict.fromkeys(d["machine"] for d in items))
    legend = ([f"machine {i + 1}: {m}" for i, m in enumerate(machines)] if "machine" in vary
              else [f"machine: {machines[0]}"])
    headers = []
    for i, d in enumerate(items):
        parts = [d[k] if k != "machine" else f"machine {machines.index(d[k]) + 1}" for k in vary]
        headers.append(" ".join(parts) or f"item {i + 1}")
    return headers, legend


_TIER_LABEL = {"gpu": "GPU memory", "unified": "unified memory", "host": "host RAM", "storage": "storage"}


def _tier_rows(items: list) -> list:
    """Memory per tier (total, then each class held there by any item)."""
    rows = []
    tiers = list(dict.fromkeys(t for d in items for t in d["memory_by_tier"]))
    for t in tiers:
        rows.append((_TIER_LABEL.get(t, t), [_gib(d["memory_by_tier"].get(t, {}).get("total")) for d in items]))
        classes = list(dict.fromkeys(c for d in items for c, b in d["memory_by_tier"].get(t, {}).get("by_class", {}).items()
                                     if b))
        for c in classes:
            rows.append((f"  {c}", [_gib(d["memory_by_tier"].get(t, {}).get("by_class", {}).get(c)) for d in items]))
    return rows


def _nested_rows(items: list, title: str, get, fmt) -> list:
    """One row per key of a per-item dict (``get(d)``, or None where the item has none) that is
    non-zero in some item, under a *title* row."""
    keys = list(dict.fromkeys(k for d in items for k, v in (get(d) or {}).items() if v))
    if not keys:
        return []
    return [(title, [""] * len(items))] + [(f"  {k}", [fmt((get(d) or {}).get(k)) for d in items]) for k in keys]


def _speed_rows(items: list) -> list:
    def field(k, fmt, scale=1.0):
        return [_num(None if d.get(k) is None else d[k] * scale, fmt) for d in items]

    def tpot(q):
        return [_num((d.get("tpot_ms") or {}).get(q), ".2f") for d in items]

    rows = [("decode tok/s", field("decode_tok_s", ".2f"))]
    for name in ("decode_tok_s", "prefill_tok_s"):
        if any(f"{name}_lo" in d for d in items):
            rows.append((f"{name.split('_')[0]} 80% interval",
                         [_interval(d, name) for d in items]))
    rows += [("aggregate tok/s", field("aggregate_tok_s", ".2f")), ("prefill tok/s", field("prefill_tok_s", ".1f")),
             ("TTFT s", field("ttft_s", ".3f")), ("TPOT mean ms", tpot("mean")), ("TPOT p50 ms", tpot("p50")),
             ("TPOT p99 ms", tpot("p99")), ("bottleneck", [d.get("bottleneck") or "-" for d in items])]
    ms = lambda v: _num(None if v is None else v * 1e3, ".3f")  # noqa: E731
    rows += _nested_rows(items, "time/token by resource, ms", lambda d: (d.get("breakdown") or {}).get("by_resource"), ms)
    rows += _nested_rows(items, "time/token by phase, ms", lambda d: (d.get("breakdown") or {}).get("by_phase"), ms)
    rows += [("expert hit rate", field("expert_hit_rate", ".3f")),
             ("page-cache hit rate", field("page_cache_hit_rate", ".3f")),
             ("distinct experts/step", field("distinct_experts_per_step", ".2f")),
             ("token-to-token reuse", field("reuse", ".3f"))]
    rows += _nested_rows(items, "bytes/token, GB", lambda d: d.get("bytes_per_token"),
                         lambda v: _num(None if v is None else v / 1e9, ".3f"))
    rows += [(k, [str(d[k]) if d.get(k) is not None else "-" for d in items]) for k in ("mode", "routing")]
    return rows


def compare_text(items: list) -> str:
    """``compare``'s table: a row per fit/simulate field, a column per item (its fit or simulate dict);
    then each item's runtime flags and the assumptions."""
    headers, legend = _item_headers(items)
    rows = [(k, [str(d[k]) for d in items]) for k in ("model", "quant", "runtime", "kv_dtype", "context", "batch",
                                                      "placement", "fits")]
    rows += [("weights", [_gib(d["weights_bytes"]) for d in items])]
    rows += _nested_rows(items, "", lambda d: d.get("weights_bytes_by_class"), _gib)[1:]   # under weights
    rows += [("KV cache", [_gib(d["kv_bytes"]) for d in items]),
             ("KV bytes/token", [_num(d["kv_bytes_per_token"], ",.0f") for d in items]),
             ("recurrent state", [_gib(d["state_bytes"]) for d in items])]
    rows += _tier_rows(items)
    rows += [("max context", [str(d["max_context"]) for d in items]), ("max batch", [str(d["max_batch"]) for d in items])]
    rows += _speed_rows(items)
    lines = legend + _table([""] + headers, [[label] + cells for label, cells in rows], set(range(1, len(items) + 1)))
    lines.append("runtime flags:")
    lines += [f"  {h}: {d['flags']}" for h, d in zip(headers, items)]
    common = [a for a in items[0]["assumptions"] if all(a in d["assumptions"] for d in items)]
    lines += [f"  assumed: {a}" for a in common]
    lines += [f"  assumed ({h}): {a}" for h, d in zip(headers, items) for a in d["assumptions"] if a not in common]
    return "\n".join(lines)
