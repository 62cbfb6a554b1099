"""``moesim rank`` (what runs on this machine, best first) and ``moesim compare`` (items side by side)."""
from __future__ import annotations

from ._args import _MODEL_HELP, _add_machine_flags, _machine_from, _machines_from, _positive_int, _print_json

# rank's default worker processes: its sweep is ~800 small groups whose Python work runs on one core per
# process; past a few processes the forks' start-up outweighs what is left to split
RANK_PROCESSES = 4


def _add_rank_parser(sub) -> None:
    r = sub.add_parser("rank", help="what runs on this machine: every catalog model x quantization that fits, "
                                    "best first")
    _add_machine_flags(r)
    r.add_argument("--by", default="speed", help="speed (decode tok/s, the default) | context (max context) | "
                                                 "quality (bits per weight) | params (total parameters)")
    r.add_argument("--filter", action="append", help="family=PREFIX | min-context=N | min-tps=X (repeatable, or "
                                                     "comma-separated)")
    r.add_argument("--context", type=_positive_int, default=4096, help="context each configuration must hold")
    r.add_argument("--batch", type=_positive_int, default=1, help="concurrent sequences")
    r.add_argument("--runtime", help="default: llama.cpp over the GGUF ladder; a serving runtime (vllm, sglang, "
                                     "trtllm, mlx) ranks native checkpoints")
    r.add_argument("--kv-dtype")
    r.add_argument("--limit", type=_positive_int, help="print the best K only")
    r.add_argument("--processes", type=_positive_int, help="worker processes the sweep forks (default: one per "
                                                          f"core, up to {RANK_PROCESSES}; the ranking is the same)")
    r.add_argument("--json", action="store_true")


def _add_compare_parser(sub) -> None:
    c = sub.add_parser("compare", help="models, quantizations or machines side by side (every fit/simulate field)")
    c.add_argument("models", nargs="+", metavar="model", help=_MODEL_HELP + " (several: compare models)")
    _add_machine_flags(c, repeatable=True)
    c.add_argument("--quant", action="append", help="quantization (repeatable: compare quantizations); default "
                                                    "Q4_K_M (the native checkpoint for a serving --runtime)")
    c.add_argument("--context", type=_positive_int, default=4096)
    c.add_argument("--allow-beyond-max-context", action="store_true")
    c.add_argument("--batch", type=_positive_int, default=1)
    c.add_argument("--prompt", type=_positive_int, default=512, help="prompt length for prefill / TTFT")
    c.add_argument("--kv-dtype")
    c.add_argument("--placement", help="as for fit; default: as the runtime would fit")
    c.add_argument("--runtime")
    c.add_argument("--mode", default="analytic", help="analytic (the default, as fit) | montecarlo")
    c.add_argument("--json", action="store_true")


def add_parsers(sub) -> None:
    _add_rank_parser(sub)
    _add_compare_parser(sub)


def _cmd_rank(args) -> int:
    from ..analysis.views import rank
    from ..spec.limits import usable_cpus
    mach = _machine_from(args)
    processes = args.processes or min(usable_cpus(), RANK_PROCESSES)
    rows = rank(mach, runtime=args.runtime, kv_dtype=args.kv_dtype, context=args.context, batch=args.batch,
                by=args.by, filter=args.filter, limit=args.limit, processes=processes)
    if args.json:
        return _print_json(rows)
    from ..report.views import rank_text
    print(rank_text(rows, mach.describe(), args.context, args.batch, args.by.strip().lower()))
    return 0


def _cmd_compare(args) -> int:
    from ..analysis.views import compare
    from ..report.views import compare_text
    items = compare(args.models, _machines_from(args), quants=args.quant, context=args.context, batch=args.batch,
                    prompt=args.prompt, runtime=args.runtime, kv_dtype=args.kv_dtype, placement=args.placement,
                    mode=args.mode, allow_beyond_max_context=args.allow_beyond_max_context)
    if args.json:
        return _print_json(items)
    print(compare_text(items))
    return 0


COMMANDS = {"rank": _cmd_rank, "compare": _cmd_compare}
