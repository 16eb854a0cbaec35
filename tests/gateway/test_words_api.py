"""What a real gateway says to people: borrowing as borrowing, waits as sentences (with a
number only when one is known) and errors as one sentence naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from gwutil import Gateway

from jupyter_gpuaas.client import GatewayError
from jupyter_gpuaas.client_cli import describe

pytestmark = pytest.mark.asyncio

#: One node of 4 a100, shared by two teams of the same cohort, 2 each; nothing is
#: reclaimed, so a borrower keeps what it borrowed until it gives it back.
SHARED: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}},
    "tenants": {
        "vision": {"cohort": "research", "quota": {"a100": 2}},
        "nlp": {"cohort": "research", "quota": {"a100": 2}},
    },
    "policy": {"idle_timeout": 600},
}


def usage_of(tenants: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = next(t["usage"] for t in tenants["tenants"] if t["name"] == name)
    return dict(entry)


async def test_borrowing_and_an_indefinite_wait_read_as_sentences(make_gateway: Any) -> None:
    gw: Gateway = await make_gateway(quotas=SHARED)
    alice, bob = gw.client("alice"), gw.client("bob")
    held = await alice.submit("vision", "job", 4)
    assert held["state"] == "admitted"

    vision = usage_of(await alice.tenants(), "vision")
    assert vision["borrowed"] == 2 and vision["borrowed_from"] == ["nlp"]
    assert vision["message"] == "vision uses 4 a100: 2 of its own and 2 borrowed from nlp"
    nlp = usage_of(await alice.tenants(), "nlp")
    assert nlp["message"] == "nlp uses none of its 2 a100"

    # A job is never culled and no grant of a100 has ended yet: nothing says when one frees.
    waiting = await bob.submit("nlp", "job", 1)
    assert waiting["state"] == "queued"
    assert waiting["estimated_wait"]["seconds"] is None  # not 0.0
    assert waiting["estimated_wait"]["basis"] == (
        "no estimate yet: none of the a100 in use has a known end"
    )
    # The core's reason: the cohort's whole quota is held, nlp's share by vision (Kueue
    # calls it quota, not capacity: reclaiming it would take a preemption).
    why = "waiting for quota: nlp uses none of its 2 a100 and 2 of them are lent out in the cohort"
    assert waiting["waiting_for"] == {"kind": "quota", "message": f"{why}; no estimate yet"}
    line = describe(await bob.get(waiting["id"]))
    assert line.endswith(f"queued, position 1 of 1; {why}; no estimate yet")


async def test_an_idle_holder_gives_a_known_end(make_gateway: Any) -> None:
    gw: Gateway = await make_gateway(quotas=SHARED)
    alice, bob = gw.client("alice"), gw.client("bob")
    held = await alice.submit("vision", "kernel", 4)
    await alice.heartbeat(held["id"], busy=False)  # culled 600 s after it went idle
    waiting = await bob.submit("nlp", "server", 1)
    seconds = waiting["estimated_wait"]["seconds"]
    assert 540 <= seconds <= 600, waiting["estimated_wait"]
    assert waiting["waiting_for"]["message"] == (
        "waiting for quota: nlp uses none of its 2 a100 and 2 of them are lent out in the cohort; "
        "the next one frees when an idle kernel of another user of vision is culled "
        "(about 10 min)"
    )  # bob has no view of alice's requests: her name is not his to read


@pytest.mark.parametrize(
    ("body", "field", "sentence"),
    [
        ({"tenant": "vision", "kind": "job", "gpus": -1}, "gpus", "gpus must be at least 1"),
        ({"tenant": "vision", "kind": "job", "gpus": "2"}, "gpus", "gpus must be an integer"),
        ({"tenant": "vision", "kind": "job"}, "gpus", "gpus is required"),
        ({"tenant": "vision", "kind": "job", "gpus": 1, "gpu": 1}, "gpu", "unknown key 'gpu'"),
    ],
)
async def test_errors_are_one_sentence_naming_the_field(
    make_gateway: Any, body: dict[str, Any], field: str, sentence: str
) -> None:
    gw: Gateway = await make_gateway()
    status, answer = await gw.raw("POST", "api/requests", body)
    assert status == 400
    assert answer["field"] == field and answer["error"].startswith(sentence), answer
    # What a client shows (CLI, magics, spawner): the sentence, no "(gpus)", no "[HTTP 400]".
    with pytest.raises(GatewayError) as e:
        await gw.client("alice")._call("POST", "api/requests", body)
    assert str(e.value) == answer["error"]


async def test_capacity_and_quota_blocked_read_the_cores_reason(make_gateway: Any) -> None:
    """The kind and sentence of `waiting_for` are the core's reason from nomination, in
    the submit answer, GET api/requests/{id} and the list alike."""
    gw: Gateway = await make_gateway(
        quotas={
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}},
            "tenants": {"vision": {"quota": {"a100": 2}}, "nlp": {"quota": {"a100": 4}}},
        }
    )
    alice, bob = gw.client("alice"), gw.client("bob")
    assert (await alice.submit("vision", "job", 2))["state"] == "admitted"
    assert (await bob.submit("nlp", "job", 2))["state"] == "admitted"
    quota = await alice.submit("vision", "job", 1)
    capacity = await bob.submit("nlp", "job", 1)
    assert quota["waiting_for"]["kind"] == "quota"
    assert quota["waiting_for"]["message"].startswith(
        "waiting for quota: vision uses all 2 of its a100;"
    )
    assert capacity["waiting_for"]["kind"] == "capacity"
    assert capacity["waiting_for"]["message"].startswith("waiting: all 4 a100 are in use;")
    for client, obj in ((alice, quota), (bob, capacity)):
        got = await client.get(obj["id"])
        assert got["waiting_for"] == obj["waiting_for"]
        listed = {r["id"]: r for r in await client.list()}
        assert listed[obj["id"]]["waiting_for"] == obj["waiting_for"]
        assert obj["waiting_for"]["message"].rstrip(".") in describe(got)


async def test_a_forward_run_estimate_from_the_stores_history(
    make_gateway: Any, tmp_path: Any
) -> None:
    """GET api/requests/{id} of a queued request: the estimate of a forward run of the
    queue, from the hold times of grants that ended before the gateway (re)started, and
    the one wait sentence ending with it."""
    import sqlite3

    db = tmp_path / "history.sqlite"
    first: Gateway = await make_gateway(f"sqlite:///{db}", quotas=SHARED)
    alice = first.client("alice")
    for _ in range(5):  # five of alice's jobs, ended
        job = await alice.submit("vision", "job", 1)
        assert job["state"] == "admitted"
        assert (await alice.cancel(job["id"]))["state"] == "finished"  # (a release)
    await first.app.stop_server()
    with sqlite3.connect(db) as conn:  # ... after 20 min each (a test cannot wait 20 min)
        conn.execute(
            "UPDATE requests SET admit_time = updated - 1200, held_since = updated - 1200"
            " WHERE state = 'finished'"
        )

    gw: Gateway = await make_gateway(f"sqlite:///{db}", quotas=SHARED)
    alice, bob = gw.client("alice"), gw.client("bob")
    held = await alice.submit("vision", "job", 4)
    assert held["state"] == "admitted"
    queued = await bob.submit("nlp", "job", 1)
    got = await bob.get(queued["id"])
    wait = got["estimated_wait"]
    # alice's jobs were held 20 min; hers started just now: bob's starts in about 20 min.
    assert 1100 <= wait["seconds"] <= 1200 and wait["low"] == wait["seconds"] == wait["high"]
    assert wait["basis"] == (
        "from running the queue forward: 1 grant held about as long as 5 past grants were"
    )
    assert wait["confidence"] == "low"  # 5 past grants
    assert got["waiting_for"]["message"].endswith(
        "; in about 20 min, a rough guess: few past grants to go by"
    )
    (listed,) = [r for r in await bob.list() if r["id"] == queued["id"]]
    assert listed["estimated_wait"]["seconds"] == pytest.approx(wait["seconds"], abs=2)


async def test_a_preempted_run_is_no_sample_of_the_estimates_history(
    make_gateway: Any, sqlite_url: str
) -> None:
    """A job preempted by a kernel of higher priority runs again from the start: its cut
    run is not how long a job holds its quota (the core cut it, and a forward run makes
    its own preemptions), so the wait estimates' history gets its complete run alone."""
    quotas = {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}},
        "tenants": {
            "vision": {"quota": {"a100": 4}, "preemption": {"within_tenant": "LowerPriority"}}
        },
    }
    gw: Gateway = await make_gateway(sqlite_url, quotas=quotas)
    alice = gw.client("alice")
    job = await alice.submit("vision", "job", 4, priority=0)
    assert job["state"] == "admitted"
    kernel = await alice.submit("vision", "kernel", 4, priority=100)
    assert kernel["state"] == "admitted"
    assert (await alice.get(job["id"]))["state"] == "queued"  # preempted, queued again
    await alice.cancel(kernel["id"])
    assert (await alice.get(job["id"]))["state"] == "admitted"  # its run again
    assert (await alice.cancel(job["id"]))["state"] == "finished"
    history = gw.arbiter.history
    # The kernel's hold and the job's complete run; not the job's cut run.
    assert len(history) == 2
