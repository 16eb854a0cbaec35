"""The virtual-clock driver: replays a scenario through the admission core.

It plays the parts the real world plays for the gateway: users submit and cancel, holders
finish after their duration and are busy or idle by their `busy` intervals (measured from
the request's first admission). At each instant the driver hands the core that instant's
batch of events (holders finishing or going idle, arrivals, cancels) and then calls
`step(now)` once, as the gateway does after each operation: the core acts on its own
deadlines (culls, expiries, evictions, nodes) and runs one admission cycle, releases
before admissions, so nothing waits for a later tick.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ..admission.core import AdmissionCore
from ..admission.model import Decision, Request
from .scenario import Scenario, ScenarioRequest

# What a holder does, in the driver's event heap.
_FINISH, _IDLE, _BUSY = 0, 1, 2
# Within one instant, users' arrivals go before their cancels (so a request cancelled at
# its own submit instant is never admitted).
_ARRIVE, _CANCEL = 0, 1


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
    # Users' actions are known in advance: one sorted list, read in order. The holders'
    # side (finish, busy, idle) is known only once a request is admitted: a heap, whose
    # entries are (time, push order, what, request id, generation): unique by the first
    # two, so comparisons stay cheap.
    users = [(r.submit, _ARRIVE, i, r.id) for i, r in enumerate(scenario.requests)]
    users += [
        (r.cancel, _CANCEL, i, r.id)
        for i, r in enumerate(scenario.requests)
        if r.cancel is not None
    ]
    users.sort()
    users.append((math.inf, _ARRIVE, 0, ""))
    u = 0
    heap: list[tuple[float, int, int, str, int]] = []
    seq = 0
    push = heapq.heappush
    pop = heapq.heappop
    get = core.get

    out: list[Decision] = []
    now = 0.0

    def follow(decisions: list[Decision], t: float) -> None:
        """Record decisions and play the holders' side of admissions."""
        nonlocal seq
        out.extend(decisions)
        for d in decisions:
            event = d.event
            if event == "preempt" and d.id is not None:
                lives[d.id].generation += 1  # its finish belonged to the run that ended
                continue
            if (event != "admit" and event != "resume") or d.id is None:
                continue
            rid = d.id
            life = lives[rid]
            spec = life.spec
            if spec.kind == "job":
                life.generation += 1
                seq += 1
                push(heap, (t + spec.duration, seq, _FINISH, rid, life.generation))
                continue
            if life.anchor is None:
                life.anchor = t
                seq += 1
                push(heap, (t + spec.duration, seq, _FINISH, rid, 0))
                for s, e in spec.busy or ():
                    if s > 0:
                        seq += 1
                        push(heap, (t + s, seq, _BUSY, rid, 0))
                    seq += 1
                    push(heap, (t + e, seq, _IDLE, rid, 0))
            if get(rid) is not None:  # not preempted in the same pass
                out.extend(core.activity(rid, _busy_at(spec, t - life.anchor), t))

    while True:
        t_next = users[u][0]
        if heap and heap[0][0] < t_next:
            t_next = heap[0][0]
        deadline = core.next_deadline()
        if deadline is not None and deadline < t_next:
            t_next = deadline
        if t_next == math.inf or t_next > limit:
            break
        now = t_next
        decisions: list[Decision] = []
        while heap and heap[0][0] == now:
            _, _, what, rid, gen = pop(heap)
            if get(rid) is None:
                continue
            if what == _FINISH:
                if gen == lives[rid].generation:
                    decisions += core.finish(rid, now)
            else:
                decisions += core.activity(rid, what == _BUSY, now)
        while users[u][0] == now and users[u][1] == _ARRIVE:
            spec = lives[users[u][3]].spec
            u += 1
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
        while users[u][0] == now:
            rid = users[u][3]
            u += 1
            if get(rid) is not None:
                decisions += core.cancel(rid, now)
        if decisions:
            follow(decisions, now)
        follow(core.step(now), now)
    end = limit if stop is not None else now
    return SimRun(out, end, core)
