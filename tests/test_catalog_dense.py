"""The catalog's breadth entries (dense models people compare against, siblings of the MoE families) and
the Hugging Face ids every entry answers to.

Published counts and per-token cache sizes are written out here, not read from the catalog, so that a
catalog edit cannot make a test agree with itself.
"""
from __future__ import annotations

import json

import pytest

import moesim
from moesim import ingest
from moesim.cli import main
from moesim.engine import memory as mem
from moesim.errors import MoesimError
from moesim.spec import hardware
from moesim.spec import models as M

# The entries this change adds (tests/test_catalog.py covers their parameter counts through the tables below).
NEW_MOE = [
    "deepseek-v2", "deepseek-coder-v2", "deepseek-v3.1", "qwen1.5-moe-a2.7b", "qwen3-coder-480b-a35b",
    "qwen3-30b-a3b-2507", "qwen3-235b-a22b-2507", "glm-4.7", "kimi-k2-thinking", "ernie-4.5-21b-a3b",
    "tongyi-deepresearch-30b-a3b",
]
DENSE_NEW = [
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.3-70b",
    "deepseek-r1-distill-llama-70b", "qwen2-7b", "qwen2-72b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
    "qwen2.5-32b", "qwen2.5-72b", "qwq-32b", "deepseek-r1-distill-qwen-32b", "qwen3-0.6b", "qwen3-1.7b",
    "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "mistral-7b-v0.3", "mistral-nemo-12b", "mistral-small-22b",
    "ministral-8b", "mistral-large-2", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b",
    "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "phi-3-medium", "phi-3.5-mini", "phi-4-mini", "aya-23-8b",
]
NEW_IDS = NEW_MOE + DENSE_NEW

# Active-parameter checks for the new entries, imported by tests/test_catalog.py into its own tables
# (figure, counting convention as there). Dense models: active == total, the vendor figure in catalog.
NEW_PRECISE_ACTIVE = {
    "deepseek-v2": (21e9, "no_embed"),            # README 21B activated; derived 20.86B without the table
    "deepseek-coder-v2": (21e9, "no_embed"),
    "deepseek-v3.1": (36.6e9, "no_embed"),        # as DeepSeek-V3 (TTM README_WEIGHTS)
    "qwen1.5-moe-a2.7b": (2.7e9, "all"),          # model card 2.7B activated; derived 2.69B
    "qwen3-coder-480b-a35b": (35e9, "all"),       # name A35B; derived 35.5B
    "qwen3-235b-a22b-2507": (22e9, "all"),
    "glm-4.7": (32e9, "no_embed_head"),           # as GLM-4.5/4.6
    "kimi-k2-thinking": (32e9, "no_embed"),       # as Kimi-K2
}
# "A3B" names only: qwen3-30b-a3b-2507 and Tongyi as qwen3-30b-a3b; ERNIE-4.5-21B-A3B +2.9 % without the
# (tied) table
NEW_LOOSE_ACTIVE = {"qwen3-30b-a3b-2507", "ernie-4.5-21b-a3b", "tongyi-deepresearch-30b-a3b"}


@pytest.fixture(scope="module")
def h200():
    return hardware.machine("dgx-h200")


def test_breadth_entries_are_in_the_catalog():
    ids = set(M.model_ids())
    assert len(set(NEW_IDS)) == len(NEW_IDS) >= 42
    assert not set(NEW_IDS) - ids


@pytest.mark.parametrize("mid", DENSE_NEW)
def test_dense_entries_are_dense_and_match_published_totals(mid):
    m = ingest.model(mid)
    total, active = m.param_counts()
    assert m.n_experts == 0 and active == total
    if mid == "gemma-3-4b":         # its 4B headline counts the vision encoder this entry leaves out
        assert m.published_total_params is None and 3.8e9 < total < 3.9e9
    else:
        assert total == pytest.approx(m.published_total_params, rel=0.03)


@pytest.mark.parametrize("mid", NEW_IDS)
def test_new_entry_fits_and_simulates_analytic(mid, h200):
    rows = moesim.fit(mid, h200, quants=["Q4_K_M"], context=4096)
    assert rows[0]["fits"].startswith("gpu"), rows[0]["fits"]
    assert rows[0]["max_context"] >= 4096
    r = moesim.simulate(mid, h200, quant="Q4_K_M", context=4096, mode="analytic", tokens=16)
    assert r.decode_tok_s > 0


# ------------------------------------------------------------------ sliding windows
def _kv(mid, context, machine):
    return mem.memory(mid, machine, "bf16", context=context, kv_dtype="f16").kv


def test_gemma2_kv_alternates_window_and_global(h200):
    # Gemma-2-9B: 42 layers, even ones slide over 4096 tokens; 8 KV heads x 256 x (K, V) x 2 B = 8192 B
    # per layer per token. At 8192 tokens: 21 global layers hold 8192 tokens, 21 sliding hold 4096.
    per_layer_token = 8 * 256 * 2 * 2
    assert _kv("gemma-2-9b", 8192, h200) == 21 * per_layer_token * 8192 + 21 * per_layer_token * 4096


def test_gemma3_kv_five_sliding_layers_per_global(h200):
    # Gemma-3-27B: 62 layers, every sixth (5, 11, ..., 59) global = 10, the other 52 slide over 1024
    # tokens; 16 KV heads x 128 x 2 x 2 B = 8192 B per layer per token. At 32768 tokens:
    per_layer_token = 16 * 128 * 2 * 2
    expected = 10 * per_layer_token * 32768 + 52 * per_layer_token * 1024
    assert expected == 3_120_562_176
    assert _kv("gemma-3-27b", 32768, h200) == expected
    # past the window only the global layers grow
    assert _kv("gemma-3-27b", 16384, h200) == expected - 10 * per_layer_token * 16384


def test_phi3_window_not_applied_and_qwen_window_off(h200):
    # llama.cpp disables Phi-3 SWA: Phi-3-medium caches all 4096 tokens on all 40 layers (10 KV heads x 128)
    assert _kv("phi-3-medium", 4096, h200) == 40 * 10 * 128 * 2 * 2 * 4096
    # Qwen2.5 configs carry sliding_window 131072 with use_sliding_window false: no cap on any layer
    assert all(l.attention.window == 0 for l in ingest.model("qwen2.5-7b").layers)


# Parameters stored in the Hub safetensors (the Hub API's safetensors.total, copies in
# daniel-p-green/alain-ai-learning-platform@522537bc out/research-*/sources/huggingface/model.json)
HUB_SAFETENSORS_TOTAL = {
    "llama-3.2-1b": 1_235_814_400,
    "deepseek-r1-distill-qwen-32b": 32_763_876_352,
    "gemma-3-1b": 999_885_952,
    "ernie-4.5-21b-a3b": 21_825_437_888,      # ERNIE-4.5-21B-A3B-Thinking, same architecture
    "tongyi-deepresearch-30b-a3b": 30_532_122_624,
}
# what the tensor inventory leaves out: Gemma 3's post-attention and post-FFN norms (2 x 1152 per layer);
# ERNIE's router score-correction bias (64 experts x 27 MoE layers), which the ernie4_5_moe reader omits
NOT_MODELLED = {"gemma-3-1b": 26 * 2 * 1152, "ernie-4.5-21b-a3b": 1_728}


@pytest.mark.parametrize("mid", sorted(HUB_SAFETENSORS_TOTAL))
def test_derived_total_matches_the_hub_safetensors_count(mid):
    total, _ = ingest.model(mid).param_counts()
    assert total + NOT_MODELLED.get(mid, 0) == HUB_SAFETENSORS_TOTAL[mid]


def test_kimi_k2_thinking_ships_int4_experts():
    m = ingest.model("kimi-k2-thinking")
    assert m.native_quant == "int4-g32" and m.max_context == 262144
    assert m.param_counts() == ingest.model("kimi-k2").param_counts()


def test_gemma_ties_embeddings_by_default():
    # Gemma2Config/CohereConfig default tie_word_embeddings to true and the configs omit the key
    for mid in ("gemma-2-9b", "gemma-3-27b", "aya-23-8b"):
        m = ingest.model(mid)
        assert m.tie_embeddings
        assert "output.weight" not in {t.name for t in m.tensors()}


def test_a_tied_head_reads_the_embedding_matrix_every_token():
    # the output GEMV multiplies by vocab x hidden whether or not the checkpoint stores it twice
    from moesim.engine.lower import decode_model as dm, memory as lm
    tied, untied = ingest.model("gemma-3-4b"), ingest.model("qwen2.5-7b")
    low_t, low_u = lm.lower(tied, "Q4_0"), lm.lower(untied, "Q4_0")
    assert low_t.head < 1e6 < low_t.embed
    assert dm.head_read_bytes(tied, low_t) == low_t.head + low_t.embed
    assert dm.head_read_bytes(untied, low_u) == low_u.head
    box = moesim.machine(gpu="rtx-4090")
    r = moesim.simulate("gemma-3-4b", quant="Q4_0", machine=box, context=512, mode="analytic")
    assert r.bytes_per_token["gpu_memory"] >= low_t.embed + low_t.attn.sum() + low_t.dense.sum()
    assert r.breakdown["by_phase"]["head_drafts"] > 0.1 * r.breakdown["seconds_per_token"]


def test_llama_cpp_loads_a_tied_head_again_on_a_discrete_gpu():
    # TENSOR_DUPLICATED: the input embeddings stay on the CPU and the output gets its own copy on the GPU
    from moesim.engine.lower import memory as lm
    low = lm.lower(ingest.model("gemma-3-27b"), "Q4_K_M")

    def head_gpu(mid, gpu, runtime=None):
        r = moesim.simulate(mid, quant="Q4_K_M", machine=moesim.machine(gpu=gpu), context=4096, mode="analytic",
                            **({"runtime": runtime} if runtime else {}))
        tier = r.memory["memory_by_tier"]["unified" if "unified" in r.memory["memory_by_tier"] else "gpu"]
        return tier["by_class"].get("lm_head", 0.0)

    assert head_gpu("gemma-3-27b", "rtx-4090") == low.head + low.embed
    assert head_gpu("gemma-3-27b", "m2-ultra") == low.head          # the Metal buffer maps the same pages
    untied = lm.lower(ingest.model("qwen2.5-7b"), "Q4_K_M")
    assert head_gpu("qwen2.5-7b", "rtx-4090") == untied.head


# ------------------------------------------------------------------ Hugging Face ids
ENTRIES = moesim._catalog.load("models")["models"]
ALL_HF = [(hf, mid) for mid, e in ENTRIES.items() for hf in e.get("hf_ids", [])]


def test_every_entry_lists_hf_ids_and_they_are_unique():
    assert all(isinstance(e.get("hf_ids"), list) for e in ENTRIES.values()), \
        [mid for mid, e in ENTRIES.items() if not isinstance(e.get("hf_ids"), list)]
    lowered = [hf.lower() for hf, _ in ALL_HF]
    assert len(lowered) == len(set(lowered))
    assert not set(lowered) & set(ENTRIES)
    assert all(hf.count("/") == 1 for hf, _ in ALL_HF)


@pytest.mark.parametrize("hf, mid", ALL_HF)
def test_every_hf_id_resolves_to_its_entry(hf, mid):
    assert M.resolve_model_id(hf) == mid
    assert ingest.model(hf).id == mid
    assert ingest.model(hf.upper()).id == mid
    assert M.is_catalog_id(hf)


def test_hf_id_through_the_api(h200):
    m = moesim.model("deepseek-ai/DeepSeek-R1")
    assert m.id == "deepseek-r1" and m is moesim.model("deepseek-r1")
    assert M.hf_config("DEEPSEEK-AI/deepseek-r1") == M.hf_config("deepseek-r1")
    rows = moesim.fit("deepseek-ai/DeepSeek-R1", h200, quants=["Q4_K_M"])
    assert rows[0]["model"] == "deepseek-r1"


def test_hf_id_in_a_sweep():
    table = moesim.sweep(models=["meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"], quants=["Q4_K_M"],
                         machines=["dgx-h200"], contexts=[4096], batches=[1], mode="analytic", threads=1)
    assert len(table) == 2
    assert {str(v) for v in table["model"]} == {"llama-3.1-8b"}


def test_a_local_snapshot_named_like_an_hf_id_is_read_from_disk(tmp_path, monkeypatch):
    # ./Qwen/Qwen3-8B holding a config.json is the user's files, not the catalog entry
    d = tmp_path / "Qwen" / "Qwen3-8B"
    d.mkdir(parents=True)
    cfg = dict(M.hf_config("qwen3-8b"), num_hidden_layers=2)
    (d / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    assert ingest.model("Qwen/Qwen3-8B").n_layers == 2
    assert ingest.model("Qwen/Qwen3-14B").id == "qwen3-14b"        # no such directory: the alias


def test_unknown_hf_id_names_field_and_nearest():
    with pytest.raises(MoesimError) as e:
        ingest.model("deepseek-ai/DeepSeek-R9")
    assert e.value.field == "model"
    assert "deepseek-ai/DeepSeek-R1" in str(e.value) and "did you mean" in str(e.value)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


MACHINE = ["--gpu", "h200", "--gpus", "8"]


def test_cli_fit_and_simulate_accept_hf_ids(capsys):
    code, out, err = run(capsys, "fit", "Qwen/Qwen3-30B-A3B", *MACHINE, "--quant", "Q4_K_M", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["model"] == "qwen3-30b-a3b"
    code, out, err = run(capsys, "simulate", "google/gemma-3-27b-it", *MACHINE, "--quant", "Q4_K_M",
                         "--mode", "analytic", "--tokens", "16", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "gemma-3-27b"


def test_cli_unknown_hf_id_one_line(capsys):
    code, _, err = run(capsys, "fit", "meta-llama/Llama-9.9-8B", *MACHINE)
    assert code == 2 and err.count("\n") == 1 and err.startswith("moesim: error: model:")
    assert "did you mean" in err and "Traceback" not in err


def test_models_listing_shows_hf_ids(capsys):
    code, out, _ = run(capsys, "models", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and rows["deepseek-r1"]["hf_ids"][0] == "deepseek-ai/DeepSeek-R1"
    assert rows["inkling"]["hf_ids"] == []
    code, out, _ = run(capsys, "models")
    line = next(l for l in out.splitlines() if l.startswith("gemma-3-27b "))
    assert "google/gemma-3-27b-it" in line
