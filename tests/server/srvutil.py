"""Helpers of the GPU kernel tests (a module of its own: every test directory has a
`conftest`, so tests cannot import theirs by that name)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gwutil import GatewayProcess
from helpers import free_port as free_port  # the tests import it from here too

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


class GatewayProc(GatewayProcess):
    """A gateway process of these tests (tests/gwutil.py's launcher); `call` as root."""

    admin_token = ADMIN_TOKEN


def gateway_command() -> list[str]:
    from jupyter_gpuaas.cli import SUBCOMMAND_MODULES

    exe = ROOT / ".venv" / "bin" / "jupyter-gpuaas"
    if "jupyter_gpuaas.gateway.cli" in SUBCOMMAND_MODULES and exe.exists():
        return [str(exe), "gateway"]
    # Until the gateway registers its subcommand: the same entry point, as a module.
    return [sys.executable, "-m", "jupyter_gpuaas.gateway.app"]


def gpu_extension(app: Any) -> Any:
    return app.web_app.settings["gpuaas"]


def on_a_fake_gpu(ext: Any, record: Any) -> tuple[int, Any]:
    """(pid, FakeGpu): the process of the kernel of `record` on an A100 that a fake NVML
    (tests/nvmlfake.py: per-process utilization on cue, which no GPU-less host has) shows
    to the extension's GPU-activity reader; the simulated gateway's grant names no UUID,
    so the kernel's grant is given that device's, as a real one is."""
    from nvmlfake import FakeGpu, FakeNvml, GiB

    from jupyter_gpuaas.devices import NvmlInventory

    pid = int(record.provisioner.pid)
    uuid = "GPU-a1000000-0000-0000-0000-00000000beef"
    gpu = FakeGpu("NVIDIA A100-SXM4-80GB", uuid, 80 * GiB, pids=[pid])
    ext.gpu_usage._tried, ext.gpu_usage._inventory = True, NvmlInventory(nvml=FakeNvml([gpu]))
    record.grant = {**(record.grant or {}), "uuids": [uuid]}
    return pid, gpu
