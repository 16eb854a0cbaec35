"""Two gateways, one leader: replicas on one PostgreSQL store elect who decides.

Only one gateway may run the admission core against a store: two would bind one device
twice. Replicas (Kubernetes pods behind a Service, or two hosts) therefore elect a leader:

- The **leader** holds a PostgreSQL advisory lock (`pg_try_advisory_lock`) on a dedicated
  connection kept open for as long as it leads. It restores the core from the store (the
  same `restore` as at start-up) and decides, as a single gateway does.
- A **follower** (standby) keeps a read-only mirror of the store, refreshed every
  `leader_check_interval` when the decision log moved (and every ten intervals anyway,
  for heartbeats): it answers GETs from it (requests, devices, tenants, positions: about
  one interval old). It forwards every change to the leader and relays its answer
  (`forward_writes`; a change that cannot be sent is refused with 503, `Retry-After` and
  "this gateway is a standby, so nothing was changed; the leader is http://...", one
  that was sent but got no answer is 502: it may have been recorded). Its event stream
  relays the leader's decisions from the store's decision log (each once it is
  committed, about an interval late). It tries the lock at each check; on winning it
  relays what is left of the log first.
- When the leader dies (even `kill -9`, or its host: the lock connection sets TCP
  keep-alives so PostgreSQL notices a silent peer within about 10 s), PostgreSQL ends its
  session and frees the lock; a follower takes it at its next attempt and restores.
- A leader whose lock connection fails stops deciding at its next check (it becomes a
  follower).
  Every write transaction is also *fenced*: it first checks, inside the transaction, that
  the lock connection's backend still holds the lock, so a leader that lost the lock (a
  network partition) cannot commit a decision next to the new leader's.

A leader that is alive but frozen (SIGSTOP, a VM paused, a loop blocked) keeps its lock
connection open, so the lock alone never frees. The leader therefore also holds a
**lease** (the `leader_lease` row, as client-go's leader election does with a Lease):
it renews it every `leader_check_interval` (the retry period), and steps down when it
could not renew for RENEW_DEADLINE. A standby that finds the lease unrenewed for
LEASE_DURATION (the database's clock: hosts need not agree on time) fences the old
leader: it ends the old leader's sessions (`pg_terminate_backend` of every backend
whose `application_name` is the old leader's URL, its lock connection included), takes
the lock, and bumps the lease's **epoch**. Every write transaction of a leader first
reads the epoch `FOR SHARE` and refuses to write unless it is its own (`fence`), so a
frozen leader that wakes up cannot commit anything next to its successor; and a
transaction of the old leader still open holds the row, so the bump waits for it (or
for its session's end): the new leader's restore sees everything the old one committed.
A standby never forwards a change to a leader whose lease is not being renewed: it
answers 503 "nothing was changed" instead of sending it into a frozen process's socket.

Who leads is found in `pg_locks` joined with `pg_stat_activity`: the leader sets its
lock connection's `application_name` (and its store connections') to its advertised URL.

SQLite has no such lock and a SQLite file cannot be shared by hosts: one gateway, always
the leader (`leader_election=auto` is off there, `on` is refused).

`Election` is the interface an election implements; `AdvisoryLockElection` is the one
there is. A Kubernetes Lease variant (coordination.k8s.io/v1, holderIdentity = the pod's
advertised URL, renewed every interval, taken over after leaseDurationSeconds) would
implement the same five methods; its `fence` would compare the Lease's resourceVersion.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Protocol

from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from .events import Event
from .rows import DecisionRow
from .store import StoreUnavailable, describe

log = logging.getLogger("jupyter_gpuaas.gateway")

# The advisory lock's key (one bigint): "gpua" in ASCII. Replicas of one deployment share
# it; two deployments on one database would need different keys (leader_lock_key).
DEFAULT_LOCK_KEY = 0x67707561
# PostgreSQL keeps at most 63 bytes of application_name.
APPLICATION_NAME_MAX = 63
# A standby refreshes its mirror at least every this many checks (heartbeats change rows
# without a decision), and relays at most this many decisions per check.
FULL_REFRESH_EVERY = 10
RELAY_BATCH = 5000
# The leader lease (seconds): a standby takes over once the lease went unrenewed for
# LEASE_DURATION; a leader that could not renew for RENEW_DEADLINE steps down first.
# With a 1 s retry period, a frozen leader is replaced in about 8 to 10 s.
LEASE_DURATION = 6.0
RENEW_DEADLINE = 4.0
# A standby forwards a change only while the leader's lease is younger than this: an
# older one means the leader is not renewing, and a change sent to it might sit in a
# frozen process's socket. Refused with 503 (nothing was changed) instead.
FORWARD_MAX_LEASE_AGE = 3.0
_NOW = "extract(epoch from clock_timestamp())"


class NotLeader(StoreUnavailable):
    """This gateway is a standby: a change is refused (503 with Retry-After)."""

    state = "standby"

    def __init__(self, leader_url: str | None, retry_after: int = 2) -> None:
        where = f"the leader is {leader_url}" if leader_url else "a leader is being elected"
        super().__init__(f"this gateway is a standby; {where}", retry_after)
        self.public = f"this gateway is a standby, so nothing was changed; {where}"


class Election(Protocol):
    """One replica's side of an election. Blocking calls: run them off the event loop,
    except `fence`, which runs inside a write transaction on the loop."""

    def try_acquire(self) -> bool:
        """Become the leader if nobody is; True if this replica leads now."""

    def still_held(self) -> bool:
        """While leading: whether leadership is still this replica's."""

    def current_leader(self) -> str | None:
        """The advertised URL of whoever leads, when known."""

    def fence(self, conn: Connection) -> None:
        """Raise NotLeader unless this replica leads, checked inside `conn`'s transaction."""

    def release(self) -> None:
        """Give leadership up (stop)."""

    def advertise(self, url: str) -> None:
        """The URL others are told is the leader's, once the port is known."""


class AdvisoryLockElection:
    """The leader is the replica whose dedicated connection holds a session advisory lock."""

    def __init__(self, db_url: str, advertise_url: str, key: int = DEFAULT_LOCK_KEY) -> None:
        url = make_url(db_url)
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        self.key = key
        self.advertise_url = advertise_url
        # Its own engine, no pool: the lock lives and dies with this one connection.
        # TCP keep-alives: a leader whose host vanished silently frees the lock in ~10 s.
        self.engine: Engine = create_engine(
            url,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={
                "connect_timeout": 3,
                "options": "-c tcp_keepalives_idle=4 -c tcp_keepalives_interval=2 "
                "-c tcp_keepalives_count=3 -c idle_session_timeout=0 "
                "-c lock_timeout=2000 -c statement_timeout=5000",
            },
        )
        self._conn: Connection | None = None
        self._pid: int | None = None  # the lock connection's backend, while leading
        self.epoch: int | None = None  # the lease's epoch this replica leads in
        self._renewed = 0.0  # monotonic time of the last renewal that succeeded
        self.lease_age: float | None = None  # a standby's last look at the leader's lease

        @event.listens_for(self.engine, "do_connect")
        def _name(_dialect: Any, _rec: Any, _args: Any, params: dict[str, Any]) -> None:
            params["application_name"] = self._application_name()

    def _application_name(self) -> str:
        url = self.advertise_url
        return url if len(url.encode()) <= APPLICATION_NAME_MAX else "gpuaas"

    def attach(self, store_engine: Engine) -> None:
        """Name the store's connections as the lock connection is named, so a successor
        can end them all (`pg_terminate_backend`) when it fences this replica."""

        @event.listens_for(store_engine, "do_connect")
        def _name(_dialect: Any, _rec: Any, _args: Any, params: dict[str, Any]) -> None:
            params["application_name"] = self._application_name()

        store_engine.dispose()  # connections opened before are unnamed

    def advertise(self, url: str) -> None:
        self.advertise_url = url
        if self._conn is not None:
            try:
                self._conn.execute(
                    text("SELECT set_config('application_name', :n, false)"),
                    {"n": self._application_name()},
                )
            except SQLAlchemyError as e:
                log.warning("leader election: cannot advertise %s: %s", url, describe(e))

    @property
    def leading(self) -> bool:
        return self._pid is not None

    def try_acquire(self) -> bool:
        if self._pid is not None:
            return self.still_held()
        try:
            conn = self.engine.connect()
        except SQLAlchemyError as e:
            log.debug("leader election: cannot connect: %s", describe(e))
            return False
        try:
            got = self._try_lock(conn)
            if not got and self._lease_expired(conn):
                got = self._fence_old_leader(conn)
            if not got:
                conn.close()
                return False
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            self.epoch = self._claim_lease(conn)
        except SQLAlchemyError as e:
            log.warning("leader election: %s", describe(e))
            conn.close()  # the session's end frees the lock, if it was taken
            return False
        self._conn, self._pid = conn, int(pid or 0)
        self._renewed = time.monotonic()
        log.warning("leader election: leading in epoch %d", self.epoch)
        return True

    def _try_lock(self, conn: Connection) -> bool:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
        return bool(got)

    def _lease_expired(self, conn: Connection) -> bool:
        """Whether the lease went unrenewed for LEASE_DURATION (a frozen leader)."""
        row = conn.execute(
            text(f"SELECT holder, {_NOW} - renewed FROM leader_lease WHERE id = 1")
        ).first()
        if row is None:
            self.lease_age = None
            return False
        self.lease_age = float(row[1])
        return self.lease_age > LEASE_DURATION

    def _fence_old_leader(self, conn: Connection) -> bool:
        """End every session of the lease's holder (its lock connection and its store
        connections, frozen transactions included), then take the lock it held."""
        holder = conn.execute(text("SELECT holder FROM leader_lease WHERE id = 1")).scalar()
        log.error(
            "leader election: the leader %s did not renew its lease for %.1f s: fencing it",
            holder,
            self.lease_age or 0.0,
        )
        conn.execute(
            text(
                "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a "
                "WHERE a.pid <> pg_backend_pid() AND (a.application_name = :holder OR a.pid IN "
                "(SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1))"
            ),
            {"holder": holder or "", "hi": self.key >> 32, "lo": self.key & 0xFFFFFFFF},
        )
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # the backends end asynchronously
            if self._try_lock(conn):
                return True
            time.sleep(0.1)
        return False

    def _claim_lease(self, conn: Connection) -> int:
        """Holding the lock: the lease is ours, in a new epoch (every write of an older
        epoch is refused from now on). Waits (lock_timeout) for a transaction of the old
        leader that still holds the lease row: what it commits comes before our restore."""
        epoch = conn.execute(
            text(
                "INSERT INTO leader_lease (id, holder, epoch, renewed) "
                f"VALUES (1, :me, 1, {_NOW}) ON CONFLICT (id) DO UPDATE SET "
                "holder = excluded.holder, epoch = leader_lease.epoch + 1, "
                "renewed = excluded.renewed RETURNING epoch"
            ),
            {"me": self._application_name()},
        ).scalar()
        return int(epoch or 0)

    def still_held(self) -> bool:
        """Renew the lease (the retry period). False once it is lost: taken in another
        epoch, or the lock connection is gone."""
        conn = self._conn
        if conn is None:
            return False
        try:
            renewed = conn.execute(
                text(f"UPDATE leader_lease SET renewed = {_NOW} WHERE id = 1 AND epoch = :e"),
                {"e": self.epoch},
            ).rowcount
        except SQLAlchemyError as e:
            log.warning("leader election: the lock connection failed: %s", describe(e))
            self._drop()
            return False
        if not renewed:
            log.error("leader election: another replica leads in a later epoch")
            self._drop()
            return False
        self._renewed = time.monotonic()
        return True

    def overdue(self) -> bool:
        """While leading: the lease could not be renewed for RENEW_DEADLINE."""
        return self._pid is not None and time.monotonic() - self._renewed > RENEW_DEADLINE

    def observe(self) -> float | None:
        """A standby: the age of the leader's lease (seconds), or None if unknown."""
        try:
            with self.engine.connect() as conn:
                self._lease_expired(conn)
        except SQLAlchemyError:
            self.lease_age = None
        return self.lease_age

    def current_leader(self) -> str | None:
        if self._pid is not None:
            return self.advertise_url
        try:
            with self.engine.connect() as conn:
                name = conn.execute(
                    text(
                        "SELECT a.application_name FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted "
                        "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1 "
                        "AND l.database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    ),
                    {"hi": self.key >> 32, "lo": self.key & 0xFFFFFFFF},
                ).scalar()
        except SQLAlchemyError:
            return None
        return str(name) if name and str(name).startswith("http") else None

    def fence(self, conn: Connection) -> None:
        """The in-transaction check: the lease's epoch is still ours. `FOR SHARE` holds
        the row until this transaction ends, so a successor's epoch bump comes after it."""
        epoch = self.epoch
        if self._pid is None or epoch is None:
            raise NotLeader(None)
        try:
            current = conn.execute(
                text("SELECT epoch FROM leader_lease WHERE id = 1 FOR SHARE")
            ).scalar()
        except SQLAlchemyError as e:
            raise StoreUnavailable(f"the store is unreachable: {describe(e)}") from None
        if current != epoch:
            log.error(
                "leader election: epoch %s is over (now %s): refusing to write", epoch, current
            )
            raise NotLeader(None)

    def _drop(self) -> None:
        conn, self._conn, self._pid = self._conn, None, None
        self.epoch = None
        if conn is not None:
            try:
                conn.close()
            except SQLAlchemyError:
                pass

    def release(self) -> None:
        self._drop()  # closing the session frees its advisory locks
        self.engine.dispose()


class Leadership:
    """Runs the election for one arbiter: lead (restore, decide) or follow (mirror)."""

    def __init__(self, arbiter: Any, election: Election, interval: float) -> None:
        self.arbiter = arbiter
        self.election = election
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._seen: int | None = None  # the last decision (seq) a standby relayed
        self._checks = 0

    def start_sync(self) -> bool:
        """At start-up, before serving: lead if nobody does. True if leading."""
        if self.election.try_acquire():
            log.info("leader election: this gateway leads")
            return True
        self.arbiter.follow(self.election.current_leader())
        self.arbiter.mirror_now()
        try:  # relay what the leader decides from now on
            self._seen = self._decisions_after(None)[0]
        except Exception as e:
            log.warning("standby: cannot read the decision log: %s", describe(e))
        log.info("leader election: standby; the leader is %s", self.arbiter.leader_url or "unknown")
        return False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._check()
            except Exception:
                log.exception("leader election check failed")

    async def _check(self) -> None:
        arbiter = self.arbiter
        if arbiter.leader:
            if not await asyncio.to_thread(self.election.still_held):
                log.error("leader election: leadership lost: this gateway is a standby now")
                arbiter.follow(None)
                await arbiter.refresh_mirror()
                self._seen = None
            return
        if await asyncio.to_thread(self.election.try_acquire):
            log.warning("leader election: this gateway takes over as the leader")
            # The old leader is gone: what it committed is final; relay the rest first.
            await self._relay(refresh=False)
            self._seen = None
            await arbiter.take_over()
            return
        arbiter.leader_url = await asyncio.to_thread(self.election.current_leader)
        self._checks += 1
        await self._relay(refresh=self._checks % FULL_REFRESH_EVERY == 0)

    def _decisions_after(self, seen: int | None) -> tuple[int, list[DecisionRow]]:
        store = self.arbiter.store
        with store.session() as s:
            if seen is None:  # start relaying from now, not from the beginning
                return int(s.scalar(select(func.max(DecisionRow.seq))) or 0), []
            rows = list(
                s.scalars(
                    select(DecisionRow)
                    .where(DecisionRow.seq > seen)
                    .order_by(DecisionRow.seq)
                    .limit(RELAY_BATCH)
                )
            )
        return (rows[-1].seq if rows else seen), rows

    async def _relay(self, *, refresh: bool) -> None:
        """A standby: refresh the mirror if the log moved, then publish what it logged."""
        arbiter = self.arbiter
        try:
            seq, rows = await arbiter.in_store(self._decisions_after, self._seen)
        except Exception as e:
            log.debug("standby: cannot read the decision log: %s", describe(e))
            await arbiter.refresh_mirror()  # says why reads are 503 now, if the store is gone
            return
        first = self._seen is None
        self._seen = seq
        if rows or refresh or first:
            await arbiter.refresh_mirror()
        for row in rows:
            publish_logged(arbiter, row)


def publish_logged(arbiter: Any, row: DecisionRow) -> None:
    """Publish a decision of the store's log on `arbiter`'s bus, as its leader did."""
    try:
        fields = json.loads(row.fields or "{}")
    except ValueError:
        fields = {}
    data: dict[str, Any] = {"t": row.t, "event": row.event}
    if row.request_id is not None:
        data["id"] = row.request_id
    data.update(fields)
    user = None
    if row.request_id:
        obj = arbiter.view(row.request_id)
        if obj is not None:
            data["request"], user = obj, obj["user"]
    arbiter.bus.publish(Event(row.event, data, user=user))


# --- a standby forwards changes to its leader ---------------------------------------------

# Set on a forwarded request: a standby never forwards one again (no loops when two
# replicas each think the other leads for an instant); it refuses it with 503.
FORWARDED = "X-Gpuaas-Forwarded"
_REQUEST_HEADERS = (
    "Authorization",
    "Cookie",
    "Content-Type",
    "X-XSRFToken",
    "Accept",
    "Idempotency-Key",
)
_ANSWER_HEADERS = ("Content-Type", "Location", "Retry-After", "Link")


class LeaderUnreachable(Exception):
    """A forwarded change was sent but not answered: it may or may not be recorded (502)."""


async def forward(handler: Any, body: bytes | None) -> None:
    """Send `handler`'s request to the leader and answer with the leader's answer.

    NotLeader (503, nothing changed) when there is no leader to send it to or it could
    not be sent; LeaderUnreachable (502) when it was sent and no answer came back.
    """
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    arbiter = handler.arbiter
    leader = arbiter.leader_url
    if leader is None or handler.request.headers.get(FORWARDED):
        raise NotLeader(leader)
    if getattr(arbiter, "leader_stale", False):
        # The leader has not renewed its lease: it may be frozen, and a change sent now
        # could sit unanswered in its socket. Not sent: nothing was changed.
        raise NotLeader(None)
    base = handler.settings.get("base_url", "/")
    path = handler.request.path[len(base) :] if handler.request.path.startswith(base) else ""
    url = leader + path + (f"?{handler.request.query}" if handler.request.query else "")
    headers = {
        k: handler.request.headers[k] for k in _REQUEST_HEADERS if k in handler.request.headers
    }
    headers[FORWARDED] = "1"
    try:
        resp = await AsyncHTTPClient().fetch(
            url,
            method=handler.request.method,
            body=body if handler.request.method in ("POST", "PUT") else None,
            headers=headers,
            raise_error=False,
            follow_redirects=False,
            allow_nonstandard_methods=True,
            connect_timeout=3,
            request_timeout=30,
        )
    except ConnectionRefusedError:
        raise NotLeader(leader) from None  # never reached the leader: nothing changed
    except HTTPClientError as e:
        if e.code == 599 and "while connecting" in str(e):  # never sent: nothing changed
            log.warning("forwarding %s %s: %s did not accept", handler.request.method, path, leader)
            raise NotLeader(leader) from None
        log.warning("forwarding %s %s to %s failed: %s", handler.request.method, path, leader, e)
        raise LeaderUnreachable(
            f"the leader ({leader}) did not answer, so this change may or may not have been "
            "recorded: look before sending it again"
        ) from None
    except OSError as e:
        log.warning("forwarding %s %s to %s failed: %s", handler.request.method, path, leader, e)
        raise LeaderUnreachable(
            f"the leader ({leader}) did not answer, so this change may or may not have been "
            "recorded: look before sending it again"
        ) from None
    handler.set_status(resp.code, resp.reason)
    for name in _ANSWER_HEADERS:
        if name in resp.headers:
            handler.set_header(name, resp.headers[name])
    handler.finish(resp.body or b"")
