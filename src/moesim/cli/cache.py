"""``moesim cache info|build|clear``: the persistent lowering cache (moesim._lowering_cache)."""
from __future__ import annotations

from ._args import _print_json

ACTIONS = ("info", "build", "clear")


def add_parsers(sub) -> None:
    c = sub.add_parser("cache", help="the lowering cache new processes load instead of lowering the catalog: "
                                     "info (where, fingerprint, size), build (lower the whole catalog), clear")
    c.add_argument("action", help="info | build | clear")
    c.add_argument("--model", action="append", help="build: these catalog models only (repeatable)")
    c.add_argument("--json", action="store_true", help="print as JSON")


def _cmd_cache(args) -> int:
    from .. import _lowering_cache as LC
    from ..errors import MoesimError, unknown_id
    action = str(args.action).strip().lower()
    if action not in ACTIONS:
        raise unknown_id("cache action", args.action, ACTIONS, "action")
    if args.model and action != "build":
        raise MoesimError("only cache build takes --model", "--model")
    if action == "build":
        from ..analysis.lowering_build import build
        from ..spec.models import _require_id
        out = build([_require_id(m) for m in args.model] if args.model else None)
        if LC.last_error():
            raise MoesimError(f"could not write the cache: {LC.last_error()}", "MOESIM_CACHE_DIR")
    elif action == "clear":
        out = {"removed_folders": LC.clear(), "dir": str(LC.cache_dir())}
    else:
        out = LC.info()
    if args.json:
        _print_json(out)
    else:
        print(_text(action, out))
    return 0


def _text(action: str, out: dict) -> str:
    if action == "clear":
        return f"removed {out['removed_folders']} cache folder(s) under {out['dir']}"
    info = out["cache"] if action == "build" else out
    lines = []
    if action == "build":
        lines.append(f"lowered {out['models']} models, {out['configurations']} configurations in "
                     f"{out['seconds']:.1f} s")
    lines.append(f"dir          {info['dir']}")
    if not info["enabled"]:
        lines.append("enabled      no (MOESIM_CACHE=off)")
        return "\n".join(lines)
    lines.append(f"fingerprint  {info['fingerprint'][:24]}")
    for ns, e in info["namespaces"].items():
        lines.append(f"  {ns:<13}{e['entries']:>6} entries {e['bytes'] / 1e6:8.2f} MB")
    lines.append(f"total        {info['bytes'] / 1e6:.2f} MB; {info['other_fingerprints']} other fingerprint(s) kept")
    return "\n".join(lines)


COMMANDS = {"cache": _cmd_cache}
