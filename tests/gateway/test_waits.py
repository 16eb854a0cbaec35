"""The gateway's reading of the core's state for people (gateway/waits.py), without a
gateway: who lends to a borrower, and when a queued request's turn may come."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.model import Request, State
from jupyter_gpuaas.admission.views import NodeState, TenantUsage
from jupyter_gpuaas.gateway.waits import estimate, lenders, usable_flavors, usage_json

NOW = 10_000.0
CONFIG = parse_config(
    {
        "flavors": {
            "a100": {"nodes": 1, "gpus_per_node": 8},
            "t4": {"nodes": 1, "gpus_per_node": 4},
        },
        "tenants": {
            "vision": {"cohort": "research", "quota": {"a100": 2, "t4": 0}},
            "nlp": {"cohort": "research", "quota": {"a100": 2}},
            "ops": {"cohort": "research", "quota": {"a100": 3}, "lending_limit": {"a100": 1}},
            "solo": {"quota": {"a100": 1, "t4": 0}},
        },
    }
)


def usage(tenant: str, nominal: int, admitted: int, borrowed: int = 0) -> TenantUsage:
    return TenantUsage(tenant, "a100", nominal, admitted, 0, borrowed, 0, 0)


@pytest.mark.parametrize(
    ("rows", "expected", "sentence"),
    [
        # nlp lends 2, ops at most 1: borrowing 2 takes nlp alone
        (
            [usage("vision", 2, 4, 2), usage("nlp", 2, 0), usage("ops", 3, 0)],
            ["nlp"],
            "vision uses 4 a100: 2 of its own and 2 borrowed from nlp",
        ),
        # borrowing 3: nlp's 2 and ops's lendable 1
        (
            [usage("vision", 2, 5, 3), usage("nlp", 2, 0), usage("ops", 3, 0)],
            ["nlp", "ops"],
            "vision uses 5 a100: 2 of its own and 3 borrowed from nlp and ops",
        ),
        # nlp uses its own: only ops has anything unused to lend
        (
            [usage("vision", 2, 3, 1), usage("nlp", 2, 2), usage("ops", 3, 0)],
            ["ops"],
            "vision uses 3 a100: 2 of its own and 1 borrowed from ops",
        ),
    ],
)
def test_lenders_and_the_usage_sentence(
    rows: list[TenantUsage], expected: list[str], sentence: str
) -> None:
    assert lenders(CONFIG, rows)[("vision", "a100")] == expected
    (vision,) = usage_json(CONFIG, rows)["vision"]
    assert vision["borrowed_from"] == expected and vision["message"] == sentence
    assert usage_json(CONFIG, rows)["ops"][0]["borrowed_from"] == []


def test_usable_flavors_skip_a_zero_quota_nobody_lends() -> None:
    assert usable_flavors(CONFIG, "vision", ["a100", "t4"]) == ["a100"]
    assert usable_flavors(CONFIG, "solo", ["a100", "t4"]) == ["a100"]
    assert usable_flavors(CONFIG, "nobody", ["a100"]) == ["a100"]


def holder(rid: str, user: str, kind: str, gpus: int, **fields: Any) -> Request:
    return Request(rid, "vision", user, kind, gpus, 0.0, state=State.ADMITTED,
                   assigned_flavor="a100", **fields)  # fmt: skip


Wait = tuple[dict[str, Any], dict[str, Any]]


def wait_of(
    holders: list[Request],
    hold_times: list[float],
    position: int = 1,
    idle_timeout: float = 0.0,
    free: int = 0,
) -> Wait:
    node = NodeState("a100-0", "a100", 4, {i: "x" for i in range(4 - free)}, False)
    return estimate(
        Request("q", "nlp", "bob", "server", 1, NOW),
        position,
        now=NOW,
        flavors=["a100"],
        holders=holders,
        nodes=[node],
        hold_times={"a100": hold_times},
        idle_timeout=lambda tenant: idle_timeout,
    )


def test_a_holder_past_every_past_hold_has_no_known_end() -> None:
    # Held 1000 s; past grants were held 60 and 600 s: no 0-second estimate, none at all.
    wait, why = wait_of([holder("a", "alice", "job", 4, admit_time=NOW - 1000)], [60, 600])
    assert wait == {
        "seconds": None,
        "basis": "no estimate yet: none of the a100 in use has a known end",
    }
    assert why == {"kind": "capacity", "message": "waiting: all 4 a100 are in use; no estimate yet"}


def test_the_next_end_from_past_holds_longer_than_its_age() -> None:
    # Held 120 s; of past grants, those held longer (600 and 1200 s) had 480 and 1080 left.
    wait, why = wait_of([holder("a", "alice", "job", 4, admit_time=NOW - 120)], [60, 600, 1200])
    assert wait["seconds"] == 780
    assert why["message"] == (
        "waiting: all 4 a100 are in use; the next one frees when a job of another user of "
        "vision ends (about 13 min)"
    )


def test_an_idle_holder_ends_when_culled() -> None:
    idle = holder("a", "alice", "kernel", 2, admit_time=NOW - 50, idle_since=NOW - 100)
    busy = holder("b", "carol", "server", 2, admit_time=NOW - 50)
    wait, why = wait_of([busy, idle], [], idle_timeout=400)
    assert wait["seconds"] == 300
    assert "1 grant idle until culled" in wait["basis"]
    assert why["message"] == (
        "waiting: all 4 a100 are in use; "
        "the next one frees when an idle kernel of another user of vision is culled (about 5 min)"
    )
    # Jobs are never culled, however long idle.
    job = holder("j", "dave", "job", 4, admit_time=NOW - 50, idle_since=NOW - 100)
    assert wait_of([job], [], idle_timeout=400)[0]["seconds"] is None


def test_later_turns_and_fifo_and_quota_waits() -> None:
    # Two held 500 s (left: 200 or 800, about 500), two held 100 s (600 or 1200: 900).
    # The waiting request's own user holds them: a user's own grants keep the name.
    holders = [holder(f"h{i}", "bob", "job", 1, admit_time=NOW - age)
               for i, age in enumerate((500, 500, 100, 100))]  # fmt: skip
    wait, why = wait_of(holders, [700, 1300], position=3)  # the third GPU to free is its
    assert wait["seconds"] == 900 and why["kind"] == "capacity"
    assert why["message"] == (
        "waiting: all 4 a100 are in use; the next one frees when bob's job ends "
        "(about 8 min); its turn in about 15 min"
    )
    wait, why = wait_of(holders[:2], [], position=2, free=2)
    assert why == {"kind": "fifo", "message": "waiting: 1 request ahead in the queue; "
                   "no estimate yet"}  # fmt: skip
    wait, why = wait_of(holders[:2], [], free=2)
    assert why["kind"] == "quota" and why["message"] == "waiting for its turn; no estimate yet"


def test_a_quota_wait_says_the_tenants_usage() -> None:
    # Two a100 free, nothing ahead: nlp (quota 2, borrowing from the cohort allowed) holds 2
    # of its own and 1 more that only ops could have lent (vision's are all in use).
    holders = [
        holder("v", "alice", "job", 2, admit_time=NOW - 10),
        Request("n", "nlp", "bob", "server", 3, 0.0, state=State.ADMITTED, assigned_flavor="a100",
                admit_time=NOW - 10),
    ]  # fmt: skip
    node = NodeState("a100-0", "a100", 8, {i: "x" for i in range(5)}, False)
    _, why = estimate(
        Request("q", "nlp", "bob", "kernel", 2, NOW),
        1,
        now=NOW,
        flavors=["a100"],
        holders=holders,
        nodes=[node],
        hold_times={},
        idle_timeout=lambda tenant: 0.0,
        config=CONFIG,
    )
    assert why == {
        "kind": "quota",
        "message": "waiting for quota: nlp uses 3 a100: 2 of its own and 1 borrowed from ops; "
        "no estimate yet",
    }


def test_lenders_in_a_cohort_tree_are_the_tenants_of_the_whole_tree() -> None:
    """vision (in research) borrows from infra, a tenant of a sibling cohort under the
    same root; a tenant of another tree is never named."""
    tree = parse_config(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 8}},
            "cohorts": {
                "org": {},
                "research": {"parent": "org"},
                "platform": {"parent": "org"},
                "elsewhere": {},
            },
            "tenants": {
                "vision": {"cohort": "research", "quota": {"a100": 2}},
                "infra": {"cohort": "platform", "quota": {"a100": 2}},
                "outside": {"cohort": "elsewhere", "quota": {"a100": 4}},
            },
        }
    )
    rows = [usage("vision", 2, 4, 2), usage("infra", 2, 0), usage("outside", 4, 0)]
    assert lenders(tree, rows)[("vision", "a100")] == ["infra"]
    (vision,) = usage_json(tree, rows)["vision"]
    assert vision["message"] == "vision uses 4 a100: 2 of its own and 2 borrowed from infra"
