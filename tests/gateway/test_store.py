"""The store on SQLite and PostgreSQL: migrations, round trips, one transaction per batch."""

from __future__ import annotations

import json
from typing import Any

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
        assert {
            "requests",
            "decisions",
            "nodes",
            "tenant_overrides",
            "alembic_version",
            "leader_lease",
        } <= tables
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0006"
        indexes = {
            i["name"]: i["column_names"] for i in inspect(store.engine).get_indexes("requests")
        }
        assert indexes["ix_requests_user_created"] == ["user", "created"]
        assert indexes["ux_requests_user_idempotency_key"] == ["user", "idempotency_key"]
        assert "ix_requests_user" not in indexes  # the composite one serves it
    finally:
        store.close()


def test_upgrade_from_0001_keeps_rows(sqlite_url: str) -> None:
    """A store made by the first release gets the history indexes and keeps its rows."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from jupyter_gpuaas.gateway.store import make_engine

    engine = make_engine(sqlite_url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    # The first release's columns only (today's Store writes columns added since).
    rid = "r-00000000000000aa"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO requests (id, tenant, user, kind, gpus, priority, busy, state,"
                " submit_time, queue_time, seq, devices, wants_devices, preemptions, culls,"
                " reason, created, updated) VALUES (:id, 'vision', 'alice', 'job', 1, 0, 1,"
                " 'queued', 1.0, 1.0, 1, '[]', 0, 0, 0, '', 1.0, 1.0)"
            ),
            {"id": rid},
        )
    engine.dispose()
    store = Store.open(sqlite_url)
    try:
        assert [r.id for r in store.query(user="alice")] == [rid]
        indexes = {i["name"] for i in inspect(store.engine).get_indexes("requests")}
        assert "ix_requests_user_created" in indexes
    finally:
        store.close()


def test_sqlite_is_wal_with_full_sync(sqlite_url: str) -> None:
    store = Store.open(sqlite_url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
            # short: a lock held elsewhere is retried by the arbiter, off the loop's back
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 10
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


def test_prune_deletes_old_ended_rows_and_their_decisions(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        rows = []
        for i, (state, t) in enumerate(
            [
                (State.FINISHED, 10.0),
                (State.REJECTED, 20.0),
                (State.QUEUED, 10.0),
                (State.CANCELLED, 500.0),
            ]
        ):
            req = Request(f"r-{i:016x}", "vision", "alice", "job", 1, t)
            req.state = state
            rows.append(req)
            store.write(Batch([(req, {})], [Decision(t, "submit", req.id)]), t)
        store.write(Batch([], [Decision(5.0, "scale_up", None, {"flavor": "a100"})]), 5.0)
        assert store.prune(before=100.0) == 2
        assert {r.id for r in store.query()} == {rows[2].id, rows[3].id}  # live, recent
        assert {d.request_id for d in store.decisions()} == {rows[2].id, rows[3].id}
        assert store.prune(before=100.0) == 0
    finally:
        store.close()


@pytest.mark.asyncio
@pytest.mark.slow
async def test_gateway_prunes_history_after_the_retention(make_gateway: Any) -> None:
    from helpers import wait_until

    gw = await make_gateway(history_retention=1.0)
    alice = gw.client("alice")
    ended = await alice.submit("vision", "job", 1)
    await alice.cancel(ended["id"])
    rejected, _ = await gw.raw(
        "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 9}
    )
    assert rejected == 422
    live = await alice.submit("vision", "job", 1)
    await wait_until(
        lambda: {r.id for r in gw.arbiter.store.query()} == {live["id"]}, 10,
        "the ended rows to be pruned", interval=0.2,
    )  # fmt: skip


def test_arrivals_are_the_submissions_and_the_culled_users_back(db_url: str) -> None:
    """What a restart reads for the arrival forecast: each submission, and each culled
    request queued again when its user came back (at that time); not a preempted job
    queued again, which keeps its place. The decisions are a real core's."""
    from jupyter_gpuaas.admission.config import parse_config
    from jupyter_gpuaas.admission.core import AdmissionCore

    core = AdmissionCore(parse_config({
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
        "tenants": {"vision": {"quota": {"a100": 2},
                               "preemption": {"within_tenant": "LowerPriority"}}},
        "policy": {"idle_timeout": 600, "reservation_ttl": 0},
    }))  # fmt: skip
    store = Store.open(db_url)
    reqs: dict[str, Request] = {}

    def write(t: float, decisions: list[Decision]) -> None:
        store.write(Batch([(r, {}) for r in reqs.values()], decisions), t)

    try:
        for req in (
            Request("r-kernel", "vision", "ann", "kernel", 1, 0.0, priority=5),
            Request("r-job", "vision", "bob", "job", 1, 0.0, priority=0),
        ):
            reqs[req.id] = req
            write(0.0, core.submit(req, 0.0))
        write(0.0, core.step(0.0))
        core.activity("r-kernel", False, 0.0)
        write(600.0, core.step(600.0))  # the idle kernel is culled, nothing parked
        assert reqs["r-kernel"].state is State.CULLED
        write(700.0, core.heartbeat("r-kernel", 700.0, busy=True) + core.step(700.0))
        assert reqs["r-kernel"].state is State.ADMITTED  # its user came back
        urgent = Request("r-urgent", "vision", "cy", "job", 1, 800.0, priority=10)
        reqs[urgent.id] = urgent
        write(800.0, core.submit(urgent, 800.0) + core.step(800.0))
        events = [(d.event, d.request_id) for d in store.decisions()]
        assert ("preempt", "r-job") in events and events.count(("requeue", "r-job")) == 1

        def arrivals(since: float) -> list[tuple[str, float]]:
            return [(r.id, r.submit_time) for r in store.arrivals_since(since)]

        assert arrivals(0.0) == [
            ("r-kernel", 0.0), ("r-job", 0.0), ("r-kernel", 700.0), ("r-urgent", 800.0),
        ]  # fmt: skip
        assert arrivals(650.0) == [("r-kernel", 700.0), ("r-urgent", 800.0)]
        back = store.arrivals_since(650.0)[0]
        assert (back.tenant, back.user, back.kind, back.gpus) == ("vision", "ann", "kernel", 1)
    finally:
        store.close()
