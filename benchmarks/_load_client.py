"""The load generator's HTTP/1.1 and SSE client for gateway_load.py (and, through it, for
gateway_replay.py's holders): keep-alive connections on raw asyncio streams, and an
`api/events` listener as a bare asyncio.Protocol.

Kept this lean because the generator shares the CPUs with the gateway it measures: time
spent parsing here is time the gateway does not get. Split out of gateway_load.py to keep
modules short (see its docstring for the benchmark); the listeners authenticate as the
load's users, whose tokens come from _load_store.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter, deque
from typing import Any

from _load_store import token_of

# --------------------------------------------------------------------------- HTTP client


class Conn:
    """One keep-alive HTTP/1.1 connection (the gateway always sends Content-Length)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = time.monotonic()  # when it last answered (or was opened)

    async def call(
        self, method: str, path: str, token: str, body: bytes = b""
    ) -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {token}\r\nContent-Length: {len(body)}\r\n"
        )
        if body:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        status_line = await self.reader.readuntil(b"\r\n")
        headers = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = await self.reader.readexactly(length) if length else b""
        return int(status_line.split(b" ", 2)[1]), payload

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections, the most recently used first. One left idle longer than
    `max_idle` seconds is closed rather than reused: the gateway closes idle connections
    after `--GatewayApp.header_timeout` (60 s), and a request sent on one it just closed
    would fail for no fault of the gateway's."""

    def __init__(self, port: int, max_idle: float = 30.0) -> None:
        self.port = port
        self.idle: deque[Conn] = deque()
        self.opened = 0
        self.max_idle = max_idle

    async def _open(self) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return Conn(reader, writer)

    async def warm(self, n: int) -> None:
        conns = await asyncio.gather(*(self._open() for _ in range(n)))
        self.idle.extend(conns)

    async def call(
        self, method: str, path: str, token: str, body: bytes = b""
    ) -> tuple[int, bytes]:
        conn = None
        while self.idle:
            conn = self.idle.pop()
            if time.monotonic() - conn.used < self.max_idle:
                break
            conn.close()
            conn = None
        if conn is None:
            conn = await self._open()
        try:
            result = await conn.call(method, path, token, body)
        except BaseException:
            conn.close()
            raise
        conn.used = time.monotonic()
        self.idle.append(conn)
        return result

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


# --------------------------------------------------------------------------- SSE listeners


class SSE(asyncio.Protocol):
    """A listener on api/events that counts events and the decision-to-receipt lag.

    Parsing is kept cheap (the generator shares the CPUs with the gateway): the decision's
    `t` is the first key of every event's data, so it is read without decoding the JSON.
    `watch` listeners decode every event and hand it to `on_event`.
    """

    def __init__(self, who: str, lags: list[float], on_event: Any = None) -> None:
        self.who = who
        self.lags = lags
        self.on_event = on_event
        self.buf = b""
        self.events = 0
        self.resets = 0
        self.by_name: Counter[str] = Counter()
        self.connected = asyncio.get_running_loop().create_future()
        self.closed = False
        self.headers_done = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        req = (
            "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {token_of(self.who)}\r\nAccept: text/event-stream\r\n\r\n"
        )
        transport.write(req.encode())

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf + data
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            status = buf[: buf.find(b"\r\n")]
            if b" 200 " not in status and not self.connected.done():
                self.connected.set_exception(RuntimeError(status.decode()))
            self.headers_done = True
            buf = buf[end + 4 :]
            # chunked transfer: the chunk-size lines are stripped below, per block
        blocks = buf.split(b"\n\n")
        self.buf = blocks.pop()
        for block in blocks:
            i = block.find(b"event: ")
            if i < 0:
                if b": connected" in block and not self.connected.done():
                    self.connected.set_result(None)
                continue
            j = block.index(b"\n", i)
            name = block[i + 7 : j].decode()
            if name == "reset":  # dropped for falling behind (or a replay it cannot have)
                self.resets += 1
                continue
            k = block.index(b'{"t": ', j)
            t = float(block[k + 6 : block.index(b",", k)])
            self.events += 1
            self.by_name[name] += 1
            self.lags.append(now - t)
            if self.on_event is not None:
                data_at = block.index(b"data: ", j) + 6
                self.on_event(name, json.loads(block[data_at:]), now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.connected.done():
            self.connected.set_exception(exc or ConnectionError("closed"))


async def open_listener(port: int, listener: SSE) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: listener, "127.0.0.1", port)
    await asyncio.wait_for(listener.connected, 30)


async def quiet(listeners: list[SSE], settle: float = 1.0, limit: float = 60.0) -> None:
    """Wait until no listener has received anything for `settle` seconds."""
    deadline = time.monotonic() + limit
    last = -1
    while time.monotonic() < deadline:
        total = sum(sse.events for sse in listeners)
        if total == last:
            return
        last = total
        await asyncio.sleep(settle)
