"""Store work off the event loop, with deadlines, and the store's health.

The store can hang (a frozen PostgreSQL, a disk that stopped answering): store work never
runs on the event loop. Each call goes to a small pool of store threads and is awaited
with a deadline (`timeout`); past it the caller gets StoreUnresponsive (503 with
Retry-After) and the thread is abandoned (a write it has not committed yet is rolled back
when the thread wakes, so "nothing was changed" stays true: `Flight`). `api/health` asks
the store with its own short deadline and its own thread, so a probe never queues behind
stuck work, and says `ok`, `failing` (the store answers with an error: unreachable, full)
or `unresponsive` (it does not answer in time).

A store that did not answer is time during which the gateway could not act: from its
first failure to the next call that succeeds, handed to `on_recovered` (the leases are
extended by it: stalls.py).
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

from .leader import NotLeader
from .store import (
    CommitUnknown,
    Store,
    StoreBusy,
    StoreUnavailable,
    StoreUnresponsive,
    describe,
)

log = logging.getLogger("jupyter_gpuaas.gateway")

T = TypeVar("T")

# How long `api/health` waits for the store's answer.
HEALTH_DEADLINE = 0.8


class Abandoned(Exception):
    """The loop stopped waiting for this store call: roll back, never commit."""


@dataclass
class Flight:
    """One store write the loop waits for with a deadline. `abandoned` (set by the loop
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
                raise Abandoned("the gateway stopped waiting for the store")


def _wrap(fut: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """An asyncio future of a store thread's future; its exception always retrieved (the
    loop may stop waiting for it)."""
    waited = asyncio.wrap_future(fut)
    waited.add_done_callback(lambda f: f.cancelled() or f.exception())
    return waited


class StoreCalls:
    """The store's threads, the deadlines the loop waits for them with, and the store's
    state as `api/health` reports it (`state`: ok, failing or unresponsive)."""

    def __init__(
        self, store: Store, *, timeout: float, on_recovered: Callable[[float], None]
    ) -> None:
        self.store = store
        # Every call is awaited at most `timeout` seconds unless it names its own.
        self.timeout = timeout
        self._on_recovered = on_recovered
        self._pool = concurrent.futures.ThreadPoolExecutor(4, "gpuaas-store")
        self._health_pool = concurrent.futures.ThreadPoolExecutor(1, "gpuaas-health")
        self._probe: concurrent.futures.Future[None] | None = None
        self._probe_writes = False
        # Calls the loop stopped waiting for that the store has not answered yet.
        self._hung: set[concurrent.futures.Future[Any]] = set()
        self.state = "ok"
        self._down_since: float | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """`fn(*args)` in a store thread, nobody waiting (a rollback, a checkpoint)."""
        return self._pool.submit(fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """`fn(*args)` in a store thread, awaited at most `timeout` (`self.timeout`)
        seconds: StoreUnresponsive past it. The store's state follows."""
        return await self.wait(self._pool.submit(fn, *args), timeout or self.timeout, None)

    async def wait(
        self, fut: concurrent.futures.Future[T], timeout: float, flight: Flight | None
    ) -> T:
        """A store thread's `fut`, awaited at most `timeout` seconds; past it `flight`
        (if any) is abandoned, and CommitUnknown says its COMMIT was already sent."""
        started = time.monotonic()
        fut.add_done_callback(self._returned)
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
            self._mark("unresponsive", f"no answer in {timeout:g} s")
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
            self._mark("failing", e.message)
            raise
        except Abandoned:
            raise
        except Exception as e:
            self._mark("failing", describe(e))
            raise
        self._mark("ok", f"answered in {time.monotonic() - started:.3f} s")
        return result

    def read_now(self, fn: Callable[..., T], *args: Any) -> T:
        """A store read for a synchronous caller on the loop, bounded: the loop waits at
        most half a second (StoreUnresponsive), never for a store that does not answer."""
        if self.state == "unresponsive":
            raise StoreUnresponsive("the store does not answer")
        fut = self._pool.submit(fn, *args)
        fut.add_done_callback(self._returned)
        try:
            return fut.result(timeout=0.5)
        except concurrent.futures.TimeoutError:
            self._hung.add(fut)
            self._mark("unresponsive", "a read got no answer in 0.5 s")
            raise StoreUnresponsive("the store did not answer within 0.5 s") from None

    def _returned(self, fut: concurrent.futures.Future[Any]) -> None:
        """A store call ended (in its thread): one that the loop gave up on may end much
        later; its error was already answered, so it is only retrieved here."""
        self._hung.discard(fut)
        if not fut.cancelled():
            fut.exception()

    def _stuck(self) -> bool:
        return bool(self._hung) and any(not f.done() for f in self._hung)

    def _mark(self, state: str, why: str) -> None:
        if state == "ok":
            if self._stuck():
                return  # an older call is still stuck in the store
            if self._down_since is not None:
                # The store answers again: the time it did not is a gap for the leases.
                self._on_recovered(time.monotonic() - self._down_since)
                self._down_since = None
        elif self._down_since is None:
            self._down_since = time.monotonic()
        if state != self.state:
            log.warning("the store is %s now (%s)", state, why)
        self.state = state

    def forget_outage(self) -> None:
        """A rebuild gave every lease a full TTL: no gap is owed for the outage so far."""
        self._down_since = None

    async def health(self) -> str:
        """`ok`, `failing` or `unresponsive`, within HEALTH_DEADLINE seconds.

        The store is asked (a query; after a failed write, a write) by one probe at a
        time; a probe still running past the deadline means the store does not answer."""
        probe = self._probe
        if probe is None or probe.done():
            write = self.state != "ok"
            fn = self.store.check_writable if write else self.store.ping
            probe = self._probe = self._health_pool.submit(fn)
            self._probe_writes = write
            probe.add_done_callback(self._returned)
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
        if self._stuck():
            return "unresponsive"
        if failed:
            return "failing"
        if writes:  # it took a write: the store records decisions again
            self._mark("ok", "a health probe could write")
        elif self.state == "failing":
            return "failing"  # it answers reads; the last write failed
        return "ok"

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._health_pool.shutdown(wait=False, cancel_futures=True)
