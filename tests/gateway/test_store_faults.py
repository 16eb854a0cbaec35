"""The store is the truth, when it fails too: real gateway subprocesses, real failures.

Each test drives a gateway through one failure (an overflowing integer, a lone surrogate,
a full disk on a small tmpfs, a read-only filesystem, a write lock held by another
process, PostgreSQL stopped under load) and asserts, while it runs and after a `kill -9`
and a restart: nothing answered 201 is lost, nothing answered 4xx/5xx (but 422, which is
stored as rejected by design) is in the store, no device is held by a request nobody can
list, memory equals the store, no answer is a 500, and every SSE event is of a decision
the store holds.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gwutil import TOKENS, GatewayProcess, assert_memory_is_store, call, gateway_argv, store_rows
from helpers import fill, tmpfs_mounts
from helpers import wait_for as wait_until  # test_leader, test_metrics_leader: from here

from jupyter_gpuaas.gateway.store import CommitUnknown

pytestmark = pytest.mark.slow

_names = itertools.count()
UNKNOWN = CommitUnknown.public


class Ledger:
    """What the clients were told, per submission name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted: set[str] = set()  # ids answered 201
        self.refused: set[str] = set()  # names answered 4xx (not 422) or 5xx
        self.unknown: set[str] = set()  # names answered "may or may not have been recorded"
        self.statuses: dict[int, int] = {}
        self.unavailable: list[tuple[dict[str, Any], dict[str, str]]] = []

    def submit(self, url: str, who: str, body: dict[str, Any]) -> tuple[int, Any]:
        name = f"t-{next(_names)}"
        status, data, headers = call(url, "POST", "api/requests", {**body, "name": name}, who)
        self.record(status, data, headers, name)
        return status, data

    def record(self, status: int, data: Any, headers: dict[str, str], name: str = "") -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 201:
                self.accepted.add(data["id"])
            elif status == 503 and isinstance(data, dict) and data.get("error") == UNKNOWN:
                # The store went away during the COMMIT: it may hold it or not, and the
                # client was told exactly that (memory == store is still checked).
                self.unknown.add(name)
            elif status not in (0, 422) and name:
                self.refused.add(name)
            if status == 503:
                self.unavailable.append((data, headers))

    def check_answers(self) -> None:
        assert 500 not in self.statuses, self.statuses
        for body, headers in self.unavailable:
            assert isinstance(body, dict) and body["error"] and "field" in body, body
            assert int(headers["Retry-After"]) >= 1


class Events:
    """Every SSE event root hears, read on a thread until the stream ends."""

    def __init__(self, url: str) -> None:
        self.events: list[dict[str, Any]] = []
        req = urllib.request.Request(url + "api/events")
        req.add_header("Authorization", f"token {TOKENS['root']}")
        self.resp = urllib.request.urlopen(req, timeout=60)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        event = None
        try:
            for raw in self.resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event:
                    self.events.append({"event": event, **json.loads(line[6:])})
        except Exception:  # the gateway was killed: the stream ends
            pass

    def assert_all_committed(self, db_url: str) -> None:
        """Each event heard is a decision in the store's log (none for an uncommitted one)."""
        from jupyter_gpuaas.gateway.store import Store, make_engine

        store = Store(make_engine(db_url))
        try:
            logged = {(d.event, d.request_id) for d in store.decisions()}
        finally:
            store.close()
        heard = {(e["event"], e.get("id")) for e in self.events}
        assert heard, "no event heard at all"
        assert heard <= logged, f"events of uncommitted decisions: {sorted(heard - logged)[:5]}"


def restart_and_compare(
    spawn: Callable[..., GatewayProcess], proc: GatewayProcess, db_url: str, ledger: Ledger
) -> GatewayProcess:
    """kill -9, start again on the same store, and compare memory with the store."""
    assert_memory_is_store(proc.url, db_url, ledger.accepted, ledger.refused)
    proc.kill()
    again = spawn(db_url, port=int(proc.url.rsplit(":", 1)[1].strip("/")))
    assert_memory_is_store(again.url, db_url, ledger.accepted, ledger.refused)
    return again


# --- bad values: each fails alone ----------------------------------------------------------


BAD = [
    ({"tenant": "vision", "kind": "job", "gpus": 1, "priority": 2**63}, "priority"),
    ({"tenant": "vision", "kind": "job", "gpus": 2**63}, "gpus"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "priority": -(2**31)}, "priority"),
    ({"tenant": "\ud800", "kind": "job", "gpus": 1}, "tenant"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "flavor": "a100\ud800"}, "flavor"),
]


def test_bad_values_fail_alone_and_leave_memory_the_store(
    spawn_gateway: Callable[..., GatewayProcess], sqlite_url: str
) -> None:
    proc = spawn_gateway(sqlite_url)
    events = Events(proc.url)
    ledger = Ledger()
    # alice holds 3 of vision's a100; bob queues behind a full nlp share
    assert (
        ledger.submit(proc.url, "alice", {"tenant": "vision", "kind": "kernel", "gpus": 3})[0]
        == 201
    )
    status, held = ledger.submit(proc.url, "bob", {"tenant": "nlp", "kind": "job", "gpus": 1})
    assert status == 201 and held["state"] == "admitted"
    status, queued = ledger.submit(proc.url, "bob", {"tenant": "nlp", "kind": "job", "gpus": 2})
    assert status == 201 and queued["state"] == "queued"

    # Bad and good submissions in the same loop turns: the good ones are answered 201.
    results: list[tuple[str, int, Any, str | None]] = []

    def bad(who: str, body: dict[str, Any], field: str) -> None:
        name = f"t-{next(_names)}"
        # the lone surrogate as JSON sends it: an escape, valid JSON, invalid Unicode
        status, data, headers = call(proc.url, "POST", "api/requests", {**body, "name": name}, who)
        ledger.record(status, data, headers, name)
        results.append(("bad", status, data, field))

    def good(who: str, tenant: str) -> None:
        status, data = ledger.submit(proc.url, who, {"tenant": tenant, "kind": "job", "gpus": 1})
        results.append(("good", status, data, None))

    threads = []
    for body, field in BAD:
        threads.append(threading.Thread(target=bad, args=("eve", body, field)))  # not in vision
        threads.append(threading.Thread(target=bad, args=("alice", body, field)))
        threads.append(threading.Thread(target=good, args=("bob", "nlp")))
    threads.append(
        threading.Thread(
            target=bad,
            args=("bob", {"tenant": "vision", "kind": "job", "gpus": 1, "name": "x"}, "name"),
        )
    )
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for kind, status, data, field in results:
        if kind == "good":
            assert status == 201, data
        elif data.get("field") == "tenant" and status == 403:
            continue  # eve/bob charging vision: refused before anything else
        else:
            assert status == 400, data
            assert data["field"] == field and field in data["error"], data
    ledger.check_answers()

    # Someone else's request, cancelled by an admin: works (nothing stuck in memory).
    status, done, _ = call(proc.url, "DELETE", f"api/requests/{held['id']}", who="root")
    assert status == 200 and done["state"] == "finished", done
    # bob's next request in nlp's queue took the released GPU: in memory and in the store
    rows = assert_memory_is_store(proc.url, sqlite_url, ledger.accepted, ledger.refused)
    assert rows[done["id"]].state == "finished"
    # A name by the rule, a path that is not one, NUL, 300 characters: 400, no tenant.
    for name in ("..%2Fetc", "%3Cscript%3E", "a" * 300, "nul%00x", "Vision"):
        status, data, _ = call(
            proc.url, "PUT", f"api/tenants/{name}", {"quota": {"a100": 1}}, "root"
        )
        assert status == 400 and data["field"] == "name", (name, data)
    status, data, _ = call(
        proc.url, "PUT", "api/tenants/ok", {"quota": {"a100": 1}, "cohort": "x" * 100}, "root"
    )
    assert status == 400 and data["field"] == "cohort", data
    tenants = call(proc.url, "GET", "api/tenants", who="root")[1]["tenants"]
    assert {t["name"] for t in tenants} == {"vision", "nlp"}
    time.sleep(0.5)  # let the last events reach the stream
    proc = restart_and_compare(spawn_gateway, proc, sqlite_url, ledger)
    events.assert_all_committed(sqlite_url)


# --- a full disk and a read-only filesystem --------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount small tmpfs filesystems (root only; skipped elsewhere)."""
    yield from tmpfs_mounts(tmp_path)


def test_full_disk_answers_503_and_memory_stays_the_store(
    spawn_gateway: Callable[..., GatewayProcess], tmpfs: Callable[[str], Path]
) -> None:
    disk = tmpfs("4m")
    db_url = f"sqlite:///{disk / 'gpuaas.sqlite'}"
    # carol queues until the disk is full: no per-user limit on the queue
    proc = spawn_gateway(db_url, "--lease-ttl=600", "--GatewayApp.max_queued_per_user=0")
    events = Events(proc.url)
    ledger = Ledger()
    status, held = ledger.submit(
        proc.url, "alice", {"tenant": "vision", "kind": "kernel", "gpus": 4}
    )
    assert status == 201 and held["state"] == "admitted"
    status, waiting = ledger.submit(proc.url, "bob", {"tenant": "nlp", "kind": "job", "gpus": 2})
    assert status == 201 and waiting["state"] == "queued"
    filler = fill(disk)
    # Until the WAL needs a page the disk no longer has, writes go on; then 503s.
    for _ in range(400):
        status, _ = ledger.submit(proc.url, "carol", {"tenant": "vision", "kind": "job", "gpus": 1})
        if status == 503:
            break
    assert ledger.statuses.get(503), ledger.statuses
    # The failed write checkpointed the WAL, giving its space back: take that too.
    time.sleep(0.5)
    again = fill(disk, "filler2")
    # Releasing the GPU cannot be recorded: not released, and bob is not admitted (no event).
    status, body, headers = call(proc.url, "DELETE", f"api/requests/{held['id']}", who="alice")
    ledger.record(status, body, headers)
    assert status == 503, body
    ledger.check_answers()
    filler.unlink()  # space again: the gateway goes on where the store is
    again.unlink()
    wait_until(lambda: call(proc.url, "GET", "api/health", who=None)[0] == 200, 10, "healthy again")
    assert (
        call(proc.url, "GET", f"api/requests/{held['id']}", who="alice")[1]["state"] == "admitted"
    )
    assert call(proc.url, "GET", f"api/requests/{waiting['id']}", who="bob")[1]["state"] == "queued"
    status, done, _ = call(proc.url, "DELETE", f"api/requests/{held['id']}", who="alice")
    assert status == 200, done
    assert (
        call(proc.url, "GET", f"api/requests/{waiting['id']}", who="bob")[1]["state"] == "admitted"
    )
    time.sleep(0.5)
    proc = restart_and_compare(spawn_gateway, proc, db_url, ledger)
    events.assert_all_committed(db_url)
    admits = [e for e in events.events if e["event"] == "admit" and e.get("id") == waiting["id"]]
    assert len(admits) == 1  # heard once: when it was committed, not when the disk was full


def test_read_only_store_is_refused_at_start(
    spawn_gateway: Callable[..., GatewayProcess], tmpfs: Callable[[str], Path], tmp_path: Path
) -> None:
    disk = tmpfs("4m")
    db_url = f"sqlite:///{disk / 'gpuaas.sqlite'}"
    proc = spawn_gateway(db_url)
    assert (
        call(proc.url, "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1})[0]
        == 201
    )
    proc.stop()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    argv = gateway_argv(tmp_path, db_url, 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("jupyter-gpuaas gateway: --db-url: cannot open the store"), r.stderr
    assert "Traceback" not in r.stderr


# --- a write lock held by another process -----------------------------------------------------


HOLD = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
c.execute("COMMIT")
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_held_sqlite_lock_waits_off_the_loop_then_503(
    spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    path = tmp_path / "gpuaas.sqlite"
    db_url = f"sqlite:///{path}"
    proc = spawn_gateway(db_url, "--GatewayApp.store_lock_timeout=1.5")
    ledger = Ledger()
    body = {"tenant": "vision", "kind": "job", "gpus": 1}
    assert ledger.submit(proc.url, "alice", body)[0] == 201

    # A short lock: the submission waits for it (queued, not decided) and is accepted.
    holder = hold_lock(path, 0.5)
    assert ledger.submit(proc.url, "alice", body)[0] == 201
    holder.wait(10)

    # A long lock: the submission is answered 503; meanwhile the loop serves others.
    holder = hold_lock(path, 4)
    answer: list[int] = []
    waiter = threading.Thread(
        target=lambda: answer.append(
            ledger.submit(proc.url, "bob", {"tenant": "nlp", "kind": "job", "gpus": 1})[0]
        )
    )
    waiter.start()
    time.sleep(0.2)
    status, me, _ = call(proc.url, "GET", "api/me", who="carol")
    assert status == 200 and me["name"] == "carol"
    assert waiter.is_alive(), "the submission should still be waiting for the lock"
    health = call(proc.url, "GET", "api/health", who=None)
    assert health[0] == 200 and health[1]["store"] == "ok", health  # WAL: reads go on
    waiter.join(10)
    assert answer == [503]
    ledger.check_answers()
    holder.wait(10)
    assert ledger.submit(proc.url, "bob", {"tenant": "nlp", "kind": "job", "gpus": 1})[0] == 201
    restart_and_compare(spawn_gateway, proc, db_url, ledger)


# --- PostgreSQL stopped under load ------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL server of this test alone (it is stopped and started again)."""
    try:
        from pg import PostgresServer, PostgresUnavailable
    except ImportError:
        from tests.pg import PostgresServer, PostgresUnavailable
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    server.start()
    yield server
    server.stop()


def pg_ctl(server: Any, action: str) -> None:
    if action == "stop":
        r = server._run("pg_ctl", "-D", str(server.data), "-m", "immediate", "-w", "stop")
    else:
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {server.port} -k {server.dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        r = server._run(
            "pg_ctl", "-D", str(server.data), "-l", str(server.log), "-w", "-o", opts, "start"
        )
    assert r.returncode == 0, r.stderr


def test_postgres_stopped_under_load(
    spawn_gateway: Callable[..., GatewayProcess], own_postgres: Any
) -> None:
    db_url = own_postgres.url
    proc = spawn_gateway(db_url, "--lease-ttl=600")
    events = Events(proc.url)
    ledger = Ledger()
    stop = threading.Event()

    def load(who: str, tenant: str) -> None:
        mine: list[str] = []
        while not stop.is_set():
            if len(mine) > 2:
                rid = mine.pop(0)
                status, data, headers = call(proc.url, "DELETE", f"api/requests/{rid}", who=who)
                ledger.record(status, data, headers)
                if status == 503:
                    mine.append(rid)
            else:
                status, data = ledger.submit(
                    proc.url, who, {"tenant": tenant, "kind": "job", "gpus": 1}
                )
                if status == 201:
                    mine.append(data["id"])
            time.sleep(0.01)

    workers = [
        threading.Thread(target=load, args=(who, tenant))
        for who, tenant in (("alice", "vision"), ("bob", "nlp"), ("carol", "vision"))
    ]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: ledger.statuses.get(201, 0) >= 5, 20, "201s before PostgreSQL stops")
        before = dict(ledger.statuses)
        pg_ctl(own_postgres, "stop")
        wait_until(lambda: ledger.statuses.get(503, 0) >= 5, 20, "503s while PostgreSQL is down")
        health = call(proc.url, "GET", "api/health", who=None)
        assert health[0] == 503 and health[1]["status"] == "unavailable", health
        pg_ctl(own_postgres, "start")
        ok = ledger.statuses.get(201, 0)
        wait_until(
            lambda: ledger.statuses.get(201, 0) > ok + 5, 30, "201s after PostgreSQL is back"
        )
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    assert before.get(201), before
    ledger.check_answers()
    assert set(ledger.statuses) <= {200, 201, 409, 503}, ledger.statuses
    time.sleep(0.5)
    proc = restart_and_compare(spawn_gateway, proc, db_url, ledger)
    events.assert_all_committed(db_url)
    assert store_rows(db_url)


# --- one operation's rows refused after the core took them (in-process) -----------------------


@pytest.mark.asyncio
async def test_rows_refused_after_the_core_fail_that_operation_alone(
    make_gateway: Any, sqlite_url: str
) -> None:
    """The edge stops bad input first; this is the arbiter's own net behind it. An
    operation whose staged rows the store cannot hold is answered with that RowError, the
    operations before it in the group are committed, the core is rebuilt from the store,
    and the operations after it run on the rebuilt core."""
    import asyncio

    from jupyter_gpuaas.admission.model import Decision
    from jupyter_gpuaas.gateway.store import RowError

    gw = await make_gateway(sqlite_url)
    arb = gw.arbiter

    def bad_op() -> None:
        now = time.time()
        arb.commit([Decision(now, "x" * 40, None)], now)  # event: String(32)

    async def submit(who: str, tenant: str) -> Any:
        _, obj = await arb.submit(tenant=tenant, user=who, kind="job", gpus=1)
        return obj

    first = asyncio.ensure_future(submit("alice", "vision"))
    bad = asyncio.ensure_future(arb.run(bad_op))
    after = asyncio.ensure_future(submit("bob", "nlp"))
    results = await asyncio.gather(first, bad, after, return_exceptions=True)
    assert isinstance(results[1], RowError) and results[1].field == "event", results[1]
    assert results[0]["state"] == "admitted" and results[2]["state"] == "admitted", results
    # bypassing the handler: the new request's row is checked before the core sees it
    with pytest.raises(RowError) as e:
        await arb.submit(tenant="vision", user="alice", kind="job", gpus=1, priority=2**40)
    assert e.value.field == "priority"
    rows = store_rows(sqlite_url)
    assert set(rows) == {results[0]["id"], results[2]["id"]}
    assert set(arb.requests) == set(rows)
    _, devices = await gw.raw("GET", "api/devices", who="root")
    held = {d["holder"]["id"] for d in devices["devices"] if d["holder"]}
    assert held == set(rows)


@pytest.mark.asyncio
async def test_unreadable_store_after_a_failed_write_drops_memory_until_it_is_back(
    make_gateway: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection (the real failures are above): a group write fails and the store
    cannot be read back either. Memory is dropped, every route answers 503 (JSON,
    Retry-After) and health says why; once the store answers, the core is rebuilt and
    nothing of the failed group exists anywhere."""
    import asyncio

    from sqlalchemy.exc import OperationalError

    from jupyter_gpuaas.gateway import store as store_mod

    gw = await make_gateway(sqlite_url)
    job = {"tenant": "vision", "kind": "job", "gpus": 4}
    status, held = await gw.raw("POST", "api/requests", job)
    assert status == 201 and held["state"] == "admitted"
    status, queued = await gw.raw(
        "POST", "api/requests", {"tenant": "nlp", "kind": "job", "gpus": 1}, "bob"
    )
    assert status == 201 and queued["state"] == "queued"

    def boom(*_: Any, **__: Any) -> Any:
        raise OperationalError("SELECT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(store_mod.WriteTx, "write", boom)
    monkeypatch.setattr(store_mod.Store, "live_requests", boom)
    status, body = await gw.raw("DELETE", f"api/requests/{held['id']}")
    assert status == 503 and "nothing was changed" in body["error"], body
    assert "disk I/O" not in body["error"]  # the database's words stay in the log
    assert gw.arbiter.broken is not None and gw.arbiter.requests == {}
    for method, path in (("GET", "api/requests"), ("GET", "api/devices"), ("POST", "api/requests")):
        status, body = await gw.raw(method, path, job if method == "POST" else None)
        assert status == 503 and body["error"], (method, path, body)
    status, health = await gw.raw("GET", "api/health", who=None)
    assert status == 503 and health == {
        "status": "unavailable",
        "store": "failing",
        "leader": True,
    }
    assert "disk I/O error" in gw.arbiter.broken
    monkeypatch.undo()
    for _ in range(50):  # rebuilt by the admission loop within about a second
        if (await gw.raw("GET", "api/health", who=None))[0] == 200:
            break
        await asyncio.sleep(0.1)
    status, again = await gw.raw("GET", f"api/requests/{held['id']}")
    assert status == 200 and again["state"] == "admitted", again  # the release never was
    status, still = await gw.raw("GET", f"api/requests/{queued['id']}", who="bob")
    assert status == 200 and still["state"] == "queued", still
    rows = store_rows(sqlite_url)
    assert set(rows) == set(gw.arbiter.requests) == {held["id"], queued["id"]}


def test_the_history_rebuilt_at_a_restart_holds_a_resumed_session_from_its_first_admission(
    tmp_path: Path,
) -> None:
    """The wait estimates' history after a restart (`Store.ended_holds`) counts holds as the
    live gateway does (admission/estimate.py `hold_start`): a kernel culled twice, parked and
    resumed each time, held its quota from its first admission to its end, not from its
    last resume; one never culled, from its admission; one whose reservation expired and
    that came back, from the start of its last hold (`held_since`), not its first
    admission. (Rows without `held_since`, written before migration 0006, are read by
    the old rule: the first three.)"""
    from jupyter_gpuaas.admission.model import Request, State
    from jupyter_gpuaas.gateway.rows import Batch
    from jupyter_gpuaas.gateway.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'gpuaas.db'}")
    try:
        resumed = Request("r-resumed", "vision", "alice", "kernel", 1, 0.0)
        resumed.state, resumed.culls = State.FINISHED, 2
        resumed.first_admit, resumed.admit_time = 100.0, 1000.0
        plain = Request("r-plain", "vision", "bob", "kernel", 1, 0.0)
        plain.state, plain.first_admit, plain.admit_time = State.FINISHED, 500.0, 500.0
        gone = Request("r-gone", "vision", "cy", "kernel", 1, 0.0)
        gone.state, gone.culls, gone.first_admit, gone.admit_time = State.CULLED, 1, 0.0, 0.0
        back = Request("r-back", "vision", "dan", "kernel", 1, 0.0, culls=1, first_admit=0.0)
        back.state, back.admit_time, back.held_since = State.FINISHED, 1200.0, 1200.0
        extra = {"name": None, "created": 0.0}
        rows = [(r, dict(extra)) for r in (resumed, plain, gone, back)]
        store.write(Batch(rows, []), 1600.0)
        ended = store.ended_holds()
    finally:
        store.close()
    assert {user: held for _, user, held, _, _, _ in ended} == {
        "alice": 1500.0, "bob": 1100.0, "cy": 1600.0, "dan": 400.0,
    }  # fmt: skip
    # Whether the user came back after the culls (the estimates' `History.comes_back`):
    # alice did, twice; cy's reservation expired.
    assert {user: (culls, gave_up) for _, user, _, culls, gave_up, _ in ended} == {
        "alice": (2, False), "bob": (0, False), "cy": (1, True), "dan": (1, False),
    }  # fmt: skip


def test_the_history_rebuilt_at_a_restart_leaves_out_preempted_grants(tmp_path: Path) -> None:
    """A grant the core preempted is no sample of how long grants are held (the live rule,
    arbiter `_account`): its hold was cut short, and a forward run makes its own
    preemptions. A finished one is."""
    from jupyter_gpuaas.admission.model import Request, State
    from jupyter_gpuaas.gateway.rows import Batch
    from jupyter_gpuaas.gateway.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'gpuaas.db'}")
    try:
        cut = Request("r-cut", "vision", "alice", "kernel", 1, 0.0)
        cut.state, cut.first_admit, cut.admit_time = State.PREEMPTED, 100.0, 100.0
        done = Request("r-done", "vision", "bob", "kernel", 1, 0.0)
        done.state, done.first_admit, done.admit_time = State.FINISHED, 500.0, 500.0
        extra = {"name": None, "created": 0.0}
        store.write(Batch([(cut, dict(extra)), (done, dict(extra))], []), 1600.0)
        ended = store.ended_holds()
    finally:
        store.close()
    assert [(user, held) for _, user, held, _, _, _ in ended] == [("bob", 1100.0)]
