"""The admission core: one state machine that both drivers (gateway, simulator) feed.

Events in (submit, cancel, finish, activity, heartbeat, nodes, time passing), decisions
out (:class:`~jupyter_gpuaas.admission.model.Decision`). Every method takes `now`; the core
never reads a clock. Every method returns the decisions it made, in order; the caller
persists and announces them.

`AdmissionCore` is composed as Kueue's `Scheduler` is: it holds its collaborators as
named fields, each a class with its own state in its own module, and drives them.
- the configuration as they read it (`Policies`, policies.py) and the live requests;
- the quota ledger (ledger.py), the nodes (nodes.py), the preemption candidates
  (holders.py), the timers (timers.py), warned victims (grace.py), the autoscaler
  (autoscale.py) and the parked reservations (positions.py `Parked`);
- the queues (`Queues`, queueing.py): every tenant's queue and who changed;
- nomination (`Nomination`, nominate.py) and the nominated heads (heads.py);
- preemption (`Preemptor`, preemptor.py; the victims are preemption.py's);
- waking (`Waking`, waking.py): who looks again when quota or devices free up;
- releases (`Releases`, releases.py): what a request gives back when it goes;
- the views (`Queries`, queries.py): what the drivers read without deciding.

An admission cycle follows Kueue's scheduler, step by step (`schedule`): heads, snapshot,
nominate, order, admit or preempt, requeue. A head that can neither fit nor preempt marks
its bucket inadmissible until room frees up for its tenant, so an idle queue costs
nothing. Both drivers call `step(now)` once per batch of events: the gateway per
operation, the simulator per instant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from .autoscale import READY, SCALE_DOWN, Autoscaler, scale_sizes
from .grace import EVICT, Graces
from .heads import Heads
from .holders import Holders
from .ledger import Ledger
from .model import TERMINAL, Config, Decision, Request, State
from .nodes import Cluster, Node
from .nominate import Entry, Mode, Nomination, Status
from .policies import Policies
from .positions import Parked
from .preemptor import Preemptor
from .queries import Queries
from .queueing import Queues
from .releases import Releases
from .timers import CULL, EXPIRE, LEASE, WARN, Timers
from .views import NodeState, Position, TenantUsage
from .waking import Waking

__all__ = ["AdmissionCore", "NodeState", "Position", "TenantUsage"]


class AdmissionCore:
    """The decision core. It starts with `Flavor.nodes` nodes of each flavor, named
    `<flavor>-<n>` as in the simulator; a driver whose nodes come from an inventory passes
    flavors with `nodes=0` and calls :meth:`add_node` for each node it really has."""

    def __init__(self, config: Config) -> None:
        self._policies = Policies(config)
        self._ledger = Ledger(config)
        self._cluster = Cluster()
        self._timers = Timers()
        self._graces = Graces()  # warned victims and the preemptors waiting for them
        self._requests: dict[str, Request] = {}  # the live requests, by id
        self._holders = Holders(self._ledger, self._cluster)  # preemption candidates
        self._holders.reconfigure(config)
        self._scaler = Autoscaler(self._cluster, self._timers)
        self._parked = Parked()  # parked reservations by user, for take-overs
        self._queues = Queues(config.tenants)
        self._heads = Heads()  # the nominated heads, of tenants that have one
        self._waking = Waking(
            self._policies,
            self._ledger,
            self._cluster,
            self._holders,
            self._queues,
            self._heads.entries,
        )
        self._nomination = Nomination(
            self._policies,
            self._ledger,
            self._cluster,
            self._holders,
            self._graces,
            self._requests,
            self._queues,
            self._waking,
        )
        self._releases = Releases(
            self._policies,
            self._ledger,
            self._cluster,
            self._timers,
            self._holders,
            self._scaler,
            self._parked,
            self._graces,
            self._requests,
            self._queues,
            self._waking,
            self._nomination,
        )
        self._preemptor = Preemptor(self._policies, self._timers, self._graces, self._releases)
        self._queries = Queries(
            self._policies,
            self._ledger,
            self._cluster,
            self._holders,
            self._scaler,
            self._graces,
            self._requests,
            self._queues,
        )
        self._seq = 0  # the last arrival number given
        for f in config.flavors.values():
            for i in range(f.nodes):
                self._cluster.add(f.name, f"{f.name}-{i}", f.gpus_per_node)

    # ------------------------------------------------------------------ configuration

    @property
    def config(self) -> Config:
        return self._policies.config

    def update_config(self, config: Config, now: float) -> list[Decision]:
        """Adopt new quotas and policy. Nobody is evicted; queues are looked at again."""
        gone = {r.tenant for r in self._requests.values()} - set(config.tenants)
        if gone:
            raise ValueError(f"tenants still have requests: {', '.join(sorted(gone))}")
        self._ledger.reconfigure(config)
        self._policies.reindex(config)
        self._holders.reconfigure(config)
        self._queries.forget_widths()
        self._queues.add_tenants(config.tenants)
        self._queues.wake(config.tenants)
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
        self._policies.canonical(req)
        req.seq = self._seq = self._seq + 1
        req.queue_time = req.submit_time
        reason = self._queries.never_fits(req)
        if reason:
            req.state = State.REJECTED
            req.reason = reason
            out.append(Decision(now, "reject", req.id, {"reason": reason}))
            return out
        self._requests[req.id] = req
        if self._policies.config.policy.take_over_parked:
            old = self._parked.claimable(req)
            if old is not None:
                self._releases.take_over(old, req, now, out)
                return out
        req.state = State.QUEUED
        self._queues.enqueue(req)
        return out

    def cancel(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        """The user cancels: whatever the request holds is released."""
        return self._releases.end(rid, now, "cancel", State.CANCELLED, reason)

    def finish(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        """The holder is done (or gone): devices and quota are released."""
        return self._releases.end(rid, now, "finish", State.FINISHED, reason)

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
            q = self._queues.tenants[req.tenant]
            req.wants_devices = busy
            if busy:
                q.resuming[rid] = req
                self._queues.touch(req.tenant)
            elif q.resuming.pop(rid, None) is not None:
                # No longer waiting to resume (served first; it may hold a StrictFIFO queue).
                self._nomination.resume_blocked.pop(rid, None)
                self._queues.strict_blocked.discard(req.tenant)
                self._queues.touch(req.tenant)
        elif req.state is State.CULLED and busy:
            self._queues.requeue(req, now, now, out)
        return out

    def heartbeat(self, rid: str, now: float, busy: bool | None = None) -> list[Decision]:
        """A lease renewal from the holder, optionally saying whether it is busy."""
        req = self._get(rid)
        ttl = self._policies.config.policy.lease_ttl
        if req.state is State.ADMITTED and ttl > 0:
            req.lease_expires = now + ttl
            self._timers.set(LEASE, rid, req.lease_expires)
        if busy is None:
            return []
        return self.activity(rid, busy, now)

    def extend_leases(self, by: float) -> list[Request]:
        """The driver could not act for `by` seconds (it stalled, or its store did not
        answer): every live lease moves `by` later, so that time never counts against a
        holder (as etcd's lessor does on promotion). The requests whose leases moved."""
        moved: list[Request] = []
        if by <= 0:
            return moved
        for req in self._requests.values():
            if req.state is State.ADMITTED and req.lease_expires is not None:
                req.lease_expires += by
                self._timers.set(LEASE, req.id, req.lease_expires)
                moved.append(req)
        return moved

    def add_node(
        self, flavor: str, name: str, gpus: int, now: float, *, autoscaled: bool = False
    ) -> list[Decision]:
        """A node joined (from the driver's inventory).

        `autoscaled` nodes are removed again after `scale_down_after` without holders,
        as if the core had asked for them (the gateway restores simulated scale-ups so).
        """
        node = self._cluster.add(flavor, name, gpus, autoscaled=autoscaled)
        self._queries.forget_widths(flavor)
        node.empty_since = now
        self._scaler.joined(flavor, name)
        self._scaler.arm_scale_down(self._policies.config, node, now)
        self._waking.room_freed_in(flavor, node)
        return []

    def remove_node(self, name: str, now: float) -> list[Decision]:
        """A node left: whoever held its devices loses them (releases.py `node_left`)."""
        node = self._cluster.nodes.get(name)
        if node is None:
            return []
        out = self._releases.node_left(node, now)
        self._queries.forget_widths(node.flavor)
        return out

    def restore(self, req: Request, now: float) -> list[Decision]:
        """Put back a request read from the store, in the state it was stored in.

        A grant whose devices are gone (node missing, device taken) ends with a `finish`.
        """
        self._seq = max(self._seq, req.seq)
        out: list[Decision] = []
        if req.state in TERMINAL:
            return out
        self._policies.canonical(req)
        self._requests[req.id] = req
        if req.state is State.QUEUED:
            self._queues.enqueue(req)
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
            self._preemptor.restore_warning(req)
        elif req.state is State.PARKED:
            flavor = req.assigned_flavor or ""
            self._ledger.add(req.tenant, flavor, req.gpus)
            self._ledger.parked[(req.tenant, flavor)] += req.gpus
            self._parked.add(req)
            if req.park_expires is not None:
                self._timers.set(EXPIRE, req.id, req.park_expires)
            if req.wants_devices:
                self._queues.tenants[req.tenant].resuming[req.id] = req
                self._queues.touch(req.tenant)
            self._preemptor.restore_warning(req)
        return out

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
                node = self._scaler.node_ready(self._policies.config, key, t)
                if node is not None:
                    out.append(
                        Decision(t, "node_ready", None, {"flavor": node.flavor, "node": key})
                    )
                    self._waking.room_freed_in(node.flavor, node)
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
                self._releases.cull(req, t, out)
            elif kind == EXPIRE and req.state is State.PARKED:
                self._releases.expire(req, t, out)
            elif kind == LEASE and req.state is State.ADMITTED:
                out += self._releases.end(key, t, "finish", State.FINISHED, "lease expired")
            elif kind == EVICT and req.holds_quota:
                by = self._requests.get(req.preempted_by or "")
                if by is None:  # its preemptor is gone (cannot happen but after bad data)
                    self._releases.victim_left(req)
                else:
                    self._releases.evict(req, by, t, out)

    def look_at_everyone(self) -> None:
        """Wake every head, as if each queue had changed: the next cycle nominates every
        tenant. Slow: the reference the wake-ups are checked against (test_wakes.py)."""
        self._queues.wake(self._policies.config.tenants)

    def step(self, now: float) -> list[Decision]:
        """Both drivers' call per batch of events: the deadlines due by `now`, a cycle."""
        out = self.advance(now)
        if self._queues.dirty:  # (most instants of a replay change no queue: no second list)
            out += self.schedule(now)
        return out

    # ------------------------------------------------------------------ the cycle

    def schedule(self, now: float) -> list[Decision]:
        """Admission cycles in Kueue's steps, until no head can be admitted.

        1. Heads: the tenants whose queue or room changed since they were last nominated
           (the queues' `dirty`); nothing changed, nothing to do.
        2. Snapshot: the core decides on its live state; each entry carries the epoch it
           was nominated at, and one nominated before the last admission (which may have
           taken its room) is nominated again before it is acted on.
        3. Nominate: each changed tenant's best head and how it would go in (nomination).
        4. Order: the best of the nominated heads (heads.py; fairshare.py in a tree).
        5. Admit or preempt it (the preemptor, then `_admit`); then again from 1. With
           `one_head_per_cycle`, its tenant has had its turn: its next head waits until
           no other tenant's head can go, and a new cycle begins (Kueue's one head per
           ClusterQueue, heads.py); and quota that a preemption frees wakes the sleeping
           heads of BestEffortFIFO queues only once no awake head can go (waking.py).
        6. Requeue: the heads that cannot go stay marked inadmissible, asleep until an
           event can change their answer (waking); those held back by capacity alone
           are the demand for nodes (autoscale.py).
        """
        out: list[Decision] = []
        if not self._queues.dirty:
            return out
        turns = self._policies.turns
        self._waking.defer = turns
        while True:
            self._nominate_changed(self._queues.changed())  # 1. heads, 3. nominate
            entry = self._first_in_order()  # 4. order
            if entry is None:
                if self._heads.next_cycle():  # the tenants that went may go again
                    continue
                if turns and self._waking.wake_deferred():  # Kueue's requeue batch
                    continue
                break
            entry = self._still_true(entry)  # 2. snapshot
            if entry is not None:
                self._admit_or_preempt(entry, now, out)  # 5. admit or preempt
                if self._policies.turns and entry.mode is not Mode.RESUME:
                    # One turn per tenant per cycle, as Kueue takes one head per
                    # ClusterQueue (heads.py); a resume takes no quota, so no turn.
                    self._heads.had_turn(entry.req.tenant)
        self._waking.defer = False
        self._requeue_inadmissible(now, out)  # 6. requeue
        return out

    def _nominate_changed(self, tenants: list[str]) -> None:
        for t in tenants:
            self._waking.looked_at(t)
            self._set_head(t, self._nomination.nominate(t))

    def _set_head(self, tenant: str, entry: Entry | None) -> None:
        self._heads.set(tenant, entry)
        if entry is not None and self._nomination.lost:
            # (Only counted with `one_head_per_cycle`.) Each request ahead of the head
            # that cannot go takes the tenant's turn of one cycle in Kueue.
            self._heads.wait(tenant, self._nomination.lost)

    def _first_in_order(self) -> Entry | None:
        return self._heads.best(self._nomination.bracket if self._policies.tournament else None)

    def _still_true(self, e: Entry) -> Entry | None:
        """The entry, or its fresh nomination if it predates the last admission; None
        when that changed the head or how it goes in (the cycle looks again)."""
        if e.epoch == self._nomination.epoch:
            return e
        e.status = Status.SKIPPED
        tenant = e.req.tenant
        self._waking.looked_at(tenant)
        fresh = self._nomination.nominate(tenant)
        self._set_head(tenant, fresh)
        if self._policies.turns:
            # Kueue's cycle ordered its heads once, at its start, and admits each in turn
            # that still fits as nominated (a changed rank does not matter); one that no
            # longer does is skipped ("no longer fits after processing another
            # workload"), and its ClusterQueue's turn of this cycle is spent.
            if (
                fresh is None
                or fresh.req is not e.req
                or fresh.flavor != e.flavor
                or fresh.mode is not e.mode
            ):
                self._heads.had_turn(tenant)
                return None
            return fresh
        if fresh is None or fresh.req is not e.req or fresh.key != e.key:
            return None
        return fresh

    def _admit_or_preempt(self, e: Entry, now: float, out: list[Decision]) -> None:
        """Step 5: an entry in mode PREEMPT first evicts its victims (jobs and victims
        without grace at once) or warns them (servers and kernels with
        `preemption_grace`): warned, the head waits for them and keeps its room. Then the
        head is bound to the best-fit node."""
        req = e.req
        if e.victims and not self._preemptor.issue(req, e.flavor, e.key, e.victims, now, out):
            self._nomination.taken()  # the warned victims' room is promised
            self._queues.touch(req.tenant)
            e.status = Status.WAITING  # for its warned victims
            return
        if self._graces.waiting(req.id):
            self._releases.withdraw(req, now, out)  # admitted before its victims had to go
        node = self._cluster.best_fit(e.flavor, req.gpus)
        assert node is not None, "nominated without room"
        resume = e.mode is Mode.RESUME
        if resume:
            self._queues.tenants[req.tenant].resuming.pop(req.id, None)
            self._ledger.parked[(req.tenant, e.flavor)] -= req.gpus
            self._parked.discard(req)
            self._timers.clear(EXPIRE, req.id)
            req.park_expires = None
            req.wants_devices = False
        else:
            self._queues.dequeue(req)
            self._ledger.add(req.tenant, e.flavor, req.gpus)
            self._nomination.capacity_blocked.pop((req.tenant, (req.flavor, req.gpus)), None)
        self._bind(req, node, e.flavor, now)
        if not resume:  # a hold begins (a resume, or a claim, goes on with one)
            req.held_since, req.culls = now, 0
        e.status = Status.ASSUMED
        self._nomination.taken()
        if resume or self._ledger.borrowed(req.tenant, e.flavor):
            # Parked, it held quota that no one could take; holding devices again, it is a
            # candidate for preemption. Or its tenant borrows, now more than before, and
            # the cohort may reclaim as much as it borrows (Kueue's reclaimWithinCohort
            # and borrowWithinCohort). Either way, heads that may evict look again.
            self._waking.wake_preemptors(req.tenant, e.flavor)
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
        self._queues.touch(req.tenant)

    def _bind(self, req: Request, node: Node, flavor: str, now: float) -> None:
        req.devices = node.free_devices(req.gpus)
        self._cluster.bind(node, req.id, req.devices)
        self._timers.clear(SCALE_DOWN, node.name)
        req.node = node.name
        req.assigned_flavor = flavor
        req.state = State.ADMITTED
        req.admit_time = now
        self._holders.hold(req, flavor)
        ttl = self._policies.config.policy.lease_ttl
        if ttl > 0:
            req.lease_expires = now + ttl
            self._timers.set(LEASE, req.id, req.lease_expires)
        req.idle_since = None if req.busy else now
        if req.idle_since is not None:
            self._arm_cull(req)

    def _requeue_inadmissible(self, now: float, out: list[Decision]) -> None:
        config = self._policies.config
        if not config.policy.autoscale:
            return
        nomination = self._nomination
        resuming = {
            rid: (f, self._requests[rid].gpus) for rid, f in nomination.resume_blocked.items()
        }
        blocked = nomination.capacity_blocked
        sizes = scale_sizes(
            config, blocked, self._queues.tenants, self._ledger, self._cluster, resuming
        )
        out += self._scaler.plan(config, sizes, now)

    # ------------------------------------------------------------------ idle policy

    def _arm_cull(self, req: Request) -> None:
        if req.idle_since is None:
            return
        times = self._policies.cull_times(req, req.idle_since)
        if times is None:
            return
        cull_at, warn_at = times
        self._timers.set(CULL, req.id, cull_at)
        if warn_at is not None:
            self._timers.set(WARN, req.id, warn_at)

    def idle_deadline(self, rid: str, idle_since: float) -> float:
        """The first time the core would act on the holder of `rid` if it went idle at
        `idle_since` and stayed so: its cull warning, else its cull (inf: never culled).
        A holder busy again before it has changed nothing the core decides on; the
        simulator's driver uses this to leave such short idle spells unsaid."""
        times = self._policies.cull_times(self._get(rid), idle_since)
        if times is None:
            return math.inf
        cull_at, warn_at = times
        return cull_at if warn_at is None else warn_at

    # ------------------------------------------------------------------ questions

    def _get(self, rid: str) -> Request:
        req = self._requests.get(rid)
        if req is None:
            raise KeyError(rid)
        return req

    def get(self, rid: str) -> Request | None:
        return self._requests.get(rid)

    def live_requests(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def waiting_for(self, rid: str) -> tuple[str, dict[str, Any]] | None:
        """Why a queued request waits, as nomination left it: (kind, details), kind one of
        "quota", "capacity", "fifo" (reasons.py); None unless it is queued and nomination
        has found its head inadmissible."""
        req = self._requests.get(rid)
        if req is None or req.state is not State.QUEUED:
            return None
        return self._nomination.waiting_for(req, self._queries.provisioning())

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be admitted ('' if it can), in words for its user."""
        return self._queries.never_fits(req)

    def position(self, rid: str) -> Position | None:
        """1-based place of a queued request in its tenant's queue and among all queued."""
        return self._queries.position(rid)

    def admitted(self) -> Iterable[Request]:
        """The admitted requests (the running grants), in the order they were bound."""
        return self._queries.admitted()

    def tenant_usage(self) -> list[TenantUsage]:
        return self._queries.tenant_usage()

    def nodes(self) -> list[NodeState]:
        return self._queries.nodes()

    def desired_nodes(self) -> dict[str, int]:
        """Nodes per flavor the queue asks for: ready, coming, and still to ask for."""
        return self._queries.desired_nodes()

    def provisioning(self) -> dict[str, dict[str, float]]:
        """Nodes on their way, by flavor: name -> time they will be ready."""
        return self._queries.provisioning()

    def reclaiming(self, rid: str) -> list[Request]:
        """The warned victims a queued preemptor waits for (empty if none)."""
        return self._queries.reclaiming(rid)
