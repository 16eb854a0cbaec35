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
from typing import Any


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
    from jupyterhub import orm  # type: ignore[import-untyped]

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
