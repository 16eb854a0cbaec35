"""A Hub down for more than three lease TTLs, against real processes: a REAL JupyterHub
(its own, `cleanup_servers = False`), a single-user server holding a GPU, and the gateway
run APART from the Hub, as in production: an external service (`url` + `api_token`, no
`command`) started with the environment a managed service would get.

While the Hub is down the server renews its own lease with its own token, which the
gateway identified before the outage (gateway/hubauth.py): the grant is still held after
three TTLs and the server's request still admitted, and a token the gateway never saw is
answered 503 "the Hub is unreachable". When the Hub is back, it and the gateway agree:
the same server runs on the same request, and stopping it gives the GPU back.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from gwutil import launch_gateway
from helpers import free_port, stop
from hubutil import QUOTAS, Hub, need_proxy

pytestmark = pytest.mark.slow

LIVE = ("queued", "admitted", "parked")
TTL = 5.0  # the gateway's --lease-ttl; servers heartbeat every second (hubutil)

EXTRA = """
c.JupyterHub.cleanup_servers = False
c.JupyterHub.hub_port = {hub_port}  # the gateway asks the Hub here, across restarts
# The gateway is not the Hub's to start or stop: an external service.
for service in c.JupyterHub.services:
    if service["name"] == "gpuaas":
        del service["command"]
        service["oauth_redirect_uri"] = "/services/gpuaas/oauth_callback"
"""


def start_gateway(hub: Hub, hub_port: int) -> subprocess.Popen[bytes]:
    """`jupyter-gpuaas gateway` with what the Hub gives a managed service, in its own
    session: stopping the Hub (its process group) leaves it running."""
    state = hub.root / "state"
    state.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        JUPYTERHUB_API_URL=f"http://127.0.0.1:{hub_port}/hub/api",
        JUPYTERHUB_API_TOKEN=hub.hub_token,
        JUPYTERHUB_SERVICE_NAME="gpuaas",
        JUPYTERHUB_SERVICE_PREFIX="/services/gpuaas/",
        JUPYTERHUB_CLIENT_ID="service-gpuaas",
        JUPYTERHUB_OAUTH_CALLBACK_URL="/services/gpuaas/oauth_callback",
        PYTHONUNBUFFERED="1",
    )
    # Not waited for here: the Hub's running() waits for it through the proxy.
    return launch_gateway(
        hub.root,
        f"sqlite:///{state / 'gpuaas.sqlite'}",
        f"--cookie-secret-file={state / 'gpuaas_cookie_secret'}",
        f"--lease-ttl={TTL}",
        # Ask the Hub about each token every second, so the outage is felt at once.
        "--GatewayApp.hub_auth_cache_max_age=1",
        port=hub.gateway_port,
        quotas=QUOTAS,
        tokens=False,
        devices="simulated:a100=1x4",
        command=(sys.executable, "-m", "jupyter_gpuaas.cli", "gateway"),
        env=env,
        log=hub.root / "gateway.log",
        wait=False,
        new_session=True,
    ).proc


@pytest.fixture
def apart(tmp_path: Path) -> Iterator[tuple[Hub, subprocess.Popen[bytes]]]:
    need_proxy()
    hub_port = free_port()
    hub = Hub(tmp_path, EXTRA.format(hub_port=hub_port))
    gateway = start_gateway(hub, hub_port)
    try:
        # running() waits for the gateway to answer too; cleanup_servers is off, so it
        # kills the servers named to remember_pid.
        with hub.running():
            yield hub, gateway
    finally:
        stop(gateway, 10)


def live(hub: Hub, user: str) -> list[tuple[str, str]]:
    return [(r["id"], r["state"]) for r in hub.requests_of(user) if r["state"] in LIVE]


def grant(hub: Hub, rid: str) -> dict[str, Any]:
    (req,) = [r for r in hub.requests_of("alice") if r["id"] == rid]
    assert req["state"] == "admitted", req
    return req["grant"]  # type: ignore[no-any-return]


def test_servers_keep_their_gpus_through_a_hub_outage(apart: Any) -> None:
    hub, gateway = apart
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("alice")
    pid = hub.pid("alice")
    hub.remember_pid(pid)
    (req,) = [r for r in hub.requests_of("alice") if r["state"] == "admitted"]
    rid, devices = req["id"], req["grant"]["devices"]
    # The server has renewed its lease itself (its token is known to the gateway).
    first = grant(hub, rid)["lease_expires"]
    hub.wait_for(lambda: grant(hub, rid)["lease_expires"] > first + 1, 20, "a renewal")

    hub.stop()  # SIGTERM to the Hub (and its proxy); alice's server and the gateway stay
    down = time.time()
    os.kill(pid, 0)
    assert gateway.poll() is None
    unknown = requests.get(
        f"{hub.gateway}/me", headers={"Authorization": f"token {secrets.token_hex(16)}"},
        timeout=10,
    )  # fmt: skip
    assert unknown.status_code == 503, unknown.text
    assert unknown.json()["error"].startswith("the Hub is unreachable")
    assert unknown.headers["Retry-After"].isdigit()

    # More than three TTLs later, the lease has kept being renewed: the server's own
    # heartbeats, since nobody in the Hub is left to send one.
    hub.wait_for(
        lambda: time.time() > down + 3 * TTL and grant(hub, rid)["lease_expires"] > down + 3 * TTL,
        6 * TTL,
        "the lease to be renewed for three TTLs with the Hub down",
    )
    assert grant(hub, rid)["devices"] == devices
    assert live(hub, "bob") == live(hub, "carol") == []  # nobody else got alice's GPU

    # The Hub comes back: it finds the same server on the same request, still admitted.
    hub.start()
    hub.wait_ready("alice")
    assert hub.pid("alice") == pid
    assert live(hub, "alice") == [(rid, "admitted")]
    after = grant(hub, rid)["lease_expires"]
    hub.wait_for(lambda: grant(hub, rid)["lease_expires"] > after + 1, 20, "a renewal after")
    # And they agree on the end: stopping the server through the Hub frees its GPU.
    hub.stop_server("alice")
    hub.wait_stopped("alice")
    hub.wait_for(lambda: live(hub, "alice") == [], 20, "the release of alice's GPU")
