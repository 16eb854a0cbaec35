"""Idle spells too short to matter are left unsaid, and nothing the core decides changes.

The simulator's driver does not tell the core of an idle spell that ends before the core
would warn or cull its holder (`AdmissionCore.idle_deadline`), when the request is admitted
or queued as the spell starts (sim/driver.py, `_Replay`). The reference is the same replay
with `run_scenario(..., every_spell=True)`, which tells the core of every busy and idle
event. Each test compares the two event lists whole, and says where they part.

Checked on every scenario file, on 20,000-request months (the interactive variant, whose
kernels and servers are preempted and readmitted inside their spells, too) and on random
scenarios with idle timeouts per tenant, cull warnings and reservations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import events_of
from test_properties import PROFILE, scenarios, show

from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import Scenario, load_scenario, parse_scenario

HERE = Path(__file__).parent
BENCHMARKS = HERE.parent / "benchmarks"
SHARED = (HERE.parent / ".." / "shared" / "scenarios").resolve()
FILES = sorted((HERE / "scenarios").glob("*.yaml")) + sorted(SHARED.glob("*.yaml"))


def compare(scenario: Scenario) -> tuple[str | None, int]:
    """(None when both runs decide alike, else where they part; spells left unsaid)."""
    quiet = run_scenario(scenario)
    told = run_scenario(scenario, every_spell=True)
    assert told.quiet_spells == 0
    a, b = events_of(quiet.decisions), events_of(told.decisions)
    if a == b and quiet.end == told.end:
        return None, quiet.quiet_spells
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, i - 2), i + 3
    pairs = zip(a[lo:hi], b[lo:hi], strict=False)
    where = "\n".join(f"  {x}\n  {y}" for x, y in pairs)
    return f"event {i} (unsaid, then told, pairwise):\n{where}", quiet.quiet_spells


def one_kernel(busy: list[list[int]]) -> dict[str, Any]:
    """A kernel alone on one GPU for 500 s, idle timeout 30 s with a 5 s warning."""
    return {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
        "tenants": {"vision": {"quota": {"a100": 1}}},
        "policy": {"idle_timeout": 30, "cull_warning": 5},
        "requests": [
            {"id": "k", "tenant": "vision", "user": "ann", "kind": "kernel", "gpus": 1,
             "submit": 0, "duration": 500, "busy": busy},
        ],
    }  # fmt: skip


def culls(data: dict[str, Any]) -> tuple[list[tuple[float, str]], int]:
    """(its warnings and culls, as (time, event); the spells left unsaid), having checked
    that telling every spell decides the same."""
    scenario = parse_scenario(data, name="one-kernel")
    problem, unsaid = compare(scenario)
    assert problem is None, problem
    events = events_of(run_scenario(scenario).decisions)
    return [(e["t"], e["event"]) for e in events if e["event"] in ("cull", "cull_warning")], unsaid


def test_a_short_spell_is_unsaid_and_a_long_one_still_culls() -> None:
    """Busy 0-10, idle 10-20 (shorter than the timeout), busy 20-30, then idle: warned at
    30 + 25 = 55 and culled at 60 either way, and the short spell was not told."""
    events, unsaid = culls(one_kernel([[0, 10], [20, 30], [200, 210]]))
    assert unsaid == 1
    assert events[:2] == [(55.0, "cull_warning"), (60.0, "cull")]


def test_a_spell_that_reaches_the_warning_is_told() -> None:
    """Idle 10-28: the warning at 35 would come after the spell, so it is unsaid; idle
    10-36 reaches it, so it is told. (Idle again from 400 on, both are warned at 425.)"""
    events, unsaid = culls(one_kernel([[0, 10], [28, 400]]))
    assert unsaid == 1 and events[0] == (425.0, "cull_warning")
    events, unsaid = culls(one_kernel([[0, 10], [36, 400]]))
    assert unsaid == 0 and events[0] == (35.0, "cull_warning")  # (busy from 36: no cull)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_scenario_decides_the_same_with_every_spell_told(path: Path) -> None:
    problem, _ = compare(load_scenario(path))
    assert problem is None, problem


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.slow
@pytest.mark.usefixtures("benchmarks")
@pytest.mark.parametrize("interactive", [False, True], ids=["month", "preempt-interactive"])
def test_a_month_decides_the_same_with_every_spell_told(tmp_path: Path, interactive: bool) -> None:
    import month_trace

    path = month_trace.generate(tmp_path, requests=20_000, preempt_interactive=interactive)
    problem, unsaid = compare(load_scenario(path))
    assert problem is None, problem
    assert unsaid > 10_000  # most of a month's spells are short


@PROFILE
@given(scenarios(), st.data())
@pytest.mark.slow
def test_random_scenarios_decide_the_same_with_every_spell_told(
    data: dict[str, Any], draw: st.DataObject
) -> None:
    policy = data["policy"]
    if draw.draw(st.booleans()):
        policy["idle_timeout"] = draw.draw(st.integers(5, 60))
    if draw.draw(st.booleans()):
        policy["cull_warning"] = draw.draw(st.integers(1, 40))
    for spec in data["tenants"].values():
        if draw.draw(st.integers(0, 3)) == 0:
            spec["idle_timeout"] = draw.draw(st.integers(0, 60))
    problem, _ = compare(parse_scenario(data, name="random"))
    assert problem is None, f"{problem}\n--- scenario:\n{show(data)}"
