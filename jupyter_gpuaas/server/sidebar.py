"""Routes of the JupyterLab sidebar (`labextension/`) under `/gpuaas/sidebar/`.

Everything else the sidebar reads goes through the gateway proxy (`/gpuaas/api/*`), the
kernel table (`/gpuaas/kernels`), the jobs routes (`/gpuaas/jobs`) and jupyter_server's own
sessions and kernels APIs. What needs this server's own knowledge lives here:

- `POST /gpuaas/sidebar/keep/{request_id}`: "keep my GPU" on a cull warning. The kernel
  is reported busy once (a heartbeat with `busy: true`), which clears the gateway's idle
  clock; the next regular heartbeat reports it idle again, so the clock starts from now.
  Once per warning: a second Keep for the same warning is refused (409), so an idle
  kernel cannot be kept forever from a button.
- `GET|POST /gpuaas/sidebar/jobs`, `GET /gpuaas/sidebar/jobs/{id}`: the `/gpuaas/jobs`
  records with their paths relative to the server's root (what JupyterLab opens), so the
  panel can link the source and the executed notebook.

None of these talks to a kernel: the panel never counts as kernel activity.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_gpuaas.client import GatewayError
from jupyter_gpuaas.jobs.manager import JobError, JobManager
from jupyter_gpuaas.words import format_duration

from .handlers import AUTH_RESOURCE

#: Settings key of the warnings already answered by a Keep: request id -> warning time.
KEPT = "gpuaas_sidebar_kept"


class SidebarHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    def send_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def send_error_json(self, status: int, error: str, field: str | None = None) -> None:
        self.send_json({"error": error, "field": field}, status)


class KeepHandler(SidebarHandler):
    @web.authenticated
    @authorized
    async def post(self, request_id: str) -> None:
        ext = self.settings.get("gpuaas")
        if ext is None or ext.client is None:
            self.send_error_json(502, "no gpuaas gateway configured (GPUAAS_URL)")
            return
        record = ext.table.by_request(request_id)
        if record is None:
            self.send_error_json(
                404, f"no GPU kernel of this server holds request {request_id}", "request_id"
            )
            return
        if not record.holds_devices:
            self.send_error_json(409, "this GPU kernel holds no GPU to keep", "request_id")
            return
        warning = record.warning
        if warning is None:
            self.send_error_json(
                409, "there is no cull warning to answer: the kernel is not idle", "request_id"
            )
            return
        kept: dict[str, Any] = self.settings.setdefault(KEPT, {})
        if kept.get(request_id) == warning.get("t"):
            self.send_error_json(
                409,
                "this warning was already answered once; run something in the kernel to "
                "keep it longer",
                "request_id",
            )
            return
        # Taken before the call: two clicks at once still keep only once.
        kept[request_id] = warning.get("t")
        try:
            await ext.client.heartbeat(request_id, True, record.utilization)
        except (GatewayError, OSError) as e:
            kept.pop(request_id, None)
            if isinstance(e, GatewayError) and 400 <= e.status < 500:
                self.send_error_json(e.status, e.error, e.field)
            else:
                self.send_error_json(502, f"cannot reach the gpuaas gateway: {e}")
            return
        # The server's own view follows: not idle since now, no warning pending.
        record.idle_since = None
        record.warning = None
        record.poke()
        timeout = (ext._idle_timeouts or {}).get(record.tenant or "")
        again = f" after {format_duration(timeout)} idle" if timeout else " if it stays idle"
        self.send_json(
            {
                "kept": True,
                "request_id": request_id,
                "t": time.time(),
                "message": f"Kept: its idle clock started again; it will be warned again{again}.",
            }
        )


class JobsBase(SidebarHandler):
    @property
    def manager(self) -> JobManager | None:
        manager: JobManager | None = self.settings.get("gpuaas_jobs")
        return manager

    def relative(self, path: str | None) -> str | None:
        """A path as JupyterLab opens it (relative to the root, "/"-separated), or None."""
        if not path:
            return None
        manager = self.manager
        base = manager.root_dir if manager else self.settings.get("server_root_dir")
        root = os.path.realpath(base or os.getcwd())
        full = os.path.realpath(path)
        if full != root and not full.startswith(root + os.sep):
            return None
        return os.path.relpath(full, root).replace(os.sep, "/")

    def job_json(self, job: Any) -> dict[str, Any]:
        out: dict[str, Any] = job.to_json()
        out["source_path"] = self.relative(job.source)
        nb = job.output_notebook
        out["output_path"] = self.relative(str(nb)) if nb is not None else None
        out["log_path"] = self.relative(str(job.log_path))
        return out


class JobsHandler(JobsBase):
    @web.authenticated
    @authorized
    def get(self) -> None:
        manager = self.manager
        self.send_json([self.job_json(j) for j in manager.list()] if manager else [])

    @web.authenticated
    @authorized
    async def post(self) -> None:
        manager = self.manager
        if manager is None:
            self.send_error_json(502, "batch jobs are not set up on this server")
            return
        try:
            spec = json.loads(self.request.body or b"{}")
        except ValueError:
            self.send_error_json(400, "the body is not JSON")
            return
        if not isinstance(spec, dict):
            self.send_error_json(400, "the body must be a JSON object")
            return
        try:
            job = await manager.submit(spec)
        except JobError as e:
            self.send_error_json(e.status, e.error, e.field)
            return
        self.send_json(self.job_json(job), 201)


class JobHandler(JobsBase):
    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        manager = self.manager
        if manager is None:
            self.send_error_json(404, f"no job {job_id}", "job_id")
            return
        try:
            self.send_json(self.job_json(manager.get(job_id)))
        except JobError as e:
            self.send_error_json(e.status, e.error, e.field)


def routes() -> list[tuple[str, type[web.RequestHandler]]]:
    rid = r"(?P<request_id>[A-Za-z0-9_.-]+)"
    job = r"(?P<job_id>[A-Za-z0-9_.-]+)"
    return [
        (rf"/gpuaas/sidebar/keep/{rid}", KeepHandler),
        (r"/gpuaas/sidebar/jobs", JobsHandler),
        (rf"/gpuaas/sidebar/jobs/{job}", JobHandler),
    ]
