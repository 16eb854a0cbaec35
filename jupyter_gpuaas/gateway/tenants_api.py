"""Devices, tenants (and an admin's quota changes) and the caller (api/devices,
api/tenants, api/me)."""

from __future__ import annotations

from jupyter_gpuaas.admission.config import SpecError

from .arbiter import Conflict
from .handler_base import ApiError, BaseHandler, BodyHandler
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
