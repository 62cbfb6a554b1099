"""Figures (matplotlib, imported only when a figure is asked for).

Each ``*_figure`` function draws one dict of :mod:`moesim.analysis.plotdata` (or a ``validate`` report)
and returns the matplotlib Figure; :func:`save` writes it (PNG or SVG by the file's suffix) and closes it.
"""
from __future__ import annotations

import math

from ..analysis.validate import CLASSES
from ..errors import MoesimError


DPI = 130
# Lines of one figure must stay apart in greyscale and for colour-blind readers: colour, marker and dash vary.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")
# Phases of a decode step in drawing order (bottom to top), with the names a reader knows them by.
PHASE_LABELS = {"attention": "attention", "experts": "experts (MoE FFN)", "dense_ffn": "dense FFN",
                "transfer": "PCIe / storage transfer", "sync_launch": "sync + kernel launch",
                "head_drafts": "LM head + drafts", "step_overhead": "step overhead",
                "all_to_all": "EP all-to-all"}


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MoesimError("plots need matplotlib: pip install 'moesim[plot]'", "plot") from None
    return plt


def save(fig, out) -> None:
    """Write *fig* to *out* (PNG/SVG by its suffix) and close it."""
    plt = _pyplot()
    try:
        fig.savefig(out, dpi=DPI)
    except (OSError, ValueError) as exc:    # no such folder, read-only, a suffix matplotlib cannot write
        raise MoesimError(f"cannot write {out}: {getattr(exc, 'strerror', None) or exc}", "plot") from None
    finally:
        plt.close(fig)


def _finite(values) -> list:
    return [v for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


def _titles(fig, ax, data: dict) -> None:
    ax.set_title(data["title"], fontsize=11, loc="left")
    if data.get("subtitle"):
        fig.text(0.01, 0.005, data["subtitle"], fontsize=7.5, color="0.35", ha="left", va="bottom")
    ax.set_xlabel(data["xlabel"])
    ax.set_ylabel(data["ylabel"])


# ------------------------------------------------------------------------------------- line plots
def line_figure(data: dict):
    """Series of (x, y) as lines with markers; NaN points (no fit) are gaps, said in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.2))
    drawn = []
    for i, s in enumerate(data["series"]):
        ys = [float("nan") if y is None else y for y in s["y"]]
        label = s["label"]
        if not _finite(ys):
            ax.plot([], [], label=f"{label} (does not fit)", color="0.7")
            continue
        missing = [x for x, y in zip(s["x"], ys) if not math.isfinite(y)]
        if missing:
            label += " (x on the axis: does not fit)"
        twin = next((d["label"] for d in drawn if d["x"] == s["x"] and d["y"] == s["y"]), None)
        if twin:                    # a line hidden under an equal one is named, not lost
            label += f" (= {twin})"
        drawn.append(s)
        # earlier lines wider, so a later line drawn over an equal one leaves both visible
        line, = ax.plot(s["x"], ys, marker=_MARKERS[i % len(_MARKERS)], linestyle=_DASHES[i % len(_DASHES)],
                        markersize=max(3.0, 6.5 - 0.6 * i), linewidth=max(1.0, 2.8 - 0.35 * i), label=label)
        if missing:                 # where it does not fit, a cross on the x axis in the line's colour
            ax.plot(missing, [0.0] * len(missing), linestyle="none", marker="x", markersize=7, clip_on=False,
                    color=line.get_color())
    ax.set_xscale(data.get("xscale", "linear"))
    if data.get("ylim"):
        ax.set_ylim(*data["ylim"])
    else:
        ax.set_ylim(bottom=0)
    if data.get("xscale") == "log":
        xs = sorted({x for s in data["series"] for x in s["x"]})
        ax.set_xticks(xs)
        ax.set_xticklabels([_short(x) for x in xs], fontsize=8)
        ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
    _titles(fig, ax, data)
    ax.legend(fontsize=8, ncol=2 if len(data["series"]) > 5 else 1)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _short(x) -> str:
    """4096 -> '4k', 131072 -> '128k', 40960 -> '40k', 500 -> '500'."""
    x = float(x)
    if x >= 1024 and x % 1024 == 0:
        return f"{x / 1024:g}k"
    if x >= 10000:
        return f"{x / 1000:.0f}k"
    return f"{x:g}"


# ---------------------------------------------------------------------------------------- heatmap
def heatmap_figure(data: dict):
    """models x machines, a log colour scale for max context, linear for tok/s; grey cells do not fit."""
    plt = _pyplot()
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize
    vals = np.array(data["values"], dtype=float)
    rows, cols = data["rows"], data["cols"]
    fig, ax = plt.subplots(figsize=(max(5.5, 1.7 * len(cols) + 2.5), max(3.2, 0.65 * len(rows) + 1.8)))
    fin = vals[np.isfinite(vals)]
    if fin.size and data["metric"] == "max_context" and fin.min() > 0:
        norm = LogNorm(vmin=fin.min(), vmax=max(fin.max(), fin.min() * 1.01))
    else:
        norm = Normalize(vmin=0, vmax=fin.max() if fin.size else 1)
    ax.set_facecolor("0.85")
    im = ax.imshow(np.ma.masked_invalid(vals), cmap="viridis", norm=norm, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = vals[i, j]
            fits = data.get("fits", [[""] * len(cols)] * len(rows))[i][j]
            text = "no fit" if not math.isfinite(v) else (_short(v) if data["metric"] == "max_context" else f"{v:.1f}")
            if math.isfinite(v) and fits and fits != "no":
                text += f"\n{fits}"
            light = math.isfinite(v) and norm(v) < 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if light else "black")
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(cols, rotation=20, ha="right", fontsize=8.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8.5)
    from matplotlib.ticker import FuncFormatter
    bar = fig.colorbar(im, ax=ax, label=data["colorbar"], format=FuncFormatter(lambda v, _: _short(v)))
    bar.ax.minorticks_off()
    _titles(fig, ax, data)
    fig.tight_layout()
    return fig


# -------------------------------------------------------------------------------------- breakdown
def breakdown_figure(data: dict):
    """A stacked bar per placement: ms per decoded token by phase, the tok/s it makes on top."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.5, 1.5 * len(data["bars"]) + 3), 5.2))
    xs = range(len(data["bars"]))
    bottom = [0.0] * len(data["bars"])
    order = [p for p in PHASE_LABELS if p in data["stacks"]] + [p for p in data["stacks"] if p not in PHASE_LABELS]
    colours = plt.get_cmap("tab10")
    for k, phase in enumerate(order):
        vals = data["stacks"][phase]
        ax.bar(xs, vals, bottom=bottom, label=PHASE_LABELS.get(phase, phase), color=colours(k % 10), width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    top = max(bottom) if bottom and max(bottom) > 0 else 1.0
    for x, total, tps in zip(xs, bottom, data["tok_s"]):
        label = "does not fit" if not math.isfinite(tps) else f"{total:.1f} ms\n{tps:.1f} tok/s"
        ax.text(x, total + 0.015 * top, label, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, top * 1.18)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(data["bars"], rotation=15, ha="right", fontsize=8.5)
    ax.grid(True, axis="y", alpha=0.3)
    _titles(fig, ax, data)
    if order:                  # no phases when no placement fits: the bars say "does not fit"
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


# ------------------------------------------------------------------------------------- validation
def validation_figure(report: dict):
    """Log-log predicted vs measured decode tok/s per class of a ``validate`` report, with the naive
    roofline for contrast."""
    plt = _pyplot()
    rows = [r for r in report["rows"] if r["decode_err"] is not None]
    if not rows:
        raise MoesimError("no row has both a measured and a predicted decode speed to plot", "plot")
    fig, ax = plt.subplots(figsize=(7, 6))
    for i, c in enumerate(CLASSES):
        rs = [r for r in rows if r["class"] == c]
        if rs:
            ax.scatter([r["decode_measured"] for r in rs], [r["decode_predicted"] for r in rs], label=c, s=24,
                       marker=_MARKERS[i % len(_MARKERS)])
    roof = [r for r in rows if r.get("roofline_predicted")]
    ax.scatter([r["decode_measured"] for r in roof], [r["roofline_predicted"] for r in roof], marker="x",
               color="0.6", s=14, label="roofline (peers)")
    lo = min(min(r["decode_measured"] for r in rows), min(r["decode_predicted"] for r in rows)) / 1.5
    hi = max(max(r["decode_measured"] for r in rows), max(r["decode_predicted"] for r in rows)) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    for f in (0.75, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6, label="±25 %" if f == 0.75 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured decode tok/s per sequence")
    ax.set_ylabel("predicted decode tok/s per sequence")
    s = report["summary"]
    ax.set_title(f"moesim vs measurements: median |err| {s['median_abs_pct_err']:.0f} % (A+B rows), "
                 f"roofline {s['roofline_decode']['median_abs_pct_err']:.0f} %", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def validation_plot(report: dict, out) -> None:
    """:func:`validation_figure` written to *out*."""
    save(validation_figure(report), out)


def serving_figure(data: dict):
    """Throughput per GPU against tok/s per user, one point per concurrency (labelled), Pareto points filled."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.2))
    pts = [p for p in data["points"] if p["per_user_tok_s"] is not None]
    ax.plot([p["per_user_tok_s"] for p in pts], [p["per_gpu_tok_s"] for p in pts], color="0.6", linestyle="--")
    for pareto, marker, label in ((True, "o", "Pareto point"), (False, "x", "dominated")):
        sel = [p for p in pts if p["pareto"] == pareto]
        ax.plot([p["per_user_tok_s"] for p in sel], [p["per_gpu_tok_s"] for p in sel], linestyle="none",
                marker=marker, markersize=7, label=label)
    for p in pts:
        ax.annotate(f"c={p['concurrency']}", (p["per_user_tok_s"], p["per_gpu_tok_s"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, which="major", alpha=0.3)
    _titles(fig, ax, data)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


FIGURES = {"context": line_figure, "cache": line_figure, "offload-cliff": line_figure, "heatmap": heatmap_figure,
           "breakdown": breakdown_figure, "serving": serving_figure}


def figure(data: dict):
    """The figure of a :mod:`moesim.analysis.plotdata` dict, by its ``kind``."""
    return FIGURES[data["kind"]](data)
