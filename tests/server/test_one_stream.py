"""One grant holder per server process: a server with GPU kernels AND batch jobs (and a
sidebar open) keeps ONE event stream to the gateway, and every consumer still hears it.

The gateway is a real subprocess (conftest.py); the server reaches it through a TCP relay
that counts the `GET /api/events` connections passing through it, which is every event
stream the gateway serves this server. Nothing here polls in the consumers' place: the
provisioner's poll and the job manager's reconcile are set to minutes, so a waiting
kernel and a queued job can only start on the `admit` event the one stream brings.

Unmarked coroutine tests (see test_gpu_kernels.py): pytest-jupyter runs them on the
server's loop.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until
from srvutil import TOKEN, GatewayProc, gpu_extension, server_app_config
from tornado.httpclient import AsyncHTTPClient

pytestmark = pytest.mark.slow


class CountingRelay:
    """A TCP relay in front of the gateway: counts the event streams opened through it
    (`opened`) and those open now (`open`)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.opened = 0
        self.open = 0
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        first = conn.recv(65536)
        stream = b"/api/events" in first.split(b"\r\n", 1)[0]
        if stream:
            with self.lock:
                self.opened += 1
                self.open += 1
        upstream.sendall(first)
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        if stream:
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture
def relay(gateway: GatewayProc) -> Iterator[CountingRelay]:
    relay = CountingRelay(int(gateway.url.rstrip("/").rsplit(":", 1)[1]))
    yield relay
    relay.close()


@pytest.fixture
def jp_server_config(relay: CountingRelay, gpu_kernelspecs: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": server_app_config(),
        "GpuaasExtension": {
            "gateway_url": f"http://127.0.0.1:{relay.port}/",
            "gateway_token": TOKEN,
            "heartbeat_interval": 0.5,
            "reconnect_delay": 0.2,
        },
        # Only an event can start a waiting kernel or a queued job here.
        "GpuaasProvisioner": {"poll_interval": 600.0},
        "JobManager": {"reconcile_interval": 600.0, "poll_interval": 0.2, "kill_grace": 1.0},
    }


async def test_kernels_jobs_and_the_sidebar_share_one_event_stream(
    gpu_app: Any,
    jp_fetch: Any,
    jp_base_url: str,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    relay: CountingRelay,
) -> None:
    ext = gpu_extension(gpu_app)
    jobs = gpu_app.web_app.settings["gpuaas_jobs"]

    async def start_kernel() -> str:
        body = json.dumps({"name": "gpu1"})
        resp = await jp_fetch("api", "kernels", method="POST", body=body)
        return str(json.loads(resp.body)["id"])

    def kernel_state(kid: str) -> str | None:
        record = ext.table.get(kid)
        return record.state if record is not None else None

    # The sidebar's stream, as a browser's EventSource opens it.
    sidebar: list[bytes] = []
    AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{jp_http_port}{jp_base_url}gpuaas/api/events",
        headers=jp_auth_header,
        streaming_callback=sidebar.append,
        request_timeout=0,
        raise_error=False,
    )
    await wait_until(lambda: sidebar, 10, "the sidebar's stream to open")
    await wait_until(lambda: relay.open == 1, 10, "the server's event stream")

    first = await start_kernel()  # the only GPU is free: admitted at once
    await wait_until(lambda: kernel_state(first) == "running", 30, "the first GPU kernel")
    job = await jobs.submit({"kind": "cell", "code": "import time; time.sleep(120)", "gpus": 1})
    assert job.state == "queued"  # behind the kernel

    # The kernel gives its GPU back: only the `admit` event can start the job.
    await jp_fetch("api", "kernels", first, method="DELETE")
    await wait_until(lambda: job.state == "running", 30, "the job admitted by its event")

    # A second kernel waits behind the job; the job's end admits it, by event only.
    second = await start_kernel()
    await wait_until(lambda: kernel_state(second) == "queued", 10, "the second kernel waiting")
    await jp_fetch("gpuaas", "jobs", job.id, method="DELETE")
    await wait_until(lambda: kernel_state(second) == "running", 30, "the kernel's admit event")

    seen = b"".join(sidebar)
    assert f'"id": "{job.id}"'.encode() in seen and b"event: admit" in seen  # the sidebar too
    # One stream all along: the extension, the job manager and the sidebar share it.
    assert (relay.opened, relay.open) == (1, 1)
    await jp_fetch("api", "kernels", second, method="DELETE")
