"""Who is calling, through a Hub outage: JupyterHub's HubOAuth with a memory.

HubOAuth asks the Hub's API about each token it has not seen within `cache_max_age`
(60 s) and answers an error when the Hub cannot be reached. Single-user servers renew
their own leases with their tokens, so a Hub down for a few minutes (an upgrade, a
crash, a reschedule) would, after that minute, make every heartbeat fail and every
running server lose its GPUs at the lease TTL: the gateway would then grant those GPUs
again while the servers still use them.

So every answer the Hub gave about a token is kept. While the Hub is unreachable (no
connection, or a 5xx), a token the Hub identified before is identified as it was, until
the first of: the token's own expiry (read once from the Hub, with the service's
`read:tokens`) and `outage_grace` seconds after the Hub last vouched for it. A token
never seen, or past that, raises `HubUnreachable` (503 with Retry-After, never 401:
the token may well be good). A token the Hub rejects, once it answers, is forgotten.
Nothing is revoked during an outage (revoking goes through the Hub), so what this
keeps working is what the Hub itself last said.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuth
from jupyterhub.utils import url_path_join
from tornado.web import HTTPError
from traitlets import Float

from .auth import HubUnreachable

log = logging.getLogger("jupyter_gpuaas.gateway")

# Entries kept at most (a token each); past it the ones the Hub vouched for longest ago go.
KNOWN_MAX = 10_000


def _unreachable(e: HTTPError) -> bool:
    """HubOAuth's own errors for "no connection" (500 "Failed to connect") and "the Hub
    answered 5xx" (502), as opposed to a refusal or a bad answer."""
    message = e.log_message or ""
    return e.status_code == 502 or (
        e.status_code == 500 and message.startswith("Failed to connect")
    )


def _expiry(model: Mapping[str, Any] | None) -> float | None:
    """`expires_at` of a JupyterHub token model (ISO 8601) as a Unix time; None: never."""
    value = (model or {}).get("expires_at")
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class OutageTolerantHubOAuth(HubOAuth):  # type: ignore[misc]
    outage_grace = Float(
        3600.0,
        min=0.0,
        help="Seconds a token the Hub identified keeps working while the Hub is "
        "unreachable, counted from the Hub's last answer about it (never past the "
        "token's own expiry). 0: none, every call fails with 503 once the cache expires.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # cache key → (user model, when the Hub last vouched for it, token expiry or
        # None, whether the Hub answered about that expiry)
        self._known: dict[str, tuple[dict[str, Any], float, float | None, bool]] = {}
        self._outage_logged = 0.0

    async def _api_request(self, method: str, url: str, /, **kwargs: Any) -> Any:
        try:
            return await super()._api_request(method, url, **kwargs)
        except HTTPError as e:
            if _unreachable(e):
                raise HubUnreachable(e.log_message) from None
            raise

    async def _check_hub_authorization(
        self, url: str, api_token: str, cache_key: str | None = None, use_cache: bool = True
    ) -> Any:
        key = cache_key or "token::" + hashlib.sha256(api_token.encode()).hexdigest()
        fresh = not (use_cache and cache_key in self.cache)  # else: no Hub call now
        try:
            model = await super()._check_hub_authorization(url, api_token, cache_key, use_cache)
        except HubUnreachable:
            return self._remembered(key)
        if not model:
            self._known.pop(key, None)
        elif fresh or key not in self._known:
            await self._remember(key, model)
        return model

    def _remembered(self, key: str) -> dict[str, Any]:
        known = self._known.get(key)
        now = time.time()
        if known is not None:
            model, vouched, expires, _ = known
            until = vouched + self.outage_grace
            if expires is not None:
                until = min(until, expires)
            if now < until:
                if now - self._outage_logged > 60:
                    self._outage_logged = now
                    log.warning(
                        "the Hub is unreachable: identifying %s as the Hub did %.0f s ago",
                        model.get("name"),
                        now - vouched,
                    )
                return model
            del self._known[key]
        raise HubUnreachable(f"the Hub is unreachable and {key[:16]}… is not known")

    async def _remember(self, key: str, model: dict[str, Any]) -> None:
        old = self._known.pop(key, None)
        if old is not None and old[3] and old[0].get("token_id") == model.get("token_id"):
            expires, asked = old[2], True  # a token's expiry never changes: asked once
        else:
            expires, asked = await self._token_expiry(model)
        if len(self._known) >= KNOWN_MAX:  # dicts keep insertion order: oldest first
            del self._known[next(iter(self._known))]
        self._known[key] = (model, time.time(), expires, asked)

    async def _token_expiry(self, model: Mapping[str, Any]) -> tuple[float | None, bool]:
        """The calling token's expiry, from the Hub's token model (needs `read:tokens`
        on the service's role; None when it never expires or may not be read), and
        whether the Hub answered (if not, it is asked again next time)."""
        token_id, name = model.get("token_id"), model.get("name")
        if model.get("kind", "user") != "user" or not token_id or not name:
            return None, True
        url = url_path_join(
            self.api_url, "users", quote(str(name), safe=""), "tokens", quote(str(token_id))
        )
        try:
            token = await self._api_request("GET", url, allow_403=True)
        except HubUnreachable:
            return None, False
        except HTTPError as e:
            log.debug("cannot read the expiry of %s's token %s: %s", name, token_id, e)
            return None, True
        return _expiry(token), True
