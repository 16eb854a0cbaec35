"""admission/from_kueue.py: a core made from Kueue's state (admitted and pending Workloads,
positions from the visibility API), where Kueue mode's forward-run estimates start; and
gateway/estimates.py making that core only when it makes a set of estimates.

Plain inputs: the requests as kueue_engine.py records Kueue's Workloads (an admitted one
has the flavor of its admission and no devices; a pending one is queued by its creation
time), no cluster.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import History, estimate_waits
from jupyter_gpuaas.admission.from_kueue import kueue_core, kueue_core_steps, node_name
from jupyter_gpuaas.admission.model import Request, State
from jupyter_gpuaas.gateway.estimates import Estimates

QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 8}},
    "tenants": {
        "vision": {"quota": {"a100": 2}, "cohort": "lab"},
        "nlp": {"quota": {"a100": 1}, "cohort": "lab"},
    },
    "policy": {"idle_timeout": 1800, "reservation_ttl": 900},
}


def admitted(rid: str, tenant: str, *, at: float, kind: str = "kernel", user: str = "ann",
             gpus: int = 1, idle_since: float | None = None) -> Request:  # fmt: skip
    """An admitted Workload's request as Kueue mode records it: its flavor, no devices."""
    return Request(rid, tenant, user, kind, gpus, at - 60.0, state=State.ADMITTED,
                   queue_time=at - 60.0, assigned_flavor="a100", first_admit=at,
                   admit_time=at, idle_since=idle_since, busy=idle_since is None)  # fmt: skip


def pending(rid: str, tenant: str, *, created: float, kind: str = "job", prio: int = 0,
            user: str = "bob", gpus: int = 1) -> Request:  # fmt: skip
    return Request(rid, tenant, user, kind, gpus, created, priority=prio,
                   queue_time=created)  # fmt: skip


def past(kind: str, seconds: list[float]) -> History:
    h = History()
    for s in seconds:
        h.add(kind, "", s)
    return h


def test_the_admitted_and_pending_workloads_make_the_cores_state() -> None:
    config = parse_config(QUOTAS)
    holders = [
        # Our holder's kernel, idle: culled at its time.
        admitted("a", "vision", at=100.0, idle_since=200.0),
        # A kernel's pod made outside jupyter-gpuaas, idle as far as we know: never culled.
        admitted("b", "nlp", at=150.0, idle_since=150.0),
        admitted("x", "elsewhere", at=100.0),  # a LocalQueue the quotas do not name
    ]
    queue = [
        pending("c", "vision", created=300.0),
        pending("d", "vision", created=400.0),
        pending("e", "vision", created=500.0),  # not placed by the visibility API yet
        pending("f", "vision", created=600.0, prio=10),
        pending("g", "elsewhere", created=300.0),
    ]
    # The visibility API says d is ahead of c (Kueue requeued c, say).
    core = kueue_core(config, holders, queue, 1000.0, positions={"d": 1, "c": 2},
                      cullable={"a"})  # fmt: skip

    live = {r.id: r for r in core.live_requests()}
    assert set(live) == {"a", "b", "c", "d", "e", "f"}
    a, b = live["a"], live["b"]
    assert (a.state, a.assigned_flavor, a.admit_time) == (State.ADMITTED, "a100", 100.0)
    assert a.idle_since == 200.0 and b.idle_since is None
    assert {a.node, b.node} == {node_name("a100")} and set(a.devices) | set(b.devices) == {0, 1}
    # Kueue's order: priority first, then the visibility API's, then the rest by creation.
    order = sorted(("c", "d", "e", "f"), key=lambda rid: core.position(rid).tenant_position)  # type: ignore[union-attr]
    assert order == ["f", "d", "c", "e"]
    # Kueue's timing and none of what Kueue does not do; the room is the quota.
    policy = core.config.policy
    assert policy.one_head_per_cycle and policy.reservation_ttl == 0 and policy.lease_ttl == 0
    assert all(t.reservation_ttl == 0 for t in core.config.tenants.values())
    assert [(n.name, n.gpus, len(n.holders)) for n in core.nodes()] == [(node_name("a100"), 3, 2)]
    used = {(u.tenant, u.flavor): u.admitted for u in core.tenant_usage()}
    assert used[("vision", "a100")] == 1 and used[("nlp", "a100")] == 1
    # The inputs are copied, never changed.
    assert holders[0].node is None and holders[0].devices == () and queue[0].seq == 0


def test_an_estimate_from_kueues_state_is_the_core_modes_of_the_same_state() -> None:
    """The same quotas and the same requests, once decided by our core (Kueue's timing, no
    parking: as Kueue decides) and once as Kueue mode sees Kueue's Workloads: the same
    forward run, the same estimates."""
    doc = {**QUOTAS, "policy": {"idle_timeout": 1800, "one_head_per_cycle": True}}
    doc["flavors"] = {"a100": {"nodes": 1, "gpus_per_node": 3}}  # all the quota, one node
    core = AdmissionCore(parse_config(doc))
    core.submit(Request("a", "vision", "ann", "kernel", 1, 0.0), 0.0)
    core.submit(Request("b", "vision", "cy", "job", 1, 0.0), 0.0)
    core.submit(Request("n", "nlp", "nat", "job", 1, 0.0), 0.0)
    core.step(0.0)
    core.activity("a", False, 100.0)  # culled at 1900 s
    for i, (rid, tenant) in enumerate([("c", "vision"), ("d", "nlp"), ("e", "vision")]):
        core.submit(Request(rid, tenant, "bob", "job", 1, 200.0 + i), 200.0 + i)
    core.step(300.0)
    assert {r.id for r in core.live_requests() if r.state is State.QUEUED} == {"c", "d", "e"}
    history = past("job", [3000.0, 5000.0, 7000.0] * 3)
    in_core = estimate_waits(core, 400.0, history)

    holders = [
        admitted("a", "vision", at=0.0, idle_since=100.0),
        admitted("b", "vision", at=0.0, kind="job", user="cy"),
        admitted("n", "nlp", at=0.0, kind="job", user="nat"),
    ]
    queue = [pending(rid, t, created=200.0 + i) for i, (rid, t) in
             enumerate([("c", "vision"), ("d", "nlp"), ("e", "vision")])]  # fmt: skip
    from_kueue = kueue_core(parse_config(QUOTAS), holders, queue, 400.0, cullable={"a"})
    in_kueue = estimate_waits(from_kueue, 400.0, history)

    assert set(in_kueue) == set(in_core) == {"c", "d", "e"}
    for rid, est in in_core.items():
        got = in_kueue[rid]
        assert est.seconds is not None
        assert (got.seconds, got.low, got.high) == pytest.approx((est.seconds, est.low, est.high))
    # c goes in when "a" is culled, at its known time.
    assert in_kueue["c"].seconds == pytest.approx(1500.0)


def test_a_victim_in_its_grace_goes_at_its_time_for_the_preemptor_in_the_queue() -> None:
    doc = {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
        "tenants": {"vision": {"quota": {"a100": 1},
                               "preemption": {"within_tenant": "LowerPriority"}}},
    }  # fmt: skip
    victim = admitted("v", "vision", at=900.0)
    victim.preempt_at, victim.preempted_by = 1120.0, "p"
    queue = [pending("p", "vision", created=900.0, prio=10)]
    core = kueue_core(parse_config(doc), [victim], queue, 1000.0)
    assert estimate_waits(core, 1000.0, History())["p"].seconds == pytest.approx(120.0)
    # Preempted for a Workload we do not see: it keeps the quota (as that one will), and
    # nothing says for how long (a request of its priority cannot preempt it either).
    victim.preempted_by = "someone-else"
    queue = [pending("p", "vision", created=900.0)]
    core = kueue_core(parse_config(doc), [victim], queue, 1000.0)
    assert core.get("v").preempt_at is None  # type: ignore[union-attr]
    assert estimate_waits(core, 1000.0, History())["p"].seconds is None


def test_the_core_is_made_only_when_a_set_of_estimates_is() -> None:
    """Estimates.of with the steps that make a core: made for the first view, not for
    the next ones (the set is kept), made again after a committed change."""
    config = parse_config(QUOTAS)
    holders = [admitted("a", "vision", at=0.0, idle_since=0.0),
               admitted("b", "vision", at=0.0, idle_since=0.0),
               admitted("n", "nlp", at=0.0, kind="job")]  # fmt: skip
    queue = [pending("c", "vision", created=10.0)]
    made: list[float] = []

    def start(now: float) -> Generator[None, None, AdmissionCore]:
        made.append(now)
        return kueue_core_steps(config, holders, queue, now, cullable={"a", "b"})

    cache = Estimates()
    first = cache.of("c", start, History(), 100.0)
    assert first is not None and first.seconds == pytest.approx(1700.0) and made == [100.0]
    later = cache.of("c", start, History(), 110.0)
    assert later is not None and later.seconds == pytest.approx(1690.0) and made == [100.0]
    cache.forget()
    cache.of("c", start, History(), 120.0)
    assert made == [100.0, 120.0] and cache.runs == 2
