"""The core's positions index (admission/positions.py) answers what the scan in
admission/views.py answers, and its running grants and parked reservations follow the
requests' states, under random load with preemption, culls, requeues and take-overs.
(These were the gateway's shadow index, tests/gateway/test_positions.py, before the core
owned them.)"""

from __future__ import annotations

import dataclasses
import random

import pytest

from jupyter_gpuaas.admission import views
from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import Request, State

PREEMPT = {"within_tenant": "LowerPriority", "reclaim_within_cohort": "Any"}


def make_core() -> AdmissionCore:
    config = parse_config(
        {
            "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}},
            "tenants": {
                "vision": {"cohort": "lab", "quota": {"a100": 4}, "preemption": PREEMPT},
                "nlp": {"cohort": "lab", "quota": {"a100": 4}, "preemption": PREEMPT},
            },
            "policy": {"idle_timeout": 5, "reservation_ttl": 30},
        }
    )
    policy = dataclasses.replace(config.policy, take_over_parked=True)
    return AdmissionCore(dataclasses.replace(config, policy=policy))


def check(core: AdmissionCore) -> int:
    live = list(core.live_requests())
    queued = 0
    for req in live:
        if req.state is State.QUEUED:
            queued += 1
            assert core.position(req.id) == views.position(core._queues.tenants, req), req.id
        else:
            assert core.position(req.id) is None
    assert {r.id for r in core.admitted()} == {r.id for r in live if r.state is State.ADMITTED}
    return queued


@pytest.mark.slow
def test_positions_grants_and_parked_follow_the_core_under_random_load() -> None:
    core = make_core()
    rng = random.Random(11)
    now = 0.0
    seq = 0
    decisions = []
    seen_queued = 0
    asked = False
    for step in range(600):
        now += rng.choice((0.0, 0.5, 1.0, 3.0))
        live = [r for r in core.live_requests()]
        admitted = [r for r in live if r.state is State.ADMITTED]
        roll = rng.random()
        if admitted and roll < 0.15:
            decisions += core.activity(rng.choice(admitted).id, False, now)
        elif live and roll < 0.3:
            victim = rng.choice(live)
            if victim.state is State.ADMITTED:
                decisions += core.finish(victim.id, now)
            else:
                decisions += core.cancel(victim.id, now)
        elif live and roll < 0.35:
            decisions += core.activity(rng.choice(live).id, True, now)
        else:
            seq += 1
            user, tenant = rng.choice((("ann", "vision"), ("bob", "nlp"), ("cy", "vision")))
            req = Request(
                id=f"r{seq}",
                tenant=tenant,
                user=user,
                kind=rng.choice(("kernel", "job")),
                gpus=rng.choice((1, 1, 2, 4)),
                submit_time=now,
                priority=rng.choice((0, 0, 5, 10)),
            )
            decisions += core.submit(req, now)
        decisions += core.step(now)
        if step % 10 == 0:
            asked = True  # from the first question on, the index is kept in step
            seen_queued = max(seen_queued, check(core))
    assert asked and seen_queued > 20
    assert check(core) >= 0
    events = {d.event for d in decisions}
    assert {"admit", "preempt", "requeue", "cull", "cancel"} <= events, events
    assert any("resumed_from" in d.fields for d in decisions), "nothing was taken over"
