"""A claim: one holder's GPU request at the gateway, from submission to release.

Every holder of GPUs (the Hub's spawners, the kernel provisioners, the job manager) keeps
one `Claim` per request and goes through it for the four things a holder does:

- **submit** (`submit()`): the request is sent with one Idempotency-Key for the claim's
  life, so a retry after an ambiguous answer never makes a second request. A claim with
  no tenant charges the user's first tenant as the gateway lists them (`choose_tenant`);
- **wait** (`admitted()`): until the request is admitted, refused, ended or timed out.
  Woken by the process's one event stream (holder.py's `follower`) where the holder has
  one, and by `poke()`; a read of the request every `poll` seconds is the safety net;
- **hold** (`hold(busy=...)`): the grant's lease, renewed by the process's grant holder
  (holder.py) with busy or idle as the holder judges it;
- **release** (`release(keep_parked=...)`): the lease dropped and the request given back
  (cancelled if queued, released if admitted), except a parked reservation the holder
  keeps for a relaunch. Callbacks registered with `on_end` hear every end of the claim,
  released here or lost at a renewal.

What the gateway granted is a typed `Grant` (flavor, node, devices, uuids), and
`Grant.environment()` is the one mapping of a grant to the environment of the process
that holds it. Request states are the admission core's (`admission.model.State`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.client import (
    GatewayClient,
    GatewayError,
    RequestObject,
    launch_environment,
    new_idempotency_key,
)
from jupyter_gpuaas.holder import (
    TERMINAL_STATES,
    Client,
    EventFollower,
    Lease,
    Subscription,
    grant_holder,
)

__all__ = ["Claim", "ClaimError", "Grant"]

log = logging.getLogger("jupyter_gpuaas.claim")

ADMITTED = State.ADMITTED.value
#: Answers to a cancel that mean there was nothing left to give back.
GONE = (404, 409)


class ClaimError(Exception):
    """The claim will not be granted: refused, ended before admission, or not admitted in
    time. `status` is the gateway's HTTP status where one said so; `state` the request's
    state where it ended; `timed_out` when the holder's own limit ran out."""

    def __init__(
        self, message: str, *, status: int = 0, state: str | None = None, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.state = state
        self.timed_out = timed_out


@dataclass(frozen=True)
class Grant:
    """What the gateway granted a request: where its devices are and what they are."""

    request_id: str
    tenant: str | None
    flavor: str | None
    node: str | None
    devices: tuple[int, ...]
    uuids: tuple[str, ...]
    lease_expires: float | None
    # The gateway's request object it was read from (saved by spawners, read by pods).
    request: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, request: Mapping[str, Any] | None) -> Grant | None:
        """The grant of an admitted request object (None while it holds no devices)."""
        if not request or request.get("state") != ADMITTED:
            return None
        inner = request.get("grant")
        if not isinstance(inner, Mapping):
            return None
        return cls(
            request_id=str(request.get("id") or ""),
            tenant=request.get("tenant"),
            flavor=inner.get("flavor") or request.get("flavor"),
            node=inner.get("node"),
            devices=tuple(int(d) for d in inner.get("devices") or []),
            uuids=tuple(str(u) for u in inner.get("uuids") or []),
            lease_expires=inner.get("lease_expires"),
            request=request,
        )

    def environment(self) -> dict[str, str]:
        """The environment that confines the holding process to these devices
        (`client.launch_environment`, the one mapping, over the request it came from)."""
        return launch_environment(self.request)


EndCallback = Callable[[str, str], Any]


class Claim:
    """One GPU request of one holder (see the module's docstring).

    `client` may be a function, asked at each call (a spawner's token rotates). A claim
    made with `request_id` takes back a request submitted earlier (a restart): `update()`
    it with what the gateway says of it, or let `admitted()` read it.
    """

    def __init__(
        self,
        client: Client,
        kind: str,
        gpus: int,
        flavor: str | None = None,
        tenant: str | None = None,
        *,
        priority: int = 0,
        name: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.gpus = gpus
        self.flavor = flavor
        self.tenant = tenant
        self.priority = priority
        self.name = name
        self.request_id = request_id
        self.request: dict[str, Any] | None = None
        self.lease: Lease | None = None
        self.ended: str | None = None  # how the claim ended (released, lost, ...)
        self._key = new_idempotency_key()
        self._changed = asyncio.Event()
        self._reread = False
        self._on_end: list[EndCallback] = []
        self._given_back = False

    # ---------------------------------------------------------------- what it is

    def gateway(self) -> GatewayClient:
        return self.client() if callable(self.client) else self.client

    @property
    def state(self) -> str | None:
        return None if self.request is None else self.request.get("state")

    @property
    def grant(self) -> Grant | None:
        return Grant.of(self.request)

    @property
    def live(self) -> bool:
        """Submitted and not ended: there is something to hold or to give back."""
        return self.request_id is not None and self.ended is None

    def update(self, request: Mapping[str, Any]) -> None:
        """Take in what the gateway says of this request (an answer or an event's)."""
        rid = request.get("id")
        if rid is not None and self.request_id is not None and str(rid) != self.request_id:
            return
        self.request = dict(request)
        if rid is not None:
            self.request_id = str(rid)
        self._changed.set()

    def poke(self) -> None:
        """Wake `admitted()` to read the request again (something may have moved it)."""
        self._reread = True
        self._changed.set()

    def hear(self, event: Mapping[str, Any]) -> None:
        """An event of the process's stream: one about this request updates it."""
        data = event.get("data") or {}
        request = data.get("request")
        if self.request_id and data.get("id") == self.request_id and isinstance(request, Mapping):
            self.update(request)
        elif event.get("event") in ("connected", "reset"):
            self.poke()  # what happened meanwhile may not be replayed: read it

    def on_end(self, callback: EndCallback) -> None:
        """Call `callback(state, reason)` once when the claim ends: `released` (by
        `release`) or `lost` (a renewal found the grant gone)."""
        self._on_end.append(callback)

    # ---------------------------------------------------------------- submit

    async def choose_tenant(self) -> str:
        """The tenant charged: the claim's own, else the user's first as the gateway
        lists them (raises ClaimError 403 for a user in none)."""
        if self.tenant is not None:
            return self.tenant
        tenants = [str(t) for t in (await self.gateway().me()).get("tenants") or []]
        if not tenants:
            raise ClaimError(
                "you are not a member of any GPU tenant: ask an administrator to add you "
                "to a tenant group",
                status=403,
            )
        self.tenant = tenants[0]
        return self.tenant

    async def submit(self) -> RequestObject:
        """Submit the request (GatewayError on refusal); returns the gateway's answer."""
        tenant = await self.choose_tenant()
        answer = await self.gateway().submit(
            tenant,
            self.kind,
            self.gpus,
            flavor=self.flavor,
            priority=self.priority,
            name=self.name,
            idempotency_key=self._key,
        )
        self.update(answer)
        return answer

    # ---------------------------------------------------------------- wait

    async def admitted(
        self,
        *,
        poll: float,
        timeout: float | None = None,
        stream: EventFollower | None = None,
        wake: asyncio.Event | None = None,
        on_turn: Callable[[Claim], Awaitable[None] | None] | None = None,
    ) -> Grant:
        """Wait until the request is admitted and return its grant.

        Each turn first calls `on_turn(claim)` (a holder shows where it stands there, or
        raises to give up), then looks at the request's state: admitted returns, ended
        (or unknown) raises ClaimError. Between turns it sleeps until an event of
        `stream` about the request, a `poke()`, `wake` being set, or `poll` seconds;
        after a poke or the poll it reads the request. A read that fails for want of a
        gateway is tried again at the next turn; a 4xx (the request is gone) ends it.
        `timeout` (seconds, None: no limit) raises ClaimError with `timed_out`; giving
        the request back then is the holder's `release()`.
        """
        sub: Subscription | None = stream.subscribe(self.hear) if stream is not None else None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if on_turn is not None:
                    turned = on_turn(self)
                    if inspect.isawaitable(turned):
                        await turned
                state = self.state
                grant = self.grant
                if grant is not None:
                    return grant
                if state is None or state in TERMINAL_STATES:
                    reason = (self.request or {}).get("reason") or f"the request was {state}"
                    raise ClaimError(str(reason), state=state)
                wait = poll
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ClaimError("not admitted in time", state=state, timed_out=True)
                    wait = min(wait, left)
                await self._sleep(wait, wake)
                if self._reread:
                    await self.read()
        finally:
            if sub is not None:
                sub()

    async def _sleep(self, seconds: float, wake: asyncio.Event | None) -> None:
        self._changed.clear()
        self._reread = False
        waits = [asyncio.ensure_future(self._changed.wait())]
        if wake is not None:
            wake.clear()
            waits.append(asyncio.ensure_future(wake.wait()))
        try:
            done, _ = await asyncio.wait(waits, timeout=seconds)
        finally:
            for task in waits:
                task.cancel()
        if not done:
            self._reread = True  # the safety net: nothing woke us, so ask

    async def read(self) -> dict[str, Any] | None:
        """Read the request again; None when the gateway did not answer (a 4xx raises
        ClaimError: the request is gone)."""
        if self.request_id is None:
            return None
        try:
            self.update(await self.gateway().get(self.request_id))
        except GatewayError as e:
            if 0 < e.status < 500:
                raise ClaimError(f"the request is gone: {e.error}", status=e.status) from None
            log.warning("gpuaas: reading GPU request %s: %s", self.request_id, e)
            return None
        return self.request

    # ---------------------------------------------------------------- hold

    def hold(
        self,
        *,
        busy: bool | Callable[[], bool] = True,
        interval: float | None = None,
        on_lost: Callable[[GatewayError], Any] | None = None,
        **lease: Any,
    ) -> Lease:
        """Hand the grant's lease to the process's grant holder (replacing any earlier
        lease of the request). `interval`: renew at least that often; `on_lost` after the
        claim's `on_end` callbacks when a renewal finds the grant gone; the rest are
        `Lease`'s own (watch, active, on_state, on_renewed, utilization)."""
        assert self.request_id is not None, "hold() before submit()"
        holder = grant_holder()
        if interval is not None:
            holder.configure(interval)

        heard: list[GatewayError] = []

        async def lost(error: GatewayError) -> None:
            if heard:  # two renewals in flight both heard it: the holder is told once
                return
            heard.append(error)
            await self._end("lost", f"GPU grant lost: {error.error}")
            if on_lost is not None:
                result = on_lost(error)
                if inspect.isawaitable(result):
                    await result

        self.lease = holder.hold(
            Lease(self.request_id, self.client, on_lost=lost, busy=busy, **lease)
        )
        return self.lease

    def drop(self) -> None:
        """Stop renewing the lease (the request stays: its lease expires by itself)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            grant_holder().drop(lease)

    # ---------------------------------------------------------------- release

    async def release(self, reason: str = "", *, keep_parked: bool = False) -> bool:
        """Give the request back (idempotent): the lease stops, and the gateway cancels
        a queued request or frees an admitted one's devices. `keep_parked` keeps the
        request (a culled one's parked quota, kept for the holder's relaunch). False when
        the gateway could not be told (its lease then expires by itself)."""
        self.drop()
        told = True
        # Given back once, even after a renewal found the grant gone: a cull that raced a
        # busy heartbeat may have left it admitted.
        if self.request_id is not None and not keep_parked and not self._given_back:
            self._given_back = True
            try:
                await self.gateway().cancel(self.request_id)
            except GatewayError as e:
                if e.status not in GONE:
                    log.warning("gpuaas: releasing GPU request %s: %s", self.request_id, e)
                    told = False
        await self._end("released", reason)
        return told

    async def _end(self, state: str, reason: str) -> None:
        if self.ended is not None:
            return
        self.ended = state
        callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            try:
                result = callback(state, reason)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpuaas: an end-of-claim callback failed")
