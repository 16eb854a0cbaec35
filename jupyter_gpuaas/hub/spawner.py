"""A spawner that queues GPU server starts at the gpuaas gateway, then starts the real one.

`QueuedSpawnerMixin` goes in front of the spawner that really starts servers
(`class QueuedLocalProcessSpawner(QueuedSpawnerMixin, LocalProcessSpawner)`), so every
spawner keeps its own start/stop/poll and only gains a queue in front.

Why the queue wait sits in `run_pre_spawn_hook`, not in `start()`
--------------------------------------------------------------------
JupyterHub's `User.spawn` awaits, in order: `apply_group_overrides`, the user-options hook,
`run_pre_spawn_hook()`, and then `asyncio.wait_for(spawner.start(), spawner.start_timeout)`.
Only `start()` is under `start_timeout` (60 s by default); a spawn that waited for a GPU
inside `start()` would be killed after a minute in the queue, and raising `start_timeout`
to hours would also stop bounding the real start (a pod that never schedules would hang
for hours). So the mixin waits for admission in `run_pre_spawn_hook`, which the Hub awaits
without a timeout, bounds that wait itself by `queue_timeout` (generous by default), and
leaves `start()` — the wrapped spawner's real start with the granted devices — bounded by
the unchanged `start_timeout`. While it waits the spawn is pending in every sense the Hub
knows (`spawner.pending == "spawn"`), so the spawn-pending page and
`GET /hub/api/users/{name}/server/progress` stream `progress()`, and stopping the server
cancels the spawn task, which cancels the gateway request.

What the mixin adds
-------------------
- options: tenant (one of the user's tenant groups), flavor and GPU count, from the spawn
  form or the REST API's user_options; `gpus: 0` starts at once without the queue;
- refusals fail the spawn at once: a tenant the user is not in (403) and a request the
  gateway can never admit (422, with its reason);
- progress: position, the tenant's usage and quota and an estimated wait, re-read when the
  gateway's event stream says something changed, not on a timer: one stream per gateway
  and token in the Hub process (holder.py), fanned out to every spawner;
- admitted: `_apply_grant()` hands the devices to the wrapped spawner (CUDA_VISIBLE_DEVICES
  for local processes, `nvidia.com/gpu` limits and the flavor's node selector for pods);
- running: the server's own `jupyter_gpuaas` extension heartbeats the request with busy
  or idle from its kernels' GPU use and its jobs (server/idle.py), not the Hub's HTTP
  activity; the spawner's lease, held by the Hub's grant holder (holder.py), is renewed
  only when nobody else renews it (a server image without the extension), with busy from
  the Hub's last-activity, and watches the request's state; a gateway `cull` (or
  preemption, or lease loss) stops the server through the Hub's REST API, keeping a
  parked reservation so a restart within the reservation TTL is admitted at once;
- release: stop, the server's death (seen by `poll()`) and a cancelled spawn release or
  cancel the request. A Hub that dies holding a grant stops heartbeating: the lease expires
  and the gateway frees the devices (no GPU leaks).

The spawner talks to the gateway as the user, with a token it mints for the request
(scopes: `custom:gpuaas:use`, access to the gateway service, and stopping this one server)
and revokes on release, so ownership and tenant membership are the gateway's own checks.
The token expires and is replaced at half its life; the spawner state keeps its id (not
the token) so that a restarted Hub revokes it (tokens.py).
"""

from __future__ import annotations

import asyncio
import html
import os
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Bool, Integer, Unicode, default
from traitlets.config import Configurable

from jupyter_gpuaas.client import GatewayClient, GatewayError, ssl_context
from jupyter_gpuaas.holder import (
    TERMINAL_STATES,
    Lease,
    Seconds,
    active_within,
    follower,
    forget_follower,
    grant_holder,
)
from jupyter_gpuaas.words import ending_sentence, format_duration

from . import resume, slow_spawn
from .form import SpawnFormMixin, _refusal, _refused
from .gateway_url import gateway_url_for
from .options import GpuOptions
from .status import QueueStatus, StatusBoard, progress_event
from .tokens import MintedToken, RequestTokenMixin


def _ended(req: dict[str, Any]) -> web.HTTPError:
    """The spawn's failure when its request ended while queued: one sentence saying who or
    what ended it and why (an admin's cancel, a refusal), shown by the Hub as it is."""
    sentence = ending_sentence(req) if req.get("state") else "The GPU request is gone."
    error = _refused(409, sentence)
    error.jupyterhub_html_message = html.escape(sentence)  # type: ignore[attr-defined]
    error.gpuaas_ended = True  # type: ignore[attr-defined]
    return error


class QueuedSpawnerMixin(SpawnFormMixin, RequestTokenMixin, Configurable):
    """Queue GPU spawns at the gpuaas gateway before the wrapped spawner starts them."""

    gateway_url = Unicode(
        help="""URL of the gpuaas gateway's API root, e.g.
        http://127.0.0.1:8765/services/gpuaas/ (the service's own address: the Hub
        reaches it directly, not through the proxy). Default: $GPUAAS_URL, else the
        gateway service through the Hub's proxy (hub/gateway_url.py).""",
    ).tag(config=True)

    @default("gateway_url")
    def _gateway_url_default(self) -> str:
        return os.environ.get("GPUAAS_URL") or gateway_url_for(self, self.gateway_service_name)

    def get_env(self) -> dict[str, str]:
        # Servers reach the gateway through the proxy unless told otherwise (a GPUAAS_URL
        # of c.Spawner.environment, or of the Hub's own environment, wins).
        env: dict[str, str] = super().get_env()  # type: ignore[misc]
        if not env.get("GPUAAS_URL"):
            url = gateway_url_for(self, self.gateway_service_name)
            if url:
                env["GPUAAS_URL"] = url
        return env

    gateway_service_name = Unicode(
        "gpuaas",
        help="""Name of the gateway's JupyterHub service: the request tokens the spawner
        mints for users carry `access:services!service=<name>`.""",
    ).tag(config=True)

    gateway_token = Unicode(
        help="""A token that may see the whole queue (`custom:gpuaas:view`), e.g. the gpuaas
        service's api_token. The Hub uses it for one event stream shared by all spawns and
        for the tenant list of the form. Empty: each spawn streams its own user's events
        and re-reads its position every `refresh_interval`. Default: $GPUAAS_HUB_TOKEN.""",
    ).tag(config=True)

    @default("gateway_token")
    def _gateway_token_default(self) -> str:
        return os.environ.get("GPUAAS_HUB_TOKEN", "")

    request_priority = Integer(
        0, help="Priority of server requests (higher runs first within a tenant)."
    ).tag(config=True)

    queue_timeout = Seconds(
        24 * 3600.0,
        zero_ok=True,
        help="""Seconds a spawn may wait in the gateway's queue before it gives up (and
        cancels its request). Separate from `start_timeout`, which still bounds only the
        real start once the GPUs are granted. 0: wait as long as it takes.""",
    ).tag(config=True)

    heartbeat_interval = Seconds(
        30.0,
        help="""Seconds between lease renewals of a running server's grant. Must be well
        under the gateway's --lease-ttl (120 s by default).""",
    ).tag(config=True)

    activity_window = Seconds(
        600.0,
        help="""For a server that does not report its own activity (no jupyter_gpuaas
        extension in its image): it counts as busy (not to be culled) if the Hub saw
        activity within this many seconds. A server with the extension heartbeats its
        own busy/idle and this is not used. The Hub's view of activity is coarse (the
        proxy and the server report every JupyterHub.last_activity_interval, 300 s by
        default), so keep this above that interval.""",
    ).tag(config=True)

    refresh_interval = Seconds(
        30.0,
        help="""Longest a queued spawn goes without re-reading its place in the queue. The
        event stream wakes it sooner whenever the queue changes; this is the safety net
        (and the only update when the user's token cannot see other users' requests).""",
    ).tag(config=True)

    hide_devices_without_grant = Bool(
        True,
        help="""Servers started with gpus: 0 see no GPU (CUDA_VISIBLE_DEVICES=""), so
        nothing uses a device the gateway did not grant. GPU kernels started inside such
        a server get their own devices from the gpuaas kernel provisioner.""",
    ).tag(config=True)

    # ----------------------------------------------------------------- state

    @property
    def _gp(self) -> dict[str, Any]:
        """Per-spawner runtime state (not traits: nothing here is configuration)."""
        state: dict[str, Any] | None = self.__dict__.get("_gpuaas")
        if state is None:
            state = self.__dict__["_gpuaas"] = {
                "rid": None,  # the gateway request while we hold or wait for one
                "resume": None,  # a pending spawn's request to take back (resume.py)
                "resume_task": None,
                "ended": None,  # how the last server ended, said on the next spawn form
                "kept": None,  # a cancelled spawn's request, until a stop says why (resume.py)
                "grant": None,  # the request object once admitted
                "token": None,  # the MintedToken of the request (tokens.py)
                "stale_tokens": [],  # ids of tokens a previous Hub minted: to revoke
                "keep": False,  # the gateway parked it: do not cancel on stop
                "running": False,  # the real start finished
                "hb": None,  # heartbeat task
                "subscription": None,  # to the event stream (holder.py)
                "board": StatusBoard(),
            }
        return state

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()  # type: ignore[misc]
        gp = self._gp
        token: MintedToken | None = gp["token"]
        ids = [token.id] if token else []
        ids += gp["stale_tokens"]
        pending = gp["rid"] if gp["rid"] and not gp["running"] else gp["kept"] or gp["resume"]
        if gp["rid"] or ids or pending:
            # The token's id, never the token: the next Hub revokes it (tokens.py).
            state["gpuaas"] = {"request": gp["rid"], "grant": gp["grant"], "tokens": ids}
            if pending:  # not started yet: the next Hub resumes it (resume.py)
                state["gpuaas"].update(request=pending, pending=True)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        saved = state.get("gpuaas") or {}
        if saved.get("pending"):
            self._gp["resume"] = saved.get("request")
            self.log.info("gpuaas request %s of %s to resume", saved["request"], self._log_name)
        elif saved.get("request"):
            self._gp.update(rid=saved["request"], grant=saved.get("grant"), running=True)
        # Minted by a Hub before this one: unusable (we do not have them), so revoked
        # as soon as this Hub mints a token or ends the request.
        stale = [int(i) for i in saved.get("tokens") or [] if isinstance(i, int)]
        known = self._gp["stale_tokens"]
        known += [i for i in stale if i not in known]
        if not self._gp["rid"]:
            self._revoke_stale_tokens()

    def clear_state(self) -> None:
        super().clear_state()  # type: ignore[misc]
        gp = self._gp
        if gp["hb"] is None:  # never while a request is live: release() clears it
            gp.update(rid=None, grant=None, keep=False, running=False)

    # ----------------------------------------------------------------- clients

    def _check_gateway(self) -> None:
        if not self.gateway_url:
            raise web.HTTPError(
                500, "the GPU gateway is not configured (set QueuedSpawnerMixin.gateway_url)"
            )

    def _gateway_ssl(self, url: str | None = None) -> ssl.SSLContext | None:
        """Under the Hub's internal SSL, the Hub's own certificate and trust bundle (the
        Hub process has no JUPYTERHUB_SSL_* of its own); None: the client's defaults."""
        settings = getattr(self.user, "settings", None) or {}
        https = (url or self.gateway_url).startswith("https:")
        if not settings.get("internal_ssl") or not https:
            return None
        return ssl_context(
            settings.get("internal_ssl_key"),
            settings.get("internal_ssl_cert"),
            settings.get("internal_ssl_ca"),
        )

    def _client(self, token: str) -> GatewayClient:
        self._check_gateway()
        return GatewayClient(self.gateway_url, token, ssl_context=self._gateway_ssl())

    def _user_client(self) -> GatewayClient:
        return self._client(self._user_token())

    def _reader_client(self) -> GatewayClient:
        """For reads that need no ownership: the Hub's token when configured."""
        return self._client(self.gateway_token or self._user_token())

    def _subscribe(self, callback: Any) -> None:
        """Hear the gateway's events: the Hub's token streams for every spawn (kept open
        between spawns); without one, each user's token streams that user's events."""
        sub = self._gp["subscription"]
        if sub is not None:
            sub.callback = callback
            return
        stream = follower(self._reader_client(), keep_open=bool(self.gateway_token))
        self._gp["subscription"] = stream.subscribe(callback)

    def _resubscribe(self, old_token: str) -> None:
        """A per-user stream follows its token: the old one is about to be revoked."""
        sub = self._gp["subscription"]
        if sub is not None and not self.gateway_token:
            self._unsubscribe()
            forget_follower(self.gateway_url, old_token)
            self._subscribe(sub.callback)

    def _unsubscribe(self) -> None:
        sub, self._gp["subscription"] = self._gp["subscription"], None
        if sub is not None:
            sub()

    # ----------------------------------------------------------------- queueing

    async def run_pre_spawn_hook(self) -> None:
        """The configured pre_spawn_hook, then the wait for GPUs (see the module doc)."""
        result = super().run_pre_spawn_hook()  # type: ignore[misc]
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result
        await self.wait_for_gpus()

    async def wait_for_gpus(self) -> None:
        """Submit the request and wait until it is admitted (or refused, or timed out)."""
        gp = self._gp
        board: StatusBoard = gp["board"]
        board.reset()
        gp["ended"] = None
        options = self.gpu_options()
        if options.gpus == 0:
            gp["grant"] = None
            board.publish(QueueStatus("skipped", options))
            return
        client = self._user_client()
        began = time.perf_counter()
        name = f"{self.user.name}/{self.name}" if self.name else self.user.name
        try:
            req = await resume.take_back(self, client, options) or await client.submit(
                options.tenant or "",
                "server",
                options.gpus,
                flavor=options.flavor,
                priority=self.request_priority,
                name=f"server {name}",
            )
        except GatewayError as e:
            self._revoke_user_token()
            board.publish(QueueStatus("failed", options, reason=e.error))
            raise _refusal(e) from None
        gp["rid"] = req["id"]
        resume.save_pending(self)
        self.log.info("gpuaas request %s for %s: %s", req["id"], self._log_name, req.get("state"))
        changed = asyncio.Event()

        def on_event(event: dict[str, Any]) -> None:
            # Any change may move our place; re-read rather than trust partial data.
            changed.set()

        self._subscribe(on_event)
        deadline = time.monotonic() + self.queue_timeout if self.queue_timeout else None
        slow_spawn.hear_as_queued(self)  # not "slow to start" while it waits in the queue
        try:
            while True:
                status = await self._queue_status(req, options)
                board.publish(status)
                state = req.get("state")
                if state == "admitted":
                    break
                if state in TERMINAL_STATES or state is None:
                    raise _ended(req)
                wait = self.refresh_interval
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise web.HTTPError(
                            504,
                            "no GPU was granted within %s (QueuedSpawnerMixin.queue_timeout);"
                            " the request was cancelled",
                            format_duration(self.queue_timeout),
                        )
                    wait = min(wait, left)
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), timeout=wait)
                except asyncio.TimeoutError:
                    pass
                try:
                    req = await client.get(gp["rid"])
                except GatewayError as e:
                    if e.status and e.status < 500:
                        raise  # the request is gone
                    # The gateway is down or restarting (the Hub restarts a managed service
                    # that dies): keep the place, and read it again at the next wake-up.
                    self.log.warning("gpuaas: %s waits for the gateway: %s", self._log_name, e)
        except BaseException as e:  # refused, timed out, or the spawn was cancelled
            self._unsubscribe()
            if not isinstance(e, web.HTTPError):
                why = "cancelled" if isinstance(e, asyncio.CancelledError) else str(e)
                board.publish(QueueStatus("failed", options, reason=why))
            elif getattr(e, "gpuaas_ended", False):  # the sentence is the Hub's failure
                sentence = str(getattr(e, "jupyterhub_message", ""))
                board.publish(QueueStatus("failed", options, reason=sentence, ended=True))
            else:
                board.publish(QueueStatus("failed", options, reason=e.log_message % e.args))
            if isinstance(e, asyncio.CancelledError):
                # A user's stop follows at once and cancels the request (poll()); a Hub
                # shutting down does not, and the next Hub resumes it (resume.py).
                gp["kept"] = gp["rid"]
                raise
            await asyncio.shield(self.release_gpus("the spawn ended before the server started"))
            raise
        gp["grant"] = req
        self._start_heartbeat()
        await self._apply_grant(req)
        # benchmarks/hub_spawn.py reads this line: the queue's share of the spawn time.
        self.log.info(
            "gpuaas request %s of %s admitted; queueing took %.1f ms",
            req["id"],
            self._log_name,
            (time.perf_counter() - began) * 1000,
        )

    async def _queue_status(self, req: dict[str, Any], options: GpuOptions) -> QueueStatus:
        usage: list[dict[str, Any]] = []
        simulated = False
        try:
            tenants = await self._reader_client().tenants()
            simulated = bool(tenants.get("simulated"))
            for t in tenants.get("tenants") or []:
                if t.get("name") == req.get("tenant"):
                    usage = list(t.get("usage") or [])
        except GatewayError as e:
            self.log.debug("tenant usage unavailable: %s", e)
        phase = "admitted" if req.get("state") == "admitted" else "queued"
        return QueueStatus(phase, options, request=req, usage=usage, simulated=simulated)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Queue updates while waiting, then the wrapped spawner's own progress."""
        board: StatusBoard = self._gp["board"]
        async for status in board.updates():
            if status.ended:
                # The Hub's own failure event says the ending sentence, once; nothing
                # after it ("Spawning server..." would read as if it went on).
                return
            yield progress_event(status)
            if status.phase == "failed":
                return
            if status.phase in ("admitted", "skipped"):
                break
        async for event in super().progress():  # type: ignore[misc]
            yield event

    async def _apply_grant(self, req: dict[str, Any]) -> None:
        """Hand the granted devices to the wrapped spawner (overridden per spawner kind)."""

    # ----------------------------------------------------------------- running

    async def start(self) -> Any:
        gp = self._gp
        if gp["rid"] is None and self.gpu_options().gpus > 0:
            # Started without the Hub's User.spawn (a test, a script): queue here instead.
            await self.wait_for_gpus()
        result = await super().start()  # type: ignore[misc]
        gp["running"] = True
        return result

    def start_polling(self) -> None:
        super().start_polling()  # type: ignore[misc]
        # After a Hub restart the state names a live request: renew its lease again.
        if self._gp["rid"] and self._gp["hb"] is None:
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        gp = self._gp
        if gp["hb"] is None or gp["hb"].done():
            gp["hb"] = asyncio.ensure_future(self._heartbeat_loop())
        rid = gp["rid"]

        def on_event(event: dict[str, Any]) -> None:
            data = event.get("data") or {}
            if data.get("id") != rid or rid != self._gp["rid"]:
                return
            if event.get("event") in ("preempt_warning", "preempt_withdrawn"):
                self._preempt_notice(str(event["event"]), data)
            if event.get("event") in ("cull", "preempt", "finish", "expire"):
                # Kept until done: the loop holds only weak references to tasks.
                self._gp["ending"] = asyncio.ensure_future(
                    self._gateway_ended(event["event"], data)
                )

        self._subscribe(on_event)

    def _preempt_notice(self, name: str, data: dict[str, Any]) -> None:
        """Preemption with grace: the server keeps its GPUs until `at`, then is stopped."""
        if name == "preempt_withdrawn":
            self._gp["preempt_warning"] = None
            self.log.info("gpuaas: the GPUs of %s are no longer reclaimed", self._log_name)
            return
        why = (data.get("request") or {}).get("preempt_reason") or "its GPUs are reclaimed"
        self._gp["preempt_warning"] = {"rid": data.get("id"), "at": data.get("at"), "why": why}
        self.log.warning("gpuaas: %s: %s", self._log_name, self.gpuaas_notice())

    def gpuaas_notice(self) -> str | None:
        """What the user should know about this server now, e.g. "your server will be
        stopped in 5 min: nlp is reclaiming its GPU" (None: nothing)."""
        w = self._gp.get("preempt_warning")
        if not w or w["rid"] != self._gp["rid"] or not w["at"]:
            return None
        left = format_duration(max(0.0, float(w["at"]) - time.time()))
        return f"your server will be stopped in {left}: {w['why']}"

    def _busy(self) -> bool:
        if not self._gp["running"] or getattr(self, "_spawn_pending", False):
            # Starting (pulling an image, waiting for the server to answer) is not idleness;
            # the Hub's last_activity is the spawn's start until the server reports.
            return True
        last = self.orm_spawner.last_activity if self.orm_spawner is not None else None
        return active_within(last, self.activity_window)

    async def _heartbeat_loop(self) -> None:
        """Hold the request's lease in the Hub's grant holder until it is given back,
        renewed only when nobody else renews it (`Lease.watch`: never speak over a server
        whose extension renews its own request with its GPUs' busy or idle)."""
        rid = self._gp["rid"]
        if rid is None:
            return

        async def ended(why: str) -> None:
            await self._gateway_ended(why, {"id": rid})

        holder = grant_holder()
        holder.configure(self.heartbeat_interval)
        lease = Lease(
            rid,
            lambda: self._user_client(),
            on_lost=lambda _error: ended("heartbeat refused"),
            on_state=lambda req: ended(f"request {req.get('state')}"),
            watch=2 * self.heartbeat_interval,
            active=lambda: rid == self._gp["rid"] and self._gp.get("stopping") != rid,
            busy=self._busy,
        )
        try:
            await holder.held(holder.hold(lease))
        finally:
            holder.drop(lease)

    async def _gateway_ended(self, why: str, data: dict[str, Any]) -> None:
        """The gateway took the GPUs back: stop the server through the Hub's API."""
        gp = self._gp
        rid = gp["rid"]
        if rid is None or data.get("id") != rid:
            return
        try:
            req = await self._user_client().get(rid)
        except GatewayError:
            req = {"state": "unknown"}
        state = req.get("state")
        if state in ("admitted", "queued"):
            return  # resumed already (a busy heartbeat raced the cull)
        if gp.get("stopping") == rid:
            return  # the event stream and a refused heartbeat both said so
        gp["stopping"] = rid
        gp["keep"] = state == "parked"  # a parked reservation outlives the server
        # Said on the spawn form until the next start (a parked one: its cull).
        gp["ended"] = ending_sentence({**req, "kind": "server"})
        self.log.info(
            "gpuaas %s request %s of %s (%s): stopping the server",
            why,
            rid,
            self._log_name,
            state,
        )
        await self._stop_through_hub()

    async def _stop_through_hub(self) -> None:
        name = quote(self.user.name, safe="")
        path = (
            f"users/{name}/servers/{quote(self.name, safe='')}"
            if self.name
            else (f"users/{name}/server")
        )
        url = self.hub.api_url.rstrip("/") + "/" + path
        request = HTTPRequest(
            url,
            method="DELETE",
            headers={"Authorization": f"token {self._user_token()}"},
            ssl_options=self._gateway_ssl(url),  # the Hub's API, under internal SSL too
        )
        try:
            await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code != 400:  # 400: already stopping
                self.log.error("could not stop %s through the Hub: %s", self._log_name, e)

    async def poll(self) -> int | None:
        status: int | None = await super().poll()  # type: ignore[misc]
        gp = self._gp
        kept = gp["kept"]
        if status is not None and kept and not gp["running"]:
            # A pending spawn the user stopped: the Hub stops it without calling stop()
            # (nothing runs yet), so its request is given back here.
            gp.update(rid=kept, kept=None)
            await self.release_gpus("the spawn was stopped before the server started")
        elif status is not None and gp["running"] and gp["rid"] is not None:
            # Died on its own: the Hub will clean up without calling stop().
            await self.release_gpus(f"the server exited ({status})")
        elif status is not None and gp["resume"] and gp["rid"] is None:
            # A spawn that was pending when the Hub went down: start it again (resume.py).
            resume.schedule_restart(self)
        return status

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)  # type: ignore[misc]
        finally:
            # After the process is gone, so the next holder never shares a device with it.
            await self.release_gpus("the server stopped")

    async def release_gpus(self, why: str) -> None:
        """Give the request back (cancel if queued, release if admitted); idempotent."""
        gp = self._gp
        rid, keep = gp["rid"], gp["keep"]
        hb = gp["hb"]
        gp.update(rid=None, grant=None, running=False, keep=False, hb=None)
        if rid is not None and gp["kept"] == rid:
            gp["kept"] = None  # a user's stop of a pending spawn: cancelled below
        if hb is not None and hb is not asyncio.current_task():
            hb.cancel()
        self._unsubscribe()
        if rid is not None and not keep:
            try:
                await self._user_client().cancel(rid)
                self.log.info("gpuaas request %s of %s released: %s", rid, self._log_name, why)
            except GatewayError as e:
                if e.status not in (404, 409):  # 409: it had already ended
                    self.log.warning(
                        "could not release gpuaas request %s (%s); its lease will expire",
                        rid,
                        e,
                    )
        self._revoke_user_token()
