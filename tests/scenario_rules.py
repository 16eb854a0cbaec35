"""SCENARIO.md's rules recomputed from a scenario's config alone, for the replay of
replay_checks.py: quota and cohort trees, the most a tenant could ever hold, which flavors
a request may use and when it must be rejected, per-tenant settings and busy intervals.

Recomputed from the config, never asked of the core: the replay trusts nothing but the
event stream and the scenario itself (invariants.py is the entry point).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from jupyter_gpuaas.admission.model import Config, Tenant
from jupyter_gpuaas.sim.scenario import ScenarioRequest

EPS = 1e-9

# --------------------------------------------------------------------------- quota rules


def lendable(tenant: Tenant, flavor: str) -> int:
    """What a member lends to its cohort: lending_limit capped at nominal, else nominal."""
    nominal = tenant.quota.get(flavor, 0)
    limit = tenant.lending_limit.get(flavor)
    return nominal if limit is None else min(limit, nominal)


def guaranteed(tenant: Tenant, flavor: str) -> int:
    """The part of nominal that is never lent."""
    return tenant.quota.get(flavor, 0) - lendable(tenant, flavor)


def members(config: Config, cohort: str) -> list[Tenant]:
    return [t for t in config.tenants.values() if t.cohort == cohort]


def quota_problem(
    config: Config, usage: Mapping[tuple[str, str], int], tenant: str, flavor: str
) -> str | None:
    """Why `usage` breaks SCENARIO.md's quota rule for (tenant, flavor), or None."""
    spec = config.tenants[tenant]
    used = usage.get((tenant, flavor), 0)
    if flavor not in spec.quota:
        return f"{tenant}/{flavor} uses {used} of a flavor absent from its quota" if used else None
    nominal = spec.quota[flavor]
    if spec.cohort is None:
        if used > nominal:
            return f"{tenant}/{flavor} uses {used} > nominal {nominal} without cohort"
        return None
    limit = spec.borrowing_limit.get(flavor)
    if limit is not None and used > nominal + limit:
        return f"{tenant}/{flavor} uses {used} > nominal {nominal} + borrowing_limit {limit}"
    if spec.cohort in config.cohorts:
        return tree_problem(config, usage, spec.cohort, flavor)
    group = members(config, spec.cohort)
    drawn = sum(max(0, usage.get((m.name, flavor), 0) - guaranteed(m, flavor)) for m in group)
    pool = sum(lendable(m, flavor) for m in group)
    if drawn > pool:
        return f"cohort {spec.cohort}/{flavor} draws {drawn} > lendable {pool}"
    return None


def tree_problem(
    config: Config, usage: Mapping[tuple[str, str], int], cohort: str | None, flavor: str
) -> str | None:
    """SCENARIO.md's cohort trees, recomputed from scratch (Kueue's resource nodes): per
    node, subtree quota SQ (own quota plus what each child passes up, SQ - LQ), local quota
    LQ (SQ - lending limit, or 0 without one; a tenant's: nominal - lendable) and usage U
    (a cohort's: what each child uses beyond its LQ). The root stays within SQ; a node with
    a borrowing limit uses its parent for no more than SQ - LQ + limit."""
    if cohort is None:
        return None
    root = cohort
    while config.cohorts[root].parent is not None:
        root = config.cohorts[root].parent or root

    def node(c: str) -> tuple[int, int, int]:
        spec = config.cohorts[c]
        sq = spec.quota.get(flavor, 0)
        used = 0
        for t in config.tenants.values():
            if t.cohort == c:
                g = guaranteed(t, flavor)
                sq += lendable(t, flavor)
                used += max(0, usage.get((t.name, flavor), 0) - g)
        for k, kspec in config.cohorts.items():
            if kspec.parent == c:
                ksq, klq, ku = node(k)
                sq += ksq - klq
                used += max(0, ku - klq)
        lq = max(0, sq - spec.lending_limit[flavor]) if flavor in spec.lending_limit else 0
        limit = spec.borrowing_limit.get(flavor)
        if limit is not None and max(0, used - lq) > sq - lq + limit:
            problems.append(
                f"cohort {c}/{flavor} subtree uses {used} > quota {sq} + borrowing {limit}"
            )
        return sq, lq, used

    problems: list[str] = []
    sq, _, used = node(root)
    if used > sq:
        problems.append(f"cohort {root}/{flavor} subtree uses {used} > its quota {sq}")
    return problems[0] if problems else None


def tree_max_hold(config: Config, tenant: Tenant, flavor: str) -> float:
    """What a tenant in a tree could hold with everyone else idle (Kueue's potential
    available): walk up, keeping what each level keeps and what its parent lends, capped
    by each level's borrowing limit."""
    nominal = tenant.quota[flavor]
    lim = tenant.lending_limit.get(flavor)
    keep: float = 0 if lim is None else nominal - min(lim, nominal)
    path: list[str] = []
    c: str | None = tenant.cohort
    while c is not None:
        path.append(c)
        c = config.cohorts[c].parent

    def sq(c: str) -> int:
        # Subtree quota as Kueue counts it: what children pass up (their lendable part).
        tenants = [t for t in config.tenants.values() if t.cohort == c]
        kids = [n for n, s in config.cohorts.items() if s.parent == c]
        own = config.cohorts[c].quota.get(flavor, 0)
        return (
            own
            + sum(lendable(t, flavor) for t in tenants)
            + sum(
                sq(k)
                - (
                    max(0, sq(k) - config.cohorts[k].lending_limit[flavor])
                    if flavor in config.cohorts[k].lending_limit
                    else 0
                )
                for k in kids
            )
        )

    avail: float = sq(path[-1])
    for c in reversed(path[:-1]):
        spec = config.cohorts[c]
        s = sq(c)
        local = max(0, s - spec.lending_limit[flavor]) if flavor in spec.lending_limit else 0
        avail = local + avail
        if flavor in spec.borrowing_limit:
            avail = min(avail, s + spec.borrowing_limit[flavor])
    avail = keep + avail
    limit = tenant.borrowing_limit.get(flavor)
    return avail if limit is None else min(avail, nominal + limit)


def max_hold(config: Config, tenant: Tenant, flavor: str) -> float:
    """The most a tenant could ever hold of a flavor: nominal plus what it may borrow."""
    if flavor not in tenant.quota:
        return 0
    nominal = tenant.quota[flavor]
    if tenant.cohort is None:
        return nominal
    if tenant.cohort in config.cohorts:
        return tree_max_hold(config, tenant, flavor)
    others = sum(lendable(m, flavor) for m in members(config, tenant.cohort) if m is not tenant)
    limit = tenant.borrowing_limit.get(flavor)
    return nominal + min(others, math.inf if limit is None else limit)


def allowed_flavors(config: Config, req: ScenarioRequest) -> list[str]:
    """Flavors a request may run on: its pinned one if the tenant has quota for it, else
    the tenant's quota flavors (in preference order)."""
    tenant = config.tenants.get(req.tenant)
    if tenant is None:
        return []
    if req.flavor is not None:
        return [req.flavor] if req.flavor in tenant.quota and req.flavor in config.flavors else []
    return [f for f in tenant.quota if f in config.flavors]


def must_reject(config: Config, req: ScenarioRequest) -> bool:
    """SCENARIO.md's rejection rule: unknown tenant/flavor, or no allowed flavor whose
    nodes are wide enough and whose quota the tenant could ever reach."""
    if req.tenant not in config.tenants:
        return True
    if req.flavor is not None and req.flavor not in config.flavors:
        return True
    tenant = config.tenants[req.tenant]
    return not any(
        req.gpus <= config.flavors[f].gpus_per_node and req.gpus <= max_hold(config, tenant, f)
        for f in allowed_flavors(config, req)
    )


def tenant_setting(config: Config, tenant: str, name: str) -> float:
    spec = config.tenants.get(tenant)
    value = getattr(spec, name, None) if spec is not None else None
    return float(getattr(config.policy, name) if value is None else value)


def busy_at(req: ScenarioRequest, first_admit: float, t: float) -> bool:
    """Whether a request uses its GPUs at t, on the timeline of its first admission."""
    if req.busy is None:
        return True
    off = t - first_admit
    return any(s - EPS <= off < e - EPS for s, e in req.busy)
