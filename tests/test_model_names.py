"""The names people write for a catalog model resolve to it (spec.models.resolve_model_id): Hugging Face repo
names without their organisation, Ollama tags, chat-tuned suffixes; names of other models still error."""
from __future__ import annotations

import pytest

import moesim
from moesim.spec.models import resolve_model_id


@pytest.mark.parametrize("name,mid", [
    ("Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b-2507"),      # repo name of an hf_ids alias
    ("qwen3-30b-a3b-instruct-2507", "qwen3-30b-a3b-2507"),
    ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("gpt-oss:20b", "gpt-oss-20b"),                               # Ollama tag
    ("llama-3-8b-instruct", "llama-3-8b"),                        # chat-tuned suffix on a catalog id
    ("gemma-3-27b-it", "gemma-3-27b"),
    ("qwen3-next-80b-a3b-instruct", "qwen3-next-80b-a3b"),
    ("QWEN3-30B-A3B", "qwen3-30b-a3b"),
])
def test_spellings_resolve(name, mid):
    assert resolve_model_id(name) == mid
    assert moesim.model(name).id == mid


@pytest.mark.parametrize("name", ["qwen3:30b", "llama-3-9b-instruct", "instruct", "mixtral-8x7b-instructx"])
def test_other_names_still_error_with_suggestions(name):
    assert resolve_model_id(name) is None
    with pytest.raises(moesim.MoesimError, match="did you mean"):
        moesim.model(name)


def test_every_catalog_id_and_alias_resolves_to_itself():
    from moesim.spec.models import _hf_alias_index, model_ids
    for mid in model_ids():
        assert resolve_model_id(mid) == mid
    for alias, mid in _hf_alias_index().items():
        assert resolve_model_id(alias) == mid
