"""The exported page in a real browser: Debian's chromium, headless, driven by Playwright's Python
package (nothing is downloaded: ``executable_path`` is the system browser). The page is opened from
``file://``, a machine is picked, and the table's rows must be the machine file's rows; any console
error fails the test; a screenshot must not be blank.

Skips when chromium or playwright is missing, except under CI (CI=true), where .ci/run installs them
and their absence is a failure."""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from moesim.analysis.site import ROW_FIELDS, site_data
from moesim.report.site import write_site

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SPEC = {"axes": {"models": ["qwen3-30b-a3b", "mixtral-8x7b"], "quants": ["Q4_K_M", "Q8_0"],
                 "machines": [{"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "gpu box"},
                              {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64, "pcie": "gen3x16",
                               "name": "gpu box gen3"},
                              {"host": "ddr5-4800x8", "host_mem_gb": 256, "name": "cpu box"},
                              {"gpu": "rtx-3060", "host": "ddr4-3200x2", "host_mem_gb": 4, "storage": "none",
                               "name": "small box"}],
                 "contexts": [2048, 8192, 32768], "batches": [1, 2]},
        "filter": {"fits": True}, "site": {"title": "browser test site"}}


def _browser_or_skip():
    missing = []
    if CHROMIUM is None:
        missing.append("chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install \".[test]\")")
    if missing:
        why = "the page test needs " + " and ".join(missing)
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(why + " under CI: .ci/run installs chromium, and pip install \".[test]\" playwright")
        pytest.skip(why)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _browser_or_skip()
    out = tmp_path_factory.mktemp("site")
    write_site(site_data(SPEC, threads=1), out)
    return out


@pytest.fixture(scope="module")
def browser():
    _browser_or_skip()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    pg = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors = []
    pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    pg.console_errors = errors
    yield pg
    pg.close()
    assert not errors, errors


def machine_rows(site: Path, machine_id: str) -> list:
    import json
    index = json.loads((site / "index.json").read_text())
    entry = next(m for m in index["machines"] if m["id"] == machine_id)
    f = json.loads((site / entry["file"]).read_text())
    return [dict(zip(f["fields"], r)) for r in f["rows"]]


def shown_rows(pg) -> list:
    """Each table row: its key (data attributes), each cell's exact value (data-value) and the 80 %
    interval shown under a speed ({field: [lo, hi]} from the span's data attributes)."""
    return pg.eval_on_selector_all("#results tbody tr", """trs => trs.map(tr => ({
        model: tr.dataset.model, quant: tr.dataset.quant, rule: tr.dataset.placementRule,
        cells: Object.fromEntries([...tr.cells].map(td => [td.dataset.field, td.dataset.value])),
        intervals: Object.fromEntries([...tr.cells].filter(td => td.querySelector('.interval')).map(td => {
            const s = td.querySelector('.interval');
            return [td.dataset.field, [Number(s.dataset.lo), Number(s.dataset.hi), s.textContent]]; }))}))""")


def cell_value(text: str, field: str):
    if field in ("model", "quant", "runtime", "placement", "fits", "bottleneck"):
        return text
    return None if text == "" else float(text)


def check_table(pg, rows: list, context: int, batch: int) -> list:
    """The table shows exactly the machine file's rows that fit at this context and batch, with their
    numbers, sorted by decode tok/s (fastest first)."""
    want = [r for r in rows if r["context"] == context and r["batch"] == batch and r["fits"] != "no"]
    got = shown_rows(pg)
    assert sorted((g["model"], g["quant"]) for g in got) == sorted((r["model"], r["quant"]) for r in want)
    by_key = {(r["model"], r["quant"], r["placement_rule"]): r for r in want}
    for g in got:
        r = by_key[(g["model"], g["quant"], g["rule"])]
        for field, text in g["cells"].items():
            assert field in ROW_FIELDS
            assert cell_value(text, field) == r[field], (field, text, r[field])
        assert {"decode_tok_s", "max_context", "placement", "fits", "weights_bytes"} <= set(g["cells"])
        for field in ("decode_tok_s", "prefill_tok_s"):     # the interval is shown exactly where the row has one
            if r.get(f"{field}_lo") is None:
                assert field not in g["intervals"]
            else:
                lo, hi, text = g["intervals"][field]
                assert (lo, hi) == (r[f"{field}_lo"], r[f"{field}_hi"]) and "\u2013" in text
                assert lo <= r[field] <= hi
    speeds = [float(g["cells"]["decode_tok_s"]) for g in got]
    assert speeds == sorted(speeds, reverse=True)
    return got


def non_blank(png: bytes) -> tuple:
    """(distinct colours, share of the commonest colour) of a PNG."""
    from PIL import Image
    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 24)
    return len(colours), max(n for n, _ in colours) / (img.width * img.height)


def test_page_from_file_url_shows_the_machine_files_rows(site, page, tmp_path):
    page.goto((site / "index.html").as_uri())
    page.wait_for_selector("#results tbody tr")
    page.evaluate("console.error('probe')")         # the listener that fails the test hears errors
    assert page.console_errors == ["console.error: probe"]
    page.console_errors.clear()
    assert page.title() == "browser test site"
    # pick the CPU-only machine: GPU "none" leaves one RAM size and one channel count
    page.select_option("#pick-gpu", "none (CPU only)")
    page.wait_for_function("document.getElementById('status').textContent.includes('cpu box')")
    assert page.input_value("#pick-ram") == "256" and page.input_value("#pick-channels") == "8"
    cpu_rows = machine_rows(site, "cpu box")
    got = check_table(page, cpu_rows, int(page.input_value("#pick-context")), 1)
    assert got, "nothing shown for the CPU box"
    # another context and batch, then the GPU box
    page.select_option("#pick-context", "32768")
    page.select_option("#pick-batch", "2")
    check_table(page, cpu_rows, 32768, 2)
    page.select_option("#pick-gpu", "rtx-4090")
    page.wait_for_function("document.getElementById('status').textContent.includes('gpu box')")
    gpu_rows = machine_rows(site, "gpu box")
    page.select_option("#pick-context", "8192")
    got = check_table(page, gpu_rows, 8192, 2)
    assert any("decode_tok_s" in g["intervals"] for g in got), "no 80 % interval shown"
    # sorting by a column and filtering by text
    page.click("#results th[data-key='decode_tok_s']")
    speeds = [float(g["cells"]["decode_tok_s"]) for g in shown_rows(page)]
    assert speeds == sorted(speeds) and len(speeds) == len(got)
    page.fill("#filter-text", "mixtral q8")
    assert {(g["model"], g["quant"]) for g in shown_rows(page)} <= {("mixtral-8x7b", "Q8_0")}
    page.fill("#filter-text", "")
    check_detail(page, gpu_rows, 8192, 2)
    png = page.screenshot(path=str(tmp_path / "site.png"), full_page=True)
    if os.environ.get("MOESIM_SITE_SCREENSHOT"):
        shutil.copy(tmp_path / "site.png", os.environ["MOESIM_SITE_SCREENSHOT"])
    colours, commonest = non_blank(png)
    assert colours > 32 and commonest < 0.9, (colours, commonest)
    assert not page.console_errors, page.console_errors


def check_detail(pg, rows: list, context: int, batch: int) -> None:
    """One model's chart has a line per quant, its flags the rows' flags at the chosen context."""
    pg.click("#results tbody tr:first-child button.link")
    pg.wait_for_selector("#chart svg path.series")
    model = pg.get_attribute("#results tbody tr.open", "data-model")
    mine = [r for r in rows if r["model"] == model and r["batch"] == batch and r["fits"] != "no"]
    quants = sorted({r["quant"] for r in mine})
    assert pg.locator("#chart svg path.series").count() == len(quants)
    assert pg.locator("#chart svg circle").count() == len(mine)
    flags = pg.eval_on_selector_all("#flags tbody tr", "trs => trs.map(tr => tr.querySelector('code').textContent)")
    want = []
    for q in quants:
        at = sorted((r for r in mine if r["quant"] == q and r["context"] <= context), key=lambda r: r["context"])
        want.append(at[-1]["flags"])
    assert sorted(flags) == sorted(want)


def test_machines_that_share_gpu_ram_and_channels_get_a_fourth_choice(site, page):
    page.goto((site / "index.html").as_uri())
    page.wait_for_function("document.getElementById('status').textContent.includes('gpu box')")
    assert page.is_visible("#pick-machine")
    assert page.eval_on_selector_all("#pick-machine option", "os => os.map(o => o.value)") == ["gpu box",
                                                                                              "gpu box gen3"]
    page.select_option("#pick-machine", "gpu box gen3")
    page.wait_for_function("document.getElementById('status').textContent.includes('gpu box gen3')")
    check_table(page, machine_rows(site, "gpu box gen3"), int(page.input_value("#pick-context")), 1)
    assert "gen3x16" in page.inner_text("#machine-description")
    page.select_option("#pick-gpu", "none (CPU only)")
    assert not page.is_visible("#pick-machine")
    assert not page.console_errors, page.console_errors


def test_a_machine_where_nothing_fits_says_so(site, page):
    page.goto((site / "index.html").as_uri() + "#machine=small%20box")
    page.wait_for_function("document.getElementById('status').textContent.includes('small box')")
    assert machine_rows(site, "small box") == []
    assert "Nothing in this export fits small box" in page.inner_text("#status")
    assert page.locator("#results tbody tr").count() == 0
    assert not page.console_errors, page.console_errors
