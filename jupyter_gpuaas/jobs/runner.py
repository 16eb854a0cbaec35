"""How an admitted job runs: the `JobRunner` interface and its first implementation, a
local process per job.

The manager decides *when* (admission, cancel, preemption); a runner only knows *how*:
start a job on a grant, poll it, and kill it. A Kubernetes Job runner (the grant's node
selector and `nvidia.com/gpu` limits instead of CUDA_VISIBLE_DEVICES) fits the same three
calls; `adopt` lets a runner tell whether a job recorded by an earlier server is still
running, so a restarted server never leaves one "running" forever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import psutil

from jupyter_gpuaas.claim import Grant

from .model import Job


class JobRunner(ABC):
    """Runs admitted jobs. Every method is cheap and non-blocking, except `cancel`, which
    may wait up to its grace period."""

    @abstractmethod
    def start(self, job: Job, grant: Grant) -> None:
        """Start `job` on `grant` (what the gateway granted its request); sets `job.pid`.
        Raises OSError (or any Exception) when it cannot start: the job then fails."""

    @abstractmethod
    def poll(self, job: Job) -> int | None:
        """None while the job runs, else its exit status (-N: killed by signal N; 255:
        ended, but its status is unknown)."""

    @abstractmethod
    def cancel(self, job: Job, grace: float) -> None:
        """Stop the job and everything it started: politely, then after `grace` seconds
        by force. Returns once they are gone."""

    @abstractmethod
    def alive(self, job: Job) -> bool:
        """Whether a job recorded earlier (maybe by another server process) still runs."""

    #: Whether the runner hands its job to the cluster's own queue at submit (Kueue mode):
    #: the job then exists while it is queued (`enqueue`), a preemption requeues it in
    #: place (the cluster stops and restarts it; the manager stops nothing), `start`
    #: follows the run the cluster began, and ending a queued job `cancel`s it too.
    queues_itself: bool = False

    def settle(self, job: Job) -> int | None:
        """`poll`, from a fresh look where `poll` answers from a cache. May block."""
        return self.poll(job)

    def enqueue(self, job: Job, request: Mapping[str, Any]) -> None:
        """Only when `queues_itself`: hand `job` to the cluster's queue, right after its
        request (the gateway's object, queued) was submitted. May block (the manager
        calls it off the event loop); raises when the cluster refuses it."""
        raise NotImplementedError


UNKNOWN_STATUS = 255


class LocalProcessRunner(JobRunner):
    """One process per job, as the server's user, in its own session (so cancel can kill
    the whole group and a terminal's Ctrl-C never reaches it), with
    CUDA_VISIBLE_DEVICES set to the grant's devices and stdout and stderr in the log.

    Notebooks run through `python -m jupyter_gpuaas.jobs.execute` (papermill) with the
    server's interpreter; a cell runs as a script with the submitting kernel's interpreter,
    so it sees the same packages the notebook does.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def command(self, job: Job) -> list[str]:
        if job.kind == "notebook":
            assert job.source is not None and job.output_notebook is not None
            argv = [
                sys.executable,
                "-m",
                "jupyter_gpuaas.jobs.execute",
                job.source,
                str(job.output_notebook),
                "--cwd",
                job.cwd,
                "--parameters",
                json.dumps(job.parameters),
            ]
            if job.kernel_name:
                argv += ["--kernel", job.kernel_name]
            return argv
        script = job.source if job.kind == "script" and job.source else str(job.script_path)
        return [job.python or sys.executable, "-u", script]

    def environment(self, job: Job, grant: Grant) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.update(grant.environment())
        env["GPUAAS_JOB_ID"] = job.id
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, job: Job, grant: Grant) -> None:
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command(job),
                cwd=job.cwd,
                env=self.environment(job, grant),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs[job.id] = proc
        job.pid = proc.pid
        job.pid_started = _create_time(proc.pid)

    def poll(self, job: Job) -> int | None:
        proc = self._procs.get(job.id)
        if proc is not None:
            code = proc.poll()
            if code is not None:
                self._procs.pop(job.id, None)
            return code
        return None if self.alive(job) else UNKNOWN_STATUS

    def alive(self, job: Job) -> bool:
        if not job.pid:
            return False
        started = _create_time(job.pid)
        if started is None:
            return False
        if job.pid_started is not None and abs(started - job.pid_started) > 1.0:
            return False  # the pid was reused by another process
        return not _is_zombie(job.pid)

    def cancel(self, job: Job, grace: float) -> None:
        if not self.alive(job):
            self._reap(job)
            return
        assert job.pid is not None
        # The tree first, while it is still attached: kernels papermill starts run in
        # their own sessions, so the job's process group alone would miss them.
        victims = _tree(job.pid)
        _signal_all(job.pid, victims, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _any_alive(victims):
            self._reap(job, block=False)
            time.sleep(0.05)
        _signal_all(job.pid, victims, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _any_alive(victims):
            self._reap(job, block=False)
            time.sleep(0.02)
        self._reap(job)

    def _reap(self, job: Job, block: bool = True) -> None:
        proc = self._procs.get(job.id)
        if proc is None:
            return
        try:
            proc.wait(timeout=2 if block else 0.001)
        except subprocess.TimeoutExpired:
            return
        self._procs.pop(job.id, None)


# ---------------------------------------------------------------------- process helpers


def _create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _tree(pid: int) -> list[Any]:
    """The process and all its descendants (psutil.Process objects)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(pgid: int, procs: list[Any], sig: int) -> None:
    try:
        os.killpg(pgid, sig)  # the job's own session: anything it forked and forgot
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _any_alive(procs: list[Any]) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
    return False
