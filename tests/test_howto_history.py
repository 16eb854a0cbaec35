"""The what-if how-to (docs/how-to/what-if-from-history.md) prints what the page shows.

Every fenced block of the page whose first line is a `$ ` command is a transcript: each
command runs, in order, in a directory holding the page's quota file and a week of a
gateway's store (history_sample.py), with this venv's `jupyter-gpuaas`; the lines after
it must be what it prints. On the page, a line `...` stands for any number of printed
lines, and `…` inside a line for any text (a date, the time of the export), so the page
may show less than a command prints but never something it does not print.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from history_sample import QUOTAS_YAML, write_sample_store

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-to" / "what-if-from-history.md"
EXE = Path(sys.executable).parent / "jupyter-gpuaas"


def transcripts(text: str) -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it), in page order."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```\n(.*?)^```", text, re.M | re.S):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ "):
            continue
        for line in lines:
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                found[-1][1].append(line)
    return found


def matches(shown: list[str], printed: list[str]) -> bool:
    """The page's lines against the printed ones: `...` any run of lines, `…` any text
    within a line (trailing spaces never count)."""

    def line(s: str) -> re.Pattern[str] | None:
        s = s.rstrip()
        return None if s == "..." else re.compile(".*?".join(map(re.escape, s.split("…"))))

    wanted = [line(s) for s in shown]
    got = [p.rstrip() for p in printed]

    def at(i: int, j: int) -> bool:
        if i == len(wanted):
            return j == len(got)
        w = wanted[i]
        if w is None:
            return any(at(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and w.fullmatch(got[j]) is not None and at(i + 1, j + 1)

    return at(0, 0)


def test_the_matcher_needs_every_shown_line() -> None:
    assert matches(["a …", "...", "d"], ["a 2026-12-06", "b", "c", "d"])
    assert not matches(["a … z"], ["a b"])
    assert not matches(["a"], ["a", "b"])  # without `...`, nothing may be left out


@pytest.mark.slow
def test_the_page_walks_from_export_to_advice(tmp_path: Path) -> None:
    commands = transcripts(PAGE.read_text(encoding="utf-8"))
    words = [shlex.split(c)[:3] for c, _ in commands]
    assert ["jupyter-gpuaas", "history", "export"] in words
    assert ["jupyter-gpuaas", "simulate", "compare"] in words
    assert any(w[:2] == ["jupyter-gpuaas", "advise"] for w in words)
    assert any("--set" in c for c, _ in commands)

    (tmp_path / "quotas.yaml").write_text(QUOTAS_YAML)
    write_sample_store(f"sqlite:///{tmp_path / 'gpuaas.sqlite'}")
    for command, shown in commands:
        argv = shlex.split(command)
        assert argv[0] in ("jupyter-gpuaas", "cat", "head"), command
        if argv[0] == "jupyter-gpuaas":
            argv[0] = str(EXE)
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr)
        printed = done.stdout.splitlines()
        assert matches(shown, printed), (
            f"$ {command}\n{PAGE.name} shows:\n" + "\n".join(shown)
            + "\n\nthe command prints:\n" + done.stdout
        )  # fmt: skip
