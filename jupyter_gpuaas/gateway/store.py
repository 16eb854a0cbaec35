"""The gateway's store: requests, the decision log, simulated nodes and tenant overrides.

The gateway is the only writer. Every batch of decisions the core makes is written in ONE
transaction together with the request rows it changed, and committed before anyone is
told (HTTP answer, SSE event). So after a crash (even `kill -9`) the database holds a state
the core really was in after some batch, and rebuilding the core from it (`restore`) can
never bind one device twice or forget a request that was answered with 201.

The schema is created and upgraded with alembic (migrations ship inside the package);
`Store.open` runs `upgrade head` before anything else touches the database, then a write
check: a store that cannot be written (a read-only file, a read-only replica) is refused
at start instead of failing the first decision.

Rows are checked before they are written (`rows.check_snapshot`): every integer fits a 32-bit
column, every string is encodable UTF-8 without NUL and fits its column. The arbiter
checks each operation's rows on their own, so one bad operation never fails its group.

Locks. The gateway is the only writer, but another process (a backup, `sqlite3` in a
shell) can hold SQLite's write lock. `begin_write` takes the lock up front
(`BEGIN IMMEDIATE`) with a busy timeout of a few milliseconds and raises `StoreBusy` at
once when it is held; the arbiter retries later without blocking its event loop and
without having touched the core. Once the lock is held, a WAL commit needs no other lock.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    and_,
    create_engine,
    delete,
    event,
    or_,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, aliased

from jupyter_gpuaas.admission.estimate import arrival, hold_start
from jupyter_gpuaas.admission.model import TERMINAL, Request, State

from .rows import (
    ACTIVITY,
    DECISIONS,
    NODES,
    OVERRIDES,
    REQUESTS,
    Base,
    Batch,
    DecisionRow,
    NodeRow,
    RequestRow,
    RowError,
    Snapshot,
    TenantOverrideRow,
    check_snapshot,
    row_to_request,
    snapshot,
)

log = logging.getLogger("jupyter_gpuaas.gateway")

MIGRATIONS = Path(__file__).with_name("migrations")


class StoreUnavailable(Exception):
    """The store cannot be read or written now (HTTP 503 with Retry-After).

    `message` (with the database's own words) is for the log; `public` is what callers
    are told: the store's address and errors are none of an API client's business.
    """

    public = "the store is unavailable, so nothing was changed"
    state = "unavailable"

    def __init__(self, message: str, retry_after: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class StoreBusy(StoreUnavailable):
    """Another process holds the store's write lock: try again shortly."""

    public = "the store is locked by another process, so nothing was changed"
    state = "locked"


class StoreUnresponsive(StoreUnavailable):
    """The store did not answer within the gateway's deadline (a frozen server, a disk
    that stopped): nothing was changed, and the gateway did not wait any longer."""

    public = "the store did not answer in time, so nothing was changed"
    state = "unresponsive"


class CommitUnknown(StoreUnavailable):
    """The store went away during the COMMIT itself: the database may have recorded the
    change before the connection broke (PostgreSQL stopped mid-commit), and nobody can
    tell which. Callers are told so, and to look before they retry."""

    public = (
        "the store went away while recording this, so it may or may not have been "
        "recorded: look it up before you retry"
    )
    state = "unknown"


def describe(error: BaseException) -> str:
    """One line for a database error (SQLAlchemy's own text carries the SQL)."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        return str(error.orig).strip().splitlines()[0]
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _is_locked(error: BaseException) -> bool:
    text_ = describe(error).lower()
    return "database is locked" in text_ or "database table is locked" in text_


class WriteTx:
    """One write transaction that already holds the store's write lock."""

    def __init__(self, store: Store, conn: Connection) -> None:
        self.store = store
        self.conn = conn
        self._tx = conn.begin()

    def write(self, snapshots: Sequence[Snapshot]) -> None:
        self.store._write_into(self.conn, snapshots)

    def commit(self) -> None:
        try:
            self._tx.commit()
        finally:
            self.conn.close()

    def rollback(self) -> None:
        try:
            if self._tx.is_active:  # not after a failed commit: that rolled back already
                self._tx.rollback()
        except SQLAlchemyError:
            log.warning("rolling back a failed write failed too", exc_info=True)
        finally:
            try:
                self.conn.close()
            except SQLAlchemyError:
                pass


def _dialect_insert(dialect: str) -> Any:
    """INSERT with ON CONFLICT DO UPDATE (an upsert) of SQLite or PostgreSQL."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert


# SQLite's wait for a lock held by another process, per attempt. Short: the arbiter runs
# on the event loop, and retries later itself (StoreBusy) rather than sleeping here.
SQLITE_BUSY_TIMEOUT_MS = 10
SQLITE_WAL_LIMIT = 1 << 20
# Less free space than this on the filesystem of a SQLite store: health says "failing"
# (the next group write would not fit; a write probe alone may still reuse WAL pages).
SQLITE_MIN_FREE = 64 * 1024
# PostgreSQL's own bound on one statement (milliseconds): a statement stuck on the server
# ends there; a server that does not answer at all is the gateway's deadline's business.
PG_STATEMENT_TIMEOUT_MS = 5000


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # pysqlite's own implicit BEGIN would be DEFERRED and come too late to tell "locked"
    # from any other failure: let SQLAlchemy's `begin` hook below emit BEGIN itself.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # WAL: readers never block the writer. synchronous=FULL: a commit is on disk when it
    # returns, even across power loss; NORMAL would be enough for `kill -9` (the WAL is in
    # the OS cache) but not for a machine crash, and a 201 promises the request survives.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    # After a checkpoint resets the WAL, cut its file back to this size: space a burst
    # took is given back to the filesystem instead of staying the WAL's for good.
    cur.execute(f"PRAGMA journal_size_limit={SQLITE_WAL_LIMIT}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        # psycopg 3 is the driver we depend on; plain postgresql:// means psycopg2 to SA.
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    else:
        # A stopped server answers at once; an unreachable one within connect_timeout. A
        # table lock held by someone else fails the statement after lock_timeout. And a
        # commit is durable whatever the server's default: with synchronous_commit=off a
        # crash loses acknowledged commits, i.e. requests answered 201 (seen in a test).
        engine = create_engine(
            url,
            pool_pre_ping=True,
            connect_args={
                "connect_timeout": 3,
                "options": "-c lock_timeout=200 -c synchronous_commit=on "
                f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS}",
            },
        )
    return engine


def _sqlite_begin(conn: Connection) -> None:
    """BEGIN IMMEDIATE for writes (the write lock now, or "database is locked" now)."""
    write = conn.get_execution_options().get("gpuaas_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def upgrade(engine: Engine) -> None:
    """`alembic upgrade head` on this engine, with the migrations shipped in the package."""
    # Before the import: alembic announces its plugins at INFO when first imported.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # a migration of a big table takes its time
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Store:
    """Synchronous access to the database, used from the gateway's event loop.

    Calls are short (one transaction per group of batches of decisions, see the
    arbiter's group commit), so they run inline: that keeps the order "commit, then
    announce" trivially true without locks. Lock waits are bounded by the short busy
    timeout (SQLite) or lock_timeout (PostgreSQL): see the module docstring.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._upserts: dict[tuple[str, tuple[str, ...]], Any] = {}
        # Checked first in every write transaction (leader.py: "do I still lead?"); it
        # raises StoreUnavailable (NotLeader) to refuse the write. None: one gateway.
        self.fence: Callable[[Connection], None] | None = None

    @classmethod
    def open(cls, url: str) -> Store:
        engine = make_engine(url)
        upgrade(engine)
        store = cls(engine)
        store.check_writable()
        return store

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    def check_writable(self) -> None:
        """Write (and commit) one row: refuse a store that cannot record decisions."""
        self.check_space()
        try:
            tx = self.begin_write(wait=2.0)
            tx.conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
            tx.commit()
        except StoreUnavailable as e:
            raise StoreUnavailable(f"the store is not writable: {e.message}") from None
        except SQLAlchemyError as e:
            raise StoreUnavailable(f"the store is not writable: {describe(e)}") from None

    @property
    def dialect(self) -> str:
        return str(self.engine.dialect.name)

    def checkpoint(self) -> None:
        """SQLite: copy the WAL into the database and truncate it, so that space freed
        (rows pruned, a file deleted next to it) is space the next write can use."""
        if self.dialect != "sqlite":
            return
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except SQLAlchemyError as e:
            log.debug("checkpoint failed: %s", describe(e))

    def check_space(self) -> None:
        """SQLite: StoreUnavailable when its filesystem is (nearly) full."""
        if self.dialect != "sqlite" or not self.engine.url.database:
            return
        try:
            st = os.statvfs(Path(self.engine.url.database).resolve().parent)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < SQLITE_MIN_FREE:
            raise StoreUnavailable("the filesystem holding the store is full")

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers a query now (and, for
        SQLite, its filesystem has room for the next write)."""
        self.check_space()
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as e:
            raise StoreUnavailable(f"the store is unreachable: {describe(e)}") from None

    # --- writing --------------------------------------------------------------------

    def begin_write(self, wait: float = 0.0) -> WriteTx:
        """A transaction holding the write lock. StoreBusy at once when another process
        holds it (after `wait` seconds of retrying, for callers off the event loop);
        StoreUnavailable when the database cannot be reached."""
        deadline = time.monotonic() + wait
        while True:
            conn = None
            try:
                conn = self.engine.connect().execution_options(gpuaas_write=True)
                tx = WriteTx(self, conn)
                if self.fence is not None:
                    try:
                        self.fence(tx.conn)
                    except StoreUnavailable:
                        tx.rollback()
                        raise
                return tx
            except SQLAlchemyError as e:
                if conn is not None:
                    conn.close()
                if not _is_locked(e):
                    raise StoreUnavailable(f"the store is unreachable: {describe(e)}") from None
                if time.monotonic() >= deadline:
                    raise StoreBusy(
                        "the store is locked by another process", retry_after=1
                    ) from None
                time.sleep(0.05)

    def write(self, batch: Batch, now: float) -> None:
        """Write request rows and decisions in one transaction (commit on return)."""
        self.write_many([snapshot(batch, now)])

    def write_many(self, snapshots: Sequence[Snapshot], wait: float = 2.0) -> None:
        """Write several batches, in order, in ONE transaction (group commit).

        The gateway's arbiter hands over every batch decided while the previous group was
        being committed, so one fsync covers many submissions. Either all of them are
        recorded or none: the store stays a state the core was in after some batch.
        Request rows are upserted (the last image of a row in the group wins; `created`
        is set only on insert, and `name`/`utilization` only where the batch gave them).
        """
        tx = self.begin_write(wait=wait)
        try:
            tx.write(snapshots)
        except BaseException:
            tx.rollback()
            raise
        tx.commit()

    def _write_into(self, conn: Connection, snapshots: Sequence[Snapshot]) -> None:
        rows: dict[str, dict[str, Any]] = {}
        decisions: list[dict[str, Any]] = []
        activity: list[dict[str, Any]] = []
        for snap in snapshots:
            activity += snap.activity
            for row in snap.rows:
                before = rows.get(row["id"])
                if before is not None:
                    row = {**before, **row, "created": before["created"]}
                rows[row["id"]] = row
            decisions += snap.decisions
        if rows:
            self._upsert_requests(conn, list(rows.values()))
        if decisions:
            conn.execute(DECISIONS.insert(), decisions)
        if activity:
            conn.execute(ACTIVITY.insert(), activity)
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

    def prune(self, before: float, limit: int = 1000) -> int:
        """Delete up to `limit` ended (and rejected) requests last changed before `before`,
        with their decisions; decisions about no request, older than `before`, too.
        Returns how many requests went. Raises StoreBusy/StoreUnavailable (try later)."""
        ended = [s.value for s in TERMINAL]
        table = REQUESTS
        tx = self.begin_write()
        try:
            ids = list(
                tx.conn.scalars(
                    select(table.c.id)
                    .where(table.c.state.in_(ended), table.c.updated < before)
                    .limit(limit)
                )
            )
            if ids:
                tx.conn.execute(delete(DECISIONS).where(DECISIONS.c.request_id.in_(ids)))
                tx.conn.execute(delete(ACTIVITY).where(ACTIVITY.c.request_id.in_(ids)))
                tx.conn.execute(delete(table).where(table.c.id.in_(ids)))
            tx.conn.execute(
                delete(DECISIONS).where(DECISIONS.c.request_id.is_(None), DECISIONS.c.t < before)
            )
        except BaseException:
            tx.rollback()
            raise
        tx.commit()
        return len(ids)

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

    def find_key(self, user: str, key: str) -> RequestRow | None:
        """The request `user` submitted with this Idempotency-Key, if any."""
        with self.session() as s:
            return s.scalars(
                select(RequestRow).where(RequestRow.user == user, RequestRow.idempotency_key == key)
            ).first()

    def query(
        self,
        *,
        state: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        kind: str | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[RequestRow]:
        """Rows newest first (created, then id, descending); `after`: the (created, id)
        of the last row of the previous page (keyset pagination: no OFFSET scans)."""
        stmt = select(RequestRow)
        for column, value in (
            (RequestRow.state, state),
            (RequestRow.tenant, tenant),
            (RequestRow.user, user),
            (RequestRow.kind, kind),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        if after is not None:
            created, rid = after
            stmt = stmt.where(
                or_(
                    RequestRow.created < created,
                    and_(RequestRow.created == created, RequestRow.id < rid),
                )
            )
        stmt = stmt.order_by(RequestRow.created.desc(), RequestRow.id.desc()).limit(limit)
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

    def ended_holds(self, limit: int = 20000) -> list[tuple[str, str, float, int, bool, float]]:
        """(kind, user, seconds held, culls, gave up, ended at) of recently ended grants
        (as many as the estimates' history keeps, admission/estimate.py `KEEP`), culled ones
        included (their devices went back when culled, or their parked reservation
        expired: their user did not come back, "gave up"): the history a forward-run
        estimate goes by, rebuilt at a start by the live rule (`hold_start`: from the
        start of the hold that ended, `held_since`, which a resume from its parked
        reservation goes on with). A preempted grant is not one: the core cut its hold
        short (the live rule too; a preempted job runs again, and its row holds its last,
        complete run). Two things the live history knows and a row does not: a
        reservation a new request took over ended no hold (the new request goes on with
        it; its row reads finished), and `culls` counts every cull of the request, not
        only those of its last hold."""
        ended = [s.value for s in (State.FINISHED, State.CANCELLED, State.CULLED)]
        cols = (RequestRow.admit_time, RequestRow.culls, RequestRow.first_admit)
        stmt = (
            select(RequestRow.kind, RequestRow.user, *cols, RequestRow.held_since)
            .add_columns(RequestRow.updated, RequestRow.state)
            .where(RequestRow.state.in_(ended), RequestRow.admit_time.is_not(None))
            .order_by(RequestRow.updated.desc())
            .limit(limit)
        )
        with self.session() as s:
            culled = State.CULLED.value
            rows = [
                (k, u, max(0.0, up - hold_start(a, c or 0, f, h)), c or 0, st == culled, up)
                for k, u, a, c, f, h, up, st in s.execute(stmt)
                if a is not None
            ]
        rows.reverse()  # oldest first: the history keeps the most recent
        return rows

    def submitted_since(self, since: float, limit: int = 100_000) -> list[Request]:
        """The requests submitted at or after `since`, oldest first (whatever became of
        them): the arrival forecast of the wait estimates (admission/estimate.py)."""
        stmt = (
            select(RequestRow)
            .where(RequestRow.submit_time >= since)
            .order_by(RequestRow.submit_time)
            .limit(limit)
        )
        with self.session() as s:
            return [row_to_request(r) for r in s.scalars(stmt)]

    def arrivals_since(self, since: float, limit: int = 100_000) -> list[Request]:
        """What entered the queue at or after `since`, oldest first: each submission at its
        submit time, and each culled request queued again at the time its user came back
        (a `requeue` whose request was last culled or its reservation expired; a preempted
        job queued again keeps its place and is no arrival). The arrival forecast of the
        wait estimates after a restart reads both, as the running gateway kept them
        (estimates.py `submitted`, `came_back`)."""
        arrived = self.submitted_since(since, limit)
        earlier = aliased(DecisionRow)
        last_mark = (
            select(earlier.event)
            .where(
                earlier.request_id == DecisionRow.request_id,
                earlier.seq < DecisionRow.seq,
                earlier.event.in_(("cull", "expire", "preempt", "admit")),
            )
            .order_by(earlier.seq.desc())
            .limit(1)
            .scalar_subquery()
        )
        stmt = (
            select(DecisionRow.request_id, DecisionRow.t)
            .where(
                DecisionRow.event == "requeue",
                DecisionRow.t >= since,
                last_mark.in_(("cull", "expire")),
            )
            .order_by(DecisionRow.seq)
            .limit(limit)
        )
        with self.session() as s:
            back = [(str(rid), float(t)) for rid, t in s.execute(stmt) if rid is not None]
            rows: dict[str, Request] = {}
            ids = sorted({rid for rid, _ in back})
            for i in range(0, len(ids), 500):  # under every database's bound on parameters
                chunk = ids[i : i + 500]
                for r in s.scalars(select(RequestRow).where(RequestRow.id.in_(chunk))):
                    rows[r.id] = row_to_request(r)
        arrived += [arrival(rows[rid], t) for rid, t in back if rid in rows]
        arrived.sort(key=lambda r: r.submit_time)
        return arrived

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


__all__ = [
    "MIGRATIONS",
    "Base",
    "Batch",
    "DecisionRow",
    "NodeRow",
    "RequestRow",
    "RowError",
    "Snapshot",
    "Store",
    "StoreBusy",
    "StoreUnavailable",
    "StoreUnresponsive",
    "TenantOverrideRow",
    "WriteTx",
    "check_snapshot",
    "describe",
    "make_engine",
    "row_to_request",
    "snapshot",
    "upgrade",
]
