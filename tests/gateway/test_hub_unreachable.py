"""Tokens through a Hub outage (gateway/hubauth.py), against a FAKE Hub API: a tornado
app answering GET /hub/api/user and the token model as JupyterHub 5 does, stopped and
started again on its port. The real-Hub version is tests/hub/test_hub_down.py.

A token the Hub identified keeps working while the Hub is unreachable, up to its own
expiry; a token never seen gets 503 "the Hub is unreachable" (not 401: it may be good);
a token the Hub rejects once it is back is forgotten.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from gwutil import Gateway, free_port
from helpers import wait_until
from tornado import httpserver, web
from tornado.httpclient import AsyncHTTPClient

ACCESS = "access:services!service=gpuaas"


def user(name: str, token_id: str) -> dict[str, Any]:
    scopes = [ACCESS, "custom:gpuaas:use"]
    return {"kind": "user", "name": name, "groups": ["vision"], "scopes": scopes,
            "token_id": token_id}  # fmt: skip


class FakeHub:
    """GET /hub/api/user by token; GET /hub/api/users/{name}/tokens/{id}: its expiry."""

    def __init__(self, port: int, models: dict[str, dict[str, Any]], expiry: dict[str, str]):
        self.port, self.models, self.expiry = port, models, expiry
        self.expiry_asked: list[str] = []
        self.server: httpserver.HTTPServer | None = None

    def start(self) -> None:
        hub = self

        class Me(web.RequestHandler):
            def get(self) -> None:
                token = (self.request.headers.get("Authorization") or "").split(" ")[-1]
                if token not in hub.models:
                    raise web.HTTPError(403)
                self.finish(json.dumps(hub.models[token]))

        class Token(web.RequestHandler):
            def get(self, name: str, token_id: str) -> None:
                hub.expiry_asked.append(token_id)
                self.finish(json.dumps({"id": token_id, "expires_at": hub.expiry.get(token_id)}))

        app = web.Application(
            [(r"/hub/api/user", Me), (r"/hub/api/users/([^/]+)/tokens/([^/]+)", Token)]
        )
        self.server = app.listen(self.port, "127.0.0.1")

    async def stop(self) -> None:
        assert self.server is not None
        self.server.stop()
        await self.server.close_all_connections()  # keep-alive ones too: the Hub is gone


async def call(gw: Gateway, path: str, token: str, body: Any = None) -> tuple[int, Any, str]:
    resp = await AsyncHTTPClient().fetch(
        gw.url + path,
        method="POST" if body is not None else "GET",
        body=json.dumps(body) if body is not None else None,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        raise_error=False,
    )
    return resp.code, json.loads(resp.body or b"null"), resp.headers.get("Retry-After", "")


@pytest.mark.asyncio
@pytest.mark.slow
async def test_known_tokens_outlive_a_hub_outage_and_unknown_ones_get_503(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    soon = datetime.fromtimestamp(time.time() + 3, timezone.utc).isoformat().replace("+00:00", "Z")
    hub = FakeHub(
        free_port(),
        {"ann-token": user("ann", "a1"), "short-token": user("sam", "a2")},
        {"a2": soon},  # ann's token never expires; sam's in 3 s
    )
    hub.start()
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{hub.port}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpuaas")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/gpuaas/")
    gw: Gateway = await make_gateway(
        hub_service=True,
        base_url="/services/gpuaas/",
        cookie_secret_file=str(tmp_path / "cookie_secret"),
        lease_ttl=30,
    )
    hub_auth = gw.app.http_server.request_callback.settings["hub_auth"]
    try:
        status, req, _ = await call(
            gw, "api/requests", "ann-token", {"tenant": "vision", "kind": "server", "gpus": 1}
        )
        assert status == 201 and req["state"] == "admitted", req
        assert (await call(gw, "api/me", "short-token"))[0] == 200
        assert (await call(gw, "api/me", "ann-token"))[0] == 200
        assert sorted(hub.expiry_asked) == ["a1", "a2"]  # once per token, not per call

        await hub.stop()
        hub_auth.cache.clear()  # as if cache_max_age (60 s) had passed: the Hub is asked
        # ann's server renews its lease as if nothing happened.
        status, beat, _ = await call(gw, f"api/requests/{req['id']}/heartbeat", "ann-token",
                                     {"busy": True})  # fmt: skip
        assert status == 200 and beat["state"] == "admitted", beat
        assert beat["grant"]["lease_expires"] > req["grant"]["lease_expires"]
        status, me, _ = await call(gw, "api/me", "ann-token")
        assert status == 200 and me["name"] == "ann"
        # A token never seen: 503, a sentence, Retry-After; never 401 or 500.
        status, err, retry = await call(gw, "api/me", "never-seen")
        assert status == 503 and retry.isdigit(), (status, err)
        assert err["error"].startswith("the Hub is unreachable"), err
        page = await AsyncHTTPClient().fetch(
            gw.url, headers={"Authorization": "token never-seen"}, raise_error=False
        )  # the landing page says it too, in HTML
        assert page.code == 503 and b"the Hub is unreachable" in page.body, page.body[:300]
        # sam's token expires during the outage: it stops working then.
        assert (await call(gw, "api/me", "short-token"))[0] == 200

        async def sam_refused() -> bool:
            hub_auth.cache.clear()
            return (await call(gw, "api/me", "short-token"))[0] == 503

        await wait_until(sam_refused, 10, "sam's token to stop working at its expiry")

        # The Hub is back, and has revoked ann's token: refused, and forgotten.
        del hub.models["ann-token"]
        hub.start()
        hub_auth.cache.clear()
        assert (await call(gw, "api/me", "ann-token"))[0] == 401
        await hub.stop()
        hub_auth.cache.clear()
        assert (await call(gw, "api/me", "ann-token"))[0] == 503
    finally:
        if hub.server is not None:
            hub.server.stop()


def test_the_snippet_runs_the_gateway_apart_from_the_hub_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUAAS_GATEWAY_EXTERNAL=1: an external service (url + api_token, no command), so
    stopping the Hub does not stop the gateway; its role may read token expiries."""
    from gwutil import ROOT
    from jupyterhub.app import JupyterHub
    from traitlets.config import Config

    monkeypatch.setenv("GPUAAS_HUB_TOKEN", "f" * 64)
    source = (ROOT / "hub_config" / "gpuaas_service_snippet.py").read_text()
    for external in ("", "1"):
        monkeypatch.setenv("GPUAAS_GATEWAY_EXTERNAL", external)
        c = Config()
        exec(compile(source, "gpuaas_service_snippet.py", "exec"), {"get_config": lambda c=c: c})
        hub = JupyterHub(config=c)
        (service,) = hub.services
        assert service["url"] == "http://127.0.0.1:8765" and service["api_token"] == "f" * 64
        assert ("command" in service) == (not external), service
        roles = {r["name"]: r for r in hub.load_roles}
        assert "read:tokens" in roles["gpuaas-service"]["scopes"]
    assert service["oauth_redirect_uri"] == "/services/gpuaas/oauth_callback"
