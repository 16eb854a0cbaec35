"""What a waiting GPU kernel tells its notebook, and the kernel-side bits of idleness.

A real jupyter_server (pytest-jupyter) with the extension and a real gateway subprocess
(one node with one a100, vision's quota 1: see conftest.py). The notebook's side is a
websocket client on the kernel's channels, speaking the messages JupyterLab sends.

Not marked `@pytest.mark.asyncio`, for the reason given in test_gpu_kernels.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from srvutil import GatewayProc
from test_gpu_kernels import ENV_CODE, _queued, gpu_kernel, kernel_ready, start_kernel, wait_for
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

pytestmark = pytest.mark.slow


class Notebook:
    """The notebook side of one kernel websocket (JupyterLab's messages, legacy JSON)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.session = Session(username="alice")
        self.seen: list[dict[str, Any]] = []
        self.unread: list[dict[str, Any]] = []

    def execute(self, code: str) -> str:
        msg = self.session.msg("execute_request", {"code": code, "silent": False})
        msg.update(channel="shell", buffers=[])
        self.ws.write_message(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    async def next(self, check: Callable[[dict[str, Any]], bool], timeout: float = 30) -> Any:
        """The next message that passes `check` (every message is kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while self.unread:  # already received while looking for another one
            msg = self.unread.pop(0)
            if check(msg):
                return msg
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                types = [m["header"]["msg_type"] for m in self.seen]
                raise AssertionError(f"no such message within {timeout}s; saw {types}")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            assert raw is not None, "the websocket closed"
            msg = json.loads(raw)
            self.seen.append(msg)
            if check(msg):
                return msg
            if msg["channel"] == "shell":  # replies and iopub race: keep it for later
                self.unread.append(msg)


def of_type(msg_type: str, parent: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def check(msg: dict[str, Any]) -> bool:
        if msg["header"]["msg_type"] != msg_type:
            return False
        return parent is None or msg["parent_header"].get("msg_id") == parent

    return check


def text_of(msg: dict[str, Any]) -> str:
    return str(msg["content"]["data"]["text/plain"])


async def kernel_model(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    return json.loads((await jp_fetch("api", "kernels", kernel_id)).body)  # type: ignore[no-any-return]


async def open_notebook(jp_ws_fetch: Any, kernel_id: str) -> Notebook:
    params = {"session_id": uuid.uuid4().hex}
    # A waiting GPU kernel's websocket opens at once (jupyter_server alone holds it until
    # the kernel runs): the timeout is far below the wait.
    ws = await asyncio.wait_for(
        jp_ws_fetch("api", "kernels", kernel_id, "channels", params=params), 10
    )
    return Notebook(ws)


async def test_a_waiting_kernel_tells_its_cell_its_place_and_follows_the_queue(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_ws_fetch: Any,
    gateway: GatewayProc,
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first kernel")
    second = await start_kernel(jp_fetch, "gpu1")
    await wait_for(lambda: _queued(jp_fetch, second), what="the second kernel queued")
    third = await start_kernel(jp_fetch, "gpu1")
    rec3 = await wait_for(lambda: _queued(jp_fetch, third), what="the third kernel queued")

    nb = await open_notebook(jp_ws_fetch, third)
    status = await nb.next(of_type("status"))
    assert status["content"]["execution_state"] == "starting"
    before = await kernel_model(jp_fetch, third)

    cell = nb.execute(ENV_CODE)
    shown = await nb.next(of_type("display_data", cell))
    assert text_of(shown) == "waiting for 1 a100 (position 2 in vision) …"
    display_id = shown["content"]["transient"]["display_id"]

    # The queue moves: the second kernel gives up, and the same display says so.
    await jp_fetch("api", "kernels", second, method="DELETE")
    moved = await nb.next(of_type("update_display_data", cell))
    assert text_of(moved) == "waiting for 1 a100 (position 1 in vision) …"
    assert moved["content"]["transient"]["display_id"] == display_id

    # Waiting is not activity: the server still sees a starting kernel, untouched since.
    during = await kernel_model(jp_fetch, third)
    assert during["execution_state"] == "starting"
    assert during["last_activity"] == before["last_activity"]
    assert during["connections"] == 1

    # The first kernel ends: the third gets the GPU, the cell's wait is cleared, and
    # the cell sent while waiting runs on the granted device.
    await jp_fetch("api", "kernels", first, method="DELETE")
    await nb.next(of_type("clear_output", cell), 60)
    out = await nb.next(of_type("stream", cell), 60)
    rec3 = await gpu_kernel(jp_fetch, third)
    assert out["content"]["text"].split() == ["0", "0", rec3["request_id"]]
    reply = await nb.next(lambda m: m["header"]["msg_type"] == "execute_reply", 30)
    assert reply["parent_header"]["msg_id"] == cell
    assert reply["content"]["status"] == "ok"
    assert gateway.request(rec3["request_id"])["state"] == "admitted"
    # Only the kernel's own messages made it busy, once it ran.
    nb.ws.close()


async def test_a_kernel_shut_down_while_waiting_says_so_in_its_cell(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], jp_ws_fetch: Any
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first kernel")
    second = await start_kernel(jp_fetch, "gpu1")
    await wait_for(lambda: _queued(jp_fetch, second), what="the second kernel queued")
    nb = await open_notebook(jp_ws_fetch, second)
    cell = nb.execute("print('never')")
    await nb.next(of_type("display_data", cell))
    await jp_fetch("api", "kernels", second, method="DELETE")
    said = await nb.next(of_type("stream", cell))
    assert said["content"]["name"] == "stderr"
    assert said["content"]["text"].startswith("The GPU kernel did not start: kernel shut down")
    dead = await nb.next(of_type("status"))
    assert dead["content"]["execution_state"] == "dead"
    assert await asyncio.wait_for(nb.ws.read_message(), 10) is None  # closed by the server


async def test_a_running_gpu_kernel_and_a_cpu_kernel_connect_as_usual(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], jp_ws_fetch: Any
) -> None:
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the kernel")
    nb = await open_notebook(jp_ws_fetch, kid)
    cell = nb.execute("print(6 * 7)")
    out = await nb.next(of_type("stream", cell))
    assert out["content"]["text"] == "42\n"
    assert not [m for m in nb.seen if m["header"]["msg_type"] == "display_data"]
    nb.ws.close()


async def test_only_gpu_kernels_start_as_pending_kernels(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]]
) -> None:
    mkm = gpu_app.kernel_manager

    async def start_cpu_kernel() -> str:
        resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
        return str(json.loads(resp.body)["id"])

    cpu = await start_cpu_kernel()
    # Not pending: the POST answered once the kernel had started.
    assert mkm.get_kernel(cpu).ready.done()
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first GPU kernel")
    # A GPU kernel that must queue and a CPU kernel, started at the same moment: the GPU
    # kernel's POST answers while it waits, the CPU kernel's once it has started.
    waiting, cpu2 = await asyncio.gather(start_kernel(jp_fetch, "gpu1"), start_cpu_kernel())
    assert mkm.get_kernel(cpu2).ready.done()
    assert not mkm.get_kernel(waiting).ready.done()  # pending: answered while queued
    assert mkm.use_pending_kernels is False  # the server's own setting, for other kernels
    # A waiting kernel cannot restart, and says so; it keeps its place.
    rec = await wait_for(lambda: _queued(jp_fetch, waiting), what="the GPU kernel queued")
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("api", "kernels", waiting, "restart", method="POST", body="")
    assert info.value.code == 500
    assert (await gpu_kernel(jp_fetch, waiting))["request_id"] == rec["request_id"]
    await jp_fetch("api", "kernels", waiting, method="DELETE")


async def test_load_provisioner_info_takes_the_grant_back_after_a_restart(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    from srvutil import TOKEN, gpu_extension

    from jupyter_gpuaas.server.provisioner import GpuaasProvisioner

    running = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, running), 30, "the kernel")
    queued = await start_kernel(jp_fetch, "gpu1")
    await wait_for(lambda: _queued(jp_fetch, queued), what="the second kernel queued")
    km1 = gpu_app.kernel_manager.get_kernel(running)
    km2 = gpu_app.kernel_manager.get_kernel(queued)
    info1 = await km1.provisioner.get_provisioner_info()
    info2 = await km2.provisioner.get_provisioner_info()
    for info in (info1, info2):  # what a store of kernel sessions would keep: plain JSON
        info["gpuaas"] = json.loads(json.dumps(info["gpuaas"]))
    rid1, rid2 = info1["gpuaas"]["request_id"], info2["gpuaas"]["request_id"]
    n_requests = len(gateway.call("GET", "api/requests"))

    # A restarted server: its table of GPU kernels forgot them, and fresh provisioners are
    # fed the saved information, against the same gateway.
    table = gpu_extension(gpu_app).table
    table.live.pop(running, None)
    table.live.pop(queued, None)
    p1 = GpuaasProvisioner(kernel_id=running, kernel_spec=km1.kernel_spec, parent=km1)
    await p1.load_provisioner_info(info1)
    p2 = GpuaasProvisioner(kernel_id=queued, kernel_spec=km2.kernel_spec, parent=km2)
    await p2.load_provisioner_info(info2)

    assert p1.record is not None and p1.record.state == "running"
    assert p1.record.request_id == rid1 and p1.record.devices == [0]
    assert p1.grant_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert p1.grant_env["GPUAAS_REQUEST_ID"] == rid1
    assert p1.holds_grant()  # a relaunch (pre_launch) reuses it: no new request
    assert table.get(running) is p1.record

    assert p2.record is not None and p2.record.state == "queued"
    assert p2.record.request_id == rid2 and p2.record.position["tenant"] == 1
    assert table.get(queued) is p2.record
    assert len(gateway.call("GET", "api/requests")) == n_requests  # nothing submitted

    # Its grant released while the server was down: the restored kernel knows.
    gateway.call("DELETE", f"api/requests/{rid1}", token=TOKEN)
    p3 = GpuaasProvisioner(kernel_id=running, kernel_spec=km1.kernel_spec, parent=km1)
    table.live.pop(running, None)
    await p3.load_provisioner_info(info1)
    assert p3.record is not None and p3.record.state == "lost"
    assert "while the server restarted" in p3.record.reason
    assert not p3.holds_grant() and table.get(running) is None
    # ...and the waiting one is admitted on the freed GPU, on the request it had.
    await wait_for(lambda: gateway.request(rid2)["state"] == "admitted", 10, "admission")
    # (This process's own provisioner of that kernel launches it too: let it finish
    # before the teardown shuts it down.)
    await wait_for(kernel_ready(gpu_app, queued), 30, "the admitted kernel to start")


async def test_the_kernels_page_for_browsers_and_json_for_api_clients(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_base_url: str,
    jp_http_port: int,
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first kernel")
    second = await start_kernel(jp_fetch, "gpu1")
    await wait_for(lambda: _queued(jp_fetch, second), what="the second kernel queued")

    page = await jp_fetch("gpuaas", "kernels", headers={"Accept": "text/html,*/*;q=0.8"})
    assert page.headers["Content-Type"].startswith("text/html")
    html = page.body.decode()
    assert "waiting for 1 a100 (position 1 in vision) …" in html
    assert "running on 1 a100: device 0 of a100-0" in html
    forced = await jp_fetch(
        "gpuaas", "kernels", params={"format": "json"}, headers={"Accept": "text/html"}
    )
    assert {k["kernel_id"] for k in json.loads(forced.body)} >= {first, second}
    plain = json.loads((await jp_fetch("gpuaas", "kernels")).body)
    waiting = next(k for k in plain if k["kernel_id"] == second)
    assert waiting["message"] == "waiting for 1 a100 (position 1 in vision) …"

    # Without credentials: a browser is sent to the login page, an API client gets 403.
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}gpuaas/kernels"
    client = AsyncHTTPClient()
    browser = await client.fetch(
        url, headers={"Accept": "text/html"}, follow_redirects=False, raise_error=False
    )
    assert browser.code == 302 and "/login" in browser.headers["Location"]
    api = await client.fetch(url, raise_error=False)
    assert api.code == 403
    await jp_fetch("api", "kernels", second, method="DELETE")


def test_the_kernels_page_escapes_what_it_shows() -> None:
    from jupyter_gpuaas.server.handlers import kernels_page
    from jupyter_gpuaas.server.kernels import GpuKernel

    k = GpuKernel(kernel_id="k<1>", kernel_name="<script>x</script>", gpus=1, flavor="a100")
    k.state, k.tenant, k.position = "queued", "vis<i>on", {"tenant": 2}
    html = kernels_page([k], "/user/alice/")
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "waiting for 1 a100 (position 2 in vis&lt;i&gt;on) …" in html
    assert 'href="/user/alice/lab"' in html
