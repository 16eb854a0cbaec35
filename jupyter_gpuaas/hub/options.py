"""The GPU options of a spawn: the form, its parsing, and user_options validation. PURE.

Both ways of starting a server land here: the spawn form (`options_from_form`, strings in
lists) and the Hub's REST API (`POST /hub/api/users/{name}/server` with the JSON body
`{"tenant", "flavor", "gpus"}`, which JupyterHub passes as `user_options` unchanged).
Keys other than these three are left alone for the wrapped spawner (KubeSpawner profiles).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpuaas.words import about_field, plural, usage_phrase_of

OPTION_KEYS = ("tenant", "flavor", "gpus")


class OptionsError(ValueError):
    """Bad GPU options; `field` names the key, str() is one sentence that names it
    ("gpus must be 0 or more"): the form and the Hub's REST API show the same words."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(about_field(field, message))
        self.field = field
        self.status = status  # 403: a tenant the user is not a member of


@dataclass(frozen=True)
class GpuOptions:
    gpus: int
    tenant: str | None = None
    flavor: str | None = None


def options_from_form(formdata: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Form fields (lists of strings) → user_options. Any integer (`-1` too) becomes one,
    and anything else is kept as typed, so `parse_options` — the one validation of the form
    and the REST API — says what is wrong with it, in the same words for both."""

    def one(key: str) -> str:
        values = formdata.get(key) or [""]
        return str(values[0]).strip()

    out: dict[str, Any] = {}
    gpus = one("gpus")
    if gpus:
        try:
            out["gpus"] = int(gpus)
        except ValueError:
            out["gpus"] = gpus
    for key in ("tenant", "flavor"):
        value = one(key)
        if value:
            out[key] = value
    return out


def parse_options(
    options: Mapping[str, Any],
    *,
    default_gpus: int,
    max_gpus: int,
    member_of: Sequence[str],
) -> GpuOptions:
    """Validate user_options against what the Hub knows: types, bounds, group membership.

    `member_of` is the user's tenant groups (the gateway's tenants the user belongs to, or
    just the user's groups when the gateway's list is unknown). Without a tenant, a user in
    exactly one tenant gets that one.
    """
    gpus = options.get("gpus", default_gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        raise OptionsError("gpus", f"must be a whole number, not {gpus!r}")
    if gpus < 0:
        raise OptionsError("gpus", "must be 0 or more")
    if gpus > max_gpus:
        raise OptionsError("gpus", f"must be at most {max_gpus} here")
    flavor = options.get("flavor")
    if flavor in ("", "any"):
        flavor = None
    if flavor is not None and not isinstance(flavor, str):
        raise OptionsError("flavor", "must be a flavor name")
    tenant = options.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise OptionsError("tenant", "must be a tenant (group) name")
    if gpus == 0:
        return GpuOptions(gpus=0, tenant=tenant, flavor=flavor)
    if tenant is None:
        if len(member_of) == 1:
            tenant = member_of[0]
        elif not member_of:
            raise OptionsError("tenant", "you belong to no GPU tenant (group): ask an admin")
        else:
            raise OptionsError("tenant", f"choose a tenant: one of {', '.join(member_of)}")
    if tenant not in member_of:
        raise OptionsError(
            "tenant",
            f"you are not a member of tenant {tenant!r} (tenants are JupyterHub groups; "
            f"yours: {', '.join(member_of) or 'none'})",
            status=403,
        )
    return GpuOptions(gpus=gpus, tenant=tenant, flavor=flavor)


@dataclass(frozen=True)
class TenantChoice:
    """One tenant on the form, with what it holds now (from the gateway's api/tenants)."""

    name: str
    flavors: tuple[str, ...]
    usage: str = ""


def tenant_choices(tenants_json: Mapping[str, Any], member_of: Sequence[str]) -> list[TenantChoice]:
    """The gateway's tenants the user belongs to, with a one-line usage summary each."""
    out = []
    for t in tenants_json.get("tenants") or []:
        if t.get("name") not in member_of:
            continue
        parts = []
        for u in t.get("usage") or []:
            queued = int(u.get("pending_requests") or 0)
            parts.append(
                usage_phrase_of(u) + (f", {plural(queued, 'request')} queued" if queued else "")
            )
        out.append(TenantChoice(t["name"], tuple(t.get("quota") or {}), "; ".join(parts)))
    return out


def render_form(
    *,
    tenants: Sequence[TenantChoice],
    flavor_names: Mapping[str, str],
    default_gpus: int,
    max_gpus: int,
    last: Mapping[str, Any] | None = None,
    banner: str = "",
    error: str = "",
    ended: str = "",
) -> str:
    """The spawn form's HTML (inside JupyterHub's spawn.html, Bootstrap 5 classes)."""
    e = html.escape
    last = last or {}
    parts: list[str] = []
    if banner:
        parts.append(f'<div class="alert alert-warning" id="gpuaas-banner">{e(banner)}</div>')
    if error:
        parts.append(f'<div class="alert alert-danger" id="gpuaas-error">{e(error)}</div>')
    if ended:  # how the last server ended: who or what stopped it, and why
        parts.append(f'<div class="alert alert-info" id="gpuaas-ended">{e(ended)}</div>')
    flavors: list[str] = []
    for t in tenants:
        flavors += [f for f in t.flavors if f not in flavors]
    options = []
    for t in tenants:
        selected = " selected" if last.get("tenant") == t.name else ""
        label = t.name + (f" ({t.usage})" if t.usage else "")
        options.append(f'<option value="{e(t.name)}"{selected}>{e(label)}</option>')
    if not tenants:
        options.append('<option value="">no GPU tenant: CPU only</option>')
    parts.append(
        '<div class="form-group mb-3"><label for="gpuaas-tenant" class="form-label">'
        "Team (charged for the GPUs)</label>"
        f'<select class="form-select" name="tenant" id="gpuaas-tenant">{"".join(options)}'
        "</select></div>"
    )
    fl = ['<option value="">any of the team\'s GPU kinds</option>']
    for f in flavors:
        selected = " selected" if last.get("flavor") == f else ""
        fl.append(f'<option value="{e(f)}"{selected}>{e(flavor_names.get(f, f))}</option>')
    parts.append(
        '<div class="form-group mb-3"><label for="gpuaas-flavor" class="form-label">'
        f'GPU kind</label><select class="form-select" name="flavor" id="gpuaas-flavor">'
        f"{''.join(fl)}</select></div>"
    )
    gpus = last.get("gpus", default_gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= max_gpus:
        gpus = default_gpus
    if not tenants:
        gpus, max_gpus = 0, 0
    parts.append(
        '<div class="form-group mb-3"><label for="gpuaas-gpus" class="form-label">'
        f"GPUs (0 to {max_gpus}; 0: start at once, without a GPU)</label>"
        # No min/max: the browser's own bubble would say other words than the API does.
        f'<input class="form-control" type="number" name="gpus" id="gpuaas-gpus" '
        f'value="{gpus}"></div>'
        '<p class="form-text">When no GPU is free the server waits in the team\'s queue; '
        "the next page shows its place and an estimated wait.</p>"
    )
    return "\n".join(parts)
