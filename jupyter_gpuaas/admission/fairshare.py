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


def tenant_rank(ledger: Ledger, head: Head, order: tuple[Any, ...]) -> Rank:
    """The head's rank at its tenant's own cohort. Whether the tenant borrows counts its
    own victims gone; its share is with the head added, as the flat order's key has it
    (one rule for a flat cohort, declared in `cohorts:` or not)."""
    tenant, flavor, gpus, own = head
    borrowing = ledger.borrows(tenant, flavor, gpus, own)
    return (borrowing, tenant_side(ledger, tenant, flavor, gpus) if borrowing else 0.0, *order)


def cohort_rank(
    ledger: Ledger,
    cohorts: Mapping[str, Cohort],
    head: Head,
    order: tuple[Any, ...],
    after: Mapping[str, int],
    child: str,
    parent: str,
) -> Rank:
    """The head's rank at `parent`, coming through its child cohort `child`, whose usage of
    the head's flavor with the head admitted is in `after` (`Ledger.usage_after`; a
    cohort absent there is unchanged)."""
    flavor = head[1]
    used = after.get(child)
    if used is None:
        used = ledger.cohort_usage(child, flavor)
    if used <= ledger.pool(child, flavor):
        return (False, 0.0, *order)
    spec = cohorts.get(child)
    weight = spec.weight if spec is not None else 1.0
    over = ledger.subtree_over(child, flavor, used)
    return (True, drs(over, ledger.lendable(parent), weight), *order)


def bracket(
    ledger: Ledger,
    cohorts: Mapping[str, Cohort],
    heads: Sequence[tuple[Head, tuple[Any, ...]]],
) -> dict[str, int]:
    """Run the tournament of every tree that has heads: the winner of each root cohort, as
    an index into `heads` (at most one head per tenant; each with its tie-break order,
    which must be unique). Heads of tenants without a cohort are not in any tree: the
    caller orders the trees' winners and those.

    A head's rank at an upper cohort is computed only if it gets there (Kueue's computeDRS
    computes them all up front): with 2,000 tenants most heads lose at their own cohort."""
    level: dict[int, int] = {}  # head index -> how far up its path it has won
    entrants: dict[str, list[int]] = {}  # cohort -> its candidates so far
    depth: dict[str, int] = {}  # cohort -> its distance from the root
    for i, (head, _) in enumerate(heads):
        path = ledger.path(head[0])
        if not path:
            continue
        level[i] = 0
        entrants.setdefault(path[0], []).append(i)
        for k, c in enumerate(path):
            if c in depth:
                break
            depth[c] = len(path) - 1 - k

    def rank(i: int) -> Rank:
        head, order = heads[i]
        k = level[i]
        if k == 0:
            return tenant_rank(ledger, head, order)
        path = ledger.path(head[0])
        after = ledger.usage_after(head[0], head[1], head[2] - head[3])
        return cohort_rank(ledger, cohorts, head, order, after, path[k - 1], path[k])

    winners: dict[str, int] = {}
    # Deepest cohorts first, so every child cohort is decided before its parent; among
    # cohorts of one depth the order does not matter (they do not meet).
    for c in sorted(depth, key=lambda c: (-depth[c], c)):
        candidates = entrants.get(c)
        if not candidates:
            continue
        best = candidates[0] if len(candidates) == 1 else min(candidates, key=rank)
        path = ledger.path(heads[best][0][0])
        k = level[best] + 1
        if k < len(path):
            level[best] = k
            entrants.setdefault(path[k], []).append(best)
        else:
            winners[c] = best
    return winners
