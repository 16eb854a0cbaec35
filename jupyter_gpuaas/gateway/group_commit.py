"""The group commit: every decision committed before anyone hears of it, one transaction
for every operation that arrived while the previous group was being written.

`GroupCommit.run(operation)` queues an operation (submit, cancel, heartbeat, a quota
change, an admission step: a function that calls the core and stages its decisions with
`stage`) and returns its value once what it staged is committed and announced. One cycle
takes the store's write lock, runs every queued operation against the core in arrival
order (each staging a copy of its batch), writes the whole group in ONE transaction, and
once that committed announces every batch in order and answers every operation. Under
load one commit (one fsync) covers every request that arrived while the previous group
was being written. While a group's write is in flight the core holds decisions the store
has not committed: reads wait for it (`settled`), so memory is never seen ahead of the
store.

Failures (the store is the truth). A cycle first takes the store's write lock
(`Store.begin_write`): when another process holds it, or the database is unreachable, the
cycle touches nothing and is retried shortly without blocking the loop (answering 503
once `lock_timeout` has passed). Each operation's rows are checked on their own
(`check_snapshot`, and the new request's row before the core sees it): a bad one fails
alone with a 400, the batches before it are committed, and the core is rebuilt from the
store before the next operation runs. When the group write itself fails (a full disk, a
server gone mid-transaction, no answer by the deadline: store_calls.py), every operation
of the group is answered 503 and the core is rebuilt from the store
(`GroupDriver.rebuild`) before anything else is answered. Any decision kind staged
through `stage` gets all of this.

What the group does not own it asks of its driver (the arbiter, `GroupDriver`): whether
memory can take operations at all, what every group starts with (the stalls' lease
extension), announcing what committed, and rebuilding memory from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from jupyter_gpuaas.admission.config import SpecError

from .events import Event
from .store import (
    CommitUnknown,
    RowError,
    Snapshot,
    Store,
    StoreBusy,
    StoreUnavailable,
    StoreUnresponsive,
    WriteTx,
    check_snapshot,
    describe,
)
from .store_calls import Abandoned, Flight, StoreCalls
from .validate import InputError

log = logging.getLogger("jupyter_gpuaas.gateway")

T = TypeVar("T")


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


@dataclass
class Staged:
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
    staged: list[Staged] = field(default_factory=list)


class GroupDriver(Protocol):
    """What the group commit asks of the one who owns memory (the arbiter)."""

    async def available(self) -> StoreUnavailable | None:
        """None when memory can take operations; else the error to answer them with."""

    def open_group(self) -> None:
        """What every group starts with (staged into it before its first operation)."""

    def close_group(self) -> None:
        """The group's operations ran: anything computed as of one of them is stale."""

    def announce(self, staged: list[Staged]) -> None:
        """Committed: now the world may hear of these batches, in order."""

    async def rebuild(self, why: str) -> bool:
        """Drop memory and rebuild it from the store (True: it succeeded)."""


def _begin_in(store: Store, flight: Flight) -> WriteTx:
    """begin_write in a store thread; rolled back at once if the loop gave up waiting."""
    tx: WriteTx = store.begin_write()
    try:
        flight.check()
    except Abandoned:
        tx.rollback()
        raise
    return tx


def _commit_in(tx: WriteTx, snaps: list[Snapshot], flight: Flight) -> None:
    """Write and commit in a store thread, unless the loop gave up before the COMMIT."""
    try:
        tx.write(snaps)
        with flight.lock:
            if flight.abandoned:
                raise Abandoned("the gateway stopped waiting for the store")
            flight.committing = True
        tx.commit()
    except BaseException:
        tx.rollback()
        raise


class GroupCommit:
    """Operations queued, run as groups, each group written in one transaction and
    announced only once it committed (see the module docstring)."""

    def __init__(
        self, store: Store, calls: StoreCalls, driver: GroupDriver, *, lock_timeout: float
    ) -> None:
        self._store = store
        self._calls = calls
        self._driver = driver
        # How long a lock held elsewhere is waited for before the group is answered 503.
        self.lock_timeout = lock_timeout
        self._ops: list[_Op] = []
        # Where the running operation stages its batches (None: no operation runs).
        self._staging: list[Staged] | None = None
        self._settled = asyncio.Event()
        self._settled.set()
        self._cycler: asyncio.Task[None] | None = None
        self._busy_since: float | None = None

    # --- the operations' side ---------------------------------------------------------

    async def run(self, operation: Callable[[], T]) -> T:
        """Run `operation` (which calls the core and `stage`) in the next cycle; its value
        once everything it staged is committed and announced. Its exception as is."""
        op = _Op(operation, asyncio.get_running_loop().create_future())
        self._ops.append(op)
        self._schedule()
        result: T = await op.future
        return result

    @property
    def staging(self) -> bool:
        """An operation runs: what it stages goes into its group."""
        return self._staging is not None

    def stage(self, staged: Staged) -> None:
        """Add a decided batch to the running operation's group."""
        if self._staging is None:
            raise RuntimeError("a batch staged outside an operation (use run or staged_by)")
        self._staging.append(staged)

    def staged_by(self, fn: Callable[[], None]) -> list[Staged]:
        """What `fn` stages, outside any group (a restore writes it itself)."""
        staged: list[Staged] = []
        with self._staging_into(staged):
            fn()
        return staged

    async def settled(self) -> None:
        """Return once no group's write is in flight (reads never see memory ahead of the
        store); StoreUnresponsive when that takes longer than the store's deadline."""
        if self._settled.is_set():
            return
        try:
            await asyncio.wait_for(self._settled.wait(), self._calls.timeout)
        except asyncio.TimeoutError:
            raise StoreUnresponsive("a write to the store is still in flight") from None

    @contextlib.contextmanager
    def unsettled(self) -> Iterator[None]:
        """Reads wait while memory may be ahead of the store (a group, a rebuild)."""
        self._settled.clear()
        try:
            yield
        finally:
            self._settled.set()

    def fail_queued(self, error: Exception) -> None:
        """Answer every operation still queued with `error`; none of them ran."""
        ops, self._ops = self._ops, []
        for op in ops:
            op.outcome = (False, error)
        _answer(ops)

    async def close(self, error: Exception, timeout: float) -> None:
        """The last group: committed (waited at most `timeout` seconds), or answered
        `error`, as is everything still queued."""
        if self._ops:
            self._schedule()
        if self._cycler is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._cycler), timeout)
            except (asyncio.TimeoutError, Exception):
                pass
        self.fail_queued(error)

    # --- the cycles -------------------------------------------------------------------

    @contextlib.contextmanager
    def _staging_into(self, staged: list[Staged]) -> Iterator[None]:
        self._staging = staged
        try:
            yield
        finally:
            self._staging = None

    def _schedule(self) -> None:
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

    async def _cycle(self) -> bool:
        """Run every queued operation, commit what they staged as one group, announce.
        True: the store's lock is held elsewhere, try again shortly."""
        refused = await self._driver.available()
        if refused is not None:
            self.fail_queued(refused)
            return False
        flight = Flight()
        try:
            tx = await self._calls.wait(
                self._calls.submit(_begin_in, self._store, flight), self._calls.timeout, flight
            )
        except StoreBusy as e:
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since < self.lock_timeout:
                return True  # nothing touched: the operations wait, the loop serves others
            self._busy_since = None
            self.fail_queued(e)
            return False
        except StoreUnavailable as e:
            log.warning("%s: %d operations answered 503", e.message, len(self._ops))
            self.fail_queued(e)
            return False
        self._busy_since = None
        ops, self._ops = self._ops, []
        group = _Group()
        with self.unsettled():  # the core runs ahead of the store until this group is in
            await self._decide_write_announce(tx, ops, group)
        _answer(group.ops)
        if self._ops:
            self._schedule()
        return False

    async def _decide_write_announce(self, tx: WriteTx, ops: list[_Op], group: _Group) -> None:
        suspect: str | None = None  # why the core must be rebuilt after this group
        with self._staging_into(group.staged):
            self._driver.open_group()
        for i, op in enumerate(ops):
            mark = len(group.staged)
            with self._staging_into(group.staged):
                try:
                    op.outcome = (True, op.fn())
                except _CLEAN_ERRORS as e:
                    op.outcome = (False, e)
                except Exception as e:
                    log.exception("an operation failed after changing the core")
                    op.outcome = (False, StoreUnavailable(f"the gateway failed: {e}"))
                    suspect = f"operation failed: {e}"
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
        self._driver.close_group()
        if await self._write(tx, group):
            self._driver.announce(group.staged)
        else:
            suspect = "a group write failed"
        if suspect is not None:
            await self._driver.rebuild(suspect)

    async def _write(self, tx: WriteTx, group: _Group) -> bool:
        """Write and commit the group's batches; False (every answer a 503) if it failed."""
        if not group.staged:
            self._calls.submit(tx.rollback)  # nothing to write: release the lock
            return True
        flight = Flight()
        snaps = [st.snap for st in group.staged]
        try:
            await self._calls.wait(
                self._calls.submit(_commit_in, tx, snaps, flight), self._calls.timeout, flight
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
            elif committing and self._store.dialect != "sqlite":
                # PostgreSQL may have committed before the connection broke. A SQLite
                # COMMIT that raised did not commit: nothing is ambiguous there.
                err = CommitUnknown(f"the store went away during the commit: {why}")
            else:
                err = StoreUnavailable(f"the store could not record this, nothing changed: {why}")
            for op in group.ops:
                if not isinstance(op.outcome[1], InputError):
                    op.outcome = (False, err)
            if self._store.dialect == "sqlite":  # a full disk: give the WAL's space back
                self._calls.submit(self._store.checkpoint)
            return False


def _answer(ops: list[_Op]) -> None:
    for op in ops:
        if op.future.done():
            continue
        ok, value = op.outcome
        if ok:
            op.future.set_result(value)
        else:
            op.future.set_exception(value)
