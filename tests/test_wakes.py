"""The wake-ups are exact: a head that sleeps (its bucket marked inadmissible, its StrictFIFO
queue blocked) is woken by every event that can change its answer, so the core decides
what it would decide if it looked at every tenant at every instant.

The reference is the same core driven with `run_scenario(..., exhaustive=True)`, which
wakes every head before each step (`AdmissionCore.look_at_everyone`). A missed wake-up
shows as a request that the reference admits or lets preempt earlier. Each test compares
the two event lists from the first difference on, so a failure names the instant.

Checked on every scenario file, on the Kueue baseline's shape, on a 20,000-request month
(its interactive variant too), on the whole 100,000-request month and on random scenarios.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from invariants import events_of
from test_properties import PROFILE, scenarios, show

from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import Scenario, load_scenario, parse_scenario

HERE = Path(__file__).parent
BENCHMARKS = HERE.parent / "benchmarks"
SHARED = (HERE.parent / ".." / "shared" / "scenarios").resolve()
FILES = sorted((HERE / "scenarios").glob("*.yaml")) + sorted(SHARED.glob("*.yaml"))


def first_difference(scenario: Scenario) -> str | None:
    """None when both runs decide alike; else the first events where they part."""
    lazy = events_of(run_scenario(scenario).decisions)
    eager = events_of(run_scenario(scenario, exhaustive=True).decisions)
    if lazy == eager:
        return None
    i = next(
        (i for i, (a, b) in enumerate(zip(lazy, eager, strict=False)) if a != b),
        min(len(lazy), len(eager)),
    )

    def around(events: list[dict[str, Any]]) -> str:
        return "\n".join(f"  {e}" for e in events[max(0, i - 3) : i + 3])

    return f"event {i}:\nwith wake-ups:\n{around(lazy)}\nlooking at everyone:\n{around(eager)}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_scenario_decides_as_if_everyone_were_looked_at(path: Path) -> None:
    problem = first_difference(load_scenario(path))
    assert problem is None, problem


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.usefixtures("benchmarks")
@pytest.mark.slow
def test_the_kueue_baseline_decides_as_if_everyone_were_looked_at(tmp_path: Path) -> None:
    """15,000 jobs in 5 cohorts of 6 tenants, reclaim Any: the shape on which a preemptor
    waiting for a node's devices once slept through the release that freed them."""
    import kueue_baseline

    problem = first_difference(load_scenario(kueue_baseline.generate(tmp_path)))
    assert problem is None, problem


@pytest.mark.slow
@pytest.mark.usefixtures("benchmarks")
@pytest.mark.parametrize("interactive", [False, True], ids=["month", "preempt-interactive"])
def test_a_month_decides_as_if_everyone_were_looked_at(tmp_path: Path, interactive: bool) -> None:
    """20,000 notebook-centric requests: culls with reservations, resumes, expiries,
    StrictFIFO, autoscaling, pinned flavors."""
    import month_trace

    path = month_trace.generate(tmp_path, requests=20_000, preempt_interactive=interactive)
    problem = first_difference(load_scenario(path))
    assert problem is None, problem


@pytest.mark.slow
@pytest.mark.usefixtures("benchmarks")
def test_the_whole_month_decides_as_if_everyone_were_looked_at(tmp_path: Path) -> None:
    """The 100,000-request month, whole (~90 s). It once parted from the reference at
    t=43,250 s: a head woken in the middle of a cycle was nominated afresh there and ranked
    above a stale head that the reference kept, so what the cycle decided depended on
    which buckets happened to be marked (waking.py's `_rouse`)."""
    import month_trace

    problem = first_difference(load_scenario(month_trace.generate(tmp_path)))
    assert problem is None, problem


@PROFILE
@given(scenarios())
@pytest.mark.slow
def test_random_scenarios_decide_as_if_everyone_were_looked_at(data: dict[str, Any]) -> None:
    problem = first_difference(parse_scenario(data, name="random"))
    assert problem is None, f"{problem}\n--- scenario:\n{show(data)}"
