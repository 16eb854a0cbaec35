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
