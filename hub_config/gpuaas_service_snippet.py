# jupyterhub_config.py snippet: run the jupyter-gpuaas gateway as the Hub-managed service
# `gpuaas`, with its custom scopes and roles. Paste (or `load_subconfig`) into your config.
#
# Who may do what (INTERFACES.md):
#   custom:gpuaas:use    submit, see and cancel one's own requests, charge one's own groups
#   custom:gpuaas:view   see the whole queue
#   custom:gpuaas:admin  change quotas, cancel any request
# Tenants are the quota file's tenants; a user may charge a tenant that is a JupyterHub
# group they belong to (`custom:gpuaas:use!group=vision` narrows that to one group).
#
# The gateway's port, quota file, state directory and devices default to a production
# layout; GPUAAS_SERVICE_PORT, GPUAAS_QUOTAS, GPUAAS_STATE_DIR and GPUAAS_DEVICES in the
# Hub's environment change them (tests/hub/test_hub_snippet.py runs this very file).
# The spawner (QueuedSpawnerMixin) watches the queue with the service's token: set
# GPUAAS_HUB_TOKEN in the Hub's environment (e.g. `openssl rand -hex 32`).
import os
import sys

c = get_config()  # noqa: F821  (defined by JupyterHub when it loads this file)

GPUAAS_PORT = int(os.environ.get("GPUAAS_SERVICE_PORT", "8765"))
QUOTAS = os.environ.get("GPUAAS_QUOTAS", "/etc/jupyter-gpuaas/quotas.yaml")
STATE = os.environ.get("GPUAAS_STATE_DIR", "/var/lib/jupyter-gpuaas")
DEVICES = os.environ.get("GPUAAS_DEVICES", "nvml")
HUB_TOKEN = os.environ.get("GPUAAS_HUB_TOKEN", "")

# .append/.extend work whether or not the rest of the config already set these lists.
gpuaas_service = dict(
    {
        "name": "gpuaas",
        "url": f"http://127.0.0.1:{GPUAAS_PORT}",
        "command": [
            sys.executable,
            "-m",
            "jupyter_gpuaas.cli",
            "gateway",
            f"--quotas={QUOTAS}",
            f"--db-url=sqlite:///{STATE}/gpuaas.sqlite",
            f"--devices={DEVICES}",
            # Signs the landing page's login cookie; a file kept across restarts, so a
            # restart logs nobody out (created, mode 0600, when missing).
            f"--cookie-secret-file={STATE}/cookie_secret",
        ],
        # Tokens the Hub issues for this service (browser OAuth) carry these scopes, so the
        # user model the gateway gets back lists them: without this, custom scopes never
        # reach the service (the Hub filters a token's scopes to what the client may ask).
        "oauth_client_allowed_scopes": [
            "custom:gpuaas:use",
            "custom:gpuaas:view",
            "custom:gpuaas:admin",
        ],
        "display": True,
        # The admin runs it: browsers reach its landing page without an "Authorize" prompt.
        "oauth_no_confirm": True,
        # The service's token, which the spawner also uses to watch the queue.
        **({"api_token": HUB_TOKEN} if HUB_TOKEN else {}),
    }
)
if os.environ.get("GPUAAS_GATEWAY_EXTERNAL"):
    # The gateway runs apart from the Hub (systemd, a container), so a Hub restart or
    # outage does not stop it; the Hub only routes to it. Start it yourself with the
    # command above and the environment a managed service gets (docs/how-to/existing-hub.md).
    del gpuaas_service["command"]
    gpuaas_service["oauth_redirect_uri"] = "/services/gpuaas/oauth_callback"
c.JupyterHub.services.append(gpuaas_service)
c.QueuedSpawnerMixin.gateway_url = f"http://127.0.0.1:{GPUAAS_PORT}/services/gpuaas/"
if HUB_TOKEN:
    c.QueuedSpawnerMixin.gateway_token = HUB_TOKEN

c.JupyterHub.custom_scopes = {
    "custom:gpuaas:use": {
        "description": "Queue GPU servers, kernels and jobs; see and cancel your own requests.",
    },
    "custom:gpuaas:view": {
        "description": "See every request in the GPU queue.",
        "subscopes": [],
    },
    "custom:gpuaas:admin": {
        "description": "Change GPU quotas and cancel any GPU request.",
        "subscopes": ["custom:gpuaas:view", "custom:gpuaas:use"],
    },
}

c.JupyterHub.load_roles.extend(
    [
        {
            # Every user: reach the service, use GPUs. (Redefining `user` replaces the default
            # role, so keep its default scopes: self.)
            "name": "user",
            "scopes": ["self", "access:services!service=gpuaas", "custom:gpuaas:use"],
        },
        {
            # Single-user servers act for their user (kernel provisioner, server extension):
            # their JUPYTERHUB_API_TOKEN must carry the gpuaas scopes too.
            "name": "server",
            "scopes": [
                "users:activity!user",  # JupyterHub's default server role...
                "access:servers!server",
                "access:services!service=gpuaas",
                "custom:gpuaas:use",
            ],
        },
        {
            "name": "gpuaas-admin",
            "description": "GPU queue administrators",
            "scopes": [
                "access:services!service=gpuaas",
                "custom:gpuaas:view",
                "custom:gpuaas:admin",
            ],
            "users": [],  # e.g. ["alice"]
            "groups": [],  # e.g. ["gpu-admins"]
        },
        {
            # The gateway itself (and the spawner's queue watcher, with the same token): see
            # the whole queue, know who calls (HubAuth checks access to the service), resolve
            # users and groups, and stop servers whose grant ended.
            "name": "gpuaas-service",
            "scopes": [
                "custom:gpuaas:view",
                "access:services!service=gpuaas",
                "list:users",
                "read:users",
                "read:groups",
                # The expiry of a token it identified: how long it may trust it while the
                # Hub is down (gateway/hubauth.py).
                "read:tokens",
                "admin:servers",
            ],
            "services": ["gpuaas"],
        },
    ]
)
