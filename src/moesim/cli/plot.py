"""``moesim plot KIND ... --out FILE.png|svg``: one figure per kind (the numbers come from the sweep
engine or simulate in analysis.plotdata; report.plots draws them)."""
from __future__ import annotations

import argparse

from ..errors import MoesimError
from ._args import _MODEL_HELP, _Parser, _add_machine_flags, _machine_from, _positive_int, _writable


KINDS = {
    "context": "decode tok/s vs context, one line per quantization (one model, one machine)",
    "heatmap": "models x machines: max context, or decode tok/s at --context",
    "breakdown": "time per decoded token by phase, one bar per placement",
    "cache": "GPU expert-cache hit rate vs cache size, one line per policy",
    "offload-cliff": "decode tok/s vs llama.cpp --n-cpu-moe N",
    "validation": "predicted vs measured decode tok/s (the packaged measurements, or a CSV)",
    "serving": "tok/s per GPU vs tok/s per user over concurrencies (serve-sim), Pareto points marked",
}


def _int_list(text: str) -> list:
    """'512,4096,32768' -> [512, 4096, 32768]."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _common(p, model: bool = True, quant_repeat: bool = False) -> None:
    if model:
        p.add_argument("model", help=_MODEL_HELP)
        _add_machine_flags(p)
    if quant_repeat:
        p.add_argument("--quant", action="append", help="quantization (repeatable); default: a GGUF ladder")
    p.add_argument("--out", required=True, help="figure file: .png or .svg")


def add_parsers(sub) -> None:
    p = sub.add_parser("plot", help="draw a figure: " + ", ".join(KINDS))
    kinds = p.add_subparsers(dest="kind", metavar="KIND", parser_class=_Parser)
    k = kinds.add_parser("context", help=KINDS["context"])
    _common(k, quant_repeat=True)
    k.add_argument("--contexts", type=_int_list, help="comma-separated depths (default: 8 from 512 to the model's max)")
    k.add_argument("--batch", type=_positive_int, default=1)
    k.add_argument("--runtime", default="auto")
    k = kinds.add_parser("heatmap", help=KINDS["heatmap"])
    k.add_argument("--models", required=True, help="comma-separated model ids")
    k.add_argument("--machines", required=True, help="comma-separated catalog machine ids ('local' = this machine)")
    k.add_argument("--metric", default="max_context", help="max_context | decode_tok_s")
    k.add_argument("--quant", default="Q4_K_M")
    k.add_argument("--context", type=_positive_int, default=4096)
    k.add_argument("--runtime", default="auto")
    _common(k, model=False)
    k = kinds.add_parser("breakdown", help=KINDS["breakdown"])
    _common(k)
    k.add_argument("--placement", action="append", help="placement (repeatable); default: all-gpu, n-cpu-moe=half, "
                                                        "experts-cpu, offload-cache, cpu-only")
    k.add_argument("--quant", default="Q4_K_M")
    k.add_argument("--context", type=_positive_int, default=4096)
    k.add_argument("--runtime")
    k = kinds.add_parser("cache", help=KINDS["cache"])
    _common(k)
    k.add_argument("--cache-sizes", type=_int_list, help="comma-separated slots per layer (default: top-k to all)")
    k.add_argument("--policy", action="append", help="lru | lfu | static | belady (montecarlo) (repeatable)")
    k.add_argument("--mode", default="analytic", help="analytic | montecarlo")
    k.add_argument("--tokens", type=_positive_int, default=128, help="decode steps per point (montecarlo)")
    k.add_argument("--quant", default="Q4_K_M")
    k.add_argument("--context", type=_positive_int, default=4096)
    k = kinds.add_parser("offload-cliff", help=KINDS["offload-cliff"])
    _common(k, quant_repeat=True)
    k.add_argument("--n-cpu-moe", dest="counts", type=_int_list, help="comma-separated N (default: 0 to all layers)")
    k.add_argument("--context", type=_positive_int, default=4096)
    k.add_argument("--runtime", default="auto")
    k = kinds.add_parser("serving", help=KINDS["serving"])
    from .serve import add_workload_flags, concurrency_levels
    add_workload_flags(k)
    k.add_argument("--sweep-concurrency", type=concurrency_levels, default=[1, 2, 4, 8, 16, 32, 64, 128],
                   metavar="C1,C2,...", help="concurrencies (default 1,2,4,...,128)")
    _common(k, model=False)
    k = kinds.add_parser("validation", help=KINDS["validation"])
    k.add_argument("data", nargs="?", help="CSV of measured runs (default: the packaged measurements)")
    k.add_argument("--uncalibrated", action="store_true", help="use the sourced priors, not calibration.toml")
    _common(k, model=False)


def _machines_list(text: str) -> list:
    from ..ingest.local_machine import local_machine
    from ..spec.hardware import machine
    out = []
    for x in (s.strip() for s in text.split(",") if s.strip()):
        out.append(local_machine() if x.lower() == "local" else machine(x))
        if x.lower() == "local":
            _print_detection(out[-1])
    return out


def _print_detection(mach) -> None:
    """What detecting this machine found and assumed, said before the figure that rests on it."""
    print(f"machine: {mach.describe()}\n" + "\n".join(f"  {a}" for a in mach.assumptions))


def _plot_data(args, mach):
    from ..analysis import plotdata as D
    if args.kind == "heatmap":
        return D.heatmap_data([s.strip() for s in args.models.split(",") if s.strip()], _machines_list(args.machines),
                              metric=args.metric, quant=args.quant, context=args.context, runtime=args.runtime)
    if args.kind == "context":
        return D.context_data(args.model, mach, quants=args.quant, contexts=args.contexts, runtime=args.runtime,
                              batch=args.batch)
    if args.kind == "breakdown":
        return D.breakdown_data(args.model, mach, placements=args.placement, quant=args.quant, context=args.context,
                                runtime=args.runtime)
    if args.kind == "serving":
        from .serve import workload_kwargs
        return D.serving_data(args.model, mach, args.sweep_concurrency, **workload_kwargs(args))
    if args.kind == "cache":
        return D.cache_data(args.model, mach, sizes=args.cache_sizes, policies=args.policy, quant=args.quant,
                            context=args.context, mode=args.mode, tokens=args.tokens)
    return D.offload_cliff_data(args.model, mach, quants=args.quant, counts=args.counts, context=args.context,
                                runtime=args.runtime)


def _cmd_plot(args) -> int:
    from ..report import plots
    if not args.kind:
        raise MoesimError("give a KIND: " + ", ".join(KINDS), "plot")
    _writable(args.out, "out")
    if args.kind == "validation":
        from ..analysis.validate import validate
        from ..ingest.packaged import measurements_csv
        fig = plots.validation_figure(validate(args.data or measurements_csv(), calibrated=not args.uncalibrated))
    else:
        mach = None if args.kind == "heatmap" else _machine_from(args)
        if mach is not None and mach.id == "local":
            _print_detection(mach)
        fig = plots.figure(_plot_data(args, mach))
    plots.save(fig, args.out)
    print(f"figure: {args.out}")
    return 0


COMMANDS = {"plot": _cmd_plot}
