"""``moesim export-site``: the files it writes, their JSON Schemas, the schema version guard, and its
errors. The page itself is driven in a browser by tests/test_site_browser.py."""
from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import jsonschema
import pytest

import moesim
from moesim.analysis.site import ROW_FIELDS, site_data
from moesim.analysis.sweep import sweep
from moesim.cli import main
from moesim.report.site import KINDS, SCHEMA_VERSION, STATIC_FILES, load_schema, write_site

ROOT = Path(__file__).resolve().parents[1]
GPU_BOX = {"gpu": "rtx-4090", "host": "ddr5-6000x2", "host_mem_gb": 64, "name": "4090 64g"}
CPU_BOX = {"host": "ddr5-4800x8", "host_mem_gb": 256, "name": "cpu 256g"}
SPEC = {"site": {"title": "test site"},
        "axes": {"models": ["qwen3-30b-a3b", "mixtral-8x7b"], "quants": ["Q4_K_M", "Q8_0"],
                 "machines": [GPU_BOX, CPU_BOX], "contexts": [2048, 8192, 32768], "batches": [1, 2]},
        "filter": {"fits": True}}

# Every version of the site schema: its field lists and a fingerprint of the schema files (types and
# descriptions included). Never edit a past entry: a change to any field (added, removed, renamed, a new
# type or meaning) is a new version, SCHEMA_VERSION + 1 in moesim/report/site/writer.py, the "$id" and
# "schema_version" const of each schema/*.schema.json, and a new entry here.
SCHEMA_HISTORY = {
    1: {"index": ("kind", "schema_version", "moesim_version", "catalog_version", "title", "description", "sweep",
                  "fields", "machines", "models", "quants", "runtimes", "placement_rules", "contexts", "batches",
                  "schemas"),
        "machine": ("kind", "schema_version", "moesim_version", "catalog_version", "machine", "fields", "rows"),
        "model": ("kind", "schema_version", "moesim_version", "catalog_version", "model", "fields", "rows"),
        "machine_entry": ("id", "description", "gpu", "gpus", "unified", "gpu_mem_gb", "gpu_bw_gbs", "ram_gb",
                          "host_memory", "channels", "sockets", "host_bw_gbs", "pcie", "storage", "file", "script",
                          "rows"),
        "model_entry": ("id", "name", "family", "total_params", "active_params", "layers", "experts", "top_k",
                        "max_context", "file", "script", "rows"),
        "row": ("model", "quant", "machine", "runtime", "kv_dtype", "placement_rule", "placement", "policy", "batch",
                "context", "fits", "weights_bytes", "kv_bytes", "state_bytes", "gpu_bytes", "host_bytes",
                "storage_bytes", "max_context", "max_batch", "decode_tok_s", "aggregate_tok_s", "tpot_ms",
                "tpot_p99_ms", "prefill_tok_s", "expert_hit_rate", "bottleneck", "flags"),
        "fingerprint": "015faa566a12e7d7645e60ed925baa11e0f81bd762e13e5694d07508e2f9b23a"},
}
# 2: the 80 % prediction interval of decode and prefill tok/s (analysis.intervals) after prefill_tok_s
_ROW_1 = SCHEMA_HISTORY[1]["row"]
SCHEMA_HISTORY[2] = dict(SCHEMA_HISTORY[1], row=_ROW_1[:_ROW_1.index("prefill_tok_s") + 1] + (
    "decode_tok_s_lo", "decode_tok_s_hi", "prefill_tok_s_lo", "prefill_tok_s_hi") + _ROW_1[_ROW_1.index(
        "prefill_tok_s") + 1:], fingerprint="addea665d89388d86fe72551261bef8c49c31e4a6343b8588339426342653d79")


@pytest.fixture(scope="module")
def data():
    return site_data(SPEC, threads=1)


@pytest.fixture(scope="module")
def site(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    write_site(data, out)
    return out


def read(site: Path, rel: str) -> dict:
    return json.loads((site / rel).read_text(encoding="utf-8"))


def schema_fields(schemas: dict) -> dict:
    defs = schemas["index"]["$defs"]
    return {"index": tuple(schemas["index"]["properties"]), "machine": tuple(schemas["machine"]["properties"]),
            "model": tuple(schemas["model"]["properties"]),
            "machine_entry": tuple(defs["machine"]["properties"]), "model_entry": tuple(defs["model"]["properties"]),
            "row": tuple(item["title"] for item in defs["row"]["prefixItems"])}


def fingerprint(schemas: dict) -> str:
    """The schemas' content without what names the version (their $id and schema_version const)."""
    bare = copy.deepcopy(schemas)
    for s in bare.values():
        s.pop("$id")
        s["properties"].pop("schema_version")
    return hashlib.sha256(json.dumps(bare, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------ files
def test_export_writes_index_machines_models_schemas_and_page(site, data):
    index = read(site, "index.json")
    assert index["kind"] == "index" and index["schema_version"] == SCHEMA_VERSION
    assert index["moesim_version"] == moesim.__version__ and index["title"] == "test site"
    assert [m["id"] for m in index["machines"]] == ["4090 64g", "cpu 256g"]
    assert [m["id"] for m in index["models"]] == ["qwen3-30b-a3b", "mixtral-8x7b"]
    assert index["quants"] == ["Q4_K_M", "Q8_0"] and index["contexts"] == [2048, 8192, 32768]
    assert index["batches"] == [1, 2] and index["fields"] == list(ROW_FIELDS)
    total = 0
    for kind, entries in (("machine", index["machines"]), ("model", index["models"])):
        for e in entries:
            f = read(site, e["file"])
            assert f["kind"] == kind and f[kind] == e and len(f["rows"]) == e["rows"] > 0
            assert all(r[ROW_FIELDS.index(kind)] == e["id"] for r in f["rows"])
            script = (site / e["script"]).read_text(encoding="utf-8")
            assert script == "moesimSite.receive(" + (site / e["file"]).read_text(encoding="utf-8") + ");\n"
            total += e["rows"]
    assert total == 2 * len(data["rows"])          # each row once in its machine's file, once in its model's
    for name in STATIC_FILES:
        assert (site / name).stat().st_size > 0
    for kind in KINDS:
        assert read(site, index["schemas"][kind]) == load_schema(kind)
    html = (site / "index.html").read_text(encoding="utf-8")
    assert "index.json.js" in html and "site.js" in html and "http" not in html.replace("http-equiv", "")


def test_page_assets_reach_nothing_outside_the_folder():
    """No CDN, no fetch (blocked on file://), no absolute URL but the SVG namespace."""
    for name in STATIC_FILES:
        text = (ROOT / "src/moesim/report/site/static" / name).read_text(encoding="utf-8")
        assert "fetch(" not in text and "XMLHttpRequest" not in text and "import(" not in text
        urls = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (name, urls)


def test_rows_are_the_sweeps_numbers(data, site):
    """The exported numbers are the sweep's, to the written precision, with the flags fit prints."""
    raw = {k: v for k, v in SPEC.items() if k != "site"}
    tab = sweep(raw, threads=1).to_dicts()
    assert len(tab) == len(data["rows"]) > 0
    rows = read(site, read(site, "index.json")["machines"][0]["file"])["rows"]
    by_key = {tuple(r[k] for k in ("model", "quant", "machine", "context", "batch")): r for r in tab}
    for row in rows:
        r = dict(zip(ROW_FIELDS, row))
        s = by_key[(r["model"], r["quant"], r["machine"], r["context"], r["batch"])]
        assert r["placement"] == s["placement"] and r["fits"] == s["fits"] and r["placement_rule"] == "auto"
        assert r["max_context"] == s["max_context"] and r["gpu_bytes"] == s["gpu_bytes"]
        for f in ("decode_tok_s", "prefill_tok_s", "tpot_ms", "aggregate_tok_s"):
            assert r[f] == pytest.approx(s[f], rel=1e-5)
    r = dict(zip(ROW_FIELDS, rows[0]))
    rec = moesim.fit(r["model"], moesim.machine(**{k: v for k, v in GPU_BOX.items() if k != "name"}),
                     quants=[r["quant"]], context=r["context"], batch=r["batch"])[0]
    assert (rec["placement"], rec["flags"]) == (r["placement"], r["flags"])


def test_each_placement_rule_is_swept_and_labelled():
    spec = copy.deepcopy(SPEC)
    spec["axes"].update(models=["qwen3-30b-a3b"], quants=["Q8_0"], machines=[GPU_BOX], contexts=[8192], batches=[1],
                        placements=["auto", "experts-cpu"])
    rows = [dict(zip(ROW_FIELDS, r)) for r in site_data(spec, threads=1)["rows"]]
    assert [r["placement_rule"] for r in rows] == ["auto", "experts-cpu"]
    assert rows[0]["placement"] != "experts-cpu" and rows[1]["placement"] == "experts-cpu"
    assert ' -ngl 999 --cpu-moe ' in rows[1]["flags"] or '\\.ffn_.*_exps\\.=CPU' in rows[1]["flags"], rows[1]["flags"]
    spec["axes"]["runtimes"] = ["auto", "llama.cpp"]          # the same configuration twice: one row
    assert len(site_data(spec, threads=1)["rows"]) == 2


# ------------------------------------------------------------------------------ schemas
def test_every_file_validates_against_its_schema(site):
    for kind in KINDS:
        jsonschema.Draft202012Validator.check_schema(load_schema(kind))
    index = read(site, "index.json")
    jsonschema.validate(index, load_schema("index"), cls=jsonschema.Draft202012Validator)
    for kind, entries in (("machine", index["machines"]), ("model", index["models"])):
        for e in entries:
            jsonschema.validate(read(site, e["file"]), load_schema(kind), cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("mutate", [
    lambda f: f["rows"][0].__setitem__(ROW_FIELDS.index("decode_tok_s"), "fast"),
    lambda f: f["rows"][0].append(1.0),
    lambda f: f["rows"][0].pop(),
    lambda f: f["rows"][0].__setitem__(ROW_FIELDS.index("context"), 0),
    lambda f: f["fields"].reverse(),
    lambda f: f.__setitem__("schema_version", SCHEMA_VERSION + 1),
    lambda f: f["machine"].pop("ram_gb"),
    lambda f: f.__setitem__("extra", 1),
], ids=["number-as-text", "extra-value", "missing-value", "context-0", "field-order", "version", "missing-entry-key",
        "unknown-key"])
def test_schema_refuses_a_changed_file(site, mutate):
    f = read(site, read(site, "index.json")["machines"][0]["file"])
    mutate(f)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(f, load_schema("machine"), cls=jsonschema.Draft202012Validator)


def test_schema_version_moves_with_the_fields():
    schemas = {k: load_schema(k) for k in KINDS}
    assert SCHEMA_VERSION == max(SCHEMA_HISTORY), "add this version's entry to SCHEMA_HISTORY"
    entry = SCHEMA_HISTORY[SCHEMA_VERSION]
    current = schema_fields(schemas)
    assert current == {k: v for k, v in entry.items() if k != "fingerprint"}, (
        "the site's fields changed without a new schema version: bump SCHEMA_VERSION and add an entry")
    assert fingerprint(schemas) == entry["fingerprint"], (
        f"the schema files changed (fingerprint {fingerprint(schemas)}): a field's type or meaning changed, so "
        "bump SCHEMA_VERSION and add an entry to SCHEMA_HISTORY (never edit a past one)")
    assert current["row"] == ROW_FIELDS
    fps = [e["fingerprint"] for e in SCHEMA_HISTORY.values()]
    assert len(set(fps)) == len(fps)
    for kind, s in schemas.items():
        assert s["$id"] == f"urn:moesim:site:schema:{SCHEMA_VERSION}:{kind}"
        assert s["properties"]["schema_version"] == {"const": SCHEMA_VERSION,
                                                     "description": s["properties"]["schema_version"]["description"]}
        assert s["$defs"] == schemas["index"]["$defs"]      # one definition of machines, models and rows
    assert schemas["index"]["$defs"]["fields"]["const"] == list(ROW_FIELDS)


# ------------------------------------------------------------------------------ the command
def write_spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "site.toml"
    p.write_text(text, encoding="utf-8")
    return p


SMALL_TOML = """
[site]
title = "small"
[axes]
models = ["qwen3-30b-a3b"]
quants = ["Q4_K_M"]
machines = [{gpu = "rtx-4090", host = "ddr5-6000x2", host_mem_gb = 64, name = "a"},
            {gpu = "rtx-3090", host = "ddr4-3200x2", host_mem_gb = 64, name = "b"}]
contexts = [4096]
"""


def test_cli_exports_and_reexports_into_its_own_folder(tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL_TOML)
    out = tmp_path / "site"
    assert main(["export-site", str(spec), "--out", str(out), "--threads", "1"]) == 0
    assert "site: 2 machines, 1 models, 2 rows" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "machines").iterdir()) == ["a.json", "a.json.js", "b.json", "b.json.js"]
    spec.write_text(SMALL_TOML.replace(',\n            {gpu = "rtx-3090", host = "ddr4-3200x2", host_mem_gb = 64, '
                                       'name = "b"}', ""), encoding="utf-8")
    assert main(["export-site", str(spec), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["machines"] == 1 and summary["rows"] == 1
    assert sorted(p.name for p in (out / "machines").iterdir()) == ["a.json", "a.json.js"]    # b's files gone


@pytest.mark.parametrize("text, field", [
    (SMALL_TOML.replace('title = "small"', 'colour = "red"'), "site.colour"),
    (SMALL_TOML.replace('title = "small"', "title = 3"), "site.title"),
    (SMALL_TOML.replace("[site]\ntitle = \"small\"", "site = 1"), "site"),
    (SMALL_TOML.replace("qwen3-30b-a3b", "qwen9"), "axes.models[0]"),
    (SMALL_TOML.replace('["Q4_K_M"]', '["Q4_K_M", "Q8_0"]') + 'placements = ["auto", "experts-cpu"]\n'
     '[zip]\ngroups = [["quants", "placements"]]\n', "zip"),
    (SMALL_TOML + "[junk]\n", "spec"),
    ("not toml [", "spec"),
])
def test_cli_bad_spec_is_one_line_naming_the_field(tmp_path, capsys, text, field):
    spec = write_spec(tmp_path, text)
    assert main(["export-site", str(spec), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moesim: error: {field}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "site").exists()


def test_cli_refuses_an_output_that_is_not_a_site(tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL_TOML)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    for out in (a_file, other):
        assert main(["export-site", str(spec), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("moesim: error: out: ") and err.count("\n") == 1, err
    assert (other / "notes.txt").read_text() == "keep me" and a_file.read_text() == "x"
    assert main(["export-site", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err.startswith("moesim: error: spec: cannot read")


def test_cli_refuses_a_folder_it_cannot_make_before_the_sweep(tmp_path, capsys, monkeypatch):
    """Regression (CLI fuzzer): --out under a file (spec.toml/x/y) was refused only after the whole sweep
    had run; now check_out refuses it first (the sweep is never called) and one line names it."""
    import moesim.analysis.site as site_mod
    spec = write_spec(tmp_path, SMALL_TOML)

    def no_sweep(*a, **k):
        raise AssertionError("the sweep ran before the folder was checked")
    monkeypatch.setattr(site_mod, "site_data", no_sweep)
    assert main(["export-site", str(spec), "--out", str(spec / "x" / "y")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moesim: error: out: cannot make ") and "is a file" in err and err.count("\n") == 1, err


def test_sample_site_spec_is_valid():
    """docs/examples/site.toml names catalog models, quants and machines (validated, not run here)."""
    from moesim.analysis.site import split_site_spec
    from moesim.analysis.sweep import build_spec, normalize_spec
    raw, site = split_site_spec(ROOT / "docs" / "examples" / "site.toml")
    norm = normalize_spec(build_spec(raw))
    assert site["title"] and len(norm["axes"]["machines"]) >= 2 and norm["filter"]["fits"] is True


def test_monte_carlo_rows_carry_percentiles_and_hit_rates_and_validate(tmp_path):
    spec = copy.deepcopy(SPEC)
    spec["axes"].update(models=["qwen3-30b-a3b"], quants=["Q4_K_M"], machines=[GPU_BOX], contexts=[4096],
                        batches=[1], placements=["offload-cache"])
    spec["run"] = {"mode": "montecarlo", "tokens": 64}
    data = site_data(spec, threads=1)
    (r,) = [dict(zip(ROW_FIELDS, row)) for row in data["rows"]]
    assert r["tpot_p99_ms"] >= r["tpot_ms"] > 0 and 0 <= r["expert_hit_rate"] <= 1
    assert r["placement"].startswith("offload-cache=")
    write_site(data, tmp_path)
    for kind, rel in (("index", "index.json"), ("machine", read(tmp_path, "index.json")["machines"][0]["file"])):
        jsonschema.validate(read(tmp_path, rel), load_schema(kind), cls=jsonschema.Draft202012Validator)


def test_site_rows_are_the_same_forked(data):
    """site_data with its sweeps forked over worker processes (export-site's default: one per core) gives the
    rows of one process, in the same order."""
    assert site_data(SPEC, threads=1, processes=2)["rows"] == data["rows"]


def test_launch_advice_reads_the_catalog_ubatch_of_every_runtime():
    """advice's default -ub (runtimes.catalog_ubatch) is the ubatch runtime() builds into each profile."""
    from moesim.spec.runtimes import catalog_ubatch, runtime, runtime_ids
    for rid in runtime_ids():
        assert catalog_ubatch(rid) == runtime(rid).ubatch == runtime(rid, model="deepseek-r1").ubatch
    with pytest.raises(moesim.MoesimError, match="runtime"):
        catalog_ubatch("no-such-runtime")
