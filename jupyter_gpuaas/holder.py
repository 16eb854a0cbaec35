"""The grant holder: the one way a process holds the gateway's grants and hears its events.

Every holder of a grant goes through this module: in a single-user server the
`jupyter_gpuaas` extension (its GPU kernels and the server's own request, server/idle.py),
the job manager (jobs/), the kernel provisioner when no extension runs (nbclient,
`jupyter console`) and the Kubernetes kernels built on it; in the Hub, the spawners'
server requests. What they share, once per process (per event loop):

- **Renewal.** `grant_holder()` keeps every `Lease` of the process and renews them all
  in one round at one interval: the shortest any holder asked for (`configure`), so no
  lease is renewed more slowly than its holder needs. A round first runs the round hooks
  (the extension judges each kernel busy or idle there, and the server itself), then
  heartbeats every lease at once. A 404 or 409 answer means the grant has ended without
  us hearing of it (culled, preempted, released, its lease expired): the lease leaves the
  holder and its `on_lost` says what to do. Any other failure is logged and the next
  round tries again, while the lease's TTL lasts.
- **Events.** `follower(client)` is the one Server-Sent Events connection of the process
  to a gateway per URL and token, fanned out to every subscriber (the extension, the job
  manager, the sidebar's event stream, the Hub's spawners). It reconnects with backoff
  and resumes with `Last-Event-ID`, so what happened meanwhile arrives first; a `reset`
  (the gateway could not replay) is handed to subscribers that asked `relist=True` as one
  `sync` event per request, listed once for all of them.
- **Words.** `TERMINAL_STATES` (a request that holds nothing any more, from the admission
  core's states) and the positive `Seconds` trait are defined here once; durations are
  `words.format_duration`.

A holder's own request (submit, wait, hold, release) is a `Claim` (claim.py), built on this.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from traitlets import Float, TraitError

from jupyter_gpuaas.admission.model import TERMINAL, State
from jupyter_gpuaas.client import GatewayClient, GatewayError

__all__ = [
    "TERMINAL_STATES",
    "EventFollower",
    "GrantHolder",
    "Lease",
    "Seconds",
    "Subscription",
    "active_within",
    "follow",
    "follower",
    "forget_follower",
    "grant_holder",
]

log = logging.getLogger("jupyter_gpuaas.holder")

#: Request states after which the gateway holds nothing for the request's holder: the
#: admission core's TERMINAL, and culled (its quota may stay parked for a relaunch, but its
#: GPUs are gone).
TERMINAL_STATES = frozenset({s.value for s in TERMINAL} | {State.CULLED.value})
#: Answers to a heartbeat that mean the grant ended: gone (404) or no longer admitted (409).
LOST = (404, 409)


class Seconds(Float[float, float]):
    """A float trait of seconds that must be more than 0 (`zero_ok`: at least 0).

    traitlets' `min=` is inclusive, which says "at least 0" but not "more than 0"."""

    def __init__(self, default_value: float, *, zero_ok: bool = False, **kwargs: Any) -> None:
        self.zero_ok = zero_ok
        super().__init__(default_value, min=0.0, **kwargs)

    def validate(self, obj: Any, value: Any) -> float:
        value = super().validate(obj, value)
        if value == 0 and not self.zero_ok:
            raise TraitError(f"{self.name} must be more than 0 seconds, not {value}")
        return float(value)


# ---------------------------------------------------------------------- renewal

Client = GatewayClient | Callable[[], GatewayClient]


@dataclass(eq=False)
class Lease:
    """One grant renewed by the process's holder.

    `client` may be a function, asked at each renewal (a spawner's token rotates). `busy`
    and `utilization` are what the next heartbeat says (a function for `busy` is asked
    then). `active` False drops the lease.

    `watch` is for a lease that another process may renew too: the Hub's spawner holds a
    server's request, and the server's own extension renews it with busy or idle from
    its GPUs, kernels and jobs; a busy heartbeat from the Hub would reset that idle clock
    with the Hub's coarse HTTP activity. So each round reads the request instead and
    renews it only when fewer than `watch` seconds of lease are left (a server without
    the extension keeps its grant, one with it is left to speak). A request read that is
    no longer admitted goes to `on_state(request)` (the lease stays: a cull may have
    raced a busy heartbeat); no `lease_expires` means a gateway without leases.
    """

    request_id: str
    client: Client
    on_lost: Callable[[GatewayError], Any] | None = None
    on_renewed: Callable[[dict[str, Any]], Any] | None = None
    on_state: Callable[[dict[str, Any]], Any] | None = None
    watch: float | None = None
    active: Callable[[], bool] | None = None
    busy: bool | Callable[[], bool] = True
    utilization: float | None = None
    lease_expires: float | None = None
    renewed_at: datetime | None = None
    lost: GatewayError | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # The lease's callback still running (stopping a server takes seconds): the lease
    # sits its rounds out meanwhile, and nobody else's round waits for it.
    busy_with: asyncio.Task[None] | None = None

    def run(self, callback: Callable[[Any], Any], arg: Any, what: str) -> None:
        self.busy_with = asyncio.ensure_future(_call(callback, arg, what=what))

    def gateway(self) -> GatewayClient:
        return self.client() if callable(self.client) else self.client


class GrantHolder:
    """Every lease of the process, renewed in one loop (see the module's docstring)."""

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self._configured: float | None = None
        self.leases: dict[str, Lease] = {}
        self._rounds: list[Callable[[], Awaitable[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.rounds = 0  # rounds run (logs, tests)

    def configure(self, interval: float) -> None:
        """Ask for renewals at least every `interval` seconds (the shortest asked wins)."""
        interval = float(interval)
        if self._configured is None or interval < self._configured:
            self._configured = self.interval = interval
            self._wake.set()

    def hold(self, lease: Lease) -> Lease:
        """Renew `lease` from the next round on; it replaces a lease of the same request."""
        old = self.leases.get(lease.request_id)
        if old is not None and old is not lease:
            old.gone.set()
        self.leases[lease.request_id] = lease
        self._ensure_running()
        return lease

    def drop(self, lease: Lease | None) -> None:
        """Stop renewing `lease` (idempotent)."""
        if lease is None:
            return
        if self.leases.get(lease.request_id) is lease:
            del self.leases[lease.request_id]
        lease.gone.set()
        self._idle()

    async def held(self, lease: Lease) -> None:
        """Until `lease` leaves the holder (dropped, inactive, lost or replaced)."""
        await lease.gone.wait()

    def add_round(self, hook: Callable[[], Awaitable[None]]) -> Callable[[], None]:
        """Run `hook()` at the start of every round (before the heartbeats); returns the
        function that removes it."""
        self._rounds.append(hook)
        self._ensure_running()

        def remove() -> None:
            if hook in self._rounds:
                self._rounds.remove(hook)
            self._idle()

        return remove

    def _idle(self) -> None:
        if not self.leases and not self._rounds:
            self._wake.set()  # nothing left to renew: the loop ends now, not after a sleep

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while self.leases or self._rounds:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpuaas: a lease renewal round failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass

    async def round(self) -> None:
        """The round hooks, then one heartbeat of every active lease, all at once."""
        self.rounds += 1
        for hook in list(self._rounds):
            try:
                await hook()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpuaas: a renewal round hook failed")
        leases = []
        for lease in list(self.leases.values()):
            if lease.active is not None and not lease.active():
                self.drop(lease)
            else:
                leases.append(lease)
        await asyncio.gather(*(self._turn(lease) for lease in leases), return_exceptions=True)

    async def _turn(self, lease: Lease) -> None:
        if lease.busy_with is not None and not lease.busy_with.done():
            return
        if lease.watch is not None:
            try:
                request = await lease.gateway().get(lease.request_id)
            except GatewayError as e:
                await self._failed(lease, e)
                return
            if request.get("state") != State.ADMITTED.value:
                if lease.on_state is not None:
                    lease.run(lease.on_state, request, "a request-state callback")
                return
            grant = request.get("grant")
            expires = grant.get("lease_expires") if grant else None
            if expires is None or expires - time.time() >= lease.watch:
                return  # renewed by someone else (or no leases): nothing to say
        if self.leases.get(lease.request_id) is lease:  # a callback may have ended it
            await self.renew(lease)

    async def renew(self, lease: Lease) -> bool:
        """One heartbeat of `lease`, with the one handling of its answer."""
        if lease.lost is not None:
            return False
        busy = bool(lease.busy() if callable(lease.busy) else lease.busy)
        client = lease.gateway()
        try:
            uuids = seen_uuids()
            if uuids:  # named only when there are some (gpuaas_grant_info, Kubernetes)
                answer = await client.heartbeat(
                    lease.request_id, busy, lease.utilization, uuids=uuids
                )
            elif lease.utilization is None:
                answer = await client.heartbeat(lease.request_id, busy)
            else:
                answer = await client.heartbeat(lease.request_id, busy, lease.utilization)
        except GatewayError as e:
            await self._failed(lease, e)
            return False
        lease.renewed_at = datetime.now(timezone.utc)
        grant = answer.get("grant") if answer else None
        if grant:
            lease.lease_expires = grant.get("lease_expires", lease.lease_expires)
        if lease.on_renewed is not None:
            await _call(lease.on_renewed, answer or {}, what="a renewal callback")
        return True

    async def _failed(self, lease: Lease, error: GatewayError) -> None:
        if error.status not in LOST:
            log.warning("gpuaas: renewing the lease of %s failed: %s", lease.request_id, error)
            return
        lease.lost = error
        self.drop(lease)
        log.info("gpuaas: the grant of %s has ended (%s)", lease.request_id, error)
        if lease.on_lost is not None:
            lease.run(lease.on_lost, error, "a lost-grant callback")


def seen_uuids(env: Mapping[str, str] | None = None) -> list[str]:
    """The UUIDs of the GPUs this process was given, where its environment names them:
    in a Kubernetes pod the device plugin picks the GPUs and names them in
    NVIDIA_VISIBLE_DEVICES (its default `uuid` device ids), which only the pod knows;
    a local grant names them in CUDA_VISIBLE_DEVICES. Indices or `all` name none."""
    env = os.environ if env is None else env
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        parts = [p.strip() for p in (env.get(name) or "").split(",")]
        uuids = [p for p in parts if p.startswith(("GPU-", "MIG-"))]
        if uuids:
            return uuids
    return []


def active_within(last: datetime | None, window: float) -> bool:
    """Busy by a last-activity time (the Hub's `Spawner.orm_spawner.last_activity`, naive
    UTC or aware): some activity within the last `window` seconds."""
    if last is None:
        return False
    if last.tzinfo is not None:
        last = last.astimezone(timezone.utc).replace(tzinfo=None)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    return (now - last).total_seconds() < window


async def _call(callback: Callable[[Any], Any], arg: Any, *, what: str) -> None:
    try:
        result = callback(arg)
        if inspect.isawaitable(result):
            await result
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("gpuaas: %s failed", what)


_holders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GrantHolder] = (
    weakref.WeakKeyDictionary()
)


def grant_holder() -> GrantHolder:
    """The holder of this process (of its running event loop: one per loop in tests)."""
    loop = asyncio.get_running_loop()
    holder = _holders.get(loop)
    if holder is None:
        holder = _holders[loop] = GrantHolder()
    return holder


# ---------------------------------------------------------------------- events

Event = dict[str, Any]
Callback = Callable[[Event], Any]


class Subscription:
    """One subscriber: a plain callback is called in order as events come; a coroutine
    function gets its own queue and task, so a slow one (a kernel shutting down) delays
    nobody else and still sees its events in order. Calling it unsubscribes; its
    `callback` may be replaced meanwhile (a spawner: waiting, then running)."""

    def __init__(
        self, stream: EventFollower, callback: Callback, relist: bool, comments: bool
    ) -> None:
        self.stream = stream
        self.callback = callback
        self.relist = relist
        self.comments = comments
        self.queue: asyncio.Queue[Event] | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def queued(self) -> bool:
        return inspect.iscoroutinefunction(self.callback)

    def __call__(self) -> None:
        self.stream.unsubscribe(self)

    def deliver(self, event: Event) -> None:
        if not self.queued:
            try:
                self.callback(event)
            except Exception:
                log.exception("gpuaas: an event subscriber failed on %s", event.get("event"))
            return
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.task = asyncio.ensure_future(self._work())
        self.queue.put_nowait(event)

    async def _work(self) -> None:
        assert self.queue is not None
        while True:
            event = await self.queue.get()
            try:
                await self.callback(event)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpuaas: handling the event %s failed", event.get("event"))

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()


class EventFollower:
    """The one event stream of the process for one gateway URL and token.

    Subscribers get `{"event": name, "data": {...}, "id": id}` as the gateway sends them,
    and `{"event": "connected"}` after each (re)connection (re-read what you show). With
    `comments=True` also the stream's comments (`{"comment": "keepalive"}`) and
    `{"event": "disconnected"}` when the connection drops or cannot be made (the sidebar's
    stream then ends, and the browser polls until it is back). The stream
    runs while it has subscribers (or always, `keep_open`: the Hub's shared stream).
    `recent` keeps the last events heard, so a consumer that resumes from an id (a
    browser's EventSource through the server) is replayed what it missed (`since`).
    """

    def __init__(
        self,
        client: GatewayClient,
        *,
        keep_open: bool = False,
        reconnect_delay: float = 0.5,
        max_backoff: float = 10.0,
        remember: int = 512,
    ) -> None:
        self.client = client
        self.keep_open = keep_open
        self.reconnect_delay = reconnect_delay
        self.max_backoff = max_backoff
        self.last_id: str | None = None
        self.connected = False
        self.connections = 0  # streams opened, reconnections included
        self.recent: deque[tuple[str, Event | None]] = deque(maxlen=remember)
        self._subs: list[Subscription] = []
        self._task: asyncio.Task[None] | None = None

    def subscribe(
        self, callback: Callback, *, relist: bool = False, comments: bool = False
    ) -> Subscription:
        """Add a subscriber; calling what it returns removes it."""
        sub = Subscription(self, callback, relist, comments)
        self._subs.append(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            sub.close()
            # After the caller's turn: an unsubscribe followed by a subscribe (a token
            # rotating) keeps the connection.
            try:
                asyncio.get_running_loop().call_soon(self._maybe_close)
            except RuntimeError:  # no loop runs any more: nothing to keep
                self._maybe_close()

    def _maybe_close(self) -> None:
        if not self._subs and not self.keep_open and self._task is not None:
            self._task.cancel()
            self._task = None
            self.connected = False

    def since(self, last_id: str) -> list[Event]:
        """What came after the event `last_id`, or one `reset` when that is not known."""
        if last_id == self.last_id:
            return []
        ids = [i for i, _ in self.recent]
        if last_id in ids:
            after = list(self.recent)[ids.index(last_id) + 1 :]
            return [event for _, event in after if event is not None]
        reason = (
            f"cannot replay the events after {last_id[:40]!r}: the server did not hear "
            "it, or too long ago; list the requests again"
        )
        return [{"event": "reset", "data": {"reason": reason, "id": None}, "id": self.last_id}]

    def _dispatch(self, event: Event) -> None:
        comment = "comment" in event
        for sub in list(self._subs):
            if comment and not sub.comments:
                continue
            sub.deliver(event)

    async def _reset(self, event: Event) -> None:
        """The gateway could not replay: relist once for the subscribers that asked."""
        log.info("gpuaas: event stream reset: %s", (event.get("data") or {}).get("reason"))
        for sub in list(self._subs):
            if not sub.relist:
                sub.deliver(event)
        relisting = [sub for sub in self._subs if sub.relist]
        if not relisting:
            return
        try:
            requests = await self.client.list()
        except GatewayError as e:
            log.warning("gpuaas: relisting the requests after a reset failed: %s", e)
            return
        for request in requests:
            sync = {"event": "sync", "data": {"id": request.get("id"), "request": request}}
            for sub in relisting:
                sub.deliver(sync)

    async def _run(self) -> None:
        delay = self.reconnect_delay
        while self._subs or self.keep_open:
            try:
                self.connections += 1
                async for event in self.client.events(comments=True, last_event_id=self.last_id):
                    if event.get("id"):
                        self.last_id = str(event["id"])
                        self.recent.append((self.last_id, None if "comment" in event else event))
                    if "comment" in event:
                        if event["comment"] == "connected" or not self.connected:
                            self.connected = True
                            delay = self.reconnect_delay
                            self._dispatch({"event": "connected"})
                        else:
                            self._dispatch(event)
                    elif event.get("event") == "reset":
                        await self._reset(event)
                    else:
                        self._dispatch(event)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # refused, unreachable, dropped mid-chunk
                log.warning("gpuaas: event stream: %s; reconnecting in %.1f s", e, delay)
            self.connected = False
            for sub in list(self._subs):
                if sub.comments:
                    sub.deliver({"event": "disconnected"})
            await asyncio.sleep(delay)
            delay = min(self.max_backoff, delay * 2)


_followers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str], EventFollower]
] = weakref.WeakKeyDictionary()


def follower(
    client: GatewayClient, *, keep_open: bool = False, reconnect_delay: float | None = None
) -> EventFollower:
    """The event stream of this process for `client`'s gateway and token (made on first
    use, with `client`'s TLS settings)."""
    streams = _followers.setdefault(asyncio.get_running_loop(), {})
    key = (client.url, client.token)
    stream = streams.get(key)
    if stream is None:
        stream = streams[key] = EventFollower(client, keep_open=keep_open)
    stream.keep_open = stream.keep_open or keep_open
    if reconnect_delay is not None:
        stream.reconnect_delay = min(stream.reconnect_delay, float(reconnect_delay))
    return stream


def forget_follower(url: str, token: str) -> None:
    """Drop a stream whose token is revoked (a spawner's rotated request token)."""
    try:
        streams = _followers.get(asyncio.get_running_loop(), {})
    except RuntimeError:
        return
    streams.pop((url.rstrip("/") + "/", token), None)


def follow(
    client: GatewayClient,
    on_event: Callable[[str, dict[str, Any]], Awaitable[None]],
    *,
    reconnect_delay: float | None = None,
) -> Callable[[], None]:
    """Hand every event of the process's stream to `on_event(name, data)`, in order, and
    after a reset each request as `on_event("sync", {"id": ..., "request": {...}})`.
    Returns the function that stops it."""

    async def deliver(event: Event) -> None:
        name = str(event.get("event"))
        if name != "connected":
            await on_event(name, dict(event.get("data") or {}))

    stream = follower(client, reconnect_delay=reconnect_delay)
    return stream.subscribe(deliver, relist=True)


def encode(event: Event) -> bytes:
    """An event (or comment) as the gateway sent it on the wire."""
    if "comment" in event:
        return f": {event['comment']}\n\n".encode()
    head = f"id: {event['id']}\n" if event.get("id") else ""
    return f"{head}event: {event['event']}\ndata: {json.dumps(event['data'])}\n\n".encode()
