"""Turn a simulation's decisions into the result object of SCENARIO.md and a human table.

Everything is derived from the decision stream alone (plus the scenario for sizes, submit
times and busy intervals), so the same report can be built from a gateway's decision log.
One pass over the decisions; cost is O(decisions + requests · busy intervals).

Choices where SCENARIO.md is silent, kept consistent across the whole report:

* Percentiles are **nearest-rank**: the smallest wait with at least p% of waits at or
  below it (`sorted[ceil(p/100 · n) − 1]`); 0.0 when there are no waits.
* Rejected requests have wait 0 and are left out of wait percentiles (they never queued).
* A request cancelled before its first admission waited until its cancel, not until the
  end of the clock. A request whose submit time is after the end (`--until`) never
  arrived: it is left out of the result, of `requests` and of every count, as if the
  scenario had stopped before it (it used to be listed as `queued`, which read as a
  request waiting in the queue).
* `never_admitted` counts requests neither admitted nor rejected (queued at the end, or
  cancelled while queued), so admitted + rejected + never_admitted = requests.
* Capacity starts at t = 0 with the flavors' initial nodes; node_ready/scale_down events
  add and remove node-time. Everything is clipped to `end`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Final

from jupyter_gpuaas.admission.model import Decision
from jupyter_gpuaas.sim.scenario import Scenario, ScenarioRequest
from jupyter_gpuaas.words import format_duration, reason_sentence

__all__ = ["Tally", "build_result", "format_table", "percentile"]

_HOUR: Final = 3600.0


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (0.0 when empty)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = max(1, math.ceil(p / 100.0 * n))
    return float(sorted_values[min(rank, n) - 1])


def _busy_overlap(
    start: float, stop: float, origin: float, busy: tuple[tuple[float, float], ...]
) -> float:
    """Seconds of [start, stop) inside the busy intervals, which are relative to `origin`."""
    if stop <= start or not busy:
        return 0.0
    total = 0.0
    # Skip the intervals before the last one that starts at or before `start` (busy lists
    # are sorted and disjoint): a binary search by hand, as bisect_right(busy, (start -
    # origin, inf)) - 1 would find, without a key tuple per call or a slice.
    at = start - origin
    lo = 0
    hi = len(busy)
    while lo < hi:
        mid = (lo + hi) // 2
        if busy[mid][0] <= at:
            lo = mid + 1
        else:
            hi = mid
    # (Conditional expressions, not max/min: interpreted, a builtin call costs ~7 times
    # as much.)
    for i in range(lo - 1 if lo > 0 else 0, len(busy)):
        s, e = busy[i]
        s += origin
        if s >= stop:
            break
        e += origin
        if e > start:
            total += (stop if stop < e else e) - (start if start > s else s)
    return total


class _Track:
    """What the decisions say of one request: one object per id, so a decision costs
    one dict lookup (a dict per field cost ~0.3 s of a month's report)."""

    def __init__(self, req: ScenarioRequest | None) -> None:
        self.req = req  # None: an id the scenario does not have
        self.state = "queued"
        self.first_admit: float | None = None
        self.flavor: str | None = None
        self.preemptions = 0
        self.culls = 0
        self.cancelled_at: float | None = None
        self.reason = ""  # a rejected request's, as its reject event said
        self.gpus = 0
        self.bound_since = 0.0  # while in `bound`
        self.alloc = 0.0  # GPU-seconds bound to devices
        self.busy = 0.0  # GPU-seconds bound and busy
        self.unbound = False  # alloc and busy counted at least once


class _Totals:
    """One tenant's counts over its requests (the per_tenant row, before rounding)."""

    def __init__(self) -> None:
        self.requests = 0
        self.admitted = 0
        self.rejected = 0
        self.alloc = 0.0
        self.busy = 0.0
        self.waits: list[float] = []  # of the requests that count in wait percentiles


def build_result(
    scenario: Scenario,
    decisions: Sequence[Decision],
    end: float,
    wall_seconds: float,
    waiting_for: Callable[[str], tuple[str, Mapping[str, Any]] | None] | None = None,
) -> dict[str, Any]:
    """The `--json` result of SCENARIO.md for `decisions` made up to clock time `end`.

    `waiting_for` (the core's, at `end`) gives a request still queued when the clock
    stopped its `waiting_for: {kind, message}`, the message in words.py's sentence."""
    tally = Tally(scenario)
    tally.add(decisions if isinstance(decisions, list) else list(decisions), end)
    return tally.result(end, wall_seconds, waiting_for)


#: Decisions between two calls of a Tally's `progress` (a month makes 680,000).
PROGRESS_EVERY: Final = 2048


class Tally:
    """The report's one pass over the decisions, fed as they are made (`add`), so a
    replay need not keep them: a month's 680,000 decisions held to the end took half the
    process's memory, and the pages they were written to ~5% of its time. `events`, when
    given, gets every decision as a JSON line too (`simulate --events`). `result` turns
    what was seen into the result object once the clock has stopped. `progress`, when
    given, is told the virtual clock every `PROGRESS_EVERY` decisions (sim/progress.py)."""

    def __init__(
        self,
        scenario: Scenario,
        events: IO[str] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.events = events
        self.progress = progress
        self._progress_due = 0  # the decision count at which progress is told next
        self._lines: list[str] = []
        self._encode = json.JSONEncoder().encode
        self.count = 0  # decisions seen
        # A track per request from the start (an id the scenario lacks gets one when it
        # is first seen), made once either way: a dict of the requests by id to make them
        # as their ids came took 0.2% of a month's samples to build (py-spy), and then
        # 100,000 look-ups.
        self.tracks: dict[str, _Track] = {r.id: _Track(r) for r in scenario.requests}
        # The requests bound to devices now, in the order a dict of their bind times would
        # keep (a re-bind without an unbind keeps its place): the clock's end unbinds them
        # in that order.
        self.bound: dict[str, _Track] = {}
        # Tracks in the order of their first unbind, which the GPU-hour totals add up in
        # (float sums depend on the order).
        self.unbound: list[_Track] = []
        self.node_start: dict[str, float] = {}
        self.node_gpus: dict[str, int] = {}
        for f in scenario.config.flavors.values():
            for i in range(f.nodes):
                self.node_start[f"{f.name}-{i}"] = 0.0
                self.node_gpus[f"{f.name}-{i}"] = f.gpus_per_node
        self.node_seconds = 0.0
        self.gpu_node_seconds = 0.0

    def add(self, decisions: list[Decision], end: float = math.inf) -> None:
        """Take in the next decisions, in the order they were made. A time past `end` is
        counted as `end` (a replay's decisions never are: its clock stops after them)."""
        self.count += len(decisions)
        if self.progress is not None and decisions and self.count >= self._progress_due:
            # Counted, not timed: a clock read per call would cost more than the drawing.
            self._progress_due = self.count + PROGRESS_EVERY
            self.progress(decisions[-1].t)
        if self.events is not None:
            encode = self._encode
            lines = self._lines
            for d in decisions:
                lines.append(encode(d.to_json()))
            if len(lines) >= 10000:
                self.flush()
        tracks = self.tracks
        bound = self.bound
        unbound = self.unbound
        # The branches go by how often a month takes them (admit 171,000, submit 100,000,
        # cull 98,000, finish 93,000, requeue 79,000, resume 53,000, preempt 46,000...):
        # interpreted, each string compared on the way down costs.
        for d in decisions:
            ev = d.event
            rid = d.id
            t = d.t
            if not t < end:
                t = end
            if rid is None:
                if ev == "node_ready":
                    node = str(d.fields.get("node"))
                    fl = self.scenario.config.flavors.get(str(d.fields.get("flavor")))
                    self.node_start[node] = t
                    self.node_gpus[node] = fl.gpus_per_node if fl is not None else 0
                elif ev == "scale_down":
                    node = str(d.fields.get("node"))
                    began = self.node_start.pop(node, None)
                    if began is not None:
                        self.node_seconds += t - began
                        self.gpu_node_seconds += (t - began) * self.node_gpus.get(node, 0)
                continue
            track = tracks.get(rid)
            if track is None:
                track = tracks[rid] = _Track(None)
            if ev == "admit":
                track.state = "admitted"
                if track.first_admit is None:
                    track.first_admit = t
                track.flavor = d.fields.get("flavor")
                req = track.req
                track.gpus = req.gpus if req is not None else int(d.fields.get("gpus", 0))
                track.bound_since = t
                bound[rid] = track
            elif ev == "submit" or ev == "requeue":
                track.state = "queued"
            elif ev == "cull":
                _unbind(bound, unbound, rid, t)
                track.culls += 1
                track.state = "parked" if d.fields.get("parked") else "culled"
            elif ev == "finish":
                _unbind(bound, unbound, rid, t)
                track.state = "finished"
            elif ev == "resume":
                track.state = "admitted"
                track.bound_since = t
                bound[rid] = track
            elif ev == "preempt":
                _unbind(bound, unbound, rid, t)
                track.preemptions += 1
                track.state = "preempted"
            elif ev == "expire":
                track.state = "culled"
            elif ev == "cancel":
                _unbind(bound, unbound, rid, t)
                track.state = "cancelled"
                track.cancelled_at = t
            elif ev == "reject":
                track.state = "rejected"
                track.reason = str(d.fields.get("reason") or "")

    def flush(self) -> None:
        """Write the JSON lines kept so far to `events`."""
        if self.events is not None and self._lines:
            self.events.write("\n".join(self._lines))
            self.events.write("\n")
            self._lines.clear()

    def result(
        self,
        end: float,
        wall_seconds: float,
        waiting_for: Callable[[str], tuple[str, Mapping[str, Any]] | None] | None = None,
    ) -> dict[str, Any]:
        """The result object, with the clock stopped at `end` (every decision taken in)."""
        self.flush()
        scenario = self.scenario
        tracks = self.tracks
        bound = self.bound
        unbound = self.unbound
        for rid in list(bound):
            _unbind(bound, unbound, rid, end)
        node_seconds = self.node_seconds
        gpu_node_seconds = self.gpu_node_seconds
        for node, began in self.node_start.items():
            if began < end:
                node_seconds += end - began
                gpu_node_seconds += (end - began) * self.node_gpus.get(node, 0)

        requests: dict[str, dict[str, Any]] = {}
        all_waits: list[float] = []
        totals = {name: _Totals() for name in scenario.config.tenants}
        admitted = rejected = never = arrived = 0

        no_track = _Track(None)
        for req in scenario.requests:
            rid = req.id
            if req.submit > end:
                continue  # not submitted yet when the clock stopped
            arrived += 1
            st = totals.get(req.tenant)
            if st is None:
                st = totals[req.tenant] = _Totals()
            st.requests += 1
            track = tracks.get(rid, no_track)
            s = track.state
            admitted_at = track.first_admit
            cancelled_at = track.cancelled_at
            counted = True
            if s == "rejected":
                wait = 0.0
                counted = False
                rejected += 1
                st.rejected += 1
            elif admitted_at is not None:
                wait = admitted_at - req.submit
                admitted += 1
                st.admitted += 1
            else:
                never += 1
                if cancelled_at is not None:
                    wait = max(0.0, cancelled_at - req.submit)
                else:
                    wait = end - req.submit
            if counted:
                all_waits.append(wait)
                st.waits.append(wait)
            st.alloc += track.alloc
            st.busy += track.busy
            requests[rid] = {
                "state": s,
                "admitted_at": admitted_at,
                "wait": wait,
                "flavor": track.flavor,
                "preemptions": track.preemptions,
                "culls": track.culls,
            }
            if s == "queued" and waiting_for is not None and cancelled_at is None:
                why = waiting_for(rid)
                if why is not None:
                    requests[rid]["waiting_for"] = {
                        "kind": why[0],
                        "message": reason_sentence(why[0], why[1]),
                    }
            if s == "rejected":
                # SCENARIO.md: a rejected request carries `reason`; its tenant for the table.
                requests[rid]["reason"] = track.reason
                requests[rid]["tenant"] = req.tenant

        all_waits.sort()
        allocated = sum([tr.alloc for tr in unbound]) / _HOUR
        busy_hours = sum([tr.busy for tr in unbound]) / _HOUR
        capacity = gpu_node_seconds / _HOUR
        per_tenant: dict[str, dict[str, Any]] = {}
        for tenant, st in totals.items():
            waits = sorted(st.waits)
            per_tenant[tenant] = {
                "requests": st.requests,
                "admitted": st.admitted,
                "rejected": st.rejected,
                "gpu_hours_allocated": _r(st.alloc / _HOUR),
                "gpu_hours_busy": _r(st.busy / _HOUR),
                "wait_p50": percentile(waits, 50),
                "wait_p95": percentile(waits, 95),
            }
            spec = scenario.config.tenants.get(tenant)
            if spec is not None and spec.cohort is not None:
                per_tenant[tenant]["cohort"] = spec.cohort
        tenant_waits = {tenant: st.waits for tenant, st in totals.items()}
        per_cohort = _per_cohort(scenario, per_tenant, tenant_waits)
        summary: dict[str, Any] = {
            "requests": arrived,
            "admitted": admitted,
            "rejected": rejected,
            "never_admitted": never,
            "wait_p50": percentile(all_waits, 50),
            "wait_p95": percentile(all_waits, 95),
            "wait_max": float(all_waits[-1]) if all_waits else 0.0,
            "gpu_hours_capacity": _r(capacity),
            "gpu_hours_allocated": _r(allocated),
            "gpu_hours_busy": _r(busy_hours),
            "gpu_hours_idle_allocated": _r(max(0.0, allocated - busy_hours)),
            "utilization": _r(busy_hours / capacity) if capacity > 0 else 0.0,
            "node_hours": _r(node_seconds / _HOUR),
            "preemptions": sum([tr.preemptions for tr in tracks.values()]),
            "culls": sum([tr.culls for tr in tracks.values()]),
            "end": float(end),
            "per_tenant": per_tenant,
        }
        if per_cohort:
            summary["per_cohort"] = per_cohort
        return {
            "requests": requests,
            "summary": summary,
            "decisions": self.count,
            "wall_seconds": round(wall_seconds, 6),
        }


def _unbind(bound: dict[str, _Track], unbound: list[_Track], rid: str, t: float) -> None:
    """Count the GPU-seconds of `rid`'s binding that ends at `t`, if it is bound."""
    track = bound.pop(rid, None)
    if track is None:
        return
    since = track.bound_since
    gpus = track.gpus
    if not track.unbound:
        track.unbound = True
        unbound.append(track)
    track.alloc += gpus * (t - since)
    req = track.req
    if req is None or req.busy is None:
        busy = t - since
    else:
        first = track.first_admit
        busy = _busy_overlap(since, t, since if first is None else first, req.busy)
    track.busy += gpus * busy


def _per_cohort(
    scenario: Scenario,
    per_tenant: Mapping[str, Mapping[str, Any]],
    tenant_waits: Mapping[str, list[float]],
) -> dict[str, dict[str, Any]]:
    """Totals per cohort over its whole subtree (a flat cohort: its members), so a
    department sees what its teams got together."""
    config = scenario.config
    parent: dict[str, str | None] = {c.name: c.parent for c in config.cohorts.values()}
    for t in config.tenants.values():
        if t.cohort is not None:
            parent.setdefault(t.cohort, None)
    out: dict[str, dict[str, Any]] = {}
    waits: dict[str, list[float]] = {}
    for name in parent:
        out[name] = {"requests": 0, "admitted": 0, "rejected": 0}
        out[name]["gpu_hours_allocated"] = out[name]["gpu_hours_busy"] = 0.0
        if parent[name] is not None:
            out[name]["parent"] = parent[name]
        waits[name] = []
    for tenant, row in per_tenant.items():
        spec = config.tenants.get(tenant)
        c = spec.cohort if spec is not None else None
        while c is not None:
            agg = out[c]
            for k in ("requests", "admitted", "rejected"):
                agg[k] += row[k]
            for k in ("gpu_hours_allocated", "gpu_hours_busy"):
                agg[k] = _r(agg[k] + row[k])
            waits[c] += tenant_waits.get(tenant, [])
            c = parent.get(c)
    for name, agg in out.items():
        w = sorted(waits[name])
        agg["wait_p50"] = percentile(w, 50)
        agg["wait_p95"] = percentile(w, 95)
    return out


def _r(x: float) -> float:
    """Round away float noise (0.30000000000000004 GPU-hours) without losing meaning."""
    return round(x, 6)


#: Rejections listed one per line in the human table; the rest are counted.
REJECTIONS_SHOWN = 20


def format_rejections(requests: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The "rejected" section: id, tenant and the reason sentence of each rejection."""
    rows = [
        (rid, str(r.get("tenant") or ""), str(r.get("reason") or "no reason recorded"))
        for rid, r in requests.items()
        if r.get("state") == "rejected"
    ]
    if not rows:
        return []
    shown = rows[:REJECTIONS_SHOWN]
    wid = max(len(r[0]) for r in shown)
    wt = max(len(r[1]) for r in shown)
    out = ["", "rejected"]
    out += [f"  {rid.ljust(wid)}  {tenant.ljust(wt)}  {why}" for rid, tenant, why in shown]
    if len(rows) > len(shown):
        more = len(rows) - len(shown)
        out.append(f"  … and {more} more (every reason is in --json)")
    return out


def format_table(result: Mapping[str, Any]) -> str:
    """A human summary of a result: a per-tenant table, the rejections with their
    reasons, then overall lines."""
    summary = result["summary"]
    per_tenant: Mapping[str, Mapping[str, Any]] = summary.get("per_tenant", {})
    headers = (
        "tenant",
        "requests",
        "admitted",
        "rejected",
        "GPU-h alloc",
        "GPU-h busy",
        "wait p50",
        "wait p95",
    )
    rows = [
        (
            name,
            str(t.get("requests", "")),
            str(t.get("admitted", "")),
            str(t.get("rejected", "")),
            f"{t.get('gpu_hours_allocated', 0.0):.1f}",
            f"{t.get('gpu_hours_busy', 0.0):.1f}",
            format_duration(t.get("wait_p50", 0.0)),
            format_duration(t.get("wait_p95", 0.0)),
        )
        for name, t in per_tenant.items()
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=False))
        return f"{first}  {rest}".rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    cohorts: Mapping[str, Mapping[str, Any]] = summary.get("per_cohort", {})
    if cohorts:
        out += ["", "cohorts (each over its whole subtree)"]
        wc = max(len(n) for n in cohorts)
        for name, c in cohorts.items():
            under = f" (in {c['parent']})" if c.get("parent") else ""
            out.append(
                f"  {name.ljust(wc)}  {c['admitted']} of {c['requests']} admitted, "
                f"{c['gpu_hours_allocated']:.1f} GPU-hours allocated, "
                f"wait p95 {format_duration(c['wait_p95'])}{under}"
            )
    out += format_rejections(result.get("requests", {}))
    capacity = summary.get("gpu_hours_capacity", 0.0)
    end = summary.get("end")
    clock = f" to t={end:.0f}s ({format_duration(end)})" if isinstance(end, (int, float)) else ""
    out += [
        "",
        f"requests     {summary['requests']}: {summary['admitted']} admitted, "
        f"{summary['rejected']} rejected, {summary['never_admitted']} never admitted"
        f" ({summary.get('preemptions', 0)} preemptions, {summary.get('culls', 0)} culls)",
        f"waits        p50 {format_duration(summary['wait_p50'])}, "
        f"p95 {format_duration(summary['wait_p95'])}, max {format_duration(summary['wait_max'])}",
        f"capacity     {capacity:.1f} GPU-hours on {summary['node_hours']:.1f} node-hours",
        f"allocated    {summary['gpu_hours_allocated']:.1f} GPU-hours: "
        f"{summary['gpu_hours_busy']:.1f} busy, {summary['gpu_hours_idle_allocated']:.1f} idle",
        f"utilization  {summary['utilization'] * 100:.1f}% (busy ÷ capacity)",
        f"simulated    {result.get('decisions', 0)} decisions{clock} "
        f"in {result.get('wall_seconds', 0.0):.2f}s",
    ]
    return "\n".join(out) + "\n"
