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

import math
from dataclasses import dataclass, field
from typing import Final

from ..admission.core import AdmissionCore
from ..admission.heap import heappop, heappush
from ..admission.model import Decision, Request, State
from .backtest import Backtest
from .report import Tally
from .scenario import Scenario, ScenarioRequest

# What a holder does, in the driver's event heap. (Final: compiled, a plain module
# constant is a dict lookup at each use.)
_FINISH: Final = 0
_IDLE: Final = 1
_BUSY: Final = 2
# Within one instant, users' arrivals go before their cancels (so a request cancelled at
# its own submit instant is never admitted).
_ARRIVE: Final = 0
_CANCEL: Final = 1


@dataclass
class SimRun:
    decisions: list[Decision]
    end: float
    core: AdmissionCore = field(repr=False)
    # Idle spells left unsaid, each with the busy event that ended it (`_Replay.run`).
    quiet_spells: int = 0


class _Life:
    """What the driver knows of one request while it plays it (a plain class: compiled,
    a dataclass's __init__ would run interpreted, once per request)."""

    def __init__(self, spec: ScenarioRequest) -> None:
        self.spec = spec
        # The two fields the holders' events read, kept here: the replay loop then never
        # reaches the spec, another object (interpreted, `life.spec.id` was 1.3% of a
        # month, mostly waiting on memory).
        self.rid = spec.id
        self.busy = spec.busy
        # First admission: busy intervals count from here; -1 until then (a float, not an
        # optional one: compiled, it is kept unboxed in the object, no float to chase).
        self.anchor = -1.0
        # Bumps when a job restarts, so its old finish is ignored.
        self.generation = 0
        # While a short idle spell is left unsaid (`_Replay.run`), the time its holder is
        # busy again; -1 otherwise.
        self.quiet_until = -1.0


def _busy_at(spec: ScenarioRequest, offset: float) -> bool:
    busy = spec.busy
    if busy is None:
        return True
    # Intervals are sorted and disjoint (the parser checks): the first that ends after
    # `offset` decides, without a generator (interpreted, 1 M of them cost ~3% of a month).
    for s, e in busy:
        if offset < e:
            return s <= offset
    return False


# A holder's event, filed under its time: (push order, what, its request's life, n);
# `n` is a job's generation for a finish, the interval's index for busy and idle.
_Due = tuple[int, int, _Life, int]


class _Replay:
    """One replay's state: the core, the requests' lives, the holders' pending events,
    the decisions so far. A class, not a closure: compiled, a closure's variables live in
    an environment object, looked up at each use.

    The holders' events are filed by time (`due`), with a heap of the distinct times
    (`times`); an instant's events go in push order, the least first. A heap of plain
    floats compares one float a step, where one of (time, order, ...) tuples compared
    them element by element and allocated a tuple per push: its pops were 6% of a
    compiled month. A month's instants nearly all have one event; a batch trace's may
    have thousands, sorted once.

    A request's busy intervals are numbered in push order at its first admission, but
    pushed one at a time, each when the one before pops (busy k, then idle k, then busy
    k+1): the same events in the same order as pushing them all at once (intervals are
    sorted and disjoint: the parser checks, so only the first can start at 0), with a
    heap a fifth the size (a month's held 10,000 entries, its pops ~3% of the replay).
    A request gone from the core pushes no more: the chain ends at its next event.

    An idle spell that ends before the core would warn or cull its holder
    (`AdmissionCore.idle_deadline`) is left unsaid, with the busy event that ends it, when
    the request is admitted or queued as it starts: told, it would only arm a cull timer
    that the end clears, or set `busy` on a queued request and set it back, and no
    decision reads either in between (a request admitted inside the spell is told it is
    busy, `_Life.quiet_until`; told it is idle, it would arm a cull the spell's end clears).
    Parked and culled requests hear of every spell: their idleness decides whether they
    want devices back. A month's 1.21 M activity events become 0.40 M (compiled, 7% of
    the whole month; tests/test_quiet_spells.py checks the decisions are the same).
    """

    def __init__(
        self,
        scenario: Scenario,
        exhaustive: bool = False,
        tally: Tally | None = None,
        every_spell: bool = False,
        backtest: Backtest | None = None,
    ) -> None:
        self.core = AdmissionCore(scenario.config)
        # `simulate --estimates`: what a gateway would have estimated at each submit.
        self.backtest = backtest
        self.exhaustive = exhaustive
        self.quiet = not every_spell
        self.tally = tally
        self.lives = {r.id: _Life(r) for r in scenario.requests}
        self.times: list[float] = []
        self.due: dict[float, list[_Due]] = {}
        self.seq = 0
        self.out: list[Decision] = []
        self.quiet_spells = 0

    def follow(self, decisions: list[Decision], t: float) -> bool:
        """Record decisions and play the holders' side of admissions (`decisions` is not
        empty: a call per instant that decided nothing cost ~2% of a month); whether the
        core was told anything (`run` steps it again only then)."""
        self.record(decisions)
        said = False
        for d in decisions:
            event = d.event
            if event != "admit" and event != "resume":
                if event == "preempt":
                    rid = d.id
                    if rid is not None:  # its finish belonged to the run that ended
                        self.lives[rid].generation += 1
                continue
            rid = d.id
            if rid is None:
                continue
            life = self.lives[rid]
            spec = life.spec
            if spec.kind == "job":
                life.generation += 1
                self.seq += 1
                self.push(t + spec.duration, (self.seq, _FINISH, life, life.generation))
                continue
            anchor = life.anchor
            if anchor < 0:
                anchor = life.anchor = t
                seq = self.seq + 1
                self.push(t + spec.duration, (seq, _FINISH, life, 0))
                busy = spec.busy
                if busy:
                    # The first interval's event now, the numbers of all of them taken.
                    start, end = busy[0]
                    if start > 0:
                        self.push(t + start, (seq + 1, _BUSY, life, 0))
                    else:  # busy from the admission on: no busy event
                        self.push(t + end, (seq + 1, _IDLE, life, 0))
                        seq -= 1
                    seq += 2 * len(busy)
                self.seq = seq
            core = self.core
            req = core.get(rid)
            if req is not None:  # not preempted in the same pass
                # Inside an unsaid idle spell it is busy, as far as the core was told.
                now_busy = t < life.quiet_until or _busy_at(spec, t - anchor)
                if self.quiet and req.busy == now_busy and req.state is State.ADMITTED:
                    # Bound as busy (or idle) as the core already holds it: binding armed
                    # its cull by `Request.busy`, and saying so again would change nothing
                    # (135,000 of a month's 160,000 admissions and resumes of holders).
                    continue
                answer = core.activity(rid, now_busy, t)
                said = True
                if answer:
                    self.record(answer)
        return said

    def push(self, t: float, event: _Due) -> None:
        """File a holder's event at time `t`."""
        at = self.due.get(t)
        if at is None:
            self.due[t] = [event]
            heappush(self.times, t)
        else:
            at.append(event)

    def record(self, decisions: list[Decision]) -> None:
        """Kept in `out`, or handed to the tally, which keeps what the report needs."""
        if self.backtest is not None and decisions:
            self.backtest.observe(decisions)
        tally = self.tally
        if tally is None:
            self.out.extend(decisions)
        elif decisions:
            tally.add(decisions)

    def run(
        self, users: list[float], arrives: list[bool], specs: list[ScenarioRequest], limit: float
    ) -> float:
        """Play until no event is left or the clock passes `limit`; the last instant at
        which something happened. An event of a holder whose request is gone does not
        count: where a holder's chain of events ends after its request left is the
        driver's bookkeeping (and with idle spells unsaid it ends later), not the
        scenario's."""
        # The loop's attributes in locals (interpreted, each use of self.x is a lookup;
        # `due` and `times` are mutated in place, never rebound).
        core = self.core
        times = self.times
        due_at = self.due
        quiet = self.quiet
        exhaustive = self.exhaustive
        inf = math.inf
        u = 0
        now = last = 0.0
        # Whether the core has been told anything since its last step. An instant that
        # told it nothing (its events were quiet spells or gone holders' alone) and has
        # no deadline due is not stepped: the step would find no deadline due and no
        # queue changed (a step leaves none marked: checked after every step of every
        # scenario, the months and the Kueue traces), so it would decide and change
        # nothing. A month steps 493,000 of its 765,000 instants; `every_spell` steps
        # all, the reference tests/test_quiet_spells.py checks this against.
        told = False
        every_step = exhaustive or not quiet
        # The core's next deadline, asked again only once it has been stepped: an instant
        # that told it nothing changed none of its timers (a month asks 493,000 times,
        # not once per instant, 765,000).
        deadline = core.next_deadline()
        while True:
            due = times[0] if times else inf
            user = users[u]
            t_next = due if due < user else user
            if deadline is not None and deadline < t_next:
                t_next = deadline
            if t_next == inf or t_next > limit:
                return last
            now = t_next
            acted = deadline == now or user == now
            decisions: list[Decision] = []
            if due == now:
                # The instant's events, the least push order first: sorted down, taken
                # from the end. An event pushed for this same instant while they play is
                # appended, and the list sorted again (a trace's whole batch can share
                # an instant: Kueue's large shape finishes thousands at once).
                at = due_at[now]
                ordered = 1
                while at:
                    if len(at) > ordered:
                        at.sort(reverse=True)  # (push orders are unique: no tie to compare)
                    seq, what, life, n = at.pop()
                    ordered = len(at)
                    rid = life.rid
                    req = core.get(rid)
                    if req is None:
                        # Gone (finished, cancelled, preempted): its holder's events end
                        # here. Ids are never reused, so nothing it would still do matters.
                        continue
                    acted = True
                    if what == _FINISH:
                        if n == life.generation:
                            decisions += core.finish(rid, now)
                            told = True
                    else:
                        # Push the interval's next event, numbered next, then act on this.
                        busy = life.busy
                        anchor = life.anchor
                        assert busy is not None
                        if what == _BUSY:
                            self.push(anchor + busy[n][1], (seq + 1, _IDLE, life, n))
                        elif n + 1 < len(busy):
                            back = anchor + busy[n + 1][0]
                            if (
                                quiet
                                and (req.state is State.ADMITTED or req.state is State.QUEUED)
                                and back < core.idle_deadline(rid, now)
                            ):
                                # Busy again before the core would warn or cull: the spell
                                # changes no decision, so neither it nor its end is said
                                # (a month has 403,000 such spells). Its next idle event
                                # keeps the order number it would have had.
                                life.quiet_until = back
                                self.quiet_spells += 1
                                self.push(anchor + busy[n + 1][1], (seq + 2, _IDLE, life, n + 1))
                                continue
                            self.push(back, (seq + 1, _BUSY, life, n + 1))
                        idle = req.idle_since
                        if (
                            what == _BUSY
                            and self.backtest is not None
                            and idle is not None
                            and req.state is State.ADMITTED
                        ):  # an idle spell heard to end before the cull, as a gateway does
                            self.backtest.busy_again(rid, now - idle, now)
                        decisions += core.activity(rid, what == _BUSY, now)
                        told = True
                del due_at[now]
                heappop(times)
            arrived: list[str] = []
            if user == now:  # (most instants are a holder's or a deadline's alone)
                told = True
                while users[u] == now and arrives[u]:
                    spec = specs[u]
                    u += 1
                    if self.backtest is not None:
                        arrived.append(spec.id)
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
                while users[u] == now:
                    rid = specs[u].id
                    u += 1
                    if core.get(rid) is not None:
                        decisions += core.cancel(rid, now)
            if decisions:
                self.follow(decisions, now)
            if exhaustive:
                core.look_at_everyone()
            if told or deadline == now or every_step:
                told = False
                decisions = core.step(now)
                if decisions:
                    told = self.follow(decisions, now)
                deadline = core.next_deadline()
            if arrived and self.backtest is not None:
                self.backtest.at_submit(core, now, arrived)
            if acted:
                last = now


def run_scenario(
    scenario: Scenario,
    until: float | None = None,
    *,
    exhaustive: bool = False,
    tally: Tally | None = None,
    every_spell: bool = False,
    backtest: Backtest | None = None,
) -> SimRun:
    """Replay `scenario` until `until` (default: its own `until`, else until no event is
    left). `exhaustive`: every tenant is nominated at every instant, as if no head ever
    slept (`AdmissionCore.look_at_everyone`): slow, the reference the core's wake-ups are
    checked against (tests/test_wakes.py). With a `tally`, the decisions go to it as they
    are made and are not kept (`SimRun.decisions` is empty): `simulate` reports so.
    `every_spell`: the core hears of every idle spell, even one too short to matter, and
    is stepped at every instant, even one that told it nothing (see `_Replay.run`): the
    reference that leaving them unsaid is checked against (tests/test_quiet_spells.py).
    `backtest`: estimates each request's wait at submit (sim/backtest.py) on copies of
    the core; the decisions are the same with or without it."""
    stop = until if until is not None else scenario.until
    limit = math.inf if stop is None else float(stop)
    # Users' actions are known in advance: sorted once by (time, arrival before cancel,
    # request order), then read in order from parallel lists (compiled, a list of tuples
    # would be unboxed whole at each look), each ending in a time that never comes.
    requests = scenario.requests
    actions = [(r.submit, _ARRIVE, i) for i, r in enumerate(requests)]
    actions += [(r.cancel, _CANCEL, i) for i, r in enumerate(requests) if r.cancel is not None]
    actions.sort()
    users = [a[0] for a in actions] + [math.inf]
    arrives = [a[1] == _ARRIVE for a in actions] + [False]
    specs = [requests[a[2]] for a in actions]
    replay = _Replay(scenario, exhaustive, tally, every_spell, backtest)
    now = replay.run(users, arrives, specs, limit)
    end = limit if stop is not None else now
    return SimRun(replay.out, end, replay.core, replay.quiet_spells)
