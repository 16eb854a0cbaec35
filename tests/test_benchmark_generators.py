"""The benchmark generators still produce scenarios the simulator accepts (tiny sizes).

Not a timed test: the benchmarks themselves run with `make bench` (benchmarks/run_all.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import load_scenario

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(autouse=True)
def _bench_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_kueue_baseline_generator(tmp_path: Path) -> None:
    import kueue_baseline

    path = kueue_baseline.generate(tmp_path, cohorts=1, tenants_per_cohort=2, scale=0.02)
    scenario = load_scenario(path)
    assert len(scenario.config.tenants) == 2
    assert {r.id.split("-")[1] for r in scenario.requests} == {"small", "medium", "large"}
    flavor = scenario.config.flavors["gpu"]
    assert flavor.nodes * flavor.gpus_per_node == 2 * kueue_baseline.NOMINAL
    run = run_scenario(scenario)
    admitted = {d.id for d in run.decisions if d.event == "admit"}
    assert admitted == {r.id for r in scenario.requests}


def test_kueue_baseline_full_shape() -> None:
    import kueue_baseline

    doc = kueue_baseline.build()
    assert len(doc["tenants"]) == 30
    assert len(doc["requests"]) == 15_000
    f = doc["flavors"]["gpu"]
    assert f["nodes"] * f["gpus_per_node"] == 600


def test_month_trace_generator(tmp_path: Path) -> None:
    import month_trace

    path = month_trace.generate(tmp_path, requests=300, seed=3)
    assert (tmp_path / "month.csv").exists()
    scenario = load_scenario(path)  # the CSV requests_file path
    assert len(scenario.requests) == 300
    assert {r.kind for r in scenario.requests} == {"kernel", "server", "job"}
    assert any(r.busy for r in scenario.requests)
    assert scenario.config.policy.idle_timeout > 0
    assert scenario.config.policy.reservation_ttl > 0
    # Seeded: the same seed writes the same trace.
    again = tmp_path / "again"
    again.mkdir()
    month_trace.generate(again, requests=300, seed=3)
    assert (again / "month.csv").read_bytes() == (tmp_path / "month.csv").read_bytes()
    run_scenario(scenario, until=7 * 86400)


@pytest.mark.slow
def test_cycle_rate_runs() -> None:
    import cycle_rate

    result = cycle_rate.measure(sizes=(50, 100), cycles=20, blocks=1)
    for row in result["rows"]:
        assert row["admitted_per_finish_cycle"] == 1.0
        assert row["admitted_by_unfit_submits"] == 0
        assert row["queue_at_end"] == row["queued"]


def test_run_all_parses_args() -> None:
    import run_all

    assert run_all.parse_args(["--quick"]).quick


def test_kueue_large_generator(tmp_path: Path) -> None:
    import kueue_large

    doc = kueue_large.build()
    assert len(doc["tenants"]) == 2000
    assert len(doc["requests"]) == 60_000
    f = doc["flavors"]["gpu"]
    assert f["nodes"] * f["gpus_per_node"] == 2000 * 20
    path = kueue_large.generate(tmp_path, cohorts=2, tenants_per_cohort=3, scale=0.1)
    scenario = load_scenario(path)
    assert len(scenario.config.tenants) == 6
    run = run_scenario(scenario)
    admitted = {d.id for d in run.decisions if d.event == "admit"}
    assert admitted == {r.id for r in scenario.requests}


@pytest.mark.slow
def test_gateway_replay_smoke() -> None:
    """The replay at a tiny scale through a real gateway: every request admitted and
    released by its holder (a behaviour check, not a timing one)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gateway_replay.py"), "--scale", "0.01", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.stdout, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("wall_s", "floor_s", "ratio", "admitted", "lost", "submit_p99_ms"):
        assert key in result
    assert result["lost"] == 0, result
    assert result["errors"] == {}, result
    import kueue_baseline

    assert result["admitted"] == result["requests"]
    assert result["requests"] == len(kueue_baseline.build(scale=0.01)["requests"])
    assert result["store_decisions"]["finish"] == result["requests"]
    assert result["floor_s"] > 0
