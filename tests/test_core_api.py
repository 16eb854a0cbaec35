"""The admission core's API as the gateway drives it: leases, warnings, reservations taken
over by a new request, restore from a store, queries. The simulator covers the rest."""

from __future__ import annotations

import dataclasses

import pytest

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import Request, State


def make_core(take_over_parked: bool = False, **policy: object) -> AdmissionCore:
    config = parse_config(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
            "tenants": {
                "vision": {"cohort": "lab", "quota": {"a100": 1}},
                "nlp": {"cohort": "lab", "quota": {"a100": 1}},
            },
            "policy": dict(policy),
        }
    )
    # The gateway's setting (not a scenario key): a new request may take over a parked one.
    policy_ = dataclasses.replace(config.policy, take_over_parked=take_over_parked)
    return AdmissionCore(dataclasses.replace(config, policy=policy_))


def req(
    rid: str, tenant: str = "vision", user: str = "ann", gpus: int = 1, **kw: object
) -> Request:
    return Request(
        id=rid,
        tenant=tenant,
        user=user,
        kind=str(kw.pop("kind", "kernel")),
        gpus=gpus,
        submit_time=float(kw.pop("t", 0.0)),
        **kw,  # type: ignore[arg-type]
    )


def events(decisions: list) -> list[tuple[str, str | None]]:
    return [(d.event, d.id) for d in decisions]


def test_submit_then_schedule_admits_with_grant() -> None:
    core = make_core()
    assert events(core.submit(req("r1"), 0.0)) == [("submit", "r1")]
    assert core.get("r1").state is State.QUEUED
    (admit,) = core.schedule(0.0)
    assert (admit.event, admit.id) == ("admit", "r1")
    assert admit.fields == {
        "tenant": "vision",
        "flavor": "a100",
        "gpus": 1,
        "node": "a100-0",
        "devices": [0],
    }
    r = core.get("r1")
    assert (r.state, r.node, r.devices) == (State.ADMITTED, "a100-0", (0,))


def test_rejection_keeps_nothing_and_says_why() -> None:
    core = make_core()
    out = core.submit(req("wide", gpus=3), 0.0)
    assert events(out) == [("submit", "wide"), ("reject", "wide")]
    assert "do not fit on one node" in out[1].fields["reason"]
    assert core.get("wide") is None
    out = core.submit(req("x", tenant="nobody"), 0.0)
    assert out[1].fields["reason"] == "unknown tenant 'nobody'"


def test_lease_expiry_releases_and_admits_next() -> None:
    core = make_core(lease_ttl=30)
    core.submit(req("r1", gpus=2), 0.0)
    core.schedule(0.0)
    core.submit(req("r2", gpus=2, user="bob"), 1.0)
    assert core.schedule(1.0) == []
    assert core.next_deadline() == 30.0
    core.heartbeat("r1", 20.0)
    assert core.next_deadline() == 50.0
    assert core.step(49.0) == []
    out = core.step(50.0)
    assert events(out) == [("finish", "r1"), ("admit", "r2")]
    assert out[0].fields == {"reason": "lease expired"}


def test_cull_warning_then_cull_then_new_request_takes_over_reservation() -> None:
    core = make_core(True, idle_timeout=100, reservation_ttl=600, cull_warning=30)
    core.submit(req("k1"), 0.0)
    core.schedule(0.0)
    core.activity("k1", False, 10.0)
    assert core.next_deadline() == 80.0
    out = core.advance(80.0)
    assert events(out) == [("cull_warning", "k1")]
    assert out[0].fields == {"cull_at": 110.0}
    out = core.advance(110.0)
    assert events(out) == [("cull", "k1")] and out[0].fields == {"parked": True}
    assert core.get("k1").state is State.PARKED
    usage = {(u.tenant, u.flavor): u for u in core.tenant_usage()}
    assert usage[("vision", "a100")].parked == 1
    # The user starts a new kernel: it takes over the parked reservation.
    out = core.submit(req("k2", t=200.0), 200.0)
    assert events(out) == [("submit", "k2"), ("finish", "k1")]
    assert out[1].fields["reason"] == "reservation claimed by k2"
    assert out[1].fields["claimed_by"] == "k2"  # the gateway counts a return by it
    out = core.schedule(200.0)
    assert events(out) == [("admit", "k2")]
    assert out[0].fields["resumed_from"] == "k1"
    assert core.tenant_usage()[0].parked == 0


def test_a_hold_begins_at_an_admission_and_goes_on_through_a_resume_or_a_claim() -> None:
    """`held_since`, the start of a grant's hold of quota (the wait estimates' age of a
    grant): its admission; a resume from its parked reservation and a new request that
    claims it go on with it; after its reservation expired, its next admission holds anew."""
    core = make_core(True, idle_timeout=100, reservation_ttl=600)
    core.submit(req("k1"), 0.0)
    core.schedule(0.0)
    assert core.get("k1").held_since == 0.0
    core.activity("k1", False, 10.0)
    assert events(core.advance(110.0)) == [("cull", "k1")]
    out = core.activity("k1", True, 200.0) + core.schedule(200.0)
    assert events(out) == [("resume", "k1")]
    assert core.get("k1").held_since == 0.0  # resumed: the same hold
    core.activity("k1", False, 300.0)
    core.advance(400.0)
    core.submit(req("k2", t=500.0), 500.0)  # claims k1's parked reservation
    assert events(core.schedule(500.0)) == [("admit", "k2")]
    assert core.get("k2").held_since == 0.0  # its user's hold goes on
    core.activity("k2", False, 600.0)
    assert events(core.advance(700.0)) == [("cull", "k2")]
    assert events(core.advance(1300.0)) == [("expire", "k2")]
    assert core.get("k2").held_since == 0.0  # (what it held last: it holds nothing now)
    out = core.activity("k2", True, 1400.0) + core.schedule(1400.0)
    assert events(out) == [("requeue", "k2"), ("admit", "k2")]  # back after it went
    assert core.get("k2").held_since == 1400.0


def test_claim_parked_needs_same_user_tenant_and_shape() -> None:
    core = make_core(True, idle_timeout=10, reservation_ttl=600)
    core.submit(req("k1"), 0.0)
    core.schedule(0.0)
    core.activity("k1", False, 0.0)
    core.advance(10.0)
    out = core.submit(req("other", user="bob", t=20.0), 20.0)
    assert events(out) == [("submit", "other")]
    out = core.submit(req("big", gpus=2, t=20.0), 20.0)
    assert events(out) == [("submit", "big")]
    out = core.submit(req("job", kind="job", t=20.0), 20.0)
    assert events(out) == [("submit", "job")]
    assert core.get("k1").state is State.PARKED


def test_without_take_over_a_new_request_queues_beside_the_parked_one() -> None:
    # The simulator's default: every request of a scenario is its own.
    core = make_core(idle_timeout=10, reservation_ttl=600)
    core.submit(req("k1"), 0.0)
    core.schedule(0.0)
    core.activity("k1", False, 0.0)
    core.advance(10.0)
    out = core.submit(req("k2", t=20.0), 20.0)
    assert events(out) == [("submit", "k2")]
    assert core.get("k1").state is State.PARKED
    assert core.get("k2").state is State.QUEUED


def test_busy_activity_cancels_pending_cull() -> None:
    core = make_core(idle_timeout=100)
    core.submit(req("k1"), 0.0)
    core.schedule(0.0)
    core.activity("k1", False, 0.0)
    core.activity("k1", True, 50.0)
    assert core.next_deadline() is None
    assert core.advance(1000.0) == []


def test_restore_rebuilds_grants_and_refuses_double_binding() -> None:
    core = make_core()
    a = req("a")
    a.state, a.assigned_flavor, a.node, a.devices = State.ADMITTED, "a100", "a100-0", (1,)
    b = req("b", tenant="nlp")
    b.state, b.assigned_flavor, b.node, b.devices = State.ADMITTED, "a100", "a100-0", (1,)
    q = req("q", user="cat", seq=7)
    assert core.restore(a, 5.0) == []
    out = core.restore(b, 5.0)
    assert events(out) == [("finish", "b")]
    assert "gone" in out[0].fields["reason"]
    core.restore(q, 5.0)
    assert core.nodes()[0].holders == {1: "a"}
    # A new submission gets a fresh sequence number after the restored ones.
    core.submit(req("n", tenant="nlp"), 6.0)
    assert core.get("n").seq > 7
    out = core.schedule(6.0)
    assert events(out) == [("admit", "n")]
    assert out[0].fields["devices"] == [0]


def test_position_and_usage() -> None:
    core = make_core()
    core.submit(req("r1", gpus=2), 0.0)
    core.schedule(0.0)
    for i in range(3):
        core.submit(req(f"q{i}", t=float(i + 1)), float(i + 1))
    core.submit(req("hi", t=5.0, priority=5), 5.0)
    core.schedule(5.0)
    pos = core.position("q1")
    assert (pos.tenant_position, pos.tenant_queued) == (3, 4)
    assert core.position("hi").tenant_position == 1
    assert core.position("r1") is None
    usage = {u.tenant: u for u in core.tenant_usage()}
    assert usage["vision"].admitted == 2 and usage["vision"].borrowed == 1
    assert usage["vision"].pending_requests == 4 and usage["vision"].pending_gpus == 4


def test_nodes_joining_and_leaving() -> None:
    core = AdmissionCore(
        parse_config(
            {
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                "tenants": {"vision": {"quota": {"a100": 4}}},
            }
        )
    )
    core.submit(req("r1", gpus=2), 0.0)
    core.schedule(0.0)
    core.submit(req("r2"), 0.0)
    assert core.schedule(0.0) == []  # blocked by capacity, not quota
    core.add_node("a100", "extra-0", 2, 1.0)
    out = core.schedule(1.0)
    assert [(d.event, d.fields.get("node")) for d in out] == [("admit", "extra-0")]
    out = core.remove_node("a100-0", 2.0)
    assert events(out) == [("finish", "r1")]
    assert out[0].fields["reason"] == "node a100-0 left"
    assert [n.name for n in core.nodes()] == ["extra-0"]


def test_a_job_on_a_node_that_leaves_is_requeued_by_submit_time() -> None:
    core = AdmissionCore(
        parse_config(
            {
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                "tenants": {"vision": {"quota": {"a100": 4}}},
            }
        )
    )
    core.submit(req("job", kind="job", t=0.0), 0.0)
    core.submit(req("kern", kind="kernel", t=0.0), 0.0)
    core.schedule(0.0)
    core.submit(req("late", kind="job", t=5.0), 5.0)
    core.schedule(5.0)  # no room: queued behind the capacity
    out = core.remove_node("a100-0", 10.0)
    assert events(out) == [("requeue", "job"), ("finish", "kern")]
    assert out[1].fields["reason"] == "node a100-0 left"
    job = core.get("job")
    assert (job.state, job.node, job.devices, job.queue_time) == (State.QUEUED, None, (), 0.0)
    # A new node: the requeued job goes first, by its submit time, not the later job.
    core.add_node("a100", "a100-1", 1, 11.0)
    assert [(d.event, d.id) for d in core.schedule(11.0)] == [("admit", "job")]
    assert core.get("late").state is State.QUEUED


def test_update_config_refuses_to_drop_tenants_with_requests() -> None:
    core = make_core()
    core.submit(req("r1"), 0.0)
    with pytest.raises(ValueError, match="vision"):
        core.update_config(
            parse_config(
                {
                    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                    "tenants": {"nlp": {"quota": {"a100": 1}}},
                }
            ),
            1.0,
        )


def test_unknown_and_ended_requests() -> None:
    core = make_core()
    with pytest.raises(KeyError):
        core.cancel("nope", 0.0)
    core.submit(req("r1"), 0.0)
    assert events(core.cancel("r1", 1.0)) == [("cancel", "r1")]
    assert core.get("r1") is None


def test_restored_autoscaled_node_is_scaled_down_when_idle() -> None:
    core = AdmissionCore(
        parse_config(
            {
                "flavors": {"a100": {"nodes": 0, "gpus_per_node": 2}},
                "tenants": {"vision": {"quota": {"a100": 4}}},
                "policy": {"autoscale": {"a100": {"max_nodes": 2, "scale_down_after": 60}}},
            }
        )
    )
    core.add_node("a100", "a100-0", 2, 0.0, autoscaled=True)
    core.add_node("a100", "fixed", 2, 0.0)
    assert core.next_deadline() == 60.0
    out = core.step(60.0)
    assert [(d.event, d.fields) for d in out] == [
        ("scale_down", {"flavor": "a100", "node": "a100-0"})
    ]
    assert [n.name for n in core.nodes()] == ["fixed"]
