"""The driver's loops and its group commit: how the arbiter runs (see arbiter.py).

Group commit. Operations (submit, cancel, heartbeat, a quota change, an admission step)
are queued and run together by one cycle: it takes the store's write lock, runs every
queued operation against the core in arrival order (each staging a copy of its batch),
writes the whole group in ONE transaction, and once that committed announces every batch
in order and answers every operation. Under load one commit (one fsync) covers every
request that arrived while the previous group was being written.

The store can hang (a frozen PostgreSQL, a disk that stopped answering): store work never
runs on the event loop. Each call goes to a small pool of store threads and is awaited
with a deadline (`store_timeout`); past it the operation is answered 503 with Retry-After
and the thread is abandoned (a write it has not committed yet is rolled back when the
thread wakes, so "nothing was changed" stays true). While a group's write is in flight
the core holds decisions the store has not committed: reads wait for it (`settled`), so
memory is never seen ahead of the store. `api/health` asks the store with its own short
deadline and says `ok`, `failing` (the store answers with an error: unreachable, full) or
`unresponsive` (it does not answer in time).

Failures (the store is the truth). A cycle first takes the store's write lock
(`Store.begin_write`): when another process holds it, or the database is unreachable, the
cycle touches nothing and is retried shortly without blocking the loop (answering 503
once `lock_timeout` has passed). Each operation's rows are checked on their own
(`check_snapshot`, and the new request's row before the core sees it): a bad one fails
alone with a 400, the batches before it are committed, and the core is rebuilt from the
store before the next operation runs. When the group write itself fails (a full disk, a
server gone mid-transaction, no answer by the deadline), every operation of the group is
answered 503 and the core is rebuilt from the store (`_rebuild`) before anything else is
answered; while the store cannot be read, the arbiter is `broken`: memory is dropped and
every route answers 503 until a rebuild succeeds. Any decision kind staged through
`commit` gets all of this.

Stalls. Time during which the gateway could not act never counts against a holder. A
probe on the loop notices a gap (the process was stopped, or the loop was blocked: its
callbacks ran late by more than `STALL_MIN` seconds), and a store that did not answer is
a gap from its first failure to the next write that succeeds. Before the next group runs
anything, every live lease is extended by the gaps (`AdmissionCore.extend_leases`, as
etcd's lessor does when it becomes able to act again) and the extended leases are
written with that group: a holder that heartbeat on time keeps its grant, and one that
really died still loses it within one TTL of the gateway acting again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import History

from .arbiter_state import ArbiterState
from .events import Event
from .leader import NotLeader
from .store import (
    CommitUnknown,
    RowError,
    Snapshot,
    StoreBusy,
    StoreUnavailable,
    StoreUnresponsive,
    WriteTx,
    check_snapshot,
    describe,
)
from .validate import InputError

log = logging.getLogger("jupyter_gpuaas.gateway")


class Conflict(Exception):
    """The request is in a state where the operation makes no sense (HTTP 409)."""


class Duplicate(Exception):
    """A submission whose Idempotency-Key this user already used: `request` is the API
    object of the request that key created (HTTP 200, nothing new)."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request.get("id"))
        self.request = request


# What an operation may raise having decided nothing (its answer stands as is). Anything
# else may have left the core half-changed: the core is rebuilt from the store.
_CLEAN_ERRORS = (Conflict, SpecError, InputError, Duplicate)

T = TypeVar("T")

# The loop's stall probe runs every STALL_PROBE seconds; a gap longer than STALL_MIN
# between two of its observations is time the gateway could not act.
STALL_PROBE = 0.25
STALL_MIN = 1.0
# How long `api/health` waits for the store's answer.
HEALTH_DEADLINE = 0.8


class _Abandoned(Exception):
    """The loop stopped waiting for this store call: roll back, never commit."""


@dataclass
class _Flight:
    """One store call the loop waits for with a deadline. `abandoned` (set by the loop
    when the deadline passed) and `committing` (set by the thread just before COMMIT) are
    decided under `lock`, so a write is either rolled back or known to be committing."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    committing: bool = False

    def abandon(self) -> bool:
        """Stop waiting; True if the COMMIT was already sent (the outcome is unknown)."""
        with self.lock:
            self.abandoned = True
            return self.committing

    def check(self) -> None:
        with self.lock:
            if self.abandoned:
                raise _Abandoned("the gateway stopped waiting for the store")


def _wrap(fut: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """An asyncio future of a store thread's future; its exception always retrieved (the
    loop may stop waiting for it)."""
    waited = asyncio.wrap_future(fut)
    waited.add_done_callback(lambda f: f.cancelled() or f.exception())
    return waited


def _begin_in(store: Any, flight: _Flight) -> WriteTx:
    """begin_write in a store thread; rolled back at once if the loop gave up waiting."""
    tx: WriteTx = store.begin_write()
    try:
        flight.check()
    except _Abandoned:
        tx.rollback()
        raise
    return tx


def _commit_in(tx: WriteTx, snaps: list[Snapshot], flight: _Flight) -> None:
    """Write and commit in a store thread, unless the loop gave up before the COMMIT."""
    try:
        tx.write(snaps)
        with flight.lock:
            if flight.abandoned:
                raise _Abandoned("the gateway stopped waiting for the store")
            flight.committing = True
        tx.commit()
    except BaseException:
        tx.rollback()
        raise


@dataclass
class _Staged:
    """One decided batch, waiting for its group's commit before it is announced."""

    snap: Snapshot
    events: list[Event]
    accounts: list[Callable[[], None]]
    nodes_added: list[tuple[str, str, int]]
    nodes_removed: list[str]
    ended: list[str]


@dataclass
class _Op:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    outcome: tuple[bool, Any] = (False, None)  # (ok, value or exception)


@dataclass
class _Group:
    ops: list[_Op] = field(default_factory=list)
    staged: list[_Staged] = field(default_factory=list)


class Loops(ArbiterState):
    """The loops and the group commit of `Arbiter` (mixed into it: the state they use is
    the arbiter's, set in `Arbiter.__init__`)."""

    # --- loops ----------------------------------------------------------------------------

    async def _admission_loop(self) -> None:
        """Wake at the core's next deadline (or every `tick`) and step it."""
        while True:
            try:
                await self._run(self._step)
            except StoreUnavailable as e:
                log.debug("admission step not run: %s", e.message)
            except Exception:
                log.exception("admission step failed")
            await self._maybe_prune()
            # A standby's mirror has deadlines only the leader acts on: no busy wake-ups.
            deadline = self.engine.next_deadline() if self.leader else None
            delay = self.tick
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.time()))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay + 0.001)
            except asyncio.TimeoutError:
                pass

    def _step(self) -> None:
        now = time.time()
        self.commit(self.engine.step(now), now)

    async def _maybe_prune(self) -> None:
        """History retention: delete ended and rejected rows older than `retention`, a
        batch at a time (each a short transaction that never waits for a lock)."""
        if self.retention <= 0 or self.broken is not None or time.monotonic() < self._next_prune:
            return
        if not self.leader:
            return
        try:
            gone = await self.in_store(self.store.prune, time.time() - self.retention)
            if self.store.dialect == "sqlite":  # freed pages and the WAL: usable space
                await self.in_store(self.store.checkpoint)
        except StoreUnavailable as e:
            log.debug("pruning postponed: %s", e.message)
            gone = 0
        except Exception as e:
            log.warning("pruning the history failed: %s", describe(e))
            gone = 0
        if gone:
            log.info("pruned %d ended requests older than the retention", gone)
        # A full batch: more are due, soon; otherwise look again in a while (a minute, or
        # a tenth of the retention when that is shorter).
        pause = 1.0 if gone >= 1000 else min(60.0, max(1.0, self.retention / 10))
        self._next_prune = time.monotonic() + pause

    async def _sampling_loop(self) -> None:
        while True:
            try:
                loop = asyncio.get_running_loop()
                self.samples = await loop.run_in_executor(None, self.inventory.sample)
            except Exception:
                log.exception("device sampling failed")
            await asyncio.sleep(self.sample_interval)

    # --- group commit ---------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run `fn` (which calls the core and `commit`) in the next cycle; its value once
        everything it staged is committed and announced. Its exception as is."""
        if not self.leader:
            raise NotLeader(self.leader_url)
        op = _Op(fn, asyncio.get_running_loop().create_future())
        self._ops.append(op)
        self._schedule_cycle()
        result: T = await op.future
        return result

    def _schedule_cycle(self) -> None:
        # One task runs cycles while operations are queued; those that arrive while a
        # group is being written form the next group.
        if self._cycler is None:
            self._cycler = asyncio.get_running_loop().create_task(self._cycles())

    async def _cycles(self) -> None:
        try:
            while self._ops:
                if await self._cycle():
                    await asyncio.sleep(0.05)  # the lock is held elsewhere: try again
        finally:
            self._cycler = None

    # --- the store, off the loop, with deadlines -------------------------------------------

    async def in_store(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """`fn(*args)` in a store thread, awaited at most `timeout` (`store_timeout`)
        seconds: StoreUnresponsive past it. The store's state for `api/health` follows."""
        return await self._await_store(
            self._store_pool.submit(fn, *args), timeout or self.store_timeout, None
        )

    async def _await_store(
        self, fut: concurrent.futures.Future[T], timeout: float, flight: _Flight | None
    ) -> T:
        started = time.monotonic()
        fut.add_done_callback(self._store_returned)
        waited = _wrap(fut)
        try:
            # asyncio.wait, not wait_for: wait_for (3.11) swallows a cancellation that
            # arrives as the call ends, and a stopping gateway would wait for that task.
            done, _ = await asyncio.wait({waited}, timeout=timeout)
            if not done:
                raise asyncio.TimeoutError
            result = waited.result()
        except asyncio.TimeoutError:
            self._hung.add(fut)  # past its deadline: the store counts as unresponsive
            committing = flight.abandon() if flight is not None else False
            self._mark_store("unresponsive", f"no answer in {timeout:g} s")
            if committing:
                raise CommitUnknown(
                    f"the store did not answer the commit within {timeout:g} s"
                ) from None
            raise StoreUnresponsive(
                f"the store did not answer within {timeout:g} s", retry_after=2
            ) from None
        except (StoreBusy, NotLeader):
            raise  # the store answered: locked elsewhere, or another replica leads
        except StoreUnavailable as e:
            self._mark_store("failing", e.message)
            raise
        except _Abandoned:
            raise
        except Exception as e:
            self._mark_store("failing", describe(e))
            raise
        self._mark_store("ok", f"answered in {time.monotonic() - started:.3f} s")
        return result

    def _store_returned(self, fut: concurrent.futures.Future[Any]) -> None:
        """A store call ended (in its thread): one that the loop gave up on may end much
        later; its error was already answered, so it is only retrieved here."""
        self._hung.discard(fut)
        if not fut.cancelled():
            fut.exception()

    def _mark_store(self, state: str, why: str) -> None:
        if state == "ok":
            if self._hung and any(not f.done() for f in self._hung):
                return  # an older call is still stuck in the store
            if self._store_down_since is not None:
                # The store answers again: the time it did not is a gap for the leases.
                self._gap += time.monotonic() - self._store_down_since
                self._store_down_since = None
        elif self._store_down_since is None:
            self._store_down_since = time.monotonic()
        if state != self.store_state:
            log.warning("the store is %s now (%s)", state, why)
        self.store_state = state

    async def store_health(self) -> str:
        """`ok`, `failing` or `unresponsive`, within HEALTH_DEADLINE seconds.

        The store is asked (a query; after a failed write, a write) by one probe at a
        time; a probe still running past the deadline means the store does not answer."""
        probe = self._probe
        if probe is None or probe.done():
            write = self.store_state != "ok"
            fn = self.store.check_writable if write else self.store.ping
            probe = self._probe = self._health_pool.submit(fn)
            self._probe_writes = write
            probe.add_done_callback(self._store_returned)
        writes = self._probe_writes
        failed = False
        waited = _wrap(probe)
        done, _ = await asyncio.wait({waited}, timeout=HEALTH_DEADLINE)
        if not done:
            return "unresponsive"
        if waited.exception() is not None:
            failed = True
        # A call still stuck in the store past its deadline: it does not answer (new
        # connections may be refused meanwhile, once a frozen server's backlog is full).
        if self._hung and any(not f.done() for f in self._hung):
            return "unresponsive"
        if failed:
            return "failing"
        if writes:  # it took a write: the store records decisions again
            self._mark_store("ok", "a health probe could write")
        elif self.store_state == "failing":
            return "failing"  # it answers reads; the last write failed
        return "ok"

    async def settled(self) -> None:
        """Return once no group's write is in flight (reads never see memory ahead of the
        store); StoreUnresponsive when that takes longer than `store_timeout`."""
        if self._settled.is_set():
            return
        try:
            await asyncio.wait_for(self._settled.wait(), self.store_timeout)
        except asyncio.TimeoutError:
            raise StoreUnresponsive("a write to the store is still in flight") from None

    def read_now(self, fn: Callable[..., T], *args: Any) -> T:
        """A store read for a synchronous caller on the loop, bounded: the loop waits at
        most half a second (StoreUnresponsive), never for a store that does not answer."""
        if self.store_state == "unresponsive":
            raise StoreUnresponsive("the store does not answer")
        fut = self._store_pool.submit(fn, *args)
        fut.add_done_callback(self._store_returned)
        try:
            return fut.result(timeout=0.5)
        except concurrent.futures.TimeoutError:
            self._hung.add(fut)
            self._mark_store("unresponsive", "a read got no answer in 0.5 s")
            raise StoreUnresponsive("the store did not answer within 0.5 s") from None

    # --- stalls -------------------------------------------------------------------------

    def _observe(self) -> None:
        """Note a gap since the last observation (the process or its loop stalled)."""
        now = time.monotonic()
        lag = now - self._last_seen
        self._last_seen = now
        if lag > STALL_MIN:
            log.warning("the gateway could not act for %.1f s: leases are extended", lag)
            self._gap += lag - STALL_PROBE

    def _stall_probe(self) -> None:
        self._observe()
        self._probe_timer = asyncio.get_running_loop().call_later(STALL_PROBE, self._stall_probe)

    def _extend_leases(self, now: float) -> None:
        """Stage the gaps' lease extension (first in its group: before any expiry)."""
        self._observe()
        by, self._gap = self._gap, 0.0
        if by > 0 and self.lease_ttl > 0:
            moved = self.core.extend_leases(by)
            if moved:
                log.warning("extended %d leases by %.1f s", len(moved), by)
                self.commit([], now, extra=moved)

    # --- one cycle ----------------------------------------------------------------------

    async def _cycle(self) -> bool:
        """Run every queued operation, commit what they staged as one group, announce.
        True: the store's lock is held elsewhere, try again shortly.

        See "Failures" in the module docstring for what happens when the store refuses.
        """
        self._observe()
        if self.broken is not None and not await self._try_rebuild():
            self._fail_queued(StoreUnavailable(f"the store is unavailable: {self.broken}"))
            return False
        flight = _Flight()
        try:
            tx = await self._await_store(
                self._store_pool.submit(_begin_in, self.store, flight),
                self.store_timeout,
                flight,
            )
        except StoreBusy as e:
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since < self.lock_timeout:
                return True  # nothing touched: the operations wait, the loop serves others
            self._busy_since = None
            self._fail_queued(e)
            return False
        except StoreUnavailable as e:
            log.warning("%s: %d operations answered 503", e.message, len(self._ops))
            self._fail_queued(e)
            return False
        self._busy_since = None
        ops, self._ops = self._ops, []
        await self._run_group(tx, ops)
        return False

    def _fail_queued(self, error: Exception) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            op.outcome = (False, error)
        self._answer(_Group(ops))

    async def _run_group(self, tx: WriteTx, ops: list[_Op]) -> None:
        """Run `ops` on the core inside `tx`; commit, announce and answer them."""
        group = _Group()
        self._json_cache = {}
        self._settled.clear()  # the core runs ahead of the store until this group is in
        try:
            await self._decide_write_announce(tx, ops, group)
        finally:
            self._settled.set()
        self._answer(group)
        if self._ops:
            self._schedule_cycle()

    async def _decide_write_announce(self, tx: WriteTx, ops: list[_Op], group: _Group) -> None:
        suspect: str | None = None  # why the core must be rebuilt after this group
        self._staging = group.staged
        try:
            self._extend_leases(time.time())
        finally:
            self._staging = None
        for i, op in enumerate(ops):
            mark = len(group.staged)
            self._staging = group.staged
            try:
                op.outcome = (True, op.fn())
            except _CLEAN_ERRORS as e:
                op.outcome = (False, e)
            except Exception as e:
                log.exception("an operation failed after changing the core")
                op.outcome = (False, StoreUnavailable(f"the gateway failed: {e}"))
                suspect = f"operation failed: {e}"
            finally:
                self._staging = None
            group.ops.append(op)
            if suspect is None:
                try:
                    for st in group.staged[mark:]:
                        check_snapshot(st.snap)
                except RowError as e:
                    # The core took this operation's decisions, the store cannot: drop
                    # them, commit those before it, rebuild, and run the rest after.
                    log.warning("refused an operation whose rows cannot be stored: %s", e)
                    op.outcome = (False, e)
                    suspect = f"rows of one operation refused: {e}"
            if suspect is not None:
                del group.staged[mark:]
                self._ops[:0] = ops[i + 1 :]
                break
        self._json_cache = {}
        committed = await self._write_group(tx, group)
        if committed:
            for st in group.staged:
                self._announce(st)
            if group.staged:
                self._maybe_scale()
        else:
            suspect = "a group write failed"
        if suspect is not None:
            await self._rebuild(suspect)

    async def _write_group(self, tx: WriteTx, group: _Group) -> bool:
        """Write and commit the group's batches; False (every answer a 503) if it failed."""
        if not group.staged:
            self._store_pool.submit(tx.rollback)  # nothing to write: release the lock
            return True
        flight = _Flight()
        snaps = [st.snap for st in group.staged]
        try:
            await self._await_store(
                self._store_pool.submit(_commit_in, tx, snaps, flight), self.store_timeout, flight
            )
            return True
        except Exception as e:
            committing = flight.committing
            why = e.message if isinstance(e, StoreUnavailable) else describe(e)
            log.error(
                "the store failed to record %d batches (%s): not announced; rebuilding the "
                "core from the store",
                len(group.staged),
                why,
            )
            err: StoreUnavailable
            if isinstance(e, (StoreUnresponsive, CommitUnknown)):
                err = e
            elif committing and self.store.dialect != "sqlite":
                # PostgreSQL may have committed before the connection broke. A SQLite
                # COMMIT that raised did not commit: nothing is ambiguous there.
                err = CommitUnknown(f"the store went away during the commit: {why}")
            else:
                err = StoreUnavailable(f"the store could not record this, nothing changed: {why}")
            for op in group.ops:
                if not isinstance(op.outcome[1], InputError):
                    op.outcome = (False, err)
            if self.store.dialect == "sqlite":  # a full disk: give the WAL's space back
                self._store_pool.submit(self.store.checkpoint)
            return False

    def _reset_memory(self) -> None:
        """Forget everything the core decided: what is left is what the store says."""
        self.requests = {}
        self.keys = {}
        self.meta = {}
        self.hold_times = {}
        self.history = History()
        self.estimates.forget()
        self._json_cache = {}
        self._last_desired = {}
        self.overrides = {}
        self.config = self.make_config(self.quotas)
        self.core = AdmissionCore(self.config)

    async def _rebuild(self, why: str) -> bool:
        """Drop memory and rebuild the core from the store, as a restart would.

        On failure memory stays empty and `broken` says why: every route answers 503
        until a later attempt (each cycle, at most once a second) succeeds.
        """
        self.broken = why
        self._last_rebuild = time.monotonic()
        self._reset_memory()
        self._settled.clear()
        try:
            stored = await self.in_store(self.read_stored)
            now = time.time()
            staged = self._restored(now, stored)
            if staged:
                for st in staged:
                    check_snapshot(st.snap)
                await self.in_store(self.store.write_many, [st.snap for st in staged], 0.0)
                for st in staged:
                    self._announce(st)
                self._maybe_scale()
        except Exception as e:
            self._reset_memory()
            self.broken = f"{why}; rebuilding from the store failed: {describe(e)}"
            log.error("the gateway cannot rebuild from the store: %s (answering 503)", describe(e))
            return False
        finally:
            self._settled.set()
        log.warning("rebuilt the core from the store after: %s", why)
        self.broken = None
        # The restore gave every lease a full TTL from now: no gap is owed any more.
        self._gap, self._store_down_since = 0.0, None
        return True

    async def _try_rebuild(self) -> bool:
        if time.monotonic() - self._last_rebuild < 1.0:
            return False
        return await self._rebuild(self.broken or "the store was unavailable")

    def check_available(self) -> None:
        """Raise StoreUnavailable while memory is dropped (see `_rebuild`)."""
        if self.broken is not None:
            raise StoreUnavailable(f"the store is unavailable: {self.broken}")

    @staticmethod
    def _answer(group: _Group) -> None:
        for op in group.ops:
            if op.future.done():
                continue
            ok, value = op.outcome
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    def _stage(self, fn: Callable[[], None]) -> list[_Staged]:
        """What `fn` stages through `commit`, outside any group."""
        staged: list[_Staged] = []
        self._staging = staged
        try:
            fn()
        finally:
            self._staging = None
            self._json_cache = {}
        return staged
