"""Names people give a card the catalog lists as several (hardware.toml [gpu_names]): `--gpu h100` resolves to
one card and says which, `--gpu-mem-gb` picks among the sizes, and a name the catalog cannot place still
errors with suggestions."""
from __future__ import annotations

import pytest

import moesim
from moesim import _catalog


def _names() -> dict:
    return _catalog.load("hardware")["gpu_names"]


def test_every_name_lists_catalog_cards_and_shadows_none():
    h = _catalog.load("hardware")
    for name, entry in _names().items():
        assert name not in h["gpu"] and name not in h["unified"], name
        assert entry["cards"], name
        for card in entry["cards"]:
            assert card in h["gpu"] or card in h["unified"], (name, card)


@pytest.mark.parametrize("name", sorted(_names()))
def test_a_name_gives_its_first_card_and_says_so(name):
    m = moesim.machine(gpu=name)
    first = _names()[name]["cards"][0]
    assert m.gpu == first
    assert any(repr(name) in a and first in a for a in m.assumptions), m.assumptions


@pytest.mark.parametrize("name,mem,card", [("h100", 94, "h100-nvl"), ("h100", 80, "h100-sxm"),
                                           ("a100", 40, "a100-40gb"), ("rtx-4060-ti", 8, "rtx-4060-ti-8gb"),
                                           ("v100", 16, "v100-sxm2-16gb"), ("arc-a770", 8, "arc-a770-8gb")])
def test_memory_picks_the_nearest_card(name, mem, card):
    m = moesim.machine(gpu=name, gpu_mem_gb=mem)
    assert m.gpu == card
    assert any("nearest" in a for a in m.assumptions)


def test_a_named_card_predicts_as_its_catalog_id():
    a = moesim.simulate("qwen3-30b-a3b", moesim.machine(gpu="h100"), quant="Q4_K_M", mode="analytic")
    b = moesim.simulate("qwen3-30b-a3b", moesim.machine(gpu="h100-sxm"), quant="Q4_K_M", mode="analytic")
    assert a.decode_tok_s == b.decode_tok_s and a.prefill_tok_s == b.prefill_tok_s


def test_catalog_ids_are_taken_as_they_are_and_unknown_names_still_error():
    assert not any("taken as" in a for a in moesim.machine(gpu="h100-pcie").assumptions)
    with pytest.raises(moesim.MoesimError, match="unknown GPU 'h1000'"):
        moesim.machine(gpu="h1000")
