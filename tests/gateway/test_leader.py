"""Two gateways, one leader (leader.py): real PostgreSQL, two real gateway processes.

One leads, the other is a standby that answers reads from the store and refuses changes
with 503 and Retry-After naming the leader. The leader is killed (`kill -9`) under a
stream of submissions sent to both, as a Service would: the standby takes over within
15 s, restores from the store, and nothing answered 201 is lost, no device is bound twice,
and the SSE clients of the new leader hear its decisions.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gwutil import (
    TOKENS,
    GatewayProcess,
    assert_memory_is_store,
    call,
    fresh_pg_database,
    store_rows,
)
from test_store_faults import Events, Ledger, wait_until

pytestmark = pytest.mark.slow

INTERVAL = "--leader-check-interval=0.5"


def health(url: str) -> dict[str, Any]:
    status, body, _ = call(url, "GET", "api/health", who=None, timeout=3)
    return body if status == 200 and isinstance(body, dict) else {}


def test_sqlite_gateway_is_always_the_leader(
    spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = spawn_gateway(f"sqlite:///{tmp_path / 'one.sqlite'}")
    assert health(gw.url) == {"status": "ok", "store": "ok", "leader": True}


def test_leader_election_on_with_sqlite_is_refused(tmp_path: Path) -> None:
    import subprocess

    from gwutil import free_port, gateway_argv

    argv = gateway_argv(tmp_path, f"sqlite:///{tmp_path / 'x.sqlite'}", free_port())
    r = subprocess.run([*argv, "--leader-election=on"], capture_output=True, timeout=60)
    assert r.returncode == 2
    assert b"needs a PostgreSQL store" in r.stderr


class ForwardLedger(Ledger):
    """A 502 (a standby forwarded it, the leader died before answering) is an unknown
    outcome, like a connection cut: it may be stored, so it is not counted as refused."""

    def record(self, status: int, data: Any, headers: dict[str, str], name: str = "") -> None:
        super().record(status, data, headers, "" if status == 502 else name)


@pytest.mark.parametrize("forward", [False, True], ids=["refuse", "forward"])
def test_standby_reads_refuses_writes_and_takes_over_after_kill_9(
    spawn_gateway: Callable[..., GatewayProcess], postgres_url: str, forward: bool
) -> None:
    db_url = fresh_pg_database(postgres_url)
    a = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600")
    b = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600", f"--GatewayApp.forward_writes={forward}")
    assert health(a.url)["leader"] is True
    hb = health(b.url)
    assert hb["leader"] is False and hb["leader_url"] == a.url, hb

    # The standby answers reads from the store: what the leader admitted, it lists.
    status, first, _ = call(
        a.url, "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1}
    )
    assert status == 201, first
    wait_until(
        lambda: any(r["id"] == first["id"] for r in call(b.url, "GET", "api/requests")[1]),
        10,
        "the standby lists the leader's request",
    )
    status, seen, _ = call(b.url, "GET", f"api/requests/{first['id']}")
    assert status == 200 and seen["state"] == "admitted", seen

    def holders() -> list[str]:
        status, devices, _ = call(b.url, "GET", "api/devices", who="root")
        assert status == 200, devices
        return [d["holder"]["id"] for d in devices["devices"] if d["holder"]]

    # Its mirror of the core (devices, positions) is at most one check interval old.
    wait_until(lambda: holders() == [first["id"]], 10, "the standby's mirror shows the holder")

    # ... and (not forwarding) refuses every change, with a sentence naming the leader.
    refusals = (
        []
        if forward
        else [
            call(b.url, "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1}),
            call(b.url, "DELETE", f"api/requests/{first['id']}"),
            call(b.url, "POST", f"api/requests/{first['id']}/heartbeat", {"busy": True}),
            call(b.url, "PUT", "api/tenants/vision", {"quota": {"a100": 3}}, who="root"),
        ]
    )
    for status, body, headers in refusals:
        assert status == 503, (status, body)
        assert "standby" in body["error"] and a.url in body["error"], body
        assert int(headers["Retry-After"]) >= 1
    assert store_rows(db_url)[first["id"]].state == "admitted"  # the DELETE changed nothing

    # A stream of submissions and cancels, to either gateway as a Service would send them.
    events_b = Events(b.url)
    ledger = ForwardLedger()
    stop = threading.Event()
    urls = itertools.cycle([a.url, b.url])
    lock = threading.Lock()

    def load(who: str, tenant: str) -> None:
        mine: list[str] = []
        while not stop.is_set():
            with lock:
                url = next(urls)
            if len(mine) > 2:
                rid = mine.pop(0)
                status, data, headers = call(url, "DELETE", f"api/requests/{rid}", who=who)
                ledger.record(status, data, headers)
                if status in (0, 503):
                    mine.append(rid)
            else:
                status, data = ledger.submit(url, who, {"tenant": tenant, "kind": "job", "gpus": 1})
                if status == 201:
                    mine.append(data["id"])
            time.sleep(0.01)

    workers = [
        threading.Thread(target=load, args=(who, tenant))
        for who, tenant in (("alice", "vision"), ("bob", "nlp"), ("carol", "vision"))
    ]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: ledger.statuses.get(201, 0) >= 20, 30, "201s from the leader")
        # The standby's stream relays the leader's decisions from the store's log.
        wait_until(
            lambda: any(e.get("id") in ledger.accepted for e in events_b.events),
            10,
            "the standby's SSE clients hear the leader's decisions",
        )
        relayed = len(events_b.events)
        killed = time.monotonic()
        a.kill()
        wait_until(lambda: health(b.url).get("leader") is True, 15, "the standby takes over")
        takeover = time.monotonic() - killed
        ok = ledger.statuses.get(201, 0)
        wait_until(lambda: ledger.statuses.get(201, 0) >= ok + 20, 30, "201s from the new leader")
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    print(f"takeover after kill -9: {takeover:.2f} s; answers: {ledger.statuses}")

    ledger.check_answers()
    assert set(ledger.statuses) <= {0, 200, 201, 409, 502, 503}, ledger.statuses
    # Every 201 (from either gateway) is stored, nothing refused is, no device twice.
    assert_memory_is_store(b.url, db_url, ledger.accepted, ledger.refused)
    # ... and once it leads, its own decisions, on the same stream.
    status, mine, _ = call(
        b.url, "POST", "api/requests", {"tenant": "nlp", "kind": "job", "gpus": 1}, "bob"
    )
    assert status == 201, mine
    ledger.accepted.add(mine["id"])
    wait_until(
        lambda: any(e.get("id") == mine["id"] for e in events_b.events[relayed:]),
        10,
        "the new leader's SSE clients hear its decisions",
    )
    assert all("request" in e for e in events_b.events if e.get("id")), "an event lacks its request"
    events_b.assert_all_committed(db_url)
    assert health(b.url)["leader"] is True


def test_leader_that_loses_its_lock_stops_deciding_and_standbys_forward(
    spawn_gateway: Callable[..., GatewayProcess], postgres_url: str
) -> None:
    """A leader whose lock connection dies (a partition, an admin's pg_terminate_backend)
    steps down at once: the other takes over, and the old one becomes its standby."""
    import psycopg
    from sqlalchemy.engine import make_url

    db_url = fresh_pg_database(postgres_url)
    a = spawn_gateway(db_url, INTERVAL)
    b = spawn_gateway(db_url, INTERVAL)
    assert health(a.url)["leader"] is True and health(b.url)["leader"] is False
    status, first, _ = call(
        a.url, "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1}
    )
    assert status == 201, first
    url = make_url(db_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database, autocommit=True
    ) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (a.url,),
        ).fetchall()
    # Its lock connection and its store connections (all named after it: leader.py).
    assert ended and set(ended) == {(True,)}, ended
    wait_until(lambda: health(b.url).get("leader") is True, 15, "the standby takes over")
    wait_until(lambda: health(a.url).get("leader") is False, 15, "the old leader steps down")
    wait_until(lambda: health(a.url).get("leader_url") == b.url, 15, "it names the new leader")
    # The old leader, a standby now, forwards changes to the new one and relays its answers.
    job = {"tenant": "vision", "kind": "job", "gpus": 1}
    status, sent, headers = call(a.url, "POST", "api/requests", {**job, "name": "via-a"})
    assert status == 201 and headers["Location"].endswith(sent["id"]), sent
    assert store_rows(db_url)[sent["id"]].name == "via-a"
    status, bad, _ = call(a.url, "POST", "api/requests", {**job, "gpus": 0})
    assert status == 400 and bad["field"] == "gpus", bad  # the leader's own answer
    status, gone, _ = call(a.url, "DELETE", f"api/requests/{sent['id']}")
    assert status == 200 and gone["state"] in ("cancelled", "finished"), gone
    # Never twice: a forwarded change that reaches a standby is refused, not sent on.
    req = urllib.request.Request(
        a.url + "api/requests", data=json.dumps(job).encode(), method="POST"
    )
    req.add_header("Authorization", f"token {TOKENS['alice']}")
    req.add_header("X-Gpuaas-Forwarded", "1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"]
    assert b.url in json.loads(refused.value.read())["error"]
    # Both gateways see the one request the old leader admitted, held by it alone.
    status, seen, _ = call(b.url, "GET", f"api/requests/{first['id']}")
    assert status == 200 and seen["state"] == "admitted", seen
    assert_memory_is_store(b.url, db_url, {first["id"], sent["id"]})


@pytest.mark.asyncio
async def test_port_0_leader_advertises_its_bound_port(
    make_gateway: Callable[..., Any], postgres_url: str
) -> None:
    db_url = fresh_pg_database(postgres_url)
    a = await make_gateway(db_url, leader_check_interval=0.2)
    b = await make_gateway(db_url, leader_check_interval=0.2)
    assert (await a.raw("GET", "api/health", who=None))[1]["leader"] is True
    status, body = await b.raw("GET", "api/health", who=None)
    assert status == 200 and body["leader"] is False and body["leader_url"] == a.url, body
