"""The REST API's route table, and its routes that are not a resource: the event stream,
health, the OpenAPI document and metrics (INTERFACES.md, "Gateway REST API").

What every handler shares (JSON errors naming the field, 503 with Retry-After when the
store is unavailable, XSRF, identity) is handler_base.py; the requests and the tenants
are requests_api.py and tenants_api.py.
"""

from __future__ import annotations

import asyncio
import time

from tornado import web

from .auth import METRICS_FORBIDDEN, may_scrape
from .events import Listener, check_last_event_id
from .handler_base import ApiError, BaseHandler
from .openapi import build_openapi
from .requests_api import HeartbeatHandler, RequestHandler, RequestsHandler
from .tenants_api import AdviceHandler, DevicesHandler, MeHandler, TenantHandler, TenantsHandler


class EventsHandler(BaseHandler):
    """Server-Sent Events: `event: <decision>` / `data: <decision JSON + request>`.

    The bus calls `_deliver` with everything published in its last period; at most one
    write is in flight per stream (tornado's write futures must not overlap) and what
    arrives meanwhile is sent when it completes. A stream that cannot keep up piles up
    in its listener until the bus drops it: it is sent one `reset` event and ends.
    A `Last-Event-ID` that is no id at all is a 400 before any listener exists.

    Once the headers are out, events go straight to the connection
    (`HTTPConnection.write`, which frames the chunk), not through `write` and `flush`:
    with a thousand streams that hear everything, those two were a third of the cost of
    a round of writes, for nothing a stream needs (no transforms, no buffering).
    """

    _listener: Listener | None = None
    _writing = False
    _streaming = False  # the headers are out: events go to the connection itself
    _last_write = 0.0

    async def get(self) -> None:
        who = self.require()
        last = self.request.headers.get("Last-Event-ID")
        if last is not None:
            try:
                last = check_last_event_id(last)
            except ValueError as e:
                raise ApiError(400, str(e), "Last-Event-ID") from None
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("X-Accel-Buffering", "no")  # proxies must not buffer the stream
        keepalive = float(self.settings.get("keepalive_interval", 15.0))
        bus = self.arbiter.bus
        # Viewers hear everything; a user, what is about their own requests (indexed).
        owner = None if who.can_view else who.name
        # A reconnecting client names the last event it heard: it gets what it missed
        # (or a `reset`). A new stream learns the current id, to resume from (events.py).
        listener = self._listener = bus.subscribe(self._deliver, owner=owner, last_event_id=last)
        try:
            resume = "" if last is not None else f"id: {bus.last_id}\n"
            self._send(f": connected\n{resume}\n".encode())
            while not await listener.wait(keepalive):
                # (A write in flight is no idle stream, and writes must not overlap.)
                idle = time.monotonic() - self._last_write >= keepalive * 0.9
                if idle and not self._writing:
                    self._send(b": keepalive\n\n")
        finally:
            bus.unsubscribe(listener)
        if self._finished:
            return
        if listener.dropped:  # fell behind: its `reset`, then the end of the stream
            self.write(b"".join(e.wire for e in listener.take()))
        self.finish()

    def _deliver(self) -> None:
        listener = self._listener
        if listener is None or self._writing:
            return  # sent when the write in flight completes
        data = listener.take_wire()
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        listener = self._listener
        if self._finished or listener is None or listener.ended:
            return
        self._last_write = time.monotonic()
        self._writing = True
        connection = self.request.connection
        if self._streaming and connection is not None:
            written = connection.write(data)
        else:  # the first write: the headers go with it
            self.write(data)
            written = self.flush()
            self._streaming = True
        written.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        self._writing = False
        listener = self._listener
        if listener is None:
            return
        if future.cancelled() or future.exception() is not None:
            listener.end()  # the client went away
        elif listener.behind:
            # What was published while this write was in flight goes in the stream's next
            # round, not now: written at once, a fast client's stream would be written
            # once per event (its write completes before the next event), a thousand of
            # them taking the loop from the submissions the rounds are spaced for.
            self.arbiter.bus.requeue(listener)

    def on_connection_close(self) -> None:
        if self._listener is not None:
            self._listener.end()


class HealthHandler(BaseHandler):
    """For a load balancer or a Kubernetes probe: anyone, no token (nothing private)."""

    async def prepare(self) -> None:
        return

    async def get(self) -> None:
        arbiter = self.arbiter
        # Answered within a second whatever the store does: `store` says whether it
        # answers ("ok"), answers with errors ("failing": unreachable, full, read-only)
        # or does not answer in time ("unresponsive"). 503 unless "ok": a readiness probe
        # needs the store; a liveness probe should accept 503 too (the process answers).
        store = await arbiter.store_health()
        if store == "ok" and arbiter.broken is not None:
            store = "failing"  # memory was dropped and could not be rebuilt yet
        status, code = ("ok", 200) if store == "ok" else ("unavailable", 503)
        if code == 503:
            self.set_header("Retry-After", "2")
        # A standby is healthy too (it answers reads); `leader_url` says who decides.
        body = {"status": status, "store": store, "leader": arbiter.leader}
        if not arbiter.leader:
            body["leader_url"] = arbiter.leader_url
        self.send(body, code)


class OpenAPIHandler(BaseHandler):
    async def prepare(self) -> None:  # anyone: no identity needed
        return

    def get(self) -> None:
        self.send(build_openapi(self.settings["base_url"], self.arbiter.config.flavors))


class MetricsHandler(BaseHandler):
    """Prometheus text; a token with the view scope unless --metrics-public (auth.py)."""

    async def prepare(self) -> None:
        if not self.settings.get("metrics_public"):
            await super().prepare()

    def get(self) -> None:
        if not self.settings.get("metrics_public") and not may_scrape(self.require()):
            raise ApiError(403, METRICS_FORBIDDEN)
        self.arbiter.snapshot_metrics()
        bus = self.arbiter.bus
        self.arbiter.metrics.set_event_streams(len(bus.listeners), bus.dropped)
        body, content_type = self.arbiter.metrics.render()
        self.set_header("Content-Type", content_type)
        self.finish(body)


class NotFoundHandler(BaseHandler):
    async def prepare(self) -> None:
        raise ApiError(404, f"no such route: {self.request.path}")


def routes(base_url: str) -> list[tuple[str, type[web.RequestHandler]]]:
    b = base_url
    return [
        (rf"{b}api/devices", DevicesHandler),
        (rf"{b}api/tenants", TenantsHandler),
        (rf"{b}api/tenants/([^/]+)", TenantHandler),
        (rf"{b}api/requests", RequestsHandler),
        (rf"{b}api/requests/([^/]+)", RequestHandler),
        (rf"{b}api/requests/([^/]+)/heartbeat", HeartbeatHandler),
        (rf"{b}api/events", EventsHandler),
        (rf"{b}api/openapi\.json", OpenAPIHandler),
        (rf"{b}api/me", MeHandler),
        (rf"{b}api/advice", AdviceHandler),
        (rf"{b}api/health", HealthHandler),
        (rf"{b}metrics", MetricsHandler),
    ]
