"""The admission core: one state machine that both drivers (gateway, simulator) feed.

Events in (submit, cancel, finish, activity, heartbeat, nodes, time passing), decisions
out (:class:`~jupyter_gpuaas.admission.model.Decision`). Every method takes `now`; the core
never reads a clock. Every method returns the decisions it made, in order; the caller
persists and announces them.

An admission cycle follows Kueue's scheduler: take the head of every tenant whose
situation changed (nominate: which flavor, does it fit, whom would it preempt), order the
heads (within nominal before borrowing, then fair share, priority, queue time), admit
the best, and go again. A head that can neither fit nor preempt marks its bucket
inadmissible until room frees up for its tenant, so an idle queue costs nothing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .autoscale import READY, SCALE_DOWN, Autoscaler, scale_sizes
from .grace import EVICT, Graces, Reclaim
from .heads import Heads
from .holders import Holders
from .ledger import Ledger
from .model import TERMINAL, Config, Decision, Preemption, Request, State
from .nodes import Cluster, Node
from .nominate import Entry, Nominating
from .queues import BucketKey, TenantQueue
from .timers import Timers
from .views import NodeState, Position, TenantUsage

__all__ = ["AdmissionCore", "NodeState", "Position", "TenantUsage"]

# Timer kinds (the autoscaler has two more).
_CULL, _WARN, _EXPIRE, _LEASE = "cull", "cull_warning", "expire", "lease"


class AdmissionCore(Nominating):
    """The decision core. It starts with `Flavor.nodes` nodes of each flavor, named
    `<flavor>-<n>` as in the simulator; a driver whose nodes come from an inventory passes
    flavors with `nodes=0` and calls :meth:`add_node` for each node it really has."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._ledger = Ledger(config)
        self._cluster = Cluster()
        self._timers = Timers()
        self._graces = Graces()  # warned victims and the preemptors waiting for them
        self._requests: dict[str, Request] = {}
        self._queues: dict[str, TenantQueue] = {t: TenantQueue() for t in config.tenants}
        self._holders = Holders(self._ledger, self._cluster)  # preemption candidates
        self._heads = Heads()  # the nominated heads, of tenants that have one
        self._dirty: set[str] = set()
        self._sleepers: dict[str, set[str]] = defaultdict(set)  # waking.py
        self._strict_blocked: set[str] = set()
        # Bucket heads held back by capacity alone (quota would admit them): scale demand.
        self._capacity_blocked: dict[tuple[str, BucketKey], str] = {}
        # Who to wake when devices of a flavor free up: (tenant, bucket) blocked by capacity
        # there; bucket None for the tenant itself (StrictFIFO head, waiting resume).
        self._cap_waiters: dict[str, set[tuple[str, BucketKey | None]]] = defaultdict(set)
        self._epoch = 0  # bumps whenever quota or devices are taken
        self._preempts: dict[str, bool] = {}  # tenants with any preemption policy
        self._flavors: dict[str, tuple[str, ...]] = {}  # a tenant's flavors, in quota order
        self._tournament = False  # fair sharing in a cohort tree: heads meet level by level
        self._index_policies()
        self._width: dict[str, int] = {}  # widest node per flavor, for rejections
        self._resume_blocked: dict[str, str] = {}  # parked rid -> flavor
        self._scaler = Autoscaler(self._cluster, self._timers)
        self._seq = 0
        for f in config.flavors.values():
            for i in range(f.nodes):
                self._cluster.add(f.name, f"{f.name}-{i}", f.gpus_per_node)

    # ------------------------------------------------------------------ configuration

    @property
    def config(self) -> Config:
        return self._config

    def _index_policies(self) -> None:
        self._preempts = {
            t.name: t.preemption != Preemption() for t in self._config.tenants.values()
        }
        self._flavors = {t.name: tuple(t.quota) for t in self._config.tenants.values()}
        self._tournament = bool(self._config.policy.fair_sharing and self._config.cohorts)
        self._holders.reconfigure(self._config)

    def update_config(self, config: Config, now: float) -> list[Decision]:
        """Adopt new quotas and policy. Nobody is evicted; queues are looked at again."""
        gone = {r.tenant for r in self._requests.values()} - set(config.tenants)
        if gone:
            raise ValueError(f"tenants still have requests: {', '.join(sorted(gone))}")
        self._config = config
        self._ledger.reconfigure(config)
        self._index_policies()
        self._width.clear()
        for t in config.tenants:
            self._queues.setdefault(t, TenantQueue())
        self._wake(config.tenants)
        return []

    # ------------------------------------------------------------------ events in

    def submit(self, req: Request, now: float, *, claim_parked: bool = False) -> list[Decision]:
        """A request arrives: rejected at once if it can never be admitted, else queued."""
        if req.id in self._requests:
            raise ValueError(f"duplicate request id {req.id!r}")
        out = [
            Decision(
                now, "submit", req.id, {"tenant": req.tenant, "kind": req.kind, "gpus": req.gpus}
            )
        ]
        req.seq = self._seq = self._seq + 1
        req.queue_time = req.submit_time
        reason = self.never_fits(req)
        if reason:
            req.state = State.REJECTED
            req.reason = reason
            out.append(Decision(now, "reject", req.id, {"reason": reason}))
            return out
        self._requests[req.id] = req
        if claim_parked:
            old = self._find_parked(req)
            if old is not None:
                self._take_over(old, req, now, out)
                return out
        req.state = State.QUEUED
        q = self._queues[req.tenant]
        bucket = q.push(req)
        if bucket.inadmissible and q.head(bucket) is req:
            # A new head may preempt where the old one could not (a higher priority).
            bucket.inadmissible = False
            self._strict_blocked.discard(req.tenant)
        self._touch(req.tenant)
        return out

    def cancel(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        """The user cancels: whatever the request holds is released."""
        return self._end(rid, now, "cancel", State.CANCELLED, reason)

    def finish(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        """The holder is done (or gone): devices and quota are released."""
        return self._end(rid, now, "finish", State.FINISHED, reason)

    def activity(self, rid: str, busy: bool, now: float) -> list[Decision]:
        """The holder is busy or idle. Idle holders are culled; busy culled ones come back."""
        req = self._get(rid)
        out: list[Decision] = []
        if req.state in TERMINAL:
            return out
        req.busy = busy
        if req.state is State.ADMITTED:
            if busy:
                req.idle_since = None
                self._timers.clear(_CULL, rid)
                self._timers.clear(_WARN, rid)
            elif req.idle_since is None:
                req.idle_since = now
                self._arm_cull(req)
        elif req.state is State.PARKED:
            q = self._queues[req.tenant]
            req.wants_devices = busy
            if busy:
                q.resuming[rid] = req
                self._touch(req.tenant)
            else:
                q.resuming.pop(rid, None)
                self._resume_blocked.pop(rid, None)
        elif req.state is State.CULLED and busy:
            self._requeue(req, now, now, out)
        return out

    def heartbeat(self, rid: str, now: float, busy: bool | None = None) -> list[Decision]:
        """A lease renewal from the holder, optionally saying whether it is busy."""
        req = self._get(rid)
        if req.state is State.ADMITTED and self._config.policy.lease_ttl > 0:
            req.lease_expires = now + self._config.policy.lease_ttl
            self._timers.set(_LEASE, rid, req.lease_expires)
        if busy is None:
            return []
        return self.activity(rid, busy, now)

    def add_node(
        self, flavor: str, name: str, gpus: int, now: float, *, autoscaled: bool = False
    ) -> list[Decision]:
        """A node joined (from the driver's inventory).

        `autoscaled` nodes are removed again after `scale_down_after` without holders,
        as if the core had asked for them (the gateway restores simulated scale-ups so).
        """
        node = self._cluster.add(flavor, name, gpus, autoscaled=autoscaled)
        self._width.pop(flavor, None)
        node.empty_since = now
        self._scaler.joined(flavor, name)
        self._scaler.arm_scale_down(self._config, node, now)
        self._room_freed_in(flavor)
        return []

    def remove_node(self, name: str, now: float) -> list[Decision]:
        """A node left: whoever held its devices loses them. A job is requeued, as a
        preempted job is (it runs again from the start, keeping its place by submit
        time); servers and kernels end."""
        out: list[Decision] = []
        node = self._cluster.nodes.get(name)
        if node is None:
            return out
        for rid in sorted(set(node.holders.values())):
            req = self._get(rid)
            if req.kind == "job" and req.state is State.ADMITTED:
                self._release_devices(req, now)
                self._release_quota(req)
                self._requeue(req, now, req.submit_time, out)
                continue
            out += self._end(rid, now, "finish", State.FINISHED, f"node {name} left")
        self._cluster.remove(name)
        self._width.pop(node.flavor, None)
        self._timers.clear(SCALE_DOWN, name)
        return out

    def restore(self, req: Request, now: float) -> list[Decision]:
        """Put back a request read from the store, in the state it was stored in.

        A grant whose devices are gone (node missing, device taken) ends with a `finish`.
        """
        self._seq = max(self._seq, req.seq)
        out: list[Decision] = []
        if req.state in TERMINAL:
            return out
        self._requests[req.id] = req
        if req.state is State.QUEUED:
            self._queues[req.tenant].push(req)
            self._touch(req.tenant)
        elif req.state is State.ADMITTED:
            node = self._cluster.nodes.get(req.node or "")
            flavor = req.assigned_flavor or ""
            ok = (
                node is not None
                and node.flavor == flavor
                and len(req.devices) == req.gpus
                and all(0 <= d < node.gpus and d not in node.holders for d in req.devices)
            )
            if not ok or node is None:
                req.state = State.FINISHED
                req.reason = "its devices were gone when the gateway restarted"
                del self._requests[req.id]
                out.append(Decision(now, "finish", req.id, {"reason": req.reason}))
                return out
            self._cluster.bind(node, req.id, req.devices)
            self._ledger.add(req.tenant, flavor, req.gpus)
            self._holders.hold(req, flavor)
            if req.idle_since is not None:
                self._arm_cull(req)
            if req.lease_expires is not None:
                self._timers.set(_LEASE, req.id, req.lease_expires)
            self._restore_warning(req)
        elif req.state is State.PARKED:
            flavor = req.assigned_flavor or ""
            self._ledger.add(req.tenant, flavor, req.gpus)
            self._ledger.parked[(req.tenant, flavor)] += req.gpus
            if req.park_expires is not None:
                self._timers.set(_EXPIRE, req.id, req.park_expires)
            if req.wants_devices:
                self._queues[req.tenant].resuming[req.id] = req
                self._touch(req.tenant)
            self._restore_warning(req)
        return out

    def _restore_warning(self, req: Request) -> None:
        if req.preempt_at is not None and req.preempted_by is not None:
            self._graces.warn(req.preempted_by, req.assigned_flavor or "", None, req)
            self._timers.set(EVICT, req.id, req.preempt_at)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When `advance` next has something to do (None: nothing until an event)."""
        return self._timers.next()

    def advance(self, now: float) -> list[Decision]:
        """Act on every deadline at or before `now`, each stamped with its own time."""
        out: list[Decision] = []
        while True:
            due = self._timers.pop_due(now)
            if due is None:
                return out
            t, kind, key = due
            if kind == READY:
                node = self._scaler.node_ready(self._config, key, t)
                if node is not None:
                    out.append(
                        Decision(t, "node_ready", None, {"flavor": node.flavor, "node": key})
                    )
                    self._room_freed_in(node.flavor)
                continue
            if kind == SCALE_DOWN:
                gone = self._scaler.scale_down(key, t)
                if gone is not None:
                    out.append(gone)
                continue
            req = self._requests.get(key)
            if req is None:
                continue
            if kind == _WARN and req.state is State.ADMITTED:
                cull_at = self._timers.get(_CULL, key)
                out.append(Decision(t, "cull_warning", key, {"cull_at": cull_at}))
            elif kind == _CULL and req.state is State.ADMITTED:
                self._cull(req, t, out)
            elif kind == _EXPIRE and req.state is State.PARKED:
                self._expire(req, t, out)
            elif kind == _LEASE and req.state is State.ADMITTED:
                out += self._end(key, t, "finish", State.FINISHED, "lease expired")
            elif kind == EVICT and req.holds_quota:
                by = self._requests.get(req.preempted_by or "")
                if by is None:  # its preemptor is gone (cannot happen but after bad data)
                    self._victim_left(req)
                else:
                    self._preempt(req, by, t, out)

    def step(self, now: float) -> list[Decision]:
        return self.advance(now) + self.schedule(now)

    # ------------------------------------------------------------------ the cycle

    def schedule(self, now: float) -> list[Decision]:
        """Admission cycles until no head can be admitted; then the scale demand."""
        out: list[Decision] = []
        if not self._dirty:
            # Every head was looked at since the last change and none can go: nothing to
            # do (most instants of a busy day are activity reports that change nothing).
            return out
        heads = self._heads
        wins = self._wins if self._tournament else None
        while True:
            if self._dirty:
                for t in self._dirty:
                    self._looked_at(t)
                    heads.set(t, self._nominate(t))
                self._dirty.clear()
            best = heads.best(wins)
            if best is None:
                break
            if best.epoch != self._epoch:
                # Nominated before the last admission, which may have taken its room (in
                # another cohort, on the same nodes): look again before acting.
                self._looked_at(best.req.tenant)
                fresh = self._nominate(best.req.tenant)
                heads.set(best.req.tenant, fresh)
                if fresh is None or fresh.req is not best.req or fresh.key != best.key:
                    continue
                best = fresh
            self._apply(best, now, out)
        if self._config.policy.autoscale:
            sizes = scale_sizes(
                self._config,
                self._capacity_blocked,
                self._queues,
                self._ledger,
                {rid: (f, self._requests[rid].gpus) for rid, f in self._resume_blocked.items()},
            )
            out += self._scaler.plan(self._config, sizes, now)
        return out

    def _apply(self, e: Entry, now: float, out: list[Decision]) -> None:
        req = e.req
        if e.victims and not self._preempt_or_warn(e, now, out):
            return  # it waits for its warned victims
        if self._graces.waiting(req.id):
            self._withdraw(req, now, out)  # admitted before its victims had to go
        node = self._cluster.best_fit(e.flavor, req.gpus)
        assert node is not None, "nominated without room"
        q = self._queues[req.tenant]
        if e.mode == "resume":
            q.resuming.pop(req.id, None)
            self._ledger.parked[(req.tenant, e.flavor)] -= req.gpus
            self._timers.clear(_EXPIRE, req.id)
            req.park_expires = None
            req.wants_devices = False
        else:
            q.remove(req.id)
            self._ledger.add(req.tenant, e.flavor, req.gpus)
            self._capacity_blocked.pop((req.tenant, (req.flavor, req.gpus)), None)
        self._bind(req, node, e.flavor, now)
        self._epoch += 1
        if e.mode == "resume":
            # Parked, it held quota that no one could take; holding devices again, it is a
            # candidate for preemption: heads that may evict it look again.
            self._wake_preemptors(req.tenant, e.flavor)
        if e.mode == "resume" and req.resumed_from is None:
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
            self._timers.set(_LEASE, req.id, req.lease_expires)
        req.idle_since = None if req.busy else now
        if req.idle_since is not None:
            self._arm_cull(req)

    # ------------------------------------------------------------------ releases

    def _release_devices(self, req: Request, now: float) -> None:
        flavor = req.assigned_flavor or ""
        node = self._cluster.unbind(req.node or "", req.devices, now)
        self._holders.unhold(req, flavor)
        if node is not None and not node.holders:
            self._scaler.arm_scale_down(self._config, node, now)
        req.node = None
        req.devices = ()
        req.idle_since = None
        for kind in (_CULL, _WARN, _LEASE):
            self._timers.clear(kind, req.id)
        req.lease_expires = None
        self._room_freed_in(flavor)

    def _release_quota(self, req: Request) -> None:
        flavor = req.assigned_flavor or ""
        self._ledger.remove(req.tenant, flavor, req.gpus)
        if req.state is State.PARKED:
            self._ledger.parked[(req.tenant, flavor)] -= req.gpus
            self._queues[req.tenant].resuming.pop(req.id, None)
            self._resume_blocked.pop(req.id, None)
            self._timers.clear(_EXPIRE, req.id)
            req.park_expires = None
        self._quota_freed_in(req.tenant, flavor)

    def _end(self, rid: str, now: float, event: str, state: State, reason: str) -> list[Decision]:
        req = self._get(rid)
        if req.state in TERMINAL:
            return []
        out: list[Decision] = []
        if self._graces:
            if req.preempted_by is not None:
                self._victim_left(req)  # ended by itself within its grace
            if self._graces.waiting(rid):
                self._withdraw(req, now, out)
        if req.state is State.QUEUED:
            self._queues[req.tenant].remove(rid)
            self._touch(req.tenant)
        if req.state is State.ADMITTED:
            self._release_devices(req, now)
        if req.holds_quota:
            self._release_quota(req)
        req.state = state
        req.reason = reason
        del self._requests[rid]
        out.append(Decision(now, event, rid, {"reason": reason} if reason else {}))
        return out

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

    def _requeue(self, req: Request, now: float, queue_time: float, out: list[Decision]) -> None:
        req.state = State.QUEUED
        req.queue_time = queue_time
        req.assigned_flavor = None
        req.wants_devices = False
        self._queues[req.tenant].push(req)
        self._touch(req.tenant)
        out.append(Decision(now, "requeue", req.id))

    def _cull(self, req: Request, now: float, out: list[Decision]) -> None:
        ttl = self._tenant_setting(req.tenant, "reservation_ttl")
        self._release_devices(req, now)
        req.culls += 1
        if ttl > 0:
            req.state = State.PARKED
            req.park_expires = now + ttl
            self._ledger.parked[(req.tenant, req.assigned_flavor or "")] += req.gpus
            self._timers.set(_EXPIRE, req.id, req.park_expires)
        else:
            self._release_quota(req)
            req.state = State.CULLED
            if req.preempted_by is not None:
                self._victim_left(req)
        out.append(Decision(now, "cull", req.id, {"parked": ttl > 0}))

    def _expire(self, req: Request, now: float, out: list[Decision]) -> None:
        wanted = req.wants_devices
        self._release_quota(req)
        req.state = State.CULLED
        if req.preempted_by is not None:
            self._victim_left(req)
        out.append(Decision(now, "expire", req.id))
        if wanted:
            self._requeue(req, now, now, out)

    def _take_over(self, old: Request, req: Request, now: float, out: list[Decision]) -> None:
        """A new request of the same user and tenant takes over a parked reservation."""
        q = self._queues[req.tenant]
        q.resuming.pop(old.id, None)
        self._resume_blocked.pop(old.id, None)
        self._timers.clear(_EXPIRE, old.id)
        req.state = State.PARKED
        req.assigned_flavor = old.assigned_flavor
        req.park_expires = old.park_expires
        req.wants_devices = True
        req.resumed_from = old.id
        if req.park_expires is not None:
            self._timers.set(_EXPIRE, req.id, req.park_expires)
        if old.preempted_by is not None:
            self._victim_left(old)
        old.state = State.FINISHED
        old.reason = f"reservation claimed by {req.id}"
        del self._requests[old.id]
        out.append(Decision(now, "finish", old.id, {"reason": old.reason}))
        q.resuming[req.id] = req
        self._touch(req.tenant)

    # ------------------------------------------------------------------ grace (grace.py)

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

    def _victim_left(self, victim: Request) -> None:
        """A warned victim is going (evicted, ended, culled): its preemptor looks again."""
        self._timers.clear(EVICT, victim.id)
        victim.preempt_at = victim.preempted_by = None
        rc = self._graces.victim_gone(victim.id)
        if rc is not None:
            self._wake_reclaim(rc)

    def _withdraw(self, by: Request, now: float, out: list[Decision]) -> None:
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
            bucket = self._queues[by.tenant].buckets.get((by.flavor, by.gpus))
            if bucket is not None:
                bucket.inadmissible = False
            self._strict_blocked.discard(by.tenant)
            self._dirty.add(by.tenant)
        if rc.preemptor not in self._graces.reclaims and by is not None:
            # Its room is no longer kept: who was held back for it looks again.
            self._wake(self._ledger.tree(by.tenant))
