"""Single-user side of jupyter-gpuaas: the jupyter_server extension, the `gpuaas` kernel
provisioner, activity reporting, culling and the `/gpuaas/` routes.

The extension is enabled by this module's name, `jupyter_gpuaas.server` (the packaged
jupyter-config file); the package face's `jupyter_gpuaas` (INTERFACES.md) leads here too.
The same file sets `ServerApp.kernel_manager_class` to this module's
`GpuaasKernelManager` (kernel_manager.py).

Only the CLI-facing `kernelspec_cli` may be imported without jupyter_server's weight; the
rest is imported on demand by jupyter_server and jupyter_client.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`jupyter_gpuaas.server.GpuaasKernelManager`, the server's kernel manager class
    (`ServerApp.kernel_manager_class`), imported only when asked for."""
    if name == "GpuaasKernelManager":
        from .kernel_manager import GpuaasKernelManager

        return GpuaasKernelManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .extension import GpuaasExtension

    return [{"module": "jupyter_gpuaas.server.extension", "app": GpuaasExtension}]
