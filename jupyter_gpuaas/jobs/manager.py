"""The server side of batch jobs: submit a `job` request, start the job once the gateway
admits it, keep its lease alive while it runs, and give the GPUs back when it ends.

It lives in the user's Jupyter server (the `jupyter_gpuaas` extension), not in a kernel:
a job outlives the notebook that submitted it, and one place owns every job's grant.

What moves a job:

- the gateway's events (admit, preempt, requeue, cancel, expire) through the process's
  one event stream (holder.py, shared with the extension), for promptness;
- a tick every `poll_interval`: processes that exited, and (every `reconcile_interval`)
  a GET of each queued job's request, in case an event was missed while the stream
  reconnected;
- a running job's lease, held by the process's grant holder (holder.py) and renewed as
  busy at the extension's `heartbeat_interval`; a renewal that finds the grant ended
  asks the gateway why;

Each job's request is a `Claim` (claim.py): submitted, held and released as every holder
of GPUs does; the runner is handed its typed `Grant`.
- the user: cancel.

Every change is written to the job's `job.json` before it is answered. A pointer file per
job under `state_dir` lets a restarted server find jobs whose outputs lie anywhere in the
tree; jobs it finds queued, starting or running were orphaned by the restart and end as
failed ("server restarted"), their processes killed and their requests released.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traitlets import Integer, List, Type, Unicode, default
from traitlets.config import Configurable, LoggingConfigurable

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.claim import Claim, ClaimError, Grant
from jupyter_gpuaas.client import GatewayClient, GatewayError
from jupyter_gpuaas.holder import Seconds, follow

from . import model, paths
from .errors import JobError as JobError  # re-exported: handlers and the sidebar import it here
from .model import Job
from .runner import JobRunner, LocalProcessRunner

#: Gateway request states that leave a job waiting for (re)admission.
_WAITING = (State.QUEUED.value, State.PREEMPTED.value)


class JobManager(LoggingConfigurable):
    """Runs batch jobs through the gateway's queue (see the module's docstring)."""

    poll_interval = Seconds(
        1.0,
        help="Seconds between checks of running jobs' processes (how fast an ended "
        "job gives its GPUs back).",
    ).tag(config=True)

    reconcile_interval = Seconds(
        10.0,
        help="Seconds between asking the gateway about each queued job, in case an admit "
        "event was missed while the event stream reconnected.",
    ).tag(config=True)

    reconnect_delay = Seconds(
        2.0, help="Seconds before reconnecting to the gateway's event stream after it drops."
    ).tag(config=True)

    kill_grace = Seconds(
        5.0,
        zero_ok=True,
        help="Seconds a cancelled or preempted job gets after SIGTERM before SIGKILL.",
    ).tag(config=True)

    state_dir = Unicode(
        help="Directory of this server's job index (one small pointer file per job, naming "
        "its gpu-jobs/<id>/ directory). Default: <jupyter data dir>/gpuaas/jobs."
    ).tag(config=True)

    @default("state_dir")
    def _state_dir_default(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpuaas", "jobs")

    default_tenant = Unicode(
        "",
        help="Tenant charged by jobs that name none. Empty: the user's only tenant, else "
        "the first the gateway lists for the user.",
    ).tag(config=True)

    notebook_kernel = Unicode(
        "",
        help="Kernel every notebook job runs on. Empty: the notebook's own kernel, except "
        "a GPU kernelspec (gpuaas provisioner), which would queue again: `fallback_kernel`.",
    ).tag(config=True)

    fallback_kernel = Unicode(
        "python3", help="Kernel of notebook jobs saved with a GPU kernelspec or with none."
    ).tag(config=True)

    history_size = Integer(
        200,
        help="Ended jobs this server remembers (lists); older pointers are dropped, their "
        "outputs stay on disk.",
    ).tag(config=True)

    interpreters = List(
        Unicode(),
        help="Absolute paths of Python interpreters a cell or script job may name (`python`) "
        "besides this server's own and each kernelspec's; any other is refused (403).",
    ).tag(config=True)

    runner_class = Type(
        LocalProcessRunner,
        klass=JobRunner,
        help="How admitted jobs run: a JobRunner subclass (local processes by default).",
    ).tag(config=True)

    # ------------------------------------------------------------------ life cycle

    def __init__(self, client: GatewayClient | None, root_dir: str, kernel_specs: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        """`kernel_specs`: the server's KernelSpecManager (its interpreters may run jobs)."""
        super().__init__(**kwargs)
        self.client = client
        self.root_dir = os.path.abspath(root_dir)
        self.kernel_specs = kernel_specs
        runner: Any = self.runner_class
        # A configurable runner (KubernetesJobRunner) reads its traits from our config.
        self.runner: JobRunner = (
            runner(parent=self) if issubclass(runner, Configurable) else runner()
        )
        self.jobs: dict[str, Job] = {}
        self.claims: dict[str, Claim] = {}  # each live job's request, by job id
        self._tasks: list[asyncio.Task[None]] = []
        self._unfollow: Any = None  # leaves the process's event stream
        self._busy: set[str] = set()  # jobs being started or killed: the tick leaves them
        self._last_reconcile = 0.0
        self._orphans: list[Job] = []

    async def start(self) -> None:
        """End the orphans of an earlier server (kill, release), start the loops."""
        orphans, self._orphans = self._orphans, []
        await asyncio.gather(*(self._clean_orphan(job) for job in orphans),
                             return_exceptions=True)  # fmt: skip
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick_loop())]
        if self.client is not None:
            self._unfollow = follow(
                self.client, self.on_event, reconnect_delay=self.reconnect_delay
            )
        self.log.info(
            "gpuaas: batch jobs on %s (index in %s)", type(self.runner).__name__, self.state_dir
        )

    async def stop(self) -> None:
        """Stop the loops; end every live job ("server stopped") and give its GPUs back.

        Without a server nobody renews a running job's lease, so the gateway would hand
        its GPUs to someone else while it still used them: better to stop it now."""
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        await asyncio.gather(
            *(self._end_live(job, "server stopped") for job in self.jobs.values() if job.live),
            return_exceptions=True,
        )

    def load(self) -> None:
        """Read the index (before the server answers anyone). Jobs recorded as queued,
        starting or running belong to a server that is gone: they are failed now, so
        nobody ever sees them "running" again; `start` kills what is left of them."""
        index = Path(self.state_dir)
        index.mkdir(parents=True, exist_ok=True)
        for pointer in sorted(index.iterdir()):
            try:
                job = Job.load(Path(pointer.read_text().strip()) / model.RECORD)
            except (OSError, ValueError, TypeError):
                pointer.unlink(missing_ok=True)  # its outputs were deleted
                continue
            self.jobs[job.id] = job
            if job.live:
                job.end(model.FAILED, "server restarted")
                job.save()
                self._orphans.append(job)
        self._prune()

    async def _clean_orphan(self, job: Job) -> None:
        if job.pid and self.runner.alive(job):
            self.log.warning("gpuaas: killing job %s (pid %s) of an earlier server", job.id,
                             job.pid)  # fmt: skip
            await asyncio.get_running_loop().run_in_executor(
                None, self.runner.cancel, job, self.kill_grace
            )
        await self._release(job)

    async def _end_live(self, job: Job, reason: str) -> None:
        if job.pid and self.runner.alive(job):
            await asyncio.get_running_loop().run_in_executor(
                None, self.runner.cancel, job, self.kill_grace
            )
        job.end(model.FAILED, reason)
        job.save()
        await self._release(job)

    def _index(self, job: Job) -> None:
        index = Path(self.state_dir)
        index.mkdir(parents=True, exist_ok=True)
        (index / job.id).write_text(job.outdir)

    def _prune(self) -> None:
        ended = sorted((j for j in self.jobs.values() if not j.live), key=lambda j: j.created)
        for job in ended[: max(0, len(ended) - self.history_size)]:
            self.jobs.pop(job.id, None)
            (Path(self.state_dir) / job.id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ queries

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError(404, f"no job {job_id}")
        return job

    def list(self) -> list[Job]:
        return sorted(self.jobs.values(), key=lambda j: j.created, reverse=True)

    def activity(self, since: float | None = None) -> builtins.list[str]:
        """The server's activity hook (server/idle.py): why jobs keep this server busy.

        A starting or running job is GPU work of this server, and so is one that ran
        after `since` (it ended between two rounds of the caller). A queued job is not:
        it holds no GPU yet, and waiting is not work."""
        out = []
        for job in self.jobs.values():
            if job.state in (model.STARTING, model.RUNNING):
                out.append(f"job {job.id} is {job.state}")
            elif since is not None and job.started and (job.ended or 0) > since:
                ended = time.strftime("%H:%M:%S", time.localtime(job.ended))
                out.append(f"job {job.id} ran until {ended}")
        return out

    # ------------------------------------------------------------------ submit

    async def submit(self, spec: Mapping[str, Any]) -> Job:
        """Validate, ask the gateway, record. Refusals raise JobError at once: a missing
        notebook, a tenant the user is not in, a request that can never be admitted."""
        allowed = {"kind", "path", "code", "cwd", "gpus", "tenant", "flavor", "priority",
                   "name", "parameters", "python"}  # fmt: skip
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise JobError(400, f"unknown field {unknown[0]!r}", unknown[0])
        kind = spec.get("kind")
        if kind not in model.KINDS:
            raise JobError(400, f"must be one of {', '.join(model.KINDS)}", "kind")
        gpus = spec.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise JobError(400, "must be a whole number of at least 1", "gpus")
        priority = spec.get("priority") or 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise JobError(400, "must be a whole number", "priority")
        parameters = spec.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, dict):
            raise JobError(400, "must be an object of name: value", "parameters")
        for key in ("tenant", "flavor", "name", "python", "code", "path", "cwd"):
            if spec.get(key) is not None and not isinstance(spec[key], str):
                raise JobError(400, "must be a string", key)

        python = spec.get("python") if kind != "notebook" else None
        if python is not None:
            self._interpreter(python)
        source: str | None = None
        if kind in ("notebook", "script"):
            source = self._source(spec.get("path"), ".ipynb" if kind == "notebook" else ".py")
            cwd = os.path.dirname(source)
            base_dir = Path(cwd)
            name = spec.get("name") or os.path.basename(source)
        else:
            code = spec.get("code") or ""
            if not code.strip():
                raise JobError(400, "the cell is empty: nothing to run", "code")
            cwd = self._directory(spec.get("cwd"))
            base_dir = Path(cwd)
            name = spec.get("name") or "cell"
        if not os.access(base_dir, os.W_OK):
            raise JobError(400, f"cannot write outputs beside the source in {base_dir}", "path")

        client = self._client()
        claim = Claim(
            client,
            "job",
            gpus,
            spec.get("flavor"),
            spec.get("tenant") or self.default_tenant or None,
            priority=priority,
            name=f"{name}",
        )
        try:
            tenant = await claim.choose_tenant()
        except GatewayError as e:
            raise JobError(502, f"cannot ask the gateway for your tenants: {e}") from None
        except ClaimError:
            raise JobError(403, "you are in no tenant: ask an administrator", "tenant") from None
        try:
            answer: Mapping[str, Any] = await claim.submit()
        except GatewayError as e:
            status = e.status if 400 <= e.status < 500 else 502
            raise JobError(status, e.error, e.field) from None

        job = Job(
            id=str(answer["id"]),
            kind=kind,
            tenant=tenant,
            gpus=gpus,
            flavor=spec.get("flavor"),
            priority=priority,
            name=name,
            user=str(answer.get("user") or ""),
            outdir=str(model.output_dir(base_dir, str(answer["id"]))),
            cwd=cwd,
            source=source,
            parameters=dict(parameters),
            python=python,
            kernel_name=self.notebook_kernel or None,
        )
        self.claims[job.id] = claim
        try:
            Path(job.outdir).mkdir(parents=True, exist_ok=True)
            if kind == "cell":
                job.script_path.write_text(str(spec["code"]))
            job.save()
            self._index(job)
        except OSError as e:
            await self._release(job)
            raise JobError(400, f"cannot write the job's outputs: {e}", "path") from None
        if self.runner.queues_itself:
            # Kueue mode: the job goes to the cluster's queue now; its admission there is
            # the request's (the gateway follows the Workload the job's label names).
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, self.runner.enqueue, job, answer)
            except Exception as e:
                self.log.warning("gpuaas: job %s could not be queued: %s", job.id, e)
                job.end(model.FAILED, f"could not be queued: {e}")
                job.save()
                await self._release(job)
                raise JobError(502, f"the job could not be queued in the cluster: {e}") from None
        self.jobs[job.id] = job
        self.log.info("gpuaas: job %s (%s %s) submitted to %s", job.id, kind, name, tenant)
        # Registered first, asked second: an admit that came before registration is seen
        # here, any later one reaches on_event with the job already known.
        try:
            answer = await client.get(job.id)
        except GatewayError:
            pass
        await self.apply(job, answer)
        return job

    def _source(self, path: Any, suffix: str) -> str:
        what = "notebook" if suffix == ".ipynb" else "script"
        if not path:
            raise JobError(400, f"a {what} path is required", "path")
        full = self._inside_root(path, "path")
        if not os.path.isfile(full):
            raise JobError(400, f"no such {what}: {path}", "path")
        if not full.endswith(suffix):
            raise JobError(400, f"not a {what} ({suffix}): {path}", "path")
        if suffix != ".ipynb":
            return full
        import nbformat

        try:
            nbformat.read(full, as_version=4)  # type: ignore[no-untyped-call]
        except Exception:
            # Not the parser's message: it may quote the file's first bytes.
            raise JobError(
                400, f"cannot read {path} as a notebook (nbformat JSON)", "path"
            ) from None
        return full

    def _directory(self, path: Any) -> str:
        full = self._inside_root(path or ".", "cwd")
        if not os.path.isdir(full):
            raise JobError(400, f"no such directory: {path}", "cwd")
        return full

    def _inside_root(self, path: str, field: str) -> str:
        return paths.inside_root(self.root_dir, path, field)

    def _interpreter(self, python: str) -> str:
        allowed = paths.interpreters(self.kernel_specs, self.interpreters, self.log)
        return paths.check_interpreter(python, allowed)

    def _client(self) -> GatewayClient:
        if self.client is None:
            raise JobError(
                503,
                "no gpuaas gateway configured for this server: set GPUAAS_URL and "
                "GPUAAS_TOKEN before starting it (or c.GpuaasExtension.gateway_url and "
                "gateway_token), or run it inside JupyterHub",
            )
        return self.client

    def _claim(self, job: Job) -> Claim:
        """The job's claim (a job of an earlier server: one on its request)."""
        claim = self.claims.get(job.id)
        if claim is None:
            claim = self.claims[job.id] = Claim(
                self._client(), "job", job.gpus, job.flavor, job.tenant, request_id=job.id
            )
        return claim

    # ------------------------------------------------------------------ state changes

    async def apply(self, job: Job, request: Mapping[str, Any], event: str | None = None) -> None:
        """Follow the gateway's view of the job's request."""
        if not job.live or job.id in self._busy:
            return
        self._claim(job).update(request)
        state = request.get("state")
        if event == "preempt" or (state in _WAITING and job.state != model.QUEUED):
            await self._requeue(job, request)
            return
        if state in _WAITING:
            if request.get("position") != job.position:
                job.position = request.get("position")
                job.save()
            return
        grant = Grant.of(request)
        if grant is not None:
            if job.state == model.QUEUED:
                await self._launch(job, grant)
            return
        # Ended at the gateway (cancelled by an admin, rejected, lease expired, ...).
        # Finished or cancelled by someone else: the owner or an admin ended it at the
        # gateway (`jupyter-gpuaas cancel ID`), which is a cancel of the job.
        if self.runner.queues_itself and job.state == model.RUNNING and await self._settled(job):
            return  # the run ended by itself, and the cluster's queue said so first
        reason = str(request.get("reason") or f"GPU request {state}")
        cancelled = state in (State.CANCELLED, State.FINISHED)
        end_state = model.CANCELLED if cancelled else model.FAILED
        if job.state == model.QUEUED:
            job.end(end_state, reason)
            job.save()
            await self._withdraw(job)
        else:
            reason = reason if cancelled else f"GPU grant lost: {reason}"
            await self._kill(job, end_state, reason, release=False)

    async def _settled(self, job: Job) -> bool:
        """Kueue mode: a request ends when its job's Workload finishes, which it does
        when the job itself ends; the job's own end, read afresh, is then its outcome
        (finished with its exit status: True), else it was stopped from outside."""
        self._busy.add(job.id)
        try:
            status = await asyncio.get_running_loop().run_in_executor(None, self.runner.settle, job)
        finally:
            self._busy.discard(job.id)
        if status is None or not job.live:
            return False
        await self._finish(job, status)
        return True

    async def _launch(self, job: Job, grant: Grant) -> None:
        self._busy.add(job.id)
        try:
            job.state = model.STARTING
            job.position = None
            job.admitted = time.time()
            job.grant = {"node": grant.node, "devices": list(grant.devices)}
            job.save()
            try:
                self.runner.start(job, grant)
            except Exception as e:
                self.log.warning("gpuaas: job %s could not start: %s", job.id, e)
                job.end(model.FAILED, f"could not start: {e}")
                job.save()
                await self._release(job)
                return
            job.state = model.RUNNING
            job.started = time.time()
            job.save()
            self._hold(job)
            self.log.info("gpuaas: job %s running on %s (pid %s)", job.id, job.grant, job.pid)
        finally:
            self._busy.discard(job.id)

    async def _requeue(self, job: Job, request: Mapping[str, Any]) -> None:
        """Preempted: the GPUs are gone, so is the run; the gateway queues the job again
        (SCENARIO.md) and it starts afresh when admitted again. A runner that queues
        itself (Kueue mode) was stopped and requeued by the cluster: nothing to stop."""
        if job.state != model.QUEUED:
            if not self.runner.queues_itself:
                await self._stop_process(job)
            with open(job.log_path, "a") as log:
                log.write("\n[gpuaas] preempted: stopped, queued again\n")
        job.state = model.QUEUED
        job.reason = (
            f"{request['reason']}; queued again"
            if self.runner.queues_itself and request.get("reason")
            else "preempted; queued again"
        )
        job.grant = None
        job.pid = None
        job.started = None
        job.position = request.get("position")
        job.save()

    async def _stop_process(self, job: Job) -> None:
        self._busy.add(job.id)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self.runner.cancel, job, self.kill_grace
            )
        finally:
            self._busy.discard(job.id)

    async def _withdraw(self, job: Job) -> None:
        """A queued job that ended: a runner that queues itself (Kueue mode) has made it
        already, waiting in the cluster's queue, and deletes it."""
        if self.runner.queues_itself:
            await self._stop_process(job)

    async def _kill(self, job: Job, state: str, reason: str, release: bool = True) -> None:
        if job.state in (model.RUNNING, model.STARTING):
            await self._stop_process(job)
        exit_status = job.exit_status
        job.end(state, reason, exit_status)
        job.save()
        if release:
            await self._release(job)

    async def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if not job.live:
            raise JobError(409, f"job {job_id} already {job.state}")
        if job.state == model.QUEUED:
            job.end(model.CANCELLED, "cancelled while queued")
            job.save()
            await self._release(job)
            await self._withdraw(job)
        else:
            await self._kill(job, model.CANCELLED, "cancelled while running")
        self.log.info("gpuaas: job %s cancelled", job.id)
        return job

    async def _finish(self, job: Job, status: int) -> None:
        if status == 0:
            job.end(model.SUCCEEDED, None, 0)
        else:
            job.end(model.FAILED, _failure(job, status), status)
        job.save()
        self.log.info("gpuaas: job %s %s", job.id, job.state)
        await self._release(job)
        self._prune()

    async def _release(self, job: Job) -> None:
        """Cancel the request if queued, release the grant if admitted: the gateway's
        DELETE does either. Gone already (404) or ended (409) is fine."""
        if self.client is None:
            return
        await self._claim(job).release(f"job {job.state}")
        self.claims.pop(job.id, None)

    # ------------------------------------------------------------------ loops

    async def _tick_loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("gpuaas: job tick failed")
            await asyncio.sleep(self.poll_interval)

    async def tick(self) -> None:
        for job in list(self.jobs.values()):
            if job.state == model.RUNNING and job.id not in self._busy:
                status = self.runner.poll(job)
                if status is not None:
                    await self._finish(job, status)
        now = time.monotonic()
        if self.client is None:
            return
        if now - self._last_reconcile >= self.reconcile_interval:
            self._last_reconcile = now
            queued = [j for j in self.jobs.values() if j.state == model.QUEUED]
            await asyncio.gather(*(self._reconcile(j) for j in queued), return_exceptions=True)

    def _hold(self, job: Job) -> None:
        """The running job's lease, renewed (busy) while it runs; a renewal that finds
        the grant ended without us hearing asks the gateway why."""
        if self.client is None:
            return
        self._claim(job).hold(
            on_lost=lambda _error: self._reconcile(job),
            active=lambda: job.state == model.RUNNING,
        )

    async def _reconcile(self, job: Job) -> None:
        assert self.client is not None
        try:
            request: Mapping[str, Any] = await self.client.get(job.id)
        except GatewayError as e:
            if e.status == 404:
                request = {"state": "cancelled", "reason": "the gateway forgot the request"}
            else:
                return
        await self.apply(job, request)

    async def on_event(self, name: str, data: Mapping[str, Any]) -> None:
        request = data.get("request") or {}
        rid = data.get("id") or request.get("id")
        job = self.jobs.get(str(rid)) if rid else None
        if job is None or not request:
            return
        await self.apply(job, request, name)


def _failure(job: Job, status: int) -> str:
    """`exited with status 1: cell 3 raised ValueError: boom` — the runner's own last
    word from the log when there is one."""
    reason = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
    try:
        with open(job.log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(job.log_path) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return reason
    for line in reversed(lines):
        if line.startswith("[gpuaas] cell") or line.startswith("[gpuaas] the notebook"):
            return f"{reason}: {line[len('[gpuaas] ') :]}"
    tail = [line for line in lines if line.strip()]
    if tail and job.kind != "notebook":
        return f"{reason}: {tail[-1].strip()[:200]}"
    return reason
