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
# The extension finds the gateway at <hub origin>/services/gpuaas/ by default; set
# GPUAAS_URL in the server's environment when it is reachable elsewhere:
# c.Spawner.environment = {"GPUAAS_URL": "http://127.0.0.1:8765/services/gpuaas/"}
