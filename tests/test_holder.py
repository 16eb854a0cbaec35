"""The grant holder's one renewal (holder.py) against a gateway double: what each answer
does to a lease. The real gateway is in tests/server/test_one_stream.py (one stream per
process) and the server, job and Hub tests (renewals end to end)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from traitlets import HasTraits, TraitError

from jupyter_gpuaas.client import GatewayError
from jupyter_gpuaas.holder import EventFollower, GrantHolder, Lease, Seconds, seen_uuids


class _Gateway:
    """A double of GatewayClient.heartbeat: answers from `answers`, by request id."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.beats: list[tuple[str, bool, float | None]] = []

    async def heartbeat(self, rid: str, busy: bool, utilization: float | None = None) -> Any:
        self.beats.append((rid, busy, utilization))
        answer = self.answers[rid]
        if isinstance(answer, GatewayError):
            raise answer
        return answer


@pytest.mark.asyncio
async def test_one_round_renews_every_lease_and_hands_lost_grants_on() -> None:
    gw = _Gateway(
        ok={"grant": {"lease_expires": 123.0}},
        gone=GatewayError(404, "no request gone"),
        ended=GatewayError(409, "request ended is finished"),
        flaky=GatewayError(503, "the store is busy"),
    )
    holder = GrantHolder()
    lost: list[str] = []
    leases = {
        rid: holder.hold(
            Lease(rid, gw, on_lost=lambda e, rid=rid: lost.append(rid))  # type: ignore[arg-type]
        )
        for rid in ("ok", "gone", "ended", "flaky")
    }
    leases["ok"].busy, leases["ok"].utilization = False, 0.25
    await holder.round()  # (holding started the holder's loop, whose rounds may run too)
    await asyncio.gather(*(lease.busy_with for lease in leases.values() if lease.busy_with))
    assert {rid for rid, _, _ in gw.beats} == {"ended", "flaky", "gone", "ok"}
    assert ("ok", False, 0.25) in gw.beats
    assert leases["ok"].lease_expires == 123.0 and leases["ok"].renewed_at is not None
    assert sorted(lost) == ["ended", "gone"]  # 404 and 409: the grant is gone
    assert set(holder.leases) == {"ok", "flaky"}  # a 503 is tried again next round
    assert leases["gone"].gone.is_set() and not leases["flaky"].gone.is_set()
    for lease in list(holder.leases.values()):
        holder.drop(lease)


@pytest.mark.asyncio
async def test_the_shortest_interval_asked_for_wins() -> None:
    holder = GrantHolder()
    holder.configure(30)
    holder.configure(0.5)
    holder.configure(10)
    assert holder.interval == 0.5


def test_seconds_must_be_more_than_zero_unless_zero_is_meant() -> None:
    class Knobs(HasTraits):
        interval = Seconds(1.0)
        grace = Seconds(5.0, zero_ok=True)

    knobs = Knobs()
    with pytest.raises(TraitError, match="interval must be more than 0 seconds"):
        knobs.interval = 0
    with pytest.raises(TraitError):
        knobs.grace = -1
    knobs.grace = 0
    assert knobs.grace == 0.0


def test_a_resuming_consumer_gets_what_followed_its_id_or_a_reset() -> None:
    stream = EventFollower(_Gateway())  # type: ignore[arg-type]
    events = [{"event": "admit", "data": {"id": f"r{n}"}, "id": f"b-{n}"} for n in range(3)]
    stream.recent.extend((e["id"], e) for e in events)
    stream.last_id = "b-2"
    assert stream.since("b-0") == events[1:]
    assert stream.since("b-2") == []
    [reset] = stream.since("other-7")
    assert reset["event"] == "reset" and "list the requests again" in reset["data"]["reason"]


def test_seen_uuids_are_what_the_container_was_given() -> None:
    """What a holder reports in its heartbeats for gpuaas_grant_info: the device plugin's
    NVIDIA_VISIBLE_DEVICES (UUIDs by default), else a local grant's CUDA_VISIBLE_DEVICES;
    indices, `all` and `void` name no GPU."""
    gpu, mig = "GPU-0b6c39b8-6d24-4a6f-9f65-2a1de1b1c0a1", "MIG-5c89852c-d268-c3f3-1b07"
    assert seen_uuids({"NVIDIA_VISIBLE_DEVICES": f"{gpu}, {mig}"}) == [gpu, mig]
    assert seen_uuids({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": gpu}) == [gpu]
    assert seen_uuids({"NVIDIA_VISIBLE_DEVICES": "0,1"}) == []
    assert seen_uuids({"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}) == []
    assert seen_uuids({}) == []
