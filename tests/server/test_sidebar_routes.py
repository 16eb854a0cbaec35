"""The JupyterLab sidebar's own routes (`/gpuaas/sidebar/`, jupyter_gpuaas/server/sidebar.py)
against a real gateway: Keep on a cull warning (once per warning), and the jobs with the
paths JupyterLab opens. The panel itself is tested in a browser by tests/ui/run_galata.py.

Unmarked coroutine tests, like test_gpu_kernels.py: pytest-jupyter runs them on the
server's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from srvutil import GatewayProc
from test_gpu_kernels import gpu_kernel, kernel_ready, start_kernel, wait_for
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.slow


async def keep(jp_fetch: Any, rid: str) -> Any:
    return await jp_fetch("gpuaas", "sidebar", "keep", rid, method="POST", body="")


@pytest.mark.gateway_policy(idle_timeout=6, cull_warning=4, reservation_ttl=60)
async def test_keep_answers_a_cull_warning_once_and_saves_the_gpu(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the kernel")
    rid = (await gpu_kernel(jp_fetch, kid))["request_id"]

    # No warning yet: nothing to keep.
    with pytest.raises(HTTPClientError) as e:
        await keep(jp_fetch, rid)
    assert e.value.code == 409
    assert "no cull warning" in json.loads(e.value.response.body)["error"]

    async def warned() -> Any:
        return (await gpu_kernel(jp_fetch, kid))["warning"]

    warning = await wait_for(warned, 20, "the cull warning")
    resp = await keep(jp_fetch, rid)
    body = json.loads(resp.body)
    assert body["kept"] is True and body["message"].startswith("Kept: its idle clock started")
    rec = await gpu_kernel(jp_fetch, kid)
    assert rec["warning"] is None and rec["state"] == "running"

    # Past the moment it was to be culled at, it still holds its GPU.
    while time.time() < float(warning["cull_at"]) + 1.5:
        await asyncio.sleep(0.1)
    assert gateway.request(rid)["state"] == "admitted"
    assert kid in gpu_app.kernel_manager

    # Idle on, it is warned again; the earlier warning cannot be answered twice.
    again = await wait_for(warned, 20, "the second cull warning")
    assert again["t"] != warning["t"]
    await keep(jp_fetch, rid)
    with pytest.raises(HTTPClientError) as e:
        await keep(jp_fetch, rid)
    assert e.value.code == 409


async def test_keep_of_an_unknown_request_is_a_404_sentence(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]]
) -> None:
    with pytest.raises(HTTPClientError) as e:
        await keep(jp_fetch, "r-nope")
    assert e.value.code == 404
    assert json.loads(e.value.response.body) == {
        "error": "no GPU kernel of this server holds request r-nope",
        "field": "request_id",
    }


async def test_jobs_carry_the_paths_jupyterlab_opens(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], jp_root_dir: Any
) -> None:
    (jp_root_dir / "work").mkdir()
    (jp_root_dir / "work" / "train.py").write_text("print('trained')\n")
    resp = await jp_fetch(
        "gpuaas",
        "sidebar",
        "jobs",
        method="POST",
        body=json.dumps({"kind": "script", "path": "work/train.py", "gpus": 1}),
    )
    job = json.loads(resp.body)
    assert resp.code == 201
    assert job["source_path"] == "work/train.py"
    assert job["log_path"] == f"work/gpu-jobs/{job['id']}/output.log"
    assert job["output_path"] is None  # a script has no executed notebook

    async def done() -> Any:
        got = json.loads((await jp_fetch("gpuaas", "sidebar", "jobs", job["id"])).body)
        return got if got["state"] in ("succeeded", "failed") else None

    ended = await wait_for(done, 60, "the job")
    assert ended["state"] == "succeeded", ended
    listed = json.loads((await jp_fetch("gpuaas", "sidebar", "jobs")).body)
    assert [j["id"] for j in listed] == [job["id"]]

    # A refused submit: the server's sentence and the field, never a 500.
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch(
            "gpuaas",
            "sidebar",
            "jobs",
            method="POST",
            body=json.dumps({"kind": "script", "path": "work/train.py", "gpus": 0}),
        )
    assert e.value.code == 400
    assert json.loads(e.value.response.body)["field"] == "gpus"
