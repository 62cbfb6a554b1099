"""The package layout: imports flow one way, the enum mirror equals csrc/moesim.h, sizes stay readable."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from moesim.engine import codes
from moesim.spec.placement import PLACEMENTS

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "moesim.h"
PACKAGE = ROOT / "src" / "moesim"


def header_constants(text: str) -> dict:
    """Every ``MS_*`` integer the header defines: ``#define MS_X (n)`` and the members of each ``enum``."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = {}
    for name, value in re.findall(r"^\s*#define\s+MS_(\w+)\s+\(?\s*(-?\d+)\s*\)?\s*$", text, re.M):
        out[name] = int(value)
    for body in re.findall(r"\benum\s*\{(.*?)\}", text, re.S):
        nxt = 0
        for item in (x.strip() for x in body.split(",")):
            if not item:
                continue
            name, _, value = (p.strip() for p in item.partition("="))
            nxt = int(value, 0) if value else nxt
            out[name.removeprefix("MS_")] = nxt
            nxt += 1
    return out


def test_header_parser_reads_defines_and_enums():
    parsed = header_constants("#define MS_A (-3)\n/* c */ enum { MS_X = 0, MS_Y, /* z */ MS_Z = 5, MS_W };")
    assert parsed == {"A": -3, "X": 0, "Y": 1, "Z": 5, "W": 6}


def test_enum_mirror_equals_moesim_h():
    header = header_constants(HEADER.read_text())
    mirrored = {k: v for k, v in vars(codes).items() if k.isupper() and isinstance(v, int)}
    assert mirrored, "engine.codes defines no constants"
    wrong = {k: (v, header.get(k)) for k, v in mirrored.items() if header.get(k) != v}
    assert not wrong, f"engine.codes disagrees with moesim.h (python, C): {wrong}"
    groups = ("ERR_", "CLASS_", "TIER_", "PLACE_", "FITS_", "EXP_", "POLICY_", "MODE_", "RES_", "BYTES_", "PHASE_",
              "SWEEP_", "MAX_")
    missing = sorted(k for k in header if k.startswith(groups) and k not in mirrored)
    assert not missing, f"moesim.h codes with no Python mirror in engine.codes: {missing}"


def test_every_placement_name_has_a_kernel_code():
    assert set(PLACEMENTS) == set(codes.PLACEMENT_CODES)
    assert sorted(codes.PLACEMENT_CODES.values()) == list(range(codes.N_PLACEMENTS))
    assert sorted(codes.POLICIES.values()) == list(range(codes.N_POLICIES))


def test_import_layers_contract():
    """spec -> ingest -> engine -> analysis -> cli, checked by import-linter (function-level imports count)."""
    from importlinter import cli as lint
    assert lint.lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0
