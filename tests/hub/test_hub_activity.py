"""A GPU server's idleness is its own verdict (server/idle.py), in a real JupyterHub.

The server's extension heartbeats the server's own gateway request with busy or idle
from its kernels; the queued spawner in the Hub only renews a lease nobody renewed, so the
Hub's HTTP activity never speaks over the server. The kernel is driven as JupyterLab
drives it: the REST API and the kernel's websocket, through the proxy, with the server's
own token (read from its environment).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
import requests
from hubutil import Hub, execute_until_busy

pytestmark = pytest.mark.slow


def _server_request(hub: Hub, rid: str) -> dict[str, Any]:
    return next(r for r in hub.requests_of("alice") if r["id"] == rid)


def _last_activity(hub: Hub, token: str) -> datetime:
    resp = requests.get(
        f"{hub.url}/user/alice/api/status", headers={"Authorization": f"token {token}"}, timeout=10
    )
    resp.raise_for_status()
    return datetime.fromisoformat(resp.json()["last_activity"].replace("Z", "+00:00"))


def test_the_server_reports_its_own_idleness_and_busyness(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("alice")
    env = hub.environ("alice")
    rid, token = env["GPUAAS_REQUEST_ID"], env["JUPYTERHUB_API_TOKEN"]
    busy = lambda: (_server_request(hub, rid).get("grant") or {}).get("busy")  # noqa: E731
    # No kernel: the server says idle (the Hub's spawner says nothing over it).
    hub.wait_for(lambda: busy() is False, 20, "the server's idle heartbeat")

    headers = {"Authorization": f"token {token}"}
    resp = requests.post(
        f"{hub.url}/user/alice/api/kernels", headers=headers, json={"name": "python3"}, timeout=30
    )
    assert resp.status_code == 201, resp.text
    kid = resp.json()["id"]
    hub.wait_for(lambda: busy() is False, 20, "idle after the kernel started")
    ws_url = f"ws://127.0.0.1:{hub.port}/user/alice/api/kernels/{kid}/channels"
    asyncio.run(execute_until_busy(ws_url, token, "import time; time.sleep(60)"))
    hub.wait_for(busy, 10, "the server's busy heartbeat while its kernel computes")
    # What jupyterhub-singleuser reports to the Hub moves while the kernel's iopub is
    # silent (jupyter_server alone saw only the execution's start).
    before = _last_activity(hub, token)
    hub.wait_for(lambda: _last_activity(hub, token) > before, 10, "last_activity to move")
    assert busy() is True
    # Interrupted: nothing computes any more, and the server says so.
    resp = requests.post(
        f"{hub.url}/user/alice/api/kernels/{kid}/interrupt", headers=headers, timeout=30
    )
    assert resp.status_code == 204, resp.text
    hub.wait_for(lambda: busy() is False, 30, "idle again once the computation stopped")
