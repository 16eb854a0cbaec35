"""1,000 SSE clients and one that stops reading (issue 40, items 5 and 9), against a real
`jupyter-gpuaas gateway` process over real sockets.

Every client that reads gets every event; the one that does not is dropped with a `reset`
(its last event) instead of holding the gateway's memory, and the gateway's own gauges
(`gpuaas_event_streams`, `gpuaas_event_streams_dropped_total`) say so; when the clients
leave, no listener is left. No timing is asserted: only what arrives.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gwutil import TOKENS, launch_gateway
from helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

CLIENTS = 1000


class Client(asyncio.Protocol):
    """An `api/events` stream that counts events (and keeps the tail of what it read)."""

    def __init__(self, token: str, headers: str = "") -> None:
        self.token = token
        self.headers = headers
        self.events = 0
        self.tail = b""
        self.closed = asyncio.get_running_loop().create_future()
        self.connected = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            f"GET /api/events HTTP/1.1\r\nHost: x\r\nAuthorization: token {self.token}\r\n"
            f"{self.headers}\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        text = self.tail + data
        self.events += text.count(b"\nevent: ") - self.tail.count(b"\nevent: ")
        self.tail = text[-4096:]
        if b": connected" in text and not self.connected.done():
            self.connected.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def metric(url: str, name: str) -> float:
    req = urllib.request.Request(
        url + "metrics", headers={"Authorization": f"token {TOKENS['root']}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} is not exported"
    return float(match.group(1))


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    gp = launch_gateway(
        tmp_path, None, "--GatewayApp.max_queued_per_user=0", "--GatewayApp.keepalive_interval=5"
    )
    yield gp.url
    gp.stop()


async def open_stream(port: int, client: Client, rcvbuf: int | None = None) -> None:
    sock = socket.socket()
    if rcvbuf is not None:  # a client that reads nothing: its window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    await asyncio.get_running_loop().create_connection(lambda: client, sock=sock)


async def submit(port: int, n: int) -> list[str]:
    """`n` submissions by alice (a long name: big events), each cancelled at once."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ids = []
    body = json.dumps({"tenant": "vision", "kind": "job", "gpus": 1, "name": "n" * 250})
    for _ in range(n):
        for method, path, data in (("POST", "/api/requests", body), ("DELETE", None, "")):
            if method == "DELETE":
                path = f"/api/requests/{ids[-1]}"
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: token "
                f"{TOKENS['alice']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n{data}".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            answer = json.loads(await reader.readexactly(length))
            assert head.startswith(b"HTTP/1.1 20"), (head, answer)
            if method == "POST":
                ids.append(answer["id"])
    writer.close()
    return ids


async def test_a_thousand_streams_and_one_that_stops_reading(gateway: str) -> None:
    port = int(gateway.rsplit(":", 1)[1].strip("/"))
    viewer = TOKENS["carol"]  # view: every stream hears every event
    clients = [Client(viewer) for _ in range(CLIENTS)]
    for i in range(0, CLIENTS, 100):
        await asyncio.gather(*(open_stream(port, c) for c in clients[i : i + 100]))
    await asyncio.wait_for(asyncio.gather(*(c.connected for c in clients)), 120)
    stuck = Client(viewer)
    await open_stream(port, stuck, rcvbuf=4096)
    await asyncio.wait_for(stuck.connected, 30)
    assert stuck.transport is not None
    stuck.transport.pause_reading()  # from here on it reads nothing
    assert metric(gateway, "gpuaas_event_streams") == CLIENTS + 1

    # Until the gateway gives up on the stuck stream (its buffer's bound), submit more.
    rounds = 0
    while metric(gateway, "gpuaas_event_streams_dropped_total") == 0:
        await submit(port, 100)
        rounds += 1
        assert rounds < 40, "the stuck stream was never dropped"
    assert metric(gateway, "gpuaas_event_streams") == CLIENTS
    await submit(port, 1)
    # Everyone who reads heard everything: the same events, at least two a submission.
    last = -1
    for _ in range(600):
        total = sum(c.events for c in clients)
        if total == last:
            break
        last = total
        await asyncio.sleep(1.0)
    counts = {c.events for c in clients}
    assert len(counts) == 1 and counts.pop() >= 2 * (100 * rounds + 1), counts
    assert all(b"event: reset" not in c.tail for c in clients)

    # The stuck client, reading again: a `reset` is the last it hears, then the end of
    # the answer (the chunked body's last chunk; the connection may idle on, keep-alive).
    stuck.transport.resume_reading()
    await wait_until(
        lambda: stuck.tail.endswith(b"\r\n0\r\n\r\n") or stuck.closed.done(), 60,
        "the stuck client to hear the end of its stream",
    )  # fmt: skip
    assert stuck.tail.endswith(b"\r\n0\r\n\r\n"), stuck.tail[-300:]
    last = stuck.tail[: -len(b"\r\n0\r\n\r\n")].rstrip(b"\r\n").rsplit(b"\n\n", 1)[-1]
    assert b"event: reset" in last and b"fell too far behind" in last, stuck.tail[-600:]
    assert stuck.events < clients[0].events

    for c in clients:
        assert c.transport is not None
        c.transport.close()
    # Nothing kept for anybody.
    await wait_until(lambda: metric(gateway, "gpuaas_event_streams") == 0, 30, "no open stream")
