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


# ------------------------------------------------------------------------------- sizes of the kernel's sources
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
KERNEL_SOURCES = sorted(p for p in (ROOT / "csrc").glob("*.[ch]")) + sorted(
    p for p in (PACKAGE / "engine").glob("_kernel*.p*") if p.suffix in (".pyx", ".pxi", ".pxd")) + [
    PACKAGE / "engine" / "glue.py", PACKAGE / "engine" / "codes.py"]


def c_functions(text: str) -> list:
    """(name, lines) of each function definition of a C file: a body opening with ``{`` alone on a line
    at column 0, its signature the lines above it back to the previous blank line or comment."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if line != "{":
            continue
        start = i
        while start > 0 and lines[start - 1].strip() and not lines[start - 1].rstrip().endswith(("*/", ";", "}")):
            start -= 1
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "}")
        name = re.findall(r"(\w+)\s*\(", " ".join(lines[start:i + 1]))
        out.append((name[0] if name else "?", end - start + 1))
    return out


def cython_functions(text: str) -> list:
    """(name, lines) of each def / cdef / cpdef function or method of a Cython or Python file."""
    lines = text.split("\n")
    out = []
    pat = re.compile(r"^(\s*)(?:async\s+)?(?:c?p?def)\s+(?:[\w\[\]\*]+\s+)*?\*?(\w+)\s*\(")
    for i, line in enumerate(lines):
        m = pat.match(line)
        if not m or line.lstrip().startswith("cdef class"):
            continue
        indent = len(m.group(1))
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
                                    or lines[end].lstrip().startswith(")")):
            end += 1
        while not lines[end - 1].strip():
            end -= 1
        out.append((m.group(2), end - i))
    return out


def test_function_counter_sees_c_and_cython_functions():
    c = "static int f(int a,\n              int b)\n{\n    return a;\n}\n\n/* x */\nint g(void)\n{\n    return 0;\n}\n"
    assert c_functions(c) == [("f", 5), ("g", 4)]
    cy = "cdef void _fill(ms_t *m, dict d):\n    m.a = 1\n\n    m.b = 2\n\n\ndef run(x):\n    return x\n"
    assert cython_functions(cy) == [("_fill", 4), ("run", 2)]


@pytest.mark.parametrize("path", KERNEL_SOURCES, ids=lambda p: p.name)
def test_kernel_sources_stay_readable(path):
    """The C core and the glue: no module over 600 lines, no function over 80 (the issue's limits)."""
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.name}: {text.count(chr(10))} lines"
    funcs = c_functions(text) if path.suffix in (".c", ".h") else cython_functions(text)
    long = [(name, n) for name, n in funcs if n > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"
