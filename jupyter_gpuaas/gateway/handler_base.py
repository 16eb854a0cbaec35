"""What every handler of the REST API shares (INTERFACES.md, "Gateway REST API").

Every handler answers JSON; every error is `{"error": ..., "field": ...}` with a 4xx status,
never an HTML page or a 500 for bad input (`write_error`). Every answer carries
`Content-Security-Policy: default-src 'none'; frame-ancestors 'none'` and
`X-Content-Type-Options: nosniff`: a JSON answer is never a page, a script or a frame,
whatever a browser is tricked into loading it as. A body must say it is JSON
(`Content-Type: application/json`, optionally `; charset=utf-8`), else 415, and each key
of a JSON object may appear once (validate.py). Input is validated strictly:
unknown keys, booleans where integers belong, and non-positive GPU counts are errors that
name the field, because a silently ignored `gpu: 4` typo would queue the wrong request.
The bounds themselves (names, integers, text, JSON) are in validate.py. When the store
cannot be reached the answer is 503 with `Retry-After` and the same JSON body.
The routes are in handlers.py, requests_api.py and tenants_api.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from tornado import web
from tornado.http1connection import HTTP1Connection

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.words import about_field

from .arbiter import Arbiter
from .auth import (
    HubUnreachable,
    Identity,
    TokenTable,
    identity_from_hub_model,
    token_from_header,
)
from .leader import LeaderUnreachable, forward
from .store import StoreUnavailable, describe
from .validate import QUERY_MAX, InputError, check_text, json_media_type, parse_json_object

log = logging.getLogger("jupyter_gpuaas.gateway")

STATES = tuple(s.value for s in State)
#: The CSP of every JSON answer: nothing may load from it, nothing may frame it.
JSON_CSP = "default-src 'none'; frame-ancestors 'none'"
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
        self.set_header("Content-Security-Policy", JSON_CSP)
        self.set_header("X-Content-Type-Options", "nosniff")

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
        from jupyterhub._xsrf_utils import get_xsrf_token

        token: bytes = get_xsrf_token(self, cookie_path=hub_auth.base_url)
        return token

    async def prepare(self) -> None:
        self.identity = await self._identify()
        # Never answer from memory ahead of the store (a group's write in flight).
        await self.arbiter.settled()

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
        elif isinstance(exc, (StoreUnavailable, SQLAlchemyError, HubUnreachable)):
            status_code = 503
        super().send_error(status_code, **kwargs)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, (StoreUnavailable, SQLAlchemyError)):
            why = value.message if isinstance(value, StoreUnavailable) else describe(value)
            log.warning("%s %s: 503: %s", self.request.method, self.request.path, why)
        elif isinstance(value, LeaderUnreachable):
            log.warning("%s %s: 502: %s", self.request.method, self.request.path, value)
        elif isinstance(value, HubUnreachable):
            log.warning("%s %s: 503: %s", self.request.method, self.request.path, value)
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
        elif isinstance(exc, HubUnreachable):
            self.set_header("Retry-After", str(exc.retry_after))
            body = {"error": exc.public, "field": None}
        elif isinstance(exc, (StoreUnavailable, SQLAlchemyError)):
            retry = exc.retry_after if isinstance(exc, StoreUnavailable) else 2
            self.set_header("Retry-After", str(retry))
            body = {"error": f"{_why(exc)}; try again in a few seconds", "field": None}
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            body["error"] = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(body))

    def json_body(self) -> dict[str, Any]:
        return self.parse_json(self.request.body or b"")

    def parse_json(self, body: bytes) -> dict[str, Any]:
        """A JSON object body: 415 unless it says it is JSON, 400 unless it is one."""
        if body:
            why = json_media_type(self.request.headers.get("Content-Type"))
            if why is not None:
                raise ApiError(415, why, "Content-Type")
        return parse_json_object(body)

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
            connection = self.request.connection
            if isinstance(connection, HTTP1Connection):
                connection.set_max_body_size(int(length))
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
        return self.parse_json(b"".join(self._chunks))


def check_keys(data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise ApiError(400, f"unknown key {key[:40]!r} (allowed: {', '.join(allowed)})", key)


def want_str(data: Mapping[str, Any], key: str, *, nullable: bool = False) -> str | None:
    value = data.get(key)
    if value is None and nullable:
        return None
    return check_text(value, key)
