"""`simulate`'s progress (sim/progress.py): on stderr only, redrawn and erased on a
terminal, plain lines with `--progress` elsewhere, nothing into a pipe unless asked, and
never in `--json`'s stdout. Through the real command; the terminal is a real pty."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "hub_config" / "examples" / "two-teams.yaml"  # its clock stops at 10 h
COMMAND = [sys.executable, "-m", "jupyter_gpuaas.cli", "simulate", str(SCENARIO)]


def simulate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *argv], capture_output=True, text=True, timeout=300)


def without_wall_time(report: str) -> list[str]:
    return [line for line in report.splitlines() if not line.startswith("simulated ")]


@pytest.mark.slow
def test_into_a_pipe_only_when_asked_and_never_on_stdout() -> None:
    quiet = simulate("--json")
    assert quiet.returncode == 0 and quiet.stderr == ""
    shown = simulate("--json", "--progress")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["requests"] == json.loads(quiet.stdout)["requests"]
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("simulate: ") and " of 10 h simulated (" in lines[0], lines
    assert lines[-1].startswith("simulate: 10 h simulated, done in "), lines
    assert "\r" not in shown.stderr and "\x1b" not in shown.stderr  # not a terminal


@pytest.mark.slow
def test_a_terminal_gets_one_line_redrawn_then_erased() -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        out, _ = proc.communicate(timeout=300)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child's side is closed and all was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0
    text = seen.decode()
    assert text.startswith("\rsimulate: ") and " of 10 h simulated (" in text, repr(text)
    assert text.endswith("\r\x1b[K"), repr(text)  # erased: the report reads as without it
    assert "\n" not in text.replace("\r\n", "")
    assert without_wall_time(out) == without_wall_time(simulate().stdout)


@pytest.mark.slow
def test_compare_shows_each_run_apart() -> None:
    both = subprocess.run(
        [*COMMAND[:-1], "compare", str(SCENARIO), str(SCENARIO), "--json", "--progress",
         "--set", "tenants.vision.quota.a100=8"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert json.loads(both.stdout)["b"].endswith("--set tenants.vision.quota.a100=8")
    lines = both.stderr.splitlines()
    assert lines[0].startswith("simulate compare A: ") and " of 10 h simulated (" in lines[0]
    done_lines = [line for line in lines if ", done in " in line]
    assert [line.split(":")[0] for line in done_lines] == [
        "simulate compare A",
        "simulate compare B",
    ]
