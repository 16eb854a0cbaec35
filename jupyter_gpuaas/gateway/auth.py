"""Who is calling and what they may do.

Two sources, one result (`Identity`):

- standalone: a token file (`tokens: {TOKEN: {user, groups, admin, view}}`);
- as the JupyterHub service `gpuaas`: the Hub's user model, whose `scopes` carry the
  custom scopes `custom:gpuaas:use` (own requests), `custom:gpuaas:view` (the whole queue)
  and `custom:gpuaas:admin` (quotas, any request), plus `access:services!service=gpuaas`.
  The Hub puts a custom scope into a token's scopes only if the token was granted it: for
  OAuth tokens of this service, that means the service's `oauth_client_allowed_scopes`
  must list them (see hub_config/gpuaas_service_snippet.py).

Tenants a user may charge are the quota file's tenants that are groups they belong to. A
scope filtered by group (`custom:gpuaas:use!group=vision`) narrows that further.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCOPE_USE = "custom:gpuaas:use"
SCOPE_VIEW = "custom:gpuaas:view"
SCOPE_ADMIN = "custom:gpuaas:admin"


@dataclass(frozen=True)
class Identity:
    name: str
    groups: frozenset[str] = frozenset()
    use: bool = True
    view: bool = False
    admin: bool = False
    # Tenants a group-filtered use scope allows; None: no filter (all of `groups`).
    use_groups: frozenset[str] | None = None
    kind: str = "user"

    @property
    def can_read(self) -> bool:
        """May read devices, tenants and its own requests."""
        return self.use or self.view or self.admin

    @property
    def can_view(self) -> bool:
        return self.view or self.admin

    def may_charge(self, tenant: str) -> bool:
        if self.admin:
            return True
        if not self.use or tenant not in self.groups:
            return False
        return self.use_groups is None or tenant in self.use_groups

    def may_see(self, owner: str) -> bool:
        return self.can_view or owner == self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "groups": sorted(self.groups),
            "use": self.use,
            "view": self.can_view,
            "admin": self.admin,
        }


METRICS_FORBIDDEN = (
    "scraping metrics needs the view scope (custom:gpuaas:view, or view: true in the token "
    "file); start the gateway with --metrics-public to let anyone scrape"
)


def may_scrape(identity: Identity) -> bool:
    """Whether `GET metrics` answers this caller, when metrics are not public.

    The view scope, as JupyterHub's `authenticate_prometheus` asks `read:metrics`: the
    series show every tenant's usage and the whole queue, which a plain user's token may
    not read through the API either.
    """
    return identity.can_view


class TokenError(ValueError):
    """A token file that breaks its format; str() is one line naming the key."""


@dataclass
class TokenTable:
    """Standalone mode's tokens. Lookup compares in constant time per entry."""

    entries: dict[str, Identity] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> TokenTable:
        if not isinstance(data, Mapping) or set(data) - {"tokens"}:
            raise TokenError("the token file must be a mapping with one key, `tokens`")
        tokens = data.get("tokens") or {}
        if not isinstance(tokens, Mapping):
            raise TokenError("tokens: must be a mapping of token to {user, groups, ...}")
        table = cls()
        for token, spec in tokens.items():
            key = f"tokens.{str(token)[:4]}…"
            if not isinstance(token, str) or len(token) < 8:
                raise TokenError(f"{key}: a token must be a string of at least 8 characters")
            if not isinstance(spec, Mapping):
                raise TokenError(f"{key}: must be a mapping with `user`")
            unknown = set(spec) - {"user", "groups", "admin", "view", "use"}
            if unknown:
                raise TokenError(f"{key}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
            user = spec.get("user")
            if not isinstance(user, str) or not user:
                raise TokenError(f"{key}.user: must be a non-empty string")
            groups = spec.get("groups") or []
            if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
                raise TokenError(f"{key}.groups: must be a list of group names")
            flags = {}
            for flag, default in (("admin", False), ("view", False), ("use", True)):
                value = spec.get(flag, default)
                if not isinstance(value, bool):
                    raise TokenError(f"{key}.{flag}: must be true or false")
                flags[flag] = value
            table.entries[token] = Identity(
                name=user,
                groups=frozenset(groups),
                use=flags["use"],
                view=flags["view"],
                admin=flags["admin"],
            )
        return table

    def lookup(self, token: str) -> Identity | None:
        found = None
        for known, identity in self.entries.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = identity
        return found


def token_from_header(value: str | None) -> str | None:
    """`token T` or `Bearer T` (case-insensitive scheme) → T."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not token.strip():
        return None
    return token.strip()


def _scope_filters(scopes: Iterable[str], base: str) -> tuple[bool, frozenset[str] | None]:
    """Whether `base` is held, and the groups it is filtered to (None: unfiltered)."""
    held = False
    groups: set[str] = set()
    unfiltered = False
    for scope in scopes:
        name, _, filt = scope.partition("!")
        if name != base:
            continue
        held = True
        if not filt:
            unfiltered = True
        elif filt.startswith("group="):
            groups.add(filt[len("group=") :])
        # other filters (user=, server=) do not name tenants: treat as no grant of tenants
    if not held:
        return False, None
    return True, (None if unfiltered else frozenset(groups))


def identity_from_hub_model(model: Mapping[str, Any], service: str = "gpuaas") -> Identity | None:
    """Map a JupyterHub user (or service) model, as HubAuth returns it, to an Identity.

    None when the model lacks access to this service (`access:services` or
    `access:services!service=<service>`) or holds none of the gpuaas scopes.
    """
    scopes = list(model.get("scopes") or [])
    access = any(s in ("access:services", f"access:services!service={service}") for s in scopes)
    if not access:
        return None
    use, use_groups = _scope_filters(scopes, SCOPE_USE)
    view, _ = _scope_filters(scopes, SCOPE_VIEW)
    admin, _ = _scope_filters(scopes, SCOPE_ADMIN)
    if not (use or view or admin):
        return None
    return Identity(
        name=str(model.get("name", "")),
        groups=frozenset(model.get("groups") or []),
        use=use or admin,
        view=view or admin,
        admin=admin,
        use_groups=use_groups,
        kind=str(model.get("kind", "user")),
    )


# --- browser sessions (HubOAuth) ------------------------------------------------------------

COOKIE_SECRET_BYTES = 32


class CookieSecretError(ValueError):
    """A cookie secret file the gateway refuses; str() is one line naming the file."""


def load_cookie_secret(path: str | os.PathLike[str]) -> bytes:
    """The key that signs the browser's login cookie, kept in `path` across restarts.

    As JupyterHub's `cookie_secret_file`: 32 random bytes written hex-encoded, mode 0600,
    when the file is missing; read back on the next start, so a restart does not log
    every browser out. A file anybody else may read or write is refused, as is one that
    does not hold at least 32 hex-encoded bytes.
    """
    file = Path(path).expanduser().absolute()
    if file.exists():
        mode = file.stat().st_mode
        if mode & 0o077:
            raise CookieSecretError(
                f"{file} can be read or written by others (mode {mode & 0o777:o}): "
                "run `chmod 600` on it"
            )
        text = file.read_text(encoding="ascii", errors="replace").strip()
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) < COOKIE_SECRET_BYTES:
            raise CookieSecretError(
                f"{file} must hold {COOKIE_SECRET_BYTES} or more random bytes in hex "
                "(openssl rand -hex 32); delete it to have a new one made"
            )
        return secret
    secret = secrets.token_bytes(COOKIE_SECRET_BYTES)
    file.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 from the start: never readable by others, not even for a moment.
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secret.hex() + "\n")
    return secret


# --- the Hub unreachable (hubauth.py) --------------------------------------------------------


class HubUnreachable(Exception):
    """The Hub could not be asked who a token is, and the gateway has never (or not
    recently enough) heard it answer for that token: answered 503 with Retry-After."""

    retry_after = 5
    public = (
        "the Hub is unreachable, so the gateway cannot check this token now (a token it "
        "checked before keeps working meanwhile); try again in a few seconds"
    )
