"""Helpers of the batch job tests (fixtures in conftest.py): everything real, as a user
would run it.

- a gateway subprocess (`jupyter-gpuaas gateway` through tests/gwutil.py, one simulated
  a100: one job at a time);
- a `jupyter server` subprocess with the `jupyter_gpuaas` extension and short intervals,
  whose root is a temp directory of notebooks;
- an in-process IPython shell with `%load_ext jupyter_gpuaas`, pointed at that server
  through GPUAAS_SERVER_URL / GPUAAS_SERVER_TOKEN (what the extension exports to kernels).

The gateway and server are shared by a module's tests (starting them costs seconds); each
test waits for its own jobs to end, so the one GPU is free again for the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gwutil import CONSOLE, GatewayProcess, launch_gateway
from helpers import free_port, stop, wait_http

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TOKEN = "alice-jobs-token-0001"
ADMIN = "root-jobs-token-00002"
SERVER_TOKEN = "server-token-jobs-0003"


def clean_env() -> dict[str, str]:
    drop = ("JUPYTERHUB_", "GPUAAS_", "JUPYTER_", "JPY_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def http(method: str, url: str, token: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        stop(self.proc, 20)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _wait_up(p: Proc, probe: str, token: str = "") -> None:
    wait_http(p.url + probe, p.proc, p.log, 60, headers={"Authorization": f"token {token}"})


class Gateway(GatewayProcess):
    """The jobs' gateway (tests/gwutil.py's launcher); `call` as root."""

    admin_token = ADMIN

    def stop(self, timeout: float = 20) -> None:
        super().stop(timeout)

    def free_gpus(self) -> int:
        return sum(int(n["free"]) for n in self.call("GET", "api/devices")["nodes"])


def start_gateway(gdir: Path) -> Gateway:
    """`jupyter-gpuaas gateway` with one simulated a100; tenants vision (alice) and nlp."""
    gw = launch_gateway(
        gdir,
        None,
        "--lease-ttl=20",
        quotas={
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
            "tenants": {
                "vision": {
                    "quota": {"a100": 1},
                    "preemption": {"within_tenant": "LowerPriority"},
                },
                "nlp": {"quota": {"a100": 1}},
            },
        },
        tokens={
            "tokens": {
                TOKEN: {"user": "alice", "groups": ["vision"]},
                ADMIN: {"user": "root", "groups": [], "admin": True},
            }
        },
        devices="simulated:a100=1x1",
        command=CONSOLE,
        env={**clean_env(), "PYTHONUNBUFFERED": "1"},
        log=gdir / "gateway.log",
        timeout=60,
        kind=Gateway,
    )
    assert isinstance(gw, Gateway)
    return gw


@dataclass
class Server(Proc):
    root: Path = field(default=Path("."))
    state_dir: Path = field(default=Path("."))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return http(method, self.url + path, SERVER_TOKEN, body)

    def env(self) -> dict[str, str]:
        return {"GPUAAS_SERVER_URL": self.url, "GPUAAS_SERVER_TOKEN": SERVER_TOKEN}


def start_server(gateway: Gateway, home: Path) -> Server:
    """`jupyter server` with the extension, rooted at home/notebooks, configured by a
    config file in its own JUPYTER_CONFIG_DIR (isolated from the user's)."""
    root, cfg = home / "notebooks", home / "config"
    for d in (root, cfg, home / "data", home / "runtime"):
        d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    state_dir = home / "data" / "gpuaas" / "jobs"
    (cfg / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {
                    "jpserver_extensions": {"jupyter_gpuaas": True},
                    "ip": "127.0.0.1",
                    "port": port,
                    "port_retries": 0,
                    "open_browser": False,
                    "allow_root": True,  # CI containers run as root
                    "root_dir": str(root),
                },
                "IdentityProvider": {"token": SERVER_TOKEN},
                "GpuaasExtension": {
                    "gateway_url": gateway.url,
                    "gateway_token": TOKEN,
                    "heartbeat_interval": 1.0,
                    "reconnect_delay": 0.2,
                },
                "JobManager": {
                    "poll_interval": 0.2,
                    "reconcile_interval": 1.0,
                    "reconnect_delay": 0.2,
                    "kill_grace": 2.0,
                    "state_dir": str(state_dir),
                },
            }
        )
    )
    env = {
        **clean_env(),
        "PYTHONUNBUFFERED": "1",
        "JUPYTER_CONFIG_DIR": str(cfg),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    log = home / f"server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "jupyter-server")], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root
        )
    server = Server(proc, f"http://127.0.0.1:{port}/", log, root, state_dir)
    _wait_up(server, "gpuaas/jobs", SERVER_TOKEN)
    return server


def notebook(path: Path, *cells: str, parameters: str | None = None) -> Path:
    """A notebook on the venv's python3 kernel; `parameters` is its tagged cell."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    if parameters is not None:
        cell = nbformat.v4.new_code_cell(parameters)
        cell.metadata["tags"] = ["parameters"]
        nb.cells.append(cell)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)
    return path
