"""`simulate compare A B` and `--plot`: a what-if read as a difference, and runs drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from jupyter_gpuaas.cli import main
from jupyter_gpuaas.sim.compare import timeline

SCENARIO = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
    "tenants": {
        "vision": {"quota": {"a100": 1}},
        "nlp": {"quota": {"a100": 1}},
    },
    "requests": [
        {
            "id": f"v{i}",
            "tenant": "vision",
            "user": "alice",
            "kind": "job",
            "gpus": 1,
            "submit": 0,
            "duration": 600,
        }
        for i in range(3)
    ]
    + [
        {
            "id": "n0",
            "tenant": "nlp",
            "user": "bob",
            "kind": "kernel",
            "gpus": 1,
            "submit": 0,
            "duration": 1800,
            "busy": [[0, 900]],
        },
    ],
}


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_a_what_if_prints_each_tenants_difference(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # vision's three 10-minute jobs share its one GPU: waits 0, 10 and 20 min. With a
    # second node and a quota of three, all three start at once.
    more = ["--set", "flavors.a100.nodes=2", "--set", "tenants.vision.quota.a100=3"]
    assert main(["simulate", "compare", str(scenario), str(scenario), *more, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"] == str(scenario) and out["b"].endswith("--set tenants.vision.quota.a100=3")
    vision = out["per_tenant"]["vision"]
    assert vision["wait_p95"] == {"a": 1200.0, "b": 0.0, "diff": -1200.0}
    assert vision["gpu_hours_allocated"]["a"] == vision["gpu_hours_allocated"]["b"] == 0.5
    nlp = out["per_tenant"]["nlp"]
    assert nlp["wait_p95"]["diff"] == 0
    # The kernel was busy for half its time: half of what it held was idle.
    assert nlp["busy_share"]["a"] == 0.5 and nlp["gpu_hours_idle"]["a"] == 0.25
    assert set(out["per_tenant"]) == {"vision", "nlp", "all"}

    assert main(["simulate", "compare", str(scenario), str(scenario), *more]) == 0
    text = capsys.readouterr().out
    assert "B - A" in text and "wait p95" in text
    lines = text.splitlines()
    block = lines[next(i for i, line in enumerate(lines) if line.startswith("vision")) :]
    vision_p95 = next(line for line in block if "wait p95" in line)
    assert vision_p95.split()[-3:] == ["20", "min", "0"] or vision_p95.endswith("-20 min"), (
        vision_p95
    )


@pytest.mark.slow
def test_plots_are_drawn_into_png_files(scenario: Path, tmp_path: Path) -> None:
    one = tmp_path / "one.png"
    events = tmp_path / "events.jsonl"
    assert main(["simulate", str(scenario), "--plot", str(one), "--events", str(events)]) == 0
    assert one.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and one.stat().st_size > 10_000
    assert sum(1 for _ in events.open()) > 8  # --events still written beside --plot
    two = tmp_path / "two.png"
    argv = ["simulate", "compare", str(scenario), str(scenario), "--plot", str(two)]
    assert main([*argv, "--set", "tenants.vision.quota.a100=2"]) == 0
    assert two.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_follows_the_decision_stream() -> None:
    events = [
        {"t": 0.0, "event": "submit", "id": "a", "gpus": 2},
        {"t": 0.0, "event": "submit", "id": "b", "gpus": 1},
        {"t": 0.0, "event": "admit", "id": "a", "gpus": 2},
        {"t": 5.0, "event": "cull", "id": "a", "parked": True},
        {"t": 5.0, "event": "admit", "id": "b", "gpus": 1},
        {"t": 9.0, "event": "finish", "id": "b"},
    ]
    assert timeline(events) == ([0.0, 5.0, 9.0], [1, 0, 0], [2, 1, 0])


def test_compare_needs_two_files(scenario: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "compare", str(scenario)]) == 2
    assert "compare needs two scenario files" in capsys.readouterr().err
    assert main(["simulate", str(scenario), "extra"]) == 2
    assert "unexpected arguments after" in capsys.readouterr().err
