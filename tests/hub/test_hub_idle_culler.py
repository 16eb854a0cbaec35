"""The real jupyterhub-idle-culler and the gateway agree on a busy GPU kernel.

A hub of its own (hubutil.Hub, with the servers reporting their activity to the Hub every
second, as `JUPYTERHUB_ACTIVITY_INTERVAL` allows) and jupyterhub-idle-culler from PyPI,
run standalone against its API as an admin would (`--timeout=20 --cull-every=2`).

- alice's server has nothing to do: the culler stops it after 20 s (the culler works);
- carol's server runs a GPU kernel (tenant nlp: the gateway culls its GPU kernels idle
  for 10 s) that computes for longer than that, iopub silent: the gateway hears it busy,
  and the server's reports keep the Hub's `last_activity` moving, so the culler keeps it;
- once the computation ends, the gateway warns and culls the idle GPU kernel (its quota
  parked), before the culler's longer timeout stops the server.

Nothing here goes through carol's server while the culler watches: a request through
the proxy would be activity of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import hubutil
import pytest
import requests
from helpers import stop
from hubutil import Hub, execute_until_busy

pytestmark = pytest.mark.slow

CULLER_TIMEOUT = 20
COMPUTE = 45  # seconds the GPU kernel's cell computes: longer than the culler's timeout


@pytest.fixture(scope="module")
def culled_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    pytest.importorskip("jupyterhub_idle_culler")
    # The session hub's quotas, plus a warning 5 s before the gateway culls.
    quotas = hubutil.QUOTAS.replace(
        "  reservation_ttl: 0\n", "  reservation_ttl: 0\n  cull_warning: 5\n"
    )
    assert quotas != hubutil.QUOTAS
    hub = Hub(
        tmp_path_factory.mktemp("culled-hub"),
        extra_config='c.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] = "1"\n',
        quotas=quotas,
    )
    with hub.running():
        yield hub


@pytest.fixture
def culler(culled_hub: Hub) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "JUPYTERHUB_API_TOKEN": culled_hub.token}
    log = open(culled_hub.root / "idle-culler.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--url={culled_hub.api}",
            f"--timeout={CULLER_TIMEOUT}",
            "--cull-every=2",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        stop(proc, 10)
        log.close()


def _kernel_request(hub: Hub) -> dict[str, Any] | None:
    return next((r for r in hub.requests_of("carol") if r["kind"] == "kernel"), None)


def test_a_computing_gpu_kernel_keeps_its_server_and_the_gateway_culls_it_once_idle(
    culled_hub: Hub, culler: subprocess.Popen[bytes]
) -> None:
    from jupyter_gpuaas.hub.demo import install_kernelspec

    hub = culled_hub
    install_kernelspec(hub.root / "quotas.yaml")  # "python3-gpu": 1 a100, in this venv
    for user, tenant in (("carol", "nlp"), ("alice", "vision")):  # CPU servers
        assert hub.spawn(user, {"tenant": tenant, "gpus": 0}).status_code in (201, 202)
    hub.wait_ready("carol", 120)
    token = hub.environ("carol")["JUPYTERHUB_API_TOKEN"]
    resp = requests.post(
        f"{hub.url}/user/carol/api/kernels",
        headers={"Authorization": f"token {token}"},
        json={"name": "python3-gpu"},
        timeout=60,
    )
    assert resp.status_code == 201, resp.text
    kid = resp.json()["id"]
    hub.wait_for(
        lambda: (_kernel_request(hub) or {}).get("state") == "admitted", 60, "the GPU kernel"
    )
    ws_url = f"ws://127.0.0.1:{hub.port}/user/carol/api/kernels/{kid}/channels"
    # A cell that computes COMPUTE seconds with iopub silent, running once it is busy.
    code = f"import time; time.sleep({COMPUTE})"
    asyncio.run(execute_until_busy(ws_url, token, code, "carol", 120))

    # The culler stops alice's idle server (spawned before carol's computation began)...
    hub.wait_for(lambda: hub.server("alice") is None, 3 * CULLER_TIMEOUT, "alice culled")
    # ...and keeps carol's, whose GPU kernel has computed since, iopub silent; the gateway
    # hears it busy and keeps it too.
    assert hub.server("carol") is not None
    request = _kernel_request(hub)
    assert request is not None and request["state"] == "admitted"
    assert request["grant"]["busy"] is True

    # The computation ends: the gateway culls the idle GPU kernel first (its quota parked
    # for a quick relaunch) while carol's server still runs.
    hub.wait_for(
        lambda: (_kernel_request(hub) or {}).get("state") == "parked",
        COMPUTE + 60,
        "the gateway's cull of the idle GPU kernel",
    )
    assert hub.server("carol") is not None
    warned = hub.log(200_000)
    # The server's own log is the spawner's output, in the Hub's log: the warning the
    # notebook's user is shown.
    assert "is idle on its GPUs and will be shut down" in warned
    # Then, idle as a whole, the server is the culler's.
    hub.wait_for(lambda: hub.server("carol") is None, 3 * CULLER_TIMEOUT, "carol culled")
