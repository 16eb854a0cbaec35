"""A container runtime for the Kubernetes API DOUBLE: a pod's container as a LOCAL process.

No cluster can run here, so when the double's toy kubelet starts a pod that matches the
selector, `LocalKubelet` runs its first container's `command` + `args` with the pod's
`env` in its `workingDir`, as a process on this machine (the image's Python is this
virtualenv's: its bin directory leads the PATH). When the process exits the pod turns
Succeeded or Failed; when the pod is deleted the process gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from k8s_double import KubernetesDouble
from k8s_store import label_selector_matches


class LocalKubelet:
    def __init__(self, double: KubernetesDouble, selector: str, logs: Path) -> None:
        self.double = double
        self.selector = selector
        self.logs = logs
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.started: list[str] = []  # pod names, in order
        double.on_pod_running.append(self._start)
        double.on_pod_deleted.append(self._stop)
        self._reaper = asyncio.ensure_future(self._reap())

    def _start(self, namespace: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if not label_selector_matches(self.selector, meta.get("labels") or {}):
            return
        c = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in c.get("env") or []}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env.setdefault("HOME", os.environ.get("HOME", "/tmp"))
        log = open(self.logs / f"{meta['name']}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [*c["command"], *(c.get("args") or [])],
            env=env,
            cwd=c.get("workingDir") or None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[(namespace, meta["name"])] = proc
        self.started.append(meta["name"])

    def _stop(self, namespace: str, pod: dict[str, Any]) -> None:
        proc = self.procs.pop((namespace, pod["metadata"]["name"]), None)
        if proc is not None:
            _kill(proc)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            for (ns, name), proc in list(self.procs.items()):
                code = proc.poll()
                if code is not None:
                    del self.procs[(ns, name)]
                    _kill(proc)  # what it left in its group (the launcher's listener)
                    if self.double.get("/api/v1", "pods", name, ns) is not None:
                        finish_pod(self.double, ns, name, code)

    def alive(self, name: str) -> bool:
        return any(n == name and p.poll() is None for (_, n), p in self.procs.items())

    def close(self) -> None:
        self._reaper.cancel()
        for proc in self.procs.values():
            _kill(proc)
        self.procs.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (the launcher and its listener), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # the group's last ones (a listener that outlived its kernel)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def finish_pod(double: KubernetesDouble, namespace: str, name: str, exit_code: int) -> None:
    """The pod's container exited: the pod says so, as kubelet would (restartPolicy
    Never: it stays, Succeeded or Failed)."""
    pod = copy.deepcopy(double.get("/api/v1", "pods", name, namespace))
    assert pod is not None, f"no pod {name}"
    status = pod.setdefault("status", {})
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    for cs in status.get("containerStatuses") or []:
        cs["ready"] = False
        cs["state"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
            }
        }
    double.put("/api/v1", "pods", pod, namespace)
