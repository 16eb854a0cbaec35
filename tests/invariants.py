"""Invariants of a simulator run, checked by replaying its events against SCENARIO.md.

The conformance scenarios pin a handful of expectations each; these invariants are what
must hold for *every* run, so the property tests can throw random scenarios at the core
and still know when it is wrong. The replay trusts nothing but the event stream and the
scenario itself: it rebuilds nodes, bound devices, quota usage and each request's life,
and reports every place where the stream contradicts the contract.

`check_run` returns human-readable problems (empty = fine); `check_expect` reads a
scenario's `expect:` block; `check_result` cross-checks the `--json` result object
against the events.

The pieces: scenario_rules.py recomputes the contract's rules from the config,
replay_state.py holds what a replay rebuilds, replay_checks.py walks the events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from replay_checks import replay
from replay_state import Event, Snapshot, events_of
from scenario_rules import EPS

from jupyter_gpuaas.sim.scenario import Scenario

__all__ = ["check_expect", "check_result", "check_run", "events_of"]

#: Result-object states (SCENARIO.md) that each replay state may be reported as.
RESULT_STATES: Mapping[str, frozenset[str]] = {
    "queued": frozenset({"queued"}),
    "admitted": frozenset({"admitted"}),
    "parked": frozenset({"parked"}),
    "culled": frozenset({"culled"}),
    "expired": frozenset({"culled", "queued"}),
    "finished": frozenset({"finished"}),
    "cancelled": frozenset({"cancelled"}),
    "rejected": frozenset({"rejected"}),
    "preempted": frozenset({"preempted"}),
}


def check_run(scenario: Scenario, decisions: Sequence[Any]) -> list[str]:
    """Every invariant of SCENARIO.md over one run; an empty list means the run is sound."""
    return replay(scenario, decisions).errors


# --------------------------------------------------------------------------- expect:


def at(timeline: Sequence[Snapshot], t: float) -> Snapshot | None:
    """The state just after all decisions at time t (the last snapshot at or before t)."""
    snap = None
    for s in timeline:
        if s.t <= t + EPS:
            snap = s
        else:
            break
    return snap


def _first(events: Sequence[Event], kind: str, rid: str) -> Event | None:
    return next((e for e in events if e.get("event") == kind and e.get("id") == rid), None)


def check_expect(
    scenario: Scenario, result: Mapping[str, Any], decisions: Sequence[Any]
) -> list[str]:
    """Every key of a scenario's `expect:` block, against the result and the events."""
    exp = scenario.expect or {}
    events = events_of(decisions)
    rp = replay(scenario, events)
    reqs: Mapping[str, Any] = result.get("requests", {})
    errs: list[str] = []
    ids_by_event: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if "id" in e:
            ids_by_event[str(e["event"])].add(str(e["id"]))

    def first_admit(rid: str) -> float | None:
        ev = _first(events, "admit", rid)
        return None if ev is None else float(ev["t"])

    for rid in exp.get("admitted") or []:
        if rid not in ids_by_event["admit"]:
            errs.append(f"{rid} never admitted, expected admitted")
    for rid in exp.get("never_admitted") or []:
        if rid in ids_by_event["admit"]:
            errs.append(f"{rid} admitted at {first_admit(rid)}, expected never")
        state = (reqs.get(rid) or {}).get("state")
        if state != "queued":
            errs.append(f"{rid} ends {state}, expected still queued")
    for rid in exp.get("rejected") or []:
        if rid not in ids_by_event["reject"]:
            errs.append(f"{rid} not rejected")
        if (reqs.get(rid) or {}).get("state") != "rejected":
            errs.append(f"{rid} state {(reqs.get(rid) or {}).get('state')}, expected rejected")
    for key, kind in (("preempted", "preempt"), ("culled", "cull")):
        for rid in exp.get(key) or []:
            if rid not in ids_by_event[kind]:
                errs.append(f"{rid} not {key}")
    for rid in exp.get("not_preempted") or []:
        if rid in ids_by_event["preempt"]:
            errs.append(f"{rid} preempted, expected not")
    for rid, when in (exp.get("admitted_at") or {}).items():
        got = first_admit(rid)
        if got is None or abs(got - float(when)) > 1e-6:
            errs.append(f"{rid} first admitted at {got}, expected {when}")
        res = (reqs.get(rid) or {}).get("admitted_at")
        if got is not None and (res is None or abs(float(res) - got) > 1e-6):
            errs.append(f"result says {rid} admitted_at {res}, events say {got}")
    for rid, when in (exp.get("resumed_at") or {}).items():
        ev = _first(events, "resume", rid)
        got = None if ev is None else float(ev["t"])
        if got is None or abs(got - float(when)) > 1e-6:
            errs.append(f"{rid} first resumed at {got}, expected {when}")
    for rid, flavor in (exp.get("flavor_of") or {}).items():
        ev = _first(events, "admit", rid)
        if ev is None or ev.get("flavor") != flavor:
            errs.append(
                f"{rid} admitted on {None if ev is None else ev.get('flavor')}, expected {flavor}"
            )
    for a, b in exp.get("order") or []:
        ta, tb = first_admit(a), first_admit(b)
        if ta is None or (tb is not None and ta > tb + EPS):
            errs.append(f"order: {a} (admitted {ta}) should be admitted no later than {b} ({tb})")
    for t, want in (exp.get("held_at") or {}).items():
        snap = at(rp.timeline, float(t))
        held = snap.held if snap else {}
        for tenant, gpus in want.items():
            if held.get(tenant, 0) != gpus:
                errs.append(f"held_at {t}: {tenant} holds {held.get(tenant, 0)}, expected {gpus}")
    for t, want in (exp.get("nodes_at") or {}).items():
        snap = at(rp.timeline, float(t))
        counts = snap.nodes if snap else {f: fl.nodes for f, fl in scenario.config.flavors.items()}
        for flavor, n in want.items():
            if counts.get(flavor, 0) != n:
                errs.append(f"nodes_at {t}: {flavor} has {counts.get(flavor, 0)}, expected {n}")
    return errs


def check_result(
    scenario: Scenario, result: Mapping[str, Any], decisions: Sequence[Any]
) -> list[str]:
    """The `--json` result agrees with the events: states, first admission, counters."""
    rp = replay(scenario, decisions)
    reqs: Mapping[str, Any] = result.get("requests", {})
    errs: list[str] = []
    for rid, life in rp.lives.items():
        entry = reqs.get(rid)
        if life.state == "unsubmitted":
            if entry is not None and entry.get("state") not in ("queued", None):
                errs.append(f"{rid} never submitted but reported {entry.get('state')}")
            continue
        if entry is None:
            errs.append(f"{rid} missing from the result")
            continue
        legal = RESULT_STATES.get(life.state, frozenset())
        if entry.get("state") not in legal:
            errs.append(f"{rid} reported {entry.get('state')!r}, events end it {life.state}")
        got = entry.get("admitted_at")
        if (got is None) != (life.first_admit is None) or (
            got is not None
            and life.first_admit is not None
            and abs(float(got) - life.first_admit) > 1e-6
        ):
            errs.append(f"{rid} admitted_at {got}, events say {life.first_admit}")
        for key, n in (("preemptions", life.preemptions), ("culls", life.culls)):
            if key in entry and entry[key] != n:
                errs.append(f"{rid} {key} {entry[key]}, events say {n}")
    return errs
