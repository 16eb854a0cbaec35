"""The requests resource: submit, list, read, cancel and heartbeat (api/requests...)."""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import urlencode

from jupyter_gpuaas.admission.model import KINDS, State
from jupyter_gpuaas.words import plural

from .arbiter import Conflict, Duplicate
from .handler_base import (
    REQUEST_ID,
    STATES,
    ApiError,
    BaseHandler,
    BodyHandler,
    check_keys,
    want_str,
)
from .validate import (
    INT32_MAX,
    LIMIT_DEFAULT,
    LIMIT_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    check_int,
    check_name,
    format_cursor,
    parse_cursor,
    parse_limit,
)


def _reject_field(reason: str) -> str | None:
    text = reason.lower()
    for field in ("tenant", "flavor"):
        if field in text:
            return field
    return "gpus"


SUBMIT_KEYS = ("tenant", "kind", "gpus", "flavor", "priority", "name")


class RequestsHandler(BodyHandler):
    async def get(self) -> None:
        who = self.require()
        self.arbiter.check_available()
        q = self.query(("state", "tenant", "user", "kind", "limit", "cursor"))
        if "state" in q and q["state"] not in STATES:
            raise ApiError(400, f"state must be one of {', '.join(STATES)}", "state")
        if "kind" in q and q["kind"] not in KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(KINDS)}", "kind")
        limit = parse_limit(q["limit"], maximum=LIMIT_MAX) if "limit" in q else LIMIT_DEFAULT
        after = parse_cursor(q["cursor"]) if "cursor" in q else None
        if not who.can_view:
            if q.get("user", who.name) != who.name:
                raise ApiError(403, "seeing other users' requests needs custom:gpuaas:view", "user")
            q["user"] = who.name
        rows = await self.arbiter.in_store(
            functools.partial(
                self.arbiter.store.query,
                state=q.get("state"),
                tenant=q.get("tenant"),
                user=q.get("user"),
                kind=q.get("kind"),
                limit=limit + 1,
                after=after,
            )
        )
        await self.arbiter.settled()  # the rows, and memory as of a committed state
        if len(rows) > limit:  # more exist: RFC 8288 says where (the list is never cut)
            rows = rows[:limit]
            nxt = {k: v for k, v in q.items() if k != "cursor"}
            nxt["cursor"] = format_cursor(rows[-1].created, rows[-1].id)
            url = f"{self.settings['base_url']}api/requests?{urlencode(sorted(nxt.items()))}"
            self.set_header("Link", f'<{url}>; rel="next"')
        out = []
        for row in rows:
            live = self.arbiter.requests.get(row.id)
            out.append(self.arbiter.request_json(live if live is not None else row))
        self.send(out)

    def idempotency_key(self) -> str | None:
        key = self.request.headers.get("Idempotency-Key")
        if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
            raise ApiError(
                400,
                "the Idempotency-Key header must be 1 to 255 visible ASCII characters",
                "Idempotency-Key",
            )
        return key

    async def post(self) -> None:
        who = self.require()
        if await self.forwarded():
            return
        data = self.json_body()
        check_keys(data, SUBMIT_KEYS)
        for key in ("tenant", "kind", "gpus"):
            if key not in data:
                raise ApiError(400, f"{key} is required", key)
        tenant = check_name(data["tenant"], "tenant")
        kind = data["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(KINDS)}", "kind")
        # More GPUs than any node has is valid input that can never be admitted: the
        # core rejects it (422, with the reason); beyond a 32-bit integer it is bad input.
        gpus = check_int(data["gpus"], "gpus", minimum=1, maximum=INT32_MAX)
        flavor = data.get("flavor")
        if flavor is not None:
            flavor = check_name(flavor, "flavor")
        priority = 0
        if data.get("priority") is not None:
            priority = check_int(
                data["priority"], "priority", minimum=PRIORITY_MIN, maximum=PRIORITY_MAX
            )
        name = want_str(data, "name", nullable=True)
        if not who.use and not who.admin:
            raise ApiError(403, "submitting needs custom:gpuaas:use")
        if tenant in self.arbiter.config.tenants and not who.may_charge(tenant):
            raise ApiError(403, f"you are not a member of tenant {tenant!r}", "tenant")
        self._take_queue_slot(who.name)
        # Answered once the submission (and whatever it admitted) is committed; `obj` is
        # the request as of its own decision. A retry (the same Idempotency-Key from the
        # same user) is answered 200 with the request the first one created.
        try:
            req, obj = await self.arbiter.submit(
                tenant=tenant,
                user=who.name,
                kind=kind,
                gpus=gpus,
                flavor=flavor,
                priority=priority,
                name=name,
                key=self.idempotency_key(),
            )
        except Duplicate as d:
            self.set_header(
                "Location", f"{self.settings['base_url']}api/requests/{d.request['id']}"
            )
            self.send(d.request, 200)
            return
        if req.state is State.REJECTED:
            raise ApiError(422, req.reason, _reject_field(req.reason), id=req.id, request=obj)
        self.set_header("Location", f"{self.settings['base_url']}api/requests/{req.id}")
        self.send(obj, 201)

    _slot_of: str | None = None  # the user whose queue slot this submission holds

    def _take_queue_slot(self, user: str) -> None:
        """Room in `user`'s share of the queue (GatewayApp.max_queued_per_user), or 429.

        Counts the user's queued requests and their submissions not yet answered (a slot
        held from here to `on_finish`), so concurrent submissions cannot pass the limit
        together."""
        limit = int(self.settings.get("max_queued_per_user", 0))
        if not limit:
            return
        in_flight: dict[str, int] = self.settings.setdefault("_submits_in_flight", {})
        queued = sum(
            1 for r in self.arbiter.requests.values() if r.user == user and r.state is State.QUEUED
        )
        if queued + in_flight.get(user, 0) >= limit:
            raise ApiError(
                429,
                f"you already have {plural(limit, 'request')} waiting in the queue, the most "
                "one user may have: cancel one, or wait until one is admitted",
            )
        in_flight[user] = in_flight.get(user, 0) + 1
        self._slot_of = user

    def on_finish(self) -> None:
        user, self._slot_of = self._slot_of, None
        if user is not None:
            in_flight: dict[str, int] = self.settings["_submits_in_flight"]
            in_flight[user] -= 1
            if not in_flight[user]:
                del in_flight[user]


IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


class RequestHandler(BaseHandler):
    def _find(self, rid: str) -> dict[str, Any]:
        self.arbiter.check_available()
        if not REQUEST_ID.fullmatch(rid):
            raise ApiError(404, "no such request (ids look like r-0123456789abcdef)")
        obj = self.arbiter.view(rid)
        if obj is None:
            raise ApiError(404, f"no request {rid}")
        return obj

    def get(self, rid: str) -> None:
        who = self.require()
        obj = self._find(rid)
        if not who.may_see(obj["user"]):
            raise ApiError(403, "not your request (seeing it needs custom:gpuaas:view)")
        self.send(obj)

    async def delete(self, rid: str) -> None:
        who = self.require()
        if await self.forwarded():
            return
        owner = self._owner(rid)
        if owner != who.name and not who.admin:
            raise ApiError(403, "not your request (cancelling it needs custom:gpuaas:admin)")
        try:
            _, obj = await self.arbiter.cancel(rid, who.name)
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        self.send(obj)


HEARTBEAT_KEYS = ("busy", "utilization", "uuids")
#: A GPU's or MIG instance's UUID as NVML and the device plugin write it.
_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9/-]{1,120}")


class HeartbeatHandler(BodyHandler):
    async def post(self, rid: str) -> None:
        who = self.require()
        if await self.forwarded():
            return
        data = self.json_body()
        check_keys(data, HEARTBEAT_KEYS)
        if not isinstance(data.get("busy"), bool):
            raise ApiError(400, "busy is required and must be true or false", "busy")
        util = data.get("utilization")
        if util is not None:
            if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 1:
                raise ApiError(400, "utilization must be a number from 0 to 1", "utilization")
            util = float(util)
        uuids = data.get("uuids")
        if uuids is not None and not (
            isinstance(uuids, list)
            and len(uuids) <= 64
            and all(isinstance(u, str) and _UUID.fullmatch(u) for u in uuids)
        ):
            raise ApiError(400, "uuids must be a list of the GPUs' UUIDs (GPU-… or MIG-…)", "uuids")
        owner = self._owner(rid)
        if owner != who.name:
            raise ApiError(403, "only the holder may heartbeat its request")
        try:
            _, obj = await self.arbiter.heartbeat(rid, data["busy"], util, uuids)
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        self.send(obj)
