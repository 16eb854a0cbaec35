"""The load's users and the gateway's store as gateway_load.py sees it from outside: who
submits (and their tokens), a grown history written straight into the SQLite file before
the gateway starts, and the decision log read back to count what every listener should
have received.

Split out of gateway_load.py to keep modules short (see its docstring for the benchmark).
The users live here rather than there because `prefill` deals the history out among them
and gateway_load.py imports this module: the other way round would be a circular import.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

TENANTS = ("t0", "t1", "t2", "t3")
USERS_PER_TENANT = 4


def users() -> list[tuple[str, str]]:
    """(user, tenant) of the submitting users."""
    return [(f"{t}u{i}", t) for t in TENANTS for i in range(USERS_PER_TENANT)]


def token_of(user: str) -> str:
    return f"tok-{user}-0123456789"


HISTORY_COLUMNS = [
    "id",
    "tenant",
    "user",
    "kind",
    "gpus",
    "flavor",
    "priority",
    "name",
    "busy",
    "state",
    "submit_time",
    "queue_time",
    "seq",
    "assigned_flavor",
    "node",
    "devices",
    "first_admit",
    "admit_time",
    "idle_since",
    "park_expires",
    "lease_expires",
    "wants_devices",
    "preemptions",
    "culls",
    "utilization",
    "reason",
    "created",
    "updated",
]


def prefill(db: Path, n: int, seed: int) -> None:
    """N ended requests over the last 20 days (the schema made by the gateway's store)."""
    from jupyter_gpuaas.gateway.store import Store

    Store.open(f"sqlite:///{db}").close()
    rng = random.Random(seed)
    who = users()
    now = time.time()
    rows, decisions = [], []
    for i in range(n):
        user, tenant = who[rng.randrange(len(who))]
        t = now - rng.uniform(60.0, 20 * 86400.0)
        state = rng.choices(("finished", "cancelled", "rejected"), (60, 25, 15))[0]
        rid = f"r-{i:016x}"
        rows.append(
            (
                rid,
                tenant,
                user,
                rng.choice(("kernel", "job")),
                1,
                None,
                0,
                "old",
                True,
                state,
                t,
                t,
                i,
                None,
                None,
                "[]",
                None,
                None,
                None,
                None,
                None,
                False,
                0,
                0,
                None,
                "",
                t,
                t + 60,
            )
        )
        decisions.append((t + 60, state if state != "finished" else "finish", rid, "{}"))
    con = sqlite3.connect(db)
    try:
        # Name the columns: later migrations add nullable ones (0003: preempt_at,
        # preempted_by) that an ended row of this history leaves empty.
        cols = ",".join(HISTORY_COLUMNS)
        marks = ",".join("?" * len(HISTORY_COLUMNS))
        con.executemany(f"INSERT INTO requests ({cols}) VALUES ({marks})", rows)
        con.executemany(
            "INSERT INTO decisions (t, event, request_id, fields) VALUES (?, ?, ?, ?)", decisions
        )
        con.commit()
    finally:
        con.close()


def expected_deliveries(db: Path, after_seq: int, upto_seq: int) -> tuple[Counter[str], int]:
    """Decisions committed in (after_seq, upto_seq], per request owner; and the total."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT r.user, count(*) FROM decisions d LEFT JOIN requests r "
            "ON r.id = d.request_id WHERE d.seq > ? AND d.seq <= ? GROUP BY r.user",
            (after_seq, upto_seq),
        ).fetchall()
    finally:
        con.close()
    per_user: Counter[str] = Counter()
    for user, n in rows:
        per_user[user or ""] += n
    return per_user, sum(per_user.values())


def last_seq(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT coalesce(max(seq), 0) FROM decisions").fetchone()[0])
    finally:
        con.close()
