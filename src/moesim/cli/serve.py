"""``moesim serve-sim``: a continuous-batching server under load (Poisson or closed-loop clients)."""
from __future__ import annotations

import argparse

from ..errors import MoesimError
from ._args import _MODEL_HELP, _add_machine_flags, _machine_from, _number, _positive_int, _print_json


def concurrency_levels(text: str) -> list:
    """'1,2,4,8' -> [1, 2, 4, 8] (each >= 1)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,4,8, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected concurrencies >= 1, got {text!r}")
    return levels


def add_workload_flags(s) -> None:
    """The model, machine and workload flags serve-sim and ``plot serving`` share."""
    s.add_argument("model", help=_MODEL_HELP)
    _add_machine_flags(s)
    s.add_argument("--quant", default="native")
    s.add_argument("--kv-dtype")
    s.add_argument("--placement", help="as for fit; default: as the runtime would fit")
    s.add_argument("--runtime", help="vllm | sglang | trtllm | llama.cpp | ...; default: the format's")
    s.add_argument("--parallel", help="multi-GPU layout: tp8, ep8, tp4-ep4, tp8-ep8-attn-dp, layer-split, pipeline")
    s.add_argument("--routing", help="routing profile id (default: the model family's)")
    s.add_argument("--isl", type=_positive_int, default=1024, help="prompt tokens per request")
    s.add_argument("--osl", type=_positive_int, default=256, help="output tokens per request")
    s.add_argument("--max-num-batched-tokens", type=_positive_int, help="token budget per step (default: vLLM's)")
    s.add_argument("--max-num-seqs", type=_positive_int, help="running requests at most (default: vLLM's)")
    s.add_argument("--requests", type=_positive_int, help="requests simulated (default: 4 per client, or 256)")
    s.add_argument("--seed", type=_positive_int, default=0, help="seed of the Poisson arrivals")
    s.add_argument("--slo-ttft-ms", type=_number, help="goodput: TTFT at most this")
    s.add_argument("--slo-tpot-ms", type=_number, help="goodput: TPOT at most this")
    s.add_argument("--prefix-tokens", type=_positive_int, default=0,
                   help="a prompt prefix shared by every request (prefix caching)")


def workload_kwargs(args) -> dict:
    """serve_sim keywords of :func:`add_workload_flags`' flags."""
    return dict(quant=args.quant, isl=args.isl, osl=args.osl, runtime=args.runtime, kv_dtype=args.kv_dtype,
                placement=args.placement, parallel=args.parallel, max_num_batched_tokens=args.max_num_batched_tokens,
                max_num_seqs=args.max_num_seqs, requests=args.requests, seed=args.seed, slo_ttft_ms=args.slo_ttft_ms,
                slo_tpot_ms=args.slo_tpot_ms, prefix_tokens=args.prefix_tokens, routing=args.routing)


def add_parsers(sub) -> None:
    s = sub.add_parser("serve-sim", help="serving under load: continuous batching with chunked prefill, KV-limited "
                                         "admission, preemption and prefix caching; TTFT/TPOT p50/p99, goodput")
    add_workload_flags(s)
    load = s.add_mutually_exclusive_group()
    load.add_argument("--rate", type=_number, help="Poisson arrivals, requests per second")
    load.add_argument("--concurrency", type=_positive_int, help="closed loop: this many clients, each sending its "
                                                                "next request when one ends")
    load.add_argument("--sweep-concurrency", type=concurrency_levels, metavar="C1,C2,...",
                      help="closed loop at each concurrency: throughput per GPU vs tok/s per user, Pareto points")
    s.add_argument("--json", action="store_true")


def _cmd_serve(args) -> int:
    from ..analysis.serve import serve_sim, sweep_concurrency
    from ..report.serve import serve_text, sweep_text
    mach = _machine_from(args)
    if args.sweep_concurrency:
        d = sweep_concurrency(args.model, mach, args.sweep_concurrency, **workload_kwargs(args))
        if args.json:
            return _print_json(d)
        print(sweep_text(d))
        return 0
    if args.rate is None and args.concurrency is None:
        raise MoesimError("give --rate, --concurrency or --sweep-concurrency", "rate")
    r = serve_sim(args.model, mach, rate=args.rate, concurrency=args.concurrency, **workload_kwargs(args))
    if args.json:
        return _print_json(r.to_dict())
    print(serve_text(r.to_dict()))
    return 0


COMMANDS = {"serve-sim": _cmd_serve}
