"""The REST API and the event stream (INTERFACES.md, "Gateway REST API").

Every handler answers JSON; every error is `{"error": ..., "field": ...}` with a 4xx status,
never an HTML page or a 500 for bad input (`write_error`). Input is validated strictly:
unknown keys, booleans where integers belong, and non-positive GPU counts are errors that
name the field, because a silently ignored `gpu: 4` typo would queue the wrong request.
The bounds themselves (names, integers, text, JSON) are in validate.py. When the store
cannot be reached the answer is 503 with `Retry-After` and the same JSON body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.exc import SQLAlchemyError
from tornado import web

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.admission.model import KINDS, State
from jupyter_gpuaas.words import about_field

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
from .leader import LeaderUnreachable, forward
from .openapi import build_openapi
from .store import StoreUnavailable, describe
from .validate import (
    INT32_MAX,
    LIMIT_DEFAULT,
    LIMIT_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUERY_MAX,
    InputError,
    check_int,
    check_name,
    check_text,
    format_cursor,
    parse_cursor,
    parse_json_object,
    parse_limit,
)

log = logging.getLogger("jupyter_gpuaas.gateway")

STATES = tuple(s.value for s in State)
REQUEST_ID = re.compile(r"r-[0-9a-f]{16}")


class ApiError(web.HTTPError):
    """An HTTP error with the JSON body of the API."""

    def __init__(self, status: int, error: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(status, reason=None)
        self.error = about_field(field, error)  # "gpus must be at least 1": one sentence
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

    def _owner(self, rid: str) -> str:
        """Who submitted `rid` (404 if nobody: ids that no submission makes, at once)."""
        self.arbiter.check_available()
        owner = self.arbiter.owner_of(rid) if REQUEST_ID.fullmatch(rid) else None
        if owner is None:
            raise ApiError(404, f"no request {rid[:40]}")
        return owner

    def send(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        # Exceptions that are answers, not bugs: bad input (400) and a store that cannot
        # be reached or written now (503; nothing was decided, try again).
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, InputError):
            status_code = 400
        elif isinstance(exc, LeaderUnreachable):
            status_code = 502
        elif isinstance(exc, (StoreUnavailable, SQLAlchemyError)):
            status_code = 503
        super().send_error(status_code, **kwargs)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, (StoreUnavailable, SQLAlchemyError)):
            why = value.message if isinstance(value, StoreUnavailable) else describe(value)
            log.warning("%s %s: 503: %s", self.request.method, self.request.path, why)
        elif isinstance(value, LeaderUnreachable):
            log.warning("%s %s: 502: %s", self.request.method, self.request.path, value)
        elif isinstance(value, InputError):
            log.info("%s %s: 400: %s", self.request.method, self.request.path, value.message)
        else:
            super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if status_code == 405:  # RFC 9110: say which methods the route has
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        body: dict[str, Any] = {"error": self._reason, "field": None}
        if isinstance(exc, ApiError):
            body = {"error": exc.error, "field": exc.field, **exc.extra}
        elif isinstance(exc, InputError):
            body = {"error": exc.message, "field": exc.field}
        elif isinstance(exc, LeaderUnreachable):
            body = {"error": str(exc), "field": None}
        elif isinstance(exc, (StoreUnavailable, SQLAlchemyError)):
            retry = exc.retry_after if isinstance(exc, StoreUnavailable) else 2
            self.set_header("Retry-After", str(retry))
            body = {"error": f"{_why(exc)}; try again in a few seconds", "field": None}
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            body["error"] = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(body))

    def json_body(self) -> dict[str, Any]:
        return parse_json_object(self.request.body)

    def raw_body(self) -> bytes:
        return self.request.body or b""

    async def forwarded(self) -> bool:
        """On a standby: send this change to the leader and answer with its answer
        (leader.py); True once answered. The leader checks everything again."""
        if self.arbiter.leader or not self.settings.get("forward_writes", True):
            return False
        await forward(self, self.raw_body())
        return True

    @classmethod
    def allowed_methods(cls) -> list[str]:
        """The methods this route implements (tornado answers the others 405)."""
        base = web.RequestHandler
        return [
            m
            for m in cls.SUPPORTED_METHODS
            if getattr(cls, m.lower()) is not getattr(base, m.lower())
        ]

    def query(self, allowed: tuple[str, ...]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, values in self.request.query_arguments.items():
            if key not in allowed:
                raise ApiError(
                    400,
                    f"unknown query parameter {key[:40]!r} (allowed: {', '.join(allowed)})",
                    key,
                )
            value = values[-1].decode("utf-8", "replace")
            if len(value) > QUERY_MAX or "\x00" in value:
                raise ApiError(
                    400, f"{key} must be at most {QUERY_MAX} characters, without NUL", key
                )
            out[key] = value
        return out


def _why(exc: BaseException) -> str:
    """What a caller is told (the details are in the gateway's log)."""
    if isinstance(exc, StoreUnavailable):
        return exc.public
    return StoreUnavailable.public


@web.stream_request_body
class BodyHandler(BaseHandler):
    """A route that takes a JSON body: read only after the caller is authenticated, and
    never more than `max_body_size` bytes (413 at once from Content-Length, or as soon
    as a chunked body passes it). The HTTP server's own cap stays as the outer bound."""

    _chunks: list[bytes]
    _size = 0
    _too_big = False

    async def prepare(self) -> None:
        await super().prepare()
        self._chunks = []
        if self.request.method not in ("POST", "PUT"):
            return
        self.require()  # 401/403 before a byte of the body is read
        limit = int(self.settings.get("max_body_size", 64 * 1024))
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > limit:
            # Answer now; the connection closes after the answer instead of reading on
            # (without this, tornado's own cap would append a bare 400 to our 413).
            self.request.connection.set_max_body_size(int(length))  # type: ignore[union-attr]
            self._too_big = True
            raise ApiError(413, f"the body is larger than {limit // 1024} KiB")

    def data_received(self, chunk: bytes) -> None:
        if self._too_big:
            return
        self._size += len(chunk)
        if self._size > int(self.settings.get("max_body_size", 64 * 1024)):
            self._too_big, self._chunks = True, []
        else:
            self._chunks.append(chunk)

    def raw_body(self) -> bytes:
        if self._too_big:
            limit = int(self.settings.get("max_body_size", 64 * 1024))
            raise ApiError(413, f"the body is larger than {limit // 1024} KiB")
        return b"".join(self._chunks)

    def json_body(self) -> dict[str, Any]:
        if self._too_big:
            limit = int(self.settings.get("max_body_size", 64 * 1024))
            raise ApiError(413, f"the body is larger than {limit // 1024} KiB")
        return parse_json_object(b"".join(self._chunks))


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise ApiError(400, f"unknown key {key[:40]!r} (allowed: {', '.join(allowed)})", key)


def want_str(data: Mapping[str, Any], key: str, *, nullable: bool = False) -> str | None:
    value = data.get(key)
    if value is None and nullable:
        return None
    return check_text(value, key)


def _reject_field(reason: str) -> str | None:
    text = reason.lower()
    for field in ("tenant", "flavor"):
        if field in text:
            return field
    return "gpus"


class DevicesHandler(BaseHandler):
    def get(self) -> None:
        who = self.require()
        self.arbiter.check_available()
        out = self.arbiter.devices_json()
        for d in out["devices"]:  # other users' names only with the view scope
            holder = d.get("holder")
            if holder is not None and not who.may_see(holder["user"]):
                holder["user"] = None
        self.send(out)


class TenantsHandler(BaseHandler):
    def get(self) -> None:
        self.require()
        self.arbiter.check_available()
        self.send(self.arbiter.tenants_json())


class TenantHandler(BodyHandler):
    async def put(self, name: str) -> None:
        who = self.require()
        if not who.admin:
            raise ApiError(403, "changing quotas needs custom:gpuaas:admin")
        if await self.forwarded():
            return
        check_name(name, "name")
        spec = self.json_body()
        if spec.get("cohort") is not None:
            check_name(spec["cohort"], "cohort")
        try:
            await self.arbiter.put_tenant(name, spec)
        except SpecError as e:
            raise ApiError(400, str(e), e.key) from None
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        tenants = self.arbiter.tenants_json()
        one = next(t for t in tenants["tenants"] if t["name"] == name)
        self.send({**one, "simulated": tenants["simulated"]})


SUBMIT_KEYS = ("tenant", "kind", "gpus", "flavor", "priority", "name")


class RequestsHandler(BodyHandler):
    def get(self) -> None:
        who = self.require()
        self.arbiter.check_available()
        q = self.query(("state", "tenant", "user", "kind", "limit", "cursor"))
        if "state" in q and q["state"] not in STATES:
            raise ApiError(400, f"state must be one of {', '.join(STATES)}", "state")
        if "kind" in q and q["kind"] not in KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(KINDS)}", "kind")
        limit = parse_limit(q["limit"], maximum=LIMIT_MAX) if "limit" in q else LIMIT_DEFAULT
        after = parse_cursor(q["cursor"]) if "cursor" in q else None
        if not who.can_view:
            if q.get("user", who.name) != who.name:
                raise ApiError(403, "seeing other users' requests needs custom:gpuaas:view", "user")
            q["user"] = who.name
        rows = self.arbiter.store.query(
            state=q.get("state"),
            tenant=q.get("tenant"),
            user=q.get("user"),
            kind=q.get("kind"),
            limit=limit + 1,
            after=after,
        )
        if len(rows) > limit:  # more exist: RFC 8288 says where (the list is never cut)
            rows = rows[:limit]
            nxt = {k: v for k, v in q.items() if k != "cursor"}
            nxt["cursor"] = format_cursor(rows[-1].created, rows[-1].id)
            url = f"{self.settings['base_url']}api/requests?{urlencode(sorted(nxt.items()))}"
            self.set_header("Link", f'<{url}>; rel="next"')
        out = []
        for row in rows:
            live = self.arbiter.requests.get(row.id)
            out.append(self.arbiter.request_json(live if live is not None else row))
        self.send(out)

    async def post(self) -> None:
        who = self.require()
        if await self.forwarded():
            return
        data = self.json_body()
        _check_keys(data, SUBMIT_KEYS)
        for key in ("tenant", "kind", "gpus"):
            if key not in data:
                raise ApiError(400, f"{key} is required", key)
        tenant = check_name(data["tenant"], "tenant")
        kind = data["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(KINDS)}", "kind")
        # More GPUs than any node has is valid input that can never be admitted: the
        # core rejects it (422, with the reason); beyond a 32-bit integer it is bad input.
        gpus = check_int(data["gpus"], "gpus", minimum=1, maximum=INT32_MAX)
        flavor = data.get("flavor")
        if flavor is not None:
            flavor = check_name(flavor, "flavor")
        priority = 0
        if data.get("priority") is not None:
            priority = check_int(
                data["priority"], "priority", minimum=PRIORITY_MIN, maximum=PRIORITY_MAX
            )
        name = want_str(data, "name", nullable=True)
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
        self.arbiter.check_available()
        if not REQUEST_ID.fullmatch(rid):
            raise ApiError(404, "no such request (ids look like r-0123456789abcdef)")
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
        if await self.forwarded():
            return
        owner = self._owner(rid)
        if owner != who.name and not who.admin:
            raise ApiError(403, "not your request (cancelling it needs custom:gpuaas:admin)")
        try:
            _, obj = await self.arbiter.cancel(rid, who.name)
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        self.send(obj)


HEARTBEAT_KEYS = ("busy", "utilization")


class HeartbeatHandler(BodyHandler):
    async def post(self, rid: str) -> None:
        who = self.require()
        if await self.forwarded():
            return
        data = self.json_body()
        _check_keys(data, HEARTBEAT_KEYS)
        if not isinstance(data.get("busy"), bool):
            raise ApiError(400, "busy is required and must be true or false", "busy")
        util = data.get("utilization")
        if util is not None:
            if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 1:
                raise ApiError(400, "utilization must be a number from 0 to 1", "utilization")
            util = float(util)
        owner = self._owner(rid)
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


class HealthHandler(BaseHandler):
    """For a load balancer or a Kubernetes probe: anyone, no token (nothing private)."""

    async def prepare(self) -> None:
        return

    def get(self) -> None:
        arbiter = self.arbiter
        store, status, code = "ok", "ok", 200
        try:
            arbiter.check_available()
            arbiter.store.ping()
        except StoreUnavailable as e:
            store, status, code = e.state, "unavailable", 503
            self.set_header("Retry-After", str(e.retry_after))
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
        (rf"{b}api/health", HealthHandler),
        (rf"{b}metrics", MetricsHandler),
    ]
