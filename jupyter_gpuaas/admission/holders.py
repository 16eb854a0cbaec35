"""Who holds devices of each flavor, for the preemption search.

Device holders per (tenant, flavor), and their GPUs per priority: the candidates of a
preemption search, and a quick bound on what one could achieve. The bound per (tenant,
flavor, priority) keeps its candidates while no holder that could be one came or went in
its cohort and flavor (a version per priority threshold, below) and the cohort's set of
borrowers is the same; its quota room while the ledger's `pool_version` (usage) is the
same. Nothing else changes it but free devices, which are added at each lookup.

Most holders that come and go cannot be a head's candidates (a kernel admitted beside
jobs does not change what a kernel head may evict): nine in ten recomputations of the
bound on one version per pool gave the same candidates.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .ledger import Ledger
from .levels import Version
from .model import Config, Request, Tenant
from .nodes import Cluster, Node
from .preemption import preemption_candidates, preemption_room


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class Bound:
    """What evicting could do for a head of (tenant, flavor, priority): valid while the
    counters it keeps (`candidates`, `usage`) still read what they read when it was made."""

    candidates: Version  # of its candidates (a threshold's, Holders._versions)
    version: int
    usage: Version  # of the usage its room was asked at (the ledger's pool version)
    usage_version: int
    removed: dict[str, int]  # GPUs every candidate holds, per owner (the tenant first)
    held: int  # their sum
    own: bool  # some candidates are the tenant's own
    borrow_ok: bool  # it may stay borrowing once they are gone
    room: int  # the most GPUs evicting could make room for in quota; -1: not asked yet
    # The most for which other members' holders can help (preemption_room): above it,
    # only the tenant's own are candidates.
    room_all: int

    def __init__(
        self,
        candidates: Version,
        usage: Version,
        removed: dict[str, int],
        own: bool,
        borrow_ok: bool,
    ) -> None:
        self.candidates = candidates
        self.version = candidates.n
        self.usage = usage
        self.usage_version = usage.n
        self.removed = removed
        self.held = sum(removed.values())
        self.own = own
        self.borrow_ok = borrow_ok
        self.room = -1 if self.held else 0  # 0: nobody to evict
        self.room_all = 0


class Holders:
    def __init__(self, ledger: Ledger, cluster: Cluster) -> None:
        self._ledger = ledger
        self._cluster = cluster
        self.holding: dict[tuple[str, str], dict[str, Request]] = defaultdict(dict)
        self.held_by_priority: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
        # tenant -> flavor -> priority -> its bound: string and int keys (compiled, a
        # tuple key is built and hashed at each of the 2 M lookups of a month).
        self._bounds: dict[str, dict[str, dict[int, Bound]]] = {}
        # Per (pool, flavor, threshold, equal too): bumps when a holder of priority below
        # the threshold (or equal to it, for a tenant whose own equal-priority holders may
        # be candidates: LowerOrNewerEqualPriority) comes or goes there, or the pool's
        # borrowers change. A bound for a head at priority p reads threshold p (None: every
        # priority, for a tenant that reclaims with Any).
        self._versions: dict[tuple[str, str, int | None, bool], Version] = {}
        self._thresholds: dict[tuple[str, str], list[tuple[int | None, bool, Version]]] = {}
        self._reclaims_any: dict[str, bool] = {}
        self._equal_too: dict[str, bool] = {}
        # Every admitted request, in the order it was bound (the gateway's wait estimates
        # walk the running grants, not every live request).
        self.admitted: dict[str, Request] = {}
        self.pool: dict[str, str] = {}  # tenant -> its cohort, or itself without one
        self._tenants: dict[str, Tenant] = {}

    def reconfigure(self, config: Config) -> None:
        self._tenants = dict(config.tenants)
        self.pool = {t: self._ledger.root(t) for t in config.tenants}
        self._reclaims_any = {
            t.name: t.preemption.reclaim_within_cohort == "Any" for t in config.tenants.values()
        }
        self._equal_too = {
            t.name: t.preemption.within_tenant == "LowerOrNewerEqualPriority"
            for t in config.tenants.values()
        }
        self._bounds.clear()
        self._ledger.on_borrowers = self._changed

    def _changed(self, pool: str, flavor: str, prio: int | None = None) -> None:
        """Holders or borrowers changed in (pool, flavor): bounds that could see it, recompute
        their candidates. `prio` None: the borrowers (every threshold)."""
        for t, equal_too, version in self._thresholds.get((pool, flavor), ()):
            if prio is None or t is None or prio < t or (equal_too and prio == t):
                version.n += 1

    def hold(self, req: Request, flavor: str) -> None:
        self.admitted[req.id] = req
        self._changed(self.pool[req.tenant], flavor, req.priority)
        self.holding[(req.tenant, flavor)][req.id] = req
        by_prio = self.held_by_priority[(req.tenant, flavor)]
        by_prio[req.priority] = by_prio.get(req.priority, 0) + req.gpus

    def unhold(self, req: Request, flavor: str) -> None:
        self.admitted.pop(req.id, None)
        if self.holding[(req.tenant, flavor)].pop(req.id, None) is not None:
            self._changed(self.pool[req.tenant], flavor, req.priority)
            by_prio = self.held_by_priority[(req.tenant, flavor)]
            left = by_prio[req.priority] - req.gpus
            if left:
                by_prio[req.priority] = left
            else:
                del by_prio[req.priority]

    def victim_pool(self, req: Request, flavor: str) -> list[Request] | None:
        """Requests holding `flavor` that the preemption policy could ever evict for `req`:
        its own tenant's (unless within_tenant is Never) and those of cohort members above
        their nominal quota (unless the cohort policies are Never).

        None when even evicting all of them could not make room: most failing searches end
        on that bound, computed from GPUs held per priority, without a candidate list.
        Empty when they could in quota but no node would have room for `req` (it waits for
        devices: `room_on`).
        """
        b = self.bound(req.tenant, flavor, req.priority)
        if not b.held:
            # Nobody to evict (its room is 0: `Bound`): 1.07 M of the 1.3 M calls of a
            # month end here, before the devices and `could_make_room` are asked.
            return None
        if req.gpus > b.held + self._cluster.free_in(flavor):
            # Not the devices, even with every candidate gone: does quota rule it out too?
            # (Asked of the ledger only here, rarely: a month has a few thousand.)
            return [] if req.gpus <= self.quota_room(req.tenant, flavor, b) else None
        if not self.could_make_room(req.tenant, flavor, b, req.gpus):
            return None
        pool: list[Request] = []
        if b.own:
            key = (req.tenant, flavor)
            held = self.holding[key].values()
            prios = self.held_by_priority[key]
            if prios and max(prios) <= req.priority:
                pool += held  # all of them (a kernel head among kernels and jobs): no filter
            else:
                pool += [v for v in held if v.priority <= req.priority]
        if req.gpus <= b.room_all:
            # The other members whose holders are candidates: the owners in `removed` but
            # the tenant (listed here, not kept in the bound: a month recomputes 385 K
            # bounds, and 145 K searches get this far).
            for name in b.removed:
                if name != req.tenant:
                    pool += self.holding[(name, flavor)].values()
        # A request runs on one node: if evicting every candidate leaves no node with
        # room, no set of them will (the search would find none; most that fail, fail so).
        return pool if self._cluster.has_room_without(flavor, req.gpus, pool) else []

    def room_on(self, node: Node, tenant: str, prio: int) -> int:
        """The devices of `node` a head of `tenant` at `prio` could have by preempting: its
        free ones and those of the holders `victim_pool` would offer it."""
        b = self.bound(tenant, node.flavor, prio)
        room = node.free
        if not b.held:
            return room  # nobody to evict (as in `victim_pool`): no holder to walk
        seen: set[str] = set()
        for rid in node.holders.values():
            v = self.admitted.get(rid)
            if v is None or rid in seen:
                continue
            seen.add(rid)
            if v.tenant == tenant:
                if b.own and v.priority <= prio:
                    room += v.gpus
            elif v.tenant in b.removed:
                room += v.gpus
        return room

    def could_make_room(
        self, tenant: str, flavor: str, b: Bound, gpus: int, room: int = -1
    ) -> bool:
        """Could evicting every candidate of `b` make room for `gpus`: their devices and
        the free ones enough, and quota enough once they are gone? The quota question is
        the costly one: asked only when the devices would do, and then kept in `b`.
        Before it, the quick one (the reach, `Waking._reach`: their GPUs and the free
        devices, their GPUs and `room`, the tenant's room in quota now, -1: asked here):
        nine in ten heads of a month end there."""
        if gpus > b.held + self._cluster.free_in(flavor):
            return False
        if b.room < 0:
            if room < 0:
                room = self._ledger.room(tenant, flavor)
            if gpus > room + b.held:
                return False
            self._ask_room(tenant, flavor, b)
        return gpus <= b.room

    def quota_room(self, tenant: str, flavor: str, b: Bound) -> int:
        """The most GPUs evicting every candidate of `b` would leave room for in quota."""
        if b.room < 0:
            self._ask_room(tenant, flavor, b)
        return b.room

    def _ask_room(self, tenant: str, flavor: str, b: Bound) -> None:
        spec = self._tenants[tenant]
        b.room, b.room_all = preemption_room(spec, flavor, self._ledger, b.removed, b.borrow_ok)

    def bound(self, tenant: str, flavor: str, prio: int) -> Bound:
        """The candidates' GPUs and owners for a head of `tenant` at `prio` on `flavor`.

        Kept per (tenant, flavor, priority): its candidates until a holder that could be
        one comes or goes in that cohort and flavor, or its borrowers change; its room until
        usage changes there. Between two changes, wakes and tries of many heads ask the same."""
        of_tenant = self._bounds.get(tenant)
        if of_tenant is None:
            of_tenant = self._bounds[tenant] = {}
        of_flavor = of_tenant.get(flavor)
        if of_flavor is None:
            of_flavor = of_tenant[flavor] = {}
        b = of_flavor.get(prio)
        if b is not None and b.candidates.n == b.version:
            if b.usage.n != b.usage_version:
                b.usage_version = b.usage.n
                if b.held:
                    b.room = -1  # the same candidates; the quota they would leave, asked again
            return b
        pool = self.pool[tenant]
        threshold = None if self._reclaims_any[tenant] else prio
        equal_too = self._equal_too[tenant]
        vkey = (pool, flavor, threshold, equal_too)
        candidates = self._versions.get(vkey)
        if candidates is None:
            candidates = self._versions[vkey] = Version()
            self._thresholds.setdefault((pool, flavor), []).append(
                (threshold, equal_too, candidates)
            )
        removed, own, borrow_ok = preemption_candidates(
            self._tenants[tenant], self._ledger, self.held_by_priority, flavor, prio
        )
        b = Bound(candidates, self._ledger.version((pool, flavor)), removed, own, borrow_ok)
        of_flavor[prio] = b
        return b
