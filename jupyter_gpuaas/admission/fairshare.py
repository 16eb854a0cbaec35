"""Fair sharing in a cohort tree: Kueue's tournament, a bracket run bottom-up.

Each cohort picks one head among its children's candidates (a member tenant's own head, a
child cohort's winner), and only that head goes on to the cohort above, so a head that
lost at its own cohort never reaches the root. At a cohort, a candidate is ranked by the
child it comes through (the tenant, or the child cohort), as that child would stand with
the head admitted (Kueue simulates the addition):
1. a child that does not borrow on the head's flavor wins;
2. then, among children that borrow on it, the lower dominant resource share (`drs`): what
   the child uses beyond its own (subtree) quota, summed over the flavors, times 1000, over
   what the cohort could lend it (`Ledger.lendable`: the cohort's potential available,
   summed over the flavors), over the child's weight;
3. then the tie-break order the caller gives (priority, then queue time, then arrival),
   which is total: the winner does not depend on the order the heads come in.
A flat cohort is a tree of one level, where this is the weighted share of the flat rule.

A pairwise scan ("keep the better of two at their lowest common cohort") is not this: a
head's share at an upper cohort depends on its own size, so that relation is not
transitive and the scan's answer followed the order of the heads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from .ledger import Ledger
from .levels import beyond
from .model import Cohort

# tenant, flavor, GPUs, and the GPUs of its own tenant's requests it would evict: a
# preemptor is ranked as its tenant would stand after the eviction, as in the flat order.
Head = tuple[str, str, int, int]

# At one cohort: (borrows on the head's flavor, dominant resource share, *tie-break order).
Rank = tuple[Any, ...]


def drs(borrowed: int, lendable: int, weight: float) -> float:
    """Kueue's weighted dominant resource share (one resource: GPUs). A child that borrows
    from a parent with nothing to lend has share 0, as in Kueue (it still borrows)."""
    if borrowed <= 0 or lendable <= 0:
        return 0.0
    return borrowed * 1000.0 / lendable / weight


def tenant_side(ledger: Ledger, tenant: str, flavor: str = "", gpus: int = 0) -> float:
    """A tenant's share at its cohort, with `gpus` more of `flavor` held (negative: fewer)."""
    t = ledger.tenants[tenant]
    if t.cohort is None:
        return 0.0
    borrowed = 0
    for f in t.quota:
        used = ledger.usage[(tenant, f)]
        if f == flavor:
            used += gpus
        borrowed += beyond(used, ledger.nominal(tenant, f))
    return drs(borrowed, ledger.lendable(t.cohort), t.weight)


def share(ledger: Ledger, tenant: str, flavor: str = "", gpus: int = 0) -> float:
    """A tenant's weighted share (the flat rule, and a tenant's side of the tournament),
    with the head being ranked (`gpus` of `flavor`) as if admitted."""
    return tenant_side(ledger, tenant, flavor, gpus)


def ranks(
    ledger: Ledger,
    cohorts: Mapping[str, Cohort],
    head: Head,
    order: tuple[Any, ...],
) -> list[Rank]:
    """The head's rank at each cohort of its tenant's path, from its own to the root (the
    root's is the last): Kueue's computeDRS, once per head."""
    tenant, flavor, gpus, own = head
    path = ledger.path(tenant)
    if not path:
        return []
    delta = gpus - own
    # The tenant at its own cohort. Whether it borrows counts its own victims gone; its
    # share is with the head added, as the flat order's key has it (one rule for a flat
    # cohort, declared in `cohorts:` or not).
    borrowing = ledger.borrows(tenant, flavor, gpus, own)
    side = tenant_side(ledger, tenant, flavor, gpus) if borrowing else 0.0
    out: list[Rank] = [(borrowing, side, *order)]
    after = ledger.usage_after(tenant, flavor, delta)
    for child, parent in pairwise(path):
        used = after.get(child)
        if used is None:
            used = ledger.cohort_usage(child, flavor)
        borrowing = used > ledger.pool(child, flavor)
        side = 0.0
        if borrowing:
            spec = cohorts.get(child)
            weight = spec.weight if spec is not None else 1.0
            side = drs(ledger.subtree_over(child, flavor, used), ledger.lendable(parent), weight)
        out.append((borrowing, side, *order))
    return out


def bracket(
    ledger: Ledger,
    cohorts: Mapping[str, Cohort],
    heads: Sequence[tuple[Head, tuple[Any, ...]]],
) -> dict[str, int]:
    """Run the tournament of every tree that has heads: the winner of each root cohort, as
    an index into `heads` (at most one head per tenant; each with its tie-break order,
    which must be unique). Heads of tenants without a cohort are not in any tree: the
    caller orders the trees' winners and those."""
    # cohort -> its children's candidates: (child name, head index). A tenant's head enters
    # at its own cohort; a child cohort's winner is added once that cohort is decided.
    rank_of: dict[int, list[Rank]] = {}
    level: dict[int, int] = {}  # head index -> how far up its path it has won
    entrants: dict[str, list[int]] = {}
    depth: dict[str, int] = {}  # cohort -> its distance from the root
    for i, (head, order) in enumerate(heads):
        path = ledger.path(head[0])
        if not path:
            continue
        rank_of[i] = ranks(ledger, cohorts, head, order)
        level[i] = 0
        entrants.setdefault(path[0], []).append(i)
        for k, c in enumerate(path):
            depth[c] = len(path) - 1 - k
    winners: dict[str, int] = {}
    # Deepest cohorts first, so every child cohort is decided before its parent; among
    # cohorts of one depth the order does not matter (they do not meet).
    for c in sorted(depth, key=lambda c: (-depth[c], c)):
        candidates = entrants.get(c)
        if not candidates:
            continue
        best = min(candidates, key=lambda i: rank_of[i][level[i]])
        path = ledger.path(heads[best][0][0])
        k = level[best]
        if k + 1 < len(path):
            level[best] = k + 1
            entrants.setdefault(path[k + 1], []).append(best)
        else:
            winners[c] = best
    return winners
