"""`jupyter-gpuaas simulate`: the result object (build_result) and its table (format_table).

Run in-process on hand-written decision lists, so they pin the report's arithmetic
without depending on the core's decisions; what the real driver's results look like is
checked in test_sim_cli.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpuaas.admission.model import Decision
from jupyter_gpuaas.sim.report import build_result, format_table, percentile
from jupyter_gpuaas.sim.scenario import Scenario, ScenarioRequest, parse_scenario

# --- the result object --------------------------------------------------------------------


def _scenario(requests: list[ScenarioRequest], **flavor_nodes: int) -> Scenario:
    doc = {
        "flavors": {name: {"nodes": n, "gpus_per_node": 4} for name, n in flavor_nodes.items()},
        "tenants": {"a": {"quota": {f: 8 for f in flavor_nodes}}, "b": {"quota": {}}},
        "requests": [],
    }
    base = parse_scenario(doc)
    return Scenario(config=base.config, requests=tuple(requests))


def _req(
    rid: str, tenant: str = "a", gpus: int = 2, submit: float = 0.0, **kw: Any
) -> ScenarioRequest:
    return ScenarioRequest(rid, tenant, "u", kw.pop("kind", "kernel"), gpus, submit, 3600.0, **kw)


def _admit(t: float, rid: str, gpus: int = 2, flavor: str = "a100") -> Decision:
    return Decision(
        t,
        "admit",
        rid,
        {
            "tenant": "a",
            "flavor": flavor,
            "gpus": gpus,
            "node": f"{flavor}-0",
            "devices": list(range(gpus)),
        },
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 95) == 10.0
    assert percentile(values, 10) == 1.0
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 95) == 7.0


def test_result_states_waits_and_gpu_hours() -> None:
    scenario = _scenario(
        [
            _req("k1", busy=((0.0, 1800.0),)),  # busy only in its first half hour
            _req("j1", kind="job", gpus=4, submit=100.0),  # preempted, requeued, finished
            _req("q1", submit=1000.0),  # never admitted
            _req("x1", tenant="b"),  # rejected
            _req("c1", submit=0.0),  # cancelled while queued
            _req("late", submit=99999.0),  # arrives after the end
        ],
        a100=2,
    )
    decisions = [
        Decision(0.0, "submit", "k1", {"tenant": "a", "kind": "kernel", "gpus": 2}),
        _admit(0.0, "k1"),
        Decision(0.0, "reject", "x1", {"reason": "no quota"}),
        _admit(200.0, "j1", gpus=4),
        Decision(600.0, "cancel", "c1"),
        Decision(1800.0, "preempt", "j1", {"by": "k9"}),
        Decision(1800.0, "requeue", "j1"),
        Decision(3600.0, "cull", "k1", {"parked": True}),
        Decision(3600.0, "resume", "k1", {"node": "a100-0", "devices": [0, 1]}),
        _admit(3600.0, "j1", gpus=4),
        Decision(5400.0, "cull", "k1", {"parked": False}),
        Decision(7200.0, "finish", "j1"),
    ]
    result = build_result(scenario, decisions, end=7200.0, wall_seconds=0.5)
    reqs = result["requests"]
    assert reqs["k1"] == {
        "state": "culled",
        "admitted_at": 0.0,
        "wait": 0.0,
        "flavor": "a100",
        "preemptions": 0,
        "culls": 2,
    }
    assert reqs["j1"]["state"] == "finished"
    assert reqs["j1"]["admitted_at"] == 200.0 and reqs["j1"]["preemptions"] == 1
    assert reqs["q1"] == {
        "state": "queued",
        "admitted_at": None,
        "wait": 6200.0,
        "flavor": None,
        "preemptions": 0,
        "culls": 0,
    }
    assert reqs["x1"]["state"] == "rejected" and reqs["x1"]["wait"] == 0.0
    assert reqs["c1"]["state"] == "cancelled" and reqs["c1"]["wait"] == 600.0
    assert "late" not in reqs  # submitted after the clock stopped: not in the result

    s = result["summary"]
    assert (s["requests"], s["admitted"], s["rejected"], s["never_admitted"]) == (5, 2, 1, 2)
    # waits counted: k1 0, j1 100, q1 6200, c1 600 (x1 rejected, late never arrived)
    assert s["wait_p50"] == 100.0 and s["wait_p95"] == 6200.0 and s["wait_max"] == 6200.0
    # 2 nodes x 4 GPUs x 2 h
    assert s["gpu_hours_capacity"] == 16.0 and s["node_hours"] == 4.0
    # k1: 2 GPUs 0..5400 = 3 GPU-h; j1: 4 GPUs 200..1800 + 3600..7200
    assert s["gpu_hours_allocated"] == pytest.approx(3.0 + 4 * (1600 + 3600) / 3600, abs=1e-5)
    # k1 busy only 0..1800 (relative to its first admission); j1 has no busy: all of it
    assert s["gpu_hours_busy"] == pytest.approx(1.0 + 4 * (1600 + 3600) / 3600, abs=1e-5)
    assert s["gpu_hours_idle_allocated"] == pytest.approx(2.0, abs=1e-5)
    assert s["utilization"] == pytest.approx(s["gpu_hours_busy"] / 16.0, abs=1e-5)
    assert s["per_tenant"]["a"]["admitted"] == 2
    assert s["per_tenant"]["b"] == {
        "requests": 1,
        "admitted": 0,
        "rejected": 1,
        "gpu_hours_allocated": 0.0,
        "gpu_hours_busy": 0.0,
        "wait_p50": 0.0,
        "wait_p95": 0.0,
    }
    assert result["decisions"] == len(decisions)
    assert result["wall_seconds"] == 0.5


def test_rejections_carry_their_reason_in_json_and_table() -> None:
    scenario = _scenario([_req("k1"), _req("x1", tenant="b"), _req("x2", gpus=9)], a100=1)
    decisions = [
        _admit(0.0, "k1"),
        Decision(0.0, "reject", "x1", {"reason": "unknown tenant 'b'"}),
        Decision(0.0, "reject", "x2", {"reason": "9 GPUs do not fit on one node"}),
    ]
    result = build_result(scenario, decisions, end=100.0, wall_seconds=0.0)
    reqs = result["requests"]
    assert reqs["x1"]["reason"] == "unknown tenant 'b'" and reqs["x1"]["tenant"] == "b"
    assert reqs["x2"]["reason"] == "9 GPUs do not fit on one node"
    assert "reason" not in reqs["k1"]
    lines = format_table(result).splitlines()
    section = lines[lines.index("rejected") + 1 :]
    assert section[0].split() == ["x1", "b", "unknown", "tenant", "'b'"]
    assert section[1].split()[:2] == ["x2", "a"]
    assert section[1].endswith("9 GPUs do not fit on one node")
    none = format_table(build_result(scenario, decisions[:1], 100.0, 0.0)).splitlines()
    assert "rejected" not in none


def test_many_rejections_are_listed_up_to_a_limit() -> None:
    reqs = [_req(f"x{i}", tenant="b") for i in range(25)]
    decisions = [Decision(0.0, "reject", r.id, {"reason": "no such tenant"}) for r in reqs]
    result = build_result(_scenario(reqs, a100=1), decisions, end=10.0, wall_seconds=0.0)
    lines = format_table(result).splitlines()
    section = lines[lines.index("rejected") + 1 :]
    assert sum("no such tenant" in line for line in section) == 20
    assert "  … and 5 more (every reason is in --json)" in section


def test_result_parked_preempted_and_still_admitted() -> None:
    scenario = _scenario([_req("k1"), _req("s1", kind="server"), _req("p1")], a100=1)
    decisions = [
        _admit(0.0, "k1"),
        _admit(0.0, "s1"),
        _admit(0.0, "p1", gpus=0),
        Decision(100.0, "cull", "k1", {"parked": True}),
        Decision(200.0, "preempt", "p1", {"by": "x"}),
    ]
    reqs = build_result(scenario, decisions, end=1000.0, wall_seconds=0.0)["requests"]
    assert [reqs[r]["state"] for r in ("k1", "s1", "p1")] == ["parked", "admitted", "preempted"]
    decisions.append(Decision(300.0, "expire", "k1"))
    reqs = build_result(scenario, decisions, end=1000.0, wall_seconds=0.0)["requests"]
    assert reqs["k1"]["state"] == "culled"


def test_capacity_follows_node_events() -> None:
    scenario = _scenario([], a100=1)
    decisions = [
        Decision(0.0, "scale_up", None, {"flavor": "a100", "nodes": 2}),
        Decision(300.0, "node_ready", None, {"flavor": "a100", "node": "a100-1"}),
        Decision(300.0, "node_ready", None, {"flavor": "a100", "node": "a100-2"}),
        Decision(2100.0, "scale_down", None, {"flavor": "a100", "node": "a100-2"}),
    ]
    s = build_result(scenario, decisions, end=3900.0, wall_seconds=0.0)["summary"]
    # a100-0: 3900 s; a100-1: 3600 s; a100-2: 1800 s  -> 9300 node-seconds
    assert s["node_hours"] == pytest.approx(9300 / 3600, abs=1e-5)
    assert s["gpu_hours_capacity"] == pytest.approx(4 * 9300 / 3600, abs=1e-5)
    assert s["utilization"] == 0.0


def test_zero_capacity_means_zero_utilization() -> None:
    s = build_result(_scenario([], a100=0), [], end=0.0, wall_seconds=0.0)["summary"]
    assert s["utilization"] == 0.0 and s["gpu_hours_capacity"] == 0.0


@pytest.mark.slow
def test_report_of_a_large_run_counts_every_decision() -> None:
    # Its speed is measured in benchmarks/ (month_trace.py), not asserted here.
    n = 100_000
    requests = [
        _req(f"r{i}", submit=float(i), busy=((0.0, 60.0), (120.0, 300.0))) for i in range(n)
    ]
    scenario = _scenario(requests, a100=1000)
    decisions: list[Decision] = []
    for i in range(n):
        rid = f"r{i}"
        decisions += [
            Decision(float(i), "submit", rid, {"tenant": "a", "kind": "kernel", "gpus": 2}),
            _admit(float(i + 5), rid),
            Decision(float(i + 400), "cull", rid, {"parked": True}),
            Decision(float(i + 500), "resume", rid, {"node": "a100-0", "devices": [0, 1]}),
            Decision(float(i + 900), "requeue", rid),
            Decision(float(i + 950), "admit", rid, {"flavor": "a100", "gpus": 2}),
            Decision(float(i + 1000), "cull", rid, {"parked": False}),
            Decision(float(i + 1200), "admit", rid, {"flavor": "a100", "gpus": 2}),
            Decision(float(i + 1300), "cull", rid, {"parked": False}),
            Decision(float(i + 1400), "finish", rid),
        ]
    result = build_result(scenario, decisions, end=float(n + 2000), wall_seconds=0.0)
    table = format_table(result)
    assert result["decisions"] == 10 * n
    summary = result["summary"]
    assert (summary["requests"], summary["admitted"], summary["never_admitted"]) == (n, n, 0)
    assert f"requests     {n}: {n} admitted" in table
