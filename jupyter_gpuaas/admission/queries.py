"""What the core answers without deciding: why a request can never fit, the idle policy's
settings and timers, and the views the drivers read (positions, usage, nodes, demand).

A base of :class:`~jupyter_gpuaas.admission.core.AdmissionCore`, which owns the state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from . import views
from .autoscale import Autoscaler
from .grace import Graces
from .holders import Holders
from .ledger import Ledger
from .model import Config, Request, State
from .nodes import Cluster
from .positions import Positions
from .queues import TenantQueue
from .timers import CULL, WARN, Timers
from .views import NodeState, Position, TenantUsage


class Queries:
    _config: Config
    _ledger: Ledger
    _cluster: Cluster
    _timers: Timers
    _scaler: Autoscaler
    _requests: dict[str, Request]
    _queues: dict[str, TenantQueue]
    _width: dict[str, int]
    _graces: Graces
    _holders: Holders
    _positions: Positions | None  # built at the first position asked for

    # ------------------------------------------------------------------ rejections

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be admitted ('' if it can), in words for its user."""
        tenant = self._config.tenants.get(req.tenant)
        if tenant is None:
            return f"unknown tenant {req.tenant!r}"
        if req.gpus < 1:
            return "a request needs at least one GPU"
        if req.flavor is not None:
            if req.flavor not in self._config.flavors:
                return f"unknown flavor {req.flavor!r}"
            if req.flavor not in tenant.quota:
                return f"tenant {tenant.name!r} has no quota for flavor {req.flavor!r}"
            flavors = [req.flavor]
        else:
            flavors = [f for f in tenant.quota if f in self._config.flavors]
            if not flavors:
                return f"tenant {tenant.name!r} has no quota for any flavor"
        widest = 0
        most = 0
        for f in flavors:
            width = self._node_width(f)
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

    def _node_width(self, flavor: str) -> int:
        """The most GPUs one node of the flavor has, or could have once scaled up."""
        widest = self._width.get(flavor)
        if widest is None:
            widest = max((n.gpus for n in self._cluster.of(flavor)), default=0)
            spec = self._config.flavors.get(flavor)
            if spec is not None and (spec.nodes > 0 or flavor in self._config.policy.autoscale):
                widest = max(widest, spec.gpus_per_node)
            self._width[flavor] = widest
        return widest

    # ------------------------------------------------------------------ idle policy

    def _tenant_setting(self, tenant: str, name: str) -> float:
        own = getattr(self._config.tenants[tenant], name)
        return float(own if own is not None else getattr(self._config.policy, name))

    def _cull_times(self, req: Request, idle_since: float) -> tuple[float, float | None] | None:
        """When a holder of `req` idle since `idle_since` would be culled, and warned first
        (None: no warning); None when it never is."""
        if req.kind == "job":
            return None
        timeout = self._tenant_setting(req.tenant, "idle_timeout")
        if timeout <= 0:
            return None
        cull_at = idle_since + timeout
        lead = self._config.policy.cull_warning
        return cull_at, (cull_at - lead if 0 < lead < timeout else None)

    def _arm_cull(self, req: Request) -> None:
        if req.idle_since is None:
            return
        times = self._cull_times(req, req.idle_since)
        if times is None:
            return
        cull_at, warn_at = times
        self._timers.set(CULL, req.id, cull_at)
        if warn_at is not None:
            self._timers.set(WARN, req.id, warn_at)

    def idle_deadline(self, rid: str, idle_since: float) -> float:
        """The first time the core would act on the holder of `rid` if it went idle at
        `idle_since` and stayed so: its cull warning, else its cull (inf: never culled).
        A holder busy again before it has changed nothing the core decides on; the
        simulator's driver uses this to leave such short idle spells unsaid."""
        req = self._get(rid)
        times = self._cull_times(req, idle_since)
        if times is None:
            return math.inf
        cull_at, warn_at = times
        return cull_at if warn_at is None else warn_at

    # ------------------------------------------------------------------ queries

    def _get(self, rid: str) -> Request:
        req = self._requests.get(rid)
        if req is None:
            raise KeyError(rid)
        return req

    def get(self, rid: str) -> Request | None:
        return self._requests.get(rid)

    def live_requests(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def position(self, rid: str) -> Position | None:
        """1-based place of a queued request in its tenant's queue and among all queued
        (by bisection: positions.py; `views.position` is the same answer by a scan)."""
        req = self._requests.get(rid)
        if req is None or req.state is not State.QUEUED:
            return None
        if self._positions is None:  # the first question: from now on kept in step
            queued = (r for q in self._queues.values() for r in q.requests())
            self._positions = Positions(queued)
        return self._positions.position(rid)

    def admitted(self) -> Iterable[Request]:
        """The admitted requests (the running grants), in the order they were bound."""
        return self._holders.admitted.values()

    def tenant_usage(self) -> list[TenantUsage]:
        return views.tenant_usage(self._config, self._queues, self._ledger)

    def nodes(self) -> list[NodeState]:
        return views.node_states(self._cluster)

    def desired_nodes(self) -> dict[str, int]:
        """Nodes per flavor the queue asks for: ready, coming, and still to ask for."""
        out = {f: len(self._cluster.of(f)) for f in self._config.flavors}
        for f, n in self._scaler.desired.items():
            out[f] = max(out.get(f, 0), n)
        return out

    def provisioning(self) -> dict[str, dict[str, float]]:
        """Nodes on their way, by flavor: name -> time they will be ready."""
        return {f: dict(p) for f, p in self._scaler.provisioning.items() if p}

    def reclaiming(self, rid: str) -> list[Request]:
        """The warned victims a queued preemptor waits for (empty if none)."""
        return self._graces.victims(rid)
