"""The spawner's per-request user tokens in a REAL JupyterHub (its own hub, hubutil.module_hub):
they expire, are replaced before they do, are revoked on stop, and a Hub restart (with
`cleanup_servers = False`, so the server outlives it) revokes the token the old Hub
minted, since the spawner state carries its id.

Tokens are read through the Hub's REST API (`GET /users/{name}/tokens`), the state
through `GET /users/{name}` (admin:server_state).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import requests
from hubutil import Hub, module_hub

pytestmark = pytest.mark.slow

LIFETIME = 60  # request_token_lifetime: the next token is minted after 30 s

EXTRA = f"""
c.JupyterHub.cleanup_servers = False
c.QueuedSpawnerMixin.request_token_lifetime = {LIFETIME}
c.JupyterHub.load_roles.append(
    {{"name": "token-reader", "scopes": ["read:tokens"], "services": ["tester"]}}
)
"""


# cleanup_servers is off: running() kills the servers named to remember_pid.
own_hub = module_hub(EXTRA)


def gpuaas_tokens(hub: Hub, user: str) -> dict[str, dict[str, Any]]:
    resp = hub.get(f"/users/{user}/tokens")
    resp.raise_for_status()
    return {
        t["id"]: t
        for t in resp.json()["api_tokens"]
        if (t.get("note") or "").startswith("gpuaas request")
    }


def state_token_ids(hub: Hub, user: str) -> list[str]:
    server = hub.server(user)
    assert server is not None
    return [f"a{i}" for i in server["state"]["gpuaas"]["tokens"]]


def seconds_left(token: dict[str, Any]) -> float:
    expires = datetime.datetime.fromisoformat(token["expires_at"].replace("Z", "+00:00"))
    return (expires - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def test_request_tokens_expire_rotate_survive_a_restart_and_die_on_stop(own_hub: Hub) -> None:
    hub = own_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("alice")
    hub.remember_pid(hub.pid("alice"))
    (first,) = gpuaas_tokens(hub, "alice").values()
    assert first["expires_at"] is not None and 0 < seconds_left(first) <= LIFETIME
    assert set(first["scopes"]) >= {"custom:gpuaas:use", "access:services!service=gpuaas"}
    assert state_token_ids(hub, "alice") == [first["id"]]  # the id, not the token

    # Half-way through its life the next token replaces it: one live token at any time.
    def rotated() -> Any:
        tokens = gpuaas_tokens(hub, "alice")
        return tokens if first["id"] not in tokens and len(tokens) == 1 else None

    (second,) = hub.wait_for(rotated, LIFETIME, "the request token to be replaced").values()
    hub.wait_for(lambda: state_token_ids(hub, "alice") == [second["id"]], 10, "state saved")
    rid = next(r["id"] for r in hub.requests_of("alice") if r["state"] == "admitted")

    # The Hub goes away; the server does not (cleanup_servers = False).
    pid = hub.pid("alice")
    hub.stop()
    os.kill(pid, 0)  # still running
    assert hub.proc is not None
    hub.start()

    # The new Hub cannot use the old token: it revokes it by the id in the state, and
    # renews the lease with one of its own.
    def replaced() -> Any:
        tokens = gpuaas_tokens(hub, "alice")
        return tokens if second["id"] not in tokens and len(tokens) == 1 else None

    (third,) = hub.wait_for(replaced, 60, "the restarted Hub to replace the token").values()
    assert seconds_left(second) > 0  # revoked, not merely expired
    assert 0 < seconds_left(third) <= LIFETIME
    assert hub.pid("alice") == pid
    lease = next(r for r in hub.requests_of("alice") if r["id"] == rid)["grant"]["lease_expires"]
    hub.wait_for(
        lambda: (
            next(r for r in hub.requests_of("alice") if r["id"] == rid)["grant"]["lease_expires"]
            > lease
        ),
        20,
        "the restarted Hub to renew the lease",
    )

    # Stopping the server revokes its token at once.
    hub.stop_server("alice")
    hub.wait_stopped("alice")
    assert gpuaas_tokens(hub, "alice") == {}
    assert {r["id"]: r["state"] for r in hub.requests_of("alice")}[rid] == "finished"


def test_a_refused_spawn_leaves_no_token(own_hub: Hub) -> None:
    hub = own_hub
    resp = hub.spawn("alice", {"tenant": "vision", "gpus": 5})  # never fits on one node
    assert resp.status_code == 422, resp.text
    hub.wait_stopped("alice")
    assert gpuaas_tokens(hub, "alice") == {}
    # and nothing authenticates as alice at the gateway with what the Hub keeps
    assert requests.get(f"{hub.gateway}/me", timeout=10).status_code == 401
