"""Step 5 of the cycle: admit the nominated head, or preempt for it.

An entry in mode PREEMPT first evicts its victims (jobs and victims without grace at once)
or warns them (servers and kernels with `preemption_grace`): warned, the head waits for
them and keeps its room. Then the head is bound to the best-fit node. A base of
:class:`~jupyter_gpuaas.admission.core.AdmissionCore`, which owns the state.
"""

from __future__ import annotations

from typing import Any

from .autoscale import SCALE_DOWN
from .grace import EVICT
from .model import Decision, Request, State
from .nodes import Node
from .nominate import Entry, Mode, Status
from .releases import Releasing
from .timers import EXPIRE, LEASE


class Admitting(Releasing):
    def _admit_or_preempt(self, e: Entry, now: float, out: list[Decision]) -> None:
        req = e.req
        if e.victims and not self._preempt_or_warn(e, now, out):
            e.status = Status.WAITING  # for its warned victims
            return
        if self._graces.waiting(req.id):
            self._withdraw(req, now, out)  # admitted before its victims had to go
        node = self._cluster.best_fit(e.flavor, req.gpus)
        assert node is not None, "nominated without room"
        resume = e.mode is Mode.RESUME
        if resume:
            self._queues[req.tenant].resuming.pop(req.id, None)
            self._ledger.parked[(req.tenant, e.flavor)] -= req.gpus
            self._parked.discard(req)
            self._timers.clear(EXPIRE, req.id)
            req.park_expires = None
            req.wants_devices = False
        else:
            self._dequeue(req)
            self._ledger.add(req.tenant, e.flavor, req.gpus)
            self._capacity_blocked.pop((req.tenant, (req.flavor, req.gpus)), None)
        self._bind(req, node, e.flavor, now)
        e.status = Status.ASSUMED
        self._epoch += 1
        if resume or self._ledger.borrowed(req.tenant, e.flavor):
            # Parked, it held quota that no one could take; holding devices again, it is a
            # candidate for preemption. Or its tenant borrows, now more than before, and
            # the cohort may reclaim as much as it borrows (Kueue's reclaimWithinCohort
            # and borrowWithinCohort). Either way, heads that may evict look again.
            self._wake_preemptors(req.tenant, e.flavor)
        if resume and req.resumed_from is None:
            out.append(
                Decision(now, "resume", req.id, {"node": node.name, "devices": list(req.devices)})
            )
        else:
            if req.first_admit is None:
                req.first_admit = now
            fields: dict[str, Any] = {
                "tenant": req.tenant,
                "flavor": e.flavor,
                "gpus": req.gpus,
                "node": node.name,
                "devices": list(req.devices),
            }
            if req.resumed_from is not None:
                fields["resumed_from"] = req.resumed_from
            out.append(Decision(now, "admit", req.id, fields))
        self._touch(req.tenant)

    def _bind(self, req: Request, node: Node, flavor: str, now: float) -> None:
        req.devices = node.free_devices(req.gpus)
        self._cluster.bind(node, req.id, req.devices)
        self._timers.clear(SCALE_DOWN, node.name)
        req.node = node.name
        req.assigned_flavor = flavor
        req.state = State.ADMITTED
        req.admit_time = now
        self._holders.hold(req, flavor)
        if self._config.policy.lease_ttl > 0:
            req.lease_expires = now + self._config.policy.lease_ttl
            self._timers.set(LEASE, req.id, req.lease_expires)
        req.idle_since = None if req.busy else now
        if req.idle_since is not None:
            self._arm_cull(req)

    def _preempt_or_warn(self, e: Entry, now: float, out: list[Decision]) -> bool:
        """Preempt jobs (and victims without grace) at once, warn the others: True when
        none was warned, so the preemptor can be admitted now."""
        by = e.req
        warned = False
        for v in e.victims:
            grace = 0.0 if v.kind == "job" else self._tenant_setting(v.tenant, "preemption_grace")
            if grace <= 0:
                self._preempt(v, by, now, out)
                continue
            warned = True
            v.preempt_at, v.preempted_by = now + grace, by.id
            self._graces.warn(by.id, e.flavor, e.key, v)
            self._timers.set(EVICT, v.id, v.preempt_at)
            out.append(Decision(now, "preempt_warning", v.id, {"by": by.id, "at": v.preempt_at}))
        if warned:
            self._epoch += 1
            self._touch(by.tenant)
        return not warned

    def _preempt(self, victim: Request, by: Request, now: float, out: list[Decision]) -> None:
        if victim.preempted_by is not None:
            self._victim_left(victim)
        if victim.state is State.ADMITTED:
            self._release_devices(victim, now)
        self._release_quota(victim)
        victim.preemptions += 1
        out.append(Decision(now, "preempt", victim.id, {"by": by.id}))
        if victim.kind == "job":
            # A preempted job runs again from the start, keeping its place by submit time.
            self._requeue(victim, now, victim.submit_time, out)
        else:
            victim.state = State.PREEMPTED
            victim.reason = f"preempted by {by.id}"
            del self._requests[victim.id]
