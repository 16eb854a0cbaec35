"""Faults of the Hub around the gateway, against real processes: a REAL JupyterHub (its own
hub, `cleanup_servers = False`, hubutil.module_hub), its managed gateway, and single-user
servers.

- A Hub restarted while a spawn waits in the queue: the spawn resumes with the same
  request (its place in the queue kept) and completes when GPUs free (hub/resume.py).
- The gateway killed with SIGKILL while a spawn waits: the Hub restarts its managed
  service, the spawn keeps waiting on the same request and completes, and no device is
  granted twice.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from hubutil import Hub, module_hub

pytestmark = pytest.mark.slow

EXTRA = """
c.JupyterHub.cleanup_servers = False
# A waiting spawn re-reads its request every second, so it does while the gateway is down.
c.QueuedSpawnerMixin.refresh_interval = 1.0
"""


# cleanup_servers is off: running() kills the servers named to remember_pid.
own_hub = module_hub(EXTRA)


def live(hub: Hub, user: str) -> list[dict[str, Any]]:
    return [r for r in hub.requests_of(user) if r["state"] in ("queued", "admitted")]


def test_a_queued_spawn_survives_a_hub_restart(own_hub: Hub) -> None:
    hub = own_hub
    # vision may hold 3: alice holds them, bob's spawn waits in the queue.
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    hub.remember_pid(hub.pid("alice"))
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code == 202
    (queued,) = hub.wait_for(lambda: live(hub, "bob"), 20, "bob's request to be queued")
    assert queued["state"] == "queued"
    rid = queued["id"]

    # The Hub (and its managed gateway) goes away and comes back.
    alice_pid = hub.pid("alice")
    hub.stop()
    os.kill(alice_pid, 0)  # alice's server outlives the Hub
    hub.start()

    # bob's spawn is pending again by itself, on the same request: nothing was cancelled
    # or submitted anew, so bob kept his place.
    def pending_again() -> Any:
        s = hub.server("bob")
        return s if s and s.get("pending") == "spawn" else None

    hub.wait_for(pending_again, 60, "bob's queued spawn to resume after the restart")
    assert [r["id"] for r in live(hub, "bob")] == [rid]
    assert [r["id"] for r in hub.requests_of("bob")] == [rid]

    # alice stops: bob's spawn is admitted on that request and his server starts.
    hub.stop_server("alice")
    hub.wait_stopped("alice")
    hub.wait_ready("bob", timeout=90)
    hub.remember_pid(hub.pid("bob"))
    assert [(r["id"], r["state"]) for r in live(hub, "bob")] == [(rid, "admitted")]
    hub.stop_server("bob")
    hub.wait_stopped("bob")
    assert live(hub, "bob") == []


def test_a_queued_spawn_survives_kill_9_of_the_gateway(own_hub: Hub) -> None:
    hub = own_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    hub.remember_pid(hub.pid("alice"))
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code == 202
    (queued,) = hub.wait_for(lambda: live(hub, "bob"), 20, "bob's request to be queued")
    rid = queued["id"]

    old = hub.gateway_pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    # JupyterHub restarts a managed service that dies; the store brings the queue back.
    hub.wait_for(lambda: hub.gateway_pid() not in (None, old), 60, "a new gateway process")
    hub.wait_for(lambda: _answers(hub), 60, "the restarted gateway to answer")
    assert [r["id"] for r in live(hub, "bob")] == [rid]
    server = hub.server("bob")
    assert server is not None and server.get("pending") == "spawn"  # still waiting

    hub.stop_server("alice")
    hub.wait_stopped("alice")
    hub.wait_ready("bob", timeout=90)
    hub.remember_pid(hub.pid("bob"))
    assert [(r["id"], r["state"]) for r in live(hub, "bob")] == [(rid, "admitted")]
    # No device is held by two requests.
    held = [
        (r["grant"]["node"], d)
        for u in ("alice", "bob", "carol")
        for r in live(hub, u)
        if r["state"] == "admitted"
        for d in r["grant"]["devices"]
    ]
    assert len(held) == len(set(held)) == 1


def _answers(hub: Hub) -> bool:
    try:
        hub.requests_of("bob")
        return True
    except Exception:
        return False
