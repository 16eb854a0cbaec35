"""SSE listeners in a process of their own (gateway_load.py's `--listener-process`).

With 1,000 streams that hear every event, reading and parsing their ~150,000 events a
second took half a core in the load generator's own process, which then sent its
submissions late (by 80-180 ms at p99 on a shared 2-core host): the latency measured was
the generator's as much as the gateway's. Here the listeners run in a child process and
read cheaply: a stream's events are counted with `bytes.count` over its whole blocks, and
only every `--sample`-th stream parses each event's decision time for the lag. The parent
(which only submits) reads the counts back when the load is over.

Protocol, one line each way on stdin/stdout: the child is given the port and the users
(JSON) as arguments; it prints `ready` once every stream has its `: connected`; on `report`
from stdin it waits until no stream has received anything for a second and prints one
JSON line: `{"streams": [[user, events, resets, closed], ...], "lags": [seconds, ...],
"cpu_s": its CPU seconds}`; then it exits when stdin closes.

    python benchmarks/_sse_crowd.py PORT USERS_JSON [--sample K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable

from _load_store import token_of

EVENT = b"\nevent: "
RESET = b"\nevent: reset\n"


class Counting(asyncio.Protocol):
    """One `api/events` stream: counts events (and `reset`s); `lags` only when sampled.

    Every event the gateway sends starts with its `id:` line, so `\\nevent: ` occurs once
    per event and never inside its JSON data (one line, newlines escaped).
    """

    def __init__(self, who: str, lags: list[float] | None) -> None:
        self.who = who
        self.lags = lags
        self.buf = b""
        self.events = 0
        self.resets = 0
        self.closed = False
        self.headers_done = False
        self.connected = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            (
                "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: token {token_of(self.who)}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            if b" 200 " not in buf[: buf.find(b"\r\n")] and not self.connected.done():
                self.connected.set_exception(RuntimeError(buf[: buf.find(b"\r\n")].decode()))
            self.headers_done = True
            buf = buf[end + 4 :]
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.buf = buf
            return
        whole, self.buf = buf[: end + 2], buf[end + 2 :]
        if not self.connected.done() and b": connected" in whole:
            self.connected.set_result(None)
        n = whole.count(EVENT)
        if not n:
            return
        resets = whole.count(RESET)
        self.resets += resets
        self.events += n - resets
        if self.lags is not None:
            now = time.time()
            i = whole.find(b'{"t": ')
            while i >= 0:  # the decision's time is the first key of every event's data
                self.lags.append(now - float(whole[i + 6 : whole.index(b",", i)]))
                i = whole.find(b'{"t": ', i + 6)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.connected.done():
            self.connected.set_exception(exc or ConnectionError("closed"))


def _made(stream: Counting) -> Callable[[], Counting]:
    return lambda: stream


async def crowd(port: int, who: list[str], sample: int) -> None:
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    streams = [
        Counting(user, lags if sample and i % sample == 0 else None) for i, user in enumerate(who)
    ]
    for i in range(0, len(streams), 50):
        batch = streams[i : i + 50]
        await asyncio.gather(*(loop.create_connection(_made(s), "127.0.0.1", port) for s in batch))
        await asyncio.wait_for(asyncio.gather(*(s.connected for s in batch)), 30)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    while (line := await reader.readline()) and line.strip() != b"report":
        pass
    last = -1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # quiet: nothing received for a second
        total = sum(s.events + s.resets for s in streams)
        if total == last:
            break
        last = total
        await asyncio.sleep(1.0)
    cpu = time.process_time()
    report = {
        "streams": [[s.who, s.events, s.resets, s.closed] for s in streams],
        "lags": [round(x, 5) for x in lags],
        "cpu_s": cpu,
    }
    print(json.dumps(report), flush=True)
    await reader.read()  # until the parent closes stdin
    for s in streams:
        if s.transport is not None:
            s.transport.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("port", type=int)
    p.add_argument("users", help="JSON list: the user of each stream")
    p.add_argument("--sample", type=int, default=20, help="every K-th stream times its lag")
    args = p.parse_args()
    asyncio.run(crowd(args.port, json.loads(args.users), args.sample))


if __name__ == "__main__":
    main()
