"""``moesim routing stats TRACE`` (a recorded trace's routing statistics) and ``moesim routing fit TRACE...``
(the routing model fitted to each trace and to all of them pooled, with the spread across them)."""
from __future__ import annotations

from ._args import _positive_int, _print_json


def add_parsers(sub) -> None:
    r = sub.add_parser("routing", help="routing statistics of recorded traces, and fitting the routing model")
    rs = r.add_subparsers(dest="routing_command", metavar="ACTION")
    st = rs.add_parser("stats", help="reuse at lags 1-32, LRU hit rates at k/2k/4k, batch union, co-activation "
                                     "recall, Gini and per-request divergence of a trace")
    st.add_argument("trace", help="a trace file or a directory of per-request files (see moesim.traces)")
    st.add_argument("--profile", default=None, metavar="ID",
                    help="also show a routing profile's stored spread of these statistics across its workloads")
    st.add_argument("--json", action="store_true")
    ft = rs.add_parser("fit", help="fit the routing model to each trace (a workload) and to all of them pooled")
    ft.add_argument("traces", nargs="+", metavar="trace")
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument("--iterations", type=_positive_int, default=None, help="calibration rounds (default 10)")
    ft.add_argument("--json", action="store_true")


def _cmd_routing(args) -> int:
    from ..errors import MoesimError
    from ..ingest import traces
    from ..report.routing import fit_text, stats_text
    if args.routing_command == "stats":
        from ..analysis.routing_stats import summary
        tr = traces.load(args.trace)
        out = {"source": tr.source, "phase": tr.phase, "decode" if tr.phase != "prompt" else "prompt":
               summary(tr.requests, tr.n_experts)}
        if tr.prompts:
            out["prompt"] = summary(tr.prompts, tr.n_experts)
        if args.profile is not None:
            from ..spec.routing import profile
            prof = profile(args.profile)
            out["routing_spread"] = {"profile": prof.id, "workloads": list(prof.workloads),
                                     "spread": {k: [lo, hi] for k, (lo, hi) in prof.spread_dict().items()}}
        if args.json:
            return _print_json(out)
        print(stats_text(out))
        return 0
    if args.routing_command == "fit":
        from ..analysis.routing_fit import FIT_ITERATIONS, fit_workloads
        if args.seed < 0:
            raise MoesimError(f"must be >= 0, got {args.seed}", "seed")
        out = fit_workloads([traces.load(t) for t in args.traces], args.seed, args.iterations or FIT_ITERATIONS)
        if args.json:
            return _print_json(out)
        print(fit_text(out))
        return 0
    raise MoesimError("say what to do: moesim routing stats TRACE | moesim routing fit TRACE...", "routing")


COMMANDS = {"routing": _cmd_routing}
