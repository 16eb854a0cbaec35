"""Where the wait estimates' error comes from: oracle substitutions, one cause at a time.

A diagnostic, not an estimator: it peeks at the future on purpose. The month is replayed
once to learn what really happened to every request (when each hold of quota ended, when
each parked notebook came back, how long each grant was held); then replayed again with
the backtest (`simulate --estimates`), and at each sampled arrival instant the queued
arrivals' start is estimated by the middle forward run (the quantile 0.5 run, before any
calibration) several times, each time replacing one more of the estimator's guesses by
the truth:

* `base`: the estimator as it is (the history's remaining hold times, the idle policy's
  culls, the seasonal arrival forecast);
* `H`: + the holders at the estimate (admitted or parked) end their hold when they really
  did, and the parked ones (and the holders culled later) come back when they really did;
* `HQ`: + the queued requests admitted on the way hold for as long as they really held;
* `HQA`: + the true arrivals of the next 24 h instead of the forecast (with their true
  hold lengths), and the culled requests whose users really came back in it (queued
  again when they were).

The drop of the median error from one variant to the next is what that guess costs.
Also reported: how far off the predicted remaining hold of each holder was (by kind and
whether it was idle), and how many holders and parked reservations were there.

    cd benchmarks && PYTHONPATH=.. python estimate_attribution.py /tmp/m/month.json --every 500
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

DAY = 86400.0
LONG_WAIT = 300.0
_ENDS = frozenset(("finish", "cancel", "preempt", "expire"))


def truth(scenario: Any, until: float | None) -> dict[str, list[tuple[float, str, bool]]]:
    """Each request's decisions (time, event, parked) of the real replay."""
    from jupyter_gpuaas.sim.driver import run_scenario

    sim = run_scenario(scenario, until=until)
    out: dict[str, list[tuple[float, str, bool]]] = defaultdict(list)
    for d in sim.decisions:
        if d.id is not None:
            out[d.id].append((d.t, d.event, bool(d.fields.get("parked"))))
    return out


def hold_end(events: list[tuple[float, str, bool]], now: float) -> float:
    """When the hold of quota that is on at `now` really ended (inf: never in the month)."""
    for t, ev, parked in events:
        if t < now:
            continue
        if ev in _ENDS or (ev == "cull" and not parked):
            return t
    return math.inf


def resumes(events: list[tuple[float, str, bool]], now: float) -> list[float]:
    return [t for t, ev, _ in events if ev == "resume" and t > now]


def first_admit_after(events: list[tuple[float, str, bool]], now: float) -> float | None:
    for t, ev, _ in events:
        if t >= now and ev in ("admit", "resume"):
            return t
    return None


def held_for(events: list[tuple[float, str, bool]], now: float) -> float | None:
    """How long the first hold starting at or after `now` lasted."""
    start = first_admit_after(events, now)
    if start is None:
        return None
    end = hold_end(events, start)
    return None if end == math.inf else end - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--until", type=float)
    ap.add_argument("--levels", default="base,H,HQ,HQA", help="the variants to run")
    ap.add_argument("--out", type=Path, default=Path("attribution.jsonl"))
    args = ap.parse_args(argv)

    import jupyter_gpuaas.admission.estimate as est
    from jupyter_gpuaas.admission.core import AdmissionCore
    from jupyter_gpuaas.admission.model import Request, State
    from jupyter_gpuaas.sim.backtest import Backtest
    from jupyter_gpuaas.sim.driver import run_scenario
    from jupyter_gpuaas.sim.scenario import load_scenario

    levels = args.levels.split(",")
    scenario = load_scenario(args.scenario)
    real = truth(scenario, None if args.until is None else args.until + 2 * DAY)
    specs = {r.id: r for r in scenario.requests}
    by_submit = sorted(scenario.requests, key=lambda r: r.submit)
    submits = [r.submit for r in by_submit]
    out = args.out.open("w", encoding="utf-8", buffering=1)
    holder_err: dict[str, list[float]] = defaultdict(list)

    class Oracle(est._Run):
        """The middle run with some of its guesses replaced by what really happened."""

        def __init__(self, copy: AdmissionCore, now: float, bt: Backtest, level: str,
                     arrivals: list[Request]) -> None:  # fmt: skip
            self.level = level
            self.pokes: list[tuple[float, str]] = []  # (time, rid): the holder is back
            self.lengths: dict[str, float] = {}
            self.poked: set[str] = set()  # parked ones whose true end is filed
            super().__init__(copy, now, bt.history, 0.5, {}, arrivals)

        def predict(self, req: Request, now: float, count: bool = True) -> None:
            if self.level == "base":
                return super().predict(req, now, count)
            events = real.get(req.id)
            if req.id in self.poked:
                return
            if events is None:  # a forecast arrival: no truth
                return super().predict(req, now, count)
            if count:  # a holder at the estimate
                end = hold_end(events, now)
            elif "Q" in self.level and req.id not in self.lengths:
                length = held_for(events, self.now)
                if length is None:
                    return super().predict(req, now, count)
                self.lengths[req.id] = length
                end = now + length
            elif req.id in self.lengths:
                return  # resumed: its end is filed
            else:
                return super().predict(req, now, count)
            if req.state is State.ADMITTED and not req.busy:
                self.copy.activity(req.id, True, now)  # no cull: its true end is filed
            self.order += 1
            est.heappush(self.heap, (end, self.order, req.id, req.admit_time or now))

        def park(self, req: Request, now: float) -> None:
            if self.level == "base":
                super().park(req, now)

        def run_all(self, waiting: set[str], horizon: float) -> None:
            copy = self.copy
            if self.level == "base":  # the estimator's own loop
                for _ in self.run(waiting, horizon, 20000):
                    pass
                return
            if self.level != "base":
                for r in list(copy.live_requests()):
                    if r.state is State.CULLED and self.level == "HQA":
                        # Its user back (queued again) within the day: when it really was.
                        again = [t for t, ev, _ in real.get(r.id, [])
                                 if ev == "requeue" and self.now < t <= self.now + DAY]  # fmt: skip
                        if again:
                            self.pokes.append((again[0], r.id))
                    if r.state is State.PARKED:
                        back = [t for t in resumes(real.get(r.id, []), self.now)]
                        end = hold_end(real.get(r.id, []), self.now)
                        if back and back[0] < end:
                            self.pokes.append((back[0], r.id))
                            self.poked.add(r.id)
                            self.order += 1
                            est.heappush(self.heap, (end, self.order, r.id, -1.0))
                self.pokes.sort()
            self.follow(copy.step(self.now), self.now)
            heap = self.heap
            limit = self.now + horizon
            arrivals = self.arrivals
            p = 0
            events = 0
            while not waiting.issubset(self.started) and events < 20000:
                t = heap[0][0] if heap else math.inf
                deadline = copy.next_deadline()
                if deadline is not None and deadline < t:
                    t = deadline
                if self.next_arrival < len(arrivals):
                    t = min(t, arrivals[self.next_arrival].submit_time)
                if p < len(self.pokes):
                    t = min(t, self.pokes[p][0])
                if t == math.inf or t > limit:
                    return
                decisions: list[Any] = []
                while p < len(self.pokes) and self.pokes[p][0] <= t:
                    rid = self.pokes[p][1]
                    p += 1
                    if copy.get(rid) is not None:
                        decisions += copy.activity(rid, True, t)
                while (self.next_arrival < len(arrivals)
                       and arrivals[self.next_arrival].submit_time <= t):  # fmt: skip
                    a = arrivals[self.next_arrival]
                    self.next_arrival += 1
                    if copy.get(a.id) is None:
                        decisions += copy.submit(a, t)
                        events += 1
                while heap and heap[0][0] <= t:
                    _, _, rid, admitted = est.heappop(heap)
                    req = copy.get(rid)
                    if req is None or req.state is not State.ADMITTED:
                        continue
                    if admitted >= 0 and req.admit_time != admitted:
                        continue
                    decisions += copy.finish(rid, t)
                    events += 1
                decisions += copy.step(t)
                events += 1
                self.follow(decisions, t)

    class Diag(Backtest):
        def at_submit(self, core: AdmissionCore, now: float, arrived: list[str]) -> None:
            self.instants += 1
            for rid in arrived:
                req = core.get(rid)
                if req is not None:
                    self.arrived.append(req)
            if (self.instants - 1 - args.offset) % self.every:
                return
            queued = [rid for rid in arrived
                      if (r := core.get(rid)) is not None and r.state is State.QUEUED]  # fmt: skip
            if not queued:
                return
            # How right the predicted remaining holds of the holders were.
            for r in core.live_requests():
                if r.state is not State.ADMITTED:
                    continue
                true = hold_end(real.get(r.id, []), now) - now
                idle = r.idle_since is not None
                if r.kind == "job" or not idle:
                    age = max(0.0, now - est.session_start(r, r.admit_time or now))
                    left = self.history.remaining(r.kind, r.user, age, 0.5)
                    if left is None or true == math.inf:
                        continue
                    pred = left[0]
                else:
                    pred = core.idle_deadline(r.id, r.idle_since or now) - now + 1200.0
                key = f"{r.kind}/{'idle' if idle else 'busy'}"
                holder_err[key].append(math.log(max(60.0, true) / max(60.0, pred)))
            parked = sum(1 for r in core.live_requests() if r.state is State.PARKED)
            lo = int(__import__("bisect").bisect_right(submits, now))
            hi = int(__import__("bisect").bisect_right(submits, now + DAY))
            true_arrivals = [
                Request(
                    s.id,
                    s.tenant,
                    s.user,
                    s.kind,
                    s.gpus,
                    s.submit,
                    flavor=s.flavor,
                    priority=s.priority,
                )
                for s in by_submit[lo:hi]
            ]
            line: dict[str, Any] = {"now": now, "parked": parked, "q": {}}
            for level in levels:
                copy = est.rebuild(core, now)
                arr = true_arrivals if level == "HQA" else est.forecast(self.arrived, now)
                run = Oracle(copy, now, self, level, arr)
                run.run_all(set(queued), 7 * DAY)
                for rid in queued:
                    t = run.started.get(rid)
                    line["q"].setdefault(rid, {})[level] = None if t is None else t - now
            for rid in queued:
                t = first_admit_after(real.get(rid, []), now)
                line["q"][rid]["actual"] = None if t is None else t - now
                line["q"][rid]["kind"] = specs[rid].kind
            out.write(json.dumps(line) + "\n")

    bt = Diag(scenario, args.every)
    run_scenario(scenario, until=args.until, backtest=bt)
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    ratio: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    out.close()
    for raw in args.out.read_text(encoding="utf-8").splitlines():
        d = json.loads(raw)
        for q in d["q"].values():
            wait = q["actual"]
            if wait is None or wait < LONG_WAIT:
                continue
            for level in levels:
                e = q[level]
                for key in ("all", q["kind"]):
                    if e is None:
                        errors[key][level].append(math.inf)
                        continue
                    errors[key][level].append(abs(e - wait) / wait)
                    ratio[key][level].append(wait / max(1.0, e))
    print(
        "| slice | n | base | + true holder ends and resumes (H) "
        "| + true holds of the queued (HQ) | + true arrivals (HQA) |"
    )
    print("|---|---|---|---|---|---|")
    for key in ("all", "kernel", "server", "job"):
        if key not in errors:
            continue
        cells = []
        for level in levels:
            e = errors[key][level]
            r = ratio[key][level]
            cells.append(f"{statistics.median(e) * 100:.0f}% (act/est {statistics.median(r):.2f})")
        print(f"| {key} | {len(errors[key]['base'])} | " + " | ".join(cells) + " |")
    print("\nholders' true / predicted remaining hold (median ratio, share predicted too short):")
    for key, v in sorted(holder_err.items()):
        short = sum(1 for x in v if x > 0) / len(v)
        print(
            f"  {key}: n={len(v)} ratio {math.exp(statistics.median(v)):.2f}, too short {short:.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
