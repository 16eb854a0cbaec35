"""The virtual-clock driver: replays a scenario through the admission core.

It plays the parts the real world plays for the gateway: users submit and cancel, holders
finish after their duration and are busy or idle by their `busy` intervals (measured from
the request's first admission). At each instant, releases (finish, cancel, idle) and the
core's own deadlines go first, then arrivals, then one admission pass — so nothing waits
for a later tick.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ..admission.core import AdmissionCore
from ..admission.model import Decision, Request
from .scenario import Scenario, ScenarioRequest

# Phases within one instant: releases and activity first, then arrivals, then cancels
# (so a request cancelled at its own submit instant is never admitted); then one pass.
_RELEASE, _ARRIVE, _CANCEL = 0, 1, 2


@dataclass
class SimRun:
    decisions: list[Decision]
    end: float
    core: AdmissionCore = field(repr=False)


@dataclass
class _Life:
    """What the driver knows of one request while it plays it."""

    spec: ScenarioRequest
    anchor: float | None = None  # first admission: busy intervals count from here
    generation: int = 0  # bumps when a job restarts, so its old finish is ignored


def _busy_at(spec: ScenarioRequest, offset: float) -> bool:
    if spec.busy is None:
        return True
    return any(s <= offset < e for s, e in spec.busy)


def run_scenario(scenario: Scenario, until: float | None = None) -> SimRun:
    core = AdmissionCore(scenario.config)
    stop = until if until is not None else scenario.until
    limit = math.inf if stop is None else float(stop)
    lives = {r.id: _Life(r) for r in scenario.requests}
    heap: list[tuple[float, int, int, str, str, int, bool]] = []
    seq = 0

    def push(t: float, phase: int, what: str, rid: str, gen: int = 0, busy: bool = False) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, phase, seq, what, rid, gen, busy))

    for r in scenario.requests:
        push(r.submit, _ARRIVE, "submit", r.id)
        if r.cancel is not None:
            push(r.cancel, _CANCEL, "cancel", r.id)

    out: list[Decision] = []
    now = 0.0

    def follow(decisions: list[Decision], t: float) -> None:
        """Record decisions and play the holders' side of admissions."""
        for d in decisions:
            out.append(d)
            if d.event == "preempt" and d.id is not None:
                lives[d.id].generation += 1  # its finish belonged to the run that ended
            if d.event not in ("admit", "resume") or d.id is None:
                continue
            life = lives[d.id]
            spec = life.spec
            if spec.kind == "job":
                life.generation += 1
                push(t + spec.duration, _RELEASE, "finish", d.id, life.generation)
                continue
            if life.anchor is None:
                life.anchor = t
                push(t + spec.duration, _RELEASE, "finish", d.id, 0)
                for s, e in spec.busy or ():
                    if s > 0:
                        push(t + s, _RELEASE, "activity", d.id, busy=True)
                    push(t + e, _RELEASE, "activity", d.id, busy=False)
            if core.get(d.id) is not None:  # not preempted in the same pass
                out.extend(core.activity(d.id, _busy_at(spec, t - life.anchor), t))

    while True:
        t_next = heap[0][0] if heap else math.inf
        deadline = core.next_deadline()
        if deadline is not None:
            t_next = min(t_next, deadline)
        if t_next == math.inf or t_next > limit:
            break
        now = t_next
        decisions: list[Decision] = []
        while heap and heap[0][0] == now and heap[0][1] == _RELEASE:
            _, _, _, what, rid, gen, busy = heapq.heappop(heap)
            if core.get(rid) is None:
                continue
            if what == "finish":
                if gen == lives[rid].generation:
                    decisions += core.finish(rid, now)
            else:
                decisions += core.activity(rid, busy, now)
        decisions += core.advance(now)
        while heap and heap[0][0] == now and heap[0][1] == _ARRIVE:
            _, _, _, _, rid, _, _ = heapq.heappop(heap)
            spec = lives[rid].spec
            req = Request(
                id=spec.id,
                tenant=spec.tenant,
                user=spec.user,
                kind=spec.kind,
                gpus=spec.gpus,
                submit_time=spec.submit,
                flavor=spec.flavor,
                priority=spec.priority,
            )
            decisions += core.submit(req, now)
        while heap and heap[0][0] == now and heap[0][1] == _CANCEL:
            rid = heapq.heappop(heap)[4]
            if core.get(rid) is not None:
                decisions += core.cancel(rid, now)
        follow(decisions, now)
        follow(core.schedule(now), now)
    end = limit if stop is not None else now
    return SimRun(out, end, core)
