"""`/gpuaas/jobs` routes of the server extension: what the magics, the shell and the sidebar
call to run batch jobs.

- `POST /gpuaas/jobs`: submit → 201 and the job. A notebook `{kind: notebook, path,
  parameters?}`, a cell `{kind: cell, code, cwd, python?}` or a script `{kind: script,
  path, python?}`, each with `gpus` and optional `tenant`, `flavor`, `priority`, `name`;
- `GET /gpuaas/jobs`: this server's jobs, newest first;
- `GET /gpuaas/jobs/{id}`: one job;
- `DELETE /gpuaas/jobs/{id}`: cancel: dequeue, or kill the process tree and release;
- `GET /gpuaas/jobs/{id}/logs`: the log as text; `?offset=N` from byte N, `?tail=N` the
  last N bytes, `?follow=1` streams it until the job ends.

Errors are JSON `{"error", "field"}` like the gateway's, with the gateway's own status when
it refused (403 not your tenant, 422 never admissible).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from .manager import JobError, JobManager

AUTH_RESOURCE = "gpuaas"
#: Bytes sent per write while following a log.
CHUNK = 64 * 1024
#: The largest `offset` or `tail` taken: 2^53 bytes, far past any log, and a seek the OS takes.
OFFSET_MAX = 2**53
_DIGITS = re.compile(r"[0-9]{1,16}")


class JobsBase(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> JobManager:
        manager: JobManager = self.settings["gpuaas_jobs"]
        return manager

    def send_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def send_error_json(self, e: JobError) -> None:
        self.send_json({"error": e.error, "field": e.field}, e.status)


class JobsHandler(JobsBase):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.send_json([job.to_json() for job in self.manager.list()])

    @web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            spec = json.loads(self.request.body or b"{}")
        except ValueError:
            self.send_error_json(JobError(400, "the body is not JSON"))
            return
        if not isinstance(spec, dict):
            self.send_error_json(JobError(400, "the body must be a JSON object"))
            return
        try:
            job = await self.manager.submit(spec)
        except JobError as e:
            self.send_error_json(e)
            return
        self.send_json(job.to_json(), 201)


class JobHandler(JobsBase):
    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        try:
            self.send_json(self.manager.get(job_id).to_json())
        except JobError as e:
            self.send_error_json(e)

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        try:
            job = await self.manager.cancel(job_id)
        except JobError as e:
            self.send_error_json(e)
            return
        self.send_json(job.to_json())


class LogsHandler(JobsBase):
    _closed = False

    def on_connection_close(self) -> None:
        self._closed = True

    def _int_arg(self, name: str) -> int | None:
        """A byte count of the query: ASCII digits (str.isdigit() also says yes to '²',
        which int() refuses) and at most OFFSET_MAX (a file offset the OS can seek to)."""
        text = self.get_argument(name, None)
        if text is None:
            return None
        if not _DIGITS.fullmatch(text) or int(text) > OFFSET_MAX:
            raise JobError(400, f"must be a whole number of bytes from 0 to {OFFSET_MAX:,}", name)
        return int(text)

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        try:
            job = self.manager.get(job_id)
            offset = self._int_arg("offset") or 0
            tail = self._int_arg("tail")
        except JobError as e:
            self.send_error_json(e)
            return
        follow = self.get_argument("follow", "0") not in ("0", "", "false")
        path = job.log_path
        size = os.path.getsize(path) if path.exists() else 0
        if tail is not None:
            offset = max(0, size - tail)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Log-Size", str(size))
        if not follow:
            self.finish(_read(path, offset, size))
            return
        self.set_header("X-Accel-Buffering", "no")
        interval = min(0.5, self.manager.poll_interval)
        try:
            while not self._closed:
                ended = not self.manager.get(job_id).live
                chunk = _read(path, offset, offset + CHUNK)
                if chunk:
                    offset += len(chunk)
                    self.write(chunk)
                    await self.flush()
                    continue
                if ended:  # read to the end after the job ended: nothing more will come
                    break
                await asyncio.sleep(interval)
        except StreamClosedError:
            return
        if not self._closed:
            self.finish()


def _read(path: Any, start: int, end: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))
    except OSError:
        return b""


def routes() -> list[tuple[str, type[web.RequestHandler]]]:
    job = r"(?P<job_id>[A-Za-z0-9_.-]+)"
    return [
        (r"/gpuaas/jobs", JobsHandler),
        (rf"/gpuaas/jobs/{job}", JobHandler),
        (rf"/gpuaas/jobs/{job}/logs", LogsHandler),
    ]
