# JupyterHub config for GPU kernels (`c = get_config()` is implied): load it next to the
# gateway's service snippet, e.g. `jupyterhub -f jupyterhub_config.py` where that file ends
# with `load_subconfig("hub_config/gpuaas_kernels.py")`.
#
# The single-user server's extension (`jupyter_gpuaas`) talks to the gateway with the
# server's own token, $JUPYTERHUB_API_TOKEN. Give that token the gateway's `use` scope (own
# requests) and access to the `gpuaas` service, on top of what the `server` role grants.
# JupyterHub hands the token only the scopes the user holds too, so users also need a role
# with `custom:gpuaas:use` (the gateway's service snippet defines that scope).
c.Spawner.server_token_scopes = [  # noqa: F821
    "users:activity!user",
    "access:servers!server",
    "custom:gpuaas:use",
    "access:services!service=gpuaas",
]
# The extension finds the gateway through the Hub's proxy: GPUAAS_URL, which the queued
# spawners set and any other spawner gets from this callable (JupyterHub calls callable
# environment values with the spawner), else JUPYTERHUB_PUBLIC_HUB_URL (a Hub with
# c.JupyterHub.public_url). Give a fixed URL instead when it is reachable elsewhere:
# c.Spawner.environment = {"GPUAAS_URL": "http://127.0.0.1:8765/services/gpuaas/"}
from jupyter_gpuaas.hub.gateway_url import gateway_url_for  # noqa: E402

_environment = c.Spawner.environment  # noqa: F821  (a dict, or a lazy value when unset)
if isinstance(_environment, dict):
    _environment.setdefault("GPUAAS_URL", gateway_url_for)
else:
    _environment.update({"GPUAAS_URL": gateway_url_for})
