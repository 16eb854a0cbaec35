"""A frozen leader is fenced and replaced (issue 40, item 3), and retries are safe (item 4).

Two real gateway processes on one real PostgreSQL database; clients submit through the
standby (which forwards to the leader) with an Idempotency-Key, retrying an answer that
asks them to with the same key. The leader is stopped with SIGSTOP under that load: the
standby takes over within 15 s, no answer is the ambiguous 502, every submission ends
up created exactly once, and the old leader, resumed, writes nothing (it is a standby).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from faultutil import Freezer
from gwutil import GatewayProcess, call, fresh_pg_database, store_rows
from helpers import wait_for

pytestmark = pytest.mark.slow  # a process frozen for seconds, on purpose


def health(url: str) -> dict[str, Any]:
    _, body, _ = call(url, "GET", "api/health", who=None, timeout=3)
    return body if isinstance(body, dict) else {}


def test_frozen_leader_is_fenced_and_replaced(
    spawn: Callable[..., GatewayProcess], freezer: Freezer, postgres_url: str
) -> None:
    db_url = fresh_pg_database(postgres_url)
    a = spawn(db_url, "--lease-ttl=600")
    b = spawn(db_url, "--lease-ttl=600")
    assert health(a.url)["leader"] is True and health(b.url)["leader"] is False

    raw: list[tuple[int, Any]] = []  # every answer any client got
    final: dict[str, tuple[int, Any]] = {}  # key -> the answer the client settled on
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            key = uuid.uuid4().hex
            body = {"tenant": "vision", "kind": "job", "gpus": 1, "name": key[:12]}
            for _ in range(60):  # retried with the same key, as our clients do
                status, data, headers = call(
                    b.url,
                    "POST",
                    "api/requests",
                    body,
                    timeout=60,
                    headers={"Idempotency-Key": key},
                )
                with lock:
                    raw.append((status, data))
                if status not in (0, 502, 503):
                    break
                time.sleep(min(2.0, float(headers.get("Retry-After", 1))))
            with lock:
                final[key] = (status, data)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(raw) >= 4, 20, "answers under load before the freeze")

    freezer.stop(a.proc.pid)
    wait_for(lambda: health(b.url).get("leader") is True, 15, "the standby takes over")
    time.sleep(3)  # the new leader decides under load (a duration: the point of the test)
    freezer.resume()
    wait_for(lambda: health(a.url).get("leader") is False, 15, "the old leader steps down")
    time.sleep(2)  # the old leader, running again, under load too (a duration)
    stop.set()
    for t in threads:
        t.join(90)

    statuses = {s for s, _ in raw}
    assert 502 not in statuses, [d for s, d in raw if s == 502][:3]
    assert 500 not in statuses and 0 not in statuses, statuses
    rows = store_rows(db_url)
    by_key: dict[str, list[str]] = {}
    for row in rows.values():
        by_key.setdefault(row.idempotency_key, []).append(row.id)
    for key, (status, data) in final.items():
        assert status in (200, 201), (key, status, data)
        assert by_key.get(key) == [data["id"]], (key, by_key.get(key), data)
    assert len(rows) == len(final), "a submission was created twice, or one nobody was told of"
    # The old leader, running again, is a standby: what it says is the store's.
    status, listed, _ = call(a.url, "GET", "api/requests?limit=10000", who="root")
    assert status == 200 and {r["id"] for r in listed} == set(rows)
