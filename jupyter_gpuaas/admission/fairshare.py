"""Fair sharing in a cohort tree: Kueue's tournament, level by level.

Two heads of one tree meet at their lowest common cohort. There, the child subtree on
each side (a cohort, or the tenant itself) is compared as it would be with the head
admitted (Kueue simulates the addition): the one that does not borrow wins, then the
lower weighted share — what it borrows beyond its subtree quota, over the parent's
subtree quota, over its weight. A tie leaves the order to the plain admission key
(priority, then queue time). Flat cohorts are a tree of one level, where this is the
weighted share of the flat rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from .ledger import Ledger
from .levels import beyond
from .model import Cohort, Tenant

# tenant, flavor, GPUs, and the GPUs of its own tenant's requests it would evict: a
# preemptor is ranked as its tenant would stand after the eviction, as in the flat order.
Head = tuple[str, str, int, int]


def share(ledger: Ledger, tenant: str, flavor: str = "", gpus: int = 0) -> float:
    """A tenant's weighted share (the flat rule, and a tenant's side of the tournament):
    the largest of borrowed / pool / weight over its flavors, with `gpus` more of `flavor`
    held (the head being ranked, as if admitted). The pool is the subtree quota of the
    tenant's cohort."""
    t = ledger.tenants[tenant]
    if t.cohort is None:
        return 0.0
    best = 0.0
    for f in t.quota:
        pool = ledger.pool(t.cohort, f)
        b = ledger.borrowed(tenant, f)
        if f == flavor and gpus:
            b = beyond(ledger.usage[(tenant, f)] + gpus, ledger.nominal(tenant, f))
        if b and pool:
            weighted = b / pool / t.weight
            if weighted > best:
                best = weighted
    return best


def _side(
    ledger: Ledger,
    tenants: Mapping[str, Tenant],
    cohorts: Mapping[str, Cohort],
    head: Head,
    child: str,
    parent: str,
) -> tuple[bool, float]:
    tenant, flavor, gpus, own = head
    if child == tenant:
        borrowing = ledger.borrows(tenant, flavor, gpus, own)
        return borrowing, share(ledger, tenant, flavor, gpus) if borrowing else 0.0
    after = ledger.usage_after(tenant, flavor, gpus - own).get(
        child, ledger.cohort_usage(child, flavor)
    )
    over = after - ledger.pool(child, flavor)
    if over <= 0:
        return False, 0.0
    pool = ledger.pool(parent, flavor)
    spec = cohorts.get(child)
    weight = spec.weight if spec is not None else 1.0
    return True, over / pool / weight if pool else float("inf")


def tournament(
    ledger: Ledger,
    tenants: Mapping[str, Tenant],
    cohorts: Mapping[str, Cohort],
    a: Head,
    b: Head,
) -> bool | None:
    """True when head `a` wins over `b`, False when `b` does, None when the tournament
    does not decide (another tree, or a tie)."""
    pa, pb = ledger.path(a[0]), ledger.path(b[0])
    if not pa or not pb or pa[-1] != pb[-1]:
        return None
    # Walk down from the root while both heads are in the same subtree.
    chain_a, chain_b = (*reversed(pa), a[0]), (*reversed(pb), b[0])
    i = 0
    while i + 1 < len(chain_a) and i + 1 < len(chain_b) and chain_a[i + 1] == chain_b[i + 1]:
        i += 1
    if i + 1 >= len(chain_a) or i + 1 >= len(chain_b):
        return None
    lca = chain_a[i]
    sa = _side(ledger, tenants, cohorts, a, chain_a[i + 1], lca)
    sb = _side(ledger, tenants, cohorts, b, chain_b[i + 1], lca)
    if sa == sb:
        return None
    return sa < sb
