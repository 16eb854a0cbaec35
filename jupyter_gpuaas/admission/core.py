"""The admission core: one state machine that both drivers (gateway, simulator) feed.

Events in (submit, cancel, finish, activity, heartbeat, nodes, time passing), decisions
out (:class:`~jupyter_gpuaas.admission.model.Decision`). Every method takes `now`; the core
never reads a clock. Every method returns the decisions it made, in order; the caller
persists and announces them.

An admission cycle follows Kueue's scheduler, step by step (`schedule`): heads,
snapshot, nominate (nominate.py), order (heads.py), admit or preempt (admit.py), requeue
(waking.py). A head that can neither fit nor preempt marks its bucket inadmissible until
room frees up for its tenant, so an idle queue costs nothing. Releases are releases.py's;
the read-only answers queries.py's. Both drivers call `step(now)` once per batch of
events: the gateway per operation, the simulator per instant.
"""

from __future__ import annotations

from collections import defaultdict

from .admit import Admitting
from .autoscale import READY, SCALE_DOWN, Autoscaler, scale_sizes
from .grace import EVICT, Graces
from .heads import Heads
from .holders import Holders
from .ledger import Ledger
from .model import KINDS, TERMINAL, Config, Decision, Preemption, Request, State, Tenant
from .nodes import Cluster
from .nominate import Entry, Status
from .positions import Parked, Positions
from .queues import BucketKey, TenantQueue
from .timers import CULL, EXPIRE, LEASE, WARN, Timers
from .views import NodeState, Position, TenantUsage

__all__ = ["AdmissionCore", "NodeState", "Position", "TenantUsage"]


class AdmissionCore(Admitting):
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
        self._nominees = self._heads.entries  # waking.py
        self._dirty: set[str] = set()
        self._sleepers: dict[str, set[str]] = defaultdict(set)  # waking.py
        self._strict_blocked: set[str] = set()
        # Bucket heads held back by capacity alone (quota would admit them): scale demand.
        self._capacity_blocked: dict[tuple[str, BucketKey], str] = {}
        # Who to wake when devices of a flavor free up: (tenant, bucket) with quota there (or
        # room by preemption) but no node; bucket None: the tenant (StrictFIFO head, resume).
        self._cap_waiters: dict[str, set[tuple[str, BucketKey | None]]] = defaultdict(set)
        self._short: list[str] = []  # nominate.py
        self._epoch = 0  # bumps whenever quota or devices are taken
        self._by_capacity = False  # nominate.py
        self._preempts: dict[str, bool] = {}  # tenants with any preemption policy
        self._flavors: dict[str, tuple[str, ...]] = {}  # a tenant's flavors, in quota order
        self._specs: dict[str, Tenant] = {}
        self._names: dict[str, str] = {}
        self._tournament = False  # fair sharing in a cohort tree: heads meet level by level
        self._index_policies()
        self._width: dict[str, int] = {}  # widest node per flavor, for rejections
        self._resume_blocked: dict[str, str] = {}  # parked rid -> flavor
        self._scaler = Autoscaler(self._cluster, self._timers)
        self._positions: Positions | None = None  # positions.py: at the first question
        self._parked = Parked()  # parked reservations by user, for take-overs
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
        # A plain dict of the specs: mypyc indexes a dict natively, a Mapping generically.
        self._specs = dict(self._config.tenants)
        # The config's own name objects. A name read from a trace row or a request body is
        # an equal but distinct string, and each dict hit on it compares bytes: requests
        # are given these (`_canonical`), so the tables' keys match by identity.
        self._names = {t.name: t.name for t in self._config.tenants.values()}
        self._names.update({f: f for f in self._config.flavors})
        self._names.update({k: k for k in KINDS})
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

    def submit(self, req: Request, now: float) -> list[Decision]:
        """A request arrives: rejected at once if it can never be admitted, else queued.

        With `policy.take_over_parked` (the gateway), a request of the same user, tenant,
        kind and size as a parked reservation takes that reservation over instead."""
        if req.id in self._requests:
            raise ValueError(f"duplicate request id {req.id!r}")
        out = [
            Decision(
                now, "submit", req.id, {"tenant": req.tenant, "kind": req.kind, "gpus": req.gpus}
            )
        ]
        self._canonical(req)
        req.seq = self._seq = self._seq + 1
        req.queue_time = req.submit_time
        reason = self.never_fits(req)
        if reason:
            req.state = State.REJECTED
            req.reason = reason
            out.append(Decision(now, "reject", req.id, {"reason": reason}))
            return out
        self._requests[req.id] = req
        if self._config.policy.take_over_parked:
            old = self._parked.claimable(req)
            if old is not None:
                self._take_over(old, req, now, out)
                return out
        req.state = State.QUEUED
        self._enqueue(req)
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
                self._timers.clear(CULL, rid)
                self._timers.clear(WARN, rid)
            elif req.idle_since is None:
                req.idle_since = now
                self._arm_cull(req)
        elif req.state is State.PARKED:
            q = self._queues[req.tenant]
            req.wants_devices = busy
            if busy:
                q.resuming[rid] = req
                self._touch(req.tenant)
            elif q.resuming.pop(rid, None) is not None:
                # No longer waiting to resume (served first; it may hold a StrictFIFO queue).
                self._resume_blocked.pop(rid, None)
                self._strict_blocked.discard(req.tenant)
                self._touch(req.tenant)
        elif req.state is State.CULLED and busy:
            self._requeue(req, now, now, out)
        return out

    def heartbeat(self, rid: str, now: float, busy: bool | None = None) -> list[Decision]:
        """A lease renewal from the holder, optionally saying whether it is busy."""
        req = self._get(rid)
        if req.state is State.ADMITTED and self._config.policy.lease_ttl > 0:
            req.lease_expires = now + self._config.policy.lease_ttl
            self._timers.set(LEASE, rid, req.lease_expires)
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
        self._room_freed_in(flavor, node)
        return []

    def restore(self, req: Request, now: float) -> list[Decision]:
        """Put back a request read from the store, in the state it was stored in.

        A grant whose devices are gone (node missing, device taken) ends with a `finish`.
        """
        self._seq = max(self._seq, req.seq)
        out: list[Decision] = []
        if req.state in TERMINAL:
            return out
        self._canonical(req)
        self._requests[req.id] = req
        if req.state is State.QUEUED:
            self._enqueue(req)
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
                self._timers.set(LEASE, req.id, req.lease_expires)
            self._restore_warning(req)
        elif req.state is State.PARKED:
            flavor = req.assigned_flavor or ""
            self._ledger.add(req.tenant, flavor, req.gpus)
            self._ledger.parked[(req.tenant, flavor)] += req.gpus
            self._parked.add(req)
            if req.park_expires is not None:
                self._timers.set(EXPIRE, req.id, req.park_expires)
            if req.wants_devices:
                self._queues[req.tenant].resuming[req.id] = req
                self._touch(req.tenant)
            self._restore_warning(req)
        return out

    def _canonical(self, req: Request) -> None:
        names = self._names
        req.tenant = names.get(req.tenant, req.tenant)
        req.kind = names.get(req.kind, req.kind)
        if req.flavor is not None:
            req.flavor = names.get(req.flavor, req.flavor)
        if req.assigned_flavor is not None:
            req.assigned_flavor = names.get(req.assigned_flavor, req.assigned_flavor)

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
                    self._room_freed_in(node.flavor, node)
                continue
            if kind == SCALE_DOWN:
                gone = self._scaler.scale_down(key, t)
                if gone is not None:
                    out.append(gone)
                continue
            req = self._requests.get(key)
            if req is None:
                continue
            if kind == WARN and req.state is State.ADMITTED:
                cull_at = self._timers.get(CULL, key)
                out.append(Decision(t, "cull_warning", key, {"cull_at": cull_at}))
            elif kind == CULL and req.state is State.ADMITTED:
                self._cull(req, t, out)
            elif kind == EXPIRE and req.state is State.PARKED:
                self._expire(req, t, out)
            elif kind == LEASE and req.state is State.ADMITTED:
                out += self._end(key, t, "finish", State.FINISHED, "lease expired")
            elif kind == EVICT and req.holds_quota:
                by = self._requests.get(req.preempted_by or "")
                if by is None:  # its preemptor is gone (cannot happen but after bad data)
                    self._victim_left(req)
                else:
                    self._preempt(req, by, t, out)

    def look_at_everyone(self) -> None:
        """Wake every head, as if each queue had changed: the next cycle nominates every
        tenant. Slow: the reference the wake-ups are checked against (test_wakes.py)."""
        self._wake(self._config.tenants)

    def step(self, now: float) -> list[Decision]:
        """Both drivers' call per batch of events: the deadlines due by `now`, a cycle."""
        out = self.advance(now)
        if self._dirty:  # (most instants of a replay change no queue: no second list)
            out += self.schedule(now)
        return out

    # ------------------------------------------------------------------ the cycle

    def schedule(self, now: float) -> list[Decision]:
        """Admission cycles in Kueue's steps, until no head can be admitted.

        1. Heads: the tenants whose queue or room changed since they were last nominated
           (`_dirty`); nothing changed, nothing to do.
        2. Snapshot: the core decides on its live state; each entry carries the epoch it
           was nominated at, and one nominated before the last admission (which may have
           taken its room) is nominated again before it is acted on.
        3. Nominate: each changed tenant's best head and how it would go in (nominate.py).
        4. Order: the best of the nominated heads (heads.py; fairshare.py in a tree).
        5. Admit or preempt it (admit.py); then again from 1.
        6. Requeue: the heads that cannot go stay marked inadmissible, asleep until an
           event can change their answer (waking.py); those held back by capacity alone
           are the demand for nodes (autoscale.py).
        """
        out: list[Decision] = []
        if not self._dirty:
            return out
        while True:
            self._nominate_changed(self._changed_heads())  # 1. heads, 3. nominate
            entry = self._first_in_order()  # 4. order
            if entry is None:
                break
            entry = self._still_true(entry)  # 2. snapshot
            if entry is not None:
                self._admit_or_preempt(entry, now, out)  # 5. admit or preempt
        self._requeue_inadmissible(now, out)  # 6. requeue
        return out

    def _changed_heads(self) -> list[str]:
        changed = list(self._dirty)
        self._dirty.clear()
        return changed

    def _nominate_changed(self, tenants: list[str]) -> None:
        for t in tenants:
            self._looked_at(t)
            self._heads.set(t, self._nominate(t))

    def _first_in_order(self) -> Entry | None:
        return self._heads.best(self._bracket if self._tournament else None)

    def _still_true(self, e: Entry) -> Entry | None:
        """The entry, or its fresh nomination if it predates the last admission; None
        when that changed the head or how it goes in (the cycle looks again)."""
        if e.epoch == self._epoch:
            return e
        e.status = Status.SKIPPED
        tenant = e.req.tenant
        self._looked_at(tenant)
        fresh = self._nominate(tenant)
        self._heads.set(tenant, fresh)
        if fresh is None or fresh.req is not e.req or fresh.key != e.key:
            return None
        return fresh

    def _requeue_inadmissible(self, now: float, out: list[Decision]) -> None:
        if not self._config.policy.autoscale:
            return
        resuming = {rid: (f, self._requests[rid].gpus) for rid, f in self._resume_blocked.items()}
        blocked = self._capacity_blocked
        sizes = scale_sizes(
            self._config, blocked, self._queues, self._ledger, self._cluster, resuming
        )
        out += self._scaler.plan(self._config, sizes, now)
