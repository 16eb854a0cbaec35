"""The user tokens the spawner mints to talk to the gateway for one request.

Each token is the user's own (so the gateway's ownership and tenant checks apply), with
only the scopes the request needs, and it never outlives its use:

- it expires (`expires_in`): a Hub that dies holding one leaves a token that stops
  working by itself; while the request lives, the spawner mints the next one when half
  the lifetime is gone and revokes the old one;
- it is revoked when the request ends (stop, the server's death, a cancelled spawn);
- the spawner's state (saved in the Hub's database) carries the token's *id*, never the
  token: a restarted Hub, which cannot use the old token, revokes it by id as soon as it
  loads the spawner, and mints a new one. The secret itself is never written anywhere.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from traitlets import Integer
from traitlets.config import Configurable

from jupyter_gpuaas.holder import forget_follower


@dataclass
class MintedToken:
    token: str
    id: int
    expires_at: float  # time.time() seconds

    def fresh(self, lifetime: float, now: float | None = None) -> bool:
        """More than half of its lifetime is left (else it is time for the next one)."""
        left = self.expires_at - (time.time() if now is None else now)
        return left > lifetime / 2


def mint(user: Any, *, note: str, scopes: list[str], lifetime: int) -> MintedToken:
    """A new token of `user` (JupyterHub's User), expiring in `lifetime` seconds."""
    from jupyterhub import orm

    began = time.time()
    token = user.new_api_token(note=note, scopes=scopes, expires_in=lifetime)
    found = orm.APIToken.find(user.db, token)
    return MintedToken(str(token), int(found.id), began + lifetime)


def revoke(user: Any, ids: list[int], log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Delete these tokens of `user` (already gone, or another user's: skipped)."""
    if not ids:
        return
    from jupyterhub import orm

    db = user.db
    try:
        for token_id in ids:
            found = db.get(orm.APIToken, token_id)
            if found is not None and found.user_id == user.id:
                db.delete(found)
        db.commit()
    except Exception:
        db.rollback()
        log.exception("could not revoke the gpuaas tokens %s of %s", ids, user.name)


class RequestTokenMixin(Configurable):
    """The request token's life in the spawner."""

    _request_token: MintedToken | None = None  # the token of the live request
    _stale_tokens: list[int]  # ids of tokens a previous Hub (or token) minted: to revoke

    # Provided by QueuedSpawnerMixin and JupyterHub's Spawner.
    if TYPE_CHECKING:

        def get_state(self) -> dict[str, Any]: ...

    gateway_url: str
    gateway_service_name: str
    user: Any
    name: str
    orm_spawner: Any
    log: Any
    _log_name: str

    def _resubscribe(self, old_token: str) -> None:
        raise NotImplementedError

    request_token_lifetime = Integer(
        3600,
        min=30,
        help="""Seconds the user token minted for a request lives (JupyterHub's
        `expires_in`). While the request lives the spawner mints the next token when half
        of this is gone and revokes the old one; the request's end revokes it at once, and
        a Hub that dies holding one leaves a token that expires by itself.""",
    ).tag(config=True)

    def _user_token(self) -> str:
        """A token of this user for the request's life: submit, heartbeat, stop itself.

        Replaced by a new one once half of `request_token_lifetime` is gone (the old one
        is revoked), so no call ever carries an expired token.
        """
        old = self._request_token
        if old is not None and old.fresh(self.request_token_lifetime):
            return old.token
        server = f"{self.user.name}/{self.name}"
        token = self._request_token = mint(
            self.user,
            note=f"gpuaas request of server {server or 'default'}",
            scopes=[
                "custom:gpuaas:use",
                f"access:services!service={self.gateway_service_name}",
                f"servers!server={server}",
            ],
            lifetime=self.request_token_lifetime,
        )
        if old is not None:
            self._stale_tokens.append(old.id)
            self._resubscribe(old.token)
        self._revoke_stale_tokens()
        self._save_state()
        return str(token.token)

    def _save_state(self) -> None:
        """Write the state now, so the Hub's database always names the live token."""
        if self.orm_spawner is None:
            return
        try:
            self.orm_spawner.state = self.get_state()
            self.user.db.commit()
        except Exception:
            self.log.exception("could not save the gpuaas state of %s", self._log_name)

    def _revoke_stale_tokens(self) -> None:
        ids, self._stale_tokens = self._stale_tokens, []
        revoke(self.user, ids, self.log)

    def _revoke_user_token(self) -> None:
        token, self._request_token = self._request_token, None
        if token is not None:
            forget_follower(self.gateway_url, token.token)
            self._stale_tokens.append(token.id)
        self._revoke_stale_tokens()
