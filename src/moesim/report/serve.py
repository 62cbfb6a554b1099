"""``moesim serve-sim`` as text: latency percentiles, throughput, goodput, the KV pool and the scheduler."""
from __future__ import annotations


def _ms(d: dict) -> str:
    return "-" if d["p50"] is None else f"p50 {d['p50']:.1f}  p99 {d['p99']:.1f}  mean {d['mean']:.1f}"


def serve_text(d: dict) -> str:
    """A ``serve_sim`` result (``ServeResult.to_dict()``)."""
    w, s, kv, g = d["workload"], d["scheduler"], d["kv"], d["goodput"]
    load = f"{w['concurrency']} clients (closed loop)" if w["concurrency"] else f"Poisson {w['rate']:g} req/s"
    lines = [f"{w['model']} {w['quant']} on {w['machine']}: runtime {w['runtime']}, KV {w['kv_dtype']}, "
             f"placement {w['placement']}" + (f", {w['parallel']}" if w["parallel"] else ""),
             f"{w['requests']} requests of {w['isl']} + {w['osl']} tokens, {load}"
             + (f", shared prefix {w['prefix_tokens']}" if w["prefix_tokens"] else "")]
    lines += [f"  assumed: {a}" for a in d["assumptions"]]
    user = "-" if d["per_user_tok_s"] is None else f"{d['per_user_tok_s']:.1f}"
    lines += [f"TTFT ms  {_ms(d['ttft_ms'])}", f"TPOT ms  {_ms(d['tpot_ms'])}",
              f"E2E s    p50 {d['e2e_s']['p50']:.2f}  p99 {d['e2e_s']['p99']:.2f}",
              f"tok/s    {user} per user, {d['aggregate_tok_s']:.1f} aggregate, {d['per_gpu_tok_s']:.1f} per GPU"]
    if g["slo_ttft_ms"] is not None or g["slo_tpot_ms"] is not None:
        lines.append(f"goodput  {g['req_s']:.2f} req/s, {g['tok_s']:.1f} tok/s ({100 * g['fraction']:.0f} % of "
                     f"requests within TTFT <= {g['slo_ttft_ms']} ms, TPOT <= {g['slo_tpot_ms']} ms)")
    lines += [f"KV pool  {kv['n_blocks']:,} blocks of {kv['block_size']} tokens ({kv['tokens']:,} tokens, "
              f"{kv['free_bytes'] / 1e9:.1f} GB on {kv['tier']}); peak use {100 * kv['peak_fraction']:.1f} %"]
    if kv["state_blocks"]:
        lines.append(f"         recurrent state {kv['state_bytes_per_seq'] / 2**20:.1f} MiB per request "
                     f"({kv['state_blocks']} blocks)")
    if kv["prefix_blocks"]:
        lines.append(f"         prefix cache {kv['prefix_blocks']} blocks shared"
                     + (f", {kv['snapshot_blocks']} blocks of state snapshots ({kv['snapshot_bytes'] / 2**20:.1f} "
                        "MiB)" if kv["snapshot_blocks"] else ""))
    lines.append(f"scheduler max_num_batched_tokens {s['max_num_batched_tokens']}, max_num_seqs {s['max_num_seqs']}: "
                 f"{s['steps']:,} steps, {s['max_running']} running at most, {s['preemptions']} preemptions")
    return "\n".join(lines)


def sweep_text(d: dict) -> str:
    """A ``sweep_concurrency`` curve: one line per concurrency, Pareto points starred."""
    lines = [f"{'conc':>6} {'tok/s/GPU':>10} {'tok/s/user':>10} {'TTFT ms':>9} {'TPOT ms':>8} {'preempt':>7}"]
    for p in d["points"]:
        user = "-" if p["per_user_tok_s"] is None else f"{p['per_user_tok_s']:.1f}"
        tpot = "-" if p["tpot_ms_p50"] is None else f"{p['tpot_ms_p50']:.1f}"
        lines.append(f"{p['concurrency']:6d} {p['per_gpu_tok_s']:10.1f} {user:>10} {p['ttft_ms_p50']:9.1f} "
                     f"{tpot:>8} {p['preemptions']:7d}" + ("  *" if p["pareto"] else ""))
    lines.append("* Pareto point: no other concurrency gives more tok/s per GPU and more tok/s per user")
    return "\n".join(lines)
