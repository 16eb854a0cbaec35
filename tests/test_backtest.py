"""`simulate --estimates`: each request's estimate at submit, the accuracy, and decisions
that are the same with or without it (the estimates run on copies of the core)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simutil import SCENARIOS, simulate, write

from jupyter_gpuaas.sim.backtest import Backtest
from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import load_scenario


@pytest.mark.slow
def test_a_small_scenario_estimated_at_submit(tmp_path: Path) -> None:
    # k1 is idle from 60 s and culled at 660 s (idle_timeout 600); j1 arrives at 100 s and
    # waits for that cull: the forward run knows it to the second. j2 comes after k1 has
    # been culled: no job has ended yet and j1 is young, so nothing says when it ends.
    scenario = write(
        tmp_path,
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
            "tenants": {"vision": {"quota": {"a100": 2}}},
            "policy": {"idle_timeout": 600},
            "requests": [
                {"id": "k1", "tenant": "vision", "user": "ann", "kind": "kernel", "gpus": 2,
                 "submit": 0, "duration": 7200, "busy": [[0, 60]]},
                {"id": "j1", "tenant": "vision", "user": "bob", "kind": "job", "gpus": 2,
                 "submit": 100, "duration": 300},
                {"id": "j2", "tenant": "vision", "user": "bob", "kind": "job", "gpus": 2,
                 "submit": 700, "duration": 300},
                {"id": "x", "tenant": "vision", "user": "bob", "kind": "job", "gpus": 4,
                 "submit": 700, "duration": 300},
            ],
        },
    )  # fmt: skip
    proc = simulate(scenario, "--json", "--estimates")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    requests = result["requests"]
    assert requests["k1"]["eta_at_submit"] == {"seconds": 0.0, "low": 0.0, "high": 0.0}
    assert requests["j1"]["wait"] == 560.0
    assert requests["j1"]["eta_at_submit"] == {"seconds": 560.0, "low": 560.0, "high": 560.0}
    assert requests["j2"]["admitted_at"] == 960.0  # when j1 (admitted at 660) ends
    eta = requests["j2"]["eta_at_submit"]
    assert eta is None  # j1, 40 s old at 700 s and no job seen yet: no known end
    assert requests["x"]["eta_at_submit"] is None  # rejected: never waited
    summary = result["summary"]["estimates"]
    assert summary["judged"] == 1 and summary["predicted"] == 1  # j1 alone waited 5 min
    assert summary["median_relative_error"] == 0.0 and summary["inside_range_share"] == 1.0

    table = simulate(scenario, "--estimates").stdout
    assert "estimates    1 request waited 5 min or more: 100% had an estimate" in table
    assert "eta_at_submit" not in simulate(scenario, "--json").stdout

    proc = simulate(scenario, "--estimates", "0")
    assert proc.returncode == 2 and "--estimates" in proc.stderr


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_estimates_change_no_decision(path: Path) -> None:
    """Every scenario decides the same with estimates made at each submit (every decision
    compared, as `--events` writes them; in-process, the 79 scenarios in seconds)."""
    scenario = load_scenario(path)
    plain = [d.to_json() for d in run_scenario(scenario).decisions]
    backtest = Backtest(load_scenario(path))
    estimated = run_scenario(load_scenario(path), backtest=backtest).decisions
    assert [d.to_json() for d in estimated] == plain
