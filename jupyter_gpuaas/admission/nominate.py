"""Step 3 of the cycle, nomination: for each tenant whose situation changed, how its best
head would be admitted right now (Kueue's nominate step: which flavor, does it fit, whom
would it preempt), and the key that orders the nominated heads (step 4).

A head that can neither fit nor preempt is not nominated: its bucket is marked
inadmissible, and `waiting_for` says why (reasons.py) from what nomination left behind.

A collaborator of :class:`~jupyter_gpuaas.admission.core.AdmissionCore` (Kueue's flavor
assigner and the nominate half of its scheduler); the victim choice is preemption.py's,
the tree tournament fairshare.py's. Who waits for devices it tells waking.py.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .fairshare import bracket, share
from .grace import Graces, kept_for_reclaim
from .holders import Holders
from .ledger import Ledger
from .model import Request
from .nodes import Cluster
from .policies import Policies
from .preemption import find_victims
from .queueing import Queues
from .queues import Bucket, BucketKey, order_key
from .reasons import waiting_reason
from .waking import Waking


class Mode(Enum):
    """How a nominated head would go in (Kueue's assignment mode)."""

    FIT = "fit"  # quota and a node have room now
    PREEMPT = "preempt"  # room once its victims are gone
    RESUME = "resume"  # a parked reservation, busy again, back onto devices


class Status(Enum):
    """Where a nominated entry stands in the cycle (Kueue's entry status)."""

    NOMINATED = "nominated"  # found a way in; not acted on yet
    SKIPPED = "skipped"  # nominated before the last admission: looked at again
    WAITING = "waiting"  # warned its victims; waits out their grace
    ASSUMED = "assumed"  # admitted (Kueue: assumed in the cache)


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class Entry:
    """A nominated head: how its tenant's best candidate would be admitted right now."""

    req: Request
    mode: Mode
    flavor: str
    borrowing: bool
    victims: list[Request]
    key: tuple[Any, ...]
    epoch: int  # the core's epoch when nominated: unchanged means still true
    status: Status

    def __init__(
        self,
        req: Request,
        mode: Mode,
        flavor: str,
        borrowing: bool,
        victims: list[Request] | None = None,
        key: tuple[Any, ...] = (),
        epoch: int = 0,
        status: Status = Status.NOMINATED,
    ) -> None:
        self.req = req
        self.mode = mode
        self.flavor = flavor
        self.borrowing = borrowing
        self.victims = [] if victims is None else victims
        self.key = key
        self.epoch = epoch
        self.status = status


def own_victims(req: Request, victims: list[Request]) -> int:
    """The GPUs of `req`'s own tenant among its victims: its tenant holds that much less
    once they are evicted (whether it borrows afterwards, and its rank, count that)."""
    return sum(v.gpus for v in victims if v.tenant == req.tenant)


def _condemned(failed: list[tuple[str | None, int, int]], req: Request) -> bool:
    """Does a head that failed by quota (pin, GPUs, priority) condemn `req`: the same
    flavor choice, as many GPUs or more, no higher priority? (A loop, not any() over a
    generator: interpreted, that builds a generator for each of a month's 765,000 asks.)"""
    for f, g, p in failed:  # noqa: SIM110 (see above)
        if f == req.flavor and req.gpus >= g and req.priority <= p:
            return True
    return False


class Nomination:
    def __init__(
        self,
        policies: Policies,
        ledger: Ledger,
        cluster: Cluster,
        holders: Holders,
        graces: Graces,
        requests: dict[str, Request],
        queues: Queues,
        waking: Waking,
    ) -> None:
        self._policies = policies
        self._ledger = ledger
        self._cluster = cluster
        self._holders = holders
        self._graces = graces
        self._requests = requests
        self._queues = queues
        # The queues' own dict of tenant queues, read in every loop here (one lookup, not two).
        self._tenant_queues = queues.tenants
        self._waking = waking
        self.epoch = 0  # bumps whenever quota or devices are taken (`taken`)
        # Bucket heads held back by capacity alone (quota would admit them): scale demand.
        self.capacity_blocked: dict[tuple[str, BucketKey], str] = {}
        self.resume_blocked: dict[str, str] = {}  # parked rid -> flavor, no node has room
        # Whether the last failed `_try` was held back by devices (its key is then in
        # `capacity_blocked`), so nomination need not build the key again to ask.
        self._by_capacity = False
        # The flavors where the head `_choose_flavor` last looked at could make room in
        # quota by preempting (the holders' bound says so) but found no victims while no
        # node has room for it: it may wait for devices there too (waking.py).
        self._short: list[str] = []
        # With `one_head_per_cycle`: how many kinds of request (size, flavor, priority) of
        # a BestEffortFIFO queue the last `nominate` found unable to go ahead of the head
        # it returns. Each costs its tenant a cycle, as Kueue pops one workload of a
        # ClusterQueue per cycle and sets one that cannot go aside, with its equivalents
        # (heads.py `wait`).
        self.lost = 0

    def taken(self) -> None:
        """Quota or devices were taken: every entry nominated before is stale."""
        self.epoch += 1

    def bracket(self, entries: Collection[Entry]) -> Entry | None:
        """With fair sharing in a cohort tree, the head that goes first: a resuming
        reservation by its key; else Kueue's tournament (fairshare.py) picks each tree's
        winner, and the least key goes first among those and the heads of tenants without
        a cohort. Deterministic: every step takes the least of a total order."""
        resuming = [e for e in entries if e.key[0] != 1]
        if resuming:
            return min(resuming, key=lambda e: e.key)
        listed = list(entries)
        heads = [
            (
                (e.req.tenant, e.flavor, e.req.gpus, own_victims(e.req, e.victims)),
                order_key(e.req),
            )
            for e in listed
        ]
        winners = bracket(self._ledger, self._policies.config.cohorts, heads)
        finalists = [listed[i] for i in winners.values()]
        finalists += [e for e in listed if not self._ledger.path(e.req.tenant)]
        return min(finalists, key=lambda e: e.key) if finalists else None

    def nominate(self, tenant: str) -> Entry | None:
        self.lost = 0
        q = self._tenant_queues[tenant]
        spec = self._policies.specs[tenant]
        for req in sorted(q.resuming.values(), key=order_key) if q.resuming else ():
            flavor = req.assigned_flavor or ""
            if self._cluster.widest_gap(flavor) >= req.gpus:
                self.resume_blocked.pop(req.id, None)
                key = (0, order_key(req))
                return Entry(req, Mode.RESUME, flavor, False, key=key, epoch=self.epoch)
            self.resume_blocked[req.id] = flavor
            self._waking.wait_for_devices(flavor, (tenant, None))
            if spec.queueing == "StrictFIFO":
                return None
        if spec.queueing == "StrictFIFO":
            if tenant in self._queues.strict_blocked:
                return None
            head = q.first()
            if head is None:
                return None
            entry = self._try(head, strict=True)
            if entry is None:
                self._queues.strict_blocked.add(tenant)
            return entry
        # A head that fails by quota (not capacity) and cannot preempt condemns every later
        # head with the same flavor choice, as many GPUs or more and no higher priority:
        # they would fail the same checks, so they are marked without being tried.
        failed: list[tuple[str | None, int, int]] | None = None
        lost: list[Bucket] | None = None  # the buckets whose head failed here, if any
        for bucket in q.heads():
            front = bucket.front()
            req = front[3]
            if failed is not None and _condemned(failed, req):
                bucket.inadmissible = True
                if lost is None:
                    lost = []
                lost.append(bucket)
                continue
            entry = self._try(req, bucket.key)
            if entry is not None:
                if lost is not None and self._policies.turns:
                    # Every request of those buckets ahead of this head fails as its
                    # bucket's head did (same size and flavor, no higher priority). Kueue
                    # spends a cycle on the first of each priority there and sets the
                    # others of that priority aside with it (its workloads of one shape
                    # and priority are equivalent: SchedulingEquivalenceHashing, on by
                    # default since v0.18, pkg/cache/queue/cluster_queue.go:702).
                    self.lost = sum(q.levels_ahead(b, front) for b in lost)
                return entry
            bucket.inadmissible = True
            if lost is None:
                lost = []
            lost.append(bucket)
            if not self._by_capacity:
                if failed is None:
                    failed = []
                failed.append((req.flavor, req.gpus, req.priority))
        return None

    def _try(
        self, req: Request, bkey: BucketKey | None = None, strict: bool = False
    ) -> Entry | None:
        tenant = req.tenant
        flavors = (req.flavor,) if req.flavor else self._policies.flavors[tenant]
        ledger = self._ledger
        cluster = self._cluster  # (a bound method kept in a local is a generic call)
        borrowing_choice: str | None = None
        borrowing_height = 0
        capacity_flavors: list[str] = []
        for f in flavors:
            if not ledger.fits(tenant, f, req.gpus):
                continue
            if cluster.widest_gap(f) < req.gpus:
                capacity_flavors.append(f)
                continue
            if self._graces and kept_for_reclaim(
                self._graces,
                req,
                f,
                self._requests,
                self._holders.pool,
                self._order,
                ledger,
                self._cluster,
            ):
                continue
            if not ledger.borrows(tenant, f, req.gpus):
                return self._entry(req, Mode.FIT, f, False)
            # Kueue's `whenCanBorrow: TryNextFlavor`: of the flavors that borrow, the one
            # borrowing from the lowest cohort of the tree (a flat cohort: the first).
            height = ledger.height(tenant, f, req.gpus)
            if borrowing_choice is None or height < borrowing_height:
                borrowing_choice, borrowing_height = f, height
        if borrowing_choice is not None:
            return self._entry(req, Mode.FIT, borrowing_choice, True)
        if not self._policies.preempts[tenant] or self._graces.waiting(req.id):
            flavors = ()  # a waiting preemptor picks no second victim set
        if flavors:
            chosen = self._choose_flavor(req, flavors)
            if chosen is not None:
                f, victims = chosen
                borrowing = ledger.borrows(req.tenant, f, req.gpus, own_victims(req, victims))
                return self._entry(req, Mode.PREEMPT, f, borrowing, victims)
            if self._short:
                # Evicting could make room in quota, but no node has room for it: devices
                # freed on a node where its candidates sit may change that (waking.py).
                waiter = (req.tenant, None if strict else bkey or (req.flavor, req.gpus))
                for f in self._short:
                    self._waking.wait_for_devices(f, waiter)
        self._by_capacity = bool(capacity_flavors)
        if capacity_flavors or self.capacity_blocked:  # (else no key to build)
            key = (req.tenant, bkey if bkey is not None else (req.flavor, req.gpus))
            if capacity_flavors:
                self.capacity_blocked[key] = capacity_flavors[0]
                waiter = (req.tenant, None if strict else key[1])
                for f in capacity_flavors:
                    self._waking.wait_for_devices(f, waiter)
            else:
                self.capacity_blocked.pop(key, None)
        return None

    def waiting_for(
        self, req: Request, provisioning: dict[str, dict[str, float]]
    ) -> tuple[str, dict[str, Any]] | None:
        """Why a queued request waits, as nomination left it: (kind, details), kind one of
        "quota", "capacity", "fifo" (reasons.py); None until nomination has found its head
        inadmissible. `provisioning`: the nodes on their way (the core's `provisioning`)."""
        if req.tenant in self._queues.dirty:
            return None  # not nominated since it changed: no reason recorded yet
        reason = waiting_reason(
            req,
            self._tenant_queues[req.tenant],
            self._policies.config.tenants[req.tenant].queueing == "StrictFIFO",
            req.tenant in self._queues.strict_blocked,
            self._policies.flavors[req.tenant],
            self.capacity_blocked,
            self._ledger,
            self._cluster,
            provisioning,
        )
        return None if reason is None else (reason.kind, reason.details())

    def _choose_flavor(
        self, req: Request, flavors: tuple[str, ...]
    ) -> tuple[str, list[Request]] | None:
        """The flavor to preempt in and its victims, or None. Kueue's flavor assigner
        (`whenCanPreempt: TryNextFlavor`) tries every flavor and keeps the best by its
        `isPreferred`: reclaim (every victim another tenant's) above preempt (some of its
        own tenant's, by priority), then the lowest borrowing height once the victims are
        gone (its preemption oracle's `borrowAfterPreemptions`); quota order breaks ties."""
        spec = self._policies.specs[req.tenant]
        graces = self._graces
        best: tuple[str, list[Request]] | None = None
        best_rank = (2, 0)
        self._short = []
        for f in flavors:
            holding = self._holders.victim_pool(req, f)
            if holding is None:
                continue
            if not holding:
                self._short.append(f)
                continue
            if graces:  # a warned victim is promised to its own preemptor
                holding = [v for v in holding if not graces.warned(v.id)]
                if not holding:
                    continue
            victims = find_victims(req, spec, f, self._ledger, self._cluster, holding)
            if victims is None:
                if self._cluster.widest_gap(f) < req.gpus:
                    self._short.append(f)  # perhaps for want of a node: it waits there too
                continue
            if graces and self._takes_kept_room(req, f, victims):
                continue
            removed: dict[str, int] = {}
            own = False
            for v in victims:
                removed[v.tenant] = removed.get(v.tenant, 0) + v.gpus
                own = own or v.tenant == req.tenant
            rank = (1 if own else 0, self._ledger.height(req.tenant, f, req.gpus, removed))
            if best is None or rank < best_rank:
                best, best_rank = (f, victims), rank
                if rank == (0, 0):
                    break  # reclaim within nominal: no later flavor ranks higher
        return best

    def _takes_kept_room(self, req: Request, flavor: str, victims: list[Request]) -> bool:
        return kept_for_reclaim(
            self._graces,
            req,
            flavor,
            self._requests,
            self._holders.pool,
            self._order,
            self._ledger,
            self._cluster,
            victims,
        )

    def _entry(
        self,
        req: Request,
        mode: Mode,
        flavor: str,
        borrowing: bool,
        victims: list[Request] | None = None,
    ) -> Entry:
        weighted = 0.0
        if borrowing and self._policies.config.policy.fair_sharing:
            # Ranked by its share as it would be with the head admitted (Kueue simulates
            # the addition), so a big head does not jump a small one on a lower share.
            weighted = share(self._ledger, req.tenant, flavor, req.gpus)
        # Kueue's borrowing height: who borrows from fewer levels of its tree goes first
        # (a flat cohort: 0 within nominal, 1 borrowing).
        height = self._ledger.height(req.tenant, flavor, req.gpus) if borrowing else 0
        key = (1, height, weighted, *order_key(req))
        return Entry(req, mode, flavor, borrowing, victims or [], key, self.epoch)

    def _order(self, req: Request, flavor: str) -> tuple[Any, ...]:
        """The admission-order key `req` would have if it fit `flavor` now."""
        borrowing = self._ledger.borrows(req.tenant, flavor, req.gpus)
        return self._entry(req, Mode.FIT, flavor, borrowing).key
