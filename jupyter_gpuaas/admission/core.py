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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import views
from .autoscale import READY, SCALE_DOWN, Autoscaler
from .ledger import Ledger
from .model import TERMINAL, Config, Decision, Preemption, Request, State
from .nodes import Cluster, Node
from .preemption import find_victims
from .queues import Bucket, BucketKey, TenantQueue, order_key
from .timers import Timers
from .views import NodeState, Position, TenantUsage

__all__ = ["AdmissionCore", "NodeState", "Position", "TenantUsage"]

# Timer kinds (the autoscaler has two more).
_CULL, _WARN, _EXPIRE, _LEASE = "cull", "cull_warning", "expire", "lease"


@dataclass
class _Entry:
    """A nominated head: how its tenant's best candidate would be admitted right now."""

    req: Request
    mode: str  # "fit" | "preempt" | "resume"
    flavor: str
    borrowing: bool
    victims: list[Request] = field(default_factory=list)
    key: tuple[Any, ...] = ()
    epoch: int = 0  # the core's epoch when nominated: unchanged means still true


class AdmissionCore:
    """The decision core. It starts with `Flavor.nodes` nodes of each flavor, named
    `<flavor>-<n>` as in the simulator; a driver whose nodes come from an inventory passes
    flavors with `nodes=0` and calls :meth:`add_node` for each node it really has."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._ledger = Ledger(config)
        self._cluster = Cluster()
        self._timers = Timers()
        self._requests: dict[str, Request] = {}
        self._queues: dict[str, TenantQueue] = {t: TenantQueue() for t in config.tenants}
        # Device holders per (tenant, flavor), and their GPUs per priority: the candidates
        # of a preemption search, and a quick bound on what one could achieve.
        self._holding: dict[tuple[str, str], dict[str, Request]] = defaultdict(dict)
        self._held_by_priority: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
        self._entries: dict[str, _Entry | None] = {}
        self._dirty: set[str] = set()
        self._strict_blocked: set[str] = set()
        # Bucket heads held back by capacity alone (quota would admit them): scale demand.
        self._capacity_blocked: dict[tuple[str, BucketKey], str] = {}
        # Who to wake when devices of a flavor free up: (tenant, bucket) blocked by capacity
        # there; bucket None for the tenant itself (StrictFIFO head, waiting resume).
        self._cap_waiters: dict[str, set[tuple[str, BucketKey | None]]] = defaultdict(set)
        self._epoch = 0  # bumps whenever quota or devices are taken
        self._preempts: dict[str, bool] = {}  # tenants with any preemption policy
        # Preemption bounds per (tenant, flavor, priority), with the versions of the pool
        # they were computed at: usage (the ledger's) and holders (`_held_version`) in the
        # tenant's cohort and that flavor. Nothing else changes them but free devices,
        # which are added at each lookup.
        self._bounds: dict[tuple[str, str, int], tuple[int, int, int, int, bool, list[str]]] = {}
        self._held_version: dict[tuple[str, str], int] = defaultdict(int)
        self._pool: dict[str, str] = {}  # tenant -> its cohort, or itself without one
        self._flavors: dict[str, tuple[str, ...]] = {}  # a tenant's flavors, in quota order
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
        self._pool = {t.name: t.cohort or t.name for t in self._config.tenants.values()}

    def update_config(self, config: Config, now: float) -> list[Decision]:
        """Adopt new quotas and policy. Nobody is evicted; queues are looked at again."""
        gone = {r.tenant for r in self._requests.values()} - set(config.tenants)
        if gone:
            raise ValueError(f"tenants still have requests: {', '.join(sorted(gone))}")
        self._config = config
        self._ledger.reconfigure(config)
        self._index_policies()
        self._bounds.clear()
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

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be admitted ('' if it can), in words for its user."""
        tenant = self._config.tenants.get(req.tenant)
        if tenant is None:
            return f"unknown tenant {req.tenant!r}"
        if req.gpus < 1:
            return "a request needs at least one GPU"
        if req.flavor is not None:
            if req.flavor not in self._config.flavors:
                return f"unknown flavor {req.flavor!r}"
            if req.flavor not in tenant.quota:
                return f"tenant {tenant.name!r} has no quota for flavor {req.flavor!r}"
            flavors = [req.flavor]
        else:
            flavors = [f for f in tenant.quota if f in self._config.flavors]
            if not flavors:
                return f"tenant {tenant.name!r} has no quota for any flavor"
        widest = 0
        most = 0
        for f in flavors:
            width = self._node_width(f)
            hold = self._ledger.max_hold(tenant.name, f)
            if req.gpus <= width and req.gpus <= hold:
                return ""
            widest = max(widest, width)
            most = max(most, hold)
        names = "/".join(flavors)
        if req.gpus > widest:
            return f"{req.gpus} GPUs do not fit on one node ({names} nodes have at most {widest})"
        return (
            f"{req.gpus} GPUs are more than tenant {tenant.name!r} can ever hold"
            f" of {names} ({most})"
        )

    def _node_width(self, flavor: str) -> int:
        """The most GPUs one node of the flavor has, or could have once scaled up."""
        widest = self._width.get(flavor)
        if widest is None:
            widest = max((n.gpus for n in self._cluster.of(flavor)), default=0)
            spec = self._config.flavors.get(flavor)
            if spec is not None and (spec.nodes > 0 or flavor in self._config.policy.autoscale):
                widest = max(widest, spec.gpus_per_node)
            self._width[flavor] = widest
        return widest

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
            self._hold(req, flavor)
            if req.idle_since is not None:
                self._arm_cull(req)
            if req.lease_expires is not None:
                self._timers.set(_LEASE, req.id, req.lease_expires)
        elif req.state is State.PARKED:
            flavor = req.assigned_flavor or ""
            self._ledger.add(req.tenant, flavor, req.gpus)
            self._ledger.parked[(req.tenant, flavor)] += req.gpus
            if req.park_expires is not None:
                self._timers.set(_EXPIRE, req.id, req.park_expires)
            if req.wants_devices:
                self._queues[req.tenant].resuming[req.id] = req
                self._touch(req.tenant)
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
        entries = self._entries
        while True:
            if self._dirty:
                for t in self._dirty:
                    entries[t] = self._nominate(t)
                self._dirty.clear()
            best: _Entry | None = None
            for e in entries.values():
                if e is not None and (best is None or e.key < best.key):
                    best = e
            if best is None:
                break
            if best.epoch != self._epoch:
                # Nominated before the last admission, which may have taken its room (in
                # another cohort, on the same nodes): look again before acting.
                fresh = self._nominate(best.req.tenant)
                entries[best.req.tenant] = fresh
                if fresh is None or fresh.req is not best.req or fresh.key != best.key:
                    continue
                best = fresh
            self._apply(best, now, out)
        if self._config.policy.autoscale:
            self._scale_demand(now, out)
        return out

    def _nominate(self, tenant: str) -> _Entry | None:
        q = self._queues[tenant]
        spec = self._config.tenants[tenant]
        for req in sorted(q.resuming.values(), key=order_key) if q.resuming else ():
            flavor = req.assigned_flavor or ""
            if self._cluster.widest_gap(flavor) >= req.gpus:
                self._resume_blocked.pop(req.id, None)
                key = (0, order_key(req))
                return _Entry(req, "resume", flavor, False, key=key, epoch=self._epoch)
            self._resume_blocked[req.id] = flavor
            self._cap_waiters[flavor].add((tenant, None))
            if spec.queueing == "StrictFIFO":
                return None
        if spec.queueing == "StrictFIFO":
            if tenant in self._strict_blocked:
                return None
            head = q.first()
            if head is None:
                return None
            entry = self._try(head, strict=True)
            if entry is None:
                self._strict_blocked.add(tenant)
            return entry
        # A head that fails by quota (not capacity) and cannot preempt condemns every later
        # head with the same flavor choice, as many GPUs or more and no higher priority:
        # they would fail the same checks, so they are marked without being tried.
        failed: list[tuple[str | None, int, int]] = []
        for _, bucket, req in q.heads():
            if any(f == req.flavor and req.gpus >= g and req.priority <= p for f, g, p in failed):
                bucket.inadmissible = True
                continue
            entry = self._try(req, bucket.key)
            if entry is not None:
                return entry
            bucket.inadmissible = True
            if (tenant, bucket.key) not in self._capacity_blocked:
                failed.append((req.flavor, req.gpus, req.priority))
        return None

    def _try(
        self, req: Request, bkey: BucketKey | None = None, strict: bool = False
    ) -> _Entry | None:
        tenant = req.tenant
        flavors = (req.flavor,) if req.flavor else self._flavors[tenant]
        ledger = self._ledger
        gap = self._cluster.widest_gap
        borrowing_choice: str | None = None
        capacity_flavors: list[str] = []
        for f in flavors:
            if not ledger.fits(tenant, f, req.gpus):
                continue
            if gap(f) < req.gpus:
                capacity_flavors.append(f)
                continue
            if not ledger.borrows(tenant, f, req.gpus):
                return self._entry(req, "fit", f, False)
            borrowing_choice = borrowing_choice or f
        if borrowing_choice is not None:
            return self._entry(req, "fit", borrowing_choice, True)
        if not self._preempts[tenant]:
            flavors = ()
        for f in flavors:
            holding = self._victim_pool(req, f)
            if not holding:
                continue
            spec = self._config.tenants[tenant]
            victims = find_victims(req, spec, f, ledger, self._cluster, holding)
            if victims is not None:
                own = sum(v.gpus for v in victims if v.tenant == req.tenant)
                borrowing = ledger.borrows(req.tenant, f, req.gpus, own)
                return self._entry(req, "preempt", f, borrowing, victims)
        key = (req.tenant, bkey if bkey is not None else (req.flavor, req.gpus))
        if capacity_flavors:
            self._capacity_blocked[key] = capacity_flavors[0]
            waiter = (req.tenant, None if strict else key[1])
            for f in capacity_flavors:
                self._cap_waiters[f].add(waiter)
        else:
            self._capacity_blocked.pop(key, None)
        return None

    def _entry(
        self,
        req: Request,
        mode: str,
        flavor: str,
        borrowing: bool,
        victims: list[Request] | None = None,
    ) -> _Entry:
        share = 0.0
        if borrowing and self._config.policy.fair_sharing:
            share = self._ledger.share(req.tenant)
        key = (1, borrowing, share, *order_key(req))
        return _Entry(req, mode, flavor, borrowing, victims or [], key, self._epoch)

    def _hold(self, req: Request, flavor: str) -> None:
        self._held_version[(self._pool[req.tenant], flavor)] += 1
        self._holding[(req.tenant, flavor)][req.id] = req
        by_prio = self._held_by_priority[(req.tenant, flavor)]
        by_prio[req.priority] = by_prio.get(req.priority, 0) + req.gpus

    def _unhold(self, req: Request, flavor: str) -> None:
        if self._holding[(req.tenant, flavor)].pop(req.id, None) is not None:
            self._held_version[(self._pool[req.tenant], flavor)] += 1
            by_prio = self._held_by_priority[(req.tenant, flavor)]
            left = by_prio[req.priority] - req.gpus
            if left:
                by_prio[req.priority] = left
            else:
                del by_prio[req.priority]

    def _victim_pool(self, req: Request, flavor: str) -> list[Request]:
        """Requests holding `flavor` that the preemption policy could ever evict for `req`:
        its own tenant's (unless within_tenant is Never) and those of cohort members above
        their nominal quota (unless the cohort policies are Never).

        Empty when even evicting all of them could not make room: most failing searches
        end on that bound, computed from GPUs held per priority, without a candidate list.
        """
        bound = self._preemption_bound(req.tenant, flavor, req.gpus, req.priority)
        if bound is None:
            return []
        own, others = bound
        pool: list[Request] = []
        if own:
            held = self._holding[(req.tenant, flavor)].values()
            pool += [v for v in held if v.priority <= req.priority]
        for name in others:
            pool += self._holding[(name, flavor)].values()
        return pool

    def _preemption_bound(
        self, tenant: str, flavor: str, gpus: int, prio: int
    ) -> tuple[bool, list[str]] | None:
        """Could evicting every candidate make room for `gpus` at priority `prio`? If so:
        whether the tenant's own requests are candidates, and which members' are.

        What bounds such an eviction is kept per (tenant, flavor, priority) until usage
        or holders change in that cohort and flavor: between two changes, wakes and tries
        of many heads ask the same question.
        """
        most, own, others = self._bound(tenant, flavor, prio)
        if gpus > most:
            return None
        return own, others

    def _bound(self, tenant: str, flavor: str, prio: int) -> tuple[int, bool, list[str]]:
        """The most GPUs an eviction could make room for, and the candidates' owners."""
        pool = (self._pool[tenant], flavor)
        usage_v = self._ledger.pool_version[pool]
        held_v = self._held_version[pool]
        key = (tenant, flavor, prio)
        cached = self._bounds.get(key)
        if cached is None or cached[0] != usage_v or cached[1] != held_v:
            cached = (usage_v, held_v, *self._preemption_room(tenant, flavor, prio))
            self._bounds[key] = cached
        # Victims' devices plus the free ones, and no more than quota allows.
        return min(cached[2] + self._cluster.free_in(flavor), cached[3]), cached[4], cached[5]

    def _preemption_room(
        self, tenant: str, flavor: str, prio: int
    ) -> tuple[int, int, bool, list[str]]:
        """GPUs held by every candidate, room in quota once they are gone, whether any
        candidate is the tenant's own, and which members' are candidates."""
        spec = self._config.tenants[tenant]
        p = spec.preemption
        ledger = self._ledger
        own_gpus = 0
        if p.within_tenant != "Never":
            equal_too = p.within_tenant == "LowerOrNewerEqualPriority"
            for q, held in self._held_by_priority[(tenant, flavor)].items():
                if q < prio or (q == prio and equal_too):
                    own_gpus += held
        others: list[str] = []
        removed: dict[str, int] = {tenant: own_gpus}
        if spec.cohort and (
            p.reclaim_within_cohort != "Never" or p.borrow_within_cohort != "Never"
        ):
            anyone = p.reclaim_within_cohort == "Any"
            usage = ledger.usage
            for name in ledger.members[spec.cohort]:
                if name == tenant or usage[(name, flavor)] <= ledger.nominal(name, flavor):
                    continue  # not borrowing: none of its requests can be reclaimed
                by_prio = self._held_by_priority[(name, flavor)]
                held = sum(g for q, g in by_prio.items() if anyone or q < prio)
                if held:
                    # All of it, not just what it borrowed: the last victim may overshoot.
                    others.append(name)
                    removed[name] = held
        if not own_gpus and not others:
            return 0, 0, False, others
        borrow_ok = p.borrow_within_cohort != "Never"
        room = ledger.room(tenant, flavor, removed, borrow_ok)
        return sum(removed.values()), room, own_gpus > 0, others

    def _apply(self, e: _Entry, now: float, out: list[Decision]) -> None:
        req = e.req
        for v in e.victims:
            self._preempt(v, req, now, out)
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
        self._hold(req, flavor)
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
        self._unhold(req, flavor)
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
        return [Decision(now, event, rid, {"reason": reason} if reason else {})]

    def _preempt(self, victim: Request, by: Request, now: float, out: list[Decision]) -> None:
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
        out.append(Decision(now, "cull", req.id, {"parked": ttl > 0}))

    def _expire(self, req: Request, now: float, out: list[Decision]) -> None:
        wanted = req.wants_devices
        self._release_quota(req)
        req.state = State.CULLED
        out.append(Decision(now, "expire", req.id))
        if wanted:
            self._requeue(req, now, now, out)

    def _find_parked(self, req: Request) -> Request | None:
        for other in self._requests.values():
            if (
                other.state is State.PARKED
                and other.user == req.user
                and other.tenant == req.tenant
                and other.kind == req.kind
                and other.gpus == req.gpus
                and req.flavor in (None, other.assigned_flavor)
            ):
                return other
        return None

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
        old.state = State.FINISHED
        old.reason = f"reservation claimed by {req.id}"
        del self._requests[old.id]
        out.append(Decision(now, "finish", old.id, {"reason": old.reason}))
        q.resuming[req.id] = req
        self._touch(req.tenant)

    # ------------------------------------------------------------------ who to wake

    def _touch(self, tenant: str) -> None:
        self._dirty.add(tenant)

    def _wake(self, tenants: Iterable[str]) -> None:
        for t in tenants:
            self._queues[t].clear_marks()
            self._strict_blocked.discard(t)
            self._dirty.add(t)

    def _room_freed_in(self, flavor: str) -> None:
        """Devices of `flavor` freed: wake who waits for devices there and now fits on one
        node. Those who wait for quota are woken by quota released in their cohort."""
        waiters = self._cap_waiters.get(flavor)
        if not waiters:
            return
        gap = self._cluster.widest_gap(flavor)
        still: set[tuple[str, BucketKey | None]] = set()
        for tenant, bkey in waiters:
            if bkey is not None:
                if bkey[1] > gap:
                    still.add((tenant, bkey))  # no node has room for it yet
                    continue
                bucket = self._queues[tenant].buckets.get(bkey)
                if bucket is not None:
                    bucket.inadmissible = False
            self._strict_blocked.discard(tenant)
            self._dirty.add(tenant)
        self._cap_waiters[flavor] = still

    def _quota_freed_in(self, tenant: str, flavor: str) -> None:
        """Quota of `flavor` freed in the tenant's cohort: wake the members' heads that could
        use it. Heads pinned to another flavor, or of members without quota for this one,
        stay asleep: nothing they wait for changed."""
        cohort = self._config.tenants[tenant].cohort
        for name in self._ledger.members[cohort] if cohort else (tenant,):
            q = self._queues[name]
            if flavor not in self._config.tenants[name].quota:
                continue
            room = self._ledger.room(name, flavor)
            # With autoscale, a head held back by devices alone is demand for nodes: let the
            # cycle see it.
            gap = 1 << 30 if flavor in self._config.policy.autoscale else None
            gap = gap or self._cluster.widest_gap(flavor)
            may_preempt = self._preempts[name]
            woken = name in self._strict_blocked
            most: dict[int, int] = {}
            for bucket in q.buckets.values():
                pin, gpus = bucket.key
                if not bucket.inadmissible or pin not in (None, flavor):
                    continue
                if gpus <= room and gpus > gap:
                    # The quota is there now, the devices are not: wait for those.
                    self._cap_waiters[flavor].add((name, bucket.key))
                    if not (may_preempt and self._could_preempt(name, flavor, q, bucket, most)):
                        continue
                elif gpus > room and not (
                    may_preempt and self._could_preempt(name, flavor, q, bucket, most)
                ):
                    continue
                bucket.inadmissible = False
                woken = True
            if woken or q.resuming:
                self._strict_blocked.discard(name)
                self._dirty.add(name)

    def _wake_preemptors(self, tenant: str, flavor: str) -> None:
        cohort = self._config.tenants[tenant].cohort
        for name in self._ledger.members[cohort] if cohort else (tenant,):
            q = self._queues[name]
            most: dict[int, int] = {}
            for bucket in q.buckets.values():
                if (
                    bucket.inadmissible
                    and bucket.key[0] in (None, flavor)
                    and self._could_preempt(name, flavor, q, bucket, most)
                ):
                    bucket.inadmissible = False
                    self._dirty.add(name)

    def _could_preempt(
        self, tenant: str, flavor: str, q: TenantQueue, bucket: Bucket, most: dict[int, int]
    ) -> bool:
        """Could the bucket's head make room by preemption? `most` remembers the bound per
        priority for the caller's loop over one tenant's buckets (nothing changes in it)."""
        head = q.head(bucket)
        if head is None:
            return False
        bound = most.get(head.priority)
        if bound is None:
            bound = most[head.priority] = self._bound(tenant, flavor, head.priority)[0]
        return head.gpus <= bound

    # ------------------------------------------------------------------ idle policy

    def _tenant_setting(self, tenant: str, name: str) -> float:
        own = getattr(self._config.tenants[tenant], name)
        return float(own if own is not None else getattr(self._config.policy, name))

    def _arm_cull(self, req: Request) -> None:
        if req.kind == "job" or req.idle_since is None:
            return
        timeout = self._tenant_setting(req.tenant, "idle_timeout")
        if timeout <= 0:
            return
        cull_at = req.idle_since + timeout
        self._timers.set(_CULL, req.id, cull_at)
        lead = self._config.policy.cull_warning
        if 0 < lead < timeout:
            self._timers.set(_WARN, req.id, cull_at - lead)

    # ------------------------------------------------------------------ autoscale

    def _scale_demand(self, now: float, out: list[Decision]) -> None:
        sizes: dict[str, list[int]] = defaultdict(list)
        tentative: list[tuple[str, str, int]] = []
        for (tenant, bkey), flavor in list(self._capacity_blocked.items()):
            if flavor not in self._config.policy.autoscale:
                continue
            bucket = self._queues[tenant].buckets.get(bkey)
            if bucket is None:
                del self._capacity_blocked[(tenant, bkey)]
                continue
            gpus = bkey[1]
            n = 0
            while n < bucket.count and self._ledger.fits(tenant, flavor, gpus):
                self._ledger.add(tenant, flavor, gpus)
                tentative.append((tenant, flavor, gpus))
                n += 1
            sizes[flavor] += [gpus] * n
        for tenant, flavor, gpus in tentative:
            self._ledger.remove(tenant, flavor, gpus)
        for rid, flavor in self._resume_blocked.items():
            if flavor in self._config.policy.autoscale:
                sizes[flavor].append(self._requests[rid].gpus)
        out += self._scaler.plan(self._config, sizes, now)

    # ------------------------------------------------------------------ queries

    def _get(self, rid: str) -> Request:
        req = self._requests.get(rid)
        if req is None:
            raise KeyError(rid)
        return req

    def get(self, rid: str) -> Request | None:
        return self._requests.get(rid)

    def live_requests(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def position(self, rid: str) -> Position | None:
        """1-based place of a queued request in its tenant's queue and among all queued."""
        req = self._requests.get(rid)
        if req is None or req.state is not State.QUEUED:
            return None
        return views.position(self._queues, req)

    def tenant_usage(self) -> list[TenantUsage]:
        return views.tenant_usage(self._config, self._queues, self._ledger)

    def nodes(self) -> list[NodeState]:
        return views.node_states(self._cluster)

    def desired_nodes(self) -> dict[str, int]:
        """Nodes per flavor the queue asks for: ready, coming, and still to ask for."""
        out = {f: len(self._cluster.of(f)) for f in self._config.flavors}
        for f, n in self._scaler.desired.items():
            out[f] = max(out.get(f, 0), n)
        return out

    def provisioning(self) -> dict[str, dict[str, float]]:
        """Nodes on their way, by flavor: name -> time they will be ready."""
        return {f: dict(p) for f, p in self._scaler.provisioning.items() if p}
