"""The kernel's (and the shell's) way to its Jupyter server's `/gpuaas/` routes.

Why the server and not the gateway: a job must run in the server (it outlives the kernel
that submitted it), so the magics need the server anyway; going through the server for
status too (its `/gpuaas/api/*` proxy) means a kernel needs no gateway token of its own,
and `%gpu` sees exactly what the sidebar sees, standalone or inside JupyterHub.

Where the server is, first found wins:

1. `GPUAAS_SERVER_URL` and `GPUAAS_SERVER_TOKEN`: exported by the `jupyter_gpuaas`
   extension into the server's environment, which its kernels and terminals inherit;
2. inside JupyterHub, `JUPYTERHUB_SERVICE_URL` (the single-user server's own URL) and
   `JUPYTERHUB_API_TOKEN`.

urllib only: importing this costs a kernel nothing.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any, cast
from urllib.parse import urlencode

from jupyter_gpuaas.client import RequestObject
from jupyter_gpuaas.words import about_field

HOW_TO_CONFIGURE = (
    "no Jupyter server with the gpuaas extension found: run this in a kernel of a Jupyter "
    "server that has the `jupyter_gpuaas` extension enabled (it exports GPUAAS_SERVER_URL "
    "and GPUAAS_SERVER_TOKEN to its kernels), or set GPUAAS_SERVER_URL (e.g. "
    "http://127.0.0.1:8888/) and GPUAAS_SERVER_TOKEN yourself; that server needs a gateway "
    "(GPUAAS_URL and GPUAAS_TOKEN, or JupyterHub)"
)


class ServerError(Exception):
    """An error answer of the server (or the gateway behind it); status 0: no answer."""

    def __init__(self, status: int, error: str, field: str | None = None) -> None:
        super().__init__(status, error, field)
        self.status = status
        self.error = error
        self.field = field

    def __str__(self) -> str:
        return about_field(self.field, self.error)


def server_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    env = os.environ if env is None else env
    url = env.get("GPUAAS_SERVER_URL") or env.get("JUPYTERHUB_SERVICE_URL") or ""
    token = env.get("GPUAAS_SERVER_TOKEN") or env.get("JUPYTERHUB_API_TOKEN") or ""
    if not url:
        raise ServerError(0, HOW_TO_CONFIGURE)
    return url.rstrip("/") + "/", token


class ServerClient:
    """Blocking calls to one Jupyter server's `/gpuaas/` routes."""

    def __init__(
        self, url: str, token: str = "", timeout: float = 30.0, track_activity: bool = True
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        # False: calls say `no_track_activity`, so jupyter_server (and the Hub after it)
        # does not count them as the user's activity: a live widget's refreshes.
        self.track_activity = track_activity

    def quiet(self) -> ServerClient:
        """The same server, for polls that must not count as activity."""
        return ServerClient(self.url, self.token, self.timeout, track_activity=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> ServerClient:
        url, token = server_from_env(env)
        return cls(url, token, **kwargs)

    # ------------------------------------------------------------------ HTTP

    def _request(
        self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None
    ) -> urllib.request.Request:
        url = self.url + path.lstrip("/")
        q = {k: v for k, v in (query or {}).items() if v is not None}
        if not self.track_activity:
            q["no_track_activity"] = 1
        if q:
            url += "?" + urlencode(q)
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(url, data=data, method=method, headers=headers)

    def _open(self, req: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise _error_from(e.code, e.read()) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerError(
                0, f"cannot reach the Jupyter server at {self.url}: {reason}"
            ) from None

    def call(self, method: str, path: str, body: Any = None, query: Any = None) -> Any:
        with self._open(self._request(method, path, body, query), self.timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("POST", "gpuaas/jobs", dict(spec)))

    def jobs(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self.call("GET", "gpuaas/jobs"))

    def job(self, job_id: str) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("GET", f"gpuaas/jobs/{job_id}"))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("DELETE", f"gpuaas/jobs/{job_id}"))

    def logs(self, job_id: str, offset: int = 0, tail: int | None = None) -> str:
        query = {"offset": offset or None, "tail": tail}
        with self._open(self._request("GET", f"gpuaas/jobs/{job_id}/logs", None, query),
                        self.timeout) as resp:  # fmt: skip
            return str(resp.read().decode("utf-8", "replace"))

    def follow(self, job_id: str, offset: int = 0) -> Iterator[str]:
        """The log as it grows, until the job ends (the server closes the stream)."""
        req = self._request("GET", f"gpuaas/jobs/{job_id}/logs", None,
                            {"follow": 1, "offset": offset or None})  # fmt: skip
        with self._open(req, None) as resp:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    return
                yield chunk.decode("utf-8", "replace")

    # ------------------------------------------------------------------ the gateway, proxied

    def me(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("GET", "gpuaas/api/me"))

    def tenants(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("GET", "gpuaas/api/tenants"))

    def devices(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.call("GET", "gpuaas/api/devices"))

    def requests(self, **filters: Any) -> list[RequestObject]:
        return cast("list[RequestObject]", self.call("GET", "gpuaas/api/requests", query=filters))

    def status(self) -> dict[str, Any]:
        """Everything `%gpu status` shows, in one dict."""
        me = self.me()
        return {
            "me": me,
            "tenants": self.tenants(),
            "devices": self.devices(),
            "requests": self.requests(user=me.get("name")),
            "jobs": self.jobs(),
        }


def _error_from(status: int, raw: bytes) -> ServerError:
    try:
        body = json.loads(raw)
        return ServerError(status, str(body.get("error") or body.get("message")), body.get("field"))
    except (ValueError, AttributeError):
        text = raw.decode("utf-8", "replace").strip()[:200] or "no body"
        if status == 404 and "<html" in text.lower():
            text = "no /gpuaas/ routes: is the jupyter_gpuaas server extension enabled?"
        elif status in (401, 403):
            text = "the Jupyter server refused the token (GPUAAS_SERVER_TOKEN)"
        return ServerError(status, text)
