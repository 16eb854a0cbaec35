"""The quota tree's nodes for one flavor, as the ledger keeps them (ledger.py), and Kueue's
`available` walked over them.

A :class:`Level` is one cohort's resource node for a flavor, a :class:`TenantQuota` one
tenant's quota of a flavor with its cohorts' levels up to the root. The admission cycle
asks `available` millions of times: fields of objects built once per configuration, not
lookups in dicts keyed by (cohort, flavor) tuples. A :class:`Version` counts the changes of
one pool's usage, for the answers cached against it (holders.py).
"""

from __future__ import annotations


class Version:
    """A counter that cached answers are kept against. The cache keeps the counter itself,
    so checking an answer costs an attribute read, not a dict lookup."""

    def __init__(self) -> None:
        self.n = 0


class Level:
    """One cohort's resource node for one flavor: subtree quota, local quota and borrowing
    limit (fixed until the ledger is reconfigured), and usage (live)."""

    def __init__(self, name: str, sq: int, lq: int, limit: int | None) -> None:
        self.name = name
        self.sq = sq
        self.lq = lq
        self.limit = limit
        self.used = 0


class TenantQuota:
    """A tenant's quota of one flavor, with its cohorts' levels from its own to the root."""

    def __init__(self, nominal: int, guaranteed: int, limit: int | None, levels: list[Level]):
        self.nominal = nominal
        self.guaranteed = guaranteed
        self.limit = limit
        self.levels = levels
        self.used = 0  # the tenant's usage of the flavor (the ledger's `usage`, kept here too)


def beyond(used: int, local: int) -> int:
    """What `used` takes beyond a `local` quota: what a level passes up to its parent.
    (A compare, not max(0, ...): interpreted, the builtin call costs several times more,
    and a month asks this millions of times.)"""
    return used - local if used > local else 0


def _step(parent_avail: int, sq: int, lq: int, used: int, limit: int | None) -> int:
    """One level down Kueue's `available`: its unused local quota plus what its parent has
    available, capped by its borrowing limit. (Comparisons, not max/min: interpreted, a
    builtin call costs seven times a compare, and this runs millions of times a month.)"""
    if limit is not None:
        over = used - lq
        cap = sq - lq - (over if over > 0 else 0) + limit
        if cap < parent_avail:
            parent_avail = cap
    unused = lq - used
    return (unused if unused > 0 else 0) + parent_avail


def available(q: TenantQuota, used: int, cu: dict[str, int]) -> int:
    """Kueue's `available`: how much more the tenant may take, walking from its root
    down (`cu` overrides cohort usages; `used` is the tenant's own)."""
    levels = q.levels
    n = len(levels)
    if not n:
        return q.nominal - used
    root = levels[n - 1]
    a = root.sq - (cu.get(root.name, root.used) if cu else root.used)
    if n > 1:  # (a flat cohort has its root alone: no range to build)
        for i in range(n - 2, -1, -1):
            lv = levels[i]
            a = _step(a, lv.sq, lv.lq, cu.get(lv.name, lv.used) if cu else lv.used, lv.limit)
    return _step(a, q.nominal, q.guaranteed, used, q.limit)


def potential(q: TenantQuota) -> int:
    """Kueue's potential available: the most the tenant could hold with everyone else idle."""
    levels = q.levels
    if not levels:
        return q.nominal
    a = levels[-1].sq
    for i in range(len(levels) - 2, -1, -1):
        lv = levels[i]
        a = lv.lq + a
        if lv.limit is not None:
            a = min(a, lv.sq + lv.limit)
    a = q.guaranteed + a
    if q.limit is not None:
        a = min(a, q.nominal + q.limit)
    return a
