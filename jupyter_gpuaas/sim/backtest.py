"""`simulate --estimates`: the wait estimate each request would have been shown at submit,
and how right it was.

While the scenario replays, the backtest keeps what a gateway would know at each moment:
the hold times of grants that ended so far (by kind and user, `History`), how long idle
spells lasted that ended before a cull (the replay tells the core every spell, as a
gateway hears each from heartbeats), and nothing of what is still to come. When
requests arrive and the instant's admission cycle leaves some of them queued, it asks
`estimate_waits` (the forward run of a copy of the core, admission/estimate.py) for
those, as the gateway would for the first view of them; a request admitted in its own
arrival cycle was shown no wait at all (its estimate is 0).

The accuracy is judged on the requests that waited at least `LONG_WAIT` (a short wait
needs no estimate, and a relative error of a tiny wait means nothing): the median of
|estimate - wait| / wait, the share whose wait fell inside the estimated range, and the
share that got an estimate at all.

`every`: estimate one arrival instant in `every` (the rest get null), so a long trace can
be backtested on a documented sample (a month of 100,000 requests, on a loaded machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..admission.core import AdmissionCore
from ..admission.estimate import Calibration, History, estimate_waits, forecast
from ..admission.model import Decision, Request
from ..words import plural
from .scenario import Scenario

#: Requests that waited at least this long are the ones the accuracy is judged on.
LONG_WAIT = 300.0
#: Events that end a hold of quota. A cull does not: the culled request is parked, its
#: quota kept for it, and most come back within the reservation (a hold is the whole
#: session, admission to the end of its reservation; admission/estimate.py `History`);
#: a cull without a reservation (`reservation_ttl: 0`) ends it. A preemption ends the
#: hold but is no sample of one (`Backtest.observe`).
_ENDS = frozenset(("finish", "cancel", "preempt", "expire"))


class Backtest:
    """The estimates at submit of one replay, and the history they were made from."""

    def __init__(self, scenario: Scenario, every: int = 1, offset: int = 0) -> None:
        self.who = {r.id: (r.kind, r.user) for r in scenario.requests}
        self.specs = {r.id: r for r in scenario.requests}
        self.preempted: set[str] = set()  # preempted, not yet queued again
        self.every = max(1, every)
        # Which instant of each `every` is estimated (0: the first): a second sample of
        # the same trace at other instants.
        self.offset = offset % self.every
        self.history = History()
        self.calibration = Calibration()
        # Estimated requests not started yet: (kind, uncalibrated estimate, estimated at).
        self.pending: dict[str, tuple[str, float, float]] = {}
        self.held_since: dict[str, float] = {}
        self.culls: dict[str, int] = {}  # culls of each session still held
        self.parked_at: dict[str, float] = {}  # when each parked reservation was culled
        self.eta: dict[str, tuple[float, float, float | None] | None] = {}
        # What arrived so far, in order: the forecast of what arrives next is what arrived
        # a day earlier (admission/estimate.py `forecast`).
        self.arrived: list[Request] = []
        self.instants = 0
        self.asked = 0  # forward-run sets made

    def observe(self, decisions: list[Decision]) -> None:
        """The decisions as they are made: admissions start holds, ends add history."""
        for d in decisions:
            rid = d.id
            if rid is None:
                continue
            event = d.event
            if event == "admit" or event == "resume":
                # A resume from a parked reservation goes on with the same hold.
                self.held_since.setdefault(rid, d.t)
                self._back(rid, d.t)
                told = self.pending.pop(rid, None)
                if told is not None:  # how the estimate turned out: the calibration learns
                    self.calibration.add(told[0], told[1], d.t - told[2])
            elif event == "cancel" or event == "reject":
                self.pending.pop(rid, None)
            if event == "preempt":
                self.preempted.add(rid)
            elif event == "requeue":
                if rid in self.preempted:  # a forward run preempts and requeues on its own
                    self.preempted.discard(rid)
                else:
                    self.came_back(rid, d.t)
            claimed_by = d.fields.get("claimed_by")
            if isinstance(claimed_by, str):
                # A new request of its user took the parked reservation over: the hold
                # goes on in it (`Request.held_since`; the gateway's `_account` alike).
                since = self.held_since.pop(rid, None)
                if since is not None:
                    self.held_since[claimed_by] = since
                    self.culls[claimed_by] = self.culls.pop(rid, 0)
                self._back(rid, d.t)  # and its user is back
                continue
            parked = event == "cull" and bool(d.fields.get("parked"))
            if event == "cull":
                self.culls[rid] = self.culls.get(rid, 0) + 1
                if parked:
                    self.parked_at[rid] = d.t
            elif event in _ENDS:
                self.parked_at.pop(rid, None)
            if event in _ENDS or (event == "cull" and not parked):
                since = self.held_since.pop(rid, None)
                culls = self.culls.pop(rid, 0)
                # A preempted run is not how long its holder would have held: the core
                # cut it short, and a forward run makes its own preemptions. A preempted
                # job runs again from the start and its complete run is the sample; in
                # the month a job was preempted 2.3 times, and with its cut runs (median
                # 4 min) counted the history's jobs held a median 265 s against the
                # 3,765 s they ran, so the runs freed the quota of jobs within minutes.
                if since is not None and event != "preempt":
                    kind, user = self.who.get(rid, ("", ""))
                    # A session that ends at its reservation's expiry (or at a cull
                    # without one): its user did not come back after its last cull.
                    gave_up = event == "expire" or event == "cull"
                    self.history.add(kind, user, d.t - since, culls, gave_up, at=d.t)

    def _back(self, rid: str, t: float) -> None:
        """`rid`'s parked reservation (if any) is taken back at `t`: how long after its
        cull its user came back goes into the history."""
        culled = self.parked_at.pop(rid, None)
        if culled is not None:
            self.history.came_back(self.who.get(rid, ("", ""))[0], t - culled, t)

    def busy_again(self, rid: str, seconds: float, t: float) -> None:
        """A holder idle for `seconds` is busy again at `t`, before its cull (the driver
        says so for the spells the core hears: every one with `every_spell`)."""
        self.history.busy_again(self.who.get(rid, ("", ""))[0], seconds, t)

    def came_back(self, rid: str, t: float) -> None:
        """A culled request whose reservation had gone is queued again at `t`: its user
        is back. To the queue it is an arrival like a submission, and the forecast counts
        it so (in the month a third of the kernels and servers that enter the queue are
        these); a forward run's copy never brings a culled request back itself."""
        spec = self.specs.get(rid)
        if spec is not None:
            self.arrived.append(Request(rid, spec.tenant, spec.user, spec.kind, spec.gpus, t,
                                        flavor=spec.flavor, priority=spec.priority))  # fmt: skip

    def at_submit(self, core: AdmissionCore, now: float, arrived: list[str]) -> None:
        """After the cycle of an instant at which `arrived` were submitted."""
        self.instants += 1
        for rid in arrived:
            req = core.get(rid)
            if req is not None:
                self.arrived.append(req)
        if (self.instants - 1 - self.offset) % self.every:
            return
        queued: list[str] = []
        for rid in arrived:
            req = core.get(rid)
            if req is None or req.state.value != "queued":
                if req is not None and req.first_admit == now:
                    self.eta[rid] = (0.0, 0.0, 0.0)
                continue
            queued.append(rid)
        if not queued:
            return
        self.asked += 1
        made = estimate_waits(
            core,
            now,
            self.history,
            only=queued,
            calibration=self.calibration,
            arrivals=forecast(self.arrived, now),
        )
        for rid, est in made.items():
            if est.seconds is None or est.low is None or est.raw is None:
                self.eta[rid] = None
            else:
                self.eta[rid] = (est.seconds, est.low, est.high)
                self.pending[rid] = (self.who.get(rid, ("", ""))[0], est.raw, now)

    def apply(self, result: dict[str, Any]) -> None:
        """Each request's `eta_at_submit` in `result`, and the accuracy in its summary."""
        requests: Mapping[str, dict[str, Any]] = result["requests"]
        errors: list[float] = []
        inside = predicted = long = 0
        for rid, r in requests.items():
            if rid not in self.eta:
                r["eta_at_submit"] = None
                sampled = False
            else:
                eta = self.eta[rid]
                sampled = True
                r["eta_at_submit"] = (
                    None
                    if eta is None
                    else {"seconds": _round(eta[0]), "low": _round(eta[1]), "high": _opt(eta[2])}
                )
            wait = r.get("wait")
            if not sampled or r.get("admitted_at") is None or not isinstance(wait, float):
                continue
            if wait < LONG_WAIT:
                continue
            long += 1
            eta = self.eta[rid]
            if eta is None:
                continue
            predicted += 1
            errors.append(abs(eta[0] - wait) / wait)
            high = eta[2]
            if eta[1] <= wait and (high is None or wait <= high):
                inside += 1
        errors.sort()
        median = errors[(len(errors) - 1) // 2] if errors else None
        result["summary"]["estimates"] = {
            "judged": long,
            "predicted": predicted,
            "predicted_share": _share(predicted, long),
            "median_relative_error": None if median is None else round(median, 4),
            "inside_range_share": _share(inside, predicted),
            "every": self.every,
            "forward_runs": self.asked,
        }


def _round(x: float) -> float:
    return round(x, 1)


def _opt(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def format_estimates(summary: Mapping[str, Any]) -> str:
    """The report's line on the backtest ('' without one)."""
    est = summary.get("estimates")
    if not est:
        return ""
    sample = f", one arrival instant in {est['every']}" if est["every"] > 1 else ""
    if not est["judged"]:
        return f"estimates    no request waited 5 min or more{sample}\n"
    err = est["median_relative_error"]
    inside = est["inside_range_share"]
    return (
        f"estimates    {plural(est['judged'], 'request')} waited 5 min or more{sample}: "
        f"{est['predicted_share'] * 100:.0f}% had an estimate at submit, "
        f"median error {'n/a' if err is None else f'{err * 100:.0f}%'}, "
        f"{'n/a' if inside is None else f'{inside * 100:.0f}%'} started inside its range\n"
    )


__all__ = ["LONG_WAIT", "Backtest", "format_estimates"]
