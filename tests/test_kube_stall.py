"""An API server that stops answering fails each call after a bound, never stalls its loop.

kubernetes_asyncio's own default is no limit at all: one call to a frozen API server would
hold Kueue mode's pods loop (the end of a preempted request), its positions loop, the
inventory or a kernel's launch forever. kubeapi/connect.py bounds every call it makes.

The stalled API server here is a loopback listener that accepts connections, reads what
it is sent and never answers: a test double, because the real one can only be frozen
(SIGSTOP) for every test sharing the session's cluster at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from jupyter_gpuaas.kubeapi.connect import api_client, request_timeout, resumable_watch
from jupyter_gpuaas.kubeapi.workloads import WorkloadWatch


@pytest.fixture
def silent_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A kubeconfig ($KUBECONFIG) naming a server that accepts and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, read by nobody: the request is never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        yield url
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_read_of_a_frozen_api_server_fails_instead_of_hanging(silent_server: str) -> None:
    """Kueue mode's read of a preempted pod (`pod_exists`) raises a timeout, which its
    loop logs and asks again at the next round, instead of waiting for good."""

    async def read() -> BaseException | None:
        watch = WorkloadWatch(_client=await api_client(timeout=0.5))
        try:
            # The outer bound only keeps a regression from hanging the suite.
            await asyncio.wait_for(watch.pod_exists("jhub", "Pod nb-alice", ""), 30)
        except asyncio.TimeoutError as e:
            return e
        finally:
            await watch.close()
        return None

    error = asyncio.run(read())
    assert error is not None
    # aiohttp's own read timeout, not the test's outer bound.
    assert type(error).__module__.startswith("aiohttp"), repr(error)


def test_a_watch_of_a_frozen_api_server_is_resumed(
    silent_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watch that hears nothing past the server's own end of it (`timeoutSeconds`) and
    the bound is taken as lost and resumed, as a dropped connection is."""
    caplog.set_level(logging.WARNING, logger="jupyter_gpuaas.kubeapi")

    async def watch() -> None:
        from kubernetes_asyncio import client

        api = await api_client(timeout=0.3)
        try:
            changes = resumable_watch(
                "node",
                client.CoreV1Api(api).list_node,
                version=lambda: "1",
                apply=lambda kind, obj: [],
                relist=lambda: asyncio.sleep(0, []),
                timeout_seconds=1,
                max_backoff=0.2,
            )

            async def drain() -> None:
                async for _ in changes:
                    pass

            task = asyncio.ensure_future(drain())
            for _ in range(200):  # until the watch was lost twice, at most 20 s
                if sum("node watch lost" in r.getMessage() for r in caplog.records) >= 2:
                    break
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await api.close()

    asyncio.run(watch())
    lost = [r.getMessage() for r in caplog.records if "node watch lost" in r.getMessage()]
    assert len(lost) >= 2, caplog.text


def test_each_kind_of_call_gets_its_own_bound() -> None:
    """A plain call waits `seconds` for each piece of its answer; a watch may be quiet until
    the server ends it and `seconds` more; a followed log only bounds its connection."""
    plain = request_timeout([("labelSelector", "a=b")], 30)
    assert (plain.sock_connect, plain.sock_read, plain.total) == (30, 30, None)
    watch = request_timeout([("watch", True), ("timeoutSeconds", 300)], 30)
    assert (watch.sock_connect, watch.sock_read) == (30, 330)
    forever = request_timeout([("watch", True)], 30)
    assert forever.sock_read is None
    log = request_timeout([("follow", True), ("container", "job")], 30)
    assert (log.sock_connect, log.sock_read) == (30, None)
    assert request_timeout(None, 5).sock_read == 5
