"""Wait estimates by running the core forward: when would each queued request start?

The estimate of a queued request is not a guess from counts: a copy of the core, rebuilt
from the live requests as a restart rebuilds it (`AdmissionCore.restore`), is run forward
on a virtual clock with predicted ends of what holds GPUs now and of what it admits on the
way, until every queued request is admitted or the run's budget is spent. It is the same
core, so the answer respects quotas, borrowing, preemption, fair sharing and the idle
policy exactly as the real queue will, as long as the predictions hold. Nothing new
arrives in the run: future submissions are unknown (a parked reservation waiting to
resume is already in the queue, and is served in its turn).

What ends a grant in the run:
- an idle kernel or server: the core's own cull timer (the idle policy: a known time) and
  its reservation's expiry, unless it is expected busy again before the cull (as past
  idle spells of its kind as long so far were, `History.busy_before_cull`: a gateway
  hears every spell from heartbeats, and most end within minutes) or its user back
  within the reservation (as the users of past culls of its kind were,
  `History.comes_back`: most are, within minutes); then it is held for its session, as
  below. A parked reservation likewise expires at its known time or, expected back (as
  often as past users still away after as long came back: fewer, the longer it has
  waited), resumes and is held for its session;
- a job with a declared duration: that duration after its admission;
- anything else: how long past grants were held (`History`), of the same user and kind
  when there are enough of them, else of the kind, else of any kind, given that it has
  already been held as long as it has (past grants held longer than its age). A grant
  older than nearly every past one (and at least `MIN_AGE`) is expected to last about
  as long again (a heavy tail: half of what has lasted t lasts 2t), said so in the
  basis; a younger one with nothing to go by has no known end.

Three runs give the range and the middle estimate of every queued request at once, so
one set of runs per queue state serves every request (the gateway keeps them until its
next decision). In the middle run the grants' hold times are spread over all quantiles
(each grant its own, from a hash of its id: a typical future, in which the first of many
grants ends early), in the low and high runs over the lower and the upper half
(`_Run.quantile`); a grant alone ends at the run's quantile (0.25, 0.5, 0.75).

The budget: at most `max_events` ends per run, nothing beyond `horizon` seconds, and,
when the driver passes its `clock`, at most `budget` seconds of that clock for the three
runs together (a third each): a request not started by then has no estimate, and says so.
The gateway runs them on its event loop, so a long queue must cost it a bounded pause,
never seconds: `estimate_steps` is the same computation in steps (a generator that
yields every `STEP` events of a run and every `STEP` requests of a copy), which the
gateway advances a few milliseconds at a time between its other work, on a copy taken
at the start (`Snapshot`: the live core may change between steps). Pure: no clock of
its own, no I/O; the driver passes the time, the core, the history and (optionally) a
clock to read in.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import TypeVar

from .core import AdmissionCore
from .heap import heappop, heappush
from .model import Config, Decision, Flavor, Request, State

_T = TypeVar("_T")

#: Past grants it takes to trust a distribution of hold times (fewer: the next wider one).
MIN_SAMPLES = 5
#: The history's window: sessions that ended within a day of the latest (every hour of
#: the day counted once: the sessions that end in a morning are mostly short ones, those
#: that end in an evening long ones), at most KEEP of each key (memory).
WINDOW = 86400.0
KEEP = 20000
#: Below this many samples behind an estimate, its confidence is said to be low.
THIN_HISTORY = 20
#: The quantiles of hold times of the low, middle and high runs (calibrated by
#: `simulate --estimates` on the month trace; benchmarks/RESULTS.md).
QUANTILES = (0.25, 0.5, 0.75)
#: Events of a run (or requests restored into a copy) between two steps of
#: `estimate_steps`, and between two readings of the driver's clock.
STEP = 32
#: A grant younger than this, with no past grants to go by, has no known end: its age
#: says nothing yet (a job that started a minute ago may run a minute or a day).
MIN_AGE = 600.0
#: The arrival forecast: (period, look-ahead) in seconds: what arrives in the next 6 h is
#: what arrived a day earlier (seasonal naive; the driver keeps what arrived).
FORECAST = (86400.0, 6 * 3600.0)
#: Outcomes a kind's calibration needs, and the quantiles of its ratios that make the
#: range; estimates shorter than MIN_ESTIMATE are not scaled (nor learnt from). The range
#: holds the start about two times in three (65%): at 60%, what the month's target asks
#: at least, drift between past and next outcomes left it at 59.5-69% of the month's
#: samples (benchmarks/RESULTS.md).
MIN_OUTCOMES = 20
RANGE = (0.175, 0.825)
MIN_ESTIMATE = 60.0
#: The bounds in seconds of the calibration's bands of estimates (under 30 min, to 3 h,
#: longer), each with its own ratios once it has MIN_OUTCOMES of them.
BANDS = (1800.0, 3 * 3600.0)


class History:
    """Past hold times in seconds, by (kind, user), by kind and overall, the most recent
    `keep` of each, sorted (a quantile of those longer than an age is a bisection).

    A hold is how long a request kept its quota: from its admission to its finish,
    cancel or the end of its parked reservation (`Request.held_since`: a new request of
    its user that takes the reservation over goes on with the hold; one queued again
    after its reservation went holds anew, and a grant's age in the runs is counted
    alike, `hold_start`). A preempted run is none (the core cut it short, and a forward
    run makes its own preemptions; a preempted job runs again from the start, and its
    complete run is the sample). A cull that parks it does
    not end it: most culled notebooks come back within their reservation (in the month
    trace a server is culled twice a session on average, and back within a median 8 min),
    and their quota stays theirs meanwhile; counted from cull to cull, the holds were a
    fraction of the sessions, and a forward run freed quota hours early (the jobs it
    started at once waited until the evening)."""

    def __init__(self, keep: int = KEEP, window: float = WINDOW) -> None:
        self.keep = keep
        self.window = window
        # Per key, (ended at, seconds) oldest first, and the seconds sorted.
        self._recent: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._sorted: dict[tuple[str, str], list[float]] = {}
        # The seconds of those not ended by a cull's expiry (their user stayed), sorted.
        self._stayed: dict[tuple[str, str], list[float]] = {}
        # Culls of the recent sessions of each kind ("": all): (ended at, culls, the last
        # one not followed by a return), and their sums.
        self._culls: dict[str, deque[tuple[float, int, int]]] = {}
        self._cull_sums: dict[str, list[int]] = {}
        # How long after its cull each recent user came back within the reservation, by
        # kind ("": all): (came back at, seconds) oldest first, and the seconds sorted.
        self._returns: dict[str, deque[tuple[float, float]]] = {}
        self._return_delays: dict[str, list[float]] = {}
        # How long each recent idle spell lasted that ended with its holder busy again
        # before the cull, by kind ("": all), kept alike.
        self._spells: dict[str, deque[tuple[float, float]]] = {}
        self._spell_lengths: dict[str, list[float]] = {}
        self._last = -math.inf  # the latest end added

    def add(
        self,
        kind: str,
        user: str,
        seconds: float,
        culls: int = 0,
        gave_up: bool = False,
        at: float | None = None,
    ) -> None:
        """A session of `kind` held `seconds`, ended `at` (None: now, as far as the
        window goes); culled `culls` times, the last of which ended it (`gave_up`: its
        user did not come back within the reservation) or not. Kept while it ended
        within `window` of the latest end added, the most recent `keep` of each key."""
        if at is None:
            at = self._last
        self._last = now = max(self._last, at)
        oldest = now - self.window
        for of in (kind, ""):
            recent_culls = self._culls.get(of)
            sums = self._cull_sums.get(of)
            if recent_culls is None or sums is None:
                recent_culls = self._culls[of] = deque()
                sums = self._cull_sums[of] = [0, 0]
            entry = (at, culls, int(gave_up and culls > 0))
            recent_culls.append(entry)
            sums[0] += entry[1]
            sums[1] += entry[2]
            while len(recent_culls) > self.keep or recent_culls[0][0] < oldest:
                _, old_culls, old_gave_up = recent_culls.popleft()
                sums[0] -= old_culls
                sums[1] -= old_gave_up
        seconds = max(0.0, seconds)
        kept = not (gave_up and culls > 0)  # ended by its user, not by a cull's expiry
        for key in ((kind, user), (kind, ""), ("", "")):
            recent = self._recent.get(key)
            ordered = self._sorted.get(key)
            stayed = self._stayed.get(key)
            if recent is None or ordered is None or stayed is None:
                recent = self._recent[key] = deque()
                ordered = self._sorted[key] = []
                stayed = self._stayed[key] = []
            recent.append((at, seconds if kept else -seconds - 1.0))
            insort(ordered, seconds)
            if kept:
                insort(stayed, seconds)
            while len(recent) > self.keep or recent[0][0] < oldest:
                old = recent.popleft()[1]
                if old >= 0.0:
                    del stayed[bisect_right(stayed, old) - 1]
                else:
                    old = -old - 1.0
                del ordered[bisect_right(ordered, old) - 1]

    def __len__(self) -> int:
        return len(self._sorted.get(("", ""), ()))

    def came_back(self, kind: str, seconds: float, at: float | None = None) -> None:
        """A user of `kind` came back `seconds` after the cull of their grant, within its
        reservation, at `at` (None: now, as far as the window goes)."""
        self._keep(self._returns, self._return_delays, kind, seconds, at)

    def busy_again(self, kind: str, seconds: float, at: float | None = None) -> None:
        """A holder of `kind` idle for `seconds` was busy again before its cull, at `at`
        (None: now, as far as the window goes): a gateway hears it from heartbeats."""
        self._keep(self._spells, self._spell_lengths, kind, seconds, at)

    def _keep(
        self,
        recent_of: dict[str, deque[tuple[float, float]]],
        sorted_of: dict[str, list[float]],
        kind: str,
        seconds: float,
        at: float | None,
    ) -> None:
        """Keep `seconds` of `kind` (and of every kind, ""), ended `at`, in `recent_of`
        (oldest first) and `sorted_of`, within the window and `keep` of each."""
        if at is None:
            at = self._last
        self._last = now = max(self._last, at)
        oldest = now - self.window
        seconds = max(0.0, seconds)
        for of in (kind, ""):
            recent = recent_of.get(of)
            ordered = sorted_of.get(of)
            if recent is None or ordered is None:
                recent = recent_of[of] = deque()
                ordered = sorted_of[of] = []
            recent.append((at, seconds))
            insort(ordered, seconds)
            while len(recent) > self.keep or recent[0][0] < oldest:
                old = recent.popleft()[1]
                del ordered[bisect_right(ordered, old) - 1]

    def busy_before_cull(self, kind: str, idle_for: float) -> float:
        """The share of holders of `kind` idle for `idle_for` seconds so far that are busy
        again before their cull: of the recent idle spells longer than that, those that
        ended with the holder busy, against the culls (the spells that lasted until the
        idle timeout). 0.0 when too few are known (`MIN_SAMPLES`), or none of the spells
        that ended early were heard (a replay that tells the core only of the idle spells
        that end in a cull: then an idle holder is one about to be culled)."""
        for key in (kind, ""):
            sums = self._cull_sums.get(key)
            lengths = self._spell_lengths.get(key, [])
            culls = sums[0] if sums is not None else 0
            longer = len(lengths) - bisect_right(lengths, idle_for)
            if longer + culls >= MIN_SAMPLES:
                return longer / (longer + culls)
        return 0.0

    def holds(self, kind: str, user: str = "") -> list[float]:
        """The recent holds of `kind` (of `user`; "": anyone's), sorted (seconds)."""
        return list(self._sorted.get((kind, user), ()))

    def culls(self, kind: str) -> tuple[int, int]:
        """(culls, culls after which the user did not come back) of the recent holds of
        `kind`: what `comes_back` goes by."""
        sums = self._cull_sums.get(kind, [0, 0])
        return sums[0], sums[1]

    def idle_spells(self, kind: str) -> list[float]:
        """How long the recent idle spells of `kind` that ended before a cull lasted,
        sorted (seconds)."""
        return list(self._spell_lengths.get(kind, ()))

    def returns(self, kind: str) -> list[float]:
        """How long after a cull the recent users of `kind` came back, sorted (seconds)."""
        return list(self._return_delays.get(kind, ()))

    def comes_back(self, kind: str, parked_for: float = 0.0) -> float | None:
        """The share of culls of `kind` after which the user came back within the
        reservation (of every kind's when the kind has fewer than `MIN_SAMPLES` culls);
        None when too few culls were seen.

        `parked_for`: the reservation has been waiting that long already, its user not
        back yet. Most come back within minutes of a cull or not at all (the month: 61%
        of culled kernels came back, half of those within 6 min; of reservations parked
        10 min, 17% came back), so of those still waiting, fewer come back: the share of
        past returns later than `parked_for` (once `MIN_SAMPLES` returns are known)."""
        for key in (kind, ""):
            sums = self._cull_sums.get(key)
            if sums is not None and sums[0] >= MIN_SAMPLES:
                p = (sums[0] - sums[1]) / sums[0]
                delays = self._return_delays.get(key, [])
                if parked_for <= 0.0 or len(delays) < MIN_SAMPLES:
                    return p
                later = p * (len(delays) - bisect_right(delays, parked_for)) / len(delays)
                return later / (later + 1.0 - p) if later > 0.0 else 0.0
        return None

    def samples(self, kind: str, user: str) -> int:
        """How many past grants an estimate for (kind, user) rests on."""
        for key in ((kind, user), (kind, ""), ("", "")):
            n = len(self._sorted.get(key, ()))
            if n >= MIN_SAMPLES:
                return n
        return len(self)

    def remaining(
        self, kind: str, user: str, age: float, q: float, busy_for: float = 0.0
    ) -> tuple[float, bool] | None:
        """The `q` quantile of how much longer a grant held `age` seconds so far will be
        held, and whether it came from past grants (False: from its age alone, a grant
        older than nearly all past ones); None when nothing is known at all.

        `busy_for`: the grant is busy now, so a cull cannot end it sooner than that (the
        idle policy's timeout and the reservation after it): the past sessions that ended
        by a cull's expiry count as ending no sooner than `busy_for` from now; those
        whose user ended them, when they did."""
        for key in ((kind, user), (kind, ""), ("", "")):
            ordered = self._sorted.get(key)
            if ordered is None:
                continue
            i = bisect_right(ordered, age)
            longer = len(ordered) - i
            if longer >= MIN_SAMPLES:
                k = min(longer - 1, int(q * longer))
                left = ordered[i + k] - age
                if left < busy_for:
                    # Below `busy_for` only the sessions whose user ended them count (the
                    # others moved up to it): the k-th of those, if it comes first.
                    stayed = self._stayed.get(key, [])
                    j = bisect_right(stayed, age) + k
                    end = stayed[j] - age if j < len(stayed) else math.inf
                    left = min(end, busy_for)
                return left, True
        if age >= MIN_AGE:
            # Lasted `age` already and longer than (nearly) anything seen: a heavy tail,
            # P(T > t(1 + x) | T > t) = 1 / (1 + x), whose q quantile is x = q / (1 - q).
            return age * q / (1.0 - q), False
        return None


class Calibration:
    """How the forward run's estimates turned out, by kind and by how long they said:
    actual wait / estimated wait of the requests that started, the most recent `keep`;
    the range of an estimate is the `RANGE` quantiles of those ratios, taken so that it
    holds the next outcome that share of the time (`_range_ranks`; its middle is the
    run's own: `estimate_steps`).
    The forward run knows only the arrivals it forecasts, so a request that later
    arrivals overtake (a job behind higher-priority kernels, a tenant above its fair
    share) starts later than it says, by about as much as such requests did before, or
    sooner: the ratios of its kind and `BANDS` band (a short estimate and a long one of
    the same kind go wrong by different factors), else of its kind, else of every kind,
    whichever has `MIN_OUTCOMES`, make its range (without: the runs' own range)."""

    def __init__(self, keep: int = 400) -> None:
        self.keep = keep
        self._recent: dict[str, deque[float]] = {}
        self._sorted: dict[str, list[float]] = {}

    def add(self, kind: str, estimated: float, actual: float) -> None:
        """A request estimated to wait `estimated` seconds (uncalibrated) waited `actual`."""
        if estimated < MIN_ESTIMATE:
            return
        ratio = max(0.0, actual) / estimated
        for key in (_band(kind, estimated), kind, ""):
            recent = self._recent.get(key)
            ordered = self._sorted.get(key)
            if recent is None or ordered is None:
                recent = self._recent[key] = deque()
                ordered = self._sorted[key] = []
            recent.append(ratio)
            insort(ordered, ratio)
            if len(recent) > self.keep:
                old = recent.popleft()
                del ordered[bisect_right(ordered, old) - 1]

    def ratios(self, kind: str, estimated: float) -> tuple[float, float, float] | None:
        """The (low, middle, high) ratio of an estimate of `estimated` seconds for a
        request of `kind`: of its band, else of its kind, else of every kind; or None."""
        for key in (_band(kind, estimated), kind, ""):
            ordered = self._sorted.get(key)
            if ordered is not None and len(ordered) >= MIN_OUTCOMES:
                low, high = _range_ranks(len(ordered))
                return ordered[low], ordered[(len(ordered) - 1) // 2], ordered[high]
        return None


def _range_ranks(n: int) -> tuple[int, int]:
    """The positions (from 0) in `n` sorted ratios of the range's ends: the range covers
    the next outcome at least `RANGE[1] - RANGE[0]` of the time. Of n + 1 outcomes that
    come alike (the n past and the next), the next is equally likely to fall in any of
    the n + 1 gaps between the n past, so the range from the i-th to the j-th of them
    (from 1) holds it (j - i) / (n + 1) of the time: i = floor(lo (n + 1)) and
    j = ceil(hi (n + 1)). The plain quantiles (positions lo (n - 1) and hi (n - 1)) held
    it less than that: 12/21 = 57% of the time at 20 outcomes, where 60% was meant,
    and the month's share inside the range hovered just under or over its 60% target."""
    lo, hi = RANGE
    i = max(1, math.floor(lo * (n + 1)))
    j = min(n, math.ceil(hi * (n + 1)))
    return i - 1, j - 1


def _band(kind: str, estimated: float) -> str:
    """The calibration's key of an estimate: its kind and how long it says (`BANDS`)."""
    return f"{kind}/{bisect_right(BANDS, estimated)}"


class Ends:
    """What a forward run counted: the grants in use when it began whose end it predicted,
    by how (those it admits on its way are not counted), and the preemptions it made."""

    def __init__(self) -> None:
        self.history = 0  # held about as long as past grants
        self.declared = 0  # a job's declared duration
        self.aged = 0  # older than nearly all past grants: as long again
        self.culled = 0  # idle, culled by the idle policy
        self.back = 0  # idle or parked, its user expected back within the reservation
        self.preempted = 0


class Estimate:
    """The estimated wait of one queued request: seconds from now until it starts (the
    middle run) and the range (`low`, `high`; `high` alone None: beyond the budget); all
    None when there is none, and `why` then says why ("beyond": not started within the
    run's budget; "unknown": it waits on a grant whose end nothing predicts).
    `samples`: past grants behind it."""

    def __init__(
        self,
        seconds: float | None,
        low: float | None,
        high: float | None,
        samples: int,
        ends: Ends,
        why: str = "",
        raw: float | None = None,
    ) -> None:
        self.raw = seconds if raw is None else raw  # the middle run's, before calibration
        self.calibrated = False
        self.seconds = seconds
        self.low = low
        self.high = high
        self.samples = samples
        self.ends = ends
        self.why = why


class _Run:
    """One forward run of a copy of the core with the `q` quantile of every hold time."""

    def __init__(
        self,
        copy: AdmissionCore,
        now: float,
        history: History,
        q: float,
        declared: Mapping[str, float],
        arrivals: Sequence[Request] = (),
    ) -> None:
        self.now = now
        # Forecast arrivals, by submit time (copies: the core takes them over).
        self.arrivals = sorted((_clone(r) for r in arrivals if r.submit_time >= now), key=_at)
        self.next_arrival = 0
        self.history = history
        self.q = q
        self.declared = declared
        self.ends = Ends()
        self.started: dict[str, float] = {}
        self.stuck = False  # some grant's end is unknown: it never ends in this run
        self.copy = copy  # a rebuilt copy of the core (`Snapshot.rebuild`), this run's own
        # (time, order, request id, its admission time): predicted ends of grants.
        self.heap: list[tuple[float, int, str, float]] = []
        self.order = 0
        # Parked reservations expected back in this run: (when, request id), by time;
        # and the quantile of the session's remaining hold of those that come back.
        self.pokes: list[tuple[float, str]] = []
        self.next_poke = 0
        self.back_q: dict[str, float] = {}
        # Each grant's own quantile (`quantile`): those in use now spread evenly over the
        # run's span, in an order that has nothing to do with them (a hash of the id).
        width = min(q, 1.0 - q)
        self.span = (q - width, 2.0 * width)
        self.u: dict[str, float] = {}
        first = [
            r.id
            for r in self.copy.live_requests()
            if r.state is State.ADMITTED or (r.state is State.PARKED and not r.wants_devices)
        ]
        first.sort(key=_mix)
        lo, wide = self.span
        for j, rid in enumerate(first):
            self.u[rid] = lo + wide * (j + 0.5) / len(first)
        # The end of the reservation of those expected back: held at least as long (in the
        # runs where they come back, never shorter than in those where they do not).
        self.floor: dict[str, float] = {}
        for req in self.copy.live_requests():
            if req.state is State.ADMITTED:
                self.predict(req, now)
            elif req.state is State.PARKED and not req.wants_devices:
                self.park(req, now)
        self.pokes.sort()

    def reservation(self, req: Request) -> float:
        """Seconds a culled grant of `req`'s tenant keeps its quota (`reservation_ttl`)."""
        config = self.copy.config
        ttl = config.tenants[req.tenant].reservation_ttl
        return config.policy.reservation_ttl if ttl is None else ttl

    def quantile(self, rid: str) -> float:
        """The quantile of its hold time at which grant `rid` ends in this run: spread over
        the run's span `q` ± min(q, 1 - q), not all at `q`. Grants end one by one, and a
        queued request waits for the first few of them: with every grant at its median,
        the first ends came as late as the earliest median, later than any real day's
        first ends (the order statistics of many grants' hold times). The middle run
        (`q` = 0.5) spreads them over all quantiles, a typical future; the quarter runs
        over the lower or the upper half. One grant alone is at `q` itself."""
        u = self.u.get(rid)
        if u is None:  # admitted on the way: a quantile of the span from its id
            lo, wide = self.span
            u = self.u[rid] = lo + wide * _mix(rid) / 2.0**32
        return u

    def returning(
        self, kind: str, rid: str, parked_for: float = 0.0, idle_for: float | None = None
    ) -> tuple[float, bool] | None:
        """The quantile of its session's remaining hold at which an idle or culled holder
        of `kind` that comes back is held in this run, and whether it is back before its
        cull; None: in this run it does not come back.

        A culled holder either does not come back (its hold ends when its reservation
        expires, a known time) or does, and is held as long as past sessions were: of
        the mixture of the two, this run's `q` quantile is the known end when `q` is
        below the share that did not come back, else the session's quantile above it.
        An idle holder (`idle_for`: idle that long so far, not culled yet) may also be
        busy again before its cull (`History.busy_before_cull`): the share that comes
        back is that one and, of the rest, those whose users come back after the cull."""
        p = self.history.comes_back(kind, parked_for) or 0.0
        early = 0.0 if idle_for is None else self.history.busy_before_cull(kind, idle_for)
        back = early + (1.0 - early) * p
        u = self.quantile(rid)
        if back <= 0.0 or u < 1.0 - back:
            return None
        # Which way it comes back says nothing of how long its session lasts then: drawn
        # apart from its quantile (a hash of its own), `early / back` of them before.
        before = _mix(rid + "/idle") / 2.0**32 < early / back
        return min(1.0, (u - (1.0 - back)) / back), before

    def park(self, req: Request, now: float) -> None:
        """A parked reservation: expected back (its user active again) halfway through
        what is left of it, in a run whose quantile says it comes back; else it expires
        at its known time (the core's own timer)."""
        if req.park_expires is None:
            return
        # Parked since its cull: the reservation's length less what is left of it.
        parked_for = max(0.0, self.reservation(req) - (req.park_expires - now))
        back = self.returning(req.kind, req.id, parked_for)
        if back is None:
            return
        self.back_q[req.id] = back[0]
        self.floor[req.id] = req.park_expires
        self.ends.back += 1
        self.pokes.append((now + max(0.0, req.park_expires - now) / 2.0, req.id))

    def predict(self, req: Request, now: float, count: bool = True) -> None:
        """File the predicted end of a grant (an idle one is culled by the core itself,
        unless its user is expected back: `returning`); `count` it in `ends` (a grant in
        use when the run began)."""
        ends = self.ends if count else Ends()
        admitted = req.admit_time if req.admit_time is not None else now
        idle = req.idle_since
        q = self.back_q.get(req.id)
        if q is None:
            q = self.quantile(req.id)
        cull_at = math.inf if idle is None else self.copy.idle_deadline(req.id, idle)
        if cull_at < math.inf and idle is not None:
            back = self.returning(req.kind, req.id, idle_for=max(0.0, now - idle))
            if back is None:
                ends.culled += 1
                return
            # Busy again before its cull, or culled and back within its reservation: its
            # quota stays held as if busy.
            self.copy.activity(req.id, True, now)
            ends.back += 1
            q, early = back
            if early:  # never culled: a busy holder's end, as below
                cull_at = math.inf
        declared = self.declared.get(req.id)
        if declared is not None and req.kind == "job":
            end = max(now, admitted + declared)
            ends.declared += 1
        else:
            age = max(0.0, now - session_start(req, admitted))
            busy_for = 0.0
            if cull_at == math.inf and req.busy and req.kind != "job":
                # Busy now: a cull needs the idle timeout and the reservation first.
                culled = self.copy.idle_deadline(req.id, now)
                if culled < math.inf:
                    busy_for = culled - now + self.reservation(req)
            left = self.history.remaining(req.kind, req.user, age, q, busy_for)
            if left is None:
                self.stuck = True
                return
            if cull_at < math.inf:  # counted as back: held at least past its reservation
                end = max(now + left[0], cull_at + self.reservation(req))
            elif req.id in self.floor:
                end = max(now + left[0], self.floor[req.id])
            else:
                if left[1]:
                    ends.history += 1
                else:
                    ends.aged += 1
                end = now + left[0]
        self.order += 1
        heappush(self.heap, (end, self.order, req.id, admitted))

    def follow(self, decisions: list[Decision], t: float) -> None:
        for d in decisions:
            rid = d.id
            if rid is None:
                continue
            if d.event == "admit" or d.event == "resume":
                self.started.setdefault(rid, t)
                req = self.copy.get(rid)
                if req is not None and req.state is State.ADMITTED:
                    self.predict(req, t, count=False)
            elif d.event == "preempt":
                self.ends.preempted += 1

    def run(
        self,
        waiting: set[str],
        horizon: float,
        max_events: int,
        clock: Callable[[], float] | None = None,
        stop_at: float = math.inf,
    ) -> Generator[None, None, None]:
        """Until every request of `waiting` started, or the budget is spent (`max_events`,
        or `clock()` past `stop_at`, read every `STEP` steps); yields every `STEP` steps."""
        copy = self.copy
        self.follow(copy.step(self.now), self.now)
        events = 0
        steps = 0
        heap = self.heap
        limit = self.now + horizon
        arrivals = self.arrivals
        while not waiting.issubset(self.started) and events < max_events:
            deadline = copy.next_deadline()
            t = heap[0][0] if heap else math.inf
            if deadline is not None and deadline < t:
                t = deadline
            if self.next_arrival < len(arrivals):
                t = min(t, arrivals[self.next_arrival].submit_time)
            pokes = self.pokes
            if self.next_poke < len(pokes):
                t = min(t, pokes[self.next_poke][0])
            if t == math.inf or t > limit:
                return
            steps += 1
            if steps % STEP == 0:
                yield  # the driver's other work goes in between (the copy is ours alone)
                if clock is not None and clock() > stop_at:
                    return  # out of time: what has not started has no estimate
            decisions: list[Decision] = []
            while self.next_poke < len(pokes) and pokes[self.next_poke][0] <= t:
                rid = pokes[self.next_poke][1]
                self.next_poke += 1
                back = copy.get(rid)
                if back is not None and back.state is State.PARKED:
                    decisions += copy.activity(rid, True, t)  # its user is back
            while (
                self.next_arrival < len(arrivals) and arrivals[self.next_arrival].submit_time <= t
            ):
                arrival = arrivals[self.next_arrival]
                self.next_arrival += 1
                if copy.get(arrival.id) is None:
                    decisions += copy.submit(arrival, t)
                    events += 1
            while heap and heap[0][0] <= t:
                _, _, rid, admitted = heappop(heap)
                req = copy.get(rid)
                if req is not None and req.state is State.ADMITTED and req.admit_time == admitted:
                    decisions += copy.finish(rid, t)
                    events += 1
            decisions += copy.step(t)
            events += 1
            self.follow(decisions, t)


def _mix(rid: str) -> int:
    """A stable 32-bit hash of a request id (the same in every process, unlike hash())."""
    return zlib.crc32(rid.encode())


def hold_start(
    admitted: float, culls: int, first_admit: float | None, held_since: float | None = None
) -> float:
    """When the hold of a request admitted at `admitted` began: `held_since`, its latest
    admission, which a resume from its parked reservation (or a claim of it) goes on
    from. A hold is one stretch of quota kept: a culled request whose reservation
    expired, queued again and admitted, holds anew, and the history's samples are holds
    alike (`History`; the one rule for the live history, the backtest's and the one
    rebuilt from the store at a restart).

    Without `held_since` (a row stored before migration 0006), a request culled before
    is counted from its first admission, else from its admission, as all were before:
    a request queued again after its reservation went (the simulator's users come back
    so; the gateway's come back as new requests) looked as old as its first session to
    the runs, while the backtest's history counted its holds apart, and a claim of a
    parked reservation began a hold of its own in the gateway's history
    (benchmarks/RESULTS.md)."""
    if held_since is not None:
        return held_since
    if culls and first_admit is not None:
        return min(first_admit, admitted)
    return admitted


def session_start(req: Request, admitted: float) -> float:
    """`hold_start` of a live request."""
    return hold_start(admitted, req.culls, req.first_admit, req.held_since)


def arrival(req: Request, t: float) -> Request:
    """`req` entering the queue at `t`, as the arrival forecast keeps it: a submission, or
    a culled request queued again once its user is back (a new request to the queue)."""
    return Request(req.id, req.tenant, req.user, req.kind, req.gpus, t,
                   flavor=req.flavor, priority=req.priority)  # fmt: skip


def forecast(arrived: Sequence[Request], now: float) -> list[Request]:
    """What arrives in the next `FORECAST[1]` seconds: what arrived `FORECAST[0]` seconds
    earlier (a seasonal naive forecast: yesterday at this hour), as new requests."""
    period, ahead = FORECAST
    lo = bisect_left(arrived, now - period, key=_submitted)
    hi = bisect_left(arrived, now - period + ahead, key=_submitted)
    out = []
    for i in range(lo, hi):
        r = arrived[i]
        at = r.submit_time + period
        out.append(Request(f"forecast-{i}", r.tenant, r.user, r.kind, r.gpus, at,
                           flavor=r.flavor, priority=r.priority))  # fmt: skip
    return out


def _submitted(r: Request) -> float:
    return r.submit_time


class Snapshot:
    """What a copy of the core is rebuilt from, taken at once: the config, the nodes and a
    copy of each live request (the live core may change while copies are made from it)."""

    def __init__(self, core: AdmissionCore) -> None:
        self.config = core.config
        self.nodes = [(n.flavor, n.name, n.gpus, n.autoscaled) for n in core.nodes()]
        self.requests = [_clone(r) for r in sorted(core.live_requests(), key=_seq)]

    def rebuild(self, now: float) -> Generator[None, None, AdmissionCore]:
        """A copy of the core that shares nothing mutable with it: its nodes, and a copy of
        each live request restored into it as a gateway restart restores them (yields
        every `STEP` requests). Leases are off in the copy (its holders send no
        heartbeats), and it takes over no parked reservation."""
        config = self.config
        flavors = {n: Flavor(f.name, 0, f.gpus_per_node) for n, f in config.flavors.items()}
        policy = dataclasses.replace(config.policy, lease_ttl=0.0, take_over_parked=False)
        copy = AdmissionCore(Config(flavors, config.tenants, policy, config.cohorts))
        for flavor, name, gpus, autoscaled in self.nodes:
            copy.add_node(flavor, name, gpus, now, autoscaled=autoscaled)
        for i, req in enumerate(self.requests):
            if i % STEP == STEP - 1:
                yield
            clone = _clone(req)
            clone.lease_expires = None
            if clone.state is State.QUEUED:
                clone.busy = True  # held as long as past grants were, culls included
            copy.restore(clone, now)
        return copy


def rebuild(core: AdmissionCore, now: float) -> AdmissionCore:
    """A copy of `core` that shares nothing mutable with it (`Snapshot.rebuild`, at once)."""
    return _finish(Snapshot(core).rebuild(now))


def _finish(steps: Generator[None, None, _T]) -> _T:
    """Run a generator of steps to its end: its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value: _T = done.value
            return value


def _seq(req: Request) -> int:
    return req.seq


def _at(req: Request) -> float:
    return req.submit_time


def _clone(r: Request) -> Request:
    return Request(
        r.id,
        r.tenant,
        r.user,
        r.kind,
        r.gpus,
        r.submit_time,
        flavor=r.flavor,
        priority=r.priority,
        busy=r.busy,
        state=r.state,
        queue_time=r.queue_time,
        seq=r.seq,
        assigned_flavor=r.assigned_flavor,
        node=r.node,
        devices=r.devices,
        first_admit=r.first_admit,
        admit_time=r.admit_time,
        idle_since=r.idle_since,
        park_expires=r.park_expires,
        lease_expires=r.lease_expires,
        wants_devices=r.wants_devices,
        preemptions=r.preemptions,
        culls=r.culls,
        reason=r.reason,
        resumed_from=r.resumed_from,
        preempt_at=r.preempt_at,
        preempted_by=r.preempted_by,
        held_since=r.held_since,
    )


def estimate_steps(
    core: AdmissionCore,
    now: float,
    history: History,
    *,
    only: Iterable[str] | None = None,
    declared: Mapping[str, float] | None = None,
    horizon: float = 7 * 86400.0,
    max_events: int = 20000,
    quantiles: tuple[float, float, float] = QUANTILES,
    calibration: Calibration | None = None,
    arrivals: Sequence[Request] = (),
    clock: Callable[[], float] | None = None,
    budget: float = math.inf,
) -> Generator[None, None, dict[str, Estimate]]:
    """The estimated wait of every queued request of `core` (or of those in `only`), from
    three forward runs. `declared`: jobs' declared durations by request id; with
    `calibration`, scaled by how past estimates of the kind turned out; `arrivals`: the
    requests expected to arrive (a forecast: their submit times are in the future, their
    ids unused), submitted in the run as they come, so that those that will overtake a
    queued request (higher priority, a tenant under its fair share) do.

    In steps: it yields now and then (every `STEP` events or restored requests) and
    returns the estimates; `core` is read only before the first step and after the last
    (the runs work on copies made from a `Snapshot` taken at once), so the driver may
    change it in between. `estimate_waits` runs it to the end at once."""
    if only is None:
        waiting = {r.id for r in core.live_requests() if r.state is State.QUEUED}
    else:
        waiting = set()
        for rid in only:
            req = core.get(rid)
            if req is not None and req.state is State.QUEUED:
                waiting.add(rid)
    out: dict[str, Estimate] = {}
    if not waiting:
        return out
    snapshot = Snapshot(core)
    # The middle run first: with the clock's budget spent, the middle estimate matters most.
    order = [1, 0, 2] if len(quantiles) == 3 else list(range(len(quantiles)))
    by_q: dict[int, _Run] = {}
    for i in order:
        copy = yield from snapshot.rebuild(now)
        run = _Run(copy, now, history, quantiles[i], declared or {}, arrivals)
        stop_at = math.inf if clock is None else clock() + budget / len(quantiles)
        yield from run.run(waiting, horizon, max_events, clock, stop_at)
        by_q[i] = run
    runs = [by_q[i] for i in range(len(quantiles))]
    low, middle, high = runs
    for rid in waiting:
        req = core.get(rid)
        samples = history.samples(req.kind, req.user) if req is not None else len(history)
        mid = middle.started.get(rid)
        if mid is None:
            why = "unknown" if middle.stuck else "beyond"
            out[rid] = Estimate(None, None, None, samples, middle.ends, why)
            continue
        waits = sorted(
            t - now for t in (low.started.get(rid), mid, high.started.get(rid)) if t is not None
        )
        # `high` None: started in the middle run, not within the slow run's budget.
        hi = waits[-1] if high.started.get(rid) is not None else None
        est = out[rid] = Estimate(mid - now, waits[0], hi, samples, middle.ends)
        ratios = (
            None if calibration is None or req is None else calibration.ratios(req.kind, mid - now)
        )
        if ratios is not None and mid - now >= MIN_ESTIMATE:
            # The range from how past estimates turned out; the middle stays the run's own
            # (scaled by the median ratio, the month's error grew from 31% to 40%: the runs
            # are about right for kernels and servers, and the ratios of few, widely spread
            # outcomes only moved a right middle; benchmarks/RESULTS.md).
            raw = mid - now
            est.low, est.high = min(raw, raw * ratios[0]), max(raw, raw * ratios[2])
            est.calibrated = True
    return out


def estimate_waits(
    core: AdmissionCore,
    now: float,
    history: History,
    *,
    only: Iterable[str] | None = None,
    declared: Mapping[str, float] | None = None,
    horizon: float = 7 * 86400.0,
    max_events: int = 20000,
    quantiles: tuple[float, float, float] = QUANTILES,
    calibration: Calibration | None = None,
    arrivals: Sequence[Request] = (),
    clock: Callable[[], float] | None = None,
    budget: float = math.inf,
) -> dict[str, Estimate]:
    """The estimated wait of every queued request of `core` (`estimate_steps`, at once)."""
    return _finish(
        estimate_steps(
            core,
            now,
            history,
            only=only,
            declared=declared,
            horizon=horizon,
            max_events=max_events,
            quantiles=quantiles,
            calibration=calibration,
            arrivals=arrivals,
            clock=clock,
            budget=budget,
        )
    )


__all__ = [
    "FORECAST",
    "QUANTILES",
    "STEP",
    "THIN_HISTORY",
    "Calibration",
    "Ends",
    "Estimate",
    "History",
    "Snapshot",
    "estimate_steps",
    "estimate_waits",
    "forecast",
    "rebuild",
    "session_start",
]
