"""SSE ids and Last-Event-ID against a real gateway process: a client that reconnects gets
exactly the events it missed, in order, before anything new; one that missed more than
the window (or comes back to a restarted gateway) gets one `reset` event and relists.

The process's event follower (`holder.follow`) is driven through a TCP relay the test can
cut, so its stream drops while the gateway keeps deciding, as a flaky network or a proxy
restart would do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
from gwutil import TOKENS

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.holder import follow

pytestmark = pytest.mark.asyncio
log = logging.getLogger("test_sse_replay")


class Recorder:
    """Reads one stream in a task; everything it hears goes in `events`."""

    def __init__(self, client: GatewayClient, last_event_id: str | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.task = asyncio.ensure_future(self._run(client, last_event_id))

    async def _run(self, client: GatewayClient, last_event_id: str | None) -> None:
        async for ev in client.events(comments=True, last_event_id=last_event_id):
            self.events.append(ev)

    def named(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "event" in e]

    async def until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 10) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for ev in self.events:
                if pred(ev):
                    return ev
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)
        raise AssertionError(f"nothing matched in {self.events}")

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


def about(rid: str, name: str | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (e.get("data") or {}).get("id") == rid and (name is None or e["event"] == name)


async def test_reconnect_with_last_event_id_gets_exactly_what_was_missed(
    spawn_gateway: Any, sqlite_url: str
) -> None:
    gw = spawn_gateway(sqlite_url)
    client = {who: GatewayClient(gw.url, TOKENS[who]) for who in ("alice", "bob", "carol")}
    watcher = Recorder(GatewayClient(gw.url, TOKENS["root"]))  # connected throughout
    carol = Recorder(client["carol"])  # view: hears everything
    alice = Recorder(client["alice"])  # hears only her own requests
    try:
        hello = await carol.until(lambda e: e.get("comment") == "connected")
        assert hello["id"]  # a new stream learns where it starts
        await alice.until(lambda e: e.get("comment") == "connected")
        await watcher.until(lambda e: e.get("comment") == "connected")
        first = await client["alice"].submit("vision", "kernel", 1)
        heard = await carol.until(about(first["id"], "admit"))
        await alice.until(about(first["id"], "admit"))
        carol_last, alice_last = heard["id"], alice.named()[-1]["id"]
        assert carol_last == alice_last  # one id per event, whoever hears it
        await carol.stop()
        await alice.stop()

        # Decisions while both are away: alice's and bob's.
        second = await client["alice"].submit("vision", "job", 2)
        bobs = await client["bob"].submit("nlp", "job", 1)
        await client["alice"].cancel(first["id"])
        await watcher.until(about(first["id"], "finish"))
        missed = _after_id(watcher.named(), carol_last)
        assert {e["data"].get("id") for e in missed} >= {second["id"], bobs["id"], first["id"]}

        carol = Recorder(client["carol"], last_event_id=carol_last)
        alice = Recorder(client["alice"], last_event_id=alice_last)
        marker = await client["alice"].submit("vision", "job", 1)  # something new
        await carol.until(about(marker["id"]))
        await alice.until(about(marker["id"]))
        await watcher.until(about(marker["id"]))

        def before_marker(rec: Recorder) -> list[tuple[str, str, Any]]:
            out = []
            for e in rec.named():
                if (e.get("data") or {}).get("id") == marker["id"]:
                    break
                out.append((e["id"], e["event"], e["data"].get("id")))
            return out

        want = [(e["id"], e["event"], e["data"].get("id")) for e in missed]
        assert before_marker(carol) == want
        alices = {first["id"], second["id"]}
        assert before_marker(alice) == [w for w in want if w[2] in alices]
        assert bobs["id"] not in {e["data"].get("id") for e in alice.named()}
        # and afterwards the same events as everybody, with the same ids
        tail = [e["id"] for e in _after_id(watcher.named(), want[-1][0])]
        assert [e["id"] for e in _after_id(carol.named(), want[-1][0])] == tail
    finally:
        for rec in (watcher, carol, alice):
            await rec.stop()


def _after_id(events: list[dict[str, Any]], last: str) -> list[dict[str, Any]]:
    ids = [e["id"] for e in events]
    return events[ids.index(last) + 1 :]


async def test_too_old_or_foreign_ids_get_a_reset(spawn_gateway: Any, sqlite_url: str) -> None:
    gw = spawn_gateway(sqlite_url, "--GatewayApp.event_replay_window=3")
    alice = GatewayClient(gw.url, TOKENS["alice"])
    watcher = Recorder(GatewayClient(gw.url, TOKENS["carol"]))
    try:
        hello = await watcher.until(lambda e: e.get("comment") == "connected")
        for _ in range(3):  # submit + admit each: 6 events, the window keeps 3
            await alice.submit("vision", "job", 1)
        await watcher.until(lambda e: len([x for x in watcher.events if "event" in x]) >= 6)
        for last_id in (hello["id"], "0000-1", "garbage"):
            rec = Recorder(GatewayClient(gw.url, TOKENS["carol"]), last_event_id=last_id)
            reset = await rec.until(lambda e: e.get("event") is not None)
            await rec.stop()
            assert reset["event"] == "reset", reset
            assert "list the requests again" in reset["data"]["reason"]
            assert reset["id"] == watcher.named()[-1]["id"]  # resume from here after relisting
        # within the window: no reset, just the last events
        recent = watcher.named()[-2]["id"]
        rec = Recorder(GatewayClient(gw.url, TOKENS["carol"]), last_event_id=recent)
        got = await rec.until(lambda e: "event" in e)
        await rec.stop()
        assert got["id"] == watcher.named()[-1]["id"] and got["event"] != "reset"
    finally:
        await watcher.stop()


class Relay:
    """A TCP relay to the gateway that the test can take down and bring back."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = True
        self.conns: list[asyncio.StreamWriter] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.conns += [writer, up_w]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def cut(self) -> None:
        self.up = False
        for w in self.conns:
            w.close()
        self.conns.clear()

    def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def test_follow_events_resumes_and_relists_on_reset(
    spawn_gateway: Any, sqlite_url: str
) -> None:
    gw = spawn_gateway(sqlite_url)
    port = int(gw.url.rstrip("/").rsplit(":", 1)[1])
    relay = Relay(port)
    await relay.start()
    heard: list[tuple[str, dict[str, Any]]] = []

    async def on_event(name: str, data: dict[str, Any]) -> None:
        heard.append((name, data))

    async def until(pred: Callable[[], bool], timeout: float = 15) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not pred():
            assert loop.time() < deadline, heard
            await asyncio.sleep(0.05)

    follower = GatewayClient(f"http://127.0.0.1:{relay.port}/", TOKENS["alice"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    unfollow = follow(follower, on_event, reconnect_delay=0.1)
    try:
        await until(lambda: bool(relay.conns))
        await asyncio.sleep(0.5)  # the gateway has subscribed the stream
        first = await alice.submit("vision", "kernel", 1)
        await until(lambda: ("admit", first["id"]) in [(n, d.get("id")) for n, d in heard])
        relay.cut()  # the stream drops; reconnects are refused for now
        second = await alice.submit("vision", "job", 1)
        await alice.cancel(first["id"])
        await asyncio.sleep(0.3)  # a few refused reconnects
        assert not [d for _, d in heard if d.get("id") == second["id"]]
        relay.up = True
        await until(lambda: ("finish", first["id"]) in [(n, d.get("id")) for n, d in heard])
        names = [(n, d.get("id")) for n, d in heard]
        assert names.index(("submit", second["id"])) < names.index(("finish", first["id"]))
        assert names.count(("admit", first["id"])) == 1  # nothing heard twice
        assert "sync" not in [n for n, _ in heard]  # replayed, not relisted

        # A restarted gateway cannot replay: the follower hears `reset` and relists.
        relay.cut()
        gw.kill()
        spawn_gateway(sqlite_url, port=port)
        heard.clear()
        relay.up = True
        await until(lambda: any(n == "sync" for n, _ in heard))
        synced = {d["id"]: d["request"]["state"] for n, d in heard if n == "sync"}
        assert synced[second["id"]] == "admitted" and synced[first["id"]] == "finished"
    finally:
        unfollow()
        relay.close()
