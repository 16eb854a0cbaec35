"""The store on SQLite and PostgreSQL: migrations, round trips, one transaction per batch."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

from jupyter_gpuaas.admission.model import Decision, Request, State
from jupyter_gpuaas.gateway.store import MIGRATIONS, Batch, Store, row_to_request


def test_migrations_ship_in_the_package() -> None:
    assert (MIGRATIONS / "env.py").is_file()
    assert (MIGRATIONS / "versions" / "0001_initial.py").is_file()
    assert MIGRATIONS.parent.name == "gateway"  # inside jupyter_gpuaas/, so in the wheel


def test_upgrade_is_idempotent_and_creates_tables(db_url: str) -> None:
    store = Store.open(db_url)
    store.close()
    store = Store.open(db_url)  # again: already at head
    try:
        tables = set(inspect(store.engine).get_table_names())
        assert {"requests", "decisions", "nodes", "tenant_overrides", "alembic_version"} <= tables
        with store.engine.connect() as conn:
            assert (
                conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                == "0002_grace"
            )
    finally:
        store.close()


def test_sqlite_is_wal_with_full_sync(sqlite_url: str) -> None:
    store = Store.open(sqlite_url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 5000
    finally:
        store.close()


def test_round_trip_and_batch(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        req = Request("r-1", "vision", "alice", "kernel", 2, 10.0, flavor="a100", priority=3)
        req.state = State.ADMITTED
        req.assigned_flavor, req.node, req.devices = "a100", "a100-0", (1, 2)
        req.seq, req.admit_time, req.first_admit, req.lease_expires = 7, 11.0, 11.0, 131.0
        decisions = [
            Decision(10.0, "submit", "r-1", {"tenant": "vision", "kind": "kernel", "gpus": 2}),
            Decision(11.0, "admit", "r-1", {"node": "a100-0", "devices": (1, 2)}),
            Decision(11.0, "scale_up", None, {"flavor": "a100", "nodes": 1}),
        ]
        store.write(Batch([(req, {"name": "nb"})], decisions, [("a100-9", "a100", 4)]), 11.0)
        (row,) = store.live_requests()
        back = row_to_request(row)
        for field in (
            "id",
            "tenant",
            "user",
            "kind",
            "gpus",
            "flavor",
            "priority",
            "state",
            "assigned_flavor",
            "node",
            "devices",
            "seq",
            "admit_time",
            "lease_expires",
        ):
            assert getattr(back, field) == getattr(req, field), field
        assert row.name == "nb" and row.created == 11.0
        logged = store.decisions()
        assert [d.event for d in logged] == ["submit", "admit", "scale_up"]
        assert json.loads(logged[1].fields) == {"node": "a100-0", "devices": [1, 2]}
        assert [n.name for n in store.nodes()] == ["a100-9"]
        req.state, req.node, req.devices = State.FINISHED, None, ()
        store.write(Batch([(req, {})], [Decision(12.0, "finish", "r-1")], [], ["a100-9"]), 12.0)
        assert store.live_requests() == []
        assert store.get("r-1").state == "finished" and store.get("r-1").name == "nb"
        assert store.nodes() == []
        assert store.query(state="finished")[0].id == "r-1"
        assert store.query(user="bob") == []
    finally:
        store.close()


def test_a_failed_batch_writes_nothing(sqlite_url: str) -> None:
    store = Store.open(sqlite_url)
    try:
        req = Request("r-1", "vision", "alice", "job", 1, 1.0)
        bad = Decision(1.0, "admit", "r-1", {"x": object()})  # not JSON: the write fails
        with pytest.raises(TypeError):
            store.write(Batch([(req, {})], [Decision(1.0, "submit", "r-1"), bad]), 1.0)
        assert store.get("r-1") is None and store.decisions() == []
    finally:
        store.close()
