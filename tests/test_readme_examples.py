"""The README's examples are run, so the page cannot drift from what the product prints.

Every fenced block of README.md that starts with `$ .venv/bin/jupyter-gpuaas simulate`
(the simulator's tour, on the README's first screen) is a transcript: each `$ COMMAND`
line is run from the repository root with this venv's `jupyter-gpuaas`, and the lines
after it must be what the command prints, line for line. A line `...` in the README
stands for any number of printed lines (the run's own wall-clock time, say), so the page
may show less than the run prints but never something it does not print.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXE = Path(sys.executable).parent / "jupyter-gpuaas"
RUNNABLE = ("$ .venv/bin/jupyter-gpuaas simulate", "$ jupyter-gpuaas simulate")
ELLIPSIS = "..."


def transcripts(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output shown after it) for each command of each runnable block."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        lines = block.splitlines()
        if not lines or not lines[0].startswith(RUNNABLE):
            continue
        for line in lines:
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                found[-1][1].append(line)
    return found


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether the README's lines are the printed lines, `...` standing for any run of
    lines (trailing spaces never count)."""
    shown = [line.rstrip() for line in shown]
    printed = [line.rstrip() for line in printed]

    def at(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed)
        if shown[i] == ELLIPSIS:
            return any(at(i + 1, k) for k in range(j, len(printed) + 1))
        return j < len(printed) and shown[i] == printed[j] and at(i + 1, j + 1)

    return at(0, 0)


def test_the_matcher_needs_every_shown_line() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "..."], ["a"])
    assert not matches(["a", "x", "..."], ["a", "b", "c"])
    assert not matches(["a"], ["a", "b"])  # without `...`, nothing may be left out


EXAMPLES = transcripts(README.read_text(encoding="utf-8"))


def test_the_readme_shows_the_simulator_tour() -> None:
    assert any("simulate hub_config/examples/two-teams.yaml" in cmd for cmd, _ in EXAMPLES)


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_a_readme_command_prints_what_the_readme_shows(command: str, shown: list[str]) -> None:
    argv = shlex.split(command)
    assert argv[0].endswith("jupyter-gpuaas"), command
    done = subprocess.run([str(EXE), *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert matches(shown, printed), (
        "README.md shows:\n" + "\n".join(shown) + "\n\nthe command prints:\n" + done.stdout
    )
