"""Queued GPU spawns through a real JupyterHub, proxy and gateway (tests/conftest.py).

The devices are simulated (one node of four a100s); what is real is everything else: the
Hub's REST API and spawn machinery, configurable-http-proxy, the gateway service and its
queue, and the single-user server processes, whose environment is read from /proc.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from hubutil import Hub

pytestmark = pytest.mark.slow


def _grant(hub: Hub, user: str) -> dict:
    live = [r for r in hub.requests_of(user) if r["state"] == "admitted"]
    assert len(live) == 1, live
    return live[0]


def test_free_gpu_spawn_sees_exactly_its_devices(clean_hub: Hub) -> None:
    hub = clean_hub
    resp = hub.spawn("alice", {"tenant": "vision", "flavor": "a100", "gpus": 2})
    assert resp.status_code in (201, 202), resp.text
    hub.wait_ready("alice")
    req = _grant(hub, "alice")
    assert req["tenant"] == "vision" and req["kind"] == "server" and req["gpus"] == 2
    devices = ",".join(str(d) for d in req["grant"]["devices"])
    env = hub.environ("alice")
    assert env["CUDA_VISIBLE_DEVICES"] == devices
    assert env["NVIDIA_VISIBLE_DEVICES"] == devices
    assert len(devices.split(",")) == 2
    assert env["GPUAAS_REQUEST_ID"] == req["id"]
    # The lease is renewed while it runs (heartbeat every second in these tests).
    first = req["grant"]["lease_expires"]
    hub.wait_for(lambda: _grant(hub, "alice")["grant"]["lease_expires"] > first, 10, "a renewal")


def test_second_spawn_queues_then_starts_when_the_first_stops(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    started = time.monotonic()
    resp = hub.spawn("bob", {"tenant": "vision", "gpus": 1})
    assert resp.status_code == 202, resp.text  # pending: queued behind alice
    assert time.monotonic() - started < 15  # the Hub answered; the queue did not block it
    events = hub.progress("bob", lambda e: (e.get("gpuaas") or {}).get("position") == 1)
    queued = events[-1]
    assert queued["gpuaas"]["phase"] == "queued", events
    assert "position 1 of 1" in queued["message"]
    # a100 are free, but vision holds all of its quota (no cohort to borrow from)
    assert "waiting for quota: vision uses all 3 of its a100" in queued["message"]
    (bob_req,) = [r for r in hub.requests_of("bob") if r["state"] == "queued"]
    assert bob_req["position"]["tenant"] == 1

    hub.stop_server("alice")
    hub.wait_ready("bob", timeout=60)
    assert _grant(hub, "bob")["id"] == bob_req["id"]
    assert [r["state"] for r in hub.requests_of("alice")][:1] != ["admitted"]
    assert hub.environ("bob")["CUDA_VISIBLE_DEVICES"] != ""


def test_cancelling_a_pending_spawn_cancels_its_request(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code == 202
    hub.progress("bob", lambda e: (e.get("gpuaas") or {}).get("phase") == "queued")
    (queued,) = [r for r in hub.requests_of("bob") if r["state"] == "queued"]
    resp = hub.stop_server("bob")
    assert resp.status_code in (202, 204), resp.text
    hub.wait_stopped("bob")
    hub.wait_for(
        lambda: (
            {r["id"]: r["state"] for r in hub.requests_of("bob")}.get(queued["id"]) == "cancelled"
        ),
        10,
        "bob's request to be cancelled",
    )
    assert hub.tenant("vision")["usage"][0]["pending_requests"] == 0


def test_zero_gpus_start_at_once_without_the_queue(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    before = len(hub.requests_of("bob"))
    assert hub.spawn("bob", {"gpus": 0}).status_code in (201, 202)
    hub.wait_ready("bob", timeout=30)  # vision's quota is full; bob did not queue
    assert len(hub.requests_of("bob")) == before
    assert hub.environ("bob")["CUDA_VISIBLE_DEVICES"] == ""


def test_never_admissible_request_fails_fast_with_the_reason(clean_hub: Hub) -> None:
    hub = clean_hub
    started = time.monotonic()
    resp = hub.spawn("alice", {"tenant": "vision", "gpus": 5})
    assert time.monotonic() - started < 10
    assert resp.status_code == 422, resp.text
    assert "never be admitted" in resp.json()["message"]
    assert "do not fit on one node" in resp.json()["message"]
    hub.wait_stopped("alice")


def test_foreign_tenant_fails_fast(clean_hub: Hub) -> None:
    hub = clean_hub
    resp = hub.spawn("alice", {"tenant": "nlp", "gpus": 1})
    assert resp.status_code == 403, resp.text
    assert resp.json()["message"].startswith("you are not a member of tenant 'nlp'")
    hub.wait_stopped("alice")
    assert not [r for r in hub.requests_of("alice") if r["tenant"] == "nlp"]


def test_a_dead_server_releases_its_gpus(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("bob")
    req = _grant(hub, "bob")
    os.kill(hub.pid("bob"), signal.SIGKILL)  # the Hub learns of it from poll()
    hub.wait_stopped("bob", timeout=30)
    hub.wait_for(
        lambda: {r["id"]: r["state"] for r in hub.requests_of("bob")}[req["id"]] == "finished",
        10,
        "bob's grant to be released",
    )
    assert hub.tenant("vision")["usage"][0]["admitted"] == 0


def test_idle_server_is_culled_and_resumes_at_once_within_the_ttl(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("carol")
    first = _grant(hub, "carol")
    # nlp culls after 10 idle seconds; the spawner reports idle after 1 s without activity.
    hub.wait_stopped("carol", timeout=30)
    culled = {r["id"]: r for r in hub.requests_of("carol")}[first["id"]]
    assert culled["state"] == "parked", culled
    usage = hub.tenant("nlp")["usage"][0]
    assert usage["parked"] == 1 and usage["admitted"] == 0

    started = time.monotonic()
    assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("carol")
    again = _grant(hub, "carol")
    assert again["id"] != first["id"]
    assert again["admitted_at"] - again["submit_time"] < 0.5  # no wait in the queue
    assert time.monotonic() - started < 30
    assert hub.tenant("nlp")["usage"][0]["parked"] == 0
