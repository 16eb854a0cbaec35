"""A `Claim` (claim.py) against a real gateway subprocess (conftest.py: one a100, tenant
vision, alice's token): submit, wait woken by the event stream, hold, release, ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import wait_until
from srvutil import TOKEN, GatewayProc

from jupyter_gpuaas.claim import Claim, ClaimError, Grant
from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.holder import follower, grant_holder


def test_a_claim_waits_on_the_stream_holds_and_releases(gateway: GatewayProc) -> None:
    async def scenario() -> None:
        client = GatewayClient(gateway.url, TOKEN)
        first = Claim(client, "kernel", 1, "a100", name="first")
        await first.submit()
        assert first.tenant == "vision"  # alice's only tenant, chosen for her
        grant = await first.admitted(poll=60)
        assert isinstance(grant, Grant) and grant.flavor == "a100" and grant.devices == (0,)
        env = grant.environment()
        assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["GPUAAS_REQUEST_ID"] == first.request_id
        first.hold(busy=True, interval=0.2)
        ends: list[tuple[str, str]] = []
        first.on_end(lambda state, reason: ends.append((state, reason)))

        second = Claim(client, "kernel", 1, "a100", tenant="vision")
        await second.submit()
        assert second.state == "queued"
        # Only the stream can wake it: its poll is an hour away.
        waiting = asyncio.ensure_future(second.admitted(poll=3600, stream=follower(client)))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        assert await first.release("done") is True
        assert ends == [("released", "done")]
        assert gateway.request(str(first.request_id))["state"] == "finished"
        grant2 = await asyncio.wait_for(waiting, 30)
        assert grant2.request_id == second.request_id and grant2.devices == (0,)
        await second.release()
        assert gateway.request(str(second.request_id))["state"] == "finished"
        assert await second.release() is True  # idempotent

    asyncio.run(scenario())


def test_a_claim_that_cannot_be_admitted_in_time_or_at_all_says_why(
    gateway: GatewayProc,
) -> None:
    async def scenario() -> None:
        client = GatewayClient(gateway.url, TOKEN)
        holder = Claim(client, "kernel", 1, "a100")
        await holder.submit()
        queued = Claim(client, "kernel", 1, "a100")
        await queued.submit()
        turns: list[Any] = []
        with pytest.raises(ClaimError) as e:
            await queued.admitted(poll=0.1, timeout=0.3, on_turn=lambda c: turns.append(c.state))
        assert e.value.timed_out and turns and set(turns) == {"queued"}
        await queued.release("gave up")
        assert gateway.request(str(queued.request_id))["state"] == "cancelled"
        # Cancelled elsewhere (an administrator): the wait ends with the gateway's reason.
        other = Claim(client, "kernel", 1, "a100")
        await other.submit()
        gateway.call("DELETE", f"api/requests/{other.request_id}")
        with pytest.raises(ClaimError) as e:
            await other.admitted(poll=0.1)
        assert e.value.state == "cancelled"
        # A held grant ended elsewhere: the next renewal hears it, and the claim ends lost.
        ends: list[tuple[str, str]] = []
        lost: list[int] = []
        holder.on_end(lambda state, reason: ends.append((state, reason)))
        lease = holder.hold(interval=3600, on_lost=lambda error: lost.append(error.status))
        gateway.call("DELETE", f"api/requests/{holder.request_id}")
        await grant_holder().round()
        await wait_until(lambda: ends, timeout=10, what="the end of the claim")
        await wait_until(lambda: lost, timeout=10, what="the holder told")
        assert lost == [409] and ends[0][0] == "lost"
        assert holder.ended == "lost" and lease.gone.is_set()
        assert await holder.release() is True  # nothing left to give back: quietly

    asyncio.run(scenario())
