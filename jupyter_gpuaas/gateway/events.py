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
    """One stream's buffer: `take()` what arrived since the last call, `wait()` for more."""

    def __init__(self, allow: Filter | None, maxsize: int, owner: str | None = None) -> None:
        self.allow = allow
        self.owner = owner
        self.maxsize = maxsize
        self.pending: list[Event] = []
        self.ready = asyncio.Event()
        self.dropped = False
        self.closed = False

    def put(self, event: Event) -> bool:
        """Buffer an event; False when the listener is too far behind (drop it)."""
        if len(self.pending) >= self.maxsize:
            return False
        self.pending.append(event)
        self.ready.set()
        return True

    def take(self) -> list[Event]:
        events, self.pending = self.pending, []
        self.ready.clear()
        return events

    async def wait(self, timeout: float) -> bool:
        """Wait for events (or close, or drop); False after `timeout` seconds without.

        A timer, not `wait_for`: no task per wait (500 listeners wake at every group).
        """
        if self.pending or self.closed or self.dropped:
            return True
        self.ready.clear()
        timer = asyncio.get_running_loop().call_later(timeout, self.ready.set)
        try:
            await self.ready.wait()
        finally:
            timer.cancel()
        return bool(self.pending) or self.closed or self.dropped


class EventBus:
    def __init__(self, maxsize: int = 1000) -> None:
        self.maxsize = maxsize
        self.listeners: set[Listener] = set()
        self._everything: set[Listener] = set()  # no owner: filtered by `allow`
        self._by_owner: dict[str, set[Listener]] = {}

    def subscribe(self, allow: Filter | None = None, *, owner: str | None = None) -> Listener:
        """A listener: bound to `owner`'s requests, or to everything `allow` passes."""
        listener = Listener(allow, self.maxsize, owner)
        self.listeners.add(listener)
        if owner is None:
            self._everything.add(listener)
        else:
            self._by_owner.setdefault(owner, set()).add(listener)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        self._everything.discard(listener)
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
            if not listener.put(event):
                log.warning("dropping a slow event listener (%d events behind)", self.maxsize)
                listener.dropped = True
                listener.ready.set()
                self.unsubscribe(listener)

    def close(self) -> None:
        """Wake every listener so its handler can finish (on shutdown)."""
        for listener in list(self.listeners):
            listener.closed = True
            listener.ready.set()
            self.unsubscribe(listener)
