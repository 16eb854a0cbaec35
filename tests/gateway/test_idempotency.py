"""`POST api/requests` with an `Idempotency-Key` (issue 40, item 4): a retry with the same
key from the same user answers 200 with the request the first one created."""

from __future__ import annotations

from typing import Any

import pytest
from gwutil import Gateway, store_rows

JOB = {"tenant": "vision", "kind": "job", "gpus": 1}


@pytest.mark.asyncio
async def test_same_key_same_user_is_the_same_request(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    status, first = await gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": "k-1"})
    assert status == 201, first
    status, again = await gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": "k-1"})
    assert status == 200 and again["id"] == first["id"], again
    # Another user's key is theirs alone; another key is another request.
    status, carols = await gw.raw(
        "POST", "api/requests", JOB, who="carol", **{"Idempotency-Key": "k-1"}
    )
    assert status == 201 and carols["id"] != first["id"]
    status, other = await gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": "k-2"})
    assert status == 201 and other["id"] != first["id"]
    # Ended (and gone from memory): still found, from the store.
    status, _ = await gw.raw("DELETE", f"api/requests/{first['id']}")
    assert status == 200
    status, ended = await gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": "k-1"})
    assert status == 200 and ended["id"] == first["id"] and ended["state"] != "queued", ended
    keys = sorted(
        (r.user, r.idempotency_key) for r in store_rows(db_url).values() if r.idempotency_key
    )
    assert keys == [("alice", "k-1"), ("alice", "k-2"), ("carol", "k-1")]


@pytest.mark.asyncio
async def test_same_key_at_once_makes_one_request(gw: Gateway) -> None:
    import asyncio

    answers = await asyncio.gather(
        *(gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": "burst"}) for _ in range(8))
    )
    ids = {body["id"] for _, body in answers}
    assert len(ids) == 1, answers
    assert sorted(status for status, _ in answers) == [200] * 7 + [201]


@pytest.mark.asyncio
@pytest.mark.parametrize("key", ["", "x" * 256, "with space", "é"])
async def test_bad_key_is_a_400_naming_the_header(gw: Gateway, key: str) -> None:
    status, body = await gw.raw("POST", "api/requests", JOB, **{"Idempotency-Key": key})
    assert status == 400 and body["field"] == "Idempotency-Key", body


@pytest.mark.asyncio
async def test_our_client_sends_a_key_and_a_retry_is_the_same_request(gw: Gateway) -> None:
    client = gw.client("alice")
    first = await client.submit("vision", "job", 1, idempotency_key="from-client")
    again = await client.submit("vision", "job", 1, idempotency_key="from-client")
    assert again["id"] == first["id"]
    fresh = await client.submit("vision", "job", 1)
    assert fresh["id"] != first["id"]
    row = gw.arbiter.store.get(fresh["id"])
    assert row is not None and row.idempotency_key  # a key of its own was sent
