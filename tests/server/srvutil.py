"""Helpers of the GPU kernel tests (a module of its own: every test directory has a
`conftest`, so tests cannot import theirs by that name)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import free_port as free_port  # the tests import it from here too
from helpers import stop

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "alice-token-0123456789"


def server_app_config() -> dict[str, Any]:
    """The ServerApp config of a test server: the extension and its kernel manager class,
    as the packaged jupyter-config file sets them (a fresh dict: pytest-jupyter adds to it)."""
    return {
        "jpserver_extensions": {"jupyter_gpuaas.server": True},
        "kernel_manager_class": "jupyter_gpuaas.server.GpuaasKernelManager",
    }


ADMIN_TOKEN = "admin-token-0123456789"


@dataclass
class GatewayProc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def call(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def request(self, rid: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"api/requests/{rid}")
        return result

    def stop(self) -> None:
        stop(self.proc, 10)


def gateway_command() -> list[str]:
    from jupyter_gpuaas.cli import SUBCOMMAND_MODULES

    exe = ROOT / ".venv" / "bin" / "jupyter-gpuaas"
    if "jupyter_gpuaas.gateway.cli" in SUBCOMMAND_MODULES and exe.exists():
        return [str(exe), "gateway"]
    # Until the gateway registers its subcommand: the same entry point, as a module.
    return [sys.executable, "-m", "jupyter_gpuaas.gateway.app"]


def gpu_extension(app: Any) -> Any:
    return app.web_app.settings["gpuaas"]
