"""The first commands: catalog listings, fit, simulate, inspect, validate, sweep and calibrate."""
from __future__ import annotations

import json
import sys

from ..errors import MoesimError
from ._args import (_MODEL_HELP, _OT_HELP, _TensorOverride, _add_machine_flags, _machine_from, _number,
                    _positive_int, _print_json, _writable)


def _add_listing_parsers(sub) -> None:
    for name, help_ in (("models", "list catalog models"), ("hardware", "list catalog hardware"),
                        ("quants", "list quantizations and KV cache dtypes")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--json", action="store_true")


def _add_fit_parser(sub) -> None:
    f = sub.add_parser("fit", help="memory per tier, fit and limits for each quantization")
    f.add_argument("model", help=_MODEL_HELP)
    _add_machine_flags(f)
    f.add_argument("--quant", action="append",
                   help="quantization (repeatable); default: a GGUF ladder (the native checkpoint for a serving --runtime)")
    f.add_argument("--context", type=_positive_int, default=4096)
    f.add_argument("--allow-beyond-max-context", action="store_true",
                   help="keep a context above the model's trained maximum (memory and speed extrapolate)")
    f.add_argument("--batch", type=_positive_int, default=1)
    f.add_argument("--kv-dtype")
    f.add_argument("--placement", help="all-gpu | experts-cpu | n-cpu-moe=N | gpu-experts=N | layers-gpu=N | "
                                       "cpu-only | unified | offload-cache[=N]; default: as the runtime would fit")
    f.add_argument("--runtime", help="llama.cpp | ik_llama.cpp | ollama | vllm | sglang | trtllm | ktransformers | mlx")
    _add_speed_options(f)
    f.add_argument("-ot", "--override-tensor", dest="tensor_overrides", action=_TensorOverride, help=_OT_HELP)
    f.add_argument("--json", action="store_true")


def _add_speed_options(p) -> None:
    """The options fit and simulate share that change memory or speed (the same spellings and meaning)."""
    p.add_argument("--parallel", help="multi-GPU layout: tp8, ep8, tp4-ep4, tp8-ep8-attn-dp, layer-split, pipeline")
    p.add_argument("--redundant-experts", type=int, default=0,
                   help="EPLB: extra replicas of the hottest experts per MoE layer, spread over the EP ranks")
    p.add_argument("--policy", default="lru", help="GPU expert cache policy: lru | lfu | static | belady")
    p.add_argument("--cache-experts", type=_positive_int, help="GPU expert-cache slots per MoE layer (offload-cache)")
    p.add_argument("--prefetch-recall", type=_number, help="next-layer predictor recall in [0, 1] (enables prefetch)")
    p.add_argument("--routing", help="routing profile id (default: the model family's)")
    p.add_argument("--mtp", type=_positive_int, default=0, help="speculative draft tokens per step (MTP)")
    p.add_argument("--mtp-acceptance", type=_number, help="per-draft acceptance probability (default: the model "
                   "family's measured one, catalog/speculation.toml)")
    p.add_argument("--mtp-dataset", help="the dataset whose measured MTP acceptance is the default "
                   "(where the family has several)")
    p.add_argument("--ubatch", type=_positive_int, help="the prompt's physical batch (llama.cpp -ub; default the "
                   "runtime's, 512): tokens per prefill pass and its compute buffers")


def _add_simulate_parser(sub) -> None:
    s = sub.add_parser("simulate", help="token-level decode simulation: tok/s, p50/p99, breakdown, hit rates")
    s.add_argument("model", help=_MODEL_HELP)
    _add_machine_flags(s)
    s.add_argument("--quant", default="native")
    s.add_argument("--context", type=_positive_int, default=4096, help="KV depth at which decode is measured")
    s.add_argument("--allow-beyond-max-context", action="store_true",
                   help="keep a context above the model's trained maximum (memory and speed extrapolate)")
    s.add_argument("--prompt", type=_positive_int, default=512, help="prompt length for prefill / TTFT")
    s.add_argument("--batch", type=_positive_int, default=1, help="concurrent sequences")
    s.add_argument("--kv-dtype")
    s.add_argument("--placement", help="as for fit; default: as the runtime would fit")
    s.add_argument("--runtime")
    _add_speed_options(s)
    s.add_argument("--tokens", type=_positive_int, default=256, help="simulated decode steps")
    s.add_argument("--warmup", type=_positive_int, help="steps excluded from statistics (default min(32, T/4))")
    s.add_argument("--seed", type=_positive_int, default=0)
    s.add_argument("--mode", default="montecarlo", help="montecarlo | analytic")
    s.add_argument("--trace", help="replay a recorded routing trace (see moesim.traces); 'sample': the small "
                                   "synthetic gpt-oss-20b trace shipped with moesim")
    s.add_argument("-ot", "--override-tensor", dest="tensor_overrides", action=_TensorOverride, help=_OT_HELP)
    s.add_argument("--json", action="store_true")


def _add_inspect_parser(sub) -> None:
    i = sub.add_parser("inspect", help="what a GGUF / safetensors / config.json describes: architecture, "
                                       "bytes per tensor class and type, what fitting it needs")
    i.add_argument("path", help="GGUF file (any shard), config.json or directory, safetensors index or file")
    i.add_argument("-ot", "--override-tensor", dest="tensor_overrides", action=_TensorOverride,
                   help="llama.cpp PATTERN=DEVICE override (repeatable): report bytes per device")
    i.add_argument("--cpu-moe", dest="tensor_overrides", nargs=0, action=_TensorOverride, const="cpu-moe",
                   help="as llama.cpp --cpu-moe")
    i.add_argument("--n-cpu-moe", dest="tensor_overrides", action=_TensorOverride, const="n-cpu-moe",
                   metavar="N", help="as llama.cpp --n-cpu-moe N")
    i.add_argument("-ngl", "--n-gpu-layers", type=_positive_int, help="as llama.cpp -ngl (default: all)")
    i.add_argument("--device", default="CUDA0", help="name of the GPU buffer type (default CUDA0)")
    i.add_argument("--context", type=_positive_int, default=4096, help="context for the KV bytes fitting needs")
    i.add_argument("--kv-dtype")
    i.add_argument("--tensors", action="store_true", help="list every tensor (and its device with -ot)")
    i.add_argument("--json", action="store_true")


def _add_validate_parser(sub) -> None:
    v = sub.add_parser("validate", help="predictions vs published measurements (../shared/validation format)")
    v.add_argument("data", nargs="?", help="CSV of measured runs (validation/README.md columns); default: the "
                                        "measurements shipped with moesim (moesim/data/measurements.csv)")
    v.add_argument("--plot", help="write a log-log predicted-vs-measured figure (PNG/SVG)")
    v.add_argument("--uncalibrated", action="store_true", help="use the sourced priors, not calibration.toml")
    v.add_argument("--explain", metavar="ID", help="one row: its configuration, measured vs predicted, the decode "
                                                   "step's breakdown and the parameters that set it")
    v.add_argument("--json", action="store_true")


def _add_sweep_parser(sub) -> None:
    w = sub.add_parser("sweep", help="evaluate a grid of configurations (SPEC.toml) into chunked Parquet/CSV/JSONL "
                                     "files; resumable; optionally on dask.distributed")
    w.add_argument("spec", help="sweep spec TOML: [axes] models, quants, machines, contexts, batches, placements, "
                                "cache_experts, prefetch_recall, mtp, mtp_acceptance, parallel, routing, prompt, "
                                "ubatch, ...; "
                                "[zip] groups; [filter] fits; [run] mode, seed, chunk_size")
    w.add_argument("--out", required=True, help="output directory (chunk files + _manifest.json); rerun the same "
                                                "command to resume")
    w.add_argument("--format", default="parquet", help="parquet | csv | jsonl (default parquet)")
    w.add_argument("--threads", type=_positive_int, help="kernel threads (default: every core; 1 per dask worker); "
                                                         "results never depend on it")
    g = w.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="dask.distributed scheduler address, e.g. tcp://10.0.0.1:8786 (workers "
                                       "must see --out)")
    g.add_argument("--local-workers", "--workers", dest="local_workers", type=_positive_int,
                   help="start a local dask.distributed cluster of N worker processes")
    w.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    w.add_argument("--no-progress", dest="progress", action="store_false")
    w.add_argument("--json", action="store_true", help="print the manifest as JSON")


def _add_calibrate_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="fit the decode model's efficiencies and overheads to measurements")
    c.add_argument("data", nargs="?", help="CSV of measured runs (validation/README.md columns); default: the "
                                        "measurements shipped with moesim")
    c.add_argument("--out", help="write the fitted parameters as a calibration TOML (the catalog's is "
                                 "src/moesim/catalog/calibration.toml)")
    c.add_argument("--no-cv", action="store_true", help="skip the cross-validations")
    c.add_argument("--holdout", choices=("source", "device-family", "both"), default="source",
                   help="cross-validate leaving out one source at a time (default), every row of one device "
                        "family at a time (nvidia-ada, apple-gpu, cpu-server, ...), or both")
    c.add_argument("--rows", help="also write the leave-one-source-out rows the [intervals] are built from (JSON; "
                                  "the repository keeps them in tests/data/loso_residuals.json)")
    c.add_argument("--processes", type=int, default=1,
                   help="fork the cross-validation's fits over this many worker processes (Linux; the same figures)")
    c.add_argument("--json", action="store_true")


def add_parsers(sub) -> None:
    for add in (_add_listing_parsers, _add_fit_parser, _add_simulate_parser, _add_inspect_parser,
                _add_validate_parser, _add_sweep_parser, _add_calibrate_parser):
        add(sub)


def _cmd_models(args) -> int:
    from ..report import listings, text
    rows = listings.models()
    if args.json:
        return _print_json(rows)
    print(text.models_text(rows))
    return 0


def _cmd_hardware(args) -> int:
    from ..report import listings, text
    ids, hw = listings.hardware()
    if args.json:
        return _print_json(ids)
    print(text.hardware_text(ids, hw))
    return 0


def _cmd_quants(args) -> int:
    from ..report import listings, text
    data = listings.quants()
    if args.json:
        return _print_json(data)
    print(text.quants_text(data))
    return 0


def _cmd_fit(args) -> int:
    from ..analysis.fit import fit
    from ..ingest import model as get_model
    from ..report.text import fit_text
    mach = _machine_from(args)
    m = get_model(args.model)
    rows = fit(m, mach, quants=args.quant, context=args.context, batch=args.batch,
               kv_dtype=args.kv_dtype, placement=args.placement, runtime=args.runtime, mtp=args.mtp,
               overrides=args.tensor_overrides, allow_beyond_max_context=args.allow_beyond_max_context,
               parallel=args.parallel, cache_experts=args.cache_experts, policy=args.policy,
               prefetch_recall=args.prefetch_recall, routing=args.routing, mtp_acceptance=args.mtp_acceptance,
               redundant_experts=args.redundant_experts, mtp_dataset=args.mtp_dataset, ubatch=args.ubatch)
    if args.json:
        return _print_json(rows)
    print(fit_text(rows, args.context, args.batch))
    return 0


def _cmd_simulate(args) -> int:
    from ..analysis.simulate import simulate
    from ..ingest import model as get_model
    from ..ingest.packaged import trace_path
    from ..report.text import simulate_text
    mach = _machine_from(args)
    m = get_model(args.model)
    placement = args.placement
    if args.tensor_overrides:
        from ..analysis.resolve import placement_from_overrides
        if placement not in (None, "auto"):
            raise MoesimError("give either --placement or --override-tensor, not both", "placement")
        placement = placement_from_overrides(m, args.tensor_overrides, args.quant)
    r = simulate(m, mach, quant=args.quant, context=args.context, batch=args.batch, placement=placement,
                 runtime=args.runtime, kv_dtype=args.kv_dtype, policy=args.policy, cache_experts=args.cache_experts,
                 prefetch_recall=args.prefetch_recall, tokens=args.tokens, warmup=args.warmup, seed=args.seed,
                 mode=args.mode, trace=trace_path(args.trace), routing=args.routing, mtp=args.mtp,
                 mtp_acceptance=args.mtp_acceptance, prompt=args.prompt, parallel=args.parallel,
                 allow_beyond_max_context=args.allow_beyond_max_context, redundant_experts=args.redundant_experts,
                 mtp_dataset=args.mtp_dataset, ubatch=args.ubatch)
    d = r.to_dict()
    if args.json:
        return _print_json(d)
    print(simulate_text(d, args.prompt))
    return 0


def _cmd_inspect(args) -> int:
    from ..analysis.inspect import inspect
    from ..report.text import inspect_text
    d = inspect(args.path, overrides=args.tensor_overrides or (), n_gpu_layers=args.n_gpu_layers, gpu=args.device,
                context=args.context, kv_dtype=args.kv_dtype, tensors=args.tensors)
    if args.json:
        return _print_json(d, default=str)
    print(inspect_text(d, tensors=args.tensors))
    return 0


def _cmd_validate(args) -> int:
    from ..analysis.validate import validate
    from ..report.text import validate_text
    if args.plot:
        _writable(args.plot, "plot")
    from ..ingest.packaged import measurements_csv
    if args.explain:
        from ..analysis.explain import explain
        from ..report.text import explain_text
        d = explain(args.data or measurements_csv(), args.explain, calibrated=not args.uncalibrated)
        if args.json:
            return _print_json(d, default=str)
        print(explain_text(d))
        return 0
    rep = validate(args.data or measurements_csv(), calibrated=not args.uncalibrated)
    if args.plot:
        from ..report.plots import validation_plot
        validation_plot(rep, args.plot)
    if args.json:
        return _print_json(rep)
    if args.data is None:
        print(f"measurements: the corpus shipped with moesim ({measurements_csv()})")
    print(validate_text(rep))
    if args.plot:
        print(f"figure: {args.plot}")
    return 0


def _calibrate_command(args, data) -> str:
    """The calibrate command line that reproduces this run (written into what it produces)."""
    parts = ["moesim calibrate"] + ([data] if data else [])
    if args.holdout != "source":
        parts.append(f"--holdout {args.holdout}")
    if args.no_cv:
        parts.append("--no-cv")
    parts += [f"--{f} {getattr(args, f)}" for f in ("out", "rows") if getattr(args, f)]
    return " ".join(parts)


def _cmd_calibrate(args) -> int:
    from ..analysis import calibrate as C
    from ..report.text import calibrate_text

    def progress(i, n, group):
        print(f"\rcross-validation {i}/{n}: {group[:60]:60}", end="" if i < n else "\n", file=sys.stderr,
              flush=True)

    for field in ("out", "rows"):
        if getattr(args, field):
            _writable(getattr(args, field), field)
    if args.rows and (args.no_cv or args.holdout == "device-family"):
        raise MoesimError("--rows needs the leave-one-source-out cross-validation (--holdout source or both)", "rows")
    given_data = args.data
    if args.data is None:
        from ..ingest.packaged import measurements_csv
        args.data = measurements_csv()
    holdout = ("source", "device-family") if args.holdout == "both" else (args.holdout,)
    if args.processes < 1:
        raise MoesimError(f"--processes must be at least 1, got {args.processes}", "processes")
    rep = C.calibrate(args.data, cross_validate=not args.no_cv, progress=None if args.json else progress,
                      holdout=holdout, processes=args.processes)
    command = _calibrate_command(args, given_data)
    if args.out:
        C.write_toml(rep, args.out, command)
    if args.rows:
        try:
            with open(args.rows, "w", encoding="utf-8") as fh:
                json.dump({"command": command, "rows": rep["intervals"]["rows"]}, fh, indent=1)
        except OSError as exc:
            raise MoesimError(f"cannot write {args.rows}: {exc.strerror or exc}", "rows") from None
    if args.json:
        return _print_json(rep)
    print(calibrate_text(rep))
    if args.out:
        print(f"written: {args.out}")
    return 0


def _cmd_sweep(args) -> int:
    import time
    from ..analysis.sweep import sweep
    from ..report.text import sweep_text
    t0 = time.perf_counter()
    man = sweep(args.spec, out=args.out, format=args.format, threads=args.threads, scheduler=args.scheduler,
                local_workers=args.local_workers, progress=args.progress)
    dt = time.perf_counter() - t0
    if args.json:
        print(json.dumps({k: v for k, v in man.items() if k != "spec"}, indent=1, sort_keys=True))
    else:
        print(sweep_text(man, args.out, dt))
    return 0


COMMANDS = {"models": _cmd_models, "hardware": _cmd_hardware, "quants": _cmd_quants, "fit": _cmd_fit,
             "simulate": _cmd_simulate, "inspect": _cmd_inspect, "validate": _cmd_validate,
             "calibrate": _cmd_calibrate, "sweep": _cmd_sweep}
