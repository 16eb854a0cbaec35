"""The forward-run wait estimates of the queue as it stands, kept until the next decision.

`admission/estimate.py` runs a copy of the core forward and gives every queued request's
start at once, so one set of runs serves every view of every queued request (an API
answer, an SSE event, the admin page's list) until something changes. The arbiter drops
the set at each committed batch of decisions (`forget`; a set that was costly to make is
kept a while longer, `SHARE_INVERSE`), and a set older than `MAX_AGE` is made again
(busy holders age and idle ones go back to work without a decision); in between, a kept
estimate counts down with the time since it was made.

A set is made in steps (`admission/estimate.py` `estimate_steps`): the first `SLICE`
seconds at once, where the view asked for it (a short queue's set is done by then, and
the answer carries it), the rest in slices of the event loop, each followed by whatever
else waits for the loop (a submission's 201, the event streams, the health probe), so a
long queue's set never pauses the gateway for more than a slice. Until it is done, views
answer from the set before it (counting down), or "no estimate yet". Its `BUDGET` counts
only the slices' own time.

The runs submit the arrivals forecast from those of a day earlier, kept from each
submission (and read back from the store at a restart). Each request's first estimate
is kept until it starts, and the calibration
(admission/estimate.py `Calibration`) learns from how it turned out.

In Kueue mode the gateway's own core holds no requests: the runs start from a core made
from Kueue's state (admission/from_kueue.py), built only when a set is made (a kept set
needs none), as the first steps of that set, on the same clock and budget; the set is
dropped too when Kueue's order changes (the visibility API's positions).

The API object (`estimated_wait`): `seconds` (the middle run), `low`/`high` (the range of
the quarter and three-quarter runs), `basis` (how, or why there is none, in words) and
`confidence` ("high": only known times such as culls; "low": few past grants to go by).
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Generator
from typing import Any, TypeAlias

from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import (
    FORECAST,
    THIN_HISTORY,
    Calibration,
    Estimate,
    History,
    arrival,
    estimate_steps,
    forecast,
)
from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.words import eta_phrase, format_duration, join_names, plural

log = logging.getLogger("jupyter_gpuaas.gateway")

#: What a set of runs starts from: the core (the gateway's, deciding), or the steps that
#: make one as of a time, when a set is made (Kueue mode: kueue_engine.py
#: `KueueEngine.forward_core`).
Start: TypeAlias = AdmissionCore | Callable[[float], Generator[None, None, AdmissionCore]]


class _WorkClock:
    """Seconds spent in a set's slices (its budget's clock): time between slices, when
    the loop does other work, does not count against it."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.since: float | None = None  # perf_counter at the start of the slice running

    def __call__(self) -> float:
        since = self.since
        return self.spent if since is None else self.spent + time.perf_counter() - since


#: Seconds a set of estimates is kept without a decision.
MAX_AGE = 30.0
#: A set that took c seconds to make is kept at least SHARE_INVERSE x c after a decision
#: (the estimates take at most about 1/SHARE_INVERSE of the loop's time on a long queue;
#: a set of a few milliseconds is made again at the next view, as the queue stands).
SHARE_INVERSE = 10.0
#: Seconds from which a set counts as costly (below, it is always made afresh).
COSTLY = 0.05
#: The forward runs' budget per set: predicted ends, and how far ahead.
MAX_EVENTS = 5000
HORIZON = 7 * 86400.0
#: Seconds of the event loop one set may take, its three runs together (a third each),
#: counted over its slices. What has not started when it runs out has no estimate yet.
BUDGET = 0.3
#: Seconds of the event loop one slice of a set takes, at most (about: a step is
#: `STEP` events of a run): what a submission waits for it, at worst.
SLICE = 0.004


def kept_for(cost: float) -> float:
    """Seconds derived work of the event loop that took `cost` seconds is kept after a
    change before it is done again: none when it was cheap (under `COSTLY`: always as
    things stand now), else `SHARE_INVERSE` times its cost, so that redoing it after every
    change takes at most about 1/SHARE_INVERSE of the loop however long the queue grows;
    never longer than `MAX_AGE` (a stall that made one costly is no reason to keep it
    longer). The gateway's one pacing rule for what it derives from the queue: the
    forward-run estimates here, and in Kueue mode the positions asked of Kueue
    (kueue_engine.py)."""
    return 0.0 if cost < COSTLY else min(MAX_AGE, SHARE_INVERSE * cost)


class Estimates:
    """The kept set of estimates, and when it was made."""

    def __init__(self) -> None:
        self._made: float | None = None
        self._set: dict[str, Estimate] = {}
        self._stale = False  # a decision came since the set was made
        self._cost = 0.0  # seconds the last set took (perf_counter)
        self._made_at = 0.0  # when it was made (perf_counter)
        self.runs = 0  # sets made (for the benchmark and tests)
        # How past estimates turned out (the calibration learns from each start), and the
        # first estimate of each request still queued: (kind, uncalibrated, made at).
        self.calibration = Calibration()
        self._told: dict[str, tuple[str, float, float]] = {}
        # The requests submitted in the last forecast period, oldest first: what arrives
        # next is forecast from them (admission/estimate.py `forecast`).
        self.arrived: list[Request] = []
        # The set being made (its steps, its clock, the time it is as of), if one is;
        # `_forgotten`: a decision came while it was being made.
        self._making: tuple[Generator[None, None, dict[str, Estimate]], _WorkClock, float] | None
        self._making = None
        self._forgotten = False
        # The core the kept set was made from, when it was made for it (Kueue mode).
        self._made_from: AdmissionCore | None = None

    def submitted(self, req: Request) -> None:
        """`req` was submitted (committed): kept for the arrival forecast."""
        arrived = self.arrived
        arrived.append(req)
        old = req.submit_time - FORECAST[0] - FORECAST[1]
        if arrived[0].submit_time < old:
            del arrived[: bisect_left(arrived, old, key=_submitted)]

    def came_back(self, req: Request, t: float) -> None:
        """Culled `req`, its reservation gone, was queued again at `t` (its user is back):
        kept for the arrival forecast as an arrival at `t` (sim/backtest.py `came_back`)."""
        self.submitted(arrival(req, t))

    def started(self, rid: str, t: float) -> None:
        """`rid` was admitted at `t`: its first estimate, against what it waited."""
        told = self._told.pop(rid, None)
        if told is not None:
            self.calibration.add(told[0], told[1], t - told[2])

    def left(self, rid: str) -> None:
        """`rid` left the queue without starting: nothing to learn from."""
        self._told.pop(rid, None)

    def forget(self) -> None:
        """A decision was committed: the set no longer says how the queue stands."""
        self._stale = True
        if self._making is not None:
            self._forgotten = True  # the set being made is as of before it

    def _fresh_enough(self, rid: str, now: float) -> bool:
        """Whether the kept set answers for `rid` now. After a decision, a costly set is
        kept for a while, and a request submitted since has no estimate until it is made
        again (said as "no estimate yet": better than a loop that stalls on each one)."""
        made = self._made
        if made is None or now - made > MAX_AGE or now < made:
            return False
        if not self._stale:
            return rid in self._set
        # Cheap: made again as the queue now stands; costly: kept a while (`kept_for`).
        return time.perf_counter() - self._made_at < kept_for(self._cost)

    def of(self, rid: str, core: Start, history: History, now: float) -> Estimate | None:
        """The estimate of a queued `rid` as of `now` (None: not queued in the core).
        `core`: the core, or the steps that make one (`Start`), taken only when a set is
        made."""
        if self._making is None and not self._fresh_enough(rid, now):
            clock = _WorkClock()
            steps = self._steps(core, history, now, clock)
            self._making = (steps, clock, now)
            self._forgotten = False
            if not self._slice():  # not done in one slice: the rest between other work
                self._schedule()
        if self._made is None:
            return None  # the first set is being made
        made = self._made
        est = self._set.get(rid)
        if est is not None and est.raw is not None and rid not in self._told:
            source = core if isinstance(core, AdmissionCore) else self._made_from
            req = source.get(rid) if source is not None else None
            self._told[rid] = (req.kind if req else "", est.raw, made)
        if est is None or est.seconds is None:
            return est
        gone = now - made
        return Estimate(
            max(0.0, est.seconds - gone),
            None if est.low is None else max(0.0, est.low - gone),
            None if est.high is None else max(0.0, est.high - gone),
            est.samples,
            est.ends,
            est.why,
        )

    def _steps(
        self, start: Start, history: History, now: float, clock: _WorkClock
    ) -> Generator[None, None, dict[str, Estimate]]:
        """A set's steps: the core made first where it is made for the set (Kueue mode),
        then the runs (admission/estimate.py `estimate_steps`)."""
        core = start if isinstance(start, AdmissionCore) else (yield from start(now))
        tenants = core.config.tenants
        # The forecast arrivals the runs can place (Kueue mode: a LocalQueue the config
        # does not name is no tenant of the copy).
        arrivals = [r for r in forecast(self.arrived, now) if r.tenant in tenants]
        estimates = yield from estimate_steps(
            core,
            now,
            history,
            horizon=HORIZON,
            max_events=MAX_EVENTS,
            calibration=self.calibration,
            arrivals=arrivals,
            clock=clock,
            budget=BUDGET,
        )
        self._made_from = None if core is start else core
        return estimates

    def _slice(self) -> bool:
        """Advance the set being made by one slice; True when it is done (and kept)."""
        making = self._making
        if making is None:
            return True
        steps, clock, now = making
        start = clock.since = time.perf_counter()
        try:
            next(steps)  # one step at least, however short the slice
            while time.perf_counter() - start < SLICE:
                next(steps)
            return False
        except StopIteration as done:
            self._set = done.value
            self._made = now
            self._made_at = time.perf_counter()
            self._making = None
            self._stale = self._forgotten  # a decision came while it was made
            self.runs += 1
            return True
        except Exception:  # a bug in the runs must not end the gateway's estimates
            log.exception("a set of wait estimates failed")
            self._making = None
            return True
        finally:
            clock.spent += time.perf_counter() - start
            clock.since = None
            self._cost = clock.spent

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a script, a test): made at once
            while not self._slice():
                pass
            return
        loop.call_soon(self._next_slice)

    def _next_slice(self) -> None:
        if not self._slice():
            asyncio.get_running_loop().call_soon(self._next_slice)


def _submitted(req: Request) -> float:
    return req.submit_time


def confidence(est: Estimate) -> str:
    ends = est.ends
    if ends.history == 0 and ends.aged == 0 and ends.back == 0:
        return "high"  # culls and declared durations only: known times
    if est.samples < THIN_HISTORY or ends.aged:
        return "low"
    return "medium"


def basis(est: Estimate, label: str) -> str:
    """How the estimate was made, or why there is none, in words."""
    if est.seconds is None:
        if est.why == "beyond":
            return (
                f"no estimate yet: it does not start within {format_duration(HORIZON)} "
                "of the queue as it stands"
            )
        return f"no estimate yet: none of the {label} in use has a known end"
    ends = est.ends
    parts = []
    if ends.culled:
        parts.append(f"{plural(ends.culled, 'idle grant')} culled by the idle policy")
    if ends.back:
        parts.append(
            f"{plural(ends.back, 'idle grant')} whose user is likely back within its reservation"
        )
    if ends.declared:
        parts.append(f"{plural(ends.declared, 'job')} ending after the time it asked for")
    if ends.history:
        past = plural(est.samples, "past grant")
        parts.append(f"{plural(ends.history, 'grant')} held about as long as {past} were")
    if ends.aged:
        parts.append(
            f"{plural(ends.aged, 'grant')} older than nearly all past ones, held as long again"
        )
    if ends.preempted:
        parts.append(f"{plural(ends.preempted, 'preemption')} the queue's policy makes")
    how = join_names(parts) or "the GPUs it needs are free for it now"
    return f"from running the queue forward: {how}"


def wait_json(est: Estimate | None, label: str) -> dict[str, Any]:
    """The API's `estimated_wait` of a queued request."""
    if est is None:
        return {"seconds": None, "low": None, "high": None, "basis": "no estimate yet"}
    out: dict[str, Any] = {
        "seconds": None if est.seconds is None else round(est.seconds),
        "low": None if est.low is None else round(est.low),
        "high": None if est.high is None else round(est.high),
        "basis": basis(est, label),
    }
    if est.seconds is not None:
        out["confidence"] = confidence(est)
    return out


def eta_of(wait: dict[str, Any]) -> str:
    """The estimate's part of the wait sentence (words.eta_phrase of `wait_json`)."""
    return eta_phrase(
        wait.get("seconds"),
        wait.get("low"),
        wait.get("high"),
        confidence=wait.get("confidence", ""),
    )


__all__ = [
    "HORIZON",
    "MAX_AGE",
    "Estimates",
    "Start",
    "basis",
    "confidence",
    "eta_of",
    "kept_for",
    "wait_json",
]
