"""Server-Sent Events: the bus that fans committed decisions out to listeners.

The arbiter publishes only after the transaction that recorded a decision committed, so a
listener never hears of a state the database might not have. Each listener has its own
bounded buffer and sees what its caller may see: a listener bound to an `owner` hears the
events about that user's requests (and those about no request); one without an owner hears
everything its `allow` filter passes (viewers and admins: everything). Owners are indexed,
so publishing an event costs the listeners that get it, not all of them. An event is
encoded once, whoever hears it. A listener that falls too far behind is dropped rather than
letting memory grow without bound — it reconnects and re-reads state from
`GET api/requests`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("jupyter_gpuaas.gateway")


@dataclass(frozen=True)
class Event:
    """One SSE event: `name` is the decision (admit, cull_warning, ...), `data` its JSON."""

    name: str
    data: dict[str, Any]
    user: str | None = None  # owner of the request it is about; None: about no request

    @functools.cached_property
    def wire(self) -> bytes:
        """The event as sent (encoded once however many listeners hear it)."""
        return f"event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()

    def encode(self) -> bytes:
        return self.wire


Filter = Callable[[Event], bool]


class Listener:
    """One stream: events buffer in `pending` and `deliver()` is called to send them.

    The bus calls `deliver` once per `coalesce` period for each listener that got events
    (every event published meanwhile in one write), not once per event, and nothing waits
    on a task per listener. `ready` wakes the stream's handler only to end it (closed,
    dropped) or for its keepalive timer.
    """

    def __init__(
        self,
        deliver: Callable[[], None],
        allow: Filter | None,
        maxsize: int,
        owner: str | None = None,
    ) -> None:
        self.deliver = deliver
        self.allow = allow
        self.owner = owner
        self.maxsize = maxsize
        self.pending: list[Event] = []
        self.ready = asyncio.Event()
        self.dropped = False
        self.closed = False

    @property
    def ended(self) -> bool:
        return self.closed or self.dropped

    def put(self, event: Event) -> bool:
        """Buffer an event; False when the listener is too far behind (drop it)."""
        if len(self.pending) >= self.maxsize:
            return False
        self.pending.append(event)
        return True

    def take(self) -> list[Event]:
        events, self.pending = self.pending, []
        return events

    def end(self, *, dropped: bool = False) -> None:
        self.dropped = self.dropped or dropped
        self.closed = self.closed or not dropped
        self.ready.set()

    async def wait(self, timeout: float) -> bool:
        """Wait until the listener ends; False after `timeout` seconds (keepalive time).

        A timer, not `wait_for`: no task per wait.
        """
        if self.ended:
            return True
        self.ready.clear()
        timer = asyncio.get_running_loop().call_later(timeout, self.ready.set)
        try:
            await self.ready.wait()
        finally:
            timer.cancel()
        return self.ended


class EventBus:
    """Fans events out to listeners.

    Deliveries are batched in time: a listener's stream is written at most once per
    `coalesce` seconds (every event published meanwhile in one write). Under load that
    divides the writes to 500 streams several times over for a few ms of delay.
    """

    def __init__(self, maxsize: int = 1000, coalesce: float = 0.01, chunk: int = 50) -> None:
        self.maxsize = maxsize
        self.coalesce = coalesce
        self.chunk = chunk
        self.listeners: set[Listener] = set()
        self._everything: set[Listener] = set()  # no owner: filtered by `allow`
        self._by_owner: dict[str, set[Listener]] = {}
        self._to_deliver: dict[Listener, None] = {}  # ordered set
        self._scheduled = False

    def subscribe(
        self,
        deliver: Callable[[], None],
        allow: Filter | None = None,
        *,
        owner: str | None = None,
    ) -> Listener:
        """A listener: bound to `owner`'s requests, or to everything `allow` passes.

        `deliver()` is called (on the loop) when events are pending for it.
        """
        listener = Listener(deliver, allow, self.maxsize, owner)
        self.listeners.add(listener)
        if owner is None:
            self._everything.add(listener)
        else:
            self._by_owner.setdefault(owner, set()).add(listener)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        self._everything.discard(listener)
        self._to_deliver.pop(listener, None)
        if listener.owner is not None:
            mine = self._by_owner.get(listener.owner)
            if mine is not None:
                mine.discard(listener)
                if not mine:
                    del self._by_owner[listener.owner]

    def publish(self, event: Event) -> None:
        if event.user is None:
            targets: Iterable[Listener] = list(self.listeners)
        else:
            targets = [*self._everything, *self._by_owner.get(event.user, ())]
        for listener in targets:
            if listener.allow is not None and not listener.allow(event):
                continue
            if listener.put(event):
                self._to_deliver[listener] = None
            else:
                log.warning("dropping a slow event listener (%d events behind)", self.maxsize)
                self.unsubscribe(listener)
                listener.end(dropped=True)
        if self._to_deliver and not self._scheduled:
            try:
                asyncio.get_running_loop().call_later(self.coalesce, self.flush)
                self._scheduled = True
            except RuntimeError:  # no loop (nobody is listening yet)
                pass

    def flush(self) -> None:
        """Hand listeners with pending events to their streams (once each).

        At most `chunk` per loop iteration: writing to 500 streams takes ~20 ms, and
        requests waiting for the loop (a submission's 201) go in between.
        """
        listeners = list(self._to_deliver)[: self.chunk]
        for listener in listeners:
            del self._to_deliver[listener]
            try:
                listener.deliver()
            except Exception:
                log.exception("event delivery failed")
                self.unsubscribe(listener)
                listener.end()
        if self._to_deliver:
            asyncio.get_running_loop().call_soon(self.flush)
        else:
            self._scheduled = False

    def close(self) -> None:
        """Wake every listener so its handler can finish (on shutdown)."""
        for listener in list(self.listeners):
            self.unsubscribe(listener)
            listener.end()
