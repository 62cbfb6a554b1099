"""``moesim plan`` as text: the Pareto front, fastest first, each point with its runtime settings."""
from __future__ import annotations

from .advice import settings_lines


def plan_text(d: dict) -> str:
    g = d["grid"]
    lines = [f"{d['model']} on {d['machine']}",
             f"runtime {d['runtime']}, batch {d['batch']}: {d['evaluated']} configurations "
             f"({len(g['quants'])} quants x {len(g['kv_dtypes'])} KV dtypes x {len(g['placements'])} placements "
             f"x {len(g['contexts'])} contexts), {d['fitting']} fit, {len(d['points'])} on the Pareto front "
             "(faster, longer context, more bits per weight and per KV element)"]
    if not d["points"]:
        lines.append("nothing fits: `moesim fit` says which tier overflows and by how much")
        return "\n".join(lines)
    lines.append(f"{'tok/s':>8} {'context':>8} {'quant':>8} {'bpw':>5} {'KV':>5} {'placement':>15} "
                 f"{'GPU GB':>7} {'host GB':>7}  runtime settings")
    for p in d["points"]:
        head = (f"{p['decode_tok_s']:8.1f} {p['context']:8d} {p['quant']:>8} {p['bits_per_weight']:5.2f} "
                f"{p['kv_dtype']:>5} {p['placement']:>15} {p['gpu_bytes'] / 1e9:7.1f} {p['host_bytes'] / 1e9:7.1f}  ")
        settings = settings_lines(p["advice"], "") or ["-"]
        lines.append(head + settings[0])
        lines += [" " * len(head) + s for s in settings[1:]]
    return "\n".join(lines)
