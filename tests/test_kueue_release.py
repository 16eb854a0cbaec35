"""Kueue mode's release of a warned holder, decided without a cluster.

The real-cluster test (tests/kubernetes/test_kueue_mode.py,
`test_a_holder_that_gives_back_a_preempted_grant_ends_it_preempted`) meets whichever
order the cluster makes: Kueue taking the quota back before the holder's release, or
after. On an idle machine it is nearly always before; CI met the other order. Here both
orders are made on cue. The arbiter is a double holding only the requests table (the
engine's decision reads nothing else of it); the engine is the real one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from jupyter_gpuaas.admission.model import Request, State
from jupyter_gpuaas.gateway.kueue_engine import KueueEngine

NOW = 1_000.0


def _engine(**fields: Any) -> tuple[KueueEngine, Request]:
    req = Request(
        id="r-1", tenant="vision", user="alice", kind="kernel", gpus=1, submit_time=0.0,
        state=State.ADMITTED, first_admit=10.0, admit_time=10.0, **fields,
    )  # fmt: skip
    engine = KueueEngine(cast(Any, None))
    engine.arbiter = cast(Any, SimpleNamespace(requests={req.id: req}))
    return engine, req


@pytest.mark.parametrize("quota_back", [False, True], ids=["quota-held", "quota-back"])
def test_a_warned_holders_release_ends_it_preempted(quota_back: bool) -> None:
    """Warned of Kueue's preemption (its pod being deleted), the holder releases: the
    request ends preempted whether or not Kueue has taken the quota back yet."""
    engine, req = _engine(preempt_at=NOW + 30, preempted_by="r-2")
    if quota_back:
        engine._going[req.id] = cast(Any, object())
    decisions = engine.finish(req.id, NOW)
    assert [d.event for d in decisions] == ["preempt"]
    assert decisions[0].fields == {"by": "r-2"}
    assert req.state is State.PREEMPTED and req.preempt_at is None
    assert req.id not in engine._going


def test_an_unwarned_holders_release_ends_it_finished() -> None:
    """Not warned, the same release is the holder's own end: finished."""
    engine, req = _engine()
    engine.views.clear()  # no Workload seen: nothing to stop on the cluster
    decisions = engine.finish(req.id, NOW, "the kernel was shut down")
    assert [d.event for d in decisions] == ["finish"]
    assert req.state is State.FINISHED and req.reason == "the kernel was shut down"
