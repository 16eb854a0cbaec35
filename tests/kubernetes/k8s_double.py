"""An in-process Kubernetes API DOUBLE: no API server can run on these machines.

An aiohttp server on a loopback port that speaks enough of the Kubernetes REST API for
kubernetes_asyncio (and so KubeSpawner) to talk to it over real HTTP:

- any resource under `/api/v1/...` or `/apis/{group}/{version}/...`, namespaced or not:
  list (label and field selectors), watch (chunked JSON lines, from a resourceVersion),
  get, create (uid, generateName, resourceVersion, creationTimestamp), replace, merge
  patch, delete;
- one resourceVersion counter for everything, an event history for watches, and 410 Gone
  (an ERROR watch event with code 410) for a watch that asks for a compacted version;
- a toy scheduler and kubelet for pods: a pod lands on a Ready, schedulable Node whose
  labels match its node selector and required node affinity, whose taints it tolerates
  and whose allocatable extended resources it fits; it then runs (phase Running, a pod IP,
  ready containers) with a `Scheduled` Event. Otherwise it stays Pending with a
  `FailedScheduling` Event, as the real scheduler says it.

Tests drive the cluster side through plain methods (`put`, `delete`, `add_node`,
`compact`, `drop_watches`) on the same event loop. A container runtime can
hook in (`on_pod_running`, `on_pod_deleted`: kubelet.py's `LocalKubelet` runs a pod's
container as a local process). It is a double: it does not check
schemas, RBAC or admission, and schedules in one pass.

The double is three layers: k8s_store.py (objects, resourceVersions, watch history,
selectors), k8s_cluster.py (scheduler, kubelet, Job controller, Nodes, Events), and this
module, which owns the state and serves it over HTTP.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from k8s_cluster import Cluster
from k8s_store import KINDS, Key, Watcher, field_selector_matches, label_selector_matches


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class KubernetesDouble(Cluster):
    """The API double. `await start()`, use `.url`, `await stop()`."""

    def __init__(self, *, history: int = 10_000, auto_schedule: bool = True) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 1
        self.history: list[tuple[int, str, Key, dict[str, Any]]] = []
        self.history_limit = history
        self.compacted = 0  # a watch from this version or older gets 410 Gone
        self.watchers: list[Watcher] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call
        self.auto_schedule = auto_schedule
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) → its container's log
        self.deletes: list[tuple[str, Any]] = []  # (path, DeleteOptions body) of each DELETE
        self.url = ""
        self._runner: web.AppRunner | None = None
        # The container runtime's hooks: (namespace, pod) when the toy kubelet starts a
        # pod, and when a pod is deleted.
        self.on_pod_running: list[Callable[[str, dict[str, Any]], None]] = []
        self.on_pod_deleted: list[Callable[[str, dict[str, Any]], None]] = []

    # ----------------------------------------------------------------- server

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig that points kubernetes_asyncio at this double."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {"token": "double-token"}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double"}}],
            "current-context": "double",
        }

    # ----------------------------------------------------------------- HTTP

    @staticmethod
    def _parse(path: str) -> tuple[str, str, str, str, str]:
        """path → (prefix, plural, namespace, name, subresource)."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            prefix, rest = "/api/v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            prefix, rest = "/" + "/".join(parts[:3]), parts[3:]
        else:
            raise web.HTTPNotFound(text=json.dumps(_status(404, "NotFound", f"no API at {path}")))
        if not rest:
            raise web.HTTPNotFound(
                text=json.dumps(_status(404, "NotFound", "discovery is not doubled"))
            )
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        else:
            ns = ""
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        return prefix, plural, ns, name, sub

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        prefix, plural, ns, name, sub = self._parse(request.path)
        q = request.query
        if sub == "scale":
            return await self._scale(request, prefix, plural, ns, name)
        if sub == "log":
            return await self._log(request, ns, name)
        if request.method == "GET" and not name:
            if q.get("watch") in ("true", "1", "True"):
                return await self._watch(request, prefix, plural, ns)
            items = [
                o
                for o in self.items(prefix, plural, ns)
                if label_selector_matches(
                    q.get("labelSelector", ""), o["metadata"].get("labels") or {}
                )
                and field_selector_matches(q.get("fieldSelector", ""), o)
            ]
            kind = KINDS.get(plural, plural.capitalize())
            return web.json_response(
                {
                    "kind": kind + "List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            )
        if request.method == "GET":
            obj = self.get(prefix, plural, name, ns)
            if obj is None:
                return self._not_found(plural, name)
            return web.json_response(obj)
        if request.method == "POST":
            body = await request.json()
            meta = body.setdefault("metadata", {})
            if meta.get("name") and self.get(prefix, plural, meta["name"], ns) is not None:
                return web.json_response(
                    _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists'),
                    status=409,
                )
            if plural == "pods":
                # The API server gives a new pod a status at once, and KubeSpawner reads
                # `pod["status"]` with no default: a watch event before the scheduler's pass
                # must not be a KeyError in its is_pod_running.
                body.setdefault("status", {"phase": "Pending"})
            return web.json_response(self.put(prefix, plural, body, ns), status=201)
        if request.method in ("PUT", "PATCH"):
            old = self.get(prefix, plural, name, ns)
            if old is None:
                return self._not_found(plural, name)
            body = await request.json()
            new = body if request.method == "PUT" else _merge(copy.deepcopy(old), body)
            return web.json_response(self.put(prefix, plural, new, ns))
        if request.method == "DELETE":
            body = await request.json() if request.can_read_body else None
            self.deletes.append((request.path, body))
            if (prefix, plural) == ("/apis/batch/v1", "jobs"):
                # Foreground (or Background) propagation: the Job's pods go too.
                for pod in [
                    p
                    for p in self.pods(ns)
                    if (p["metadata"].get("labels") or {}).get("job-name") == name
                ]:
                    self.delete("/api/v1", "pods", pod["metadata"]["name"], ns)
            obj = self.delete(prefix, plural, name, ns)
            if obj is None:
                return self._not_found(plural, name)
            if plural == "pods" and self.auto_schedule:
                asyncio.get_running_loop().call_soon(self.schedule)
            return web.json_response(obj)
        return web.json_response(_status(405, "MethodNotAllowed", request.method), status=405)

    async def _scale(
        self, request: web.Request, prefix: str, plural: str, ns: str, name: str
    ) -> web.Response:
        """The scale subresource of a Deployment: read or set spec.replicas."""
        obj = self.get(prefix, plural, name, ns)
        if obj is None:
            return self._not_found(plural, name)
        if request.method == "PATCH":
            body = await request.json()
            new = copy.deepcopy(obj)
            new["spec"]["replicas"] = int(body["spec"]["replicas"])
            obj = self.put(prefix, plural, new, ns)
        replicas = obj["spec"].get("replicas", 1)
        return web.json_response(
            {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": replicas},
                "status": {"replicas": replicas},
            }
        )

    async def _log(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """A pod's log; with follow=true, streamed until the pod ends or goes."""
        if self.get("/api/v1", "pods", name, ns) is None:
            return self._not_found("pods", name)
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        sent = 0
        follow = request.query.get("follow") in ("true", "True", "1")
        while True:
            text = self.logs.get((ns, name), "")
            if len(text) > sent:
                await resp.write(text[sent:].encode())
                sent = len(text)
            pod = self.get("/api/v1", "pods", name, ns)
            done = pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not follow or (done and len(self.logs.get((ns, name), "")) == sent):
                break
            await asyncio.sleep(0.05)
        return resp

    @staticmethod
    def _not_found(plural: str, name: str) -> web.Response:
        return web.json_response(
            _status(404, "NotFound", f'{plural} "{name}" not found'), status=404
        )

    async def _watch(
        self, request: web.Request, prefix: str, plural: str, ns: str
    ) -> web.StreamResponse:
        q = request.query
        w = Watcher(prefix, plural, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        since = q.get("resourceVersion", "")
        backlog: list[dict[str, Any]] = []
        if since in ("", "0"):
            backlog = [
                {"type": "ADDED", "object": copy.deepcopy(o)}
                for (p, pl, n, _), o in self.objects.items()
                if self._watch_matches(w, (p, pl, n, ""), o)
            ]
        elif int(since) <= self.compacted:
            gone = {
                "type": "ERROR",
                "object": _status(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"
                ),
            }
            await resp.write(json.dumps(gone).encode() + b"\n")
            return resp
        else:
            backlog = [
                {"type": kind, "object": copy.deepcopy(obj)}
                for rv, kind, key, obj in self.history
                if rv > int(since) and self._watch_matches(w, key, obj)
            ]
        self.watchers.append(w)
        timeout = float(q.get("timeoutSeconds") or 0) or None
        try:
            for ev in backlog:
                await resp.write(json.dumps(ev).encode() + b"\n")
            while True:
                try:
                    ev = await asyncio.wait_for(w.queue.get(), timeout)
                except asyncio.TimeoutError:
                    break
                if ev is None:
                    break
                await resp.write(json.dumps(ev).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(w)
        return resp


def _merge(old: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what a strategic merge of these simple objects does)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(old, dict):
        old = {}
    for k, v in patch.items():
        if v is None:
            old.pop(k, None)
        else:
            old[k] = _merge(old.get(k), v)
    return old
