"""Fixtures of the GPU kernel tests: a real gateway subprocess with simulated devices, and a
jupyter_server (pytest-jupyter) with the `jupyter_gpuaas` extension enabled explicitly
(the editable install may not have installed the jupyter-config file).

The gateway is a subprocess started like an administrator would (`jupyter-gpuaas gateway`),
with a short lease TTL; a test marked `@pytest.mark.gateway_policy(idle_timeout=3, ...)`
gets that quota-file policy. The server is torn down (its extension stopped, its kernels
shut down) before the gateway, so releases reach a live gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gwutil import launch_gateway

# pytest-jupyter's fixtures (jp_serverapp, jp_fetch, ...) and hooks, for this directory only:
# enabling the plugin for the whole suite would hand every coroutine test to its loop.
from pytest_jupyter.jupyter_server import *  # noqa: F403
from srvutil import (
    ADMIN_TOKEN,
    TOKEN,
    GatewayProc,
    gateway_command,
    gpu_extension,
    server_app_config,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gateway_policy(**policy): the `policy` block of the test gateway's quotas"
    )


@pytest.fixture
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProc]:
    marker = request.node.get_closest_marker("gateway_policy")
    policy: dict[str, Any] = {"idle_timeout": 0, "reservation_ttl": 60, "cull_warning": 0}
    if marker is not None:
        policy.update(marker.kwargs)
    gdir = tmp_path / "gateway"
    gdir.mkdir()
    gw = launch_gateway(
        gdir,
        None,
        "--lease-ttl=5",
        quotas={
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
            "tenants": {"vision": {"quota": {"a100": 1}}},
            "policy": policy,
        },
        tokens={
            "tokens": {
                TOKEN: {"user": "alice", "groups": ["vision"], "admin": False},
                ADMIN_TOKEN: {"user": "root", "groups": [], "admin": True},
            }
        },
        devices="simulated:a100=1x1",
        command=gateway_command(),
        log=gdir / "gateway.log",
        kind=GatewayProc,
    )
    yield gw
    gw.stop()


@pytest.fixture
def gpu_kernelspecs(jp_environ: Any, jp_data_dir: Path) -> dict[str, str]:
    """GPU kernelspecs in the test's Jupyter data dir, written by our own installer."""
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    kernels = Path(jp_data_dir) / "kernels"
    write_spec(kernels / "gpu1", gpus=1, flavor="a100", display_name="Python 3 (1 GPU)")
    write_spec(kernels / "gpu2", gpus=2, flavor="a100", display_name="Python 3 (2 GPUs)")
    return {"one": "gpu1", "never": "gpu2"}


@pytest.fixture
def jp_server_config(gateway: GatewayProc, gpu_kernelspecs: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": server_app_config(),
        "GpuaasExtension": {
            "gateway_url": gateway.url,
            "gateway_token": TOKEN,
            "heartbeat_interval": 0.5,
            "reconnect_delay": 0.2,
        },
        "GpuaasProvisioner": {"poll_interval": 0.5},
    }


@pytest.fixture
def gpu_app(jp_serverapp: Any, jp_asyncio_loop: Any, gateway: GatewayProc) -> Iterator[Any]:
    """The server with the extension started (pytest-jupyter does not run the start hooks);
    stopped again, kernels and all, while the gateway still runs.

    Every step of the teardown runs even when one before it fails: a server app left with
    open kernels and sockets would be freed by a later garbage collection only (it is a
    reference cycle), in the middle of another test. GpuaasKernelManager never terminates
    its zmq context from a finalizer (kernel_manager.py), so that no longer hangs, but
    its kernels would still run on.
    """
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    yield jp_serverapp
    try:
        jp_asyncio_loop.run_until_complete(gpu_extension(jp_serverapp).stop_extension())
    finally:
        # Shuts down every kernel and closes the zmq context (GpuaasKernelManager).
        jp_asyncio_loop.run_until_complete(jp_serverapp.kernel_manager.shutdown_all(now=True))
