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

Who leads is found in `pg_locks` joined with `pg_stat_activity`: the leader sets its
lock connection's `application_name` to its advertised URL.

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
                "-c tcp_keepalives_count=3 -c idle_session_timeout=0",
            },
        )
        self._conn: Connection | None = None
        self._pid: int | None = None  # the lock connection's backend, while leading

        @event.listens_for(self.engine, "do_connect")
        def _name(_dialect: Any, _rec: Any, _args: Any, params: dict[str, Any]) -> None:
            params["application_name"] = self._application_name()

    def _application_name(self) -> str:
        url = self.advertise_url
        return url if len(url.encode()) <= APPLICATION_NAME_MAX else "gpuaas"

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
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        except SQLAlchemyError as e:
            log.debug("leader election: %s", describe(e))
            conn.close()
            return False
        if not got:
            conn.close()
            return False
        self._conn, self._pid = conn, int(pid or 0)
        return True

    def still_held(self) -> bool:
        conn = self._conn
        if conn is None:
            return False
        try:
            conn.execute(text("SELECT 1"))
            return True
        except SQLAlchemyError as e:
            log.warning("leader election: the lock connection failed: %s", describe(e))
            self._drop()
            return False

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
        pid = self._pid
        if pid is None:
            raise NotLeader(None)
        try:
            held = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND classid = :hi AND objid = :lo AND objsubid = 1 AND pid = :pid"
                ),
                {"hi": self.key >> 32, "lo": self.key & 0xFFFFFFFF, "pid": pid},
            ).scalar()
        except SQLAlchemyError as e:
            raise StoreUnavailable(f"the store is unreachable: {describe(e)}") from None
        if not held:
            log.error("leader election: the lock is no longer held: refusing to write")
            raise NotLeader(None)

    def _drop(self) -> None:
        conn, self._conn, self._pid = self._conn, None, None
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
                self._seen = None
            return
        if await asyncio.to_thread(self.election.try_acquire):
            log.warning("leader election: this gateway takes over as the leader")
            # The old leader is gone: what it committed is final; relay the rest first.
            await self._relay(refresh=False)
            self._seen = None
            arbiter.take_over()
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
            seq, rows = await asyncio.to_thread(self._decisions_after, self._seen)
        except Exception as e:
            log.debug("standby: cannot read the decision log: %s", describe(e))
            arbiter.refresh_mirror()  # says why reads are 503 now, if the store is gone
            return
        first = self._seen is None
        self._seen = seq
        if rows or refresh or first:
            arbiter.refresh_mirror()
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
_REQUEST_HEADERS = ("Authorization", "Cookie", "Content-Type", "X-XSRFToken", "Accept")
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
    except (OSError, HTTPClientError) as e:
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
