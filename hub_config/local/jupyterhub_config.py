# The embedded default: JupyterHub on one machine with the gpuaas gateway as a managed
# service. `jupyter-gpuaas demo` (what `make demo` runs) starts it with
# `jupyterhub -f hub_config/local/jupyterhub_config.py`, passing the settings below as
# environment variables; the tests load this same file and override a few knobs.
#
#   GPUAAS_DEMO_IP, GPUAAS_DEMO_PORT           public address (127.0.0.1:8000)
#   GPUAAS_DEMO_HUB_PORT, GPUAAS_DEMO_PROXY_API_PORT, GPUAAS_DEMO_GATEWAY_PORT
#                                              internal ports (the demo picks free ones;
#                                              8081, 8001, 8765 without it)
#   GPUAAS_DEMO_PROXY                          configurable-http-proxy (node_modules/, PATH)
#   GPUAAS_DEMO_CONTROL_TOKEN                  the demo's own token: stops the servers first
#   GPUAAS_DEMO_PASSWORD                       the users' shared password (>= 8 chars)
#   GPUAAS_DEMO_ADMIN_PASSWORD                 admin's password (>= 32 chars)
#   GPUAAS_DEMO_DEVICES                        gateway --devices (simulated:a100=1x4)
#   GPUAAS_DEMO_QUOTAS                         quota file (quotas.yaml next to this file)
#   GPUAAS_DEMO_STATE_DIR                      databases, cookie secret (.gpuaas-demo)
#   GPUAAS_HUB_TOKEN                           the gateway service's API token (generated)
#
# Users alice and bob are in the group (= tenant) `vision`, carol in `nlp`; `admin` is the
# Hub's admin. All log in with SharedPasswordAuthenticator.
import os
import secrets
import shutil
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)

here = Path(__file__).resolve().parent
repo = here.parent.parent
env = os.environ.get

ip = env("GPUAAS_DEMO_IP", "127.0.0.1")
port = int(env("GPUAAS_DEMO_PORT", "8000"))
hub_port = int(env("GPUAAS_DEMO_HUB_PORT", "8081"))
proxy_api_port = int(env("GPUAAS_DEMO_PROXY_API_PORT", "8001"))
gateway_port = int(env("GPUAAS_DEMO_GATEWAY_PORT", "8765"))
state = Path(env("GPUAAS_DEMO_STATE_DIR", ".gpuaas-demo")).resolve()
state.mkdir(parents=True, exist_ok=True)
quotas = env("GPUAAS_DEMO_QUOTAS", str(here / "quotas.yaml"))
devices = env("GPUAAS_DEMO_DEVICES", "simulated:a100=1x4")
# The gateway service's token: the Hub gives it to the service, and the spawners use it to
# watch the whole queue (one event stream for every pending spawn).
hub_token = env("GPUAAS_HUB_TOKEN") or secrets.token_hex(32)
gateway_url = f"http://127.0.0.1:{gateway_port}/services/gpuaas/"

# --- the Hub and its proxy ------------------------------------------------------------
c.JupyterHub.ip = ip
c.JupyterHub.port = port
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = hub_port
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
# configurable-http-proxy from npm, installed by `make` into node_modules/ (package.json).
chp = repo / "node_modules" / ".bin" / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = [
    env("GPUAAS_DEMO_PROXY") or (str(chp) if chp.exists() else "configurable-http-proxy")
]
# Queued GPU spawns are pending spawns: don't let the Hub's throttle refuse the queue.
c.JupyterHub.concurrent_spawn_limit = 0

# --- users, groups (= tenants) and logins -----------------------------------------------
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = env("GPUAAS_DEMO_PASSWORD", "gpuaas-demo")
c.SharedPasswordAuthenticator.admin_password = env("GPUAAS_DEMO_ADMIN_PASSWORD") or (
    secrets.token_urlsafe(32)  # nobody knows it: admin cannot log in without the demo
)
c.Authenticator.admin_users = {"admin"}
c.Authenticator.allowed_users = {"alice", "bob", "carol"}
c.JupyterHub.load_groups = {
    "vision": {"users": ["alice", "bob"]},
    "nlp": {"users": ["carol"]},
}

# --- the gateway service, its custom scopes and roles ---------------------------------
c.JupyterHub.custom_scopes = {
    "custom:gpuaas:use": {"description": "Queue and hold GPUs for your own requests."},
    "custom:gpuaas:view": {"description": "See the whole GPU queue."},
    "custom:gpuaas:admin": {"description": "Change GPU quotas and cancel any GPU request."},
}
c.JupyterHub.services = [
    {
        "name": "gpuaas",
        "display": True,
        "url": f"http://127.0.0.1:{gateway_port}",
        "api_token": hub_token,
        "command": [
            sys.executable,
            "-m",
            "jupyter_gpuaas.cli",
            "gateway",
            "--quotas",
            quotas,
            "--devices",
            devices,
            "--db-url",
            f"sqlite:///{state / 'gpuaas.sqlite'}",
            # Signs the landing page's login cookie; kept, so a restart logs nobody out.
            "--cookie-secret-file",
            str(state / "gpuaas_cookie_secret"),
        ],
        # The Hub's admin runs it: browsers go to its landing page without the Hub's
        # "Authorize access" prompt.
        "oauth_no_confirm": True,
        # The custom scopes a user's browser session carries to the service (OAuth).
        "oauth_client_allowed_scopes": [
            "custom:gpuaas:use",
            "custom:gpuaas:view",
            "custom:gpuaas:admin",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "gpuaas-users",
        "description": "Use the GPU gateway: queue and hold GPUs of your tenants.",
        "scopes": ["custom:gpuaas:use", "access:services!service=gpuaas"],
        "groups": ["vision", "nlp"],
    },
    {
        "name": "gpuaas-admins",
        "description": "Administer the GPU gateway.",
        "scopes": [
            "custom:gpuaas:admin",
            "custom:gpuaas:view",
            "custom:gpuaas:use",
            "access:services!service=gpuaas",
        ],
        "users": ["admin"],
    },
    {
        # The service's own token (also the spawners' queue watcher): see the whole queue,
        # know who is calling (HubAuth), stop servers it culls.
        "name": "gpuaas-service",
        "scopes": [
            "custom:gpuaas:view",
            "access:services!service=gpuaas",
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

# --- the spawner that queues -----------------------------------------------------------
c.JupyterHub.spawner_class = "jupyter_gpuaas.hub.QueuedSimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = str(state / "home" / "{username}")
c.QueuedSpawnerMixin.gateway_url = gateway_url
c.QueuedSpawnerMixin.gateway_token = hub_token
c.QueuedSpawnerMixin.default_gpus = 1
c.QueuedSpawnerMixin.max_gpus = 4
c.QueuedSpawnerMixin.flavors = {"a100": {"display_name": "NVIDIA A100"}}
c.Spawner.default_url = "/lab"  # JupyterLab is a dependency of the package
venv_bin = Path(sys.executable).parent
c.Spawner.cmd = [str(venv_bin / "jupyterhub-singleuser")]
# Terminals run a plain interactive bash: jupyter_server's default login shell sources
# /etc/profile, which (on Debian) resets PATH and loses the environment's bin directory.
c.Spawner.args = [f"--ServerApp.terminado_settings=shell_command={shutil.which('bash') or 'sh'}"]
# GPU kernels wait as pending kernels and are refused in words through this kernel manager
# (the packaged jupyter-config file sets it too; said here so that an environment whose
# config predates it still gets it).
c.Spawner.args.append("--ServerApp.kernel_manager_class=jupyter_gpuaas.server.GpuaasKernelManager")
if os.geteuid() == 0:  # a container or a throwaway VM: jupyter_server refuses root otherwise
    c.Spawner.args.append("--allow-root")
# Single-user servers find the gateway (kernels, magics, the sidebar) and may use it as
# their user: the server token carries the gpuaas scopes on top of the default ones.
# The environment's bin directory comes first on PATH, so `jupyter-gpuaas` works in the
# server's terminals and kernels.
c.Spawner.environment = {
    "GPUAAS_URL": gateway_url,
    "PATH": os.pathsep.join([str(venv_bin), env("PATH", os.defpath)]),
}
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    "custom:gpuaas:use",
    "access:services!service=gpuaas",
]

# --- the demo's control token ------------------------------------------------------------
# `jupyter-gpuaas demo` stops every user server through the API before the Hub itself,
# whose cleanup stops managed services (the gateway) before servers: a server stopped
# after the gateway could not hand its GPUs back.
if env("GPUAAS_DEMO_CONTROL_TOKEN"):
    c.JupyterHub.services.append(
        {"name": "gpuaas-demo", "api_token": env("GPUAAS_DEMO_CONTROL_TOKEN")}
    )
    c.JupyterHub.load_roles.append(
        {
            "name": "gpuaas-demo",
            "description": "The demo command: stops the user servers before the Hub.",
            "scopes": ["list:users", "read:users", "admin:servers"],
            "services": ["gpuaas-demo"],
        }
    )
