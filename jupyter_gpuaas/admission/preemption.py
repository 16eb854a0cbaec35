"""Kueue's classic preemption: whom to evict so that a request fits, and as few as possible.

A request may preempt when its own size fits its tenant's nominal quota, or where
`borrow_within_cohort` allows it while borrowing. Candidates are its own tenant's requests
allowed by `within_tenant`, and requests of other cohort members that are above their
nominal quota, allowed by `reclaim_within_cohort` (or, lower priority, by
`borrow_within_cohort`). Victims are searched in up to two attempts, with and without
borrowing afterwards (`find_victims` gives the order); each takes candidates greedily —
other tenants first, then lower priority, then most recently admitted — until the request
fits, and then puts back, in reverse order, every victim the request can do without.

Across flavors (nominate.py's `_choose_flavor`), one where preemption only reclaims what
other tenants borrowed is preferred over one that evicts the tenant's own by priority, then
the one where the request borrows from the lowest cohort once its victims are gone; quota
order breaks ties (Kueue's flavor assigner ranks reclaim above preempt, then the borrowing
height after the preemption).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

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


def _victim_order(
    tenant: str, hierarchical: set[str]
) -> Callable[[Request], tuple[int, int, float, int]]:
    # Groups: holders it has a hierarchical advantage over, other tenants', its own.
    def key(v: Request) -> tuple[int, int, float, int]:
        group = 2 if v.tenant == tenant else 0 if v.tenant in hierarchical else 1
        return (group, v.priority, -(v.admit_time or 0.0), -v.seq)

    return key


def find_victims(
    req: Request,
    tenant: Tenant,
    flavor: str,
    ledger: Ledger,
    cluster: Cluster,
    admitted: list[Request],
) -> list[Request] | None:
    """The requests to preempt so that `req` fits `flavor`, or None if no set will do.

    `admitted` are the requests holding devices of `flavor` in the tenant or its cohort.
    Kueue's `classicalPreemptions`: candidates are the tenant's own (allowed by
    `within_tenant`) and other members' (by `reclaim_within_cohort`, or lower priority by
    `borrow_within_cohort`); each of the latter is reclaimable while the preemptor
    borrows (lower priority under `borrow_within_cohort`) or only if it ends within
    nominal. Up to two attempts, with and without borrowing, in the order SCENARIO.md
    gives; the first that makes room wins.
    """
    p = tenant.preemption
    if (
        p.within_tenant == "Never"
        and p.reclaim_within_cohort == "Never"
        and p.borrow_within_cohort == "Never"
    ):
        return None
    bwc = p.borrow_within_cohort != "Never"
    nominal = ledger.nominal(req.tenant, flavor)
    # Kueue's flavor assigner tries preemption only when the request's own size fits the
    # tenant's nominal quota, when it may preempt while borrowing, or when it fits a
    # subtree below the root (a hierarchical advantage is possible).
    if (
        req.gpus > nominal
        and not bwc
        and not ledger.may_reclaim_in_tree(req.tenant, flavor, req.gpus)
    ):
        return None
    advantage = ledger.advantage_levels(req.tenant, flavor, req.gpus)
    mine = set(ledger.path(req.tenant))
    own: list[Request] = []
    others: list[Request] = []
    while_borrowing: set[str] = set()  # others' candidates that stay valid when borrowing
    hierarchical: set[str] = set()
    below: dict[str, tuple[str, ...]] = {}  # a holder's cohorts below the common ancestor
    # The policies' answers, asked once and not per holder (a pool holds hundreds).
    me = req.tenant
    prio = req.priority
    within = p.within_tenant
    reclaim = p.reclaim_within_cohort
    others_allowed = tenant.cohort is not None and (reclaim != "Never" or bwc)
    # Per other member, decided at its first holder: 0 lends nothing back (within nominal,
    # or its subtree within its quota), 1 a candidate owner, 2 one with a hierarchical
    # advantage over it.
    owners: dict[str, int] = {}
    # The common policy's test written out (a call less for each of the thousands of
    # holders a month's searches walk); the other policies ask `_own_allowed`.
    lower_only = within == "LowerPriority"
    for v in admitted:
        vt = v.tenant
        if vt == me:
            if v.priority < prio if lower_only else _own_allowed(within, v, req):
                own.append(v)
            continue
        if not others_allowed:
            continue
        owner = owners.get(vt)
        if owner is None:
            owner = owners[vt] = _owner(ledger, vt, flavor, mine, advantage, reclaim, below)
            if owner == 2:
                hierarchical.add(vt)
        if not owner:
            continue
        lower = v.priority < prio
        by_reclaim = reclaim == "Any" or (reclaim == "LowerPriority" and lower)
        if (owner == 2 and by_reclaim) or (bwc and lower):
            while_borrowing.add(v.id)
        elif not by_reclaim:
            continue
        others.append(v)
    if not own and not others:
        return None
    under_nominal = ledger.usage[(req.tenant, flavor)] < nominal
    attempts: tuple[bool, ...]
    if not others or (not bwc and not under_nominal):
        attempts = (True,)
    elif not bwc and not hierarchical:
        attempts = (False, True)
    else:
        attempts = (True, False)
    candidates = others + own
    order = _victim_order(req.tenant, hierarchical)
    for allow_borrow in attempts:
        if allow_borrow:
            pool = [v for v in candidates if v.tenant == req.tenant or v.id in while_borrowing]
        else:
            pool = candidates
        # Most attempts fail even with every candidate gone: ask that before sorting.
        # The order is total (it ends in the arrival number), so sorting the pool is
        # the same as taking the pool out of the sorted candidates.
        if not pool or not _all_would_do(req, flavor, ledger, cluster, pool, allow_borrow):
            continue
        pool = sorted(pool, key=order)
        victims = _minimal(req, flavor, ledger, cluster, pool, allow_borrow, below)
        if victims is not None:
            return victims
    return None


def _owner(
    ledger: Ledger,
    name: str,
    flavor: str,
    mine: set[str],
    advantage: dict[str, bool],
    reclaim: str,
    below: dict[str, tuple[str, ...]],
) -> int:
    """What another member is to a preemption search (find_victims): 0 lends nothing back,
    1 a candidate owner, 2 one the preemptor has a hierarchical advantage over. Records
    its cohorts below the common ancestor in `below` (("",) when it lends nothing)."""
    if ledger.usage[(name, flavor)] <= ledger.nominal(name, flavor):
        return 0  # a member within nominal lends nothing back
    lca = ""
    up: list[str] = []
    for c in ledger.path(name):
        if c in mine:
            lca = c
            break
        up.append(c)
    path = below[name] = tuple(up)
    if any(not ledger.over_quota(c, flavor) for c in path):
        below[name] = ("",)  # its subtree is within its quota
        return 0
    return 2 if advantage.get(lca, False) and reclaim != "Never" else 1


def _all_would_do(
    req: Request,
    flavor: str,
    ledger: Ledger,
    cluster: Cluster,
    candidates: list[Request],
    allow_borrow: bool,
) -> bool:
    """Would `req` fit with every candidate gone? Evicting all frees at least as much as
    any set the greedy pass could pick, so if not, no set will: one check instead of one
    per candidate."""
    removed: dict[str, int] = {}
    for v in candidates:
        removed[v.tenant] = removed.get(v.tenant, 0) + v.gpus
    return ledger.fits(
        req.tenant, flavor, req.gpus, removed, allow_borrow
    ) and cluster.has_room_without(flavor, req.gpus, candidates)


def _minimal(
    req: Request,
    flavor: str,
    ledger: Ledger,
    cluster: Cluster,
    candidates: list[Request],
    allow_borrow: bool,
    below: dict[str, tuple[str, ...]],
) -> list[Request] | None:
    """Evict `candidates` (already in victim order, and known to make room all together:
    `_all_would_do`) until `req` fits, then put back, in reverse order, every earlier
    victim it can do without (Kueue's fillBackWorkloads)."""
    removed: dict[str, int] = defaultdict(int)
    freed: dict[str, int] = defaultdict(int)

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
            # ... and whose cohorts below the common ancestor are still over their quota.
            if any(not ledger.over_quota(c, flavor, removed) for c in below.get(v.tenant, ())):
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


def preemption_candidates(
    spec: Tenant,
    ledger: Ledger,
    held_by_priority: dict[tuple[str, str], dict[int, int]],
    flavor: str,
    prio: int,
) -> tuple[dict[str, int], bool, bool]:
    """For a head of `spec`'s tenant at priority `prio` on `flavor`: GPUs held by every
    candidate per owner (the tenant itself first, with 0 when none of its own is one),
    whether any candidate is the tenant's own, and whether the tenant may stay borrowing
    once they are gone (Kueue's attempt with borrowing). The holders cache it per pool
    version; the room it leaves in quota is `preemption_room`, asked only when the GPUs
    held could be enough."""
    tenant = spec.name
    p = spec.preemption
    own_gpus = 0
    if p.within_tenant != "Never":
        equal_too = p.within_tenant == "LowerOrNewerEqualPriority"
        for q, held in held_by_priority.get((tenant, flavor), {}).items():
            if q < prio or (q == prio and equal_too):
                own_gpus += held
    removed: dict[str, int] = {tenant: own_gpus}
    if spec.cohort and (p.reclaim_within_cohort != "Never" or p.borrow_within_cohort != "Never"):
        anyone = p.reclaim_within_cohort == "Any"
        for name in ledger.borrowers(tenant, flavor):
            if name == tenant:
                continue  # only members above nominal: others' requests cannot be reclaimed
            by_prio = held_by_priority.get((name, flavor), {})
            held = sum(g for q, g in by_prio.items() if anyone or q < prio)
            if held:
                # All of it, not just what it borrowed: the last victim may overshoot.
                removed[name] = held
    borrow_ok = p.borrow_within_cohort != "Never" or own_gpus > 0 or len(ledger.path(tenant)) > 1
    return removed, own_gpus > 0, borrow_ok


def preemption_room(
    spec: Tenant, flavor: str, ledger: Ledger, removed: dict[str, int], borrow_ok: bool
) -> tuple[int, int]:
    """What evicting could do for the tenant's quota of `flavor`, with `removed` its
    candidates' GPUs: (the most GPUs some victim set could make room for, the most for
    which other members' holders can help).

    In a tree, or with `borrow_within_cohort`: the room with every candidate gone, both.
    In a flat cohort without it, `find_victims` allows less, and the bound follows it:
    no head larger than nominal preempts; a head that would end above nominal may evict
    only its own (the attempt with borrowing); others' holders help only a tenant ending
    within nominal (the attempt without). Nine in ten searches that passed the looser
    bound failed on it."""
    tenant = spec.name
    if len(ledger.path(tenant)) > 1 or spec.preemption.borrow_within_cohort != "Never":
        room = ledger.room(tenant, flavor, removed, borrow_ok)
        return room, room
    own = removed.get(tenant, 0)
    room_own = ledger.room(tenant, flavor, {tenant: own} if own else None, True)
    nominal = ledger.nominal(tenant, flavor)
    room_all = 0
    if ledger.usage[(tenant, flavor)] < nominal:
        room_all = ledger.room(tenant, flavor, removed, False)
    return min(nominal, max(room_own, room_all)), room_all
