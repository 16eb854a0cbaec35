"""Conformance: every scenario file runs through the real core and meets its `expect:` block.

Each scenario pins one rule of SCENARIO.md with expectations derived by hand from the
spec; `check_run` adds the invariants that hold for every run. The CLI test replays the
same files through the shared, independent checker, so our reading of the contract and
the other team's are cross-checked. The targeted tests read event fields that `expect:`
cannot express (node choice, device indices, reasons, `by`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from invariants import check_expect, check_result, check_run, events_of

from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.report import build_result
from jupyter_gpuaas.sim.scenario import Scenario, load_scenario

HERE = Path(__file__).parent
SCENARIOS = sorted((HERE / "scenarios").glob("*.yaml"))
REPO = HERE.parent
CHECKER = (REPO / ".." / "shared" / "tools" / "scenario_check.py").resolve()


def run(path: Path) -> tuple[Scenario, list[dict[str, Any]], dict[str, Any]]:
    """Parse, run and report in-process: the same code path as `simulate --json`."""
    scenario = load_scenario(path)
    sim = run_scenario(scenario)
    result = build_result(scenario, sim.decisions, sim.end, 0.0)
    return scenario, events_of(sim.decisions), result


def trace(events: list[dict[str, Any]], limit: int = 80) -> str:
    return "\n".join(str(e) for e in events[:limit])


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    scenario, events, result = run(path)
    problems = check_run(scenario, events) + check_expect(scenario, result, events)
    problems += check_result(scenario, result, events)
    assert not problems, "\n".join(problems) + "\n--- events:\n" + trace(events)


def test_there_are_enough_scenarios() -> None:
    """The conformance set is the spec's executable form: keep it broad."""
    ours = [p for p in SCENARIOS if int(p.name.split("-", 1)[0]) >= 20]
    assert len(ours) >= 22
    for p in ours:
        assert p.read_text().startswith("# "), f"{p.name}: first line must say what it pins"


@pytest.mark.skipif(not CHECKER.exists(), reason=f"shared checker absent at {CHECKER}")
def test_cli_through_shared_checker() -> None:
    """The real console script, judged by the independent checker of the same contract."""
    exe = Path(sys.executable).parent / "jupyter-gpuaas"
    cmd = str(exe) if exe.exists() else f"{sys.executable} -m jupyter_gpuaas.cli"
    proc = subprocess.run(
        [sys.executable, str(CHECKER), cmd, *map(str, SCENARIOS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    n = len(SCENARIOS)
    assert re.fullmatch(rf"{n}/{n} scenarios pass", last), proc.stdout + proc.stderr


# --------------------------------------------------------------------------- event fields


def by_id(events: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The first event of `kind` per request id."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["event"] == kind and e.get("id") not in out:
            out[e["id"]] = e
    return out


def test_best_fit_node_choice_and_lowest_devices() -> None:
    """28: a request joins the fullest node that still fits; devices are taken lowest first."""
    _, events, _ = run(HERE / "scenarios" / "28-best-fit-placement.yaml")
    admits = by_id(events, "admit")
    assert admits["y"]["node"] == admits["x"]["node"]
    assert admits["u"]["node"] == admits["x"]["node"]
    assert admits["w"]["node"] == admits["z"]["node"] != admits["x"]["node"]
    assert admits["v"]["node"] not in {admits["x"]["node"], admits["z"]["node"]}
    assert list(admits["x"]["devices"]) == [0, 1]
    assert list(admits["y"]["devices"]) == [2]
    assert list(admits["u"]["devices"]) == [3]
    assert list(admits["z"]["devices"]) == [0, 1]
    assert list(admits["w"]["devices"]) == [2, 3]
    assert list(admits["v"]["devices"]) == [0, 1, 2, 3]


def test_reject_reasons_are_readable() -> None:
    """27: every rejection carries a sentence a user can act on, and names the culprit."""
    _, events, _ = run(HERE / "scenarios" / "27-rejection-reasons.yaml")
    rejects = by_id(events, "reject")
    assert set(rejects) == {"too-wide", "over-nominal", "no-tenant", "no-flavor", "not-in-quota"}
    for rid, e in rejects.items():
        reason = e.get("reason")
        assert isinstance(reason, str) and len(reason.split()) >= 3, (rid, reason)
        assert "Traceback" not in reason and "Error(" not in reason, (rid, reason)
    assert "ghost" in rejects["no-tenant"]["reason"]
    assert "v100" in rejects["no-flavor"]["reason"]
    # the reject is the very next event for that request, at its submit time
    for rid, e in rejects.items():
        mine = [x for x in events if x.get("id") == rid]
        assert [x["event"] for x in mine] == ["submit", "reject"], mine
        assert mine[0]["t"] == e["t"] == 0


def test_preempt_names_the_preemptor() -> None:
    """37 and 34: `by` is the request that took the room."""
    _, events, _ = run(HERE / "scenarios" / "37-victims-other-tenants-first.yaml")
    assert [(e["id"], e["by"]) for e in events if e["event"] == "preempt"] == [("a2", "bh")]
    _, events, _ = run(HERE / "scenarios" / "34-preempted-kernel-and-server-end.yaml")
    pre = {e["id"]: e["by"] for e in events if e["event"] == "preempt"}
    assert pre == {"k": "hi", "s": "hi"}
    # a preempted kernel/server ends: nothing about it after the preempt
    for rid in ("k", "s"):
        mine = [e["event"] for e in events if e.get("id") == rid]
        assert mine[-1] == "preempt", mine


def test_preempted_job_requeued_and_restarted() -> None:
    """33: the victim is requeued at once and, readmitted at 200, runs its full 100 s."""
    _, events, _ = run(HERE / "scenarios" / "33-lower-or-newer-equal-priority.yaml")
    mine = [(e["t"], e["event"]) for e in events if e.get("id") == "small"]
    assert mine == [
        (2, "submit"),
        (2, "admit"),
        (100, "preempt"),
        (100, "requeue"),
        (200, "admit"),
        (300, "finish"),
    ], mine


def test_park_expire_requeue_sequence() -> None:
    """43: cull parks the quota, expire releases it after the ttl, requeue waits for busy."""
    _, events, _ = run(HERE / "scenarios" / "43-reservation-expires.yaml")
    mine = [(e["t"], e["event"], e.get("parked")) for e in events if e.get("id") == "k1"]
    assert mine[:6] == [
        (0, "submit", None),
        (0, "admit", None),
        (150, "cull", True),
        (450, "expire", None),
        (1000, "requeue", None),
        (1000, "admit", None),
    ], mine


def test_resume_binds_devices_again() -> None:
    """42: a resume event carries node and devices, and the kernel is never re-admitted."""
    _, events, _ = run(HERE / "scenarios" / "42-cull-reservation-resume-ahead.yaml")
    resume = by_id(events, "resume")["k1"]
    assert resume["t"] == 500 and len(resume["devices"]) == 2 and resume["node"] == "a100-0"
    assert [e["t"] for e in events if e["event"] == "admit" and e["id"] == "k1"] == [0]


def test_autoscale_asks_once_and_names_nodes() -> None:
    """48: one node is asked for (max_nodes 2), it joins as a100-1 after the delay."""
    _, events, _ = run(HERE / "scenarios" / "48-autoscale-max-nodes.yaml")
    ready = [e for e in events if e["event"] == "node_ready"]
    assert [(e["t"], e["node"]) for e in ready] == [(51, "a100-1")]
    ups = [e for e in events if e["event"] == "scale_up"]
    assert ups and all(e["t"] == 1 and e["flavor"] == "a100" for e in ups), ups


def test_quota_blocked_asks_no_nodes() -> None:
    """47: the only scale_up is the one o1 (capacity-blocked) caused, at its submit."""
    _, events, _ = run(HERE / "scenarios" / "47-autoscale-quota-blocked-asks-nothing.yaml")
    assert [e["t"] for e in events if e["event"] == "scale_up"] == [10]


def test_report_sums_each_cohort_over_its_subtree() -> None:
    """`simulate`'s result: every tenant names its cohort, and per_cohort adds up each
    cohort's whole subtree (org = research + ops in the shared cohort-tree scenario)."""
    _, _, result = run(HERE / "scenarios" / "13-cohort-tree.yaml")
    summary = result["summary"]
    tenants, cohorts = summary["per_tenant"], summary["per_cohort"]
    assert tenants["vision"]["cohort"] == "research"
    assert tenants["infra"]["cohort"] == "ops"
    assert cohorts["research"]["parent"] == "org"
    assert "parent" not in cohorts["org"]
    research = tenants["vision"]["gpu_hours_allocated"] + tenants["nlp"]["gpu_hours_allocated"]
    assert cohorts["research"]["gpu_hours_allocated"] == pytest.approx(research)
    both = cohorts["research"]["gpu_hours_allocated"] + cohorts["ops"]["gpu_hours_allocated"]
    assert cohorts["org"]["gpu_hours_allocated"] == pytest.approx(both)
    assert cohorts["org"]["requests"] == 4
    assert cohorts["org"]["admitted"] == 4
