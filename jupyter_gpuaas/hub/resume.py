"""A queued spawn survives a Hub restart: it keeps its request (and its place in the
queue) and completes.

JupyterHub does not carry a pending spawn across its own restart. On SIGTERM it stops
its managed services, then cancels every task, the pending spawn's included; at the next
start `init_spawners` polls the spawner, which (no process yet) says "not running", and
the Hub stops it ("appears to have stopped while the Hub was down"). So:

- the request id is written to the spawner's state in the Hub's database as soon as the
  gateway answers the submission (`save_pending`), marked `pending` (not yet started);
- a cancelled spawn keeps its request (`kept`) until the Hub says why: a user's stop of a
  pending spawn polls the spawner right after, and `poll()` cancels the request then; a
  Hub shutting down never does, so the request stays queued for the next Hub;
- the next Hub loads `pending` as the request to resume, not as a running server's
  grant; the stop that `init_spawners` makes gives nothing back, and then the spawner
  starts the server again through the Hub's REST API with its saved user_options, as the
  gateway's service (`gateway_token`, which needs `admin:servers`, as the snippets'
  `gpuaas-service` role has). Without that token, the user's next start resumes it;
- a start that finds a request to resume reuses it when it is still queued or admitted
  and asks for what this start asks (tenant, flavor, GPUs); otherwise it cancels it and
  submits anew.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from sqlalchemy.orm import object_session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.client import GatewayClient, GatewayError, RequestObject

from .options import GpuOptions

LIVE = (State.QUEUED.value, State.ADMITTED.value)
GATEWAY_WAIT = 120  # seconds a resumed spawn waits for a restarting gateway
RESUME_ATTEMPTS = 60  # one a second: the Hub's API answers once init_spawners is done


def save_pending(spawner: Any) -> None:
    """Write the spawner's state (now naming its pending request) to the Hub's database."""
    orm: Any = getattr(spawner, "orm_spawner", None)
    session = object_session(orm) if orm is not None else None
    if session is None:
        return
    try:
        orm.state = spawner.get_state()
        session.commit()
    except Exception as e:  # the spawn goes on; only a Hub restart would lose the request
        session.rollback()
        spawner.log.warning("could not save the gpuaas request of %s: %s", spawner._log_name, e)


def matches(req: Mapping[str, Any], options: GpuOptions) -> bool:
    """Whether a saved request asks for what this start asks."""
    if options.tenant and req.get("tenant") != options.tenant:
        return False
    if options.flavor and req.get("flavor") not in (None, options.flavor):
        return False
    return int(req.get("gpus") or 0) == options.gpus


async def take_back(
    spawner: Any, client: GatewayClient, options: GpuOptions
) -> RequestObject | None:
    """The saved request to resume for this start, or None (after cancelling a saved one
    that no longer fits)."""
    rid = spawner._resume_request
    spawner._resume_request = None
    if not rid:
        return None
    req = None
    for _ in range(GATEWAY_WAIT):
        try:
            req = await client.get(rid)
            break
        except GatewayError as e:
            if e.status and e.status < 500:  # 404: it is gone
                spawner.log.info("gpuaas request %s of %s is gone (%s)", rid, spawner._log_name, e)
                return None
            # The gateway restarts with the Hub (a managed service): wait for it.
            await asyncio.sleep(1.0)
    if req is None:
        return None
    if req.get("state") in LIVE and matches(req, options):
        spawner.log.info(
            "gpuaas request %s of %s resumed: %s", rid, spawner._log_name, req.get("state")
        )
        return req
    if req.get("state") in LIVE:
        try:
            await client.cancel(rid)
        except GatewayError as e:
            spawner.log.warning("could not cancel gpuaas request %s: %s", rid, e)
    return None


def schedule_restart(spawner: Any) -> None:
    """After the Hub stopped a spawn that was pending when it went down: start it again
    through the Hub's API, as the gateway's service (once; see the module doc)."""
    if not spawner._resume_request or not spawner.gateway_token or spawner._resume_task:
        return
    spawner._resume_task = asyncio.ensure_future(_restart(spawner))


async def _restart(spawner: Any) -> None:
    name = quote(spawner.user.name, safe="")
    path = (
        f"users/{name}/servers/{quote(spawner.name, safe='')}"
        if spawner.name
        else (f"users/{name}/server")
    )
    url = spawner.hub.api_url.rstrip("/") + "/" + path
    body = json.dumps(dict(spawner.user_options or {}))
    try:
        for _ in range(RESUME_ATTEMPTS):
            await asyncio.sleep(1.0)
            if not spawner._resume_request:
                return  # the user started it (or it was cancelled) meanwhile
            request = HTTPRequest(
                url,
                method="POST",
                body=body,
                headers={
                    "Authorization": f"token {spawner.gateway_token}",
                    "Content-Type": "application/json",
                },
                request_timeout=30,
                ssl_options=spawner._gateway_ssl(url),
            )
            try:
                await AsyncHTTPClient().fetch(request)
                spawner.log.info("gpuaas: restarting the queued spawn of %s", spawner._log_name)
                return
            except HTTPClientError as e:
                if e.code == 400:  # already running or pending: nothing to do
                    return
                if e.code in (401, 403, 404):
                    spawner.log.warning(
                        "gpuaas: cannot restart the queued spawn of %s (%s): it resumes "
                        "when the user starts it",
                        spawner._log_name,
                        e,
                    )
                    return
            except OSError:
                pass  # the Hub's API is not up yet
    finally:
        spawner._resume_task = None
