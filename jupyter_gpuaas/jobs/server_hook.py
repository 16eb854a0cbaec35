"""How the `jupyter_gpuaas` server extension hosts batch jobs, in three calls, so the
extension's own code changes by a line each:

- `setup(ext)` in `initialize_settings`: the JobManager (configured as `JobManager.*`,
  sharing the extension's gateway client) and the `/gpuaas/jobs` routes;
- `start(ext)` with the extension's loops: export where kernels find this server, end
  the orphans of an earlier run, start the job loops;
- `stop(ext)` with them: end live jobs and release their GPUs.

Kernels inherit the server's environment, so exporting `GPUAAS_SERVER_URL` and
`GPUAAS_SERVER_TOKEN` into it is how `%gpu` in any kernel of this server finds its way
back here (see server_client.py).
"""

from __future__ import annotations

import os
from typing import Any

from .manager import JobManager

SETTINGS_KEY = "gpuaas_jobs"


def setup(ext: Any) -> JobManager:
    manager = JobManager(
        ext.client,
        ext.serverapp.root_dir,
        kernel_specs=getattr(ext.serverapp, "kernel_spec_manager", None),
        parent=ext,
    )
    ext.settings[SETTINGS_KEY] = manager
    manager.load()  # before the server answers: no orphan is ever seen "running"
    return manager


def handlers() -> list[tuple[str, Any]]:
    from .handlers import routes

    return routes()


def export_environment(serverapp: Any) -> None:
    """Tell this server's future kernels and terminals where it is."""
    url = getattr(serverapp, "connection_url", "") or ""
    if url.startswith("http"):
        os.environ["GPUAAS_SERVER_URL"] = url
    token = getattr(getattr(serverapp, "identity_provider", None), "token", "") or ""
    if token:
        os.environ["GPUAAS_SERVER_TOKEN"] = token


async def start(ext: Any) -> None:
    export_environment(ext.serverapp)
    manager: JobManager = ext.settings[SETTINGS_KEY]
    await manager.start()


async def stop(ext: Any) -> None:
    manager: JobManager | None = ext.settings.get(SETTINGS_KEY)
    if manager is not None:
        await manager.stop()
