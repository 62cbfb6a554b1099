"""The ``advice`` of a fit / simulate record (analysis.advice) as text: the runtime's settings, why each
is there, what overflows, and the options that change speed."""
from __future__ import annotations


_TIER_NAMES = {"gpu": "GPU memory", "host": "host RAM", "storage": "storage", "unified": "unified memory"}


def overflow_lines(adv: dict, indent: str = "") -> list:
    """'does not fit' lines: the tier, what it needs, what it has, by how much it overflows (GB)."""
    return [f"{indent}does not fit: {_TIER_NAMES.get(o['tier'], o['tier'])} "
            f"needs {o['need_gb']:.1f} GB of {o['have_gb']:.1f} GB ({o['over_gb']:.1f} GB over)"
            for o in adv.get("overflow", ())]


def settings_lines(adv: dict, indent: str = "  ") -> list:
    """The runtime's settings: a command line, or Ollama's environment and Modelfile."""
    lines = []
    if adv["modelfile"]:
        if adv["env"]:
            lines.append(indent + "environment: " + " ".join(f"{k}={v}" for k, v in adv["env"].items()))
        lines.append(indent + "Modelfile:   " + "; ".join(f"PARAMETER {k} {v}" for k, v in adv["modelfile"].items()))
    elif adv["program"] or adv["args"]:
        lines.append(indent + f"{adv['program']} {adv['flags']}".strip())
    if not adv["exact"]:
        lines.append(indent + f"(approximate: {adv['runtime']} cannot realise this configuration exactly)")
    return lines


def advice_lines(adv: dict, indent: str = "  ") -> list:
    """Settings, then why (one line each), what overflows, and the speed options named."""
    lines = overflow_lines(adv, indent)
    lines += settings_lines(adv, indent)
    lines += [indent + "  why: " + w for w in adv["why"]]
    lines += [indent + "  with " + o for o in adv.get("options", ())]
    return lines


def fit_settings_lines(rows: list) -> list:
    """``fit``'s settings, one per quantization; the reasons and options all rows share said once, the
    rest with their quantization; what overflows with its quantization."""
    advs = [r["advice"] for r in rows]
    common_why = [w for w in advs[0]["why"] if all(w in a["why"] for a in advs)]
    common_opt = [o for o in advs[0].get("options", ()) if all(o in a.get("options", ()) for a in advs)]
    lines = ["runtime settings:"]
    for r, a in zip(rows, advs):
        settings = settings_lines(a, "") or ["-"]
        lines.append(f"  {r['quant']:10} {settings[0]}")
        lines += [f"  {'':10} {s}" for s in settings[1:]]
    lines += ["  why: " + w for w in common_why]
    for r, a in zip(rows, advs):
        lines += [f"  why ({r['quant']}): " + w for w in a["why"] if w not in common_why]
        lines += [f"  {r['quant']}: " + o for o in overflow_lines(a)]
    lines += ["  with " + o for o in common_opt]
    return lines
