"""Who holds devices of each flavor, for the preemption search.

Device holders per (tenant, flavor), and their GPUs per priority: the candidates of a
preemption search, and a quick bound on what one could achieve. The bound per (tenant,
flavor, priority) is kept with the version of the pool it was computed at: the ledger's
`pool_version` of the tenant's cohort and that flavor, which usage and holders both bump.
Nothing else changes it but free devices, which are added at each lookup.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .ledger import Ledger
from .model import Config, Request, Tenant
from .nodes import Cluster
from .preemption import preemption_candidates, preemption_room


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class Bound:
    """What evicting could do for a head of (tenant, flavor, priority), as of the
    version of its pool (usage and holders in its cohort and flavor)."""

    version: int
    removed: dict[str, int]  # GPUs every candidate holds, per owner (the tenant first)
    held: int  # their sum
    own: bool  # some candidates are the tenant's own
    others: list[str]  # the other members whose holders are candidates
    borrow_ok: bool  # it may stay borrowing once they are gone
    room: int  # room in quota once they are all gone; -1: not asked yet

    def __init__(
        self,
        version: int,
        removed: dict[str, int],
        held: int,
        own: bool,
        others: list[str],
        borrow_ok: bool,
        room: int = -1,
    ) -> None:
        self.version = version
        self.removed = removed
        self.held = held
        self.own = own
        self.others = others
        self.borrow_ok = borrow_ok
        self.room = room


class Holders:
    def __init__(self, ledger: Ledger, cluster: Cluster) -> None:
        self._ledger = ledger
        self._cluster = cluster
        self.holding: dict[tuple[str, str], dict[str, Request]] = defaultdict(dict)
        self.held_by_priority: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
        self._bounds: dict[tuple[str, str, int], Bound] = {}
        # Every admitted request, in the order it was bound (the gateway's wait estimates
        # walk the running grants, not every live request).
        self.admitted: dict[str, Request] = {}
        self.pool: dict[str, str] = {}  # tenant -> its cohort, or itself without one
        self._tenants: dict[str, Tenant] = {}

    def reconfigure(self, config: Config) -> None:
        self._tenants = dict(config.tenants)
        self.pool = {t: self._ledger.root(t) for t in config.tenants}
        self._bounds.clear()

    def hold(self, req: Request, flavor: str) -> None:
        self.admitted[req.id] = req
        self._ledger.bump((self.pool[req.tenant], flavor))
        self.holding[(req.tenant, flavor)][req.id] = req
        by_prio = self.held_by_priority[(req.tenant, flavor)]
        by_prio[req.priority] = by_prio.get(req.priority, 0) + req.gpus

    def unhold(self, req: Request, flavor: str) -> None:
        self.admitted.pop(req.id, None)
        if self.holding[(req.tenant, flavor)].pop(req.id, None) is not None:
            self._ledger.bump((self.pool[req.tenant], flavor))
            by_prio = self.held_by_priority[(req.tenant, flavor)]
            left = by_prio[req.priority] - req.gpus
            if left:
                by_prio[req.priority] = left
            else:
                del by_prio[req.priority]

    def victim_pool(self, req: Request, flavor: str) -> list[Request]:
        """Requests holding `flavor` that the preemption policy could ever evict for `req`:
        its own tenant's (unless within_tenant is Never) and those of cohort members above
        their nominal quota (unless the cohort policies are Never).

        Empty when even evicting all of them could not make room: most failing searches
        end on that bound, computed from GPUs held per priority, without a candidate list.
        """
        b = self.bound(req.tenant, flavor, req.priority)
        if not self.could_make_room(req.tenant, flavor, b, req.gpus):
            return []
        pool: list[Request] = []
        if b.own:
            held = self.holding[(req.tenant, flavor)].values()
            pool += [v for v in held if v.priority <= req.priority]
        for name in b.others:
            pool += self.holding[(name, flavor)].values()
        # A request runs on one node: if evicting every candidate leaves no node with
        # room, no set of them will (the search would find none; most that fail, fail so).
        freed: dict[str, int] = {}
        for v in pool:
            node = v.node or ""
            freed[node] = freed.get(node, 0) + v.gpus
        if not self._cluster.has_room(flavor, req.gpus, freed):
            return []
        return pool

    def could_make_room(self, tenant: str, flavor: str, b: Bound, gpus: int) -> bool:
        """Could evicting every candidate of `b` make room for `gpus`: their devices and
        the free ones enough, and quota enough once they are gone? The quota question is
        the costly one: asked only when the devices would do, and then kept in `b`."""
        if gpus > b.held + self._cluster.free_in(flavor):
            return False
        if b.room < 0:
            b.room = preemption_room(tenant, flavor, self._ledger, b.removed, b.borrow_ok)
        return gpus <= b.room

    def bound(self, tenant: str, flavor: str, prio: int) -> Bound:
        """The candidates' GPUs and owners for a head of `tenant` at `prio` on `flavor`.

        Kept per (tenant, flavor, priority) until usage or holders change in that cohort
        and flavor: between two changes, wakes and tries of many heads ask the same."""
        version = self._ledger.pool_version.get((self.pool[tenant], flavor), 0)
        key = (tenant, flavor, prio)
        b = self._bounds.get(key)
        if b is None or b.version != version:
            removed, own, borrow_ok = preemption_candidates(
                self._tenants[tenant], self._ledger, self.held_by_priority, flavor, prio
            )
            others = [name for name in removed if name != tenant]
            b = Bound(version, removed, sum(removed.values()), own, others, borrow_ok)
            if not b.held:
                b.room = 0  # nobody to evict
            self._bounds[key] = b
        return b
