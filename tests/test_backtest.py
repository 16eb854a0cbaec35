"""`simulate --estimates`: each request's estimate at submit, the accuracy, and decisions
that are the same with or without it (the estimates run on copies of the core)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from simutil import SCENARIOS, simulate, write

from jupyter_gpuaas.admission.estimate import forecast
from jupyter_gpuaas.admission.model import Decision
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


def _busy_trace(seed: int, n: int = 240, days: float = 2.5) -> list[dict[str, Any]]:
    """A crowded trace over more than a day (so the arrival forecast and the calibration
    take part): kernels with idle gaps, long servers, low-priority jobs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(("kernel", "kernel", "server", "job"))
        duration = round(rng.lognormvariate(8.0, 0.7))
        r: dict[str, Any] = {
            "id": f"r{i:04d}",
            "tenant": rng.choice(("vision", "nlp")),
            "user": f"u{rng.randrange(8)}",
            "kind": kind,
            "gpus": rng.choice((1, 1, 2, 4)),
            "submit": round(rng.uniform(0, days * 86400)),
            "duration": duration,
            "priority": 0 if kind == "job" else 100,
        }
        if kind != "job":
            r["busy"] = [[0, max(60, duration // 3)], [duration // 2, duration]]
        out.append(r)
    out.sort(key=lambda r: (r["submit"], r["id"]))
    return out


def _estimates_at_submit(tmp_path: Path, requests: list[dict[str, Any]]) -> dict[str, Any]:
    doc = {
        "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}},
        "tenants": {
            "vision": {"cohort": "lab", "quota": {"a100": 4}},
            "nlp": {"cohort": "lab", "quota": {"a100": 4}},
        },
        "policy": {"fair_sharing": True, "idle_timeout": 1800},
        "requests": requests,
    }
    backtest = Backtest(load_scenario(write(tmp_path, doc)))
    run_scenario(load_scenario(write(tmp_path, doc)), backtest=backtest)
    return dict(backtest.eta)


@pytest.mark.slow  # two backtests of a generated trace: about 2 s
def test_the_estimate_at_submit_uses_only_what_was_known_then(tmp_path: Path) -> None:
    """No peeking: what arrives after a request's submit, or how long it will really be
    held, changes nothing in the estimate it was shown at submit (the history, the
    calibration and the arrival forecast only learn from the past)."""
    trace = _busy_trace(11)
    before = _estimates_at_submit(tmp_path, trace)
    cut = 1.5 * 86400
    # Everything submitted after the cut is changed: other sizes, kinds and durations,
    # and a burst of extra requests.
    altered = []
    for r in trace:
        if r["submit"] < cut:
            altered.append(r)
        else:
            altered.append({**r, "gpus": 4, "kind": "job", "duration": 99, "priority": 0})
            altered[-1].pop("busy", None)
    altered += [
        {"id": f"x{i}", "tenant": "nlp", "user": "x", "kind": "kernel", "gpus": 2,
         "submit": round(cut) + 60 * i, "duration": 5000, "priority": 100}
        for i in range(30)
    ]  # fmt: skip
    altered.sort(key=lambda r: (r["submit"], r["id"]))
    after = _estimates_at_submit(tmp_path, altered)
    early = {r["id"] for r in trace if r["submit"] < cut}
    estimated = {rid for rid in early if before.get(rid) not in (None, (0.0, 0.0, 0.0))}
    assert len(estimated) >= 20, "the trace must crowd the queue for the test to mean anything"
    assert {rid: after.get(rid) for rid in early} == {rid: before.get(rid) for rid in early}
    late = [r["id"] for r in trace if r["submit"] >= cut]
    assert [before.get(rid) for rid in late] != [after.get(rid) for rid in late]


def test_a_hold_lasts_until_the_quota_goes_back() -> None:
    # Five kernels, each culled and parked at 600 s and back at 700 s, finish at 2000 s:
    # held 2000 s each (the parked reservation kept their quota). Five more are culled
    # without a reservation at 600 s, and five parked ones expire at 1800 s: those holds
    # end there.
    ids = [f"k{i}" for i in range(15)]
    who = [SimpleNamespace(id=rid, kind="kernel", user=f"u{i // 5}") for i, rid in enumerate(ids)]
    bt = Backtest(SimpleNamespace(requests=who))  # type: ignore[arg-type]
    for i, rid in enumerate(ids):
        group = i // 5
        bt.observe([Decision(0.0, "admit", rid, {})])
        bt.observe([Decision(600.0, "cull", rid, {"parked": group != 1})])
        if group == 0:
            bt.observe([Decision(700.0, "resume", rid, {})])
            bt.observe([Decision(2000.0, "finish", rid, {})])
        elif group == 2:
            bt.observe([Decision(1800.0, "expire", rid, {})])
    assert bt.history.remaining("kernel", "u0", 0.0, 0.5) == (2000.0, True)
    assert bt.history.remaining("kernel", "u1", 0.0, 0.5) == (600.0, True)
    assert bt.history.remaining("kernel", "u2", 0.0, 0.5) == (1800.0, True)
    assert not bt.held_since  # every hold ended
    # Of the 15 culls, 5 users came back within the reservation: a culled kernel's user
    # is expected back one time in three (the estimates' `History.comes_back`).
    assert bt.history.comes_back("kernel") == pytest.approx(1 / 3)


def test_a_preempted_run_is_no_sample_of_a_hold() -> None:
    # Five jobs run 100 s, are preempted and queued again (a preempted job runs again from
    # the start), then run their whole 3,600 s: each is one hold of 3,600 s. The cut runs
    # are not how long a job holds its quota (the core cut them; a forward run makes its
    # own preemptions): counted, a quarter of the history would have said 100 s.
    ids = [f"j{i}" for i in range(5)]
    who = [SimpleNamespace(id=rid, kind="job", user="ann") for rid in ids]
    bt = Backtest(SimpleNamespace(requests=who))  # type: ignore[arg-type]
    for rid in ids:
        bt.observe([Decision(0.0, "admit", rid, {})])
        bt.observe([Decision(100.0, "preempt", rid, {}), Decision(100.0, "requeue", rid, {})])
        bt.observe([Decision(500.0, "admit", rid, {})])
        bt.observe([Decision(4100.0, "finish", rid, {})])
    assert len(bt.history) == 5
    assert bt.history.remaining("job", "ann", 0.0, 0.25) == (3600.0, True)
    assert not bt.held_since


def test_a_culled_request_queued_again_is_forecast_as_an_arrival() -> None:
    # "k" was culled, its reservation expired, and its user came back at 5000 s: queued
    # again, an arrival to the queue; "j" was preempted and queued again by the core
    # itself (a forward run does that on its own). A day later, the forecast of the next
    # hours has "k" coming back at 5000 s + a day, and no "j".
    who = [
        SimpleNamespace(id="k", kind="kernel", user="ann", tenant="vision", gpus=2,
                        flavor=None, priority=100),
        SimpleNamespace(id="j", kind="job", user="bob", tenant="vision", gpus=1,
                        flavor=None, priority=0),
    ]  # fmt: skip
    bt = Backtest(SimpleNamespace(requests=who))  # type: ignore[arg-type]
    bt.observe([Decision(0.0, "admit", "k", {}), Decision(0.0, "admit", "j", {})])
    bt.observe([Decision(1800.0, "cull", "k", {"parked": True})])
    bt.observe([Decision(3000.0, "expire", "k", {})])
    bt.observe([Decision(4000.0, "preempt", "j", {}), Decision(4000.0, "requeue", "j", {})])
    bt.observe([Decision(5000.0, "requeue", "k", {})])
    coming = forecast(bt.arrived, 86400.0)
    assert [(r.user, r.kind, r.gpus, r.priority, r.submit_time) for r in coming] == [
        ("ann", "kernel", 2, 100, 86400.0 + 5000.0)
    ]


def test_the_backtest_keeps_how_long_after_a_cull_users_came_back() -> None:
    # Five kernels culled (parked) at 1800 s; their users came back 100-500 s later. A
    # sixth was culled and its reservation expired: no return. Of reservations parked
    # 300 s, those whose users are still to come back are the two later returns of the
    # five that came back, against the one that expired.
    ids = [f"k{i}" for i in range(6)]
    who = [SimpleNamespace(id=rid, kind="kernel", user="ann") for rid in ids]
    bt = Backtest(SimpleNamespace(requests=who))  # type: ignore[arg-type]
    for i, rid in enumerate(ids):
        bt.observe([Decision(0.0, "admit", rid, {})])
        bt.observe([Decision(1800.0, "cull", rid, {"parked": True})])
        if i < 5:
            bt.observe([Decision(1900.0 + 100.0 * i, "resume", rid, {})])
        else:
            bt.observe([Decision(3000.0, "expire", rid, {})])
        bt.observe([Decision(6000.0, "finish", rid, {})])
    assert not bt.parked_at
    assert bt.history.comes_back("kernel") == pytest.approx(5 / 6)
    later = (5 / 6) * (2 / 5)
    assert bt.history.comes_back("kernel", parked_for=300.0) == pytest.approx(
        later / (later + 1 / 6)
    )


def test_a_new_request_that_claims_a_reservation_goes_on_with_its_hold() -> None:
    # Five kernels admitted at 0 s, culled and parked at 600 s; at 900 s a new kernel of
    # each user takes the reservation over (the core's `claimed_by`, then an admit with
    # `resumed_from`) and is released at 3,000 s. Each user held the quota for one hold of
    # 3,000 s with one cull, and came back 300 s after it: what the gateway keeps too
    # (arbiter `_account`, `Request.held_since`), not a hold of 900 s and one of 2,100 s.
    ids = [f"k{i}" for i in range(5)]
    who = [SimpleNamespace(id=rid, kind="kernel", user=f"u{i}") for i, rid in enumerate(ids)]
    who += [SimpleNamespace(id=f"n{i}", kind="kernel", user=f"u{i}") for i in range(5)]
    bt = Backtest(SimpleNamespace(requests=who))  # type: ignore[arg-type]
    for i, rid in enumerate(ids):
        new = f"n{i}"
        bt.observe([Decision(0.0, "admit", rid, {})])
        bt.observe([Decision(600.0, "cull", rid, {"parked": True})])
        bt.observe([Decision(900.0, "finish", rid, {"reason": "…", "claimed_by": new})])
        bt.observe([Decision(900.0, "admit", new, {"resumed_from": rid})])
        bt.observe([Decision(3000.0, "finish", new, {})])
    assert bt.history.holds("kernel") == [3000.0] * 5
    assert bt.history.culls("kernel") == (5, 0)
    assert bt.history.returns("kernel") == [300.0] * 5
    assert not bt.held_since and not bt.parked_at


def test_the_backtest_hears_the_idle_spells_a_gateway_hears(tmp_path: Path) -> None:
    # k1 is busy 0-60 s, 300-400 s and 1000-1100 s: idle 240 s and 600 s, each spell over
    # long before its cull (idle_timeout 1800 s). The quiet replay tells the core neither
    # (they change no decision); with every spell told, as a gateway hears them from
    # heartbeats, the backtest's history keeps both (`History.busy_before_cull`).
    path = write(
        tmp_path,
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
            "tenants": {"vision": {"quota": {"a100": 1}}},
            "policy": {"idle_timeout": 1800},
            "requests": [
                {"id": "k1", "tenant": "vision", "user": "ann", "kind": "kernel", "gpus": 1,
                 "submit": 0, "duration": 1200, "busy": [[0, 60], [300, 400], [1000, 1100]]},
            ],
        },
    )  # fmt: skip
    scenario = load_scenario(path)
    quiet = Backtest(scenario)
    run_scenario(scenario, backtest=quiet)
    assert quiet.history.idle_spells("kernel") == []
    heard = Backtest(scenario)
    run_scenario(scenario, backtest=heard, every_spell=True)
    assert heard.history.idle_spells("kernel") == [240.0, 600.0]
