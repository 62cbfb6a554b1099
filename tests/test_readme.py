"""The README is the user's first page: its examples run in a fresh clone, the outputs it shows are
what the commands print today, and it shows the CI's test command verbatim."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from moesim.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEST_COMMAND = 'pip install ".[test]" && python -m pytest'
# examples that take more than a few seconds on a 2-core machine: parsed and path-checked, not run here.
# After a cost-model change, `PYTHONPATH=src python tests/test_readme.py` refreshes the shown outputs.
SLOW = (" sweep ", " --batch 64 ")


def blocks(lang: str) -> list:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def commands(text: str) -> list:
    """Shell lines of a block, continuation lines joined, comments dropped."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def moesim_argv(words: list) -> list:
    """The argument lists of the ``moesim`` invocations in one shell line (split at ``&&``)."""
    out, cur = [], None
    for w in words + ["&&"]:
        if w == "&&":
            if cur is not None:
                out.append(cur)
            cur = None
        elif cur is None:
            cur = [] if w == "moesim" else None
        else:
            cur.append(w)
    return out


CONSOLE = []
for block in blocks("console"):
    head, _, output = block.partition("\n")
    while head.endswith("\\"):
        nxt, _, output = output.partition("\n")
        head = head[:-1] + " " + nxt.strip()
    words = shlex.split(head.removeprefix("$ "))
    assert words[0] == "moesim", head
    CONSOLE.append((words[1:], output))
BASH = [argv for block in blocks("bash") for words in commands(block) for argv in moesim_argv(words)]


def test_readme_points_nowhere_outside_the_clone():
    assert "../shared" not in README
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target
    for path in re.findall(r"\b(docs/[\w./-]+)", README):
        assert (ROOT / path.rstrip(".")).exists(), path


def test_set_up_commands_first_and_the_ci_test_command_verbatim():
    first = blocks("bash")[0].splitlines()
    assert first[0].startswith("pip install . && moesim ")
    assert first[1] == TEST_COMMAND
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_every_example_parses():
    assert len(BASH) >= 10 and len(CONSOLE) >= 3
    parser = build_parser()
    for argv in BASH + [c for c, _ in CONSOLE]:
        parser.parse_args(argv)


def test_interval_coverage_quoted_is_the_shipped_one():
    """The README's coverage sentence is the one calibration.toml [intervals] holds (rebuilt by its command),
    with the held-out row counts of tests/data/loso_residuals.json, so a rebuild cannot leave it stale."""
    import json
    import tomllib
    got = re.search(r"covers ([\d.]+) % of (\d+) held-out decode rows and ([\d.]+) % of (\d+) prefill rows",
                    " ".join(README.split()))
    assert got, "the README quotes the intervals' coverage"
    iv = tomllib.loads((ROOT / "src/moesim/catalog/calibration.toml").read_text(encoding="utf-8"))["intervals"]
    rows = json.loads((ROOT / "tests/data/loso_residuals.json").read_text(encoding="utf-8"))["rows"]
    n_decode = sum(r.get("decode_log") is not None for r in rows)
    n_prefill = sum(r.get("prefill_log") is not None for r in rows)
    assert (float(got[1]), int(got[2])) == (round(100 * iv["coverage_decode"], 1), n_decode)
    assert (float(got[3]), int(got[4])) == (round(100 * iv["coverage_prefill"], 1), n_prefill)


@pytest.fixture
def clone_dir(tmp_path, monkeypatch):
    """A working folder that sees the clone's docs/ (the examples' inputs) and takes what they write."""
    (tmp_path / "docs").symlink_to(ROOT / "docs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,expected", CONSOLE, ids=[" ".join(c[:2]) for c, _ in CONSOLE])
def test_shown_output_is_what_the_command_prints(capsys, clone_dir, argv, expected):
    assert main(argv) == 0
    out, _ = capsys.readouterr()
    assert out == expected


@pytest.mark.parametrize("argv", [a for a in BASH if not any(s in f" {' '.join(a)} " for s in SLOW)],
                         ids=lambda a: " ".join(a[:2]))
def test_example_runs(capsys, clone_dir, argv):
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out


def test_python_example_runs(clone_dir):
    (code,) = blocks("python")
    exec(compile(code, "README.md", "exec"), {})


if __name__ == "__main__":
    # `PYTHONPATH=src python tests/test_readme.py` rewrites the README's shown outputs with what the
    # commands print now (after a cost-model change moves the numbers); review the diff before committing.
    import contextlib
    import io
    import os

    os.chdir(ROOT)
    text = README
    for block in blocks("console"):
        head_lines = []
        lines = block.splitlines(keepends=True)
        while lines and (not head_lines or head_lines[-1].rstrip().endswith("\\")):
            head_lines.append(lines.pop(0))
        words = shlex.split("".join(head_lines).replace("\\\n", " ").removeprefix("$ "))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(words[1:]) == 0, words
        text = text.replace(block, "".join(head_lines) + buf.getvalue(), 1)
    (ROOT / "README.md").write_text(text, encoding="utf-8")
