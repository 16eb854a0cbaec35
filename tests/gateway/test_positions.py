"""Positions in the API answer what a scan of the queues answers, under random load
through the arbiter (the core keeps them: tests/test_core_positions.py), and a user
coming back takes over their parked reservation."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from gwutil import QUOTAS, Gateway

from jupyter_gpuaas.admission import views
from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.gateway.arbiter import Conflict

pytestmark = pytest.mark.asyncio


def check(gw: Gateway) -> int:
    core = gw.arbiter.core
    queued = 0
    for req in list(core.live_requests()):
        if req.state is State.QUEUED:
            assert core.position(req.id) == views.position(core._queues.tenants, req), req.id
            queued += 1
    running = {r.id for r in core.live_requests() if r.state is State.ADMITTED}
    assert {r.id for r in core.admitted()} == running
    return queued


@pytest.mark.slow
async def test_positions_match_a_scan_under_random_load(make_gateway: Any) -> None:
    # Higher priority preempts lower within a tenant: victims are requeued.
    preempt = {"within_tenant": "LowerPriority", "reclaim_within_cohort": "Any"}
    # Idle grants are culled quickly and parked: a later submission may take one over.
    quotas = {
        **QUOTAS,
        "policy": {"idle_timeout": 0.05, "reservation_ttl": 30},
        "tenants": {
            name: {**spec, "preemption": preempt} for name, spec in QUOTAS["tenants"].items()
        },
    }
    gw: Gateway = await make_gateway(quotas=quotas)
    arbiter = gw.arbiter
    rng = random.Random(7)
    live: list[str] = []
    seen_queued = 0
    for step in range(400):
        running = [r.id for r in arbiter.core.admitted()]
        if running and rng.random() < 0.1:
            rid = rng.choice(running)
            await arbiter.heartbeat(rid, False, None)
            await asyncio.sleep(0.1)  # culled (parked) by the admission loop
        elif live and rng.random() < 0.35:
            rid = live.pop(rng.randrange(len(live)))
            try:
                await arbiter.cancel(rid, "root")
            except Conflict:  # preempted and ended meanwhile: nothing to cancel
                pass
        else:
            user, tenant = rng.choice((("alice", "vision"), ("bob", "nlp"), ("carol", "vision")))
            req, obj = await arbiter.submit(
                tenant=tenant,
                user=user,
                kind=rng.choice(("kernel", "job")),
                gpus=rng.choice((1, 1, 2)),
                priority=rng.choice((0, 0, 0, 5, 10)),
            )
            assert obj["state"] == req.state.value
            live.append(req.id)
        if step % 10 == 0:
            seen_queued = max(seen_queued, check(gw))
    seen_queued = max(seen_queued, check(gw))
    assert seen_queued > 20
    events = {d.event for d in arbiter.store.decisions()}
    assert {"admit", "preempt", "requeue", "cancel", "cull"} <= events, events
    claimed = [d for d in arbiter.store.decisions() if '"resumed_from"' in d.fields]
    assert claimed, "no parked reservation was taken over"
    # The API's object carries the same position.
    for req in list(arbiter.core.live_requests()):
        if req.state is State.QUEUED:
            pos = arbiter.core.position(req.id)
            status, body = await gw.raw("GET", f"api/requests/{req.id}", who="root")
            assert status == 200
            assert body["position"] == {
                "tenant": pos.tenant_position,
                "tenant_of": pos.tenant_queued,
                "overall": pos.overall_position,
                "of": pos.overall_queued,
            }
            break
