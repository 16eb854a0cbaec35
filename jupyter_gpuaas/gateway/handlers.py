"""The REST API and the event stream (INTERFACES.md, "Gateway REST API").

Every handler answers JSON; every error is `{"error": ..., "field": ...}` with a 4xx status,
never an HTML page or a 500 for bad input (`write_error`). Input is validated strictly:
unknown keys, booleans where integers belong, and non-positive GPU counts are errors that
name the field, because a silently ignored `gpu: 4` typo would queue the wrong request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from tornado import web

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.admission.model import KINDS, State

from .arbiter import Arbiter, Conflict
from .auth import (
    METRICS_FORBIDDEN,
    Identity,
    TokenTable,
    identity_from_hub_model,
    may_scrape,
    token_from_header,
)
from .events import Listener
from .openapi import build_openapi

log = logging.getLogger("jupyter_gpuaas.gateway")

STATES = tuple(s.value for s in State)
MAX_NAME = 255


class ApiError(web.HTTPError):
    """An HTTP error with the JSON body of the API."""

    def __init__(self, status: int, error: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(status, reason=None)
        self.error = error
        self.field = field
        self.extra = extra


class BaseHandler(web.RequestHandler):
    identity: Identity | None = None

    @property
    def arbiter(self) -> Arbiter:
        arbiter: Arbiter = self.settings["arbiter"]
        return arbiter

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    # --- XSRF, as JupyterHub does it for services ------------------------------------
    # A request that brings its token (`Authorization: token T`) is exempt. A browser's
    # login cookie (HubOAuth) is accepted for a POST, PUT or DELETE only with the `_xsrf`
    # form field or an X-XSRFToken header matching the signed `_xsrf` cookie, which is
    # tied to the login: HubOAuth runs this check while it reads the cookie, and a cookie
    # that fails it does not identify anybody (answered 403 by `require`). Standalone
    # gateways accept tokens only, so there is no cookie to check.
    _xsrf_failure: str | None = None

    def check_xsrf_cookie(self) -> None:
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is None:
            return
        try:
            hub_auth.check_xsrf_cookie(self)
        except web.HTTPError as e:
            self._xsrf_failure = e.log_message or "XSRF check failed"
            raise

    @property
    def _xsrf_token_id(self) -> bytes:
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is None:
            return b""
        token_id: bytes = hub_auth._get_xsrf_token_id(self)
        return token_id

    @property
    def xsrf_token(self) -> bytes:
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is None:
            # Standalone: only header tokens identify anybody, so there is nothing for an
            # XSRF token to protect (and HubOAuth may have patched tornado's own).
            return b""
        from jupyterhub._xsrf_utils import get_xsrf_token  # type: ignore[import-untyped]

        token: bytes = get_xsrf_token(self, cookie_path=hub_auth.base_url)
        return token

    async def prepare(self) -> None:
        self.identity = await self._identify()

    async def _identify(self) -> Identity | None:
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is not None:
            model = await hub_auth.get_user(self, sync=False)
            if not model:
                return None
            ident = identity_from_hub_model(model, self.settings.get("service_name", "gpuaas"))
            if ident is None:
                # Known to the Hub but without gpuaas scopes: 403, not 401.
                return Identity(str(model.get("name", "")), use=False)
            return ident
        token = token_from_header(self.request.headers.get("Authorization"))
        if token is None:
            return None
        tokens: TokenTable = self.settings["tokens"]
        return tokens.lookup(token)

    def require(self) -> Identity:
        """The caller, who must be known and hold at least one gpuaas permission."""
        if self.identity is None:
            if self._xsrf_failure is not None:
                raise ApiError(
                    403,
                    "the login cookie came without a matching XSRF token: send the "
                    "_xsrf form field or an X-XSRFToken header, or reload the page",
                )
            if self.request.headers.get("Authorization"):
                raise ApiError(401, "invalid or expired token")
            raise ApiError(401, "authentication required: send 'Authorization: token <T>'")
        if not self.identity.can_read:
            raise ApiError(403, "no gpuaas permission (custom:gpuaas:use)")
        return self.identity

    def send(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        body: dict[str, Any] = {"error": self._reason, "field": None}
        if isinstance(exc, ApiError):
            body = {"error": exc.error, "field": exc.field, **exc.extra}
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            body["error"] = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(body))

    def json_body(self) -> dict[str, Any]:
        if not self.request.body:
            raise ApiError(400, "a JSON object body is required")
        try:
            data = json.loads(self.request.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "body must be a JSON object")
        return data

    def query(self, allowed: tuple[str, ...]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, values in self.request.query_arguments.items():
            if key not in allowed:
                raise ApiError(400, f"unknown query parameter (allowed: {', '.join(allowed)})", key)
            out[key] = values[-1].decode("utf-8", "replace")
        return out


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise ApiError(400, f"unknown key (allowed: {', '.join(allowed)})", key)


def want_int(data: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, "must be an integer", key)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"must be at least {minimum}", key)
    return value


def want_str(data: Mapping[str, Any], key: str, *, nullable: bool = False) -> str | None:
    value = data.get(key)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, "must be a non-empty string", key)
    if len(value) > MAX_NAME:
        raise ApiError(400, f"must be at most {MAX_NAME} characters", key)
    return value


def _reject_field(reason: str) -> str | None:
    text = reason.lower()
    for field in ("tenant", "flavor"):
        if field in text:
            return field
    return "gpus"


class DevicesHandler(BaseHandler):
    def get(self) -> None:
        self.require()
        self.send(self.arbiter.devices_json())


class TenantsHandler(BaseHandler):
    def get(self) -> None:
        self.require()
        self.send(self.arbiter.tenants_json())


class TenantHandler(BaseHandler):
    async def put(self, name: str) -> None:
        who = self.require()
        if not who.admin:
            raise ApiError(403, "changing quotas needs custom:gpuaas:admin")
        spec = self.json_body()
        try:
            await self.arbiter.put_tenant(name, spec)
        except SpecError as e:
            raise ApiError(400, str(e), e.key) from None
        except ValueError as e:
            raise ApiError(409, str(e)) from None
        tenants = self.arbiter.tenants_json()
        one = next(t for t in tenants["tenants"] if t["name"] == name)
        self.send({**one, "simulated": tenants["simulated"]})


SUBMIT_KEYS = ("tenant", "kind", "gpus", "flavor", "priority", "name")


class RequestsHandler(BaseHandler):
    def get(self) -> None:
        who = self.require()
        q = self.query(("state", "tenant", "user", "kind", "limit"))
        if "state" in q and q["state"] not in STATES:
            raise ApiError(400, f"must be one of {', '.join(STATES)}", "state")
        if "kind" in q and q["kind"] not in KINDS:
            raise ApiError(400, f"must be one of {', '.join(KINDS)}", "kind")
        limit = 1000
        if "limit" in q:
            if not q["limit"].isdigit() or not 1 <= int(q["limit"]) <= 10000:
                raise ApiError(400, "must be an integer from 1 to 10000", "limit")
            limit = int(q["limit"])
        if not who.can_view:
            if q.get("user", who.name) != who.name:
                raise ApiError(403, "seeing other users' requests needs custom:gpuaas:view", "user")
            q["user"] = who.name
        rows = self.arbiter.store.query(
            state=q.get("state"),
            tenant=q.get("tenant"),
            user=q.get("user"),
            kind=q.get("kind"),
            limit=limit,
        )
        out = []
        for row in rows:
            live = self.arbiter.requests.get(row.id)
            out.append(self.arbiter.request_json(live if live is not None else row))
        self.send(out)

    async def post(self) -> None:
        who = self.require()
        data = self.json_body()
        _check_keys(data, SUBMIT_KEYS)
        for key in ("tenant", "kind", "gpus"):
            if key not in data:
                raise ApiError(400, "is required", key)
        tenant = want_str(data, "tenant")
        kind = want_str(data, "kind")
        if kind not in KINDS:
            raise ApiError(400, f"must be one of {', '.join(KINDS)}", "kind")
        gpus = want_int(data, "gpus", minimum=1)
        flavor = want_str(data, "flavor", nullable=True)
        priority = want_int(data, "priority") if data.get("priority") is not None else 0
        name = want_str(data, "name", nullable=True)
        assert tenant is not None and kind is not None
        if not who.use and not who.admin:
            raise ApiError(403, "submitting needs custom:gpuaas:use")
        if tenant in self.arbiter.config.tenants and not who.may_charge(tenant):
            raise ApiError(403, f"you are not a member of tenant {tenant!r}", "tenant")
        # Answered once the submission (and whatever it admitted) is committed; `obj` is
        # the request as of its own decision.
        req, obj = await self.arbiter.submit(
            tenant=tenant,
            user=who.name,
            kind=kind,
            gpus=gpus,
            flavor=flavor,
            priority=priority,
            name=name,
        )
        if req.state is State.REJECTED:
            raise ApiError(422, req.reason, _reject_field(req.reason), id=req.id, request=obj)
        self.set_header("Location", f"{self.settings['base_url']}api/requests/{req.id}")
        self.send(obj, 201)


class RequestHandler(BaseHandler):
    def _find(self, rid: str) -> dict[str, Any]:
        obj = self.arbiter.view(rid)
        if obj is None:
            raise ApiError(404, f"no request {rid}")
        return obj

    def get(self, rid: str) -> None:
        who = self.require()
        obj = self._find(rid)
        if not who.may_see(obj["user"]):
            raise ApiError(403, "not your request (seeing it needs custom:gpuaas:view)")
        self.send(obj)

    async def delete(self, rid: str) -> None:
        who = self.require()
        owner = self.arbiter.owner_of(rid)
        if owner is None:
            raise ApiError(404, f"no request {rid}")
        if owner != who.name and not who.admin:
            raise ApiError(403, "not your request (cancelling it needs custom:gpuaas:admin)")
        try:
            _, obj = await self.arbiter.cancel(rid, who.name)
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        self.send(obj)


HEARTBEAT_KEYS = ("busy", "utilization")


class HeartbeatHandler(BaseHandler):
    async def post(self, rid: str) -> None:
        who = self.require()
        data = self.json_body()
        _check_keys(data, HEARTBEAT_KEYS)
        if not isinstance(data.get("busy"), bool):
            raise ApiError(400, "is required and must be true or false", "busy")
        util = data.get("utilization")
        if util is not None:
            if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 1:
                raise ApiError(400, "must be a number from 0 to 1", "utilization")
            util = float(util)
        owner = self.arbiter.owner_of(rid)
        if owner is None:
            raise ApiError(404, f"no request {rid}")
        if owner != who.name:
            raise ApiError(403, "only the holder may heartbeat its request")
        try:
            _, obj = await self.arbiter.heartbeat(rid, data["busy"], util)
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        self.send(obj)


class EventsHandler(BaseHandler):
    """Server-Sent Events: `event: <decision>` / `data: <decision JSON + request>`.

    The bus calls `_deliver` with everything published in its last period; at most one
    write is in flight per stream (tornado's flush futures must not overlap) and what
    arrives meanwhile is sent when it completes. A stream that cannot keep up piles up
    in its listener until the bus drops it.
    """

    _listener: Listener | None = None
    _writing = False
    _last_write = 0.0

    async def get(self) -> None:
        who = self.require()
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("X-Accel-Buffering", "no")  # proxies must not buffer the stream
        keepalive = float(self.settings.get("keepalive_interval", 15.0))
        bus = self.arbiter.bus
        # Viewers hear everything; a user, what is about their own requests (indexed).
        owner = None if who.can_view else who.name
        # A reconnecting client names the last event it heard: it gets what it missed
        # (or a `reset`). A new stream learns the current id, to resume from (events.py).
        last = self.request.headers.get("Last-Event-ID")
        listener = self._listener = bus.subscribe(self._deliver, owner=owner, last_event_id=last)
        try:
            resume = "" if last is not None else f"id: {bus.last_id}\n"
            self._send(f": connected\n{resume}\n".encode())
            while not await listener.wait(keepalive):
                if time.monotonic() - self._last_write >= keepalive * 0.9:
                    self._send(b": keepalive\n\n")
        finally:
            bus.unsubscribe(listener)
        if not self._finished:
            self.finish()

    def _deliver(self) -> None:
        listener = self._listener
        if listener is None or self._writing:
            return  # sent when the write in flight completes
        events = listener.take()
        if events:
            self._send(b"".join(e.wire for e in events))

    def _send(self, data: bytes) -> None:
        listener = self._listener
        if self._finished or listener is None or listener.ended:
            return
        self.write(data)
        self._last_write = time.monotonic()
        self._writing = True
        self.flush().add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        self._writing = False
        listener = self._listener
        if listener is None:
            return
        if future.cancelled() or future.exception() is not None:
            listener.end()  # the client went away
        elif listener.pending:
            self._deliver()

    def on_connection_close(self) -> None:
        if self._listener is not None:
            self._listener.end()


class OpenAPIHandler(BaseHandler):
    async def prepare(self) -> None:  # anyone: no identity needed
        return

    def get(self) -> None:
        self.send(build_openapi(self.settings["base_url"]))


class MetricsHandler(BaseHandler):
    """Prometheus text; a token with the view scope unless --metrics-public (auth.py)."""

    async def prepare(self) -> None:
        if not self.settings.get("metrics_public"):
            await super().prepare()

    def get(self) -> None:
        if not self.settings.get("metrics_public") and not may_scrape(self.require()):
            raise ApiError(403, METRICS_FORBIDDEN)
        self.arbiter.snapshot_metrics()
        body, content_type = self.arbiter.metrics.render()
        self.set_header("Content-Type", content_type)
        self.finish(body)


class MeHandler(BaseHandler):
    def get(self) -> None:
        who = self.require()
        tenants = [t for t in self.arbiter.config.tenants if who.may_charge(t)]
        self.send({**who.to_json(), "tenants": tenants})


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
        (rf"{b}metrics", MetricsHandler),
    ]
