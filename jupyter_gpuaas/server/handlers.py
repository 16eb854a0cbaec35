"""Routes under `/gpuaas/`: the sidebar's only way to the gateway, and this server's GPU
kernels.

`/gpuaas/api/...` forwards to the gateway with the server's token, so the browser never
holds a gateway token and needs no CORS: whoever this server lets in acts as the server's
owner (in JupyterHub, the token's user). Answers come back verbatim (status and JSON body),
so the sidebar sees the gateway's own errors (`{"error", "field"}`); an unreachable gateway
is a 502 in the same shape.

Only the gateway routes of `PROXIED` are reached, and the check is on the path as the
gateway will read it: tornado matches its route table against the raw path but hands the
handler the decoded one, so `requests%2F..%2F..%2Fmetrics` passes the table as one
segment and decodes to `requests/../../metrics`. The decoded path must have no empty,
`.` or `..` segment and match `PROXIED` whole, and each segment is encoded again when the
gateway's URL is built; anything else is a 404 that never leaves this server.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import httpclient, web
from tornado.iostream import StreamClosedError

from jupyter_gpuaas.holder import encode, follower
from jupyter_gpuaas.words import format_duration

if TYPE_CHECKING:
    from .extension import GpuaasExtension
    from .kernels import GpuKernel

AUTH_RESOURCE = "gpuaas"
#: The gateway routes the sidebar may reach through `/gpuaas/api/` (decoded paths).
PROXIED = re.compile(r"(?:requests|tenants|devices|me)(?:/[^/]+)?(?:/heartbeat)?|advice")


def gateway_path(path: str) -> str | None:
    """The gateway URL path (after `api/`) of a decoded proxy path, each segment encoded;
    None when it is not one of `PROXIED` (a `..`, `.` or empty segment never is)."""
    segments = path.split("/")
    if any(s in ("", ".", "..") for s in segments) or not PROXIED.fullmatch(path):
        return None
    return "/".join(quote(s, safe="") for s in segments)


class GpuaasHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def ext(self) -> GpuaasExtension:
        ext: GpuaasExtension = self.settings["gpuaas"]
        return ext

    def gateway_or_502(self) -> Any:
        client = self.ext.client
        if client is None:
            self.send_error_json(502, "no gpuaas gateway configured (GPUAAS_URL)")
            return None
        return client

    def send_error_json(self, status: int, error: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": error, "field": None}))


class ProxyHandler(GpuaasHandler):
    """GET/POST/DELETE `/gpuaas/api/<path>` → the gateway's `api/<path>`."""

    async def _forward(self, path: str) -> None:
        target = gateway_path(path)
        if target is None:
            shown = path if len(path) <= 80 and path.isprintable() else "this path"
            self.send_error_json(404, f"{shown!r} is not a gateway route the sidebar may use")
            return
        client = self.gateway_or_502()
        if client is None:
            return
        url = client.url + "api/" + target
        # `no_track_activity` is jupyter_server's (a widget's refresh), not the gateway's.
        query = "&".join(
            part for part in self.request.query.split("&")
            if part and part.split("=", 1)[0] != "no_track_activity"
        )  # fmt: skip
        if query:
            url += "?" + query
        method = self.request.method or "GET"
        body = self.request.body if method in ("POST", "PUT") else None
        try:
            resp = await httpclient.AsyncHTTPClient().fetch(
                url,
                method=method,
                headers={
                    "Authorization": f"token {client.token}",
                    "Content-Type": "application/json",
                },
                body=body,
                allow_nonstandard_methods=True,
                raise_error=False,
                request_timeout=client.timeout,
                ssl_options=client.ssl,  # JupyterHub's internal SSL (client.py)
            )
        except OSError as e:
            self.send_error_json(502, f"cannot reach the gpuaas gateway: {e}")
            return
        if resp.code == 599:
            self.send_error_json(502, f"cannot reach the gpuaas gateway: {resp.error}")
            return
        self.set_status(resp.code)
        self.set_header("Content-Type", "application/json")
        self.finish(resp.body or b"")

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        await self._forward(path)


class EventsHandler(GpuaasHandler):
    """`/gpuaas/api/events`: the gateway's Server-Sent Events, as they come.

    Each browser tab subscribes to the server's one gateway stream (holder.py) rather
    than opening its own. An EventSource that resumes (`Last-Event-ID`) is replayed what
    the server heard after that event, or told `reset` (it then lists again)."""

    _closed = False
    _pending: asyncio.Queue[dict[str, Any] | None] | None = None

    def on_connection_close(self) -> None:
        self._closed = True
        if self._pending is not None:
            self._pending.put_nowait(None)  # wake the writer loop now, not at the next event

    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = self.gateway_or_502()
        if client is None:
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")
        pending: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pending = pending
        stream = follower(client, reconnect_delay=self.ext.reconnect_delay)
        last = self.request.headers.get("Last-Event-ID")
        missed = stream.since(last) if last is not None else []
        resume = f"id: {stream.last_id}\n" if last is None and stream.last_id else ""
        unsubscribe = stream.subscribe(pending.put_nowait, comments=True)
        try:
            # The headers at once: a browser's EventSource opens before the first event.
            self.write(f": connected\n{resume}\n".encode() + b"".join(map(encode, missed)))
            await self.flush()
            while not self._closed:
                event = await pending.get()
                if event is None or event.get("event") == "disconnected":
                    break  # the browser's EventSource polls, then comes back
                if event.get("event") == "connected":
                    continue  # what was missed meanwhile is replayed on the stream
                self.write(encode(event))
                await self.flush()
        except StreamClosedError:
            self._closed = True
        finally:
            unsubscribe()
        if not self._finished and not self._closed:
            self.finish()


class KernelsHandler(JupyterHandler):
    """`/gpuaas/kernels`: this server's GPU kernels, live first, then recently ended.

    A page for browsers (what each kernel waits for, its place in the queue, its GPUs),
    JSON for API clients: JSON unless `Accept` asks for text/html, and `?format=json` or
    `?format=html` decide outright. A page handler, not an API handler: a browser that has
    not logged in to this server yet is sent through the login (in JupyterHub, the Hub's
    OAuth) instead of getting a bare 403; an API client without a token still gets 403.
    """

    auth_resource = AUTH_RESOURCE

    def wants_html(self) -> bool:
        fmt = self.get_argument("format", "")
        if fmt in ("json", "html"):
            return fmt == "html"
        return "text/html" in self.request.headers.get("Accept", "")

    def get_login_url(self) -> str:
        if not self.wants_html():
            raise web.HTTPError(403)
        return str(super().get_login_url())

    @web.authenticated
    @authorized
    def get(self) -> None:
        ext: GpuaasExtension = self.settings["gpuaas"]
        kernels = list(ext.table.all())
        self.set_header("Cache-Control", "no-store")
        if not self.wants_html():
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps([k.to_json() for k in kernels]))
            return
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(kernels_page(kernels, self.base_url))


class NotificationsHandler(GpuaasHandler):
    """`/gpuaas/notifications`: cull warnings and culls, newest last."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.finish(json.dumps([n.to_json() for n in self.ext.table.notifications]))


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5">
<title>GPU kernels</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: 0.3em 1em 0.3em 0; border-bottom: 1px solid #ddd; }}
.waiting {{ color: #8a5a00; }} .running {{ color: #1a7f37; }} .ended {{ color: #666; }}
</style></head>
<body>
<h1>GPU kernels of this server</h1>
{body}
<p><a href="{lab}">JupyterLab</a> · <a href="?format=json">as JSON</a> ·
refreshed every 5 s</p>
</body></html>
"""


def kernels_page(kernels: list[GpuKernel], base_url: str) -> str:
    """The page of `/gpuaas/kernels`: every value escaped."""
    esc = html.escape
    if not kernels:
        body = '<p id="gpuaas-none">No GPU kernel has run on this server yet.</p>'
    else:
        rows = []
        now = time.time()
        for k in kernels:
            kind = "waiting" if k.waiting else "running" if k.ended is None else "ended"
            since = format_duration(now - (k.ended or k.created))
            rows.append(
                f'<tr class="{kind}" data-kernel-id="{esc(k.kernel_id)}">'
                f"<td>{esc(k.kernel_name)}</td><td>{esc(k.kernel_id[:8])}</td>"
                f'<td class="gpuaas-sentence">{esc(k.sentence())}</td>'
                f"<td>{esc(k.tenant or '')}</td><td>{esc(k.request_id or '')}</td>"
                f"<td>{esc(since)}</td></tr>"
            )
        body = (
            "<table><thead><tr><th>kernel</th><th>id</th><th>GPUs</th><th>team</th>"
            "<th>request</th><th>since</th></tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table>"
        )
    return PAGE.format(body=body, lab=esc(base_url.rstrip("/") + "/lab"))


def routes() -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (r"/gpuaas/api/events", EventsHandler),
        (rf"/gpuaas/api/({PROXIED.pattern})", ProxyHandler),
        (r"/gpuaas/kernels", KernelsHandler),
        (r"/gpuaas/notifications", NotificationsHandler),
    ]
