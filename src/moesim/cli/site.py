"""``moesim export-site SPEC.toml --out DIR``: a sweep as a static site (JSON, JSON Schema, index.html)."""
from __future__ import annotations

import json

from ._args import _positive_int


# a site's sweeps are thousands of small groups whose Python lowering runs on one core per process (as rank's)
SITE_PROCESSES = 8


def add_parsers(sub) -> None:
    s = sub.add_parser("export-site", help="run a sweep spec and write a static site: JSON per machine and model, "
                                           "an index, their JSON Schemas and an index.html that works offline")
    s.add_argument("spec", help="sweep spec TOML (docs/examples/site.toml); an optional [site] table sets the "
                                "page's title and description")
    s.add_argument("--out", required=True, help="folder for the site (new, empty, or an earlier export's)")
    s.add_argument("--threads", type=_positive_int, help="kernel threads (default: every core); results never "
                                                         "depend on it")
    s.add_argument("--processes", type=_positive_int, help="worker processes each sweep forks (default: one per "
                                                          f"core, up to {SITE_PROCESSES}; the site is the same)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cmd_export_site(args) -> int:
    import time
    from ..analysis.site import site_data
    from ..report.site import site_text, write_site
    from ..report.site.writer import check_out
    t0 = time.perf_counter()
    from ..spec.limits import usable_cpus
    check_out(args.out)          # refuse a bad folder before the sweep runs
    processes = args.processes or min(usable_cpus(), SITE_PROCESSES)
    summary = write_site(site_data(args.spec, threads=args.threads, processes=processes), args.out)
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        print(site_text(summary, time.perf_counter() - t0))
    return 0


COMMANDS = {"export-site": _cmd_export_site}
