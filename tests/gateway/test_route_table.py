"""Every route of the gateway, and who may call it: one table.

The gateway runs as a JupyterHub service (HubOAuth), in-process on a real socket, against
a FAKE Hub API: a tornado handler answering `GET /hub/api/user` as JupyterHub 5 does for
a service (the user model with the token's scopes; 403 for a token it does not know or
whose `expires_at` has passed, as `APIToken.find` ignores expired tokens). Callers are
tokens in the Authorization header:

    anon     no token
    owner    ann, custom:gpuaas:use, member of vision: owns the requests in the table
    other    bob, custom:gpuaas:use, member of nlp
    view     vic, custom:gpuaas:view only
    admin    boss, custom:gpuaas:admin
    wrong    a token the Hub never issued
    expired  ann's token whose expiry has passed

The routes come from the running app: a route without a row fails the test, so a new
route cannot ship without saying who may call it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlparse

import pytest
from gwutil import Gateway, free_port
from tornado import web
from tornado.httpclient import AsyncHTTPClient

ACCESS = "access:services!service=gpuaas"
PREFIX = "/services/gpuaas/"
WHO = ("anon", "owner", "other", "view", "admin", "wrong", "expired")
TOKENS = {
    "owner": "owner-token-1",
    "other": "other-token-2",
    "view": "view-token-3",
    "admin": "admin-token-4",
    "wrong": "wrong-token-5",
    "expired": "expired-token-6",
}


def model(name: str, scopes: list[str], groups: list[str]) -> dict[str, Any]:
    return {"kind": "user", "name": name, "groups": groups, "scopes": [ACCESS, *scopes]}


class FakeHub:
    """`GET /hub/api/user` by token, with expiry."""

    def __init__(self) -> None:
        self.models = {
            TOKENS["owner"]: model("ann", ["custom:gpuaas:use"], ["vision"]),
            TOKENS["other"]: model("bob", ["custom:gpuaas:use"], ["nlp"]),
            TOKENS["view"]: model("vic", ["custom:gpuaas:view"], []),
            TOKENS["admin"]: model("boss", ["custom:gpuaas:admin"], []),
            TOKENS["expired"]: model("ann", ["custom:gpuaas:use"], ["vision"]),
        }
        self.expires_at = {TOKENS["expired"]: time.time() - 60}
        hub = self

        class User(web.RequestHandler):
            def get(self) -> None:
                token = (self.request.headers.get("Authorization") or "").split(" ")[-1]
                found = hub.models.get(token)
                if found is None or hub.expires_at.get(token, float("inf")) <= time.time():
                    raise web.HTTPError(403)
                self.finish(json.dumps(found))

        self.port = free_port()
        self.server = web.Application([(r"/hub/api/user", User)]).listen(self.port, "127.0.0.1")


Expect = dict[str, int]  # caller -> status


@dataclass
class Row:
    method: str
    route: str  # the route pattern below the prefix, as the app lists it
    path: str  # what is called; {rid}: the shared request, {fresh}: a new one per call
    expect: Expect
    body: Any = None
    form: dict[str, str] | None = None
    stream: bool = False


def row(method: str, route: str, *codes: int, path: str | None = None, **kw: Any) -> Row:
    expect = dict(zip(WHO, codes, strict=True))
    return Row(method, route, path if path is not None else route, expect, **kw)


# anon owner other view admin wrong expired
READ = (401, 200, 200, 200, 200, 401, 401)
TABLE = [
    row("GET", "api/devices", *READ),
    row("GET", "api/tenants", *READ),
    row("GET", "api/me", *READ),
    # Advice about one's own work for everyone who may read; all of it for an admin.
    row("GET", "api/advice", *READ),
    row("GET", "api/requests", *READ),
    row("GET", "api/requests", 401, 200, 403, 200, 200, 401, 401, path="api/requests?user=ann"),
    row(
        "POST",
        "api/requests",
        *(401, 201, 403, 403, 201, 401, 401),
        body={"tenant": "vision", "kind": "job", "gpus": 1},
    ),
    row(
        "PUT",
        "api/tenants/([^/]+)",
        *(401, 403, 403, 403, 200, 401, 401),
        path="api/tenants/nlp",
        body={"quota": {"a100": 2}},
    ),
    row(
        "GET",
        "api/requests/([^/]+)",
        *(401, 200, 403, 200, 200, 401, 401),
        path="api/requests/{rid}",
    ),
    row(
        "DELETE",
        "api/requests/([^/]+)",
        *(401, 200, 403, 403, 200, 401, 401),
        path="api/requests/{fresh}",
    ),
    row(
        "POST",
        "api/requests/([^/]+)/heartbeat",
        *(401, 200, 403, 403, 403, 401, 401),  # only the holder renews its lease
        path="api/requests/{rid}/heartbeat",
        body={"busy": True},
    ),
    row("GET", "api/events", *READ, stream=True),
    row("GET", r"api/openapi\.json", *(200,) * 7, path="api/openapi.json"),
    row("GET", "metrics", *(401, 403, 403, 200, 200, 401, 401)),  # view scope
    row("GET", "api/health", *(200,) * 7),  # anyone (a load balancer's probe)
    # The landing page: a browser without a login goes to the Hub's OAuth (302).
    row("GET", "", *(302, 200, 200, 200, 200, 302, 302)),
    row(
        "POST",
        "tenant",
        *(401, 403, 403, 403, 303, 401, 401),
        form={"tenant": "nlp", "quota.a100": "2", "quota.t4": ""},
    ),
    # Confirmed (the page asks first: without confirm=yes it answers the question, 200).
    row(
        "POST",
        "cancel",
        *(401, 303, 403, 403, 303, 401, 401),
        form={"request": "{fresh}", "confirm": "yes"},
    ),
    row("POST", "cancel", *(401, 200, 403, 403, 200, 401, 401), form={"request": "{fresh}"}),
    # The OAuth callback (JupyterHub's HubOAuthCallbackHandler): without the state cookie
    # the login began with, it is refused; somebody already logged in is sent back (302).
    row(
        "GET",
        "oauth_callback",
        *(403, 302, 302, 302, 302, 403, 403),
        path="oauth_callback?code=x&state=y",
    ),
]


def app_routes(gw: Gateway) -> set[str]:
    webapp = gw.app.http_server.request_callback
    out = set()
    for rule in webapp.wildcard_router.rules:
        pattern = rule.matcher.regex.pattern.rstrip("$")
        assert pattern.startswith(PREFIX), pattern
        out.add(pattern[len(PREFIX) :])
    return out


async def stream_status(url: str, headers: dict[str, str]) -> int:
    """The status of an SSE answer, without waiting for the stream to end."""
    u = urlparse(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        head = [f"GET {u.path} HTTP/1.0", f"Host: {u.netloc}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1])
    finally:
        writer.close()


@pytest.mark.asyncio
@pytest.mark.slow
async def test_every_route_by_every_caller(
    make_gateway: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    hub = FakeHub()
    try:
        monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{hub.port}/hub/api")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpuaas")
        monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpuaas")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", PREFIX)
        gw: Gateway = await make_gateway(
            hub_service=True,
            base_url=PREFIX,
            cookie_secret_file=str(tmp_path / "gpuaas_cookie_secret"),
        )
        routes = app_routes(gw)
        missing = routes - {r.route for r in TABLE}
        assert not missing, f"routes without a row in TABLE: {sorted(missing)}"
        owner = gw.client(TOKENS["owner"])
        shared = await owner.submit("vision", "kernel", 1)
        assert shared["state"] == "admitted"
        client = AsyncHTTPClient()
        failures = []
        checked = 0
        for r in TABLE:
            if r.route not in routes:
                continue  # a route this build does not have yet (api/health)
            for who in WHO:
                fresh = ""
                if "{fresh}" in r.path or (r.form and "{fresh}" in r.form.values()):
                    fresh = (await owner.submit("vision", "job", 1))["id"]
                path = r.path.replace("{rid}", shared["id"]).replace("{fresh}", fresh)
                headers = {"Authorization": f"token {TOKENS[who]}"} if who in TOKENS else {}
                if r.stream:
                    status = await stream_status(gw.url + path, headers)
                else:
                    body: str | None = None
                    if r.form is not None:
                        form = {k: v.replace("{fresh}", fresh) for k, v in r.form.items()}
                        body = urlencode(form)
                        headers["Content-Type"] = "application/x-www-form-urlencoded"
                    elif r.body is not None:
                        body = json.dumps(r.body)
                        headers["Content-Type"] = "application/json"
                    resp = await client.fetch(
                        gw.url + path,
                        method=r.method,
                        body=body,
                        headers=headers,
                        raise_error=False,
                        follow_redirects=False,
                        allow_nonstandard_methods=True,
                    )
                    status = resp.code
                    if status == 500:
                        failures.append(f"{r.method} {path} as {who}: 500 {resp.body[:200]!r}")
                    location = resp.headers.get("Location") or ""
                    if r.route == "" and status == 302 and "/oauth2/authorize" not in location:
                        failures.append(f"{r.method} {path} as {who}: 302 elsewhere")
                checked += 1
                if status != r.expect[who]:
                    failures.append(f"{r.method} /{path} as {who}: {status}, want {r.expect[who]}")
        assert not failures, "\n".join(failures)
        assert checked >= 17 * len(WHO)
    finally:
        hub.server.stop()


@pytest.mark.asyncio
@pytest.mark.slow
async def test_a_token_that_expires_stops_working_within_the_cache_age(
    make_gateway: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Seen while valid, then expired at the Hub: refused once the gateway's cached answer
    is older than --hub-auth-cache-max-age (HubAuth caches the Hub's answers)."""
    hub = FakeHub()
    try:
        monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{hub.port}/hub/api")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", PREFIX)
        gw: Gateway = await make_gateway(
            hub_service=True,
            base_url=PREFIX,
            cookie_secret_file=str(tmp_path / "gpuaas_cookie_secret"),
            hub_auth_cache_max_age=1,
        )
        token = TOKENS["owner"]
        assert (await gw.raw("GET", "api/me", who=token))[0] == 200
        hub.expires_at[token] = time.time()
        await asyncio.sleep(1.5)
        status, answer = await gw.raw("GET", "api/me", who=token)
        assert status == 401, answer
        assert answer["error"] == "invalid or expired token"
    finally:
        hub.server.stop()
