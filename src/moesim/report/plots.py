"""Figures (matplotlib, imported only when a figure is asked for)."""
from __future__ import annotations

from ..analysis.validate import CLASSES
from ..errors import MoesimError


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MoesimError("plots need matplotlib: pip install 'moesim[plot]'", "plot") from None
    return plt


def validation_plot(report: dict, out) -> None:
    """Log-log predicted vs measured decode tok/s per class of a ``validate`` report, with the naive
    roofline for contrast; written to *out* (PNG/SVG by its suffix)."""
    plt = _pyplot()
    rows = [r for r in report["rows"] if r["decode_err"] is not None]
    fig, ax = plt.subplots(figsize=(7, 6))
    for c in CLASSES:
        rs = [r for r in rows if r["class"] == c]
        if rs:
            ax.scatter([r["decode_measured"] for r in rs], [r["decode_predicted"] for r in rs], label=c, s=22)
    ax.scatter([r["decode_measured"] for r in rows], [r["roofline_predicted"] for r in rows], marker="x",
               color="0.6", s=14, label="roofline (peers)")
    lo = min(min(r["decode_measured"] for r in rows), min(r["decode_predicted"] for r in rows)) / 1.5
    hi = max(max(r["decode_measured"] for r in rows), max(r["decode_predicted"] for r in rows)) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.75, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured decode tok/s per sequence")
    ax.set_ylabel("predicted decode tok/s per sequence")
    s = report["summary"]
    ax.set_title(f"moesim vs measurements: median |err| {s['median_abs_pct_err']:.0f} % (A+B rows), "
                 f"roofline {s['roofline_decode']['median_abs_pct_err']:.0f} %", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as exc:    # no such folder, read-only, a suffix matplotlib cannot write
        raise MoesimError(f"cannot write {out}: {getattr(exc, 'strerror', None) or exc}", "plot") from None
    finally:
        plt.close(fig)
