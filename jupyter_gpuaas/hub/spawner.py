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
- admitted: `apply_grant(grant)`, the documented hook, hands the grant (or None for a server
  without GPUs) to the wrapped spawner: the local spawners (local.py) override it for
  CUDA_VISIBLE_DEVICES, the Kubernetes one (kube.py) for the pod's GPU resource, node
  selector and pin;
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

The request itself is a `Claim` (claim.py): submitted, waited on, held and released the
way every holder of GPUs does. The spawner's own state is declared below as attributes,
as JupyterHub's `Spawner` declares its own (`_spawn_pending = False`).

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
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Bool, Integer, Unicode, default
from traitlets.config import Configurable

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.claim import Claim, ClaimError, Grant
from jupyter_gpuaas.client import GatewayClient, GatewayError, ssl_context
from jupyter_gpuaas.holder import (
    Seconds,
    Subscription,
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

    hub: Any  # provided by JupyterHub's Spawner

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
    # Runtime state, declared as JupyterHub's Spawner declares its own: nothing here is
    # configuration. The two mutable ones are made per spawner in __init__.

    _gpu_claim: Claim | None = None  # the gateway request while we hold or wait for one
    _resume_request: str | None = None  # a pending spawn's request to take back (resume.py)
    _resume_task: asyncio.Future[None] | None = None
    _kept_request: str | None = None  # a cancelled spawn's request, until a stop says why
    _keep_parked = False  # the gateway parked it: do not cancel on stop
    _server_running = False  # the real start finished
    _holding: asyncio.Future[None] | None = None  # the lease's task (_heartbeat_loop)
    _subscription: Subscription | None = None  # to the event stream (holder.py)
    _stopping_request: str | None = None  # the request whose end stops the server now
    _ending: asyncio.Future[None] | None = None  # that stop, kept until done
    _preempt_warning: dict[str, Any] | None = None  # the last preempt_warning's gist
    _ended_sentence: str | None = None  # how the last server ended, said on the next form
    _ended_parked: str | None = None  # its request, when parked: the sentence may go stale
    _board: StatusBoard  # the queue's status, for progress()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._board = StatusBoard()
        self._stale_tokens = []

    @property
    def _rid(self) -> str | None:
        """The id of the request held or waited for (None: none)."""
        return None if self._gpu_claim is None else self._gpu_claim.request_id

    def _claim_of(self, request_id: str, request: dict[str, Any] | None = None) -> Claim:
        """A claim on a request submitted earlier (a restarted Hub's, a kept one)."""
        claim = Claim(lambda: self._user_client(), "server", 0, request_id=request_id)
        if request:
            claim.update(request)
        return claim

    def _granted(self) -> dict[str, Any] | None:
        """The admitted request object (saved in the Hub's database), None while waiting."""
        claim = self._gpu_claim
        return claim.request if claim is not None and claim.grant is not None else None

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        token: MintedToken | None = self._request_token
        ids = [token.id] if token else []
        ids += self._stale_tokens
        rid = self._rid
        pending = (
            rid if rid and not self._server_running else self._kept_request or self._resume_request
        )
        if rid or ids or pending:
            # The token's id, never the token: the next Hub revokes it (tokens.py).
            state["gpuaas"] = {"request": rid, "grant": self._granted(), "tokens": ids}
            if pending:  # not started yet: the next Hub resumes it (resume.py)
                state["gpuaas"].update(request=pending, pending=True)
        if self._ended_sentence:
            # The Hub drops a stopped server's Spawner and makes a new one for the next
            # form: the sentence goes with the state it saves at the stop (and survives a
            # Hub restart), until the next start clears it.
            state["gpuaas_ended"] = self._ended_sentence
            if self._ended_parked:
                state["gpuaas_ended_parked"] = self._ended_parked
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        ended = state.get("gpuaas_ended")
        if isinstance(ended, str) and ended:
            self._ended_sentence = ended  # how the last server ended, for the next form
            parked = state.get("gpuaas_ended_parked")
            self._ended_parked = parked if isinstance(parked, str) and parked else None
        saved = state.get("gpuaas") or {}
        if saved.get("pending"):
            self._resume_request = saved.get("request")
            self.log.info("gpuaas request %s of %s to resume", saved["request"], self._log_name)
        elif saved.get("request"):
            self._gpu_claim = self._claim_of(str(saved["request"]), saved.get("grant"))
            self._server_running = True
        # Minted by a Hub before this one: unusable (we do not have them), so revoked
        # as soon as this Hub mints a token or ends the request.
        stale = [int(i) for i in saved.get("tokens") or [] if isinstance(i, int)]
        known = self._stale_tokens
        known += [i for i in stale if i not in known]
        if not self._rid:
            self._revoke_stale_tokens()

    def clear_state(self) -> None:
        super().clear_state()  # type: ignore[misc]
        if self._holding is None:  # never while a request is live: release() clears it
            self._gpu_claim = None
            self._keep_parked = self._server_running = False

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
        sub = self._subscription
        if sub is not None:
            sub.callback = callback
            return
        stream = follower(self._reader_client(), keep_open=bool(self.gateway_token))
        self._subscription = stream.subscribe(callback)

    def _resubscribe(self, old_token: str) -> None:
        """A per-user stream follows its token: the old one is about to be revoked."""
        sub = self._subscription
        if sub is not None and not self.gateway_token:
            self._unsubscribe()
            forget_follower(self.gateway_url, old_token)
            self._subscribe(sub.callback)

    def _unsubscribe(self) -> None:
        sub, self._subscription = self._subscription, None
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
        board = self._board
        board.reset()
        self._ended_sentence = self._ended_parked = None
        options = self.gpu_options()
        if options.gpus == 0:
            await self.apply_grant(None)
            board.publish(QueueStatus("skipped", options))
            return
        began = time.perf_counter()
        name = f"{self.user.name}/{self.name}" if self.name else self.user.name
        # No tenant chosen: "" lets the gateway charge the user's only tenant.
        claim = Claim(
            lambda: self._user_client(),
            "server",
            options.gpus,
            options.flavor,
            options.tenant or "",
            priority=self.request_priority,
            name=f"server {name}",
        )
        try:
            resumed = await resume.take_back(self, self._user_client(), options)
            if resumed is not None:
                claim.update(resumed)
            else:
                await claim.submit()
        except GatewayError as e:
            self._revoke_user_token()
            board.publish(QueueStatus("failed", options, reason=e.error))
            raise _refusal(e) from None
        self._gpu_claim = claim
        resume.save_pending(self)
        self.log.info("gpuaas request %s for %s: %s", claim.request_id, self._log_name, claim.state)
        # Any change may move our place: re-read rather than trust partial data.
        self._subscribe(lambda _event: claim.poke())
        slow_spawn.hear_as_queued(self)  # not "slow to start" while it waits in the queue

        async def show(claim: Claim) -> None:
            board.publish(await self._queue_status(claim.request or {}, options))

        try:
            try:
                await self.before_gpu_wait(claim)
                grant = await claim.admitted(
                    poll=self.refresh_interval, timeout=self.queue_timeout or None, on_turn=show
                )
            except ClaimError as e:
                if e.timed_out:
                    raise web.HTTPError(
                        504,
                        "no GPU was granted within %s (QueuedSpawnerMixin.queue_timeout);"
                        " the request was cancelled",
                        format_duration(self.queue_timeout),
                    ) from None
                # Ended while queued (an admin's cancel, a refusal) or gone: one sentence.
                raise _ended(dict(claim.request or {}) if e.state else {}) from None
        except BaseException as e:  # refused, timed out, or the spawn was cancelled
            self._unsubscribe()
            if not isinstance(e, web.HTTPError):
                why = "cancelled" if isinstance(e, asyncio.CancelledError) else str(e)
                board.publish(QueueStatus("failed", options, reason=why))
            elif getattr(e, "gpuaas_ended", False):  # the sentence is the Hub's failure
                sentence = str(getattr(e, "jupyterhub_message", ""))
                board.publish(QueueStatus("failed", options, reason=sentence, ended=True))
            else:
                board.publish(QueueStatus("failed", options, reason=(e.log_message or "") % e.args))
            if isinstance(e, asyncio.CancelledError):
                # A user's stop follows at once and cancels the request (poll()); a Hub
                # shutting down does not, and the next Hub resumes it (resume.py).
                self._kept_request = claim.request_id
                raise
            await asyncio.shield(self.release_gpus("the spawn ended before the server started"))
            raise
        self._start_heartbeat()
        await self.apply_grant(grant)
        # benchmarks/hub_spawn.py reads this line: the queue's share of the spawn time.
        self.log.info(
            "gpuaas request %s of %s admitted; queueing took %.1f ms",
            grant.request_id,
            self._log_name,
            (time.perf_counter() - began) * 1000,
        )

    async def _queue_status(self, req: Mapping[str, Any], options: GpuOptions) -> QueueStatus:
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
        async for status in self._board.updates():
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

    async def before_gpu_wait(self, claim: Claim) -> None:
        """Called once the request is submitted, before the wait for its admission: a
        spawner kind whose admission needs its server to exist already (kube.py in
        Kueue mode: the pod is what Kueue admits) makes it here. If it raises, the spawn
        fails and the request is given back."""

    async def apply_grant(self, grant: Grant | None) -> None:
        """Hand this start's grant to the wrapped spawner before it starts the server.

        The one hook a spawner kind overrides to give its server the granted devices
        (local.py: CUDA_VISIBLE_DEVICES; kube.py: the pod's GPU resource, node selector
        and pin). Called once per start: with the grant, or None for a server started
        with gpus: 0 (which should see no GPU, `hide_devices_without_grant`)."""

    # ----------------------------------------------------------------- running

    async def start(self) -> Any:
        if self._gpu_claim is None:
            if self.gpu_options().gpus > 0:
                # Started without the Hub's User.spawn (a test, a script): queue here.
                await self.wait_for_gpus()
            else:
                await self.apply_grant(None)
        result = await super().start()  # type: ignore[misc]
        self._server_running = True
        return result

    def start_polling(self) -> None:
        super().start_polling()  # type: ignore[misc]
        # After a Hub restart the state names a live request: renew its lease again.
        if self._rid and self._holding is None:
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        if self._holding is None or self._holding.done():
            self._holding = asyncio.ensure_future(self._heartbeat_loop())
        rid = self._rid

        def on_event(event: dict[str, Any]) -> None:
            data = event.get("data") or {}
            if data.get("id") != rid or rid != self._rid:
                return
            if event.get("event") in ("preempt_warning", "preempt_withdrawn"):
                self._preempt_notice(str(event["event"]), data)
            if event.get("event") in ("cull", "preempt", "finish", "expire"):
                # Kept until done: the loop holds only weak references to tasks.
                self._ending = asyncio.ensure_future(self._gateway_ended(event["event"], data))

        self._subscribe(on_event)

    def _preempt_notice(self, name: str, data: dict[str, Any]) -> None:
        """Preemption with grace: the server keeps its GPUs until `at`, then is stopped."""
        if name == "preempt_withdrawn":
            self._preempt_warning = None
            self.log.info("gpuaas: the GPUs of %s are no longer reclaimed", self._log_name)
            return
        why = (data.get("request") or {}).get("preempt_reason") or "its GPUs are reclaimed"
        self._preempt_warning = {"rid": data.get("id"), "at": data.get("at"), "why": why}
        self.log.warning("gpuaas: %s: %s", self._log_name, self.gpuaas_notice())

    def gpuaas_notice(self) -> str | None:
        """What the user should know about this server now, e.g. "your server will be
        stopped in 5 min: nlp is reclaiming its GPU" (None: nothing)."""
        w = self._preempt_warning
        if not w or w["rid"] != self._rid or not w["at"]:
            return None
        left = format_duration(max(0.0, float(w["at"]) - time.time()))
        return f"your server will be stopped in {left}: {w['why']}"

    def _busy(self) -> bool:
        if not self._server_running or getattr(self, "_spawn_pending", False):
            # Starting (pulling an image, waiting for the server to answer) is not idleness;
            # the Hub's last_activity is the spawn's start until the server reports.
            return True
        last = self.orm_spawner.last_activity if self.orm_spawner is not None else None
        return active_within(last, self.activity_window)

    async def _heartbeat_loop(self) -> None:
        """Hold the request's lease in the Hub's grant holder until it is given back,
        renewed only when nobody else renews it (`Lease.watch`: never speak over a server
        whose extension renews its own request with its GPUs' busy or idle)."""
        claim = self._gpu_claim
        if claim is None or claim.request_id is None:
            return
        rid = claim.request_id

        async def ended(why: str) -> None:
            await self._gateway_ended(why, {"id": rid})

        lease = claim.hold(
            busy=self._busy,
            interval=self.heartbeat_interval,
            on_lost=lambda _error: ended("heartbeat refused"),
            on_state=lambda req: ended(f"request {req.get('state')}"),
            watch=2 * self.heartbeat_interval,
            active=lambda: rid == self._rid and self._stopping_request != rid,
        )
        try:
            await grant_holder().held(lease)
        finally:
            grant_holder().drop(lease)

    async def _gateway_ended(self, why: str, data: dict[str, Any]) -> None:
        """The gateway took the GPUs back: stop the server through the Hub's API."""
        rid = self._rid
        if rid is None or data.get("id") != rid:
            return
        try:
            req: Mapping[str, Any] = await self._user_client().get(rid)
        except GatewayError:
            req = {"state": "unknown"}
        state = req.get("state")
        if state in (State.ADMITTED, State.QUEUED):
            return  # resumed already (a busy heartbeat raced the cull)
        if self._stopping_request == rid:
            return  # the event stream and a refused heartbeat both said so
        self._stopping_request = rid
        self._keep_parked = state == State.PARKED  # a parked reservation outlives the server
        # Said on the spawn form until the next start (a parked one: its cull).
        self._ended_sentence = ending_sentence({**req, "kind": "server"})
        self._ended_parked = rid if self._keep_parked else None
        self.log.info(
            "gpuaas %s request %s of %s (%s): stopping the server",
            why,
            rid,
            self._log_name,
            state,
        )
        await self._stop_through_hub()

    async def _last_ending(self) -> str:
        """The sentence for the next spawn form: how the last server ended. A parked
        reservation may have expired since its cull was said ("stays reserved for a
        while" is then untrue): its request is read again and said as it is now."""
        sentence, rid = self._ended_sentence or "", self._ended_parked
        if rid is None:
            return sentence
        try:
            req: Mapping[str, Any] = await self._reader_client().get(rid)
        except GatewayError:
            return sentence  # the gateway is away: what was true at the stop
        if req.get("state") == State.PARKED:
            return sentence
        self._ended_parked = None
        self._ended_sentence = ending_sentence({**req, "kind": "server"})
        return self._ended_sentence

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
        except OSError as e:  # the Hub's API is down or unreachable: said, not raised into
            # a task nobody awaits (its grant is ended already; the Hub's poll sees the rest)
            self.log.error("could not reach the Hub to stop %s: %s", self._log_name, e)

    async def poll(self) -> int | None:
        status: int | None = await super().poll()  # type: ignore[misc]
        kept = self._kept_request
        if status is not None and kept and not self._server_running:
            # A pending spawn the user stopped: the Hub stops it without calling stop()
            # (nothing runs yet), so its request is given back here.
            self._gpu_claim, self._kept_request = self._claim_of(kept), None
            await self.release_gpus("the spawn was stopped before the server started")
        elif status is not None and self._server_running and self._rid is not None:
            # Died on its own: the Hub will clean up without calling stop().
            await self.release_gpus(f"the server exited ({status})")
        elif status is not None and self._resume_request and self._rid is None:
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
        claim, keep, holding = self._gpu_claim, self._keep_parked, self._holding
        self._gpu_claim, self._holding = None, None
        self._server_running = self._keep_parked = False
        if claim is not None and self._kept_request == claim.request_id:
            self._kept_request = None  # a user's stop of a pending spawn: cancelled below
        if holding is not None and holding is not asyncio.current_task():
            holding.cancel()
        self._unsubscribe()
        released = claim is not None and await claim.release(why, keep_parked=keep)
        if claim is not None and released and not keep:
            self.log.info(
                "gpuaas request %s of %s released: %s", claim.request_id, self._log_name, why
            )
        self._revoke_user_token()
