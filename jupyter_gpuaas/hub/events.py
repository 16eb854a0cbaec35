"""One gateway event stream per (gateway, token) in the Hub process, fanned out to spawners.

Queued spawns need to know when the queue moves, and running ones when the gateway culls
or preempts them. Polling every second per spawn would multiply load by the number of
waiting users; instead the Hub keeps one Server-Sent Events connection (with a token that
may see the whole queue, `custom:gpuaas:view`) and every spawner subscribes a callback.
Without such a token each spawner streams with its user's token, which sees only that
user's own requests; the spawner then also re-reads its position every `refresh_interval`.

The stream reconnects with backoff, and tells subscribers `{"event": "connected"}` after
every (re)connection, so they re-read state. It reconnects with the last event id it
heard (`Last-Event-ID`): the gateway replays what it missed (a cull, a preemption) before
anything new, or says `reset`, which subscribers also hear as `connected`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from jupyter_gpuaas.client import GatewayClient, GatewayError

log = logging.getLogger("jupyter_gpuaas.hub")

Callback = Callable[[dict[str, Any]], None]


class EventStream:
    """A reconnecting SSE consumer that runs while it has subscribers."""

    def __init__(
        self,
        url: str,
        token: str,
        max_backoff: float = 10.0,
        shared: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.client = GatewayClient(url, token, ssl_context=ssl_context)
        self.last_id: str | None = None
        self.shared = shared  # the Hub's own stream: kept open between spawns
        self.max_backoff = max_backoff
        self.callbacks: set[Callback] = set()
        self.connected = False
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Add a callback; returns the function that removes it.

        A stream without subscribers stays connected (the Hub's shared stream is wanted
        again at the next spawn) until its next event, when it hangs up.
        """
        self.callbacks.add(callback)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

        def unsubscribe() -> None:
            self.callbacks.discard(callback)

        return unsubscribe

    def _dispatch(self, event: dict[str, Any]) -> None:
        for callback in list(self.callbacks):
            try:
                callback(event)
            except Exception:
                log.exception("gpuaas event callback failed")

    async def _run(self) -> None:
        backoff = 0.5
        while self.callbacks or self.shared:
            try:
                async for event in self.client.events(comments=True, last_event_id=self.last_id):
                    self.last_id = event.get("id") or self.last_id
                    if not self.callbacks and not self.shared:
                        return
                    if event.get("event") == "reset":  # missed too much: re-read
                        self._dispatch({"event": "connected"})
                        continue
                    if "comment" in event:
                        if event["comment"] == "connected" or not self.connected:
                            self.connected = True
                            backoff = 0.5
                            self._dispatch({"event": "connected"})
                        continue
                    self._dispatch(event)
            except asyncio.CancelledError:
                raise
            except GatewayError as e:
                log.warning("gpuaas event stream: %s; reconnecting in %.1fs", e, backoff)
            except Exception as e:  # a dropped connection mid-chunk, a parse error
                log.warning("gpuaas event stream failed (%s); reconnecting", e)
            self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff, backoff * 2)


_streams: dict[tuple[str, str], EventStream] = {}


def stream_for(
    url: str, token: str, shared: bool = False, ssl_context: ssl.SSLContext | None = None
) -> EventStream:
    """The Hub-wide stream for this gateway and token (created on first use)."""
    key = (url, token)
    stream = _streams.get(key)
    if stream is None:
        stream = _streams[key] = EventStream(url, token, shared=shared, ssl_context=ssl_context)
    return stream


def forget_stream(url: str, token: str) -> None:
    """Drop a per-user stream once its token is revoked."""
    _streams.pop((url, token), None)
