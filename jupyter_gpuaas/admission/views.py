"""What the core shows its drivers: queue positions, usage per tenant, nodes.

Read-only answers for the gateway's API, metrics and pages. They scan queues, so they
are for display, never for the admission cycle's hot path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from .ledger import Ledger
from .model import Config, Request
from .nodes import Cluster
from .queues import TenantQueue, order_key


@dataclass(frozen=True)
class Position:
    tenant_position: int
    tenant_queued: int
    overall_position: int
    overall_queued: int


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    flavor: str
    nominal: int
    admitted: int
    parked: int
    borrowed: int
    pending_gpus: int
    pending_requests: int


@dataclass(frozen=True)
class NodeState:
    name: str
    flavor: str
    gpus: int
    holders: dict[int, str]
    autoscaled: bool


def position(queues: Mapping[str, TenantQueue], req: Request) -> Position:
    """Place in its tenant's queue, and among every queued request by priority and time."""
    mine = order_key(req)[:2]
    overall = total = 0
    for q in queues.values():
        total += len(q)
        overall += sum(1 for r in q.requests() if order_key(r)[:2] < mine)
    q = queues[req.tenant]
    return Position(q.ahead_of(req) + 1, len(q), overall + 1, total)


def tenant_usage(
    config: Config, queues: Mapping[str, TenantQueue], ledger: Ledger
) -> list[TenantUsage]:
    """Quota, usage and waiting demand per tenant and flavor.

    A queued request without a pinned flavor counts under its tenant's first flavor.
    """
    pending: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for name, q in queues.items():
        spec = config.tenants.get(name)
        if spec is None:
            continue
        for r in q.requests():
            f = r.flavor or next(iter(spec.quota), "")
            pending[(name, f)][0] += r.gpus
            pending[(name, f)][1] += 1
    out = []
    for t in config.tenants.values():
        for f, nominal in t.quota.items():
            used = ledger.usage[(t.name, f)]
            parked = ledger.parked[(t.name, f)]
            gpus, count = pending.get((t.name, f), (0, 0))
            borrowed = ledger.borrowed(t.name, f)
            out.append(
                TenantUsage(t.name, f, nominal, used - parked, parked, borrowed, gpus, count)
            )
    return out


def node_states(cluster: Cluster) -> list[NodeState]:
    return [NodeState(n.name, n.flavor, n.gpus, dict(n.holders), n.autoscaled) for n in cluster]
