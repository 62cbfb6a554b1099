"""The ``moesim`` command line (DESIGN §4 flag vocabulary).

Errors in input print one line on stderr (``moesim: error: <field>: <message>``) and exit 2; never a
traceback. An internal error prints one line and exits 3; MOESIM_TRACEBACK=1 lets it raise instead.
(MOESIM_DEBUG is the build's switch for a bounds-checked kernel, read only by setup.py.)
This package parses arguments and dispatches; ``analysis`` computes and ``report`` renders. Each module
holds a group of commands: ``add_parsers(sub)`` and a ``COMMANDS`` table of name -> handler.
"""
from __future__ import annotations

import os
import sys

from .. import __version__
from ..errors import MoesimError
from . import cache, core, plan, plot, routing, serve, site, views
from ._args import _Parser

COMMAND_MODULES = (core, plan, plot, routing, serve, site, views, cache)
_COMMANDS = {name: fn for mod in COMMAND_MODULES for name, fn in mod.COMMANDS.items()}


def build_parser():
    p = _Parser(prog="moesim", description="Will this MoE model run on this machine, and how fast?")
    p.add_argument("--version", action="version", version=f"moesim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in COMMAND_MODULES:
        mod.add_parsers(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 0
        return _COMMANDS[args.command](args)
    except MoesimError as exc:
        print(f"moesim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal bug: one line unless debugging
        if os.environ.get("MOESIM_TRACEBACK", "") not in ("", "0"):
            raise
        print(f"moesim: internal error: {type(exc).__name__}: {exc} (set MOESIM_TRACEBACK=1 for a traceback)",
              file=sys.stderr)
        return 3


def run(argv=None):
    """The process's entry point (``python -m moesim``, the ``moesim`` script): :func:`main`, then the
    exit a normal one makes -- the standard streams flushed, the atexit handlers run (the lowering cache
    writes there) -- without the interpreter's teardown, which frees every object the command built one
    by one (~0.2 s CPU after a rank over the catalog) and returns nothing to the user. With other Python
    threads still running (whom a normal exit would wait for) the exit is the normal one.

    The cyclic garbage collector runs every 20,000 net allocations instead of 700: loading the lowering
    cache and lowering the catalog allocate in bursts of live objects, whose collections cost a first
    rank ~90 ms CPU at the default (~20 ms here); cycles are still collected. And unless the environment
    says otherwise, numpy's OpenBLAS worker threads sleep at once when idle (OPENBLAS_THREAD_TIMEOUT=4,
    2^4 cycles, set before numpy loads) instead of spinning ~2^28 cycles after it loads: ~0.1 s of a
    second core's CPU per command, for a program whose BLAS calls are few (the thread count and the
    results are unchanged)."""
    import gc
    gc.set_threshold(20000, 10, 10)
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    code = main(argv)
    import threading
    if threading.active_count() > 1:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):     # a reader that went away, or a closed stream
        pass
    import atexit
    atexit._run_exitfuncs()
    try:
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(0 if code is None else code if isinstance(code, int) else 1)     # as SystemExit(code) would


if __name__ == "__main__":
    run()
