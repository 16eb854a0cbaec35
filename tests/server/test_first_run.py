"""A notebook's GPU kernel takes its GPU at its first cell run, not when the notebook opens.

JupyterLab starts the kernel of each notebook it opens, reopens or restores (a page
reload, a new login) through a session (`POST api/sessions`), connects its websocket and
asks for kernel_info and comm_info; none of that is a run. A real jupyter_server
(pytest-jupyter) with the extension and a real gateway subprocess (one node with one a100,
vision's quota 1: conftest.py); the notebook's side speaks JupyterLab's messages on the
kernel's websocket (test_gpu_waiting.py's `Notebook`).

Not marked `@pytest.mark.asyncio`, for the reason given in test_gpu_kernels.py.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from srvutil import GatewayProc, gpu_extension
from test_gpu_kernels import ENV_CODE, gpu_kernel, gpu_kernels, wait_for
from test_gpu_waiting import Notebook, kernel_model, of_type, open_notebook, text_of

from jupyter_gpuaas.words import DEFERRED_KERNEL

pytestmark = pytest.mark.slow


async def open_session(jp_fetch: Any, path: str, kernel: str = "gpu1") -> str:
    """A notebook's session, as JupyterLab starts it when it opens or restores one."""
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel}}
    resp = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    return str(json.loads(resp.body)["kernel"]["id"])


def ask(nb: Notebook, msg_type: str) -> str:
    """A request JupyterLab sends on every (re)connection: not a run."""
    msg = nb.session.msg(msg_type, {})
    msg.update(channel="shell", buffers=[])
    nb.ws.write_message(json.dumps(msg, default=str))
    return str(msg["header"]["msg_id"])


def requests_of(gateway: GatewayProc) -> list[dict[str, Any]]:
    return list(gateway.call("GET", "api/requests?user=alice"))


async def reopen(jp_fetch: Any, jp_ws_fetch: Any, path: str) -> tuple[str, Notebook]:
    """Open a notebook as JupyterLab does: its session, its websocket, its first asks."""
    kid = await open_session(jp_fetch, path)
    nb = await open_notebook(jp_ws_fetch, kid)
    ask(nb, "kernel_info_request")
    ask(nb, "comm_info_request")
    return kid, nb


async def test_reopened_notebooks_ask_for_nothing_until_a_cell_runs(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_ws_fetch: Any,
    gateway: GatewayProc,
) -> None:
    opened = [await reopen(jp_fetch, jp_ws_fetch, f"nb{i}.ipynb") for i in range(3)]
    for kid, nb in opened:
        status = await nb.next(of_type("status"))
        assert status["content"]["execution_state"] == "idle"  # ready to take a cell
        record = await gpu_kernel(jp_fetch, kid)
        assert record["state"] == "deferred"
        assert record["request_id"] is None
        assert record["message"] == DEFERRED_KERNEL
        model = await kernel_model(jp_fetch, kid)
        assert model["reason"] == DEFERRED_KERNEL
    # A heartbeat round sees nothing held and nothing busy: opening is no activity.
    ext = gpu_extension(gpu_app)
    await ext.heartbeat_once()
    assert ext.current_activity() == []
    assert requests_of(gateway) == []

    # The first cell run of one notebook asks for one GPU, is admitted and runs.
    kid, nb = opened[1]
    before = (await kernel_model(jp_fetch, kid))["last_activity"]
    cell = nb.execute(ENV_CODE)
    shown = await nb.next(of_type("display_data", cell))
    assert text_of(shown) != DEFERRED_KERNEL  # what it does now: asking, waiting, running
    out = await nb.next(of_type("stream", cell), 60)
    record = await gpu_kernel(jp_fetch, kid)
    assert record["state"] == "running"
    assert out["content"]["text"].split() == ["0", "0", record["request_id"]]
    reply = await nb.next(lambda m: m["header"]["msg_type"] == "execute_reply", 30)
    assert reply["parent_header"]["msg_id"] == cell
    assert reply["content"]["status"] == "ok"
    # kernel_info asked while it waited is answered once it runs.
    assert any(m["header"]["msg_type"] == "kernel_info_reply" for m in nb.seen + nb.unread)
    held = requests_of(gateway)
    assert [(r["id"], r["state"]) for r in held] == [(record["request_id"], "admitted")]
    assert (await kernel_model(jp_fetch, kid))["last_activity"] > before  # the run is
    # The two other notebooks still hold and ask for nothing.
    for other, _ in (opened[0], opened[2]):
        assert (await gpu_kernel(jp_fetch, other))["state"] == "deferred"
    for _, other_nb in opened:
        other_nb.ws.close()


async def test_a_reload_reconnects_without_asking_and_a_run_after_it_does(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_ws_fetch: Any,
    gateway: GatewayProc,
) -> None:
    kid, nb = await reopen(jp_fetch, jp_ws_fetch, "train.ipynb")
    await nb.next(of_type("status"))
    last = (await kernel_model(jp_fetch, kid))["last_activity"]
    nb.ws.close()  # the page reloads: the same session, a new websocket
    again = await open_session(jp_fetch, "train.ipynb")
    assert again == kid  # JupyterLab finds the notebook's session and keeps its kernel
    nb = await open_notebook(jp_ws_fetch, kid)
    ask(nb, "kernel_info_request")
    await nb.next(of_type("status"))
    model = await kernel_model(jp_fetch, kid)
    assert model["last_activity"] == last
    assert (await gpu_kernel(jp_fetch, kid))["state"] == "deferred"
    assert requests_of(gateway) == []
    cell = nb.execute("print(6 * 7)")
    out = await nb.next(of_type("stream", cell), 60)
    assert out["content"]["text"] == "42\n"
    assert [r["state"] for r in requests_of(gateway)] == ["admitted"]
    nb.ws.close()


async def test_restart_interrupt_and_shutdown_of_a_deferred_kernel_ask_for_nothing(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_ws_fetch: Any,
    gateway: GatewayProc,
) -> None:
    kid, nb = await reopen(jp_fetch, jp_ws_fetch, "idle.ipynb")
    await nb.next(of_type("status"))
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="")
    await jp_fetch("api", "kernels", kid, "interrupt", method="POST", body="")
    assert (await gpu_kernel(jp_fetch, kid))["state"] == "deferred"
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await wait_for(lambda: kid not in gpu_app.kernel_manager, 30, "the deferred kernel shut down")
    # It never asked: nothing at the gateway, and no ended row in the sidebar's history.
    assert requests_of(gateway) == []
    assert [k for k in await gpu_kernels(jp_fetch) if k["kernel_id"] == kid] == []
    nb.ws.close()


async def test_with_the_knob_off_and_for_api_kernels_the_gpu_is_asked_for_at_once(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    gateway: GatewayProc,
) -> None:
    # A program's POST api/kernels asked for a kernel to use now.
    resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu1"}))
    api_kid = str(json.loads(resp.body)["id"])
    api_rec = await wait_for(
        lambda: _with_request(jp_fetch, api_kid), 30, "the API kernel's request"
    )
    await jp_fetch("api", "kernels", api_kid, method="DELETE")
    # An admin who wants the old behaviour: a notebook's kernel asks as it starts.
    gpu_extension(gpu_app).take_gpu_at_first_run = False
    kid = await open_session(jp_fetch, "old.ipynb")
    rec = await wait_for(lambda: _with_request(jp_fetch, kid), 30, "the notebook's request")
    assert rec["state"] in ("queued", "admitted", "running")
    ids = {r["id"] for r in requests_of(gateway)}
    assert {api_rec["request_id"], rec["request_id"]} <= ids


async def _with_request(jp_fetch: Any, kernel_id: str) -> dict[str, Any] | None:
    record = await gpu_kernel(jp_fetch, kernel_id)
    return record if record["request_id"] else None


async def test_a_reload_is_no_activity_for_a_kernel_that_runs(
    gpu_app: Any,
    jp_fetch: Callable[..., Awaitable[Any]],
    jp_ws_fetch: Any,
    gateway: GatewayProc,
) -> None:
    """A reloaded page reconnects and asks kernel_info, comm_info and its notebook's input
    history (JupyterLab's NotebookHistory, at every connection): none of it is work, so
    the idle clock of a kernel idle on its GPU goes on."""
    kid, nb = await reopen(jp_fetch, jp_ws_fetch, "idle-run.ipynb")
    cell = nb.execute("x = 1")
    await nb.next(of_type("execute_reply", cell), 60)
    ext = gpu_extension(gpu_app)
    record = ext.table.get(kid)
    assert record is not None and record.state == "running"
    # Two renewal rounds after the run: the later one judged the kernel after the run's
    # last message, so its verdict (idle) stands until something new happens.
    lease = record.provisioner.lease
    assert lease is not None
    for _ in range(2):
        last = lease.renewed_at
        await wait_for(lambda last=last: lease.renewed_at != last, 30, "a renewal round")
    await wait_for(lambda: record.idle_since is not None, 30, "the kernel judged idle")
    idle_since = record.idle_since
    nb.ws.close()

    nb = await open_notebook(jp_ws_fetch, kid)
    for msg_type in ("kernel_info_request", "comm_info_request"):
        ask(nb, msg_type)
    history = nb.session.msg(
        "history_request", {"output": False, "raw": True, "hist_access_type": "tail", "n": 10}
    )
    history.update(channel="shell", buffers=[])
    nb.ws.write_message(json.dumps(history, default=str))
    hid = history["header"]["msg_id"]
    await nb.next(
        lambda m: of_type("status", hid)(m) and m["content"]["execution_state"] == "idle", 30
    )
    await nb.next(of_type("history_reply", hid), 30)  # kept if it came first
    await ext.heartbeat_once()
    assert record.idle_since == idle_since
    assert record.provisioner.lease is not None and record.provisioner.lease.busy is False
    nb.ws.close()
