"""Waking: who looks again when quota or devices free up (Kueue's requeue step:
inadmissible heads wait until an event can change their answer).

A head that can neither fit nor preempt marks its bucket inadmissible, so an idle queue
costs nothing; `Waking` clears the marks of exactly the heads that something they wait
for has changed for: devices of a flavor (capacity waiters), quota of a flavor in their
tree, or a holder that became a preemption candidate again. A collaborator of
:class:`~jupyter_gpuaas.admission.core.AdmissionCore`; nomination tells it who waits for
devices (`wait_for_devices`), releases tell it what they freed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .holders import Bound, Holders
from .ledger import Ledger
from .model import Request
from .nodes import Cluster, Node
from .policies import Policies
from .queueing import Queues
from .queues import Bucket, BucketKey, TenantQueue

Waiter = tuple[str, BucketKey | None]


class Waking:
    def __init__(
        self,
        policies: Policies,
        ledger: Ledger,
        cluster: Cluster,
        holders: Holders,
        queues: Queues,
        nominees: dict[str, Any],
    ) -> None:
        self._policies = policies
        self._ledger = ledger
        self._cluster = cluster
        self._holders = holders
        self._queues = queues
        # The queues' own dict of tenant queues, read in every loop here (one lookup, not two).
        self._tenant_queues = queues.tenants
        # The tenants holding a head nominated in the cycle under way (the Heads' entries).
        self._nominees = nominees
        # Per root cohort, its tenants that may have a sleeping head (a superset): the ones
        # looked at since they were last seen with none. A release wakes these, not the tree.
        self._sleepers: dict[str, set[str]] = defaultdict(set)
        # Who to wake when devices of a flavor free up: (tenant, bucket) with quota there (or
        # room by preemption) but no node; bucket None: the tenant (StrictFIFO head, resume).
        self._cap_waiters: dict[str, set[Waiter]] = defaultdict(set)
        # With `one_head_per_cycle` (Kueue's timing; the core sets `defer` for the length
        # of its cycles): quota that a preemption frees in a cycle under way reaches the
        # sleeping heads of BestEffortFIFO queues only once no awake head can go, as Kueue
        # requeues a cohort's inadmissible workloads in one batch a second after the
        # release (its requeue batch period, cache/queue/inadmissible_workloads.go),
        # while a StrictFIFO head is back in its queue at once (`RequeueIfNotPresent`).
        self.defer = False
        self._deferred: dict[tuple[str, str], None] = {}  # (tenant, flavor), in order

    def looked_at(self, tenant: str) -> None:
        """About to nominate the tenant's heads, which may mark some inadmissible."""
        self._sleepers[self._ledger.root(tenant)].add(tenant)

    def wait_for_devices(self, flavor: str, waiter: Waiter) -> None:
        """`waiter` is woken when devices of `flavor` free up (`room_freed_in`)."""
        self._cap_waiters[flavor].add(waiter)

    def _rouse(self, tenant: str) -> None:
        """A tenant whose sleeping head was woken is nominated again, at once unless it
        holds a head nominated in the cycle under way: that one is nominated again when it
        comes first (`_still_true`), as in the reference, where no bucket sleeps and so
        nothing wakes (`look_at_everyone`). What a cycle decides must not depend on which
        buckets happened to be marked: a head nominated afresh here could rank above a
        stale one the reference keeps (the 100,000-request month parted at t=43,250)."""
        if tenant not in self._nominees:
            self._queues.dirty.add(tenant)

    def room_freed_in(self, flavor: str, node: Node | None = None) -> None:
        """Devices of `flavor` freed (on `node`; None: a node joined, or gone): wake who
        waits for devices there and now fits on one node, or, where it may preempt, could
        now make room on `node`: its free devices and its candidates' there together (only
        that node changed). Those who wait for quota are woken by quota released in their
        cohort."""
        waiters = self._cap_waiters.get(flavor)
        if not waiters:
            return
        gap = self._cluster.widest_gap(flavor)
        preempts = self._policies.preempts
        strict_blocked = self._queues.strict_blocked
        still: set[Waiter] = set()
        for waiter in waiters:
            tenant, bkey = waiter
            if bkey is not None:
                bucket = self._tenant_queues[tenant].buckets.get(bkey)
                if bkey[1] > gap and not (
                    node is not None
                    and bucket is not None
                    and bucket.inadmissible
                    and preempts[tenant]
                    # (No node gives more than it has: half the asks a month end here.)
                    and bkey[1] <= node.gpus
                    and self._room_on(node, tenant, bucket) >= bkey[1]
                ):
                    still.add(waiter)  # no node has room for it yet
                    continue
                if bucket is not None:
                    bucket.inadmissible = False
            strict_blocked.discard(tenant)
            self._rouse(tenant)
        self._cap_waiters[flavor] = still

    def _room_on(self, node: Node, tenant: str, bucket: Bucket) -> int:
        head = self._tenant_queues[tenant].head(bucket)
        return -1 if head is None else self._holders.room_on(node, tenant, head.priority)

    def wake_deferred(self) -> bool:
        """Wake the heads that the releases kept back by `defer` would have woken, as if
        the quota were freed now. False when none was kept back."""
        if not self._deferred:
            return False
        deferred = list(self._deferred)
        self._deferred.clear()
        defer = self.defer
        self.defer = False
        for tenant, flavor in deferred:
            self.quota_freed_in(tenant, flavor)
        self.defer = defer
        return True

    def quota_freed_in(self, tenant: str, flavor: str, strict_only: bool = False) -> None:
        """Quota of `flavor` freed in the tenant's cohort: wake the members' heads that could
        use it. Heads pinned to another flavor, or of members without quota for this one,
        stay asleep: nothing they wait for changed. With `defer`, only the StrictFIFO
        heads now (`strict_only`), the others at `wake_deferred`."""
        if self.defer and not strict_only:
            self._deferred[(tenant, flavor)] = None
            strict_only = True
        # With autoscale, a head held back by devices alone is demand for nodes: let the
        # cycle see it. Nothing below changes the nodes: one look for the whole tree.
        gap = 1 << 30 if flavor in self._policies.config.policy.autoscale else None
        gap = gap or self._cluster.widest_gap(flavor)
        free = self._cluster.free_in(flavor)
        flavors = self._policies.flavors
        preempts = self._policies.preempts
        strict_blocked = self._queues.strict_blocked
        sleepers = self._sleepers[self._ledger.root(tenant)]
        # Marks are only set by nomination (so a member not looked at since it had none
        # has none); what is done below is order-free (set additions).
        for name in list(sleepers):
            q = self._tenant_queues[name]
            strict = name in strict_blocked
            if strict_only and not strict:
                continue
            if flavor not in flavors[name]:
                if not (q.resuming or strict or any(b.inadmissible for b in q.buckets.values())):
                    sleepers.discard(name)
                continue
            may_preempt = preempts[name]
            asleep = False  # any bucket marked, of whichever flavor
            woken = strict
            room = -1  # asked of the ledger at the first sleeping head (most have none)
            most: dict[int, Bound] = {}
            reach: dict[int, int] = {}
            for bucket in q.buckets.values():
                if not bucket.inadmissible:
                    continue
                asleep = True
                pin, gpus = bucket.key
                if pin is not None and pin != flavor:
                    continue
                if room < 0:
                    room = self._ledger.room(name, flavor)
                if gpus <= room:
                    if gpus <= gap:
                        bucket.inadmissible = False
                        woken = True
                        continue
                    # The quota is there now, the devices are not: wait for those.
                    self._cap_waiters[flavor].add((name, bucket.key))
                # It would have to preempt.
                if not may_preempt:
                    continue
                # Could its head make room by preemption? Most are ruled out by the reach
                # of the bucket's highest level (`_reach`) before the head is looked for.
                if gpus > self._reach(name, flavor, bucket, most, reach, room, free):
                    # With room <= free (nearly always), the reach is room + what the
                    # candidates hold, and evicting frees no more quota than they hold
                    # (those of the head's level, no more than the top one's): quota
                    # stops it still, and `_evicting_makes_quota` would say no. (207 K
                    # calls a month, each a head, a bound and a quota question.)
                    if (
                        room > free
                        and gpus > gap
                        and self._evicting_makes_quota(name, flavor, q, bucket, most)
                    ):
                        self._cap_waiters[flavor].add((name, bucket.key))
                    continue
                head = q.head(bucket)
                if head is None or not self._could_preempt_head(name, flavor, head, most, room):
                    if gpus > gap and self._evicting_makes_quota(name, flavor, q, bucket, most):
                        # Quota no longer stands in its way once it evicts (this release
                        # freed some), devices do: another tree's release frees them,
                        # and only waiters hear of that (a hunt found it missed).
                        self._cap_waiters[flavor].add((name, bucket.key))
                    continue
                bucket.inadmissible = False
                woken = True
            if woken or q.resuming:
                strict_blocked.discard(name)
                self._rouse(name)
            elif not asleep:
                sleepers.discard(name)  # nothing of it sleeps: not looked at again till then

    def wake_preemptors(self, tenant: str, flavor: str) -> None:
        free = self._cluster.free_in(flavor)  # (waking changes no node: one look)
        strict_blocked = self._queues.strict_blocked
        for name in self._ledger.tree(tenant):
            q = self._tenant_queues[name]
            most: dict[int, Bound] = {}
            if name in strict_blocked:  # (its head is its first request, unmarked)
                first = q.first()
                if (
                    first is not None
                    and first.flavor in (None, flavor)
                    and self._could_preempt_head(name, flavor, first, most, -1)
                ):
                    strict_blocked.discard(name)
                    self._rouse(name)
                continue
            room = -1  # asked of the ledger at the first sleeping head
            reach: dict[int, int] = {}
            for bucket in q.buckets.values():
                if not bucket.inadmissible:
                    continue
                pin, gpus = bucket.key
                if pin is not None and pin != flavor:
                    continue
                if room < 0:
                    room = self._ledger.room(name, flavor)
                # As in `quota_freed_in`: most heads end at the reach of the top level.
                if gpus > self._reach(name, flavor, bucket, most, reach, room, free):
                    continue
                head = q.head(bucket)
                if head is not None and self._could_preempt_head(name, flavor, head, most, room):
                    bucket.inadmissible = False
                    self._rouse(name)

    def _reach(
        self,
        tenant: str,
        flavor: str,
        bucket: Bucket,
        most: dict[int, Bound],
        reach: dict[int, int],
        room: int,
        free: int,
    ) -> int:
        """The most GPUs evicting could make room for, for any head of the bucket: the
        reach of its highest level, with `room` the tenant's room in quota now and `free`
        the flavor's free devices (the caller's, asked once per loop). Evicting
        every candidate frees their devices and at most as much quota as they hold, so
        the reach is what they hold and the less of the free devices and `room`
        (`Holders.could_make_room` asks the same of one head, both halves apart).
        A stale entry at the front is only ever above the head, and a
        bound only grows with the priority. `most` and `reach` keep the bounds and reaches
        per priority for the caller's loop over one tenant's buckets (nothing changes in
        it): 2.5 M buckets a month ask this, and most ask no more."""
        prios = bucket.prios
        if not prios:
            return 1 << 30  # (no level: nothing rules the head out here)
        top = prios[0]
        most_gpus = reach.get(top)
        if most_gpus is None:
            # (Not min(): interpreted, the builtin call costs more than the compare.)
            held = self._bound(tenant, flavor, top, most).held
            most_gpus = reach[top] = held + (room if room < free else free)
        return most_gpus

    def _evicting_makes_quota(
        self, tenant: str, flavor: str, q: TenantQueue, bucket: Bucket, most: dict[int, Bound]
    ) -> bool:
        """Would evicting every candidate leave quota enough for the bucket's head (devices
        aside)? A head that quota stops even so has nothing to gain from freed devices."""
        head = q.head(bucket)
        if head is None:
            return False
        b = self._bound(tenant, flavor, head.priority, most)
        return head.gpus <= self._holders.quota_room(tenant, flavor, b)

    def _could_preempt_head(
        self, tenant: str, flavor: str, head: Request, most: dict[int, Bound], room: int
    ) -> bool:
        b = self._bound(tenant, flavor, head.priority, most)
        return self._holders.could_make_room(tenant, flavor, b, head.gpus, room)

    def _bound(self, tenant: str, flavor: str, prio: int, most: dict[int, Bound]) -> Bound:
        b = most.get(prio)
        if b is None:
            b = most[prio] = self._holders.bound(tenant, flavor, prio)
        return b
