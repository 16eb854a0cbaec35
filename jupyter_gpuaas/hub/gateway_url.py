"""Where a single-user server finds the gateway: through the Hub's proxy, at
`<public origin><base_url>services/gpuaas/`, never at the Hub's own port (JupyterHub
answers a request for `/services/...` there with a redirect, not the service).

The Hub knows the proxy's address; a single-user server only knows it when the Hub has a
`c.JupyterHub.public_url` (JupyterHub then sets JUPYTERHUB_PUBLIC_HUB_URL, which
`client.gateway_from_env` reads). So the spawner puts GPUAAS_URL, built here, into every
server's environment (`QueuedSpawnerMixin.get_env`), and a Hub whose spawner is not ours
does the same with `c.Spawner.environment = {"GPUAAS_URL": gateway_url_for}` (a callable
value, which JupyterHub calls with the spawner: hub_config/gpuaas_kernels.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from jupyter_gpuaas.client import SERVICE_PREFIX

__all__ = ["gateway_url_for", "proxy_origin"]

# A proxy bound to every interface is reached on the loopback by local servers.
_ANY_HOST = ("", "0.0.0.0", "::", "[::]")


def proxy_origin(spawner: Any) -> str:
    """scheme://host:port of the Hub's public proxy, as seen by this spawner's server: the
    configured public URL, else the proxy's bind URL (loopback when bound to all)."""
    public = getattr(spawner, "public_hub_url", "") or getattr(spawner, "public_url", "")
    if public:
        parsed = urlparse(public)
        return f"{parsed.scheme}://{parsed.netloc}"
    settings = getattr(getattr(spawner, "user", None), "settings", None) or {}
    proxy = settings.get("proxy")
    bind = str(getattr(proxy, "public_url", "") or "")
    if not bind:
        return ""
    parsed = urlparse(bind)
    host = parsed.hostname or ""
    if host in _ANY_HOST and not _same_host(spawner):
        return ""  # a pod or a remote host: only c.JupyterHub.public_url says where
    host = "127.0.0.1" if host in _ANY_HOST else (f"[{host}]" if ":" in host else host)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme or 'http'}://{host}{port}"


def _same_host(spawner: Any) -> bool:
    """Whether the server runs on the Hub's host (a local process spawner)."""
    from jupyterhub.spawner import LocalProcessSpawner

    return isinstance(spawner, LocalProcessSpawner)


def gateway_url_for(spawner: Any, service: str = "gpuaas") -> str:
    """The gateway's URL through the proxy for this spawner's server ('' when unknown)."""
    origin = proxy_origin(spawner)
    if not origin:
        return ""
    hub_prefix = str(getattr(getattr(spawner, "hub", None), "base_url", "") or "/hub/")
    base = hub_prefix[: -len("hub/")] if hub_prefix.endswith("/hub/") else "/"
    prefix = SERVICE_PREFIX if service == "gpuaas" else f"/services/{service}/"
    return origin + base.rstrip("/") + prefix
