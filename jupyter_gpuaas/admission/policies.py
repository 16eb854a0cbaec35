"""The configuration as the core's collaborators read it: the `Config` itself and the
indexes of its tenants that the cycle asks on every head (who may preempt, a tenant's
flavors in quota order, its spec), plus the idle policy's settings and cull times.

One object, shared by every collaborator of
:class:`~jupyter_gpuaas.admission.core.AdmissionCore`: `update_config` re-indexes it in
place, so no collaborator keeps a stale copy of the configuration.
"""

from __future__ import annotations

from .model import KINDS, Config, Preemption, Request, Tenant


class Policies:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.preempts: dict[str, bool] = {}  # tenants with any preemption policy
        self.flavors: dict[str, tuple[str, ...]] = {}  # a tenant's flavors, in quota order
        # A plain dict of the specs: mypyc indexes a dict natively, a Mapping generically.
        self.specs: dict[str, Tenant] = {}
        self.names: dict[str, str] = {}
        self.tournament = False  # fair sharing in a cohort tree: heads meet level by level
        self.turns = False  # one head per tenant per cycle (Policy.one_head_per_cycle)
        self.reindex(config)

    def reindex(self, config: Config) -> None:
        """Adopt `config` (the dicts are refilled, not replaced)."""
        self.config = config
        self.preempts.clear()
        self.preempts.update(
            {t.name: t.preemption != Preemption() for t in config.tenants.values()}
        )
        self.flavors.clear()
        self.flavors.update({t.name: tuple(t.quota) for t in config.tenants.values()})
        self.specs.clear()
        self.specs.update(config.tenants)
        # The config's own name objects. A name read from a trace row or a request body is
        # an equal but distinct string, and each dict hit on it compares bytes: requests
        # are given these (`canonical`), so the tables' keys match by identity.
        self.names.clear()
        self.names.update({t.name: t.name for t in config.tenants.values()})
        self.names.update({f: f for f in config.flavors})
        self.names.update({k: k for k in KINDS})
        self.tournament = bool(config.policy.fair_sharing and config.cohorts)
        self.turns = config.policy.one_head_per_cycle

    def canonical(self, req: Request) -> None:
        """Give `req` the config's own name objects (see `reindex`)."""
        names = self.names
        req.tenant = names.get(req.tenant, req.tenant)
        req.kind = names.get(req.kind, req.kind)
        if req.flavor is not None:
            req.flavor = names.get(req.flavor, req.flavor)
        if req.assigned_flavor is not None:
            req.assigned_flavor = names.get(req.assigned_flavor, req.assigned_flavor)

    # ------------------------------------------------------------------ idle policy

    def setting(self, tenant: str, name: str) -> float:
        """A tenant's own idle or grace setting, else the policy's."""
        own = getattr(self.config.tenants[tenant], name)
        return float(own if own is not None else getattr(self.config.policy, name))

    def cull_times(self, req: Request, idle_since: float) -> tuple[float, float | None] | None:
        """When a holder of `req` idle since `idle_since` would be culled, and warned first
        (None: no warning); None when it never is."""
        if req.kind == "job":
            return None
        timeout = self.setting(req.tenant, "idle_timeout")
        if timeout <= 0:
            return None
        cull_at = idle_since + timeout
        lead = self.config.policy.cull_warning
        return cull_at, (cull_at - lead if 0 < lead < timeout else None)
