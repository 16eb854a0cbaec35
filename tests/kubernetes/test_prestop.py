"""The preStop hook's decision (prestop.hold_seconds, pure) and its loop (wait_out, with
its clock and sleep handed in), and the hook in a kernel pod's manifest. The hook on the
real control plane, with the real Kueue evicting the pod, is in test_kueue_lab.py."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpuaas.kubernetes.kernel_pods import kernel_pod_manifest
from jupyter_gpuaas.kubernetes.prestop import (
    MODULE,
    hold_seconds,
    prestop_lifecycle,
    wait_out,
)

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("request_", "want"),
    [
        # a warning stands: held until `at` less the margin
        ({"state": "admitted", "preempt_at": NOW + 30}, 25.0),
        # already past `at` less the margin: SIGTERM now
        ({"state": "admitted", "preempt_at": NOW + 3}, 0.0),
        ({"state": "preempted", "preempt_at": NOW - 10}, 0.0),
        # ended as preempted, its time forgotten: the hook's start + the grace
        ({"state": "preempted", "preempt_at": None}, 25.0),
        # the pod ended as preempted before `at` (its Workload gone): still held to `at`
        ({"state": "preempted", "preempt_at": NOW + 20}, 15.0),
        # held, no warning yet: ask again
        ({"state": "admitted", "preempt_at": None}, None),
        ({"state": "parked"}, None),
        # a normal stop: at once
        ({"state": "finished", "preempt_at": None}, 0.0),
        ({"state": "culled"}, 0.0),
        ({"state": "cancelled"}, 0.0),
        ({"state": "queued"}, 0.0),
        # a bad answer: at once
        (None, 0.0),
        ({"state": "admitted", "preempt_at": "soon"}, None),
        ({"state": "finished", "preempt_at": True}, 0.0),
    ],
)
def test_hold_seconds(request_: Any, want: float | None) -> None:
    assert hold_seconds(request_, NOW, 5.0) == want


class Clock:
    """A clock that moves only when the loop sleeps."""

    def __init__(self) -> None:
        self.now = NOW
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_wait_out_holds_until_the_warning() -> None:
    clock = Clock()
    answers = [{"state": "admitted"}, {"state": "admitted", "preempt_at": NOW + 40.25}]
    held = wait_out(
        lambda: answers.pop(0), margin=5, poll=2, grace=60, clock=clock.time, sleep=clock.sleep
    )
    # one poll while no warning was seen, then to `at` less the margin (inside the grace)
    assert clock.slept == [0.25, 35.0]
    assert held == 35.25


def test_wait_out_polls_only_for_a_while() -> None:
    clock = Clock()
    held = wait_out(
        lambda: {"state": "admitted"}, margin=5, poll=2, clock=clock.time, sleep=clock.sleep
    )
    assert held == 2.0
    assert len(clock.slept) == 8


def test_wait_out_holds_a_request_ended_as_preempted_for_the_grace() -> None:
    clock = Clock()
    answers = [{"state": "admitted"}, {"state": "preempted", "preempt_at": None}]
    held = wait_out(
        lambda: answers.pop(0), margin=5, poll=2, grace=30, clock=clock.time, sleep=clock.sleep
    )
    assert clock.slept == [0.25, 24.75]
    assert held == 25.0


def test_wait_out_a_normal_stop_costs_nothing() -> None:
    clock = Clock()
    held = wait_out(
        lambda: {"state": "finished"}, margin=5, poll=2, clock=clock.time, sleep=clock.sleep
    )
    assert (held, clock.slept) == (0.0, [])


def test_wait_out_an_error_ends_the_hold() -> None:
    clock = Clock()

    def fail() -> dict[str, Any]:
        raise OSError("connection refused")

    assert wait_out(fail, margin=5, poll=2, clock=clock.time, sleep=clock.sleep) == 0.0
    assert clock.slept == []


def test_kernel_pod_carries_the_hook() -> None:
    common: dict[str, Any] = {
        "name": "k",
        "kernel_id": "kid",
        "user": "ann",
        "command": ["python", "launch.py"],
        "image": "img",
        "request": {"id": "r1", "tenant": "ml", "gpus": 1, "grant": {"flavor": "a100"}},
        "flavors": {"a100": {}},
        "queue": "ml",
    }
    hooked = kernel_pod_manifest(**common, lifecycle=prestop_lifecycle(margin=3))
    container = hooked["spec"]["containers"][0]
    assert container["lifecycle"] == {
        "preStop": {"exec": {"command": ["python", "-m", MODULE, "--margin", "3", "--grace", "30"]}}
    }
    assert "lifecycle" not in kernel_pod_manifest(**common)["spec"]["containers"][0]


def test_a_warning_past_the_pods_grace_holds_only_until_the_grace_ends() -> None:
    """A `preempt_at` beyond the pod's own grace (the gateway's clock ahead of the node's)
    holds SIGTERM only until the hook's start + grace less the margin: past that the kubelet
    would SIGKILL the process with no time for its own shutdown."""
    request = {"state": "admitted", "preempt_at": 1000.0 + 300.0}
    assert hold_seconds(request, 1000.0, 5.0, started=1000.0, grace=30.0) == 25.0
    assert hold_seconds(request, 1010.0, 5.0, started=1000.0, grace=30.0) == 15.0
