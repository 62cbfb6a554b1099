"""Text of ``moesim routing stats`` and ``moesim routing fit``."""
from __future__ import annotations

import math

_STATS = ("reuse_lag1", "reuse_lag2", "reuse_lag4", "reuse_lag8", "reuse_lag16", "reuse_lag32", "lru_1k", "lru_2k",
          "lru_4k", "union_b8", "union_b32", "coact_recall", "gini", "divergence")


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3f}"


def stats_text(out: dict) -> str:
    lines = [f"{out['source']} ({out['phase']} tokens)"]
    for part in ("decode", "prompt"):
        st = out.get(part)
        if not st:
            continue
        lines.append(f"  {part}: {st['requests']} requests, {st['tokens']} tokens, {st['layers']} MoE layers, "
                     f"{st['experts']} experts, top-{st['top_k']}")
        lines += [f"    {key:13s} {_fmt(st.get(key))}" for key in _STATS if key in st]
    sp = out.get("routing_spread")
    if sp:
        pooled = f" ({', '.join(sp['workloads'])})" if sp["workloads"] else ""
        if not sp["spread"]:
            lines.append(f"  routing profile {sp['profile']}: no stored spread across workloads")
        else:
            lines.append(f"  routing profile {sp['profile']}: spread across its workloads{pooled}, min .. max")
            lines += [f"    {key:13s} {_fmt(lo)} .. {_fmt(hi)}" for key, (lo, hi) in
                      sorted(sp["spread"].items(), key=lambda kv: (_STATS + (kv[0],)).index(kv[0]))]
    return "\n".join(lines)


def fit_text(out: dict) -> str:
    lines = []
    for src, f in out["workloads"].items():
        lines.append(f"{src}: {f['requests']} requests, {f['tokens']} {f['phase']} tokens, fit error {f['error']:.4f}")
        lines += [f"    {key:13s} model {_fmt(f['model'][key])}  trace {_fmt(f['trace'][key])}" for key in f["trace"]]
    if "pooled" in out:
        p = out["pooled"]
        lines.append(f"pooled fit (error {p['error']:.4f}): concentration {p['profile']['concentration']}, "
                     f"recency decay {p['profile']['recency_decay']} power {p['profile']['recency_power']}, "
                     f"partners {p['profile']['n_partners']}")
    if len(out["workloads"]) > 1:
        lines.append("spread across workloads (min .. max, relative):")
        lines += [f"    {key:13s} {_fmt(v['min'])} .. {_fmt(v['max'])}  {v['relative']:.1%}" for key, v in out["spread"].items()]
    lines.append("(--json prints the fitted per-layer parameters, the catalog/routing.toml entry)")
    return "\n".join(lines)
