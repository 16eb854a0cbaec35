"""Releases: what a request gives back when it ends, is culled, expires, is evicted, is
taken over or loses its node, and what a warned victim leaving means for its preemptor.

Every release says what it freed (`room_freed_in` for devices, `quota_freed_in` for
quota: waking.py), so exactly the heads that wait for it look again. A collaborator of
:class:`~jupyter_gpuaas.admission.core.AdmissionCore`.
"""

from __future__ import annotations

from .autoscale import SCALE_DOWN, Autoscaler
from .grace import EVICT, Graces, Reclaim
from .holders import Holders
from .ledger import Ledger
from .model import TERMINAL, Decision, Request, State
from .nodes import Cluster, Node
from .nominate import Nomination
from .policies import Policies
from .positions import Parked
from .queueing import Queues
from .timers import CULL, EXPIRE, LEASE, WARN, Timers
from .waking import Waking


class Releases:
    def __init__(
        self,
        policies: Policies,
        ledger: Ledger,
        cluster: Cluster,
        timers: Timers,
        holders: Holders,
        scaler: Autoscaler,
        parked: Parked,
        graces: Graces,
        requests: dict[str, Request],
        queues: Queues,
        waking: Waking,
        nomination: Nomination,
    ) -> None:
        self._policies = policies
        self._ledger = ledger
        self._cluster = cluster
        self._timers = timers
        self._holders = holders
        self._scaler = scaler
        self._parked = parked
        self._graces = graces
        self._requests = requests
        self._queues = queues
        self._waking = waking
        self._nomination = nomination

    def release_devices(self, req: Request, now: float) -> None:
        flavor = req.assigned_flavor or ""
        node = self._cluster.unbind(req.node or "", req.devices, now)
        self._holders.unhold(req, flavor)
        if node is not None and not node.holders:
            self._scaler.arm_scale_down(self._policies.config, node, now)
        req.node = None
        req.devices = ()
        req.idle_since = None
        for kind in (CULL, WARN, LEASE):
            self._timers.clear(kind, req.id)
        req.lease_expires = None
        self._waking.room_freed_in(flavor, node)

    def release_quota(self, req: Request) -> None:
        flavor = req.assigned_flavor or ""
        self._ledger.remove(req.tenant, flavor, req.gpus)
        if req.state is State.PARKED:
            self._ledger.parked[(req.tenant, flavor)] -= req.gpus
            self._parked.discard(req)
            if self._queues.tenants[req.tenant].resuming.pop(req.id, None) is not None:
                # A StrictFIFO queue waits behind a reservation that wants its devices
                # back (nomination stops there): with it gone, its head looks again.
                self._queues.touch(req.tenant)
            self._nomination.resume_blocked.pop(req.id, None)
            self._timers.clear(EXPIRE, req.id)
            req.park_expires = None
        self._waking.quota_freed_in(req.tenant, flavor)

    def end(self, rid: str, now: float, event: str, state: State, reason: str) -> list[Decision]:
        req = self._get(rid)
        if req.state in TERMINAL:
            return []
        out: list[Decision] = []
        if self._graces:
            if req.preempted_by is not None:
                self.victim_left(req)  # ended by itself within its grace
            if self._graces.waiting(rid):
                self.withdraw(req, now, out)
        if req.state is State.QUEUED:
            self._queues.dequeue(req)
            self._queues.touch(req.tenant)
        if req.state is State.ADMITTED:
            self.release_devices(req, now)
        if req.holds_quota:
            self.release_quota(req)
        req.state = state
        req.reason = reason
        del self._requests[rid]
        out.append(Decision(now, event, rid, {"reason": reason} if reason else {}))
        return out

    def node_left(self, node: Node, now: float) -> list[Decision]:
        """A node left: whoever held its devices loses them. A job is requeued, as a
        preempted job is (it runs again from the start, keeping its place by submit
        time); servers and kernels end."""
        out: list[Decision] = []
        name = node.name
        for rid in sorted(set(node.holders.values())):
            req = self._get(rid)
            if req.kind == "job" and req.state is State.ADMITTED:
                self.release_devices(req, now)
                self.release_quota(req)
                self._queues.requeue(req, now, req.submit_time, out)
                continue
            out += self.end(rid, now, "finish", State.FINISHED, f"node {name} left")
        self._cluster.remove(name)
        self._timers.clear(SCALE_DOWN, name)
        return out

    def evict(self, victim: Request, by: Request, now: float, out: list[Decision]) -> None:
        """A victim is preempted now (at once, or at the end of its grace)."""
        if victim.preempted_by is not None:
            self.victim_left(victim)
        if victim.state is State.ADMITTED:
            self.release_devices(victim, now)
        self.release_quota(victim)
        victim.preemptions += 1
        out.append(Decision(now, "preempt", victim.id, {"by": by.id}))
        if victim.kind == "job":
            # A preempted job runs again from the start, keeping its place by submit time.
            self._queues.requeue(victim, now, victim.submit_time, out)
        else:
            victim.state = State.PREEMPTED
            victim.reason = f"preempted by {by.id}"
            del self._requests[victim.id]

    def _get(self, rid: str) -> Request:
        req = self._requests.get(rid)
        if req is None:
            raise KeyError(rid)
        return req

    def cull(self, req: Request, now: float, out: list[Decision]) -> None:
        ttl = self._policies.setting(req.tenant, "reservation_ttl")
        self.release_devices(req, now)
        req.culls += 1
        if ttl > 0:
            req.state = State.PARKED
            req.park_expires = now + ttl
            self._ledger.parked[(req.tenant, req.assigned_flavor or "")] += req.gpus
            self._parked.add(req)
            self._timers.set(EXPIRE, req.id, req.park_expires)
        else:
            self.release_quota(req)
            req.state = State.CULLED
            if req.preempted_by is not None:
                self.victim_left(req)
        out.append(Decision(now, "cull", req.id, {"parked": ttl > 0}))

    def expire(self, req: Request, now: float, out: list[Decision]) -> None:
        wanted = req.wants_devices
        self.release_quota(req)
        req.state = State.CULLED
        if req.preempted_by is not None:
            self.victim_left(req)
        out.append(Decision(now, "expire", req.id))
        if wanted:
            self._queues.requeue(req, now, now, out)

    def take_over(self, old: Request, req: Request, now: float, out: list[Decision]) -> None:
        """A new request of the same user and tenant takes over a parked reservation."""
        q = self._queues.tenants[req.tenant]
        q.resuming.pop(old.id, None)
        self._nomination.resume_blocked.pop(old.id, None)
        self._parked.discard(old)
        self._timers.clear(EXPIRE, old.id)
        req.state = State.PARKED
        req.assigned_flavor = old.assigned_flavor
        req.park_expires = old.park_expires
        req.wants_devices = True
        req.resumed_from = old.id
        req.held_since, req.culls = old.held_since, old.culls  # its user's hold goes on
        self._parked.add(req)
        if req.park_expires is not None:
            self._timers.set(EXPIRE, req.id, req.park_expires)
        if old.preempted_by is not None:
            self.victim_left(old)
        old.state = State.FINISHED
        old.reason = f"reservation claimed by {req.id}"
        del self._requests[old.id]
        # `claimed_by` says it in data: what counts a user's return (the gateway's
        # estimates) reads it, not the reason's words.
        out.append(Decision(now, "finish", old.id, {"reason": old.reason, "claimed_by": req.id}))
        q.resuming[req.id] = req
        self._queues.touch(req.tenant)

    # ------------------------------------------------------------------ warned victims

    def victim_left(self, victim: Request) -> None:
        """A warned victim is going (evicted, ended, culled): its preemptor looks again."""
        self._timers.clear(EVICT, victim.id)
        victim.preempt_at = victim.preempted_by = None
        rc = self._graces.victim_gone(victim.id)
        if rc is not None:
            self._wake_reclaim(rc)

    def withdraw(self, by: Request, now: float, out: list[Decision]) -> None:
        """The preemptor was cancelled or admitted elsewhere: its victims keep running."""
        rc = self._graces.reclaims.get(by.id)
        for v in self._graces.withdraw(by.id):
            self._timers.clear(EVICT, v.id)
            v.preempt_at = v.preempted_by = None
            out.append(Decision(now, "preempt_withdrawn", v.id, {"by": by.id}))
        if rc is not None:
            self._wake_reclaim(rc)

    def _wake_reclaim(self, rc: Reclaim) -> None:
        by = self._requests.get(rc.preemptor)
        if by is not None and by.state is State.QUEUED:
            bucket = self._queues.tenants[by.tenant].buckets.get((by.flavor, by.gpus))
            if bucket is not None:
                bucket.inadmissible = False
            self._queues.strict_blocked.discard(by.tenant)
            self._queues.dirty.add(by.tenant)
        if rc.preemptor not in self._graces.reclaims and by is not None:
            # Its room is no longer kept: who was held back for it looks again.
            self._queues.wake(self._ledger.tree(by.tenant))
