"""What the test_sim_cli*.py files share: the scenario they break one key at a time, and
the real console script they run it through.

Imported as `simutil` (tests/ is on sys.path through tests/conftest.py), like `helpers`.
The CLI's own tests are in test_sim_cli.py, parsing and its errors in
test_sim_cli_parsing.py, the result object in test_sim_cli_result.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "jupyter-gpuaas"
EXAMPLE = ROOT / "hub_config" / "examples" / "two-teams.yaml"
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))


def _load_config_tests() -> types.ModuleType:
    """test_config.py's cases, loaded by path so this works whatever pytest's import mode."""
    spec = importlib.util.spec_from_file_location(
        "_gpuaas_test_config", Path(__file__).with_name("test_config.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_tc = _load_config_tests()
CONFIG_CASES: list[tuple[str, str, Any, str, str]] = _tc.CONFIG_CASES
DELETE = _tc.DELETE
mutate = _tc.mutate

try:
    import jupyter_gpuaas.sim.driver as real_driver  # noqa: F401

    HAVE_DRIVER = True
except ImportError:
    HAVE_DRIVER = False
needs_driver = pytest.mark.skipif(
    not HAVE_DRIVER, reason="jupyter_gpuaas.sim.driver is not written yet (another engineer's file)"
)


def base_scenario() -> dict[str, Any]:
    doc: dict[str, Any] = _tc.base_config()
    doc["until"] = 7200
    doc["requests"] = [
        {
            "id": "r1",
            "tenant": "vision",
            "user": "ann",
            "kind": "kernel",
            "gpus": 2,
            "submit": 0,
            "duration": 3600,
            "busy": [[0, 600], [1200, 1800]],
        },
        {
            "id": "r2",
            "tenant": "nlp",
            "user": "bob",
            "kind": "job",
            "gpus": 4,
            "flavor": "a100",
            "priority": 3,
            "submit": 10,
            "duration": 600,
            "cancel": 500,
        },
        {
            "id": "r3",
            "tenant": "solo",
            "user": "cy",
            "kind": "server",
            "gpus": 1,
            "submit": 20,
            "duration": 1000,
        },
    ]
    doc["expect"] = {"admitted": ["r1"]}
    return doc


def write(tmp_path: Path, doc: Any, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def simulate(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "simulate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], key: str, words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"jupyter-gpuaas simulate: {key}: "), lines[0]
    assert words in lines[0]


# The key of a scenario's request list, short for the case tables that edit it.
R = "requests"

# A CSV trace: a scenario whose requests come from trace.csv beside it (requests_file).
CSV_HEADER = "id,tenant,user,kind,gpus,flavor,priority,submit,duration,busy,cancel\n"


def csv_scenario(tmp_path: Path, rows: str) -> Path:
    (tmp_path / "trace.csv").write_text(CSV_HEADER + rows)
    doc = base_scenario()
    del doc[R]
    doc["requests_file"] = "trace.csv"
    return write(tmp_path, doc)
