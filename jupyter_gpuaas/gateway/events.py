"""Server-Sent Events: the bus that fans committed decisions out to listeners.

The arbiter publishes only after the transaction that recorded a decision committed, so a
listener never hears of a state the database might not have. Each listener has its own
bounded queue and a filter (what its caller may see); a listener that falls too far behind
is dropped rather than letting memory grow without bound — it reconnects and re-reads
state from `GET api/requests`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("jupyter_gpuaas.gateway")


@dataclass(frozen=True)
class Event:
    """One SSE event: `name` is the decision (admit, cull_warning, ...), `data` its JSON."""

    name: str
    data: dict[str, Any]
    user: str | None = None  # owner of the request it is about; None: about no request

    def encode(self) -> bytes:
        return f"event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()


Filter = Callable[[Event], bool]


class Listener:
    def __init__(self, allow: Filter, maxsize: int) -> None:
        self.allow = allow
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=maxsize)
        self.dropped = False


class EventBus:
    def __init__(self, maxsize: int = 1000) -> None:
        self.maxsize = maxsize
        self.listeners: set[Listener] = set()

    def subscribe(self, allow: Filter) -> Listener:
        listener = Listener(allow, self.maxsize)
        self.listeners.add(listener)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.discard(listener)

    def publish(self, event: Event) -> None:
        for listener in list(self.listeners):
            if not listener.allow(event):
                continue
            try:
                listener.queue.put_nowait(event)
            except asyncio.QueueFull:
                log.warning("dropping a slow event listener (%d events behind)", self.maxsize)
                listener.dropped = True
                self.listeners.discard(listener)

    def close(self) -> None:
        """Wake every listener so its handler can finish (on shutdown)."""
        for listener in list(self.listeners):
            try:
                listener.queue.put_nowait(None)
            except asyncio.QueueFull:
                pass
        self.listeners.clear()
