"""The production snippets, hub_config/gpuaas_service_snippet.py and gpuaas_kernels.py, run
as-is in a REAL JupyterHub (its own hub, hubutil.Hub), with no GPUAAS_URL anywhere
for the single-user servers.

The hub's base is the demo config (proxy, ports, logins, groups, the queued spawner), but
its gateway service, custom scopes, roles and the servers' gateway URL are thrown away
and replaced by what the snippets define. Then: the managed service starts, a user's
spawn through it is queued behind a full tenant and admitted when it frees, the server's
own client finds the gateway through the Hub's proxy (not the Hub's port), and the
landing page answers a logged-in browser.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hubutil import REPO, Hub
from test_hub_landing import open_landing

pytestmark = pytest.mark.slow

SNIPPETS = REPO / "hub_config"

EXTRA = """
import os
# Forget the demo's service, scopes and roles and its servers' GPUAAS_URL: the snippets
# alone define them.
c.JupyterHub.services = [s for s in c.JupyterHub.services if s["name"] == "tester"]
c.JupyterHub.load_roles = [r for r in c.JupyterHub.load_roles if r["name"] == "tester"]
c.JupyterHub.custom_scopes = {{}}
c.Spawner.environment.pop("GPUAAS_URL", None)
c.Spawner.server_token_scopes = []
del c.QueuedSpawnerMixin["gateway_url"]
# The snippet's production paths, moved into the test's directory.
os.environ["GPUAAS_SERVICE_PORT"] = "{port}"
os.environ["GPUAAS_QUOTAS"] = {quotas!r}
os.environ["GPUAAS_STATE_DIR"] = {state!r}
os.environ["GPUAAS_DEVICES"] = "simulated:a100=1x4"
load_subconfig({snippet!r})
load_subconfig({kernels!r})
"""


@pytest.fixture
def snippet_hub(tmp_path: Path) -> Iterator[Hub]:
    hub = Hub(tmp_path)
    state = tmp_path / "gateway-state"
    state.mkdir()
    hub.extra_config = EXTRA.format(
        port=hub.gateway_port,
        quotas=str(tmp_path / "quotas.yaml"),
        state=str(state),
        snippet=str(SNIPPETS / "gpuaas_service_snippet.py"),
        kernels=str(SNIPPETS / "gpuaas_kernels.py"),
    )
    with hub.running():
        yield hub


def run_in_server_env(env: dict[str, str], code: str) -> Any:
    """Run Python with the single-user server's own environment: its client, its token."""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_snippets_run_in_a_hub(snippet_hub: Hub, browser: Any) -> None:
    hub = snippet_hub
    # The service came up with the snippet's cookie secret file, private.
    secret = Path(hub.root / "gateway-state" / "cookie_secret")
    assert secret.exists() and (secret.stat().st_mode & 0o077) == 0

    # vision may hold 3: alice takes them, bob's spawn is queued behind her.
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code == 202
    events = hub.progress("bob", lambda e: "waiting" in (e.get("message") or "").lower())
    assert events and not any(e.get("failed") for e in events), events
    queued = [r for r in hub.requests_of("bob") if r["state"] == "queued"]
    assert queued, hub.requests_of("bob")

    # alice's server finds the gateway through the proxy, with its own token.
    env = hub.environ("alice")
    assert env["GPUAAS_URL"] == f"{hub.url}/services/gpuaas/"
    mine = run_in_server_env(
        env,
        "import json\nfrom jupyter_gpuaas.client import SyncGatewayClient\n"
        "c = SyncGatewayClient.from_env()\nprint(json.dumps([c.me(), c.list()]))",
    )
    assert mine[0]["name"] == "alice", mine[0]
    assert [r["state"] for r in mine[1] if r["kind"] == "server"] == ["admitted"]

    # alice stops: bob's queued spawn is admitted and completes.
    hub.stop_server("alice")
    hub.wait_stopped("alice")
    hub.wait_ready("bob", timeout=90)
    assert [r["state"] for r in hub.requests_of("bob") if r["state"] == "admitted"]

    # The landing page answers a browser that logged in to the Hub (HubOAuth).
    page = open_landing(browser, hub, "bob", hub.password)
    assert re.search(r"bob", page.inner_text("body"))
    page.context.close()
    hub.stop_server("bob")
    hub.wait_stopped("bob")
    # The gateway agrees: nothing left held.
    assert all(r["state"] != "admitted" for u in ("alice", "bob") for r in hub.requests_of(u))
