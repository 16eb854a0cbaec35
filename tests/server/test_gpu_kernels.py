"""GPU kernels against a real gateway (simulated devices: one node with one a100).

Kernels are started through the server's REST API (as the notebook does) and driven through
their channels with jupyter_client's async client.

The coroutine tests are deliberately NOT marked `@pytest.mark.asyncio`: pytest-asyncio would
run them on a loop of its own while the server, its kernels and the extension's loops live on
pytest-jupyter's loop (jp_asyncio_loop), and every request to the server would hang.
Unmarked, strict-mode pytest-asyncio leaves them alone and pytest-jupyter's hook (imported by
conftest.py for this directory only) runs them on the server's loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from helpers import wait_until as wait_for
from srvutil import GatewayProc, gpu_extension
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.slow


async def start_kernel(jp_fetch: Any, name: str) -> str:
    t0 = time.monotonic()
    resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
    # The REST call never waits for the queue (pending kernels).
    assert time.monotonic() - t0 < 5
    return str(json.loads(resp.body)["id"])


async def gpu_kernels(jp_fetch: Any) -> list[dict[str, Any]]:
    resp = await jp_fetch("gpuaas", "kernels")
    result: list[dict[str, Any]] = json.loads(resp.body)
    return result


async def gpu_kernel(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    for k in await gpu_kernels(jp_fetch):
        if k["kernel_id"] == kernel_id:
            return k
    raise AssertionError(f"kernel {kernel_id} not in /gpuaas/kernels")


async def run_code(app: Any, kernel_id: str, code: str) -> str:
    km = app.kernel_manager.get_kernel(kernel_id)
    await asyncio.wait_for(km.ready, 60)
    kc = km.client()
    kc.start_channels()
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        await kc.wait_for_ready(timeout=60)
        reply = await kc.execute_interactive(code, output_hook=hook, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
    return "".join(out)


def kernel_ready(app: Any, kernel_id: str) -> Callable[[], bool]:
    def check() -> bool:
        km = app.kernel_manager.get_kernel(kernel_id)
        return bool(km.ready.done() and km.has_kernel)

    return check


ENV_CODE = (
    "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), "
    "os.environ.get('NVIDIA_VISIBLE_DEVICES'), os.environ.get('GPUAAS_REQUEST_ID'))"
)


async def test_second_kernel_waits_for_the_gpu_then_starts_on_it(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    out = await run_code(gpu_app, first, ENV_CODE)
    rec1 = await gpu_kernel(jp_fetch, first)
    assert rec1["state"] == "running" and rec1["devices"] == [0]
    assert out.split() == ["0", "0", rec1["request_id"]]
    assert gateway.request(rec1["request_id"])["state"] == "admitted"

    second = await start_kernel(jp_fetch, "gpu1")
    rec2 = await wait_for(
        lambda: _queued(jp_fetch, second), what="the second kernel queued with a position"
    )
    assert rec2["position"]["overall"] == 1
    # /gpuaas/kernels says why in the gateway's words: the core found vision at its quota
    # (checked before devices, as Kueue does), and no grant in use has a known end.
    assert rec2["waiting_for"] == {
        "kind": "quota",
        "message": "waiting for quota: vision uses its only a100; no estimate yet",
    }
    assert rec2["estimated_wait"]["seconds"] is None
    # The kernel list of the server says it is still starting, and why.
    model = json.loads((await jp_fetch("api", "kernels", second)).body)
    assert model["execution_state"] == "starting"
    assert "waiting for 1 a100 (position 1 in vision)" in model.get("reason", "")
    # The sidebar can also read the queue through the proxy.
    mine = json.loads(
        (await jp_fetch("gpuaas", "api", "requests", params={"state": "queued"})).body
    )
    assert [r["id"] for r in mine] == [rec2["request_id"]]

    await jp_fetch("api", "kernels", first, method="DELETE")
    await wait_for(kernel_ready(gpu_app, second), 30, "the second kernel to start")
    out = await run_code(gpu_app, second, ENV_CODE)
    rec2 = await gpu_kernel(jp_fetch, second)
    assert out.split() == ["0", "0", rec2["request_id"]]
    assert gateway.request(rec1["request_id"])["state"] == "finished"
    assert gateway.request(rec2["request_id"])["state"] == "admitted"


async def _queued(jp_fetch: Any, kernel_id: str) -> dict[str, Any] | None:
    try:
        rec = await gpu_kernel(jp_fetch, kernel_id)
    except AssertionError:
        return None
    return rec if rec["state"] == "queued" and rec["position"] else None


async def test_shutting_down_a_waiting_kernel_cancels_its_request(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first kernel")
    second = await start_kernel(jp_fetch, "gpu1")
    rec = await wait_for(lambda: _queued(jp_fetch, second), what="the second kernel queued")
    t0 = time.monotonic()
    await jp_fetch("api", "kernels", second, method="DELETE")
    assert time.monotonic() - t0 < 5  # does not wait for the queue
    assert gateway.request(rec["request_id"])["state"] == "cancelled"
    await wait_for(lambda: second not in gpu_app.kernel_manager, 10, "the kernel removed")
    # Interrupting a waiting kernel cancels it too.
    third = await start_kernel(jp_fetch, "gpu1")
    rec3 = await wait_for(lambda: _queued(jp_fetch, third), what="the third kernel queued")
    await jp_fetch("api", "kernels", third, "interrupt", method="POST", body="")
    await wait_for(
        lambda: gateway.request(rec3["request_id"])["state"] == "cancelled",
        what="the interrupted kernel's request cancelled",
    )
    # The first kernel kept its GPU throughout.
    assert (await gpu_kernel(jp_fetch, first))["state"] == "running"


async def test_never_admissible_kernel_fails_at_once_with_the_reason(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]]
) -> None:
    t0 = time.monotonic()
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu2"}))
    assert time.monotonic() - t0 < 5
    assert info.value.code == 422
    body = json.loads(info.value.response.body)
    assert "2 GPUs do not fit on one node" in body["message"]
    assert json.loads((await jp_fetch("api", "kernels")).body) == []
    failed = (await gpu_kernels(jp_fetch))[0]
    assert failed["state"] == "failed" and "do not fit" in failed["reason"]
    # The refused start leaves nothing behind that the server's shutdown would trip on.
    resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    cpu = json.loads(resp.body)["id"]
    await gpu_app.kernel_manager.shutdown_all()
    assert cpu not in gpu_app.kernel_manager and len(gpu_app.kernel_manager) == 0


async def test_restart_keeps_the_grant(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    kid = await start_kernel(jp_fetch, "gpu1")
    before = await run_code(gpu_app, kid, ENV_CODE)
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="")
    after = await run_code(gpu_app, kid, ENV_CODE)
    assert before == after  # same devices, same request
    rid = before.split()[2]
    assert gateway.request(rid)["state"] == "admitted"


async def test_kill_9_of_the_kernel_releases_its_grant(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    kid = await start_kernel(jp_fetch, "gpu1")
    await run_code(gpu_app, kid, "pass")
    rec = await gpu_kernel(jp_fetch, kid)
    km = gpu_app.kernel_manager.get_kernel(kid)
    os.kill(km.provisioner.pid, signal.SIGKILL)
    await wait_for(
        lambda: gateway.request(rec["request_id"])["state"] == "finished",
        what="the dead kernel's grant released",
    )
    old = next(k for k in await gpu_kernels(jp_fetch) if k["request_id"] == rec["request_id"])
    assert old["state"] == "released" and "died" in old["reason"]


@pytest.mark.gateway_policy(idle_timeout=3, cull_warning=2, reservation_ttl=60)
async def test_idle_kernel_is_warned_culled_and_relaunched_from_its_parked_quota(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the kernel")
    rec = await gpu_kernel(jp_fetch, kid)
    await wait_for(
        lambda: _notes(jp_fetch, "cull_warning"), 15, "a cull warning for the idle kernel"
    )
    await wait_for(lambda: kid not in gpu_app.kernel_manager, 15, "the culled kernel shut down")
    culled = await gpu_kernel(jp_fetch, kid)
    assert culled["state"] == "culled"
    assert culled["reason"] == "culled: idle on GPU for 3 s"
    assert "will be shut down" in culled["warning"]["message"]
    assert gateway.request(rec["request_id"])["state"] == "parked"
    notes = await _notes(jp_fetch, "culled")
    assert notes and notes[-1]["message"] == culled["reason"]

    # Relaunched within the reservation TTL: admitted at once, no queueing.
    again = await start_kernel(jp_fetch, "gpu1")
    rec2 = await gpu_kernel(jp_fetch, again)
    assert rec2["state"] in ("admitted", "running"), rec2
    await wait_for(kernel_ready(gpu_app, again), 30, "the relaunched kernel")
    assert gateway.request(rec2["request_id"])["state"] == "admitted"


async def _notes(jp_fetch: Any, kind: str) -> list[dict[str, Any]]:
    notes = json.loads((await jp_fetch("gpuaas", "notifications")).body)
    return [n for n in notes if n["kind"] == kind]


async def test_server_shutdown_releases_every_grant_and_cancels_every_wait(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    first = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, first), 30, "the first kernel")
    second = await start_kernel(jp_fetch, "gpu1")
    waiting = await wait_for(lambda: _queued(jp_fetch, second), what="the second kernel queued")
    running = await gpu_kernel(jp_fetch, first)
    await gpu_extension(gpu_app).stop_extension()
    assert gateway.request(running["request_id"])["state"] == "finished"
    await wait_for(
        lambda: gateway.request(waiting["request_id"])["state"] == "cancelled",
        what="the waiting kernel's request cancelled",
    )


async def test_proxy_routes_forward_as_the_server_user(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    tenants = json.loads((await jp_fetch("gpuaas", "api", "tenants")).body)
    assert [t["name"] for t in tenants["tenants"]] == ["vision"]
    devices = json.loads((await jp_fetch("gpuaas", "api", "devices")).body)
    assert devices["simulated"] is True
    me = json.loads((await jp_fetch("gpuaas", "api", "me")).body)
    assert me["name"] == "alice"
    created = json.loads(
        (
            await jp_fetch(
                "gpuaas",
                "api",
                "requests",
                method="POST",
                body=json.dumps({"tenant": "vision", "kind": "job", "gpus": 1}),
            )
        ).body
    )
    assert created["user"] == "alice" and created["state"] == "admitted"
    got = json.loads((await jp_fetch("gpuaas", "api", "requests", created["id"])).body)
    assert got["id"] == created["id"]
    # Gateway errors come through with their status and body.
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(
            "gpuaas",
            "api",
            "requests",
            method="POST",
            body=json.dumps({"tenant": "vision", "kind": "job", "gpus": 0}),
        )
    assert info.value.code == 400
    assert json.loads(info.value.response.body)["field"] == "gpus"
    deleted = json.loads(
        (await jp_fetch("gpuaas", "api", "requests", created["id"], method="DELETE")).body
    )
    assert deleted["state"] == "finished"


async def test_events_pass_through(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_base_url: str,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    gateway: GatewayProc,
) -> None:
    from tornado.httpclient import AsyncHTTPClient

    chunks: list[bytes] = []
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}gpuaas/api/events"
    fetch = AsyncHTTPClient().fetch(
        url,
        headers=jp_auth_header,
        streaming_callback=chunks.append,
        request_timeout=0,
        raise_error=False,
    )
    await wait_for(lambda: chunks, 10, "the stream to open")
    rid = gateway.call(
        "POST",
        "api/requests",
        {"tenant": "vision", "kind": "job", "gpus": 1},
        token="alice-token-0123456789",
    )["id"]
    await wait_for(lambda: b"event: admit" in b"".join(chunks), 10, "an admit event")
    assert rid.encode() in b"".join(chunks)
    del fetch
    # A browser's EventSource resumes with Last-Event-ID: the gateway replays through us.
    blocks = b"".join(chunks).decode().split("\n\n")
    submit = next(b for b in blocks if "event: submit" in b and rid in b)
    submit_id = next(line[3:].strip() for line in submit.splitlines() if line.startswith("id:"))
    again: list[bytes] = []
    resumed = AsyncHTTPClient().fetch(
        url,
        headers={**jp_auth_header, "Last-Event-ID": submit_id},
        streaming_callback=again.append,
        request_timeout=0,
        raise_error=False,
    )
    await wait_for(lambda: b"event: admit" in b"".join(again), 10, "the replayed admit")
    assert b"event: submit" not in b"".join(again)  # only what came after submit_id
    del resumed
