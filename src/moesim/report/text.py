"""Plain-text renderings of the CLI's results: each function takes the result (the same dicts the
``--json`` output prints) and returns the lines to print, joined by newlines."""
from __future__ import annotations

from .advice import advice_lines, fit_settings_lines

GiB = 2**30


def fmt_bytes(b: float) -> str:
    """A fixed-width GiB cell for the ``fit`` table ("-" for zero)."""
    return f"{b / GiB:7.1f} GiB" if b else "      -    "


def human(b: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


# ------------------------------------------------------------------------------ catalog listings
def models_text(rows: list) -> str:
    lines = [f"{'id':30} {'total':>8} {'active':>8} {'layers':>6} {'experts':>9} {'context':>9}  {'native':6}  hf ids"]
    for r in rows:
        ex = f"{r['experts']}/{r['top_k']}" if r["experts"] else "dense"
        lines.append(f"{r['id']:30} {r['total_params'] / 1e9:7.1f}B {r['active_params'] / 1e9:7.1f}B "
                     f"{r['layers']:6d} {ex:>9} {r['max_context']:9d}  {r['native_quant']:6}  "
                     + (", ".join(r.get("hf_ids") or []) or "-"))
    return "\n".join(lines)


def hardware_text(ids: dict, hw: dict) -> str:
    """*ids*: the catalog ids per section; *hw*: the hardware catalog they index."""
    lines = []
    for section in ("machine", "gpu", "unified"):
        lines.append(f"{section}:")
        for i in ids[section]:
            e = hw[section][i]
            extra = ""
            if section == "gpu":
                extra = f"{e['memory_bytes'] / GiB:6.0f} GiB {e['mem_bw_gbs']:7.0f} GB/s"
            elif section == "unified":
                extra = f"{e['default_memory_gb']:6.0f} GB  {e['mem_bw_gbs']:7.0f} GB/s"
            lines.append(f"  {i:26} {extra}  {e.get('name', '')}")
    for section in ("cpu", "host_memory", "link", "storage"):
        lines.append(f"{section}: " + ", ".join(ids[section]))
    return "\n".join(lines)


def quants_text(data: dict) -> str:
    lines = ["GGUF file types: " + ", ".join(data["gguf_ftypes"]),
             "checkpoint formats: " + ", ".join(data["formats"]),
             "KV cache dtypes: " + ", ".join(data["kv_dtypes"]),
             "sparse-attention indexer cache dtypes (--kv-dtype ATTENTION+INDEXER, e.g. fp8+fp4): "
             + ", ".join(data["indexer_dtypes"]) + f" (default {data['indexer_dtype_default']})",
             "ggml tensor types (block, bytes, bits/weight):"]
    for k, v in sorted(data["ggml_types"].items(), key=lambda kv: kv[1]["bpw"]):
        lines.append(f"  {k:8} {v['block']:4d} {v['bytes']:4d} {v['bpw']:7.4f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ fit / simulate
def fit_text(rows: list, context: int, batch: int) -> str:
    """The ``fit`` table: one line per quantization, then the runtime settings of each (report.advice)."""
    r0 = rows[0]
    lines = [f"{r0['model']} on {r0['machine']}", f"context {context}, batch {batch}; runtime {r0['runtime']}"]
    common = [a for a in r0["assumptions"] if all(a in r["assumptions"] for r in rows)]
    lines += [f"  assumed: {a}" for a in common]
    lines += [f"  assumed ({r['quant']}): {a}" for r in rows for a in r["assumptions"] if a not in common]
    lines.append(f"{'quant':10} {'weights':>11} {'placement':>15} {'GPU':>11} {'host':>11} {'storage':>11} "
                 f"{'fits':>17} {'max context':>11} {'max batch':>9} {'tok/s':>8} {'80 %':>11}  KV")
    for r in rows:
        t = r["memory_by_tier"]
        gpu_tier = t.get("gpu") or t.get("unified")
        tok_s = f"{r['decode_tok_s']:8.1f}" if r.get("decode_tok_s") else "       -"
        tok_s += f" {_span(r.get('decode_tok_s_lo'), r.get('decode_tok_s_hi')):>11}"
        lines.append(f"{r['quant']:10} {fmt_bytes(r['weights_bytes'])} {r['placement']:>15} "
                     f"{fmt_bytes(gpu_tier['total'])} {fmt_bytes(t['host']['total'])} "
                     f"{fmt_bytes(t['storage']['total'])} {r['fits']:>17} {r['max_context']:11d} "
                     f"{r['max_batch']:9d} {tok_s}  {r['kv_dtype']}")
    lines += [f"  80 % interval: {b}" for b in dict.fromkeys(r["interval_basis"] for r in rows
                                                         if r.get("decode_tok_s_lo") is not None)]
    for r in rows:
        lines += [f"  {r['quant']}: {x}" for x in speculation_lines(r)]
    seen = set()
    for r in rows:          # the breakdown where there is one: several kinds of cache (--json always has it)
        if len(r.get("kv_terms") or ()) > 1 and r["kv_dtype"] not in seen:
            seen.add(r["kv_dtype"])
            lines += kv_terms_lines(r["kv_terms"], r["kv_dtype"], r["context"])
    lines += fit_settings_lines(rows)
    return "\n".join(lines)


def kv_terms_lines(rows: list, kv_dtype: str, context: int, indent: str = "  ") -> list:
    """The KV cache of one sequence by layer kind (analysis.kvterms rows): layers, dtype, entry size, total."""
    if not rows:
        return []
    lines = [f"KV cache per sequence at context {context} ({kv_dtype}), by layer kind:"]
    for r in rows:
        what = (f"{human(r['fixed_bytes'])} fixed" if r["fixed_bytes"] else
                f"{r['bytes_per_entry']:.0f} B per " + (f"{r['tokens_per_entry']} tokens" if r["tokens_per_entry"] > 1
                                                        else "token") + (f", last {r['window']}" if r["window"] else ""))
        lines.append(f"{indent}{r['layers']:3d}{' MTP' if r['mtp'] else ''} x {r['kind']:24} {r['dtype']:9} "
                     f"{what:30} {human(r['bytes_at_context']):>12}")
    lines.append(f"{indent}total {human(sum(r['bytes_at_context'] for r in rows))}")
    return lines


def _span(lo, hi) -> str:
    """``9.8–15.1``: an 80 % interval (analysis.intervals), ``-`` where there is none."""
    return "-" if lo is None or hi is None else f"{lo:.1f}–{hi:.1f}"


def _paren(d: dict, name: str) -> str:
    """`` (9.8–15.1)`` after a tok/s figure, nothing where the record has no interval."""
    lo, hi = d.get(f"{name}_lo"), d.get(f"{name}_hi")
    return "" if lo is None or hi is None else f" ({_span(lo, hi)})"


def speculation_lines(d: dict) -> list:
    """MTP: the acceptance used, where it comes from, and whether the drafts pay (analysis.simulate)."""
    if d.get("speculation_speedup") is None:
        return []
    return [f"MTP acceptance {d['mtp_acceptance']:.3f} per draft; source: {d['mtp_acceptance_source']}",
            d["speculation_note"]]


def simulate_text(d: dict, prompt: int) -> str:
    """A ``simulate`` result (``Result.to_dict()``) for a *prompt*-token prompt."""
    lines = [f"{d['model']} {d['quant']} on {d['machine']}",
             f"runtime {d['runtime']}, placement {d['placement']}; fits: {d['fits']}"]
    lines += [f"  assumed: {a}" for a in d.get("assumptions", ())]
    lines += advice_lines(d["advice"], "  ")
    t = d["tpot_ms"]
    lines += [f"context {d['context']}, batch {d['batch']}, {d['mode']} over {d['tokens']} steps, "
              f"routing {d['routing']}, seed {d['seed']}",
              f"decode   {d['decode_tok_s']:9.2f} tok/s{_paren(d, 'decode_tok_s')} per sequence, "
              f"{d['aggregate_tok_s']:9.2f} tok/s aggregate",
              f"TPOT     mean {t['mean']:.2f} ms, p50 {t['p50']:.2f} ms, p99 {t['p99']:.2f} ms",
              f"prefill  {d['prefill_tok_s']:9.1f} tok/s{_paren(d, 'prefill_tok_s')}, TTFT {d['ttft_s']:.2f} s for a "
              f"{prompt}-token prompt",
              f"bottleneck: {d['bottleneck']}"]
    if d.get("decode_tok_s_lo") is not None:
        lines.append(f"80 % interval: {d['interval_basis']}")
    lines += speculation_lines(d)
    if d["expert_hit_rate"] is not None:
        lines.append(f"GPU expert hit rate {d['expert_hit_rate']:.3f} ({d['policy']})")
    if d["page_cache_hit_rate"] is not None:
        lines.append(f"host page-cache hit rate {d['page_cache_hit_rate']:.3f}")
    lines.append(f"distinct experts per MoE layer per step {d['distinct_experts_per_step']:.2f}, "
                 f"consecutive-token reuse {d['reuse']:.3f}")
    per = d["breakdown"]["seconds_per_token"]
    lines.append("time per token by resource:")
    for k, v in sorted(d["breakdown"]["by_resource"].items(), key=lambda kv: -kv[1]):
        if v > 0:
            lines.append(f"  {k:14} {v * 1e3:9.3f} ms  {100 * v / per:5.1f} %")
    a2a = d["breakdown"]["by_phase"].get("all_to_all", 0.0)
    if a2a > 0:
        lines.append(f"  of which expert-parallel all-to-all (dispatch + combine) {a2a * 1e3:.3f} ms  "
                     f"{100 * a2a / per:.1f} %")
    lines.append("bytes per token:")
    lines += [f"  {k:14} {v / 1e9:9.3f} GB" for k, v in d["bytes_per_token"].items() if v > 0]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ inspect
def _architecture_lines(a: dict) -> list:
    att = ", ".join(f"{n} {k}" for k, n in a["attention"].items())
    moe = (f"{a['moe_layers']} MoE layers, {a['experts']} experts top-{a['top_k']}"
           + (f" + {a['shared_experts']} shared" if a["shared_experts"] else "")) if a["experts"] else "dense"
    return [f"{a['name']}: {a['family']}, {a['layers']} layers ({att}), hidden {a['hidden']}, vocab {a['vocab']}, "
            f"{moe}; max context {a['max_context']}" + (f"; {a['mtp_layers']} MTP" if a["mtp_layers"] else ""),
            f"parameters {a['total_params'] / 1e9:.2f}B total, {a['active_params'] / 1e9:.2f}B active per token"]


def _weights_lines(d: dict) -> list:
    exact = "exact, from the file's tensor table" if d["exact"] else "derived from the architecture and quantization"
    lines = [f"weights: {d['tensors']} tensors, {human(d['weights_bytes'])} ({d['weights_bytes']:.0f} bytes; {exact})"
             + (f", plus {human(d['mtp_bytes'])} MTP" if d.get("mtp_bytes") else "")]
    if d.get("weights_bytes_by_class"):
        lines.append("by class:")
        for c, b in d["weights_bytes_by_class"].items():
            if b:
                types = ", ".join(f"{t} {human(v)}" for t, v in sorted(d["formats_by_class"][c].items(),
                                                                        key=lambda kv: -kv[1]))
                lines.append(f"  {c:15} {human(b):>12}   [{types}]")
    lines.append("by type:")
    for t, v in sorted(d["bytes_by_type"].items(), key=lambda kv: -kv[1]["bytes"]):
        lines.append(f"  {t:12} {v['tensors']:6d} tensors {human(v['bytes']):>12}")
    return lines


def _placement_lines(pl: dict) -> list:
    lines = ["placement" + (f" ({' '.join('-ot ' + o for o in pl['overrides'])})" if pl["overrides"] else "") + ":"]
    for dev, v in sorted(pl["by_device"].items()):
        cls = ", ".join(f"{c} {human(b)}" for c, b in v["by_class"].items() if b)
        lines.append(f"  {dev:8} {human(v['total']):>12} in {v['tensors']} tensors  [{cls}]")
    if pl.get("equivalent"):
        lines.append(f"  = moesim placement {pl['equivalent']}")
    lines += [f"    {name:48} {dev}" for name, dev in (pl.get("tensors") or {}).items()]
    return lines


def inspect_text(d: dict, tensors: bool = False) -> str:
    """An ``inspect`` result; *tensors*: list the tensor table (when no placement lists the tensors)."""
    files = d.get("files") or []
    lines = [f"{d['path']}  ({d['format']}{', ' + str(len(files)) + ' files' if len(files) > 1 else ''})"]
    if d.get("architecture"):
        lines += _architecture_lines(d["architecture"])
    lines += _weights_lines(d)
    if "fit_needs" in d:
        n = d["fit_needs"]
        lines.append(f"to fit at context {n['context']}: weights {human(n['weights_bytes'])} + KV cache "
                     f"{human(n['kv_bytes'])} ({d['kv_dtype']}, {d['kv_bytes_per_token']:.0f} B/token)"
                     + (f" + recurrent state {human(n['state_bytes'])}" if n["state_bytes"] else "")
                     + f" = {human(n['total_bytes'])} for one sequence, before runtime buffers")
        lines += kv_terms_lines(d.get("kv_terms") or [], d["kv_dtype"], n["context"])
    if "placement" in d:
        lines += _placement_lines(d["placement"])
    elif tensors and d.get("tensor_table"):
        lines += [f"  {t['name']:48} {t['type']:8} {str(tuple(t['shape'])):28} {round(t['bytes']):14d}  {t['class']}"
                  for t in d["tensor_table"]]
    lines += [f"note: {note}" for note in d.get("notes") or []]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ validate / sweep
def _cell(v, w=9, p=1):
    return f"{v:{w}.{p}f}" if v is not None else " " * (w - 1) + "-"


def _pct(v):
    return f"{100 * v:+6.0f}%" if v is not None else "      -"


def validate_text(report: dict) -> str:
    """The ``validate`` report: one line per row, then the summary overall and per class."""
    s = report["summary"]
    lines = [f"{'id':8} {'class':5} {'q':1} {'measured':>9} {'predicted':>9} {'err':>7} {'roofline':>9}  "
             f"{'prefill meas':>12} {'pred':>9} {'err':>7}"]
    for r in report["rows"]:
        lines.append(f"{r['id']:8} {r['class']:5} {r['quality']:1} {_cell(r['decode_measured'])} "
                     f"{_cell(r['decode_predicted'])} {_pct(r['decode_err'])} {_cell(r['roofline_predicted'])}  "
                     f"{_cell(r['prefill_measured'], 12)} {_cell(r['prefill_predicted'])} {_pct(r['prefill_err'])}")
    d, p, rf = s["decode"], s["prefill"], s["roofline_decode"]
    lines.append("")
    lines.append(f"quality A+B rows: decode median |err| {_pct_of(d, 'median')}, p90 {_pct_of(d, 'p90')} "
                 f"({d['n']} rows); prefill median {_pct_of(p, 'median')} ({p['n']} rows); "
                 f"naive roofline decode median {_pct_of(rf, 'median')}")
    for c, v in s["by_class"].items():
        dd = v["decode"]
        if dd["n"]:
            lines.append(f"  {c:4} decode median {dd['median_abs_pct_err']:6.1f} %  p90 {dd['p90_abs_pct_err']:6.1f} %"
                         f"  ({dd['n']} rows)   roofline median {v['roofline_decode']['median_abs_pct_err']:6.1f} %")
    fams = {f: v for f, v in (s.get("by_device_family") or {}).items() if v["decode"]["n"] or v["prefill"]["n"]}
    if fams:
        lines.append("  by device family (a family absent from the calibration's rows is predicted out of family):")
    for f, v in fams.items():
        dd, pp = v["decode"], v["prefill"]
        lines.append(f"    {f:17} decode median {_pct_of(dd, 'median'):>8} p90 {_pct_of(dd, 'p90'):>8} ({dd['n']:3})   "
                     f"prefill median {_pct_of(pp, 'median'):>8} ({pp['n']:3})")
    sv = s.get("serving") or {}
    if sv and sv["decode"]["n"]:
        st, ag = sv["decode_as_batch_step"], sv["aggregate"]
        lines.append(f"  serving rows (serve-sim at the row's concurrency, ISL, OSL): decode median "
                     f"{sv['decode']['median_abs_pct_err']:.1f} % ({sv['decode']['n']} rows: {', '.join(sv['rows'])}); "
                     f"as one batch step {st['median_abs_pct_err']:.1f} %; aggregate median "
                     + (f"{ag['median_abs_pct_err']:.1f} %" if ag["n"] else "-"))
    qc = s["quality_c"]["decode"]
    if qc["n"]:
        lines.append(f"quality C rows (not in the headline): decode median {qc['median_abs_pct_err']:.1f} % ({qc['n']} rows)")
    lines.append(f"rows evaluated {s['rows_evaluated']}, skipped {len(s['rows_skipped'])}:")
    lines += [f"  {sk['id']}: {sk['reason']}" for sk in s["rows_skipped"]]
    return "\n".join(lines)


def sweep_text(man: dict, out, seconds: float) -> str:
    """One line for a finished sweep (its manifest *man*, written under *out* in *seconds*)."""
    if man.get("already_complete"):
        return (f"{out}: already complete ({man['rows']} rows in {man['n_chunks']} {man['format']} files); "
                "nothing to do")
    return (f"{man['configurations']} configurations, {man['rows']} rows in {man['n_chunks']} {man['format']} "
            f"files under {out} ({seconds:.1f} s, {man['configurations'] / max(seconds, 1e-9):,.0f} configurations/s)")


def calibrate_text(report: dict) -> str:
    """``moesim calibrate``'s report: fitted parameters against their priors, and the errors."""
    lines = ["parameter                         fitted      prior   bounds           rows  sources"]
    sup = report.get("support", {})
    for k, v in report["params"].items():
        lo, hi = report["bounds"][k]
        s = sup.get(k)
        said = "" if s is None else f"{s['rows']:5d} {s['sources']:8d}" + ("" if s["fitted"] else "  held at the prior")
        lines.append(f"  {k:30} {v:9.4g} {report['priors'][k]:9.4g}   {f'[{lo:g}, {hi:g}]':15} {said}".rstrip())
    ins, pri = report["in_sample"], report["priors_error"]
    lines.append(f"rows fitted {report['rows_fitted']} (quality A+B), skipped {len(report['rows_skipped'])}; "
                 f"fit {report['fit_seconds']:.1f} s")
    lines.append(f"decode median |err|: priors {pri['decode']['median_abs_pct_err']:.1f} %, fitted in-sample "
                 f"{ins['decode']['median_abs_pct_err']:.1f} % (p90 {ins['decode']['p90_abs_pct_err']:.1f} %)")
    if ins["prefill"]["n"]:
        lines.append(f"prefill median |err|: priors {pri['prefill']['median_abs_pct_err']:.1f} %, fitted in-sample "
                     f"{ins['prefill']['median_abs_pct_err']:.1f} %")
    cv = report.get("cross_validated")
    if cv:
        lines.append(f"leave-one-source-out ({len(cv['groups'])} sources): decode median |err| "
                     f"{cv['decode']['median_abs_pct_err']:.1f} %, p90 {cv['decode']['p90_abs_pct_err']:.1f} %; "
                     f"prefill median {cv['prefill']['median_abs_pct_err'] or float('nan'):.1f} %")
        for c, v in cv["by_class"].items():
            d, f = v["decode"], v["prefill"]
            dd = f"{d['median_abs_pct_err']:6.1f} % ({d['n']})" if d["n"] else "      -   "
            ff = f"{f['median_abs_pct_err']:6.1f} % ({f['n']})" if f["n"] else "-"
            lines.append(f"  {c:4} decode {dd}   prefill {ff}")
    fam = report.get("device_family_out")
    if fam:
        lines.append(f"leave-one-device-family-out ({len(fam['groups'])} families): decode median |err| "
                     f"{_pct_of(fam['decode'], 'median')}, p90 {_pct_of(fam['decode'], 'p90')}; prefill median "
                     f"{_pct_of(fam['prefill'], 'median')}, p90 {_pct_of(fam['prefill'], 'p90')}")
        for title, part in (("family", fam["by_group"]), ("class", fam["by_class"])):
            for g, v in part.items():
                d, f = v["decode"], v["prefill"]
                lines.append(f"  {title} {g:17} decode {_pct_of(d, 'median'):>8} p90 {_pct_of(d, 'p90'):>8} ({d['n']:3})   "
                             f"prefill {_pct_of(f, 'median'):>8} p90 {_pct_of(f, 'p90'):>8} ({f['n']:3})")
    for metric, c in (report.get("intervals") or {}).get("coverage", {}).items():
        nested = report["intervals"]["coverage_nested"][metric]
        if c["n"]:
            lines.append(f"80 % {metric} interval covers {100 * c['covered']:.0f} % of {c['n']} leave-one-source-out "
                         f"rows ({100 * (nested['covered'] or 0):.0f} % with each source's interval built without it)")
    return "\n".join(lines)


def _pct_of(summary: dict, which: str) -> str:
    v = summary.get(f"{which}_abs_pct_err")
    return "-" if v is None else f"{v:.1f} %"


def _rate_text(name: str, value: float) -> str:
    """One lowered rate of --explain: FLOP/s in T/s, bandwidths in GB/s, token counts as they are."""
    if "flops" in name:
        return f"{name} {value / 1e12:.2f} T/s"
    if name == "kernel_latency_x":
        return f"kernel latency x{value:.3f} (kernel_ref_mhz / the GPU's boost_mhz)"
    if name == "prefill_weight_pass_tokens":
        return f"{name} {value:g} tokens per pass over the weights"
    if name.endswith("_tokens"):
        return f"{name} {value:g} tokens per expert"
    return f"{name} {value / 1e9:.1f} GB/s"


def explain_text(d: dict) -> str:
    """``moesim validate --explain ID``: one row's configuration, prediction, breakdown and parameters."""
    lines = [f"{d['id']} (class {d['class']}, quality {d['quality']}): {d['source']}"]
    if d.get("source_url"):
        lines.append(f"  {d['source_url']}")
    if "skipped" in d:
        return "\n".join(lines + [f"skipped: {d['skipped']}"])
    lines.append("configuration: " + ", ".join(f"{k} {v}" for k, v in d["configuration"].items() if k != "assumed"))
    lines += [f"  assumed: {a}" for a in d["configuration"]["assumed"]]
    for what in ("decode", "prefill"):
        v = d[what]
        lines.append(f"{what} tok/s: measured {_cell(v['measured'])} predicted {_cell(v['predicted'])} "
                     f"err {_pct(v['err'])}")
    b = d["breakdown"]
    lines.append(f"decode step per token {1e3 * b['seconds_per_token']:.4f} ms, by resource (ms):")
    lines += [f"  {k:14} {1e3 * v:10.4f}" for k, v in b["by_resource"].items() if v]
    lines.append("by phase (ms):")
    lines += [f"  {k:14} {1e3 * v:10.4f}" for k, v in b["by_phase"].items() if v]
    lines.append("bytes per token: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in d["bytes_per_token"].items() if v))
    pp = d["prefill"].get("by_phase_s") or {}
    if pp:
        lines.append(f"prompt of {d['configuration']['prompt']} tokens {1e3 * sum(pp.values()):.2f} ms, by phase (ms):")
        lines += [f"  {k:14} {1e3 * v:10.4f}" for k, v in pp.items() if v]
    r = d.get("rates") or {}
    if r:
        lines.append("rates: " + ", ".join(_rate_text(k, v) for k, v in r.items() if k != "backend"))
    if r.get("backend"):
        lines.append("llama.cpp backend (runtimes.toml [backends.*]): "
                     + ", ".join(f"{k} {v}" for k, v in r["backend"].items()))
    lines.append("parameters (value, prior, set by; prior's source):")
    lines += [f"  {p['name']:26} {p['value']!s:>10} {p['prior']!s:>10}  {p['source']}; {p['prior_source']}"
              for p in d["parameters"]]
    return "\n".join(lines)
