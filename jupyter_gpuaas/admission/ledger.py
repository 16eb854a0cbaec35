"""The quota ledger: who holds how much of which flavor, and what may still be borrowed.

Usage counts admitted and parked GPUs. A tenant's usage up to its guaranteed quota
(nominal minus lendable) is its own; everything above draws on its cohort's pool, the sum
of what the members lend. So, for every cohort and flavor:

    sum over members of max(0, usage - guaranteed) <= sum over members of lendable

The ledger keeps that left-hand sum per cohort and flavor up to date, so a fit check is a
handful of dictionary reads however many requests are admitted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from .model import Config, Tenant


class Ledger:
    def __init__(self, config: Config) -> None:
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.parked: dict[tuple[str, str], int] = defaultdict(int)
        self._drawn: dict[tuple[str, str], int] = defaultdict(int)  # (cohort, flavor)
        # Bumps on every change of usage in one (cohort, flavor), or (tenant, flavor) for a
        # tenant without a cohort: what a cached answer about that pool depends on.
        self.pool_version: dict[tuple[str, str], int] = defaultdict(int)
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Adopt new quotas, keeping usage: an admin's change never evicts anyone."""
        self.tenants: Mapping[str, Tenant] = config.tenants
        self.members: dict[str, list[str]] = defaultdict(list)
        self._pool: dict[tuple[str, str], int] = defaultdict(int)
        # Per (tenant, flavor): nominal, guaranteed, borrowing limit (None: unlimited).
        # Flat dicts, because the admission cycle asks these questions millions of times.
        self._nominal: dict[tuple[str, str], int] = {}
        self._guaranteed: dict[tuple[str, str], int] = {}
        self._limit: dict[tuple[str, str], int | None] = {}
        self._cohort: dict[str, str | None] = {}
        for t in config.tenants.values():
            self._cohort[t.name] = t.cohort
            for f, nominal in t.quota.items():
                self._nominal[(t.name, f)] = nominal
                self._guaranteed[(t.name, f)] = t.guaranteed(f)
                self._limit[(t.name, f)] = t.borrowing_limit.get(f)
            if t.cohort is not None:
                self.members[t.cohort].append(t.name)
                for f in t.quota:
                    self._pool[(t.cohort, f)] += t.lendable(f)
        self._drawn.clear()
        for (tenant, flavor), used in self.usage.items():
            spec = self.tenants.get(tenant)
            if spec is not None and spec.cohort is not None:
                self._drawn[(spec.cohort, flavor)] += max(0, used - spec.guaranteed(flavor))

    # --- changes -------------------------------------------------------------------

    def add(self, tenant: str, flavor: str, gpus: int) -> None:
        self._move(tenant, flavor, gpus)

    def remove(self, tenant: str, flavor: str, gpus: int) -> None:
        self._move(tenant, flavor, -gpus)

    def _move(self, tenant: str, flavor: str, delta: int) -> None:
        key = (tenant, flavor)
        before = self.usage[key]
        after = before + delta
        self.usage[key] = after
        cohort = self._cohort[tenant]
        if cohort is not None:
            g = self._guaranteed.get(key, 0)
            self._drawn[(cohort, flavor)] += max(0, after - g) - max(0, before - g)
            self.pool_version[(cohort, flavor)] += 1
        else:
            self.pool_version[key] += 1

    # --- questions -----------------------------------------------------------------

    def nominal(self, tenant: str, flavor: str) -> int:
        return self._nominal.get((tenant, flavor), 0)

    def borrowed(self, tenant: str, flavor: str) -> int:
        key = (tenant, flavor)
        return max(0, self.usage[key] - self._nominal.get(key, 0))

    def pool(self, cohort: str, flavor: str) -> int:
        return self._pool[(cohort, flavor)]

    def fits(
        self,
        tenant: str,
        flavor: str,
        gpus: int,
        removed: Mapping[str, int] | None = None,
        allow_borrow: bool = True,
    ) -> bool:
        """Would `gpus` more fit the tenant's quota of `flavor`?

        `removed` takes GPUs away from tenants first (per tenant, this flavor): the
        preemption search asks "would it fit if these victims went?".
        """
        key = (tenant, flavor)
        nominal = self._nominal.get(key)
        if nominal is None:
            return False  # a flavor absent from the tenant's quota is not usable by it
        used = self.usage[key]
        if removed:
            used -= removed.get(tenant, 0)
        after = used + gpus
        cohort = self._cohort[tenant]
        if cohort is None:
            return after <= nominal
        if not allow_borrow and after > nominal:
            return False
        limit = self._limit[key]
        if limit is not None and after > nominal + limit:
            return False
        drawn = self._drawn[(cohort, flavor)]
        if removed:
            for name, gone in removed.items():
                if not gone or self._cohort.get(name) != cohort:
                    continue
                u = self.usage[(name, flavor)]
                g = self._guaranteed.get((name, flavor), 0)
                drawn += max(0, u - gone - g) - max(0, u - g)
        g = self._guaranteed[key]
        drawn += max(0, after - g) - max(0, used - g)
        return drawn <= self._pool[(cohort, flavor)]

    def room(
        self,
        tenant: str,
        flavor: str,
        removed: Mapping[str, int] | None = None,
        allow_borrow: bool = True,
    ) -> int:
        """The most GPUs of `flavor` the tenant's quota would admit right now (with the
        `removed` GPUs gone first): the largest `gpus` for which `fits` is true."""
        key = (tenant, flavor)
        nominal = self._nominal.get(key)
        if nominal is None:
            return 0
        rm = removed or {}
        used = self.usage[key] - rm.get(tenant, 0)
        cohort = self._cohort[tenant]
        if cohort is None or not allow_borrow:
            room = nominal - used
            if cohort is None:
                return max(0, room)
        else:
            limit = self._limit[key]
            room = nominal + limit - used if limit is not None else 1 << 62
        drawn = self._drawn[(cohort, flavor)]
        for name, gone in rm.items():
            if gone and self._cohort.get(name) == cohort:
                u = self.usage[(name, flavor)]
                g = self._guaranteed.get((name, flavor), 0)
                drawn += max(0, u - gone - g) - max(0, u - g)
        # Up to its guaranteed quota it draws nothing from the pool; beyond, all of it.
        pool_room = max(0, self._guaranteed[key] - used) + self._pool[(cohort, flavor)] - drawn
        return max(0, min(room, pool_room))

    def borrows(self, tenant: str, flavor: str, gpus: int, removed: int = 0) -> bool:
        """Would holding `gpus` more put the tenant above its nominal quota?"""
        key = (tenant, flavor)
        return self.usage[key] - removed + gpus > self._nominal.get(key, 0)

    def max_hold(self, tenant: str, flavor: str) -> int:
        """The most the tenant could ever hold of the flavor, with everyone else idle."""
        t = self.tenants[tenant]
        nominal = t.quota.get(flavor, 0)
        if t.cohort is None:
            return nominal
        others = sum(
            self.tenants[m].lendable(flavor) for m in self.members[t.cohort] if m != tenant
        )
        limit = t.borrowing_limit.get(flavor)
        return nominal + (others if limit is None else min(limit, others))

    def share(self, tenant: str, flavor: str = "", gpus: int = 0) -> float:
        """Weighted share for fair sharing: the largest of borrowed / pool / weight, with
        `gpus` more of `flavor` held (the head being ranked, as if admitted)."""
        t = self.tenants[tenant]
        if t.cohort is None:
            return 0.0
        best = 0.0
        for f in t.quota:
            pool = self._pool[(t.cohort, f)]
            b = self.borrowed(tenant, f)
            if f == flavor and gpus:
                key = (tenant, f)
                b = max(0, self.usage[key] + gpus - self._nominal.get(key, 0))
            if b and pool:
                best = max(best, b / pool / t.weight)
        return best
