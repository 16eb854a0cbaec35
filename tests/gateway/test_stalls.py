"""Leases measure the holder, not the gateway (issue 40, item 1), in process: the test
blocks the gateway's own event loop (a real stall of the loop, as a long GC pause or a
blocking call would make), past the TTL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from gwutil import Gateway, store_rows

TTL = 1.0
KERNEL = {"tenant": "vision", "kind": "kernel", "gpus": 1}


@pytest.mark.asyncio
@pytest.mark.slow
async def test_a_stalled_loop_extends_every_lease_and_commits_it(
    make_gateway: Any, sqlite_url: str
) -> None:
    gw: Gateway = await make_gateway(sqlite_url, lease_ttl=TTL)
    status, held = await gw.raw("POST", "api/requests", KERNEL)
    assert status == 201 and held["state"] == "admitted"
    before = held["grant"]["lease_expires"]

    time.sleep(3 * TTL)  # the loop (the gateway's and this test's) is stalled

    # The first thing the gateway does after the stall is extend, not expire.
    status, seen = await gw.raw("GET", f"api/requests/{held['id']}")
    assert status == 200 and seen["state"] == "admitted", seen
    await asyncio.sleep(0.3)
    status, seen = await gw.raw("GET", f"api/requests/{held['id']}")
    assert seen["state"] == "admitted", seen
    extended = seen["grant"]["lease_expires"]
    assert extended >= before + 2 * TTL, (before, extended)
    assert store_rows(sqlite_url)[held["id"]].lease_expires == extended  # committed

    # Nobody heartbeats: the grant ends within a TTL or so of the gateway acting again.
    for _ in range(50):
        status, seen = await gw.raw("GET", f"api/requests/{held['id']}")
        if seen["state"] != "admitted":
            break
        await asyncio.sleep(0.1)
    assert seen["state"] == "finished" and seen["reason"] == "lease expired", seen
