"""The API's and the metrics' views of the core: what a request, the devices and the
tenants look like to a client, and the gauges' snapshot.

Views are functions of the core's state (`CoreState`: the core, its engine and what the
API keeps beside it, passed explicitly); the arbiter calls them. They only read: the core
(positions included) and the inventory as of the last committed cycle (the core never
holds a decision the store has not committed), or a stored row. The forward-run
estimates are the one cache they fill (estimates.py), dropped at each committed decision.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import History
from jupyter_gpuaas.admission.model import Config, Request, State

from ..devices import DeviceSample, Inventory
from . import estimates, waits
from .engine import Engine
from .estimates import Estimates, Start
from .grace import grace_of, preempt_reason, preemption_fields, reclaim_wait
from .metrics import DeviceRow, PendingCount, ReportedGrant, TenantUsage
from .store import RequestRow


@dataclass(frozen=True)
class CoreState:
    """What the views read: the core, whom requests are handed to (the core or Kueue:
    engine.py), and what the API keeps beside them, as of the last committed cycle."""

    config: Config
    core: AdmissionCore
    engine: Engine
    inventory: Inventory
    # The live requests by id, and what the API adds to each (name, created, updated,
    # utilization).
    requests: Mapping[str, Request]
    meta: Mapping[str, Mapping[str, Any]]
    samples: Sequence[DeviceSample]
    # Hold times by flavor (waits.py), past holds by kind and user, and the forward-run
    # estimates of the queue as it stands (estimates.py).
    hold_times: Mapping[str, list[float]]
    history: History
    estimates: Estimates
    # What the forward runs start from: the core, or in Kueue mode the steps that make a
    # core from Kueue's state (kueue_engine.py `KueueEngine.forward_core`).
    forward: Start


class MetricSnapshot(NamedTuple):
    """The gauges' values: metrics.GatewayMetrics.set_snapshot's arguments, in order."""

    tenants: list[TenantUsage]
    pending: list[PendingCount]
    desired_nodes: Mapping[str, int]
    idle_gpus: dict[str, int]
    devices: list[DeviceRow]
    simulated: bool
    nodes: dict[str, int]
    reported: list[ReportedGrant]


def request_json(state: CoreState, req: Request | RequestRow) -> dict[str, Any]:
    """The API's request object, from a live request or a stored row."""
    meta: Mapping[str, Any]
    if isinstance(req, Request):
        live: Request | None = req
        meta = state.meta.get(req.id, {})
        status = req.state.value
    else:
        live, meta, status = None, meta_of(req), req.state
    out: dict[str, Any] = {
        "id": req.id,
        "user": req.user,
        "tenant": req.tenant,
        "kind": req.kind,
        "gpus": req.gpus,
        "flavor": req.flavor,
        "priority": req.priority,
        "name": meta.get("name"),
        "state": status,
        "created": meta.get("created"),
        "updated": meta.get("updated"),
        "submit_time": req.submit_time,
        "admitted_at": req.first_admit,
        "reason": req.reason or None,
        "position": None,
        "estimated_wait": None,
        "grant": None,
        "scaling": None,
    }
    if status == State.ADMITTED.value:
        devices = list(req.devices) if isinstance(req, Request) else req.device_list()
        out["grant"] = {
            "flavor": req.assigned_flavor,
            "node": req.node,
            "devices": devices,
            "uuids": state.inventory.uuids(req.node or "", devices),
            "lease_expires": req.lease_expires,
            "admitted_at": req.admit_time,
            "busy": req.busy,
            "utilization": meta.get("utilization"),
        }
    elif status == State.PARKED.value:
        out["parked"] = {"flavor": req.assigned_flavor, "expires": req.park_expires}
    out.update(_preemption_of(state, req))
    if status == State.QUEUED.value and live is not None:
        pos = state.engine.position(live.id)  # by bisection (admission/positions.py)
        if pos is not None:
            out["position"] = {
                "tenant": pos.tenant_position,
                "tenant_of": pos.tenant_queued,
                "overall": pos.overall_position,
                "of": pos.overall_queued,
            }
            wait, why = _wait(state, live, pos.overall_position)
            out["estimated_wait"], out["waiting_for"] = wait, why
        elif (before := state.engine.waiting_for(live.id)) and before[1].get("sentence"):
            # In no queue yet (Kueue mode: a holder's request before its pod's
            # Workload): the engine's sentence alone.
            out["waiting_for"] = {"kind": before[0], "message": before[1]["sentence"]}
        out["scaling"] = _scaling_for(state, live)
        reclaim = reclaim_wait(live, state.engine.reclaiming(live.id), time.time())
        if reclaim is not None:  # a preemptor waiting out its victims' grace
            reclaim["low"] = reclaim["high"] = reclaim["seconds"]
            reclaim["confidence"] = "high"
            out["estimated_wait"] = reclaim
            out["waiting_for"] = {"kind": "quota", "message": f"waiting: {reclaim['basis']}"}
    return out


def _preemption_of(state: CoreState, req: Request | RequestRow) -> dict[str, Any]:
    """A warned victim's pending eviction: when, for whom, and why in words."""
    by = state.requests.get(req.preempted_by or "") if req.preempt_at is not None else None
    reason = preempt_reason(
        req.tenant,
        req.gpus,
        by.tenant if by is not None else None,
        by.gpus if by is not None else None,
    )
    return preemption_fields(req.preempt_at, req.preempted_by, reason)


def _flavors_for(config: Config, req: Request) -> list[str]:
    if req.flavor:
        return [req.flavor]
    tenant = config.tenants.get(req.tenant)
    return list(tenant.quota) if tenant else []


def _scaling_for(state: CoreState, req: Request) -> dict[str, Any] | None:
    """Nodes being provisioned for a flavor this request waits on, and when ready."""
    provisioning = state.core.provisioning()
    for flavor in _flavors_for(state.config, req):
        coming = provisioning.get(flavor)
        if coming:
            return {"flavor": flavor, "nodes": len(coming), "ready_by": max(coming.values())}
    return None


def _wait(state: CoreState, req: Request, position: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`estimated_wait`, `waiting_for`) of a queued request: the estimate of a forward
    run of the queue (estimates.py), and the one wait sentence, its reason and that
    estimate (waits.py, words.wait_sentence)."""
    config = state.config
    flavors = waits.usable_flavors(config, req.tenant, _flavors_for(config, req))
    now = time.time()
    # The forward run of the core, or in Kueue mode of a core made from Kueue's state
    # (which has no tenant the config does not name: a LocalQueue of its own).
    forward = (
        state.estimates.of(req.id, state.forward, state.history, now)
        if req.tenant in config.tenants
        else None
    )
    wait = estimates.wait_json(forward, flavors[0] if len(flavors) == 1 else "GPUs")
    _, why = waits.estimate(
        req,
        position,
        now=now,
        flavors=flavors,
        holders=state.engine.admitted(),
        nodes=state.core.nodes(),
        hold_times=state.hold_times,
        idle_timeout=lambda tenant: idle_timeout(config, tenant),
        config=config,
        reason=state.engine.waiting_for(req.id),
        eta=estimates.eta_of(wait),
        eta_seconds=wait["seconds"],
    )
    return wait, why


def idle_timeout(config: Config, tenant: str) -> float:
    """The tenant's idle timeout, else the policy's."""
    t = config.tenants.get(tenant)
    if t is not None and t.idle_timeout is not None:
        return t.idle_timeout
    return config.policy.idle_timeout


def devices_json(state: CoreState) -> dict[str, Any]:
    out = state.inventory.to_json(state.samples)
    holders: dict[tuple[str, int], str] = {}
    for node in state.core.nodes():
        for index, rid in node.holders.items():
            holders[(node.name, index)] = rid
    for d in out["devices"]:
        holder = holders.get((d["node"], d["index"]))
        req = state.requests.get(holder) if holder else None
        d["holder"] = (
            {"id": req.id, "user": req.user, "tenant": req.tenant, "kind": req.kind}
            if req
            else None
        )
    out["nodes"] = [
        {
            "name": n.name,
            "flavor": n.flavor,
            "gpus": n.gpus,
            "autoscaled": n.autoscaled,
            "free": n.gpus - len(n.holders),
        }
        for n in state.core.nodes()
    ]
    out["desired_nodes"] = dict(state.core.desired_nodes())
    return out


def tenants_json(state: CoreState) -> dict[str, Any]:
    config = state.config
    usage = waits.usage_json(config, state.core.tenant_usage())
    tenants = []
    for name, t in config.tenants.items():
        tenants.append(
            {
                "name": name,
                "cohort": t.cohort,
                "quota": dict(t.quota),
                "borrowing_limit": dict(t.borrowing_limit),
                "lending_limit": dict(t.lending_limit),
                "weight": t.weight,
                "queueing": t.queueing,
                "idle_timeout": idle_timeout(config, name),
                "preemption_grace": grace_of(config, name),
                "usage": usage.get(name, []),
            }
        )
    return {"simulated": state.inventory.simulated, "tenants": tenants}


def metric_snapshot(state: CoreState) -> MetricSnapshot:
    """The gauges as the core stands: usage, pending requests, idle GPUs, devices."""
    tenants = [
        TenantUsage(u.tenant, u.flavor, u.nominal, u.admitted, u.parked, u.borrowed, u.pending_gpus)
        for u in state.core.tenant_usage()
    ]
    pending: dict[tuple[str, str, str], int] = {}
    idle: dict[str, int] = {}
    holders: dict[tuple[str, int], tuple[str, str, str, tuple[int, ...]]] = {}
    reported: list[ReportedGrant] = []
    for req in state.requests.values():
        if req.state is State.QUEUED:
            flavor = req.flavor or (_flavors_for(state.config, req) or [""])[0]
            key = (req.tenant, flavor, req.kind)
            pending[key] = pending.get(key, 0) + 1
        elif req.state is State.ADMITTED:
            if not req.busy:
                idle[req.tenant] = idle.get(req.tenant, 0) + req.gpus
            for index in req.devices:
                holders[(req.node or "", index)] = (req.id, req.user, req.tenant, ())
            reported += _reported(state, req)
    flavor_of = {(d.node, d.index): d.flavor for d in state.inventory.devices()}
    attributed = {key: (holder[1], holder[2]) for key, holder in holders.items()}
    rows: list[DeviceRow] = []
    for s in state.samples:
        user_tenant = attributed.get((s.node, s.index))
        rows.append(
            (
                s,
                flavor_of.get((s.node, s.index), ""),
                user_tenant[1] if user_tenant else None,
                user_tenant[0] if user_tenant else None,
            )
        )
    return MetricSnapshot(
        tenants,
        [PendingCount(t, f, k, n) for (t, f, k), n in pending.items()],
        state.core.desired_nodes(),
        idle,
        rows,
        state.inventory.simulated,
        _node_counts(state),
        reported,
    )


def _reported(state: CoreState, req: Request) -> list[ReportedGrant]:
    """The whole GPUs (`GPU-…`) a holder reported for a grant whose devices the
    inventory knows no UUID of (a cluster's Node); none where the inventory knows them
    (its device series already carry them)."""
    uuids = state.meta.get(req.id, {}).get("uuids") or ()
    if not uuids or state.inventory.uuids(req.node or "", list(req.devices)) is not None:
        return []
    flavor = req.assigned_flavor or ""
    return [
        ReportedGrant(u, req.node or "", req.tenant, req.user, flavor)
        for u in uuids
        if u.startswith("GPU-")
    ]


def _node_counts(state: CoreState) -> dict[str, int]:
    """Nodes per flavor in the core (every configured flavor, 0 included)."""
    counts = dict.fromkeys(state.config.flavors, 0)
    for node in state.core.nodes():
        counts[node.flavor] = counts.get(node.flavor, 0) + 1
    return counts


def meta_of(row: RequestRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "created": row.created,
        "updated": row.updated,
        "utilization": row.utilization,
        "peak_utilization": row.peak_utilization,
    }
