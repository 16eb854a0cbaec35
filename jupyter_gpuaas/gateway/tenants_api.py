"""Devices, tenants (and an admin's quota changes) and the caller (api/devices,
api/tenants, api/me)."""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.words import format_duration

from .advice import advise_from_store
from .advice_cache import AdviceCache, AdviceLate
from .arbiter import Conflict
from .handler_base import ApiError, BaseHandler, BodyHandler
from .history import parse_span
from .validate import check_name, check_tenant_bounds


class DevicesHandler(BaseHandler):
    def get(self) -> None:
        who = self.require()
        self.arbiter.check_available()
        out = self.arbiter.devices_json()
        for d in out["devices"]:  # other users' names only with the view scope
            holder = d.get("holder")
            if holder is not None and not who.may_see(holder["user"]):
                holder["user"] = None
        self.send(out)


class TenantsHandler(BaseHandler):
    def get(self) -> None:
        self.require()
        self.arbiter.check_available()
        self.send(self.arbiter.tenants_json())


class TenantHandler(BodyHandler):
    async def put(self, name: str) -> None:
        who = self.require()
        if not who.admin:
            raise ApiError(403, "changing quotas needs custom:gpuaas:admin")
        if await self.forwarded():
            return
        check_name(name, "name")
        spec = self.json_body()
        check_tenant_bounds(spec)
        if spec.get("cohort") is not None:
            check_name(spec["cohort"], "cohort")
        try:
            await self.arbiter.put_tenant(name, spec)
        except SpecError as e:
            raise ApiError(400, str(e), e.key) from None
        except Conflict as e:
            raise ApiError(409, str(e)) from None
        tenants = self.arbiter.tenants_json()
        one = next(t for t in tenants["tenants"] if t["name"] == name)
        self.send({**one, "simulated": tenants["simulated"]})


class MeHandler(BaseHandler):
    def get(self) -> None:
        who = self.require()
        tenants = [t for t in self.arbiter.config.tenants if who.may_charge(t)]
        self.send({**who.to_json(), "tenants": tenants})


#: The longest history `api/advice` replays: a year.
ADVICE_SPAN_MAX = 366 * 86400.0


class AdviceHandler(BaseHandler):
    """`GET api/advice?since=30d`: advise.py over this gateway's own store, on a thread
    (reading the history and replaying what-ifs never blocks the event loop), bounded by
    advice_cache.py: an answer per period reused for a while, and a deadline past which
    the caller gets the last answer marked stale, or a 503 with Retry-After."""

    async def get(self) -> None:
        who = self.require()
        self.arbiter.check_available()
        text = self.get_query_argument("since", "30d")
        try:
            since = parse_span(text)
        except ValueError as e:
            raise ApiError(400, f"since: {e}", "since") from None
        if since > ADVICE_SPAN_MAX:
            raise ApiError(400, "since must be at most 366d", "since")
        min_grants = int(self.settings.get("advice_min_grants", 10))
        arbiter = self.arbiter
        url = arbiter.store.engine.url.render_as_string(hide_password=False)
        quotas = dict(arbiter.quotas)
        cache: AdviceCache = self.settings["advice_cache"]

        def work() -> dict[str, Any]:
            return advise_from_store(url, quotas, since, min_grants=min_grants)

        try:
            answer, stale = await cache.get(since, work)
        except AdviceLate as e:  # answered here: an error's answer drops set headers
            self.set_header("Retry-After", str(e.retry_after))
            sentence = (
                f"the advice for the last {format_duration(since)} is still being worked "
                f"out from the store's history; ask again in {e.retry_after} s"
            )
            self.send({"error": sentence, "field": None}, 503)
            return
        out = {**answer, "stale": stale}
        if not who.admin:  # a user's own work only: never another user's or a tenant's
            out["advice"] = [
                a for a in out["advice"] if a["kind"] == "smaller_gpu" and a["subject"] == who.name
            ]
        self.send(out)
