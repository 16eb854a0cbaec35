"""The holders of gateway_replay.py: each generator process's submissions, SSE listeners
and releases (split out of gateway_replay.py to keep modules short; see its docstring).

A holder learns of its request's admission from SSE (or the submit's answer), runs its
duration, and DELETEs it; a `preempt` stops its clock and the next `admit` restarts it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import gateway_load as gl

# --------------------------------------------------------------------------- the holders


@dataclass
class Holder:
    """One request of the trace and what its holder knows of it."""

    spec: dict[str, Any]
    gid: str | None = None  # the gateway's id, from the submit's answer
    running: bool = False  # its clock runs (admitted, as far as the holder knows)
    releasing: bool = False  # DELETE sent
    done: bool = False  # released (or failed: see `error`)
    admitted: bool = False
    runs: int = 0  # admissions the holder started its clock on
    preempted: int = 0
    timer: asyncio.TimerHandle | None = None
    error: str | None = None
    early: list[tuple[str, float, float]] = field(default_factory=list)


class Worker:
    """The holders of some tenants: their submissions, SSE listeners and releases."""

    def __init__(self, port: int, specs: list[dict[str, Any]], connections: int) -> None:
        self.port = port
        self.holders = [Holder(s) for s in sorted(specs, key=lambda s: s["submit"])]
        self.by_gid: dict[str, Holder] = {}
        self.unknown: dict[str, list[tuple[str, float, float]]] = {}  # events before the POST
        self.pool = gl.Pool(port)
        self.connections = connections
        self.submit_ms: list[float] = []
        self.release_ms: list[float] = []
        self.notify_ms: list[float] = []  # admit decision's t to receipt
        self.preempt_notify_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self.raced = 0  # DELETE met a request preempted and requeued meanwhile
        self.last_release = 0.0
        self.remaining = len(self.holders)
        self.all_done: asyncio.Future[None] | None = None
        self.listeners: list[Listener] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def error(self, h: Holder | None, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1
        if h is not None and not h.done:
            h.error = what
            self.finish(h)

    def finish(self, h: Holder) -> None:
        h.done = True
        self.remaining -= 1
        if self.remaining == 0 and self.all_done is not None and not self.all_done.done():
            self.all_done.set_result(None)

    # --- events -----------------------------------------------------------------------

    def on_event(self, name: str, gid: str, t: float, now: float) -> None:
        h = self.by_gid.get(gid)
        if h is None:  # the event beat the submit's answer: keep it for then
            self.unknown.setdefault(gid, []).append((name, t, now))
            return
        if h.gid == gid:  # not about a request it has given up (see `release`)
            self.apply(h, name, t, now)

    def apply(self, h: Holder, name: str, t: float, now: float) -> None:
        if h.done:
            return
        if name == "admit":
            self.notify_ms.append((now - t) * 1000)
            self.start_clock(h)
        elif name == "preempt":
            self.preempt_notify_ms.append((now - t) * 1000)
            h.preempted += 1
            if h.running and not h.releasing:
                h.running = False
                if h.timer is not None:
                    h.timer.cancel()
                    h.timer = None
        elif name == "reject":
            self.error(h, "rejected")

    def start_clock(self, h: Holder) -> None:
        if h.running or h.releasing:
            return
        h.running = h.admitted = True
        h.runs += 1
        loop = asyncio.get_running_loop()
        h.timer = loop.call_later(float(h.spec["duration"]), self.release_soon, h)

    def release_soon(self, h: Holder) -> None:
        h.timer = None
        h.releasing = True
        self.spawn(self.release(h))

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- HTTP -------------------------------------------------------------------------

    async def submit(self, h: Holder, sched: float, again: bool = False) -> None:
        s = h.spec
        body = json.dumps(
            {
                "tenant": s["tenant"],
                "kind": s["kind"],
                "gpus": s["gpus"],
                "priority": s["priority"],
                "name": s["id"],
            }
        ).encode()
        try:
            status, payload = await self.pool.call(
                "POST", "/api/requests", gl.token_of(s["user"]), body
            )
        except (OSError, asyncio.IncompleteReadError) as e:
            self.error(h, f"submit {type(e).__name__}")
            return
        if not again:
            self.submit_ms.append((time.perf_counter() - sched) * 1000)
        if status != 201:
            self.error(h, f"submit HTTP {status}")
            return
        obj = json.loads(payload)
        h.gid = obj["id"]
        h.running = h.releasing = False
        self.by_gid[h.gid] = h
        if obj["state"] == "admitted":
            self.start_clock(h)
        for name, t, now in self.unknown.pop(h.gid, ()):
            self.apply(h, name, t, now)

    async def release(self, h: Holder) -> None:
        t0 = time.perf_counter()
        try:
            status, payload = await self.pool.call(
                "DELETE", f"/api/requests/{h.gid}", gl.token_of(h.spec["user"])
            )
        except (OSError, asyncio.IncompleteReadError) as e:
            self.error(h, f"release {type(e).__name__}")
            return
        self.release_ms.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            self.error(h, f"release HTTP {status}")
            return
        state = json.loads(payload).get("state")
        if state == "cancelled":
            # The gateway had preempted and requeued it before the DELETE came, and the
            # holder had not heard yet: its last run was cut short, and the DELETE
            # cancelled the requeued request. Submit it again, as the requeue would have
            # run it again: it counts as done only once a run of it ends in a release.
            self.raced += 1
            await self.submit(h, time.perf_counter(), again=True)
            return
        if state != "finished":
            self.error(h, f"release left it {state}")
            return
        self.last_release = time.time()
        h.running = False
        self.finish(h)

    # --- the run ----------------------------------------------------------------------

    async def connect(self) -> None:
        await self.pool.warm(self.connections)
        users = sorted({h.spec["user"] for h in self.holders})
        self.listeners = [Listener(u, self.on_event) for u in users]
        loop = asyncio.get_running_loop()
        for i in range(0, len(self.listeners), 50):
            batch = self.listeners[i : i + 50]
            await asyncio.gather(
                *(loop.create_connection(lambda x=x: x, "127.0.0.1", self.port) for x in batch)
            )
            await asyncio.gather(*(asyncio.wait_for(x.connected, 30) for x in batch))

    async def run(self, start_epoch: float, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.all_done = loop.create_future()
        if not self.holders:
            return
        # perf_counter for the schedule, the epoch only to agree on the start
        start = time.perf_counter() + (start_epoch - time.time())
        for h in self.holders:
            sched = start + float(h.spec["submit"])
            delay = sched - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.spawn(self.submit(h, sched))
        left = timeout - (time.perf_counter() - start)
        try:
            await asyncio.wait_for(asyncio.shield(self.all_done), max(1.0, left))
        except TimeoutError:
            pass

    def result(self) -> dict[str, Any]:
        never_admitted = sum(1 for h in self.holders if not h.admitted)
        unreleased = sum(1 for h in self.holders if h.admitted and not h.done)
        failed = sum(1 for h in self.holders if h.error is not None)
        lost = sum(1 for h in self.holders if not h.admitted or not h.done or h.error)
        return {
            "lost": lost,
            "requests": len(self.holders),
            "admitted": sum(1 for h in self.holders if h.admitted),
            "never_admitted": never_admitted,
            "unreleased": unreleased,
            "failed": failed,
            "errors": self.errors,
            "raced": self.raced,
            "runs": sum(h.runs for h in self.holders),
            "preempted": sum(h.preempted for h in self.holders),
            "last_release": self.last_release,
            "submit_ms": self.submit_ms,
            "release_ms": self.release_ms,
            "notify_ms": self.notify_ms,
            "preempt_notify_ms": self.preempt_notify_ms,
            "listeners_closed": sum(1 for x in self.listeners if x.closed),
            "connections_opened": self.pool.opened,
            "cpu_s": time.process_time(),
        }


class Listener(asyncio.Protocol):
    """An SSE stream on api/events for one user: each event's name, `t` and `id` go to
    `on_event` (read by position: a decision's JSON starts `{"t": T, "event": E, "id": I`)."""

    def __init__(self, user: str, on_event: Any) -> None:
        self.user = user
        self.on_event = on_event
        self.buf = b""
        self.headers_done = False
        self.closed = False
        self.connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            (
                "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: token {gl.token_of(self.user)}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf + data
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            if b" 200 " not in buf[: buf.find(b"\r\n")] and not self.connected.done():
                self.connected.set_exception(RuntimeError(buf[:200].decode(errors="replace")))
            self.headers_done = True
            buf = buf[end + 4 :]
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
            if name not in ("admit", "preempt", "reject"):
                continue
            k = block.index(b'{"t": ', j) + 6
            t = float(block[k : block.index(b",", k)])
            m = block.find(b'"id": "', k)
            if m < 0:
                continue
            m += 7
            self.on_event(name, block[m : block.index(b'"', m)].decode(), t, now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.connected.done():
            self.connected.set_exception(exc or ConnectionError("closed"))


def work(
    port: int,
    specs: list[dict[str, Any]],
    connections: int,
    ready: Any,
    go: Any,
    timeout: float,
) -> dict[str, Any]:
    """One generator process (or the only one): connect, say ready, wait for the start
    epoch, replay its share."""

    async def main() -> dict[str, Any]:
        w = Worker(port, specs, connections)
        await w.connect()
        ready.put(len(w.listeners))
        start_epoch = await asyncio.get_running_loop().run_in_executor(None, go.get)
        await w.run(start_epoch, timeout)
        out = w.result()
        w.pool.close()
        for x in w.listeners:
            x.transport.close()
        return out

    return asyncio.run(main())


def child(port: int, specs: Any, conns: int, ready: Any, go: Any, out: Any, timeout: float) -> None:
    try:
        out.put(work(port, specs, conns, ready, go, timeout))
    except BaseException as e:  # reported, not swallowed: the parent counts it as lost
        ready.put(-1)
        out.put({"crashed": f"{type(e).__name__}: {e}"})
