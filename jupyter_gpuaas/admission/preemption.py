"""Kueue's classic preemption: whom to evict so that a request fits, and as few as possible.

A request may preempt when, with its victims gone, it fits within its tenant's nominal
quota; or, where `borrow_within_cohort` allows, while borrowing. Candidates are its own
tenant's requests allowed by `within_tenant`, and requests of other cohort members that
are above their nominal quota, allowed by `reclaim_within_cohort` (or, when the preemptor
borrows, by `borrow_within_cohort`). Victims are taken greedily — other tenants first,
then lower priority, then most recently admitted — until the request fits, and the set is
then minimised by putting back every victim the request can do without.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from .ledger import Ledger
from .model import Request, Tenant
from .nodes import Cluster


def _own_allowed(policy: str, victim: Request, req: Request) -> bool:
    if policy == "LowerPriority":
        return victim.priority < req.priority
    if policy == "LowerOrNewerEqualPriority":
        if victim.priority != req.priority:
            return victim.priority < req.priority
        return (victim.queue_time, victim.seq) > (req.queue_time, req.seq)
    return False


def _victim_order(tenant: str) -> object:
    def key(v: Request) -> tuple[bool, int, float, int]:
        return (v.tenant == tenant, v.priority, -(v.admit_time or 0.0), -v.seq)

    return key


def find_victims(
    req: Request,
    tenant: Tenant,
    flavor: str,
    ledger: Ledger,
    cluster: Cluster,
    admitted: Iterable[Request],
) -> list[Request] | None:
    """The requests to preempt so that `req` fits `flavor`, or None if no set will do.

    `admitted` are the requests holding devices of `flavor` in the tenant or its cohort.
    """
    p = tenant.preemption
    if (
        p.within_tenant == "Never"
        and p.reclaim_within_cohort == "Never"
        and p.borrow_within_cohort == "Never"
    ):
        return None
    own: list[Request] = []
    reclaim: list[Request] = []  # other members' requests, by reclaim_within_cohort
    lower: list[Request] = []  # other members' lower-priority requests
    for v in admitted:
        if v.tenant == req.tenant:
            if _own_allowed(p.within_tenant, v, req):
                own.append(v)
        elif tenant.cohort is not None:
            if p.reclaim_within_cohort == "Any" or (
                p.reclaim_within_cohort == "LowerPriority" and v.priority < req.priority
            ):
                reclaim.append(v)
            if v.priority < req.priority:
                lower.append(v)
    # Within nominal quota once the victims are gone: reclaim what the cohort borrowed.
    victims = _minimal(req, flavor, ledger, cluster, own + reclaim, allow_borrow=False)
    if victims is None and p.borrow_within_cohort == "LowerPriority":
        # Borrowing: only lower-priority requests of other members may make room.
        victims = _minimal(req, flavor, ledger, cluster, own + lower, allow_borrow=True)
    return victims


def _minimal(
    req: Request,
    flavor: str,
    ledger: Ledger,
    cluster: Cluster,
    candidates: list[Request],
    allow_borrow: bool,
) -> list[Request] | None:
    if not candidates:
        return None
    removed: dict[str, int] = defaultdict(int)
    freed: dict[str, int] = defaultdict(int)
    # Most searches fail. Evicting every candidate frees at least as much as any set the
    # greedy pass could pick, so if even that does not fit, no set will: one check instead
    # of one per candidate, and no sort.
    for v in candidates:
        removed[v.tenant] += v.gpus
        freed[v.node or ""] += v.gpus
    if not (
        ledger.fits(req.tenant, flavor, req.gpus, removed, allow_borrow)
        and cluster.has_room(flavor, req.gpus, freed)
    ):
        return None
    removed.clear()
    freed.clear()
    candidates.sort(key=_victim_order(req.tenant))  # type: ignore[arg-type]

    def fits() -> bool:
        return ledger.fits(
            req.tenant, flavor, req.gpus, removed, allow_borrow
        ) and cluster.has_room(flavor, req.gpus, freed)

    targets: list[Request] = []
    for v in candidates:
        if v.tenant != req.tenant:
            # Only a member still above its nominal quota may be reclaimed from.
            left = ledger.usage[(v.tenant, flavor)] - removed[v.tenant]
            if left <= ledger.nominal(v.tenant, flavor):
                continue
        targets.append(v)
        removed[v.tenant] += v.gpus
        freed[v.node or ""] += v.gpus
        if fits():
            break
    else:
        return None
    for i in range(len(targets) - 2, -1, -1):
        v = targets[i]
        removed[v.tenant] -= v.gpus
        freed[v.node or ""] -= v.gpus
        if fits():
            targets.pop(i)
        else:
            removed[v.tenant] += v.gpus
            freed[v.node or ""] += v.gpus
    return targets


def preemption_room(
    spec: Tenant,
    ledger: Ledger,
    held_by_priority: Mapping[tuple[str, str], Mapping[int, int]],
    flavor: str,
    prio: int,
) -> tuple[int, int, bool, list[str]]:
    """For a head of `spec`'s tenant at priority `prio` on `flavor`: GPUs held by every
    candidate, room in quota once they are gone, whether any candidate is the tenant's
    own, and which members' are candidates (the core caches it per pool version)."""
    tenant = spec.name
    p = spec.preemption
    own_gpus = 0
    if p.within_tenant != "Never":
        equal_too = p.within_tenant == "LowerOrNewerEqualPriority"
        for q, held in held_by_priority.get((tenant, flavor), {}).items():
            if q < prio or (q == prio and equal_too):
                own_gpus += held
    others: list[str] = []
    removed: dict[str, int] = {tenant: own_gpus}
    if spec.cohort and (p.reclaim_within_cohort != "Never" or p.borrow_within_cohort != "Never"):
        anyone = p.reclaim_within_cohort == "Any"
        usage = ledger.usage
        for name in ledger.members[spec.cohort]:
            if name == tenant or usage[(name, flavor)] <= ledger.nominal(name, flavor):
                continue  # not borrowing: none of its requests can be reclaimed
            by_prio = held_by_priority.get((name, flavor), {})
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
