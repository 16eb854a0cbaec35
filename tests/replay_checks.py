"""The replay: one pass over a run's events that checks each against SCENARIO.md.

`Replay.apply` checks every event against its request's state; `boundary` what must hold
once every decision at an instant is made (quota, devices on ready nodes, cancels, grace
deadlines, BestEffortFIFO). `replay` drives it; invariants.py turns it into check_run,
check_expect and check_result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from replay_state import TERMINAL, Event, Grace, Snapshot, events_of
from scenario_rules import EPS, allowed_flavors, busy_at, must_reject, quota_problem, tenant_setting

from jupyter_gpuaas.sim.scenario import Scenario, ScenarioRequest


class Replay(Grace):
    """Rebuilds the world from events and collects contradictions with the contract."""

    # ----------------------------------------------------------------- one event

    def apply(self, ev: Event) -> None:
        """Apply one event, checking it against the request's state (one branch per kind)."""
        t = float(ev["t"])
        kind = ev.get("event")
        rid = ev.get("id")
        if kind in ("scale_up", "node_ready", "scale_down"):
            self.apply_node(t, kind, ev)
            return
        if rid not in self.lives:
            self.err(t, f"{kind} of unknown request {rid!r}")
            return
        life = self.lives[rid]
        spec = life.spec
        assert spec is not None
        if life.state in TERMINAL:
            self.err(t, f"{kind} of {rid} after it was {life.state}")
            return
        if kind != "submit" and life.state == "unsubmitted":
            self.err(t, f"{kind} of {rid} before its submit")
            return

        if kind == "submit":
            life.submits += 1
            if life.submits > 1:
                self.err(t, f"{rid} submitted twice")
            if abs(t - spec.submit) > EPS:
                self.err(t, f"{rid} submitted at {t:g}, its submit time is {spec.submit:g}")
            for key, want in (("tenant", spec.tenant), ("gpus", spec.gpus), ("kind", spec.kind)):
                if ev.get(key) != want:
                    self.err(t, f"submit of {rid}: {key} {ev.get(key)!r}, expected {want!r}")
            life.state = "queued"
        elif kind == "reject":
            if life.last_event != "submit" or abs(life.last_t - t) > EPS:
                self.err(t, f"{rid} rejected, but not right after its submit")
            if not must_reject(self.cfg, spec):
                self.err(t, f"{rid} rejected although it could fit some day ({ev.get('reason')!r})")
            if not str(ev.get("reason") or "").strip():
                self.err(t, f"{rid} rejected without a reason")
            life.state = "rejected"
        elif kind == "admit":
            if self.expect_state(t, rid, kind, ("queued",)):
                if (
                    life.submits == 1
                    and life.last_event == "submit"
                    and must_reject(self.cfg, spec)
                ):
                    self.err(t, f"{rid} admitted although it must be rejected")
                if spec.cancel is not None and t >= spec.cancel - EPS:
                    self.err(t, f"{rid} admitted at {t:g}, at or after its cancel {spec.cancel:g}")
                flavor = ev.get("flavor")
                if ev.get("tenant") != spec.tenant or ev.get("gpus") != spec.gpus:
                    self.err(t, f"admit of {rid}: tenant/gpus {ev.get('tenant')}/{ev.get('gpus')}")
                if spec.flavor is not None and flavor != spec.flavor:
                    self.err(t, f"{rid} pinned to {spec.flavor} admitted on {flavor}")
                if flavor not in allowed_flavors(self.cfg, spec):
                    self.err(t, f"{rid} admitted on {flavor}, not an allowed flavor")
                if spec.tenant in self.cfg.tenants and isinstance(flavor, str):
                    life.flavor = flavor
                    self.usage[(spec.tenant, flavor)] += spec.gpus
                    self.bind(t, rid, ev, flavor, spec.gpus)
                    problem = quota_problem(self.cfg, self.usage, spec.tenant, flavor)
                    if problem:
                        self.err(t, f"after admit of {rid}: {problem}")
                life.admits += 1
                life.admit_t = t
                if life.first_admit is None:
                    life.first_admit = t
                life.state = "admitted"
        elif kind == "preempt_warning":
            self.warning(t, rid, life, ev)
        elif kind == "preempt_withdrawn":
            if life.warned_by is None:
                self.err(t, f"warning of {rid} withdrawn, but it was not warned")
            elif ev.get("by") != life.warned_by:
                self.err(t, f"{rid} warned by {life.warned_by}, withdrawn by {ev.get('by')!r}")
            self.withdrawn_by.add(str(ev.get("by")))
            self.unwarn(rid)
        elif kind == "preempt":
            if self.expect_state(t, rid, kind, ("admitted", "parked")):
                by = ev.get("by")
                if by not in self.lives or by == rid:
                    self.err(t, f"{rid} preempted by {by!r}, not another request")
                at_once = life.warned_by is None
                self.check_eviction(t, rid, life, by)
                if at_once and isinstance(by, str) and by in self.lives:
                    self.check_no_second_set(t, by)
                self.unbind(t, rid)
                self.release_quota(rid)
                life.preemptions += 1
                life.state = "preempted-job" if spec.kind == "job" else "preempted"
        elif kind == "requeue":
            self.expect_state(t, rid, kind, ("preempted-job", "culled", "expired"))
            life.state = "queued"
        elif kind == "cull":
            if spec.kind == "job":
                self.err(t, f"job {rid} culled: jobs are never culled")
            if tenant_setting(self.cfg, spec.tenant, "idle_timeout") <= 0:
                self.err(t, f"{rid} culled although idle_timeout is 0")
            if self.expect_state(t, rid, kind, ("admitted",)):
                if (
                    life.admits == 1
                    and life.first_admit is not None
                    and busy_at(spec, life.first_admit, t)
                ):
                    self.err(t, f"{rid} culled while busy")
                self.unbind(t, rid)
                life.culls += 1
                ttl = tenant_setting(self.cfg, spec.tenant, "reservation_ttl")
                parked = bool(ev.get("parked"))
                if parked != (ttl > 0):
                    self.err(t, f"cull of {rid}: parked={parked} with reservation_ttl {ttl:g}")
                if parked:
                    life.parked_at = t
                    life.state = "parked"
                else:
                    self.release_quota(rid)
                    life.state = "culled"
                    self.unwarn(rid)
        elif kind == "resume":
            if self.expect_state(t, rid, kind, ("parked",)) and life.flavor is not None:
                self.bind(t, rid, ev, life.flavor, spec.gpus)
                life.parked_at = None
                life.state = "admitted"
        elif kind == "expire":
            if self.expect_state(t, rid, kind, ("parked",)):
                ttl = tenant_setting(self.cfg, spec.tenant, "reservation_ttl")
                if life.parked_at is not None and abs(t - (life.parked_at + ttl)) > EPS:
                    self.err(t, f"{rid} parked at {life.parked_at:g} expired after ttl {ttl:g}")
                self.release_quota(rid)
                life.state = "expired"
                self.unwarn(rid)
        elif kind == "finish":
            ok = life.state in ("admitted", "parked", "culled", "expired") or (
                life.state == "queued" and spec.kind != "job" and life.admits > 0
            )
            if not ok:
                self.err(t, f"finish of {rid} while {life.state}")
            if (
                spec.kind == "job"
                and life.admit_t is not None
                and abs(t - (life.admit_t + spec.duration)) > EPS
            ):
                self.err(
                    t,
                    f"job {rid} admitted at {life.admit_t:g} for {spec.duration:g}s "
                    f"finished at {t:g}",
                )
            self.unbind(t, rid)
            self.release_quota(rid)
            life.state = "finished"
            self.unwarn(rid)
        elif kind == "cancel":
            if spec.cancel is None or abs(t - spec.cancel) > EPS:
                self.err(t, f"{rid} cancelled at {t:g}, its cancel time is {spec.cancel}")
            self.unbind(t, rid)
            self.release_quota(rid)
            life.state = "cancelled"
            self.unwarn(rid)
        else:
            self.err(t, f"unknown event {kind!r}")
        life.last_event, life.last_t = str(kind), t

    # ----------------------------------------------------------------- nodes

    def apply_node(self, t: float, kind: str | None, ev: Event) -> None:
        flavor = ev.get("flavor")
        if flavor not in self.cfg.flavors:
            self.err(t, f"{kind} of unknown flavor {flavor!r}")
            return
        auto = self.cfg.policy.autoscale.get(flavor)
        if auto is None:
            self.err(t, f"{kind} for {flavor}, which has no autoscale policy")
            return
        if kind == "scale_up":
            self.scale_ups.append((t, flavor))
            return
        node = ev.get("node")
        if not isinstance(node, str) or not node.startswith(f"{flavor}-"):
            self.err(t, f"{kind} of node {node!r}: not named {flavor}-<n>")
            return
        count = sum(1 for f in self.nodes.values() if f == flavor)
        if kind == "node_ready":
            if node in self.nodes:
                self.err(t, f"node {node} ready twice")
            if count + 1 > auto.max_nodes:
                self.err(t, f"{flavor} grows to {count + 1} nodes > max_nodes {auto.max_nodes}")
            asked = t - auto.provision_delay
            if not any(abs(ts - asked) <= EPS and f == flavor for ts, f in self.scale_ups):
                self.err(t, f"{node} ready without a scale_up of {flavor} at {asked:g}")
            self.nodes[node] = flavor
            self.empty_since[node] = t
        else:
            if node not in self.nodes:
                self.err(t, f"scale_down of missing node {node}")
                return
            if self.bound[node]:
                self.err(t, f"{node} removed while devices are bound: {dict(self.bound[node])}")
            if count - 1 < self.cfg.flavors[flavor].nodes:
                self.err(t, f"{flavor} shrinks below its {self.cfg.flavors[flavor].nodes} nodes")
            idle = t - self.empty_since.get(node, t)
            if idle < auto.scale_down_after - EPS:
                self.err(t, f"{node} removed after {idle:g}s idle < {auto.scale_down_after:g}")
            del self.nodes[node]
            self.bound.pop(node, None)

    # ----------------------------------------------------------------- boundaries

    def boundary(self, t: float) -> None:
        """Checks that hold once every decision at `t` is made."""
        for (tenant, flavor), _ in list(self.usage.items()):
            if tenant in self.cfg.tenants:
                problem = quota_problem(self.cfg, self.usage, tenant, flavor)
                if problem:
                    self.err(t, problem)
        for node, devs in self.bound.items():
            if devs and node not in self.nodes:
                self.err(t, f"devices bound on missing node {node}")
        for rid, life in self.lives.items():
            if life.state == "preempted-job":
                self.err(t, f"preempted job {rid} not requeued at the same instant")
            cancel = life.spec.cancel if life.spec is not None else None
            if (
                cancel is not None
                and cancel <= t + EPS
                and life.state not in TERMINAL
                and life.state != "unsubmitted"
                and rid not in self.missed_cancel
            ):
                self.missed_cancel.add(rid)
                self.err(t, f"{rid} is {life.state} after its cancel time {cancel:g}")
        for rid, life in self.lives.items():
            if life.evict_at is not None and life.evict_at <= t + EPS:
                self.err(t, f"{rid} still runs after its eviction deadline {life.evict_at:g}")
                self.unwarn(rid)
        for by in self.withdrawn_by:
            if by in self.lives and self.lives[by].state == "queued":
                self.err(t, f"{by} withdrew its warnings but was neither admitted nor cancelled")
        self.withdrawn_by.clear()
        self.best_effort_fifo(t)
        held: dict[str, int] = defaultdict(int)
        for life in self.lives.values():
            if life.node is not None and life.spec is not None:
                held[life.spec.tenant] += life.spec.gpus
        counts: dict[str, int] = defaultdict(int)
        for flavor in self.nodes.values():
            counts[flavor] += 1
        self.timeline.append(Snapshot(t, dict(held), dict(counts)))

    def fits_now(self, spec: ScenarioRequest) -> str | None:
        """A flavor where `spec` fits quota and a node right now, or None."""
        for flavor in allowed_flavors(self.cfg, spec):
            trial = dict(self.usage)
            trial[(spec.tenant, flavor)] = trial.get((spec.tenant, flavor), 0) + spec.gpus
            if quota_problem(self.cfg, trial, spec.tenant, flavor):
                continue
            if any(f == flavor and self.free(n) >= spec.gpus for n, f in self.nodes.items()):
                return flavor
        return None

    def best_effort_fifo(self, t: float) -> None:
        """BestEffortFIFO: after all decisions at t, no queued request of such a tenant fits.

        A tenant with a parked request that may be busy again is skipped: that request is
        served ahead of its tenant's queue, and whether it then blocks the queue is not
        pinned by the contract.
        """
        blocked: set[str] = set()
        # While a preemptor waits for warned victims, the room they free is kept for it
        # (Kueue keeps a preempting workload's usage in the cycle): its cohort is skipped.
        reclaiming = self.warned_pools()
        for name in self.cfg.tenants:
            if self.pool_of(name) in reclaiming:
                blocked.add(name)
        for life in self.lives.values():
            if life.state == "parked" and life.spec is not None:
                first = life.first_admit
                if life.admits > 1 or first is None or busy_at(life.spec, first, t):
                    blocked.add(life.spec.tenant)
        for rid, life in self.lives.items():
            spec = life.spec
            if life.state != "queued" or spec is None or spec.tenant in blocked:
                continue
            tenant = self.cfg.tenants.get(spec.tenant)
            if tenant is None or tenant.queueing != "BestEffortFIFO":
                continue
            flavor = self.fits_now(spec)
            if flavor is not None:
                self.err(t, f"BestEffortFIFO: queued {rid} ({spec.gpus} GPUs) fits on {flavor}")

    def finish(self, end_t: float | None) -> None:
        until = self.scenario.until
        for rid, life in self.lives.items():
            spec = life.spec
            assert spec is not None
            if life.submits == 0 and (until is None or spec.submit < until - EPS):
                self.err(spec.submit, f"{rid} never submitted")
            if life.state in ("preempted-job",):
                self.err(end_t or 0.0, f"{rid} ends preempted without requeue")


def replay(scenario: Scenario, decisions: Sequence[Any]) -> Replay:
    """Replay events, checking after every event and at every timestamp boundary."""
    rp = Replay(scenario)
    last: float | None = None
    for ev in events_of(decisions):
        t = float(ev["t"])
        if last is not None and t < last - EPS:
            rp.err(t, f"event out of time order (after t={last:g}): {ev}")
        if last is not None and t > last + EPS:
            rp.boundary(last)
        last = t if last is None else max(last, t)
        rp.apply(ev)
    if last is not None:
        rp.boundary(last)
    rp.finish(last)
    return rp
