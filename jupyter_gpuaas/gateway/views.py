"""The API's and the metrics' views of the core: what a request, the devices and the
tenants look like to a client, and the gauges' snapshot (`Arbiter` mixes this in).

Views only read: the core (positions included) and the inventory as of the last committed
cycle (the core never holds a decision the store has not committed), or a stored row.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_gpuaas.admission.model import Request, State

from . import estimates, waits
from .arbiter_state import ArbiterState
from .grace import grace_of, preempt_reason, preemption_fields, reclaim_wait
from .metrics import PendingCount, TenantUsage
from .store import RequestRow


class Views(ArbiterState):
    """Read-only views of `Arbiter`'s state (mixed into it)."""

    def view(self, rid: str) -> dict[str, Any] | None:
        """The request object of `rid`: live from memory, else from the store."""
        live = self.requests.get(rid)
        if live is not None:
            return self.request_json(live)
        row = self.read_now(self.store.get, rid)
        return None if row is None else self.request_json(row)

    def request_json(self, req: Request | RequestRow) -> dict[str, Any]:
        """The API's request object, from a live request or a stored row."""
        if isinstance(req, Request):
            live: Request | None = req
            meta = self.meta.get(req.id, {})
            state = req.state.value
        else:
            live, meta, state = None, meta_of(req), req.state
        out: dict[str, Any] = {
            "id": req.id,
            "user": req.user,
            "tenant": req.tenant,
            "kind": req.kind,
            "gpus": req.gpus,
            "flavor": req.flavor,
            "priority": req.priority,
            "name": meta.get("name"),
            "state": state,
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
        if state == State.ADMITTED.value:
            devices = list(req.devices) if isinstance(req, Request) else req.device_list()
            out["grant"] = {
                "flavor": req.assigned_flavor,
                "node": req.node,
                "devices": devices,
                "uuids": self.inventory.uuids(req.node or "", devices),
                "lease_expires": req.lease_expires,
                "admitted_at": req.admit_time,
                "busy": req.busy,
                "utilization": meta.get("utilization"),
            }
        elif state == State.PARKED.value:
            out["parked"] = {"flavor": req.assigned_flavor, "expires": req.park_expires}
        out.update(self._preemption_of(req))
        if state == State.QUEUED.value and live is not None:
            pos = self.engine.position(live.id)  # by bisection (admission/positions.py)
            if pos is not None:
                out["position"] = {
                    "tenant": pos.tenant_position,
                    "tenant_of": pos.tenant_queued,
                    "overall": pos.overall_position,
                    "of": pos.overall_queued,
                }
                wait, why = self._wait(live, pos.overall_position)
                out["estimated_wait"], out["waiting_for"] = wait, why
            elif (before := self.engine.waiting_for(live.id)) and before[1].get("sentence"):
                # In no queue yet (Kueue mode: a holder's request before its pod's
                # Workload): the engine's sentence alone.
                out["waiting_for"] = {"kind": before[0], "message": before[1]["sentence"]}
            out["scaling"] = self._scaling_for(live)
            reclaim = reclaim_wait(live, self.engine.reclaiming(live.id), time.time())
            if reclaim is not None:  # a preemptor waiting out its victims' grace
                reclaim["low"] = reclaim["high"] = reclaim["seconds"]
                reclaim["confidence"] = "high"
                out["estimated_wait"] = reclaim
                out["waiting_for"] = {"kind": "quota", "message": f"waiting: {reclaim['basis']}"}
        return out

    def _preemption_of(self, req: Request | RequestRow) -> dict[str, Any]:
        """A warned victim's pending eviction: when, for whom, and why in words."""
        by = self.requests.get(req.preempted_by or "") if req.preempt_at is not None else None
        reason = preempt_reason(req.tenant, req.gpus, by.tenant if by is not None else None)
        return preemption_fields(req.preempt_at, req.preempted_by, reason)

    def _flavors_for(self, req: Request) -> list[str]:
        if req.flavor:
            return [req.flavor]
        tenant = self.config.tenants.get(req.tenant)
        return list(tenant.quota) if tenant else []

    def _scaling_for(self, req: Request) -> dict[str, Any] | None:
        """Nodes being provisioned for a flavor this request waits on, and when ready."""
        provisioning = self.core.provisioning()
        for flavor in self._flavors_for(req):
            coming = provisioning.get(flavor)
            if coming:
                return {"flavor": flavor, "nodes": len(coming), "ready_by": max(coming.values())}
        return None

    def estimate_wait(self, req: Request, position: int) -> dict[str, Any]:
        """A rough wait (`estimated_wait`): see waits.estimate."""
        return self._wait(req, position)[0]

    def _wait(self, req: Request, position: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(`estimated_wait`, `waiting_for`) of a queued request: the estimate of a forward
        run of the queue (estimates.py), and the one wait sentence, its reason and that
        estimate (waits.py, words.wait_sentence)."""
        flavors = waits.usable_flavors(self.config, req.tenant, self._flavors_for(req))
        now = time.time()
        forward = self.estimates.of(req.id, self.core, self.history, now)
        wait = estimates.wait_json(forward, flavors[0] if len(flavors) == 1 else "GPUs")
        _, why = waits.estimate(
            req,
            position,
            now=now,
            flavors=flavors,
            holders=self.engine.admitted(),
            nodes=self.core.nodes(),
            hold_times=self.hold_times,
            idle_timeout=self._idle_timeout,
            config=self.config,
            reason=self.engine.waiting_for(req.id),
            eta=estimates.eta_of(wait),
            eta_seconds=wait["seconds"],
        )
        return wait, why

    def _idle_timeout(self, tenant: str) -> float:
        t = self.config.tenants.get(tenant)
        if t is not None and t.idle_timeout is not None:
            return t.idle_timeout
        return self.config.policy.idle_timeout

    def devices_json(self) -> dict[str, Any]:
        out = self.inventory.to_json(self.samples)
        holders: dict[tuple[str, int], str] = {}
        for node in self.core.nodes():
            for index, rid in node.holders.items():
                holders[(node.name, index)] = rid
        for d in out["devices"]:
            holder = holders.get((d["node"], d["index"]))
            req = self.requests.get(holder) if holder else None
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
            for n in self.core.nodes()
        ]
        out["desired_nodes"] = dict(self.core.desired_nodes())
        return out

    def tenants_json(self) -> dict[str, Any]:
        usage = waits.usage_json(self.config, self.core.tenant_usage())
        tenants = []
        for name, t in self.config.tenants.items():
            tenants.append(
                {
                    "name": name,
                    "cohort": t.cohort,
                    "quota": dict(t.quota),
                    "borrowing_limit": dict(t.borrowing_limit),
                    "lending_limit": dict(t.lending_limit),
                    "weight": t.weight,
                    "queueing": t.queueing,
                    "idle_timeout": self._idle_timeout(name),
                    "preemption_grace": grace_of(self.config, name),
                    "usage": usage.get(name, []),
                }
            )
        return {"simulated": self.inventory.simulated, "tenants": tenants}

    def snapshot_metrics(self) -> None:
        tenants = [
            TenantUsage(
                u.tenant, u.flavor, u.nominal, u.admitted, u.parked, u.borrowed, u.pending_gpus
            )
            for u in self.core.tenant_usage()
        ]
        pending: dict[tuple[str, str, str], int] = {}
        idle: dict[str, int] = {}
        holders: dict[tuple[str, int], tuple[str, str, str, tuple[int, ...]]] = {}
        for req in self.requests.values():
            if req.state is State.QUEUED:
                flavor = req.flavor or (self._flavors_for(req) or [""])[0]
                key = (req.tenant, flavor, req.kind)
                pending[key] = pending.get(key, 0) + 1
            elif req.state is State.ADMITTED:
                if not req.busy:
                    idle[req.tenant] = idle.get(req.tenant, 0) + req.gpus
                for index in req.devices:
                    holders[(req.node or "", index)] = (req.id, req.user, req.tenant, ())
        flavor_of = {(d.node, d.index): d.flavor for d in self.inventory.devices()}
        attributed = {key: (holder[1], holder[2]) for key, holder in holders.items()}
        rows = []
        for s in self.samples:
            user_tenant = attributed.get((s.node, s.index))
            rows.append(
                (
                    s,
                    flavor_of.get((s.node, s.index), ""),
                    user_tenant[1] if user_tenant else None,
                    user_tenant[0] if user_tenant else None,
                )
            )
        self.metrics.set_snapshot(
            tenants,
            [PendingCount(t, f, k, n) for (t, f, k), n in pending.items()],
            self.core.desired_nodes(),
            idle,
            rows,
            simulated=self.inventory.simulated,
            nodes=self._node_counts(),
            leader=self.leader,
        )

    def _node_counts(self) -> dict[str, int]:
        """Nodes per flavor in the core (every configured flavor, 0 included)."""
        counts = dict.fromkeys(self.config.flavors, 0)
        for node in self.core.nodes():
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
