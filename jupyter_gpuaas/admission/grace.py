"""Preemption with grace: the bookkeeping between a victim's warning and its eviction.

With `preemption_grace` > 0 (the victim's tenant's, else the policy's), a `server` or
`kernel` chosen as a victim is warned (`preempt_warning`) and keeps its devices, still
counted as held, until its deadline; a `job` is preempted at once. The preemptor stays
queued meanwhile, as a *reclaim*: it picks no second victim set, and is admitted as soon
as its victims' devices are free (earlier if one ends by itself). Cancelled or admitted
elsewhere in the meantime, it withdraws the warnings and the victims keep running.

While a reclaim waits, the room it was promised is kept for it, as Kueue keeps a
preempting workload's usage in the cycle's snapshot: a request ordered after the
preemptor is not admitted on that flavor of its cohort if, with it admitted, the
preemptor would no longer fit once its victims are gone, nor may such a request preempt
its way into that room. Without that, a job preempted at once would be admitted again
into its own freed room at the same instant.

Pure: the core owns the state and calls in; nothing here reads a clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .ledger import Ledger
from .model import Request
from .nodes import Cluster, Node

#: The core's timer kind for evictions at the end of a grace period.
EVICT: Final = "evict"


@dataclass
class Reclaim:
    """A preemptor waiting for its warned victims to go."""

    preemptor: str
    flavor: str
    key: tuple[Any, ...] | None  # its admission-order key when it chose its victims
    victims: dict[str, Request] = field(default_factory=dict)


class Graces:
    def __init__(self) -> None:
        self.reclaims: dict[str, Reclaim] = {}  # by preemptor id
        self.victim_of: dict[str, str] = {}  # warned victim id -> preemptor id

    def __bool__(self) -> bool:
        return bool(self.reclaims)

    def warn(self, by: str, flavor: str, key: tuple[Any, ...] | None, victim: Request) -> None:
        """`victim` is warned for preemptor `by` (key None: not known yet, after a restore)."""
        rc = self.reclaims.get(by)
        if rc is None:
            rc = self.reclaims[by] = Reclaim(by, flavor, key)
        rc.victims[victim.id] = victim
        self.victim_of[victim.id] = by

    def waiting(self, rid: str) -> bool:
        """Is `rid` a preemptor whose victims are still in their grace?"""
        return rid in self.reclaims

    def warned(self, rid: str) -> bool:
        return rid in self.victim_of

    def victims(self, rid: str) -> list[Request]:
        rc = self.reclaims.get(rid)
        return list(rc.victims.values()) if rc is not None else []

    def victim_gone(self, rid: str) -> Reclaim | None:
        """A warned victim left (evicted, or ended by itself): its preemptor's reclaim,
        which is dropped once no victim is left."""
        by = self.victim_of.pop(rid, None)
        if by is None:
            return None
        rc = self.reclaims[by]
        del rc.victims[rid]
        if not rc.victims:
            del self.reclaims[by]
        return rc

    def withdraw(self, preemptor: str) -> list[Request]:
        """The preemptor needs its victims no longer: the ones still warned."""
        rc = self.reclaims.pop(preemptor, None)
        if rc is None:
            return []
        for vid in rc.victims:
            self.victim_of.pop(vid, None)
        return list(rc.victims.values())

    def __iter__(self) -> Iterator[Reclaim]:
        return iter(self.reclaims.values())


def keeps_room(
    rc: Reclaim,
    preemptor: Request,
    tenant: str,
    gpus: int,
    ledger: Ledger,
    cluster: Cluster,
    evicted: Sequence[Request] = (),
) -> bool:
    """Would the preemptor still fit once its victims are gone, with `gpus` more GPUs of
    `tenant` admitted on the reclaim's flavor now (on the node best fit would pick), after
    evicting `evicted` for them (a second preemptor's victims)?"""
    flavor = rc.flavor
    removed: dict[str, int] = defaultdict(int)
    freed: dict[str, int] = defaultdict(int)
    for v in rc.victims.values():
        removed[v.tenant] += v.gpus
        if v.node is not None:
            freed[v.node] += v.gpus
    gone: dict[str, int] = {}  # devices the evicted give back, by node
    for v in evicted:
        removed[v.tenant] += v.gpus
        if v.node is not None:
            gone[v.node] = gone.get(v.node, 0) + v.gpus
    removed[tenant] -= gpus  # "removed" a negative amount: admitted (the ledger is untouched)
    if not ledger.fits(preemptor.tenant, flavor, preemptor.gpus, removed):
        return False
    taken = _landing(cluster, flavor, gpus, gone) if gone else cluster.best_fit(flavor, gpus)
    for node in cluster.of(flavor):
        free = node.free + freed.get(node.name, 0) + gone.get(node.name, 0)
        if taken is node:
            free -= gpus
        if free >= preemptor.gpus:
            return True
    return False


def _landing(cluster: Cluster, flavor: str, gpus: int, gone: Mapping[str, int]) -> Node | None:
    """The node best fit would pick for `gpus` once `gone` devices are free too (fewest
    free that suffice, oldest on a tie: `Cluster.best_fit`'s rule, on a what-if)."""
    best: Node | None = None
    for node in cluster.of(flavor):
        free = node.free + gone.get(node.name, 0)
        if free >= gpus and (
            best is None
            or free < best.free + gone.get(best.name, 0)
            or (free == best.free + gone.get(best.name, 0) and node.order < best.order)
        ):
            best = node
    return best


def kept_for_reclaim(
    graces: Graces,
    req: Request,
    flavor: str,
    requests: Mapping[str, Request],
    pool_of: Mapping[str, str],
    order: Callable[[Request, str], tuple[Any, ...]],
    ledger: Ledger,
    cluster: Cluster,
    evicted: Sequence[Request] = (),
) -> bool:
    """Would admitting `req` on `flavor` take room kept for a preemptor of its pool
    (cohort) ordered ahead of it, whose victims are in their grace? `order` gives a
    request's admission-order key on a flavor. `evicted`: the victims `req` would
    preempt first (a preemptor may no more take kept room than a fitting request)."""
    pool = pool_of[req.tenant]
    key: tuple[Any, ...] | None = None
    for rc in graces:
        by = requests.get(rc.preemptor)
        if by is None or by is req or rc.flavor != flavor or pool_of[by.tenant] != pool:
            continue
        if rc.key is None:  # restored: its order as of now
            rc.key = order(by, flavor)
        if key is None:
            key = order(req, flavor)
        if rc.key < key and not keeps_room(rc, by, req.tenant, req.gpus, ledger, cluster, evicted):
            return True
    return False
