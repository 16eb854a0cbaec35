"""A container runtime beside KWOK on the REAL cluster: a pod's container as a LOCAL process.

KWOK plays every kubelet of the session's cluster (conftest.py's `cluster`) but runs
nothing: it turns a bound pod Running with an IP of its loopback range (127.20.0.0/16,
or GPUAAS_POD_CIDR) and removes a deleted one. Where a test needs the pod's process
itself (a GPU kernel the provisioner talks to), `KwokKubelet` plays the container: it
watches the API server for pods of its selector that KWOK has made Running on a Node,
and runs the first container's `command` + `args` with the pod's `env` in its
`workingDir`, as a process on this machine (the image's Python is this virtualenv's: its
bin directory leads the PATH). The process listens on every address, so it answers at
the pod's IP, which is on loopback.

How it and KWOK share the pod: KWOK's stages own its life up to Running (IP, conditions)
and its removal once deleted; none of them matches a Running pod again, so when the
process exits this kubelet reports what kubelet would (`status.phase` Succeeded or Failed,
the container terminated with its exit code) through the pods/status subresource, and
KWOK leaves it so.

When the pod gets a deletionTimestamp it stops the container as kubelet does: it runs the
container's `lifecycle.preStop.exec` command (same env, same workingDir) first, sends the
process group SIGTERM when the hook returns or the pod's grace (deletionGracePeriodSeconds,
else terminationGracePeriodSeconds, else 30 s) runs out, and SIGKILL at the grace's end
(at least 2 s after a SIGTERM that the hook delayed past the grace, as kubelet gives).
Each stop is recorded in `stops` (the hook's exit code, when SIGTERM was sent). KWOK
removes a deleted pod on its own clock (its pod-delete stage), possibly before the
process ends: a stop under way goes on regardless, as the container would. A pod that
vanishes without a deletionTimestamp seen (replaced by a newer one of the same name) gets
SIGTERM, then SIGKILL, at once. Once the process is gone it deletes the pod with no grace
(kubelet's last delete), so a pod whose removal KWOK is told to delay
(`pod-delete.stage.kwok.x-k8s.io/delay`) lasts as long as its process.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: A stand-in container (`KwokKubelet(stand_in=...)`): lives until SIGTERM, then exits 0.
UNTIL_SIGTERM = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "time.sleep(3600)",
]


class KwokKubelet:
    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        selector: str,
        logs: Path,
        stand_in: list[str] | None = None,
    ) -> None:
        """`stand_in`: a command run in the container's place, with the pod's env and in its
        workingDir (a server pod's `jupyterhub-singleuser` needs a Hub that a test of its
        stop has no use for); its preStop hook, SIGTERM and SIGKILL are played as ever."""
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.selector = selector
        self.logs = logs
        self.stand_in = stand_in
        self.procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # pod uid → name, proc
        self.started: list[dict[str, Any]] = []  # the pods it ran, as it found them
        # pod name → {"deleted_at", "sigterm_at", "removing_at" (epoch seconds: its
        # deletion, SIGTERM, the last delete once its process is gone), "grace",
        # "hook_exit", "hook_log"}
        self.stops: dict[str, dict[str, Any]] = {}
        self._envs: dict[str, dict[str, str]] = {}  # pod uid → the container's env
        self._stopping: dict[str, asyncio.Task[None]] = {}  # pod uid → its stop
        self._hooks: list[subprocess.Popen[bytes]] = []  # the preStop hooks it ran
        self._api: Any = None
        self._core: Any = None  # CoreV1Api; its raw (_preload_content=False) calls are untyped
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from kubernetes_asyncio import client, config

        api = await config.new_client_from_config(config_file=str(self.kubeconfig))
        self._api = api
        self._core = client.CoreV1Api(api)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server busy: the next round reads again
                print(f"kwok_kubelet: {e}", file=sys.stderr)
            await asyncio.sleep(0.05)

    async def _sync(self) -> None:
        resp = await self._core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False
        )
        pods = {p["metadata"]["uid"]: p for p in (await resp.json())["items"]}
        for uid, pod in pods.items():
            status = pod.get("status") or {}
            running = status.get("phase") == "Running" and status.get("podIP")
            if (
                uid not in self.procs
                and running
                and pod["spec"].get("nodeName")
                and not pod["metadata"].get("deletionTimestamp")
                and not any(p["metadata"]["uid"] == uid for p in self.started)
            ):
                self._start(pod)
        for uid, (_, proc) in list(self.procs.items()):
            if uid in self._stopping:
                continue
            pod = pods.get(uid)
            if pod is not None and pod["metadata"].get("deletionTimestamp"):
                self._stopping[uid] = asyncio.ensure_future(self._stop(uid, pod, proc))
                continue
            if pod is None:
                del self.procs[uid]
                await asyncio.to_thread(_kill, proc)
                continue
            code = proc.poll()
            if code is not None:
                del self.procs[uid]
                await asyncio.to_thread(_kill, proc)  # what it left in its group
                await self._finish(pod, code)

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        c = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value", "") for e in c.get("env") or []}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env.setdefault("HOME", os.environ.get("HOME", "/tmp"))
        log = open(self.logs / f"{meta['name']}-{meta['uid'][:8]}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            self.stand_in or [*c["command"], *(c.get("args") or [])],
            env=env,
            cwd=_workdir(c),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[meta["uid"]] = (meta["name"], proc)
        self._envs[meta["uid"]] = env
        self.started.append(copy.deepcopy(pod))

    async def _stop(self, uid: str, pod: dict[str, Any], proc: subprocess.Popen[bytes]) -> None:
        """Kubelet's stop of a deleted pod's container: preStop hook, SIGTERM, SIGKILL."""
        meta, spec = pod["metadata"], pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds")
        grace = 30 if grace is None else int(grace)
        record: dict[str, Any] = {"deleted_at": time.time(), "sigterm_at": None, "grace": grace}
        record["removing_at"] = None
        record.update(hook_exit=None, hook_log=None)
        self.stops[meta["name"]] = record
        deadline = time.monotonic() + grace
        c = spec["containers"][0]
        hook = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        if hook and proc.poll() is None and grace > 0:
            record["hook_log"] = self.logs / f"{meta['name']}-{uid[:8]}.prestop.log"
            log = open(record["hook_log"], "ab")  # noqa: SIM115
            run = subprocess.Popen(
                list(hook),
                env=self._envs.get(uid),
                cwd=_workdir(c),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            self._hooks.append(run)
            try:
                record["hook_exit"] = await asyncio.to_thread(run.wait, grace)
            except subprocess.TimeoutExpired:
                run.kill()
                await asyncio.to_thread(run.wait)
        record["sigterm_at"] = time.time()
        _signal(proc, signal.SIGTERM)
        left = max(deadline - time.monotonic(), 2.0)
        try:
            await asyncio.to_thread(proc.wait, left)
        except subprocess.TimeoutExpired:
            pass
        _signal(proc, signal.SIGKILL)  # the grace's end, and what it left in its group
        await asyncio.to_thread(proc.wait)
        self.procs.pop(uid, None)
        self._stopping.pop(uid, None)
        # The container is gone: the pod object goes too, as kubelet's last delete does.
        from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions

        record["removing_at"] = time.time()
        try:
            await self._core.delete_namespaced_pod(
                meta["name"],
                self.namespace,
                body=V1DeleteOptions(
                    grace_period_seconds=0, preconditions=V1Preconditions(uid=uid)
                ),
            )
        except Exception:  # already gone (KWOK's stage removed it)
            pass

    async def _finish(self, pod: dict[str, Any], exit_code: int) -> None:
        """The container exited: the pod says so, as kubelet would (restartPolicy Never:
        it stays, Succeeded or Failed)."""
        status = copy.deepcopy(pod.get("status") or {})
        statuses = status.get("containerStatuses") or []
        for cs in statuses:
            cs["ready"] = False
            cs["started"] = False
            cs["state"] = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "startedAt": (cs.get("state", {}).get("running") or {}).get("startedAt"),
                    "finishedAt": _now(),
                }
            }
        conditions = [
            {**c, "status": "False"} if c.get("type") in ("Ready", "ContainersReady") else c
            for c in status.get("conditions") or []
        ]
        patch = {
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": statuses,
                "conditions": conditions,
            }
        }
        await self._core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            self.namespace,
            patch,
            _content_type="application/merge-patch+json",
        )

    def alive(self, name: str) -> bool:
        return any(n == name and p.poll() is None for n, p in self.procs.values())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        for task in list(self._stopping.values()):
            task.cancel()
        for hook in self._hooks:
            if hook.poll() is None:
                hook.kill()
        for _, proc in self.procs.values():
            await asyncio.to_thread(_kill, proc)
        self.procs.clear()
        if self._api is not None:
            await self._api.close()


def _workdir(container: dict[str, Any]) -> str | None:
    """The container's workingDir where this machine has it (a server image's home, such
    as /home/jovyan, it may not: then this process's own)."""
    wd = container.get("workingDir")
    return wd if wd and Path(wd).is_dir() else None


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (the launcher and its listener), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            continue
    try:  # the group's last ones (a listener that outlived its kernel)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
