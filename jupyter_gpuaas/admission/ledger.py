"""The quota ledger: who holds how much of which flavor, and what may still be borrowed.

Usage counts admitted and parked GPUs. Quota is a tree, as in Kueue's hierarchical
cohorts: tenants are leaves, cohorts inner nodes (a flat cohort is a root whose children
are its members). Per node and flavor (Kueue's resource node):

- subtree quota: a tenant's nominal; a cohort's own quota plus, per child, what the child
  lends it (the child's subtree quota minus its local quota);
- local quota: what the node keeps for itself and never lends (a tenant: nominal minus
  lendable; a cohort: subtree quota minus its lending limit, or 0 without one);
- usage: a tenant's GPUs; a cohort's, the sum over children of what each uses beyond its
  local quota.

A node may take `available` more: at the root, subtree quota minus usage; below, its unused
local quota plus what its parent has available, capped by its borrowing limit. So for flat
cohorts, sum over members of max(0, usage - guaranteed) <= sum of lendable, as before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from .levels import Level, TenantQuota, Version, available, beyond, potential
from .model import Config, Tenant

_NOBODY: Final[dict[str, None]] = {}  # never written: the borrowers of a tenant without a cohort
_UNCHANGED: Final[dict[str, int]] = {}  # never written: no cohort usage overridden


class Ledger:
    def __init__(self, config: Config) -> None:
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.parked: dict[tuple[str, str], int] = defaultdict(int)
        # Per (cohort, flavor): its Level, which holds the cohort's usage.
        self._levels: dict[tuple[str, str], Level] = {}
        # Bumps on every change of usage in one (root cohort, flavor), or (tenant, flavor)
        # for a tenant without a cohort: what a cached answer about that pool's quota (a
        # preemption bound's room) depends on. A plain dict: mypyc reads it natively.
        self.pool_version: dict[tuple[str, str], Version] = {}
        # Told (root cohort, flavor) when a member starts or stops borrowing (holders.py
        # keeps preemption bounds that list the borrowers).
        self.on_borrowers: Callable[[str, str], None] | None = None
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Adopt new quotas, keeping usage: an admin's change never evicts anyone."""
        self.tenants: Mapping[str, Tenant] = config.tenants
        flavors = list(config.flavors)
        # Per (tenant, flavor): nominal, local (guaranteed) quota, borrowing limit.
        # Flat dicts, because the admission cycle asks these questions millions of times.
        self._nominal: dict[tuple[str, str], int] = {}
        self._guaranteed: dict[tuple[str, str], int] = {}
        self._limit: dict[tuple[str, str], int | None] = {}
        # Per (cohort, flavor): subtree quota, local quota, borrowing limit.
        self._sq: dict[tuple[str, str], int] = defaultdict(int)
        self._lq: dict[tuple[str, str], int] = defaultdict(int)
        self._climit: dict[tuple[str, str], int | None] = {}
        self._cohort: dict[str, str | None] = {}
        self._potential: dict[tuple[str, str], int] = {}  # per (cohort, flavor)
        parent: dict[str, str | None] = {c.name: c.parent for c in config.cohorts.values()}
        for t in config.tenants.values():
            self._cohort[t.name] = t.cohort
            if t.cohort is not None:
                parent.setdefault(t.cohort, None)  # a flat cohort: a root of its own
            for f, nominal in t.quota.items():
                self._nominal[(t.name, f)] = nominal
                self._guaranteed[(t.name, f)] = t.guaranteed(f)
                self._limit[(t.name, f)] = t.borrowing_limit.get(f)
        self._parent = parent
        # Path from each cohort to its root, and the root of each tenant's tree.
        self._up: dict[str, tuple[str, ...]] = {}
        for c in parent:
            path = [c]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]] or "")
            self._up[c] = tuple(path)
        self._path: dict[str, tuple[str, ...]] = {
            t: self._up[c] if c is not None else () for t, c in self._cohort.items()
        }
        # Height of each cohort: 1 above tenants only, 1 + its highest child cohort's.
        self._height: dict[str, int] = defaultdict(lambda: 1)
        for c in sorted(parent, key=lambda c: -len(self._up[c])):
            above = parent[c]
            if above is not None:
                self._height[above] = max(self._height[above], self._height[c] + 1)
        self.members: dict[str, list[str]] = defaultdict(list)  # root cohort -> tenants
        for name, up in self._path.items():
            if up:
                self.members[up[-1]].append(name)
        # Subtree quotas bottom-up: what tenants lend, then the deepest cohorts first.
        for t in config.tenants.values():
            if t.cohort is not None:
                for f in t.quota:
                    self._sq[(t.cohort, f)] += t.lendable(f)
        for c in sorted(parent, key=lambda c: -len(self._up[c])):
            spec = config.cohorts.get(c)
            for f in flavors:
                key = (c, f)
                self._sq[key] += spec.quota.get(f, 0) if spec else 0
                if spec is not None and f in spec.lending_limit:
                    self._lq[key] = max(0, self._sq[key] - spec.lending_limit[f])
                self._climit[key] = spec.borrowing_limit.get(f) if spec else None
                above = parent[c]
                if above is not None:
                    self._sq[(above, f)] += self._sq[key] - self._lq[key]
        # Kueue's calculateLendable per cohort: its potential available summed over the
        # flavors (all of them GPUs, one resource). Fixed until the next reconfiguration.
        self._lendable: dict[str, int] = {}
        for c in sorted(parent, key=lambda c: len(self._up[c])):  # parents first
            above = parent[c]
            total = 0
            for f in flavors:
                key = (c, f)
                if above is None:
                    avail = self._sq[key]
                else:
                    avail = self._lq[key] + self._potential[(above, f)]
                    limit = self._climit.get(key)
                    if limit is not None and self._sq[key] + limit < avail:
                        avail = self._sq[key] + limit
                self._potential[key] = avail
                total += avail
            self._lendable[c] = total
        self._levels = {
            (c, f): Level(c, self._sq[(c, f)], self._lq[(c, f)], self._climit.get((c, f)))
            for c in parent
            for f in flavors
        }
        self._of_cohort: dict[str, list[tuple[str, Level]]] = defaultdict(list)
        for (c, f), lv in self._levels.items():
            self._of_cohort[c].append((f, lv))
        # tenant -> flavor -> its quota, with its usage: string keys, no tuple to build
        # for each of the millions of `fits` of a month.
        self._quotas: dict[str, dict[str, TenantQuota]] = {t: {} for t in config.tenants}
        for key, nominal in self._nominal.items():
            q = TenantQuota(
                nominal,
                self._guaranteed[key],
                self._limit[key],
                [self._level(c, key[1]) for c in self._path[key[0]]],
            )
            q.used = self.usage.get(key, 0)
            self._quotas[key[0]][key[1]] = q
        for (tenant, flavor), used in list(self.usage.items()):
            if used and tenant in self._cohort:
                self._propagate(tenant, flavor, 0, used)
        # Per (root cohort, flavor): the members above their nominal quota, the only ones
        # a preemptor may reclaim from (a preemption bound asks it for every sleeping head).
        self._borrowers: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)
        for (tenant, flavor), used in list(self.usage.items()):
            tree_path = self._path.get(tenant, ())
            if tree_path and used > self._nominal.get((tenant, flavor), 0):
                self._borrowers[(tree_path[-1], flavor)][tenant] = None

    # --- changes -------------------------------------------------------------------

    def add(self, tenant: str, flavor: str, gpus: int) -> None:
        self._move(tenant, flavor, gpus)

    def remove(self, tenant: str, flavor: str, gpus: int) -> None:
        self._move(tenant, flavor, -gpus)

    def undo(self, moves: list[tuple[str, str, int]], versions: dict[tuple[str, str], int]) -> None:
        """Take back tentative `add`s (tenant, flavor, gpus) and put the pools' versions
        back as they were (`versions`, read before the first): the ledger is as before, so
        what was cached on those versions (the preemption bounds) still holds."""
        for tenant, flavor, gpus in reversed(moves):
            self._move(tenant, flavor, -gpus)
        for pool, n in versions.items():
            self.version(pool).n = n

    def version(self, pool: tuple[str, str]) -> Version:
        """The usage version of a pool (a key of `pool_of`)."""
        v = self.pool_version.get(pool)
        if v is None:
            v = self.pool_version[pool] = Version()
        return v

    def pool_of(self, tenant: str, flavor: str) -> tuple[str, str]:
        """The key of the tenant's pool in `pool_version`: (root cohort, flavor), or
        (tenant, flavor) without a cohort."""
        path = self._path[tenant]
        return (path[-1] if path else tenant, flavor)

    def _move(self, tenant: str, flavor: str, delta: int) -> None:
        key = (tenant, flavor)
        before = self.usage[key]
        self.usage[key] = before + delta
        q = self._quota(tenant, flavor)
        if q is not None:
            q.used = before + delta
        path = self._path[tenant]
        if path:
            self._propagate(tenant, flavor, before, before + delta)
            pool = (path[-1], flavor)
            self.version(pool).n += 1
            nominal = self._nominal.get(key, 0)
            if (before > nominal) != (before + delta > nominal):
                if before + delta > nominal:
                    self._borrowers[pool][tenant] = None
                else:
                    del self._borrowers[pool][tenant]
                if self.on_borrowers is not None:
                    self.on_borrowers(pool[0], flavor)
        else:
            self.version(key).n += 1

    def _propagate(self, tenant: str, flavor: str, before: int, after: int) -> None:
        """Carry a tenant's change of usage up its cohorts: each level passes on what
        changes beyond its local quota."""
        g = self._guaranteed.get((tenant, flavor), 0)
        delta = beyond(after, g) - beyond(before, g)
        for c in self._path[tenant]:
            if not delta:
                return
            lv = self._level(c, flavor)
            b = lv.used
            lv.used = b + delta
            delta = beyond(b + delta, lv.lq) - beyond(b, lv.lq)

    def _quota(self, tenant: str, flavor: str) -> TenantQuota | None:
        of_tenant = self._quotas.get(tenant)
        return None if of_tenant is None else of_tenant.get(flavor)

    def _level(self, cohort: str, flavor: str) -> Level:
        """The cohort's level of the flavor (one is made for a flavor the config lacks)."""
        lv = self._levels.get((cohort, flavor))
        if lv is None:
            lv = self._levels[(cohort, flavor)] = Level(
                cohort, self._sq[(cohort, flavor)], self._lq[(cohort, flavor)], None
            )
        return lv

    # --- questions -----------------------------------------------------------------

    def nominal(self, tenant: str, flavor: str) -> int:
        return self._nominal.get((tenant, flavor), 0)

    def borrowed(self, tenant: str, flavor: str) -> int:
        key = (tenant, flavor)
        return beyond(self.usage[key], self._nominal.get(key, 0))

    def pool(self, cohort: str, flavor: str) -> int:
        """A cohort's subtree quota of `flavor` (for a flat cohort: what its members lend)."""
        return self._sq[(cohort, flavor)]

    def lendable(self, cohort: str) -> int:
        """What a cohort's children are measured against in fair sharing (Kueue's
        calculateLendable): the most its subtree could use of every flavor with all
        else idle, including what it may borrow from above, summed over the flavors."""
        return self._lendable.get(cohort, 0)

    def subtree_over(self, cohort: str, flavor: str = "", used: int = 0) -> int:
        """What the cohort's subtree uses beyond its subtree quota, summed over the
        flavors, with its usage of `flavor` taken as `used` (the rest as they are)."""
        total = 0
        for f, lv in self._of_cohort.get(cohort, ()):
            total += beyond(used if f == flavor else lv.used, lv.sq)
        return total

    def root(self, tenant: str) -> str:
        """The root cohort of the tenant's tree, or the tenant itself without a cohort."""
        path = self._path[tenant]
        return path[-1] if path else tenant

    def tree(self, tenant: str) -> Sequence[str]:
        """The tenants sharing quota with `tenant` (itself included): its whole tree."""
        path = self._path[tenant]
        return self.members[path[-1]] if path else (tenant,)

    def borrowers(self, tenant: str, flavor: str) -> dict[str, None]:
        """The members of the tenant's tree above their nominal quota of `flavor` (the keys;
        a dict, not an abstract iterable: mypyc iterates a dict natively)."""
        path = self._path[tenant]
        return self._borrowers[(path[-1], flavor)] if path else _NOBODY

    def path(self, tenant: str) -> tuple[str, ...]:
        """The tenant's cohorts, from its own up to the root (empty without a cohort)."""
        return self._path[tenant]

    def cohort_usage(self, cohort: str, flavor: str) -> int:
        return self._level(cohort, flavor).used

    def over_quota(self, cohort: str, flavor: str, removed: dict[str, int] | None = None) -> bool:
        """Does the cohort's subtree use more than its subtree quota (Kueue: not within
        nominal)? `removed` takes GPUs away from tenants first."""
        used = self._with_removed(flavor, removed or {}).get(cohort)
        if used is None:
            used = self._level(cohort, flavor).used
        return used > self._sq[(cohort, flavor)]

    def usage_after(self, tenant: str, flavor: str, gpus: int) -> dict[str, int]:
        """Cohort usages on the tenant's path with `gpus` more held (changed ones only)."""
        return self._with_removed(flavor, {tenant: -gpus})

    def _with_removed(self, flavor: str, removed: dict[str, int]) -> dict[str, int]:
        """Cohort usages with `removed` GPUs taken from those tenants (changed ones only)."""
        out: dict[str, int] = {}
        for name, gone in removed.items():
            if not gone:
                continue
            path = self._path.get(name)
            if not path:
                continue
            key = (name, flavor)
            u = self.usage[key]
            g = self._guaranteed.get(key, 0)
            delta = beyond(u - gone, g) - beyond(u, g)
            for c in path:
                if not delta:
                    break
                lv = self._level(c, flavor)
                b = out.get(c)
                if b is None:
                    b = lv.used
                out[c] = b + delta
                delta = beyond(b + delta, lv.lq) - beyond(b, lv.lq)
        return out

    def fits(
        self,
        tenant: str,
        flavor: str,
        gpus: int,
        removed: dict[str, int] | None = None,
        allow_borrow: bool = True,
    ) -> bool:
        """Would `gpus` more fit the tenant's quota of `flavor`?

        `removed` takes GPUs away from tenants first (per tenant, this flavor): the
        preemption search asks "would it fit if these victims went?".
        """
        q = self._quota(tenant, flavor)
        if q is None:
            return False  # a flavor absent from the tenant's quota is not usable by it
        used = q.used
        if removed:
            used -= removed.get(tenant, 0)
        if not allow_borrow and used + gpus > q.nominal:
            return False
        cu = self._with_removed(flavor, removed) if removed else _UNCHANGED
        return gpus <= available(q, used, cu)

    def room(
        self,
        tenant: str,
        flavor: str,
        removed: dict[str, int] | None = None,
        allow_borrow: bool = True,
    ) -> int:
        """The most GPUs of `flavor` the tenant's quota would admit right now (with the
        `removed` GPUs gone first): the largest `gpus` for which `fits` is true."""
        q = self._quota(tenant, flavor)
        if q is None:
            return 0
        used = q.used - (removed.get(tenant, 0) if removed else 0)
        cu = self._with_removed(flavor, removed) if removed else _UNCHANGED
        room = available(q, used, cu)
        if not allow_borrow and q.nominal - used < room:
            room = q.nominal - used
        return room if room > 0 else 0

    def borrows(self, tenant: str, flavor: str, gpus: int, removed: int = 0) -> bool:
        """Would holding `gpus` more put the tenant above its nominal quota?"""
        q = self._quota(tenant, flavor)
        if q is None:
            return self.usage[(tenant, flavor)] - removed + gpus > 0
        return q.used - removed + gpus > q.nominal

    def height(
        self, tenant: str, flavor: str, gpus: int, removed: dict[str, int] | None = None
    ) -> int:
        """Kueue's borrowing height: 0 when `gpus` more fit within nominal; else the height
        (distance to its furthest leaf) of the lowest cohort whose subtree quota holds
        them, or of the root when none does. A flat cohort has height 1. `removed` takes
        GPUs away from tenants first (per tenant, this flavor): the height a preemptor
        would borrow from once its victims are gone (Kueue's `borrowAfterPreemptions`)."""
        key = (tenant, flavor)
        used = self.usage[key]
        if removed:
            used -= removed.get(tenant, 0)
        if used + gpus <= self._nominal.get(key, 0):
            return 0
        path = self._path[tenant]
        if not path:
            return 0
        after = self._with_removed(flavor, removed) if removed else _UNCHANGED
        remaining = gpus - max(0, self._guaranteed.get(key, 0) - used)
        for c in path:
            ck = (c, flavor)
            cu = self._level(c, flavor).used
            if after:
                cu = after.get(c, cu)
            if cu + remaining <= self._sq[ck]:
                return self._height[c]
            remaining -= max(0, self._lq[ck] - cu)
        return self._height[path[-1]]

    def may_reclaim_in_tree(self, tenant: str, flavor: str, gpus: int) -> bool:
        """Would `gpus` more fit within the quota of a cohort below the root (Kueue's
        mayReclaimInHierarchy): then it may preempt there by hierarchical advantage."""
        path = self._path[tenant]
        if len(path) < 2:
            return False
        key = (tenant, flavor)
        used = self.usage[key]
        remaining = gpus - max(0, self._guaranteed.get(key, 0) - used)
        for c in path[:-1]:
            ck = (c, flavor)
            cu = self._level(c, flavor).used
            if cu + remaining <= self._sq[ck]:
                return True
            remaining -= max(0, self._lq[ck] - cu)
        return False

    def advantage_levels(self, tenant: str, flavor: str, gpus: int) -> dict[str, bool]:
        """Per cohort on the tenant's path: does it have a hierarchical advantage over the
        holders whose lowest common ancestor with it is that cohort (Kueue's
        collectCandidatesForHierarchicalReclaim)?"""
        key = (tenant, flavor)
        used = self.usage[key]
        adv = used + gpus <= self._nominal.get(key, 0)
        remaining = max(0, gpus - max(0, self._guaranteed.get(key, 0) - used))
        out: dict[str, bool] = {}
        for c in self._path[tenant]:
            out[c] = adv
            ck = (c, flavor)
            cu = self._level(c, flavor).used
            adv = adv or cu + remaining <= self._sq[ck]
            remaining = max(0, remaining - max(0, self._lq[ck] - cu))
        return out

    def max_hold(self, tenant: str, flavor: str) -> int:
        """The most the tenant could ever hold of the flavor, with everyone else idle
        (Kueue's potential available); 0 for a flavor outside its quota."""
        q = self._quota(tenant, flavor)
        return 0 if q is None else potential(q)
