"""The landing page at the service prefix (`/services/gpuaas/`): the GPUs in words.

A person signed in to JupyterHub (HubOAuth: the page sends the browser through the Hub's
OAuth and the callback at `<prefix>oauth_callback` sets the login cookie) sees the queue,
the tenants with their quotas and the devices with their holders. What names they see
follows the API's rules: without `custom:gpuaas:view`, only their own requests carry
names, and everybody else's are counted per tenant. Admins (`custom:gpuaas:admin`) also
see every request with a Cancel button, and change a tenant's quota and limits in a form.

The page is rendered on the server (templates/landing.html, tornado's templates escape
every value), and its forms carry the `_xsrf` token: a cookie-authenticated POST without
it is refused with 403 (handler_base.BaseHandler). The forms run the API's own handlers
(`DELETE api/requests/{id}`, `PUT api/tenants/{name}`), so their checks and error
sentences are the API's, word for word.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tornado import web
from tornado.httputil import url_concat

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.words import eta_phrase, format_duration, plural, usage_sentence_of

from .auth import HubUnreachable, Identity
from .handler_base import ApiError, BaseHandler
from .requests_api import RequestHandler
from .tenants_api import TenantHandler

TEMPLATES = Path(__file__).resolve().parent / "templates"
LIVE = (State.QUEUED, State.ADMITTED, State.PARKED)
LIMITS = ("borrowing_limit", "lending_limit")
MAX_ROWS = 500  # requests listed on the page; the rest are counted
_INT = re.compile(r"[+-]?\d{1,30}")
_NUMBER = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


# --- words ---------------------------------------------------------------------------


def wait_sentence(obj: dict[str, Any]) -> str:
    """What a queued request waits for, and for how long, from its API object: the
    gateway's one wait sentence (`waiting_for.message`, its reason and its estimate) as it
    is, so this page says what the spawn page and the sidebar say; the estimate alone in
    the same words (words.eta_phrase) from an object without one."""
    waiting_for = obj.get("waiting_for")
    if isinstance(waiting_for, dict) and waiting_for.get("message"):
        return str(waiting_for["message"]).rstrip(".") + "."
    estimate = obj.get("estimated_wait") or {}
    seconds = estimate.get("seconds")
    return (
        eta_phrase(
            None if seconds is None else float(seconds),
            estimate.get("low"),
            estimate.get("high"),
            confidence=str(estimate.get("confidence") or ""),
        )
        + "."
    )


def position_sentence(obj: dict[str, Any]) -> str:
    pos = obj.get("position")
    if not pos:
        return "waiting"
    return (
        f"{pos['overall']} of {pos['of']}; {pos['tenant']} of {pos['tenant_of']} in {obj['tenant']}"
    )


def dashboard_link(grafana_url: str | None, tenant: str) -> str | None:
    """The Grafana dashboard showing `tenant`'s row (its repeated row, by the variable
    `tenant`), or None where no dashboard URL is configured."""
    if not grafana_url:
        return None
    return str(url_concat(grafana_url, {"var-tenant": tenant}))


def usage_sentence(tenant: str, row: dict[str, Any]) -> str:
    """`vision uses 4 a100: 2 of its own and 2 borrowed from nlp; 2 requests wait for 3 GPUs`
    (the usage in words.py's words, as every other place says it)."""
    text = usage_sentence_of(tenant, row)
    if row["pending_requests"]:
        n = row["pending_requests"]
        verb = "waits" if n == 1 else "wait"
        text += f"; {plural(n, 'request')} {verb} for {plural(row['pending_gpus'], 'GPU')}"
    return text + "."


def since(timestamp: Any, now: float) -> str:
    if not isinstance(timestamp, (int, float)):
        return ""
    return format_duration(max(0.0, now - float(timestamp))) + " ago"


# --- the handlers ----------------------------------------------------------------------


class PageHandler(BaseHandler):
    """An HTML page: a browser is sent to the Hub's login, errors are pages too."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        # No script at all: should a value ever escape its escaping, it still cannot run.
        self.set_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'self'; base-uri 'none'",
        )

    def get_template_path(self) -> str:
        return str(TEMPLATES)

    def get_login_url(self) -> str:
        """The Hub's OAuth authorize URL, with a state cookie for the callback."""
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is None:
            raise ApiError(401, "this gateway runs without JupyterHub: send a token")
        params: dict[str, str] = {}
        # PKCE where the Hub's HubOAuth has it; older ones (5.4 and before) take no
        # code_verifier at all, so it is passed only with a verifier to pass.
        state_kwargs: dict[str, str] = {}
        if getattr(hub_auth, "pkce_enabled", False):
            verifier, challenge, method = hub_auth.generate_pkce_code_challenge()
            params.update(code_challenge=challenge, code_challenge_method=method)
            state_kwargs["code_verifier"] = verifier
        params["state"] = hub_auth.set_state_cookie(self, next_url=self.request.uri, **state_kwargs)
        return str(url_concat(hub_auth.login_url, params))

    def signed_in(self) -> Identity | None:
        """The caller, or None after sending a browser to the Hub's login."""
        browser = self.request.method in ("GET", "HEAD") and self._xsrf_failure is None
        if self.identity is None and self.settings.get("hub_auth") is not None and browser:
            self.redirect(self.get_login_url())
            return None
        return self.require()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, ApiError):
            message = exc.error
        elif isinstance(exc, HubUnreachable):  # a login the gateway cannot check now
            self.set_header("Retry-After", str(exc.retry_after))
            message = exc.public
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.render(
            "error.html",
            status=status_code,
            message=message,
            home=self.settings["base_url"],
        )


class LandingHandler(PageHandler):
    def get(self) -> None:
        who = self.signed_in()
        if who is None:
            return
        self.page(who)

    def page(
        self,
        who: Identity,
        *,
        status: int = 200,
        form: dict[str, Any] | None = None,
        notice: str = "",
        notice_error: bool = False,
        confirm: dict[str, str] | None = None,
    ) -> None:
        """Render the page; `form`: a tenant form sent back with its errors; `confirm`: a
        Cancel or Release button's question, asked before anything is done."""
        self.set_status(status)
        if not notice:
            notice = self._notice()
        self.render(
            "landing.html",
            **self.view(who, form or {}),
            notice=notice,
            notice_error=notice_error,
            confirm=confirm,
        )

    def _notice(self) -> str:
        """What the last form did (Post/Redirect/Get), said only when it is true."""
        rid = self.get_query_argument("cancelled", "")
        if rid:
            owner = self.arbiter.owner_of(rid)
            obj = self.arbiter.view(rid) if owner is not None else None
            who = self.identity
            if obj and who and who.may_see(obj["user"]):
                what = f"Request {rid} ({obj['user']}, {obj['tenant']})"
                if obj["state"] == "cancelled":
                    return f"{what} is cancelled."
                if obj["state"] == "finished":
                    return f"{what} has ended and released its GPUs."
        name = self.get_query_argument("saved", "")
        if name and name in self.arbiter.config.tenants:
            return f"Saved the quota and limits of {name}."
        return ""

    def view(self, who: Identity, form: dict[str, Any]) -> dict[str, Any]:
        arb = self.arbiter
        now = time.time()
        queued: list[dict[str, Any]] = []
        running: list[dict[str, Any]] = []
        hidden: dict[str, int] = {}
        hidden_running: dict[str, int] = {}
        visible = []
        for req in list(arb.requests.values()):
            if req.state not in LIVE:
                continue
            if not who.may_see(req.user):
                bucket = hidden if req.state is State.QUEUED else hidden_running
                bucket[req.tenant] = bucket.get(req.tenant, 0) + 1
                continue
            visible.append(req)

        # A page, not a dump: the first MAX_ROWS in line (cheap positions from the core),
        # then the holders; what is left over is counted and is in api/requests.
        def order(req: Any) -> tuple[int, int, str]:
            if req.state is not State.QUEUED:
                return (1, 0, req.id)
            pos = arb.engine.position(req.id)
            return (0, pos.overall_position if pos else 1 << 30, req.id)

        visible.sort(key=order)
        more = max(0, len(visible) - MAX_ROWS)
        for req in visible[:MAX_ROWS]:
            obj = arb.request_json(req)
            row = {
                **obj,
                "since": since(obj.get("created"), now),
                "can_cancel": who.admin or req.user == who.name,
            }
            if req.state is State.QUEUED:
                row["where"] = position_sentence(obj)
                row["wait"] = wait_sentence(obj)
                queued.append(row)
            else:
                running.append(row)
        queued.sort(key=lambda r: (r["position"] or {}).get("overall", 1 << 30))
        running.sort(key=lambda r: (r["tenant"], r["user"], r["id"]))
        tenants = []
        for t in arb.tenants_json()["tenants"]:
            spec = arb.config.tenants[t["name"]]
            rows = []
            for u in t["usage"]:
                lend = spec.lendable(u["flavor"]) if spec.cohort else 0
                rows.append({**u, "lendable": lend, "sentence": usage_sentence(t["name"], u)})
            values = self._form_values(t)
            if form.get("tenant") == t["name"]:
                values = form["values"]
            tenants.append(
                {
                    **t,
                    "rows": rows,
                    "flavors": list(arb.config.flavors),
                    "values": values,
                    "dashboard": dashboard_link(self.settings.get("grafana_url"), t["name"])
                    if who.can_view
                    else None,
                    "errors": form.get("errors", []) if form.get("tenant") == t["name"] else [],
                }
            )
        devices = arb.devices_json()
        for d in devices["devices"]:
            holder = d.get("holder")
            if holder is None:
                d["held_by"] = "free"
            elif who.may_see(holder["user"]):
                d["held_by"] = (
                    f"{holder['user']} ({holder['tenant']}, {holder['kind']} {holder['id']})"
                )
            else:
                d["held_by"] = f"another user of {holder['tenant']}"
        return {
            "who": who,
            "base": self.settings["base_url"],
            "hub": getattr(self.settings.get("hub_auth"), "hub_prefix", ""),
            "simulated": devices["simulated"],
            "queued": queued,
            "running": running,
            "hidden": sorted(hidden.items()),
            "hidden_running": sorted(hidden_running.items()),
            "more": more,
            "tenants": tenants,
            "devices": devices["devices"],
            "nodes": devices["nodes"],
        }

    @staticmethod
    def _form_values(tenant: dict[str, Any]) -> dict[str, str]:
        values: dict[str, str] = {}
        for flavor, n in tenant["quota"].items():
            values[f"quota.{flavor}"] = str(n)
        for which in LIMITS:
            for flavor, n in (tenant.get(which) or {}).items():
                values[f"{which}.{flavor}"] = str(n)
        return values


def form_number(text: str) -> Any:
    """A form field as the JSON value a client would send: `2` → 2, `-1` → -1, `1.5` →
    1.5; anything else stays a string, so the API's validation says what is wrong."""
    text = text.strip()
    if _INT.fullmatch(text):
        return int(text)
    if _NUMBER.fullmatch(text):
        return float(text)
    return text


FIELD_LABELS = {
    "quota": "Quota",
    "borrowing_limit": "Borrowing limit",
    "lending_limit": "Lending limit",
}


def field_error(tenant: str, key: str, error: str) -> dict[str, str]:
    """One bad field of the quota form in words ("Quota for a100: must be a whole number
    of GPUs, 0 or more, not "two""), its scenario key kept only as a hint."""
    path = key.removeprefix(f"tenants.{tenant}.")
    block, _, flavor = path.partition(".")
    problem = error.removeprefix(f"{key}: ") if key else error
    label = FIELD_LABELS.get(block)
    words = f"{label} for {flavor}: {problem}" if label and flavor else problem
    return {"field": path, "sentence": words, "hint": key}


def field_errors(tenant: str, values: dict[str, str]) -> list[dict[str, str]]:
    """Every field of the form that is not a whole number of GPUs, 0 or more (blank is
    allowed: no quota, no limit)."""
    out = []
    for name, text in values.items():
        if not text.strip():
            continue
        value = form_number(text)
        if isinstance(value, int) and value >= 0:
            continue
        problem = f"must be a whole number of GPUs, 0 or more, not {text.strip()!r}"
        out.append(field_error(tenant, f"tenants.{tenant}.{name}", problem))
    return out


class TenantFormHandler(LandingHandler, TenantHandler):
    """POST tenant: the admin's quota form, run through `PUT api/tenants/{name}`."""

    SUPPORTED_METHODS = ("POST",)
    # Not streamed like the API's bodies: a form is small (BodyHandler.prepare still
    # refuses one past max_body_size from its Content-Length), and its `_xsrf` field must
    # be parsed before tornado's XSRF check, which runs before any streamed chunk arrives.
    _stream_request_body = False
    _form_spec: dict[str, Any] | None = None

    def json_body(self) -> dict[str, Any]:  # the API handler's body: the form, as JSON
        return dict(self._form_spec or {})

    def send(self, data: Any, status: int = 200) -> None:  # the API's answer: redirect
        name = data.get("name", "") if isinstance(data, dict) else ""
        self.redirect(
            f"{self.settings['base_url']}?{urlencode({'saved': name})}#tenants", status=303
        )

    async def post(self) -> None:
        who = self.require()
        name = self.get_body_argument("tenant", "")
        if name not in self.arbiter.config.tenants:
            raise ApiError(404, f"no tenant {name!r}", "tenant")
        if not who.admin:
            raise ApiError(403, "changing quotas needs custom:gpuaas:admin")
        values: dict[str, str] = {}
        for key in ("quota", *LIMITS):
            for flavor in self.arbiter.config.flavors:
                values[f"{key}.{flavor}"] = self.get_body_argument(f"{key}.{flavor}", "")
        errors = field_errors(name, values)
        if errors:  # every bad field at once, before the API (which stops at the first)
            form = {"tenant": name, "values": values, "errors": errors}
            self.page(who, status=400, form=form)
            return
        self._form_spec = self._spec(name, values)
        try:
            await TenantHandler.put(self, name)
        except ApiError as e:
            errors = [field_error(name, e.field or "", e.error)]
            form = {"tenant": name, "values": values, "errors": errors}
            self.page(who, status=e.status_code, form=form)

    def _spec(self, name: str, values: dict[str, str]) -> dict[str, Any]:
        """The tenant's current spec with the form's quota and limits in it. A blank quota
        leaves the flavor out of the tenant's quota; a blank limit means no limit."""
        arb = self.arbiter
        base = arb.overrides.get(name)
        if base is None:
            base = (arb.quotas.get("tenants") or {}).get(name) or {}
        spec = json.loads(json.dumps(base))  # a deep copy of plain data
        for key in ("quota", *LIMITS):
            block = {}
            for flavor in arb.config.flavors:
                text = values.get(f"{key}.{flavor}", "")
                if text.strip():
                    block[flavor] = form_number(text)
            if block or key == "quota":
                spec[key] = block
            else:
                spec.pop(key, None)
        return dict(spec)


class CancelFormHandler(LandingHandler, RequestHandler):  # type: ignore[misc]  # POST only
    """POST cancel: a Cancel button, run through `DELETE api/requests/{id}`."""

    SUPPORTED_METHODS = ("POST",)

    def send(self, data: Any, status: int = 200) -> None:
        rid = data.get("id", "") if isinstance(data, dict) else ""
        self.redirect(f"{self.settings['base_url']}?{urlencode({'cancelled': rid})}", status=303)

    async def post(self) -> None:
        who = self.require()
        rid = self.get_body_argument("request", "")
        if not rid:
            raise ApiError(400, "which request to cancel is missing", "request")
        question = self._question(who, rid)
        if question is not None and self.get_body_argument("confirm", "") != "yes":
            self.page(who, confirm=question)  # asked first: nothing is done yet
            return
        try:
            await RequestHandler.delete(self, rid)
        except ApiError as e:
            self.page(who, status=e.status_code, notice=e.error, notice_error=True)

    def _question(self, who: Identity, rid: str) -> dict[str, str] | None:
        """What the Cancel or Release button asks before it acts, e.g. "Release alice's
        server (1 a100)? It stops at once and its GPU goes to the next in line." None when
        the request is not live or not this person's to cancel (the API then says why)."""
        owner = self.arbiter.owner_of(rid)
        if owner is None or not (who.admin or owner == who.name):
            return None
        obj = self.arbiter.view(rid)
        if obj is None or obj.get("state") not in {s.value for s in LIVE}:
            return None
        whose = "your" if owner == who.name else f"{owner}'s"
        gpus = int(obj["gpus"])
        flavor = (obj.get("grant") or {}).get("flavor") or obj.get("flavor")
        size = f"{gpus} {flavor}" if flavor else plural(gpus, "GPU")
        what = f"{whose} {obj['kind']} ({size})"
        if obj["state"] == "queued":
            verb = "Cancel"
            question = f"Cancel the request of {what}? It leaves the queue."
        else:
            verb = "Release"
            question = f"Release the GPUs of {what}? It is stopped at once."
        if owner != who.name:
            question += f" {owner} is told an admin ({who.name}) did it."
        return {"request": rid, "question": question, "verb": verb}


def oauth_callback_handler() -> type[web.RequestHandler]:
    """JupyterHub's OAuth callback, using the app's own HubOAuth: the state of a login
    (set when the page sent the browser to the Hub) lives in that instance."""
    from jupyterhub.services.auth import HubOAuthCallbackHandler

    class OAuthCallbackHandler(HubOAuthCallbackHandler):  # type: ignore[misc]
        def initialize(self) -> None:
            self.hub_auth = self.settings["hub_auth"]

    return OAuthCallbackHandler


def routes(base_url: str) -> list[tuple[str, type[web.RequestHandler]]]:
    b = base_url
    return [
        (rf"{b}", LandingHandler),
        (rf"{b}tenant", TenantFormHandler),
        (rf"{b}cancel", CancelFormHandler),
    ]
