"""`jupyter-gpuaas devices` through the real console script (NVML is absent on CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXE = Path(sys.executable).parent / "jupyter-gpuaas"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), "devices", *args], capture_output=True, text=True, timeout=60)


def test_simulated_devices_as_json() -> None:
    p = run("--json", "--devices", "simulated:a100=1x2,t4=2x1")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["simulated"] is True
    assert [(d["node"], d["index"]) for d in out["devices"]] == [
        ("a100-0", 0),
        ("a100-0", 1),
        ("t4-0", 0),
        ("t4-1", 0),
    ]


def test_table_says_simulated() -> None:
    p = run("--devices", "simulated:a100=1x1")
    assert p.returncode == 0
    assert "a100-0" in p.stdout and "simulated" in p.stdout


def test_bad_spec_is_one_line_exit_2() -> None:
    p = run("--devices", "simulated:a100=two")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr
