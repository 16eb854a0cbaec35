"""`GET api/advice` is bounded (advice_cache.py): one replay of a period at a time, its
answer reused for `advice_cache_seconds`, and past `advice_deadline` the caller gets the
last answer marked stale, or a 503 with Retry-After and one sentence when there is none.

The slow replay is a real one: the test holds PostgreSQL's ACCESS EXCLUSIVE lock on the
store's `requests` table, so the gateway's read of the history waits on the database
itself, as it would behind a long migration or a backup's lock. (SQLite cannot stall a
reader on cue: in WAL mode a reader never waits for a writer.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from gwutil import TOKENS, call, fresh_pg_database
from helpers import wait_for
from sqlalchemy.engine import make_url

from jupyter_gpuaas.client import SyncGatewayClient

CACHE = 4.0  # seconds an answer is reused (GatewayApp.advice_cache_seconds)


def lock_waiters(db_url: str) -> int:
    """Sessions of this database waiting for a lock (the gateway's history reads)."""
    url = make_url(db_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        waiting = "wait_event_type = 'Lock'"
        row = conn.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND {waiting}",
            (url.database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def requests_locked(db_url: str) -> Iterator[None]:
    url = make_url(db_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database
    ) as conn:
        conn.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


def test_a_slow_replay_answers_503_then_stale_and_runs_once(
    spawn_gateway: Any, postgres_url: str
) -> None:
    db_url = fresh_pg_database(postgres_url)
    gw = spawn_gateway(
        db_url,
        "--GatewayApp.advice_min_grants=1",
        "--GatewayApp.advice_deadline=0.5",
        f"--GatewayApp.advice_cache_seconds={CACHE}",
    )
    alice = SyncGatewayClient(gw.url, TOKENS["alice"], timeout=10)
    kernel = alice.submit("vision", "kernel", 1, flavor="a100")
    alice.heartbeat(kernel["id"], busy=True, utilization=0.2)
    alice.cancel(kernel["id"])

    with requests_locked(db_url):
        # No answer yet and the replay waits on the lock: 503, Retry-After, one sentence.
        status, body, headers = call(gw.url, "GET", "api/advice?since=30d", who="root")
        assert status == 503, body
        retry = int(headers["Retry-After"])
        assert retry >= 1 and body["error"] == (
            "the advice for the last 30 d is still being worked out from the store's "
            f"history; ask again in {retry} s"
        )
        # Another caller of the same period (30d is 2592000 s) joins that replay: one
        # read waits on the lock, not two.
        status, _, _ = call(gw.url, "GET", "api/advice?since=2592000", who="alice")
        assert status == 503
        assert lock_waiters(db_url) == 1

    # The lock is gone: the replay finishes and its answer is given.
    def fresh() -> dict[str, Any] | None:
        status, body, _ = call(gw.url, "GET", "api/advice", who="root")
        return body if status == 200 else None

    first = wait_for(fresh, what="the advice after the lock")
    assert first["stale"] is False and [a["subject"] for a in first["advice"]] == ["alice"]

    with requests_locked(db_url):
        # Within advice_cache_seconds the answer is the cached one: no read of the store.
        status, cached, _ = call(gw.url, "GET", "api/advice", who="root")
        assert status == 200 and cached["stale"] is False
        assert cached["until"] == first["until"]
        assert lock_waiters(db_url) == 0
        # Past it, a new replay starts and waits on the lock; past the deadline each
        # caller gets the last answer, marked stale, and still only their own advice.
        time.sleep(CACHE)
        status, stale, _ = call(gw.url, "GET", "api/advice", who="root")
        assert status == 200 and stale["stale"] is True and stale["until"] == first["until"]
        assert stale["advice"] == first["advice"]
        status, mine, _ = call(gw.url, "GET", "api/advice", who="alice")
        assert status == 200 and mine["stale"] is True
        assert [a["subject"] for a in mine["advice"]] == ["alice"]
        status, theirs, _ = call(gw.url, "GET", "api/advice", who="bob")
        assert status == 200 and theirs["stale"] is True and theirs["advice"] == []
        assert lock_waiters(db_url) == 1

    # Released: the replay under way completes, and the next answer is fresh and newer.
    newer = wait_for(
        lambda: (a := fresh()) is not None and not a["stale"] and a,
        what="a fresh answer after the second lock",
    )
    assert newer["until"] > first["until"]
