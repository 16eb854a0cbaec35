"""Restart and `kill -9`: a real gateway subprocess, killed with SIGKILL under load.

After a restart on the same database: every request answered 201 exists, no device is held
by two admitted requests, and the restarted core's view (api/devices holders) matches the
rows of the store.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gwutil import TOKENS

from jupyter_gpuaas.client import GatewayError, SyncGatewayClient
from jupyter_gpuaas.gateway.store import Store

pytestmark = pytest.mark.slow


def client(url: str, who: str) -> SyncGatewayClient:
    return SyncGatewayClient(url, TOKENS[who], timeout=5)


def check_consistent(url: str, db_url: str, accepted: set[str]) -> dict[str, int]:
    root = client(url, "root")
    everything = {r["id"]: r for r in root.list(limit=10000)}
    missing = accepted - set(everything)
    assert not missing, f"{len(missing)} requests answered 201 are gone: {sorted(missing)[:5]}"
    admitted = [r for r in everything.values() if r["state"] == "admitted"]
    seen: dict[tuple[str, int], str] = {}
    for r in admitted:
        for d in r["grant"]["devices"]:
            key = (r["grant"]["node"], d)
            assert key not in seen, f"device {key} held by {seen[key]} and {r['id']}"
            seen[key] = r["id"]
    # the core's view (device holders) is the store's
    devices = root.devices()
    held = {(d["node"], d["index"]): d["holder"]["id"] for d in devices["devices"] if d["holder"]}
    assert held == seen
    store = Store.open(db_url)
    try:
        rows = {r.id: r for r in store.query(limit=100000)}
    finally:
        store.close()
    assert set(rows) == set(everything)
    for rid, r in everything.items():
        assert rows[rid].state == r["state"]
    states: dict[str, int] = {}
    for r in everything.values():
        states[r["state"]] = states.get(r["state"], 0) + 1
    return states


def load(
    url: str,
    who: str,
    tenant: str,
    stop: threading.Event,
    accepted: set[str],
    stats: dict[str, int],
    lock: threading.Lock,
) -> None:
    c = client(url, who)
    rng = random.Random(hash(who))
    mine: list[str] = []
    while not stop.is_set():
        try:
            if mine and rng.random() < 0.4:
                rid = mine.pop(rng.randrange(len(mine)))
                try:
                    c.cancel(rid)
                except GatewayError as e:
                    if e.status != 409:
                        raise
            else:
                r = c.submit(tenant, rng.choice(["kernel", "job"]), rng.choice([1, 1, 2]))
                with lock:
                    accepted.add(r["id"])
                    stats["201"] += 1
                mine.append(r["id"])
        except GatewayError as e:
            if e.status == 0:  # the gateway died under us: stop this worker
                return
            raise


def test_kill_9_under_load_loses_nothing(
    spawn_gateway: Any, sqlite_url: str, tmp_path: Path
) -> None:
    accepted: set[str] = set()
    stats = {"201": 0}
    lock = threading.Lock()
    # No per-user queue limit: three workers queue faster than one user may (429), and a
    # worker that stops on a 429 would leave the gateway idle when it is killed.
    flags = ("--lease-ttl=60", "--GatewayApp.max_queued_per_user=0")
    proc = spawn_gateway(sqlite_url, *flags)
    for round_ in range(2):
        stop = threading.Event()
        workers = [
            threading.Thread(target=load, args=(proc.url, who, tenant, stop, accepted, stats, lock))
            for who, tenant in (("alice", "vision"), ("bob", "nlp"), ("carol", "vision"))
        ]
        t0 = time.monotonic()
        for w in workers:
            w.start()
        time.sleep(1.5 + round_ * 0.37)  # kill at a different instant each round
        proc.kill()  # SIGKILL, mid-load
        elapsed = time.monotonic() - t0
        stop.set()
        for w in workers:
            w.join(10)
        print(f"round {round_}: {stats['201']} accepted so far, {elapsed:.1f}s of load")
        proc = spawn_gateway(sqlite_url, *flags, port=int(proc.url.split(":")[2][:-1]))
        states = check_consistent(proc.url, sqlite_url, accepted)
        print(f"after restart {round_}: {states}")
    assert stats["201"] > 20


def test_restart_keeps_queue_and_grants(spawn_gateway: Any, db_url: str) -> None:
    proc = spawn_gateway(db_url)
    alice, bob = client(proc.url, "alice"), client(proc.url, "bob")
    held = alice.submit("vision", "kernel", 4, name="big")
    waiting = bob.submit("nlp", "job", 2)
    assert (held["state"], waiting["state"]) == ("admitted", "queued")
    proc.stop()  # SIGTERM: a clean stop
    proc = spawn_gateway(db_url)
    alice, bob = client(proc.url, "alice"), client(proc.url, "bob")
    again = alice.get(held["id"])
    assert again["state"] == "admitted" and again["grant"]["devices"] == held["grant"]["devices"]
    assert again["name"] == "big"
    # holders could not heartbeat while the gateway was down: their lease was renewed
    assert again["grant"]["lease_expires"] >= held["grant"]["lease_expires"]
    queued = bob.get(waiting["id"])
    assert queued["state"] == "queued" and queued["position"]["overall"] == 1
    alice.cancel(held["id"])
    assert bob.get(waiting["id"])["state"] == "admitted"
    check_consistent(proc.url, db_url, {held["id"], waiting["id"]})
