"""The server's own activity (server/idle.py) against a real jupyter_server and gateway.

What jupyter_server and JupyterHub read is `GET /api/status`'s `last_activity`
(jupyterhub-singleuser reports the same value to the Hub): GPU work moves it, idleness and
our own widgets' refreshes do not. The gateway hears the same verdict as the heartbeats of
the server's own request. Every fetch of these tests during a measurement says
`no_track_activity`, as jupyter_server allows, so the tests' own calls are no activity.

As in test_gpu_kernels.py, the coroutine tests are run by pytest-jupyter on the server's
loop (no asyncio mark).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from srvutil import TOKEN, GatewayProc, gpu_extension, on_a_fake_gpu
from test_gpu_kernels import kernel_ready, start_kernel, wait_for

from jupyter_gpuaas.server.idle import SETTING

pytestmark = pytest.mark.slow

QUIET = {"no_track_activity": "1"}


async def last_activity(jp_fetch: Any) -> datetime:
    body = json.loads((await jp_fetch("api", "status")).body)
    return datetime.fromisoformat(body["last_activity"].replace("Z", "+00:00"))


async def rounds(ext: Any, n: int = 3) -> None:
    """Let `n` heartbeat rounds of the extension pass (each stamps `activity.since`)."""
    for _ in range(n):
        before = ext.activity.since
        await wait_for(lambda b=before: ext.activity.since != b, 10, "a heartbeat round")


async def kernel_client(app: Any, kernel_id: str) -> Any:
    km = app.kernel_manager.get_kernel(kernel_id)
    await asyncio.wait_for(km.ready, 60)
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return kc


def grant_of(gateway: GatewayProc, rid: str) -> dict[str, Any]:
    grant: dict[str, Any] = gateway.request(rid)["grant"] or {}
    return grant


async def test_gpu_use_of_a_silent_kernel_is_activity_and_idleness_is_not(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    """NVML per-process utilization (a fake NVML): a kernel executing nothing whose process
    computes on its GPU is busy; at 0 % it is idle and nothing moves."""
    ext = gpu_extension(gpu_app)
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the kernel")
    record = ext.table.get(kid)
    pid, gpu = on_a_fake_gpu(ext, record)

    # A kernel that just started has just been active; then it is idle: no execution,
    # 0 % on the GPU, and it stays so.
    await rounds(ext, 2)
    await wait_for(lambda: not ext.current_activity(), 10, "the new kernel idle")
    await rounds(ext)
    assert ext.current_activity() == []
    assert grant_of(gateway, record.request_id)["busy"] is False
    idle_mark = await last_activity(jp_fetch)
    await rounds(ext)
    assert await last_activity(jp_fetch) == idle_mark

    gpu.process_utilization = {pid: 90}
    await wait_for(lambda: ext.current_activity(), 10, "the GPU use seen as activity")
    assert ext.current_activity() == [f"GPU kernel {kid[:8]} is busy"]
    await wait_for(lambda: grant_of(gateway, record.request_id)["busy"], 10, "a busy heartbeat")
    assert grant_of(gateway, record.request_id)["utilization"] == 0.9
    await rounds(ext, 1)
    assert await last_activity(jp_fetch) > idle_mark  # /api/status, hence the Hub, sees it

    gpu.process_utilization = {pid: 0}
    await wait_for(lambda: not ext.current_activity(), 10, "idle again")
    mark = await last_activity(jp_fetch)
    await rounds(ext)
    assert await last_activity(jp_fetch) == mark
    assert grant_of(gateway, record.request_id)["busy"] is False


async def test_an_execution_moves_last_activity_while_its_iopub_is_silent(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]]
) -> None:
    """Without NVML: the execution state. jupyter_server itself sees only the execution's
    first and last messages; the rounds in between are ours."""
    ext = gpu_extension(gpu_app)
    kid = await start_kernel(jp_fetch, "gpu1")
    kc = await kernel_client(gpu_app, kid)
    try:
        msg_id = kc.execute("import time; time.sleep(4)")
        await wait_for(lambda: ext.current_activity(), 10, "the execution seen")
        first = gpu_app.web_app.settings[SETTING]
        km = gpu_app.kernel_manager.get_kernel(kid)
        kernel_first = km.last_activity
        await rounds(ext, 2)
        assert gpu_app.web_app.settings[SETTING] > first
        # The rounds since moved the kernel's own last activity (jupyter_server's culler
        # reads it) and the server's, which jupyter_server alone would have left at the
        # execution's first messages.
        assert km.last_activity > kernel_first
        assert gpu_app.kernel_manager.last_kernel_activity >= km.last_activity
        assert await last_activity(jp_fetch) >= km.last_activity
        reply = await kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:  # kernel_info's came first
            reply = await kc.get_shell_msg(timeout=30)
        assert reply["msg_type"] == "execute_reply"
    finally:
        kc.stop_channels()
    await wait_for(lambda: not ext.current_activity(), 10, "idle after the execution")


async def test_a_running_job_is_activity_with_no_kernel_at_all(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], jp_root_dir: Any
) -> None:
    ext = gpu_extension(gpu_app)
    await rounds(ext)
    mark = await last_activity(jp_fetch)
    spec = {
        "kind": "cell",
        "code": "import time; time.sleep(4)",
        "gpus": 1,
        "cwd": str(jp_root_dir),
    }  # fmt: skip  (a job's cwd is inside root_dir)
    job = json.loads(
        (await jp_fetch("gpuaas", "jobs", method="POST", body=json.dumps(spec), params=QUIET)).body
    )
    await wait_for(
        lambda: f"job {job['id']} is running" in ext.current_activity(), 20, "the job running"
    )
    assert len(gpu_app.kernel_manager) == 0
    await rounds(ext, 1)
    assert await last_activity(jp_fetch) > mark
    # shutdown_no_activity_timeout asks the extensions: a running job keeps the server.
    assert gpu_app.extension_manager.any_activity()
    await wait_for(lambda: not ext.current_activity(), 30, "the job's end")
    assert not gpu_app.extension_manager.any_activity()


@pytest.mark.gateway_policy(idle_timeout=8, cull_warning=0, reservation_ttl=60)
async def test_a_kernel_showing_only_a_live_status_widget_is_idle_and_culled(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    ext = gpu_extension(gpu_app)
    kid = await start_kernel(jp_fetch, "gpu1")
    kc = await kernel_client(gpu_app, kid)
    km = gpu_app.kernel_manager.get_kernel(kid)

    async def refreshes(n: int) -> None:
        """Read the kernel's iopub (as a frontend would) until `n` widget updates came."""
        seen = 0
        while seen < n:
            msg = await kc.get_iopub_msg(timeout=10)
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update":
                seen += 1

    try:
        reply = await kc.execute_interactive(
            "%load_ext jupyter_gpuaas\n%gpu status --every 0.2", timeout=60
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        # The widget refreshes (every 0.2 s plus its five calls), with comm messages on iopub...
        await refreshes(1)
        # The cell that started the widget was activity, and the extension's next round
        # (every 0.5 s here) may still count it: let three rounds pass before the mark.
        await asyncio.sleep(1.5)
        mark, kernel_mark = await last_activity(jp_fetch), km.last_activity
        await refreshes(4)
        assert kid in gpu_app.kernel_manager
        # ...none of which is activity: not the kernel's, not the server's (nor are the
        # refreshes' HTTP polls of /gpuaas/api/*, which say no_track_activity).
        assert km.last_activity == kernel_mark
        assert await last_activity(jp_fetch) == mark
        assert ext.activity.own_comms.dropped >= 4
    finally:
        kc.stop_channels()
    # The gateway hears "idle" and culls the kernel after the tenant's 8 idle seconds.
    await wait_for(lambda: kid not in gpu_app.kernel_manager, 20, "the idle kernel culled")
    culled = next(k for k in ext.table.all() if k.kernel_id == kid)
    assert culled.state == "culled" and culled.reason == "culled: idle on GPU for 8 s"


async def test_the_server_request_heartbeats_say_idle_then_busy_then_idle(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    """The server's own `server` request (the Hub spawner's, GPUAAS_REQUEST_ID): its
    heartbeats come from the server's kernels, here a plain (CPU-spec) kernel, which in a
    GPU server runs on the server's GPUs."""
    ext = gpu_extension(gpu_app)
    server = gateway.call(
        "POST", "api/requests", {"tenant": "vision", "kind": "server", "gpus": 1}, token=TOKEN
    )
    assert server["state"] == "admitted"
    ext.activity.server_request_id = server["id"]
    await wait_for(lambda: ext.activity.server_busy is False, 10, "an idle heartbeat")
    assert grant_of(gateway, server["id"])["busy"] is False

    resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kid = json.loads(resp.body)["id"]
    kc = await kernel_client(gpu_app, kid)
    try:
        kc.execute("import time; time.sleep(3)")
        await wait_for(lambda: grant_of(gateway, server["id"])["busy"], 10, "a busy heartbeat")
        assert ext.activity.reasons == [f"kernel {kid[:8]} is executing"]
        await kc.get_shell_msg(timeout=30)
    finally:
        kc.stop_channels()
    await wait_for(lambda: grant_of(gateway, server["id"]).get("busy") is False, 10, "idle again")
    gateway.call("DELETE", f"api/requests/{server['id']}", token=TOKEN)
    await wait_for(lambda: not ext.activity.reports, 10, "heartbeats stopped once it ended")
