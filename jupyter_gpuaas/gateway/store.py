"""The gateway's store: requests, the decision log, simulated nodes and tenant overrides.

The gateway is the only writer. Every batch of decisions the core makes is written in ONE
transaction together with the request rows it changed, and committed before anyone is
told (HTTP answer, SSE event). So after a crash (even `kill -9`) the database holds a state
the core really was in after some batch, and rebuilding the core from it (`restore`) can
never bind one device twice or forget a request that was answered with 201.

The schema is created and upgraded with alembic (migrations ship inside the package);
`Store.open` runs `upgrade head` before anything else touches the database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    Table,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jupyter_gpuaas.admission.model import TERMINAL, Decision, Request, State

log = logging.getLogger("jupyter_gpuaas.gateway")

MIGRATIONS = Path(__file__).with_name("migrations")


class Base(DeclarativeBase):
    pass


class RequestRow(Base):
    """One request, live or ended: every field of the core's `Request` plus what the API adds."""

    __tablename__ = "requests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(255), index=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    gpus: Mapped[int] = mapped_column(Integer)
    flavor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    busy: Mapped[bool] = mapped_column(Boolean, default=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    submit_time: Mapped[float] = mapped_column(Float)
    queue_time: Mapped[float] = mapped_column(Float, default=0.0)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    assigned_flavor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    devices: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of indices
    first_admit: Mapped[float | None] = mapped_column(Float, nullable=True)
    admit_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    park_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    wants_devices: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    culls: Mapped[int] = mapped_column(Integer, default=0)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A warned preemption victim: evicted at preempt_at for preempted_by (migration 0002).
    preempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preempted_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)

    def device_list(self) -> list[int]:
        return list(json.loads(self.devices or "[]"))


class DecisionRow(Base):
    """The append-only decision log: what the core decided, in order."""

    __tablename__ = "decisions"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    t: Mapped[float] = mapped_column(Float)
    event: Mapped[str] = mapped_column(String(32))
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    fields: Mapped[str] = mapped_column(Text, default="{}")


class NodeRow(Base):
    """A node the simulated scaler added (inventory nodes are re-read on start)."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[int] = mapped_column(Integer)
    autoscaled: Mapped[bool] = mapped_column(Boolean, default=True)
    created: Mapped[float] = mapped_column(Float)


class TenantOverrideRow(Base):
    """An admin's `PUT api/tenants/{name}`: the tenant's spec, replacing the quota file's."""

    __tablename__ = "tenant_overrides"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    spec: Mapped[str] = mapped_column(Text)
    updated: Mapped[float] = mapped_column(Float)


REQUESTS = cast(Table, RequestRow.__table__)
DECISIONS = cast(Table, DecisionRow.__table__)
NODES = cast(Table, NodeRow.__table__)
OVERRIDES = cast(Table, TenantOverrideRow.__table__)

# Fields copied verbatim between the core's Request and a row.
_COPIED = (
    "tenant",
    "user",
    "kind",
    "gpus",
    "flavor",
    "priority",
    "busy",
    "submit_time",
    "queue_time",
    "seq",
    "assigned_flavor",
    "node",
    "first_admit",
    "admit_time",
    "idle_since",
    "park_expires",
    "lease_expires",
    "wants_devices",
    "preemptions",
    "culls",
    "reason",
    "preempt_at",
    "preempted_by",
)


def request_to_row(req: Request, row: RequestRow, now: float) -> None:
    for name in _COPIED:
        setattr(row, name, getattr(req, name))
    row.state = req.state.value
    row.devices = json.dumps(list(req.devices))
    row.updated = now


def row_to_request(row: RequestRow) -> Request:
    req = Request(
        id=row.id,
        tenant=row.tenant,
        user=row.user,
        kind=row.kind,
        gpus=row.gpus,
        submit_time=row.submit_time,
        flavor=row.flavor,
        priority=row.priority,
        busy=row.busy,
    )
    for name in _COPIED:
        setattr(req, name, getattr(row, name))
    req.state = State(row.state)
    req.devices = tuple(row.device_list())
    return req


@dataclass
class Batch:
    """What one transaction writes: request rows (new or changed) and decisions."""

    requests: list[tuple[Request, dict[str, Any]]]  # (request, extra columns: name, ...)
    decisions: Sequence[Decision]
    nodes_added: list[tuple[str, str, int]] = field(default_factory=list)  # name, flavor, gpus
    nodes_removed: list[str] = field(default_factory=list)
    tenants: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # overrides put


@dataclass
class Snapshot:
    """A Batch as plain data, taken when the core decided it.

    The arbiter keeps deciding while a group of snapshots is written by the store's
    thread, and the core mutates its Request objects: the rows are copied first.
    """

    rows: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    nodes_added: list[tuple[str, str, int]]
    nodes_removed: list[str]
    tenants: list[tuple[str, str]]  # (name, spec JSON)
    now: float


def snapshot(batch: Batch, now: float) -> Snapshot:
    """Copy a batch into plain data (raises TypeError if a decision is not JSON)."""
    rows = []
    for req, extra in batch.requests:
        row = {name: getattr(req, name) for name in _COPIED}
        row["id"] = req.id
        row["state"] = req.state.value
        row["devices"] = json.dumps(list(req.devices))
        row["updated"] = now
        row.update(extra)
        row.setdefault("created", now)
        rows.append(row)
    decisions = []
    for d in batch.decisions:
        fields = {k: v for k, v in d.to_json().items() if k not in ("t", "event", "id")}
        decisions.append(
            {
                "t": d.t,
                "event": d.event,
                "request_id": d.id,
                "fields": json.dumps(fields, default=list),
            }
        )
    return Snapshot(
        rows,
        decisions,
        list(batch.nodes_added),
        list(batch.nodes_removed),
        [(name, json.dumps(spec)) for name, spec in batch.tenants],
        now,
    )


def _dialect_insert(dialect: str) -> Any:
    """INSERT with ON CONFLICT DO UPDATE (an upsert) of SQLite or PostgreSQL."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never block the writer. synchronous=FULL: a commit is on disk when it
    # returns, even across power loss; NORMAL would be enough for `kill -9` (the WAL is in
    # the OS cache) but not for a machine crash, and a 201 promises the request survives.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        # psycopg 3 is the driver we depend on; plain postgresql:// means psycopg2 to SA.
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    return engine


def upgrade(engine: Engine) -> None:
    """`alembic upgrade head` on this engine, with the migrations shipped in the package."""
    # Before the import: alembic announces its plugins at INFO when first imported.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Store:
    """Synchronous access to the database, used from the gateway's event loop.

    Calls are short (one transaction per group of batches of decisions, see the
    arbiter's group commit), so they run inline: that keeps the order "commit, then
    announce" trivially true without locks.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._upserts: dict[tuple[str, tuple[str, ...]], Any] = {}

    @classmethod
    def open(cls, url: str) -> Store:
        engine = make_engine(url)
        upgrade(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    # --- writing --------------------------------------------------------------------

    def write(self, batch: Batch, now: float) -> None:
        """Write request rows and decisions in one transaction (commit on return)."""
        self.write_many([snapshot(batch, now)])

    def write_many(self, snapshots: Sequence[Snapshot]) -> None:
        """Write several batches, in order, in ONE transaction (group commit).

        The gateway's arbiter hands over every batch decided while the previous group was
        being committed, so one fsync covers many submissions. Either all of them are
        recorded or none: the store stays a state the core was in after some batch.
        Request rows are upserted (the last image of a row in the group wins; `created`
        is set only on insert, and `name`/`utilization` only where the batch gave them).
        """
        rows: dict[str, dict[str, Any]] = {}
        decisions: list[dict[str, Any]] = []
        for snap in snapshots:
            for row in snap.rows:
                before = rows.get(row["id"])
                if before is not None:
                    row = {**before, **row, "created": before["created"]}
                rows[row["id"]] = row
            decisions += snap.decisions
        with self.engine.begin() as conn:
            if rows:
                self._upsert_requests(conn, list(rows.values()))
            if decisions:
                conn.execute(DECISIONS.insert(), decisions)
            for snap in snapshots:
                now = snap.now
                nodes = NODES
                for name, flavor, gpus in snap.nodes_added:
                    if conn.execute(select(nodes.c.name).where(nodes.c.name == name)).first():
                        continue
                    conn.execute(
                        nodes.insert().values(
                            name=name, flavor=flavor, gpus=gpus, autoscaled=True, created=now
                        )
                    )
                for name in snap.nodes_removed:
                    conn.execute(nodes.delete().where(nodes.c.name == name))
                overrides = OVERRIDES
                for name, spec in snap.tenants:
                    done = conn.execute(
                        overrides.update()
                        .where(overrides.c.name == name)
                        .values(spec=spec, updated=now)
                    )
                    if not done.rowcount:
                        conn.execute(overrides.insert().values(name=name, spec=spec, updated=now))

    def _upsert(self, dialect: str, keys: tuple[str, ...]) -> Any:
        """The upsert of request rows with these columns (built once: building one costs
        more than running it)."""
        stmt = self._upserts.get((dialect, keys))
        if stmt is None:
            table = REQUESTS
            update = [k for k in keys if k not in ("id", "created")]
            stmt = _dialect_insert(dialect)(table)
            stmt = stmt.on_conflict_do_update(
                index_elements=[table.c.id], set_={k: stmt.excluded[k] for k in update}
            )
            self._upserts[(dialect, keys)] = stmt
        return stmt

    def _upsert_requests(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        table = REQUESTS
        dialect = conn.dialect.name
        # One statement per set of columns (a batch without `name` keeps the stored one).
        by_keys: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in rows:
            by_keys.setdefault(tuple(sorted(row)), []).append(row)
        for keys, group in by_keys.items():
            update = [k for k in keys if k not in ("id", "created")]
            if dialect in ("sqlite", "postgresql"):
                conn.execute(self._upsert(dialect, keys), group)
                continue
            for row in group:  # any other database: look each row up
                found = conn.execute(select(table.c.id).where(table.c.id == row["id"])).first()
                if found is None:
                    conn.execute(table.insert().values(**row))
                else:
                    values = {k: row[k] for k in update}
                    conn.execute(table.update().where(table.c.id == row["id"]).values(**values))

    def add_node(self, name: str, flavor: str, gpus: int, now: float) -> None:
        with self.session() as s:
            if s.get(NodeRow, name) is None:
                s.add(NodeRow(name=name, flavor=flavor, gpus=gpus, created=now))

    def remove_node(self, name: str) -> None:
        with self.session() as s:
            row = s.get(NodeRow, name)
            if row is not None:
                s.delete(row)

    def put_tenant(self, name: str, spec: dict[str, Any], now: float) -> None:
        with self.session() as s:
            row = s.get(TenantOverrideRow, name)
            if row is None:
                s.add(TenantOverrideRow(name=name, spec=json.dumps(spec), updated=now))
            else:
                row.spec = json.dumps(spec)
                row.updated = now

    # --- reading --------------------------------------------------------------------

    def live_requests(self) -> list[RequestRow]:
        live = [s.value for s in State if s not in TERMINAL]
        with self.session() as s:
            rows = s.scalars(
                select(RequestRow).where(RequestRow.state.in_(live)).order_by(RequestRow.seq)
            )
            return list(rows)

    def get(self, rid: str) -> RequestRow | None:
        with self.session() as s:
            return s.get(RequestRow, rid)

    def query(
        self,
        *,
        state: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[RequestRow]:
        stmt = select(RequestRow)
        for column, value in (
            (RequestRow.state, state),
            (RequestRow.tenant, tenant),
            (RequestRow.user, user),
            (RequestRow.kind, kind),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        stmt = stmt.order_by(RequestRow.created.desc(), RequestRow.id).limit(limit)
        with self.session() as s:
            return list(s.scalars(stmt))

    def nodes(self) -> list[NodeRow]:
        with self.session() as s:
            return list(s.scalars(select(NodeRow).order_by(NodeRow.name)))

    def tenant_overrides(self) -> dict[str, dict[str, Any]]:
        with self.session() as s:
            return {r.name: json.loads(r.spec) for r in s.scalars(select(TenantOverrideRow))}

    def decisions(self, request_id: str | None = None) -> list[DecisionRow]:
        stmt = select(DecisionRow).order_by(DecisionRow.seq)
        if request_id is not None:
            stmt = stmt.where(DecisionRow.request_id == request_id)
        with self.session() as s:
            return list(s.scalars(stmt))

    def ended_hold_times(self, limit: int = 200) -> Iterable[tuple[str, float]]:
        """(flavor, seconds held) of recently ended grants: the basis of wait estimates."""
        ended = [State.FINISHED.value, State.CANCELLED.value, State.PREEMPTED.value]
        stmt = (
            select(RequestRow.assigned_flavor, RequestRow.admit_time, RequestRow.updated)
            .where(RequestRow.state.in_(ended), RequestRow.admit_time.is_not(None))
            .order_by(RequestRow.updated.desc())
            .limit(limit)
        )
        with self.session() as s:
            return [(f, u - a) for f, a, u in s.execute(stmt) if f is not None and a is not None]
