"""The driver's loops and its group commit: how the arbiter runs (see arbiter.py).

Group commit. Operations (submit, cancel, heartbeat, a quota change, an admission step)
are queued and run together by one `_cycle` on the event loop's thread, scheduled once per
loop iteration: it runs every queued operation against the core in arrival order (each
staging a copy of its batch), writes the whole group in ONE transaction, and once that
committed announces every batch in order and answers every operation. Under load one
commit (one fsync) covers every request that arrived in the same loop iteration. The
write is done inline, not in a thread: a writer thread would hand the GIL back and forth
with the busy loop (each handover up to the 5 ms switch interval) and the cycle, not the
disk, would become the bottleneck. The core never holds a decision the store has not
committed once a cycle returns, so readers need no lock.

Failures (the store is the truth). A cycle first takes the store's write lock
(`Store.begin_write`): when another process holds it, or the database is unreachable, the
cycle touches nothing and is retried shortly without blocking the loop (answering 503
once `lock_timeout` has passed). Each operation's rows are checked on their own
(`check_snapshot`, and the new request's row before the core sees it): a bad one fails
alone with a 400, the batches before it are committed, and the core is rebuilt from the
store before the next operation runs. When the group write itself fails (a full disk, a
server gone mid-transaction), every operation of the group is answered 503 and the core
is rebuilt from the store (`_rebuild`) before anything else is answered; while the store
cannot be read, the arbiter is `broken`: memory is dropped and every route answers 503
until a rebuild succeeds. Any decision kind staged through `commit` gets all of this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.admission.core import AdmissionCore

from .events import Event
from .leader import NotLeader
from .store import (
    CommitUnknown,
    RowError,
    Snapshot,
    StoreBusy,
    StoreUnavailable,
    WriteTx,
    check_snapshot,
    describe,
)
from .validate import InputError

log = logging.getLogger("jupyter_gpuaas.gateway")


class Conflict(Exception):
    """The request is in a state where the operation makes no sense (HTTP 409)."""


# What an operation may raise having decided nothing (its answer stands as is). Anything
# else may have left the core half-changed: the core is rebuilt from the store.
_CLEAN_ERRORS = (Conflict, SpecError, InputError)

T = TypeVar("T")


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


class Loops:
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
            self._maybe_prune()
            # A standby's mirror has deadlines only the leader acts on: no busy wake-ups.
            deadline = self.core.next_deadline() if self.leader else None
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
        self.commit(self.core.step(now), now)

    def _maybe_prune(self) -> None:
        """History retention: delete ended and rejected rows older than `retention`, a
        batch at a time (each a short transaction that never waits for a lock)."""
        if self.retention <= 0 or self.broken is not None or time.monotonic() < self._next_prune:
            return
        if not self.leader:
            return
        try:
            gone = self.store.prune(time.time() - self.retention)
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
        # While waiting for a lock held elsewhere, one timer retries (operations queue).
        if not self._cycle_scheduled and self._retry is None:
            self._cycle_scheduled = True
            asyncio.get_running_loop().call_soon(self._cycle)

    def _retry_cycle(self) -> None:
        self._retry = None
        self._schedule_cycle()

    def _cycle(self) -> None:
        """Run every queued operation, commit what they staged as one group, announce.

        See "Failures" in the module docstring for what happens when the store refuses.
        """
        self._cycle_scheduled = False
        if not self._ops:
            return
        if self.broken is not None and not self._try_rebuild():
            self._fail_queued(StoreUnavailable(f"the store is unavailable: {self.broken}"))
            return
        try:
            tx = self.store.begin_write()
        except StoreBusy as e:
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since < self.lock_timeout:
                # Nothing touched: the operations wait, the loop serves others meanwhile.
                self._retry = asyncio.get_running_loop().call_later(0.05, self._retry_cycle)
                return
            self._busy_since = None
            self._fail_queued(e)
            return
        except StoreUnavailable as e:
            log.warning("%s: %d operations answered 503", e.message, len(self._ops))
            self._fail_queued(e)
            return
        self._busy_since = None
        ops, self._ops = self._ops, []
        self._run_group(tx, ops)

    def _fail_queued(self, error: Exception) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            op.outcome = (False, error)
        self._answer(_Group(ops))

    def _run_group(self, tx: WriteTx, ops: list[_Op]) -> None:
        """Run `ops` on the core inside `tx`; commit, announce and answer them."""
        group = _Group()
        self._json_cache = {}
        suspect: str | None = None  # why the core must be rebuilt after this group
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
        committed = self._write_group(tx, group)
        if committed:
            for st in group.staged:
                self._announce(st)
            if group.staged:
                self._maybe_scale()
        else:
            suspect = "a group write failed"
        if suspect is not None:
            self._rebuild(suspect)
        self._answer(group)
        if self._ops:
            self._schedule_cycle()

    def _write_group(self, tx: WriteTx, group: _Group) -> bool:
        """Write and commit the group's batches; False (every answer a 503) if it failed."""
        if not group.staged:
            tx.rollback()  # nothing to write: just release the lock
            return True
        committing = False
        try:
            tx.write([st.snap for st in group.staged])
            committing = True  # every row was taken: only the COMMIT itself can fail now
            tx.commit()
            return True
        except Exception as e:
            tx.rollback()
            why = describe(e)
            log.error(
                "the store failed to record %d batches (%s): not announced; rebuilding the "
                "core from the store",
                len(group.staged),
                why,
            )
            err: StoreUnavailable
            if committing:  # the database may have committed before the connection broke
                err = CommitUnknown(f"the store went away during the commit: {why}")
            else:
                err = StoreUnavailable(f"the store could not record this, nothing changed: {why}")
            for op in group.ops:
                if not isinstance(op.outcome[1], InputError):
                    op.outcome = (False, err)
            return False

    def _reset_memory(self) -> None:
        """Forget everything the core decided: what is left is what the store says."""
        self.requests = {}
        self.meta = {}
        self.hold_times = {}
        self._json_cache = {}
        self._last_desired = {}
        self.overrides = {}
        self.config = self.make_config(self.quotas)
        self.core = AdmissionCore(self.config)

    def _rebuild(self, why: str) -> bool:
        """Drop memory and rebuild the core from the store, as a restart would.

        On failure memory stays empty and `broken` says why: every route answers 503
        until a later attempt (each cycle, at most once a second) succeeds.
        """
        self.broken = why
        self._last_rebuild = time.monotonic()
        self._reset_memory()
        try:
            self.overrides = self.store.tenant_overrides()
            self.config = self.make_config(self.quotas, self.overrides)
            self.core = AdmissionCore(self.config)
            self.restore(time.time(), lock_wait=0.0)
        except Exception as e:
            self._reset_memory()
            self.broken = f"{why}; rebuilding from the store failed: {describe(e)}"
            log.error("the gateway cannot rebuild from the store: %s (answering 503)", describe(e))
            return False
        log.warning("rebuilt the core from the store after: %s", why)
        self.broken = None
        return True

    def _try_rebuild(self) -> bool:
        if time.monotonic() - self._last_rebuild < 1.0:
            return False
        return self._rebuild(self.broken or "the store was unavailable")

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

    def _commit_now(self, fn: Callable[[], None], wait: float = 0.0) -> None:
        """Stage, write and announce synchronously (restore, before the loop serves)."""
        staged: list[_Staged] = []
        self._staging = staged
        try:
            fn()
        finally:
            self._staging = None
            self._json_cache = {}
        if staged:
            for st in staged:
                check_snapshot(st.snap)
            self.store.write_many([st.snap for st in staged], wait=wait)
            for st in staged:
                self._announce(st)
            self._maybe_scale()
