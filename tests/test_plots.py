"""``moesim plot``: every kind makes a non-empty figure with labelled axes from the sweep's numbers
(small grids, so the whole file runs in seconds)."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import moesim  # noqa: E402
from moesim import MoesimError  # noqa: E402
from moesim.analysis import plotdata as D  # noqa: E402
from moesim.cli import main  # noqa: E402
from moesim.report import plots as R  # noqa: E402

MODEL, MACHINE = "qwen3-30b-a3b", "desktop-4090"


def _axes_labelled(fig) -> None:
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() and (ax.get_title() or ax.get_title(loc="left"))


def _png_ok(path) -> None:
    from matplotlib import image
    assert path.stat().st_size > 5000
    px = image.imread(str(path))
    assert px.ndim == 3 and len(np.unique(px.reshape(-1, px.shape[-1]), axis=0)) > 20    # not one colour


def test_context_curve_is_the_sweeps_numbers():
    d = D.context_data(MODEL, MACHINE, quants=["Q4_K_M", "Q8_0"], contexts=[1024, 8192])
    t = moesim.sweep(models=[MODEL], quants=["Q4_K_M"], machines=[MACHINE], contexts=[8192], mode="analytic")
    assert d["series"][0]["label"] == "Q4_K_M" and d["series"][0]["x"] == [1024, 8192]
    assert d["series"][0]["y"][1] == pytest.approx(float(t["decode_tok_s"][0]))
    assert d["series"][0]["y"][0] > d["series"][0]["y"][1]              # deeper KV, slower decode
    fig = R.figure(d)
    _axes_labelled(fig)
    assert len(fig.axes[0].get_lines()) == 2 and fig.axes[0].get_xscale() == "log"     # both fit: no crosses


def test_heatmap_marks_what_does_not_fit():
    d = D.heatmap_data([MODEL, "deepseek-v3"], [MACHINE, "mac-studio-m3-ultra-512"], metric="decode_tok_s",
                       context=2048)
    vals = np.array(d["values"])
    assert vals.shape == (2, 2) and np.isfinite(vals[0]).all()
    assert math.isnan(vals[1, 1]) and d["fits"][1][1] == "no"           # 671B at Q4_K_M overflows 512 GB x 0.75
    fig = R.figure(d)
    _axes_labelled(fig)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "no fit" in texts and len(texts) == 4
    with pytest.raises(MoesimError, match="metric"):
        D.heatmap_data([MODEL], [MACHINE], metric="speed")


def test_breakdown_bars_sum_to_the_step_time():
    d = D.breakdown_data(MODEL, MACHINE, placements=["all-gpu", "experts-cpu"], context=2048)
    for i, tps in enumerate(d["tok_s"]):
        total_ms = sum(v[i] for v in d["stacks"].values())
        assert total_ms == pytest.approx(1e3 / tps, rel=0.02)
    assert d["tok_s"][0] > d["tok_s"][1]
    fig = R.figure(d)
    _axes_labelled(fig)
    assert len(fig.axes[0].patches) == 2 * len(d["stacks"])


def test_cache_hit_rate_rises_with_cache_size():
    d = D.cache_data(MODEL, MACHINE, sizes=[8, 32, 128], policies=["lru", "lfu"])
    for s in d["series"]:
        assert s["y"] == sorted(s["y"]) and 0 < s["y"][0] < 1
        assert s["y"][-1] == pytest.approx(1.0)                        # every expert cached
    mc = D.cache_data(MODEL, MACHINE, sizes=[8, 32], policies=["lru", "belady"], mode="montecarlo", tokens=32)
    assert all(b >= l for l, b in zip(mc["series"][0]["y"], mc["series"][1]["y"]))   # Belady bounds LRU
    _axes_labelled(R.figure(d))
    with pytest.raises(MoesimError, match="belady"):
        D.cache_data(MODEL, MACHINE, sizes=[8], policies=["belady"])
    with pytest.raises(MoesimError, match="dense"):
        D.cache_data("llama-3-8b", MACHINE)


def test_cache_sizes_and_monte_carlo_work_are_bounded_before_the_sweep():
    """Regression (CLI fuzzer): --cache-sizes took any integers (3,000 sizes up to 1.5 million slots ran
    minutes for a figure of 128-expert layers) and --mode montecarlo --tokens 2^20 ran for minutes past
    simulate's bound on one call's work; both are refused at once, naming the field."""
    with pytest.raises(MoesimError, match=r"in \[0, 128\]") as ei:
        D.cache_data(MODEL, MACHINE, sizes=[8, 129])
    assert ei.value.field == "cache_sizes"
    with pytest.raises(MoesimError, match="expert choices") as ei:
        D.cache_data(MODEL, MACHINE, sizes=[8], policies=["lru"], mode="montecarlo", tokens=1 << 20)
    assert ei.value.field == "tokens"
    assert D.cache_data(MODEL, MACHINE, sizes=[0, 128], policies=["lru"])["series"][0]["y"] == [0.0, 1.0]


def test_figures_on_a_machine_without_a_discrete_gpu():
    """Regression (CLI fuzzer): ``plot breakdown`` on a CPU-only or unified machine failed on its first
    default bar (all-gpu / n-cpu-moe need a discrete GPU), and cache / offload-cliff refused with a sweep
    spec's field and hint (axes.placements[0] ... filter.skip_inapplicable); now the breakdown draws the
    placements the machine has, and the two figures that move experts name the machine."""
    cpu = moesim.machine(host="ddr5-4800x8")
    assert D.breakdown_data(MODEL, cpu)["bars"] == ["cpu-only"]
    assert D.breakdown_data(MODEL, "mac-studio-m3-ultra-512")["bars"] == ["unified", "cpu-only"]
    for build in (D.cache_data, D.offload_cliff_data):
        for mach in (cpu, "mac-studio-m3-ultra-512"):
            with pytest.raises(MoesimError, match="discrete GPU") as ei:
                build(MODEL, mach)
            assert ei.value.field == "machine"


def test_offload_cliff_falls_and_leaves_gaps_where_it_does_not_fit():
    d = D.offload_cliff_data(MODEL, MACHINE, quants=["Q4_K_M", "Q8_0"], counts=[0, 24, 48])
    q4, q8 = d["series"]
    assert q4["y"][0] > q4["y"][1] > q4["y"][2]
    assert math.isnan(q8["y"][0]) and math.isfinite(q8["y"][2])        # Q8_0 (32 GB) needs experts off the 4090
    fig = R.figure(d)
    _axes_labelled(fig)
    assert any("does not fit" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    with pytest.raises(MoesimError, match=r"\[0, 48\]"):
        D.offload_cliff_data(MODEL, MACHINE, counts=[49])


@pytest.mark.parametrize("argv", [
    ["context", MODEL, "--machine", MACHINE, "--quant", "Q4_K_M", "--contexts", "1024,16384"],
    ["heatmap", "--models", f"{MODEL},gpt-oss-20b", "--machines", f"{MACHINE},dgx-h100"],
    ["breakdown", MODEL, "--machine", MACHINE, "--placement", "all-gpu", "--placement", "cpu-only"],
    ["cache", MODEL, "--machine", MACHINE, "--cache-sizes", "8,16,64"],
    ["offload-cliff", MODEL, "--machine", MACHINE, "--n-cpu-moe", "0,12,48"],
    ["serving", "gpt-oss-20b", "--gpu", "h100-sxm", "--sweep-concurrency", "1,8", "--isl", "256", "--osl", "16"],
])
def test_cli_writes_each_kind(tmp_path, capsys, argv):
    out = tmp_path / f"{argv[0]}.png"
    assert main(["plot", *argv, "--out", str(out)]) == 0
    _png_ok(out)
    assert f"figure: {out}" in capsys.readouterr().out


def test_cli_validation_figure_as_svg(tmp_path):
    """A dozen rows of the packaged corpus (validate on all of it: tests/test_packaging.py)."""
    from moesim.ingest.packaged import measurements_csv
    lines = open(measurements_csv(), encoding="utf-8").read().splitlines()
    data = tmp_path / "few.csv"
    data.write_text("\n".join(lines[:1] + [l for l in lines if l.startswith(("KT-01", "REF-01", "AP-09"))]) + "\n")
    out = tmp_path / "validation.svg"
    assert main(["plot", "validation", str(data), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<?xml") and "measured decode tok/s per sequence" in text


def test_cli_plot_errors_are_one_line(tmp_path, capsys):
    assert main(["plot", "context", MODEL, "--machine", MACHINE, "--out", str(tmp_path / "no" / "x.png")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["plot", "pie", "--out", "x.png"]) == 2
    assert main(["plot", "cache", MODEL, "--machine", MACHINE, "--cache-sizes", "8,x", "--out", "x.png"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err
