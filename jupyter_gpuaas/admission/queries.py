"""What the core answers without deciding: why a request can never fit, and the views
the drivers read (positions, usage, nodes, demand, the victims a preemptor waits for).

A collaborator of :class:`~jupyter_gpuaas.admission.core.AdmissionCore`, whose public
questions it answers; its own state is the widest node per flavor, kept for rejections.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import views
from .autoscale import Autoscaler
from .grace import Graces
from .holders import Holders
from .ledger import Ledger
from .model import Request, State
from .nodes import Cluster
from .policies import Policies
from .queueing import Queues
from .views import NodeState, Position, TenantUsage


class Queries:
    def __init__(
        self,
        policies: Policies,
        ledger: Ledger,
        cluster: Cluster,
        holders: Holders,
        scaler: Autoscaler,
        graces: Graces,
        requests: dict[str, Request],
        queues: Queues,
    ) -> None:
        self._policies = policies
        self._ledger = ledger
        self._cluster = cluster
        self._holders = holders
        self._scaler = scaler
        self._graces = graces
        self._requests = requests
        self._queues = queues
        self._width: dict[str, int] = {}  # widest node per flavor, for rejections

    def forget_widths(self, flavor: str | None = None) -> None:
        """Nodes of `flavor` (None: the configuration) changed: widths are asked again."""
        if flavor is None:
            self._width.clear()
        else:
            self._width.pop(flavor, None)

    # ------------------------------------------------------------------ rejections

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be admitted ('' if it can), in words for its user."""
        tenant = self._policies.config.tenants.get(req.tenant)
        if tenant is None:
            return f"unknown tenant {req.tenant!r}"
        if req.gpus < 1:
            return "a request needs at least one GPU"
        if req.flavor is not None:
            if req.flavor not in self._policies.config.flavors:
                return f"unknown flavor {req.flavor!r}"
            if req.flavor not in tenant.quota:
                return f"tenant {tenant.name!r} has no quota for flavor {req.flavor!r}"
            flavors = [req.flavor]
        else:
            flavors = [f for f in tenant.quota if f in self._policies.config.flavors]
            if not flavors:
                return f"tenant {tenant.name!r} has no quota for any flavor"
        widest = 0
        most = 0
        for f in flavors:
            width = self.node_width(f)
            hold = self._ledger.max_hold(tenant.name, f)
            if req.gpus <= width and req.gpus <= hold:
                return ""
            widest = max(widest, width)
            most = max(most, hold)
        names = "/".join(flavors)
        if req.gpus > widest:
            return f"{req.gpus} GPUs do not fit on one node ({names} nodes have at most {widest})"
        return (
            f"{req.gpus} GPUs are more than tenant {tenant.name!r} can ever hold"
            f" of {names} ({most})"
        )

    def node_width(self, flavor: str) -> int:
        """The most GPUs one node of the flavor has, or could have once scaled up."""
        widest = self._width.get(flavor)
        if widest is None:
            widest = max((n.gpus for n in self._cluster.of(flavor)), default=0)
            spec = self._policies.config.flavors.get(flavor)
            if spec is not None and (
                spec.nodes > 0 or flavor in self._policies.config.policy.autoscale
            ):
                widest = max(widest, spec.gpus_per_node)
            self._width[flavor] = widest
        return widest

    # ------------------------------------------------------------------ views

    def position(self, rid: str) -> Position | None:
        """1-based place of a queued request in its tenant's queue and among all queued
        (by bisection: positions.py; `views.position` is the same answer by a scan)."""
        req = self._requests.get(rid)
        if req is None or req.state is not State.QUEUED:
            return None
        return self._queues.position(rid)

    def admitted(self) -> Iterable[Request]:
        """The admitted requests (the running grants), in the order they were bound."""
        return self._holders.admitted.values()

    def tenant_usage(self) -> list[TenantUsage]:
        return views.tenant_usage(self._policies.config, self._queues.tenants, self._ledger)

    def nodes(self) -> list[NodeState]:
        return views.node_states(self._cluster)

    def desired_nodes(self) -> dict[str, int]:
        """Nodes per flavor the queue asks for: ready, coming, and still to ask for."""
        out = {f: len(self._cluster.of(f)) for f in self._policies.config.flavors}
        for f, n in self._scaler.desired.items():
            out[f] = max(out.get(f, 0), n)
        return out

    def provisioning(self) -> dict[str, dict[str, float]]:
        """Nodes on their way, by flavor: name -> time they will be ready."""
        return {f: dict(p) for f, p in self._scaler.provisioning.items() if p}

    def reclaiming(self, rid: str) -> list[Request]:
        """The warned victims a queued preemptor waits for (empty if none)."""
        return self._graces.victims(rid)
