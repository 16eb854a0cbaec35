"""Who may do what, on every route (token auth over real HTTP), bad input on every route,
and the JupyterHub scope mapping.

The HubAuth tests feed `identity_from_hub_model` fake user-model dicts shaped like what
JupyterHub 5 returns to a service: they do NOT run a Hub (the real-Hub test is issue 4).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from gwutil import Gateway

from jupyter_gpuaas.gateway.auth import Identity, TokenError, TokenTable, identity_from_hub_model
from jupyter_gpuaas.gateway.openapi import build_openapi

DOC = build_openapi("/")
ERROR = {"$ref": "#/components/schemas/Error", "components": DOC["components"]}

WHO = ["alice", "bob", "carol", "root", "eve", None, "bad-token-xyz"]


def expect_row(**codes: int) -> list[int]:
    """Codes in WHO's order; anonymous and bad token are always 401."""
    return [codes["alice"], codes["bob"], codes["carol"], codes["root"], codes["eve"], 401, 401]


@pytest.mark.asyncio
async def test_auth_matrix(make_gateway: Any) -> None:
    gw: Gateway = await make_gateway()
    mine = await gw.client("alice").submit("vision", "kernel", 1)
    rid = mine["id"]
    ok = {"alice": 200, "bob": 200, "carol": 200, "root": 200, "eve": 200}
    matrix: list[tuple[str, str, Any, list[int]]] = [
        ("GET", "api/devices", None, expect_row(**ok)),
        ("GET", "api/tenants", None, expect_row(**ok)),
        ("GET", "api/me", None, expect_row(**ok)),
        ("GET", "api/requests", None, expect_row(**ok)),
        (
            "PUT",
            "api/tenants/nlp",
            {"quota": {"a100": 2}},
            expect_row(alice=403, bob=403, carol=403, root=200, eve=403),
        ),
        (
            "POST",
            "api/requests",
            {"tenant": "vision", "kind": "job", "gpus": 1},
            expect_row(alice=201, bob=403, carol=201, root=201, eve=403),
        ),
        (  # wrong tenant: alice is not in nlp
            "POST",
            "api/requests",
            {"tenant": "nlp", "kind": "job", "gpus": 1},
            expect_row(alice=403, bob=201, carol=403, root=201, eve=403),
        ),
        (
            "GET",
            f"api/requests/{rid}",
            None,
            expect_row(alice=200, bob=403, carol=200, root=200, eve=403),
        ),
        (
            "POST",
            f"api/requests/{rid}/heartbeat",
            {"busy": True},
            expect_row(alice=200, bob=403, carol=403, root=403, eve=403),
        ),
        (
            "GET",
            "api/requests?user=alice",
            None,
            expect_row(alice=200, bob=403, carol=200, root=200, eve=403),
        ),
    ]
    failures = []
    for method, path, body, codes in matrix:
        for who, code in zip(WHO, codes, strict=True):
            status, answer = await gw.raw(method, path, body, who=who)
            if status != code:
                failures.append(f"{method} {path} as {who}: {status} (want {code}) {answer}")
            if status >= 400:
                jsonschema.validate(answer, ERROR)
    # anyone: the OpenAPI document; metrics: the view scope (by default)
    for who in WHO:
        status, _ = await gw.raw("GET", "api/openapi.json", who=who)
        if status != 200:
            failures.append(f"GET api/openapi.json as {who}: {status}")
    scrapers = expect_row(alice=403, bob=403, carol=200, root=200, eve=403)
    for who, code in zip(WHO, scrapers, strict=True):
        status, _ = await gw.raw("GET", "metrics", who=who)
        if status != code:
            failures.append(f"GET metrics as {who}: {status} (want {code})")
    # events: refused before streaming
    for who in (None, "bad-token-xyz"):
        status, _ = await gw.raw("GET", "api/events", who=who)
        if status != 401:
            failures.append(f"GET api/events as {who}: {status}")
    # cancelling: owner or admin, not other users nor view
    for who, code in (("bob", 403), ("carol", 403), ("eve", 403), (None, 401)):
        status, _ = await gw.raw("DELETE", f"api/requests/{rid}", who=who)
        if status != code:
            failures.append(f"DELETE as {who}: {status} (want {code})")
    status, _ = await gw.raw("DELETE", f"api/requests/{rid}", who="root")
    if status != 200:
        failures.append(f"DELETE as root: {status}")
    other = await gw.client("alice").submit("vision", "job", 1)
    status, _ = await gw.raw("DELETE", f"api/requests/{other['id']}", who="alice")
    if status != 200:
        failures.append(f"DELETE as owner: {status}")
    assert not failures, "\n".join(failures)


@pytest.mark.asyncio
async def test_metrics_can_be_public(make_gateway: Any) -> None:
    gw: Gateway = await make_gateway(metrics_public=True)
    assert (await gw.raw("GET", "metrics", who=None))[0] == 200
    assert (await gw.raw("GET", "metrics", who="bob"))[0] == 200


def test_bearer_and_token_schemes() -> None:
    from jupyter_gpuaas.gateway.auth import token_from_header

    assert token_from_header("token abc") == "abc"
    assert token_from_header("Bearer abc") == "abc"
    assert token_from_header("Basic abc") is None
    assert token_from_header("token ") is None
    assert token_from_header(None) is None


@pytest.mark.asyncio
async def test_bearer_over_http(gw: Gateway) -> None:
    status, _ = await gw.raw("GET", "api/me", who=None, Authorization="Bearer alice-token-0001")
    assert status == 200


SUBMIT_BAD: list[tuple[Any, str | None]] = [
    ("{", None),
    ("[1, 2]", None),
    ("", None),
    ({"tenant": "vision", "kind": "job"}, "gpus"),
    ({"tenant": "vision", "gpus": 1}, "kind"),
    ({"kind": "job", "gpus": 1}, "tenant"),
    ({"tenant": "vision", "kind": "job", "gpus": "2"}, "gpus"),
    ({"tenant": "vision", "kind": "job", "gpus": True}, "gpus"),
    ({"tenant": "vision", "kind": "job", "gpus": 0}, "gpus"),
    ({"tenant": "vision", "kind": "job", "gpus": -2}, "gpus"),
    ({"tenant": "vision", "kind": "job", "gpus": 1.5}, "gpus"),
    ({"tenant": "vision", "kind": "gpu", "gpus": 1}, "kind"),
    ({"tenant": 5, "kind": "job", "gpus": 1}, "tenant"),
    ({"tenant": "", "kind": "job", "gpus": 1}, "tenant"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "gpu": 1}, "gpu"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "priority": True}, "priority"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "priority": "high"}, "priority"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "flavor": 3}, "flavor"),
    ({"tenant": "vision", "kind": "job", "gpus": 1, "name": "x" * 300}, "name"),
]
HEARTBEAT_BAD: list[tuple[Any, str | None]] = [
    ("not json", None),
    ({}, "busy"),
    ({"busy": 1}, "busy"),
    ({"busy": "yes"}, "busy"),
    ({"busy": True, "utilization": 2}, "utilization"),
    ({"busy": True, "utilization": -0.1}, "utilization"),
    ({"busy": True, "utilization": True}, "utilization"),
    ({"busy": True, "extra": 1}, "extra"),
    ({"busy": True, "uuids": "GPU-0"}, "uuids"),
    ({"busy": True, "uuids": ["not-a-uuid"]}, "uuids"),
    ({"busy": True, "uuids": [7]}, "uuids"),
]
TENANT_BAD: list[tuple[Any, str | None]] = [
    ("{oops", None),
    ({"quota": {"a100": "x"}}, "tenants.vision.quota.a100"),
    ({"quota": {"a100": True}}, "tenants.vision.quota.a100"),
    ({"quota": {"a100": 1}, "colour": "red"}, "tenants.vision"),
    ({"quota": {"h100": 1}}, "tenants.vision.quota.h100"),
]
QUERY_BAD = [
    ("api/requests?state=bogus", "state"),
    ("api/requests?kind=gpu", "kind"),
    ("api/requests?limit=0", "limit"),
    ("api/requests?limit=x", "limit"),
    ("api/requests?colour=red", "colour"),
]


@pytest.mark.asyncio
async def test_bad_input_everywhere(gw: Gateway) -> None:
    held = await gw.client("alice").submit("vision", "kernel", 1)
    failures = []

    async def expect(method: str, path: str, body: Any, field: Any, who: str = "alice") -> None:
        status, answer = await gw.raw(method, path, body, who=who)
        if status != 400:
            failures.append(f"{method} {path} {body!r:.60}: {status} {answer}")
            return
        jsonschema.validate(answer, ERROR)
        # the field is named, or (for a key the message names) contained in it
        if field is not None and not str(answer["field"] or "").startswith(field):
            failures.append(f"{method} {path} {body!r:.60}: field {answer['field']} != {field}")

    for body, field in SUBMIT_BAD:
        await expect("POST", "api/requests", body, field)
    for body, field in HEARTBEAT_BAD:
        await expect("POST", f"api/requests/{held['id']}/heartbeat", body, field)
    for body, field in TENANT_BAD:
        await expect("PUT", "api/tenants/vision", body, field, who="root")
    for path, field in QUERY_BAD:
        await expect("GET", path, None, field)
    assert not failures, "\n".join(failures)
    # nothing bad was stored
    assert [r["id"] for r in await gw.client("alice").list()] == [held["id"]]


@pytest.mark.asyncio
async def test_not_found_and_conflict(gw: Gateway) -> None:
    for method, path, body in (
        ("GET", "api/requests/r-nope", None),
        ("DELETE", "api/requests/r-nope", None),
        ("POST", "api/requests/r-nope/heartbeat", {"busy": True}),
        ("GET", "api/nothing-here", None),
    ):
        status, answer = await gw.raw(method, path, body)
        assert status == 404, (method, path, answer)
        jsonschema.validate(answer, ERROR)
    r = await gw.client("alice").submit("vision", "job", 1)
    await gw.client("alice").cancel(r["id"])
    status, answer = await gw.raw("DELETE", f"api/requests/{r['id']}")
    assert status == 409 and "ended" in answer["error"]
    status, answer = await gw.raw("POST", f"api/requests/{r['id']}/heartbeat", {"busy": True})
    assert status == 409
    status, answer = await gw.raw("PATCH", "api/requests", {})
    assert status == 405
    jsonschema.validate(answer, ERROR)


# --- token file ------------------------------------------------------------------------


def test_token_file_errors_name_the_key() -> None:
    good = TokenTable.parse({"tokens": {"abcdefgh1": {"user": "u", "groups": ["g"]}}})
    assert good.lookup("abcdefgh1") == Identity("u", frozenset({"g"}))
    assert good.lookup("abcdefgh2") is None
    for data, text in (
        ([], "mapping"),
        ({"tokens": {"short": {"user": "u"}}}, "at least 8"),
        ({"tokens": {"abcdefgh1": {"groups": []}}}, ".user"),
        ({"tokens": {"abcdefgh1": {"user": "u", "admin": "yes"}}}, ".admin"),
        ({"tokens": {"abcdefgh1": {"user": "u", "groups": "g"}}}, ".groups"),
        ({"tokens": {"abcdefgh1": {"user": "u", "role": "x"}}}, "unknown"),
    ):
        with pytest.raises(TokenError, match=text.replace(".", r"\.")):
            TokenTable.parse(data)


# --- JupyterHub scopes (fake user models, not a running Hub) ---------------------------


def hub_model(scopes: list[str], groups: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    return {"kind": "user", "name": "ann", "groups": groups or [], "scopes": scopes, **kw}


ACCESS = "access:services!service=gpuaas"


def test_hub_use_scope_and_groups() -> None:
    ident = identity_from_hub_model(hub_model([ACCESS, "custom:gpuaas:use"], ["vision", "x"]))
    assert ident is not None and ident.name == "ann"
    assert ident.use and not ident.can_view and not ident.admin
    assert ident.may_charge("vision") and not ident.may_charge("nlp")
    assert ident.may_see("ann") and not ident.may_see("bob")


def test_hub_needs_access_scope_and_a_gpuaas_scope() -> None:
    assert identity_from_hub_model(hub_model(["custom:gpuaas:use"], ["vision"])) is None
    assert identity_from_hub_model(hub_model([ACCESS], ["vision"])) is None
    assert identity_from_hub_model(hub_model([ACCESS, "custom:other:use"])) is None
    other_service = "access:services!service=grades"
    assert identity_from_hub_model(hub_model([other_service, "custom:gpuaas:use"])) is None
    # unfiltered access:services (admins) is enough
    assert identity_from_hub_model(hub_model(["access:services", "custom:gpuaas:use"]))


def test_hub_view_and_admin() -> None:
    view = identity_from_hub_model(hub_model([ACCESS, "custom:gpuaas:view"], ["vision"]))
    assert view is not None and view.can_view and not view.admin
    assert not view.may_charge("vision")  # view alone reads, it does not submit
    assert view.may_see("bob")
    admin = identity_from_hub_model(hub_model([ACCESS, "custom:gpuaas:admin"]))
    assert admin is not None and admin.admin and admin.can_view and admin.may_charge("nlp")


def test_hub_group_filtered_use_scope() -> None:
    scopes = [ACCESS, "custom:gpuaas:use!group=vision"]
    ident = identity_from_hub_model(hub_model(scopes, ["vision", "nlp"]))
    assert ident is not None
    assert ident.may_charge("vision") and not ident.may_charge("nlp")


def test_hub_service_name_is_configurable() -> None:
    model = hub_model(["access:services!service=gpus", "custom:gpuaas:use"], ["vision"])
    assert identity_from_hub_model(model, service="gpus") is not None
    assert identity_from_hub_model(model) is None


def test_hub_snippet_loads_into_jupyterhub_config() -> None:
    """The shipped jupyterhub_config.py snippet parses into JupyterHub's own traits."""
    from gwutil import ROOT
    from jupyterhub.app import JupyterHub
    from traitlets.config import Config

    c = Config()
    source = (ROOT / "hub_config" / "gpuaas_service_snippet.py").read_text()
    exec(compile(source, "gpuaas_service_snippet.py", "exec"), {"get_config": lambda: c})
    hub = JupyterHub(config=c)
    (service,) = hub.services
    assert service["name"] == "gpuaas"
    assert set(service["oauth_client_allowed_scopes"]) == {
        "custom:gpuaas:use",
        "custom:gpuaas:view",
        "custom:gpuaas:admin",
    }
    assert set(hub.custom_scopes) == set(service["oauth_client_allowed_scopes"])
    roles = {r["name"]: r for r in hub.load_roles}
    assert "custom:gpuaas:use" in roles["user"]["scopes"]
    assert "access:services!service=gpuaas" in roles["user"]["scopes"]
    # What the gateway checks (view, access) and what it does as the Hub's service: read
    # users and groups, stop servers it culls (tests/hub/test_hub_snippet.py runs it).
    assert {
        "custom:gpuaas:view",
        "access:services!service=gpuaas",
        "list:users",
        "read:users",
        "read:groups",
        "admin:servers",
    } <= set(roles["gpuaas-service"]["scopes"])
    assert roles["gpuaas-service"]["services"] == ["gpuaas"]


@pytest.mark.asyncio
async def test_hub_mode_over_http_with_a_fake_hub_api(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Hub mode end to end, against a FAKE Hub API (a tornado handler answering
    GET /hub/api/user like JupyterHub 5 does for a service), not a running Hub."""
    import json as _json

    from gwutil import free_port
    from tornado import web

    models = {
        "ann-token": hub_model([ACCESS, "custom:gpuaas:use"], ["vision"]),
        "boss-token": hub_model([ACCESS, "custom:gpuaas:admin"], [], name="boss"),
        "nope-token": hub_model([ACCESS], ["vision"], name="nope"),
    }

    class FakeUser(web.RequestHandler):
        def get(self) -> None:
            token = (self.request.headers.get("Authorization") or "").split(" ")[-1]
            if token not in models:
                raise web.HTTPError(403)
            self.finish(_json.dumps(models[token]))

    port = free_port()
    hub = web.Application([(r"/hub/api/user", FakeUser)]).listen(port, "127.0.0.1")
    try:
        monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{port}/hub/api")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpuaas")
        monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpuaas")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/gpuaas/")
        gw: Gateway = await make_gateway(
            hub_service=True,
            base_url="/services/gpuaas/",
            cookie_secret_file=str(tmp_path / "gpuaas_cookie_secret"),
        )
        assert gw.url.endswith("/services/gpuaas/")
        status, me = await gw.raw("GET", "api/me", who="ann-token")
        assert status == 200 and me["tenants"] == ["vision"] and not me["admin"], me
        status, r = await gw.raw(
            "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1}, who="ann-token"
        )
        assert status == 201 and r["user"] == "ann"
        status, _ = await gw.raw(
            "POST", "api/requests", {"tenant": "nlp", "kind": "job", "gpus": 1}, who="ann-token"
        )
        assert status == 403
        assert (await gw.raw("GET", "api/me", who="nope-token"))[0] == 403
        assert (await gw.raw("GET", "api/me", who="unknown-token"))[0] == 401
        assert (await gw.raw("GET", "api/me", who=None))[0] == 401
        status, _ = await gw.raw("PUT", "api/tenants/nlp", {"quota": {"a100": 1}}, who="boss-token")
        assert status == 200
    finally:
        hub.stop()


# --- browser sessions: the cookie secret and XSRF (HubOAuth against a fake Hub API) ------


def test_cookie_secret_file_is_made_0600_and_kept(tmp_path: Any) -> None:
    import os
    import stat

    from jupyter_gpuaas.gateway.auth import CookieSecretError, load_cookie_secret

    path = tmp_path / "state" / "gpuaas_cookie_secret"
    first = load_cookie_secret(path)
    assert len(first) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_cookie_secret(path) == first  # a restart signs with the same key
    os.chmod(path, 0o644)
    with pytest.raises(CookieSecretError, match="can be read or written by others"):
        load_cookie_secret(path)
    os.chmod(path, 0o600)
    path.write_text("too short\n")
    with pytest.raises(CookieSecretError, match="32 or more random bytes in hex"):
        load_cookie_secret(path)


@pytest.mark.slow
def test_gateway_refuses_an_open_cookie_secret_file(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from gwutil import write_files

    q, _ = write_files(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32)
    os.chmod(secret, 0o644)
    env = dict(
        os.environ, JUPYTERHUB_API_TOKEN="x", JUPYTERHUB_API_URL="http://127.0.0.1:1/hub/api"
    )
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "gateway", "--quotas", str(q), "--port", "0",
         "--devices", "simulated:a100=1x4,t4=1x8", "--db-url", f"sqlite:///{tmp_path / 'g.db'}",
         "--cookie-secret-file", str(secret)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--cookie-secret-file:" in done.stderr and "chmod 600" in done.stderr


@pytest.mark.asyncio
@pytest.mark.slow
async def test_cookie_login_needs_xsrf_and_tokens_do_not(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The login cookie HubOAuth sets (signed with the cookie secret) identifies a browser
    on GET; its POSTs need the page's `_xsrf` token; a token in the header needs none."""
    import json as _json
    import re
    from urllib.parse import urlencode

    from gwutil import free_port
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient

    models = {
        "ann-oauth": hub_model([ACCESS, "custom:gpuaas:use"], ["vision"]),
        "boss-oauth": hub_model([ACCESS, "custom:gpuaas:admin"], [], name="boss"),
    }

    class FakeUser(web.RequestHandler):
        def get(self) -> None:
            token = (self.request.headers.get("Authorization") or "").split(" ")[-1]
            if token not in models:
                raise web.HTTPError(403)
            self.finish(_json.dumps(models[token]))

    port = free_port()
    hub = web.Application([(r"/hub/api/user", FakeUser)]).listen(port, "127.0.0.1")
    try:
        monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{port}/hub/api")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpuaas")
        monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpuaas")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/gpuaas/")
        secret_file = tmp_path / "gpuaas_cookie_secret"
        gw: Gateway = await make_gateway(
            hub_service=True, base_url="/services/gpuaas/", cookie_secret_file=str(secret_file)
        )
        secret = bytes.fromhex(secret_file.read_text().strip())
        client = AsyncHTTPClient()

        def login_cookie(token: str) -> str:
            signed = web.create_signed_value(secret, "service-gpuaas", token).decode()
            return f"service-gpuaas={signed}"

        async def fetch(path: str, cookie: str, **kw: Any) -> Any:
            return await client.fetch(
                gw.url + path,
                headers={"Cookie": cookie, **kw.pop("headers", {})},
                follow_redirects=False,
                raise_error=False,
                **kw,
            )

        # Not logged in: the page sends the browser to the Hub's OAuth.
        resp = await fetch("", "")
        assert resp.code == 302 and "/hub/api/oauth2/authorize" in resp.headers["Location"]
        # Logged in: the page, with an _xsrf cookie and the same token in its forms.
        cookie = login_cookie("boss-oauth")
        resp = await fetch("", cookie)
        assert resp.code == 200 and "Signed in as" in resp.body.decode()
        xsrf_cookie = re.search(r"_xsrf=([^;]+)", resp.headers["Set-Cookie"]).group(1)
        form_xsrf = re.search(r'name="_xsrf" value="([^"]+)"', resp.body.decode()).group(1)
        assert form_xsrf == xsrf_cookie
        cookies = f"{cookie}; _xsrf={xsrf_cookie}"
        held = await gw.client("ann-oauth").submit("vision", "job", 1)  # token: no xsrf
        # A forged POST (the login cookie, no _xsrf): 403, nothing cancelled.
        body = urlencode({"request": held["id"]})
        resp = await fetch("cancel", cookies, method="POST", body=body)
        assert resp.code == 403 and "XSRF" in resp.body.decode()
        resp = await fetch(
            "cancel", cookies, method="POST", body=urlencode({"request": held["id"], "_xsrf": "x"})
        )
        assert resp.code == 403
        assert gw.arbiter.view(held["id"])["state"] == "admitted"
        # The API, cookie-authenticated: DELETE needs the X-XSRFToken header too.
        resp = await fetch(f"api/requests/{held['id']}", cookies, method="DELETE")
        assert resp.code == 403 and "XSRF" in _json.loads(resp.body)["error"]
        # With the page's token: asked first (nothing done), then, confirmed, cancelled.
        body = urlencode({"request": held["id"], "_xsrf": form_xsrf})
        resp = await fetch("cancel", cookies, method="POST", body=body)
        assert resp.code == 200 and 'name="confirm"' in resp.body.decode(), resp.body
        assert gw.arbiter.view(held["id"])["state"] == "admitted"
        body = urlencode({"request": held["id"], "_xsrf": form_xsrf, "confirm": "yes"})
        resp = await fetch("cancel", cookies, method="POST", body=body)
        assert resp.code == 303, resp.body
        assert gw.arbiter.view(held["id"])["state"] == "finished"  # released
        other = await gw.client("ann-oauth").submit("vision", "job", 1)
        resp = await fetch(
            f"api/requests/{other['id']}",
            cookies,
            method="DELETE",
            headers={"X-XSRFToken": form_xsrf},
        )
        assert resp.code == 200
        # Another user's login does not match this page's token.
        ann = f"{login_cookie('ann-oauth')}; _xsrf={xsrf_cookie}"
        third = await gw.client("ann-oauth").submit("vision", "job", 1)
        body = urlencode({"request": third["id"], "_xsrf": form_xsrf, "confirm": "yes"})
        assert (await fetch("cancel", ann, method="POST", body=body)).code == 403
        # Tokens in the header are exempt, as in JupyterHub.
        status, _ = await gw.raw("DELETE", f"api/requests/{third['id']}", who="ann-oauth")
        assert status == 200
    finally:
        hub.stop()
