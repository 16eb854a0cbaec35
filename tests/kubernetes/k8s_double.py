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
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Key = tuple[str, str, str, str]  # (api prefix, plural, namespace or "", name)

KINDS = {
    "pods": "Pod",
    "events": "Event",
    "nodes": "Node",
    "namespaces": "Namespace",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "services": "Service",
    "secrets": "Secret",
    "configmaps": "ConfigMap",
    "podtemplates": "PodTemplate",
    "jobs": "Job",
    "deployments": "Deployment",
    "provisioningrequests": "ProvisioningRequest",
}
CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses", "clusterroles"}


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


def _get_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """The equality- and set-based label selector grammar of the API."""
    if not selector:
        return True
    for term in re.split(r",(?![^()]*\))", selector):
        term = term.strip()
        m = re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            has = labels.get(m.group(1)) in values
            if has != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_selector_matches(selector: str, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        neq = "!=" in term
        k, v = term.split("!=" if neq else "=", 1)
        got = _get_path(obj, k.strip())
        got = "" if got is None else str(got)
        if (got == v.strip()) == neq:
            return False
    return True


@dataclass
class Watcher:
    prefix: str
    plural: str
    namespace: str
    labels: str
    fields: str
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class KubernetesDouble:
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

    # ----------------------------------------------------------------- store

    def _emit(self, kind: str, key: Key, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, kind, key, copy.deepcopy(obj)))
        if len(self.history) > self.history_limit:
            dropped = self.history.pop(0)
            self.compacted = dropped[0]
        for w in list(self.watchers):
            if self._watch_matches(w, key, obj):
                w.queue.put_nowait({"type": kind, "object": copy.deepcopy(obj)})

    def _watch_matches(self, w: Watcher, key: Key, obj: dict[str, Any]) -> bool:
        prefix, plural, ns, _ = key
        return (
            (prefix, plural) == (w.prefix, w.plural)
            and (not w.namespace or w.namespace == ns)
            and label_selector_matches(w.labels, (obj.get("metadata") or {}).get("labels") or {})
            and field_selector_matches(w.fields, obj)
        )

    def put(
        self, prefix: str, plural: str, obj: dict[str, Any], namespace: str = ""
    ) -> dict[str, Any]:
        """Create or replace an object as the cluster would (a Node joining, a status)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if namespace:
            meta["namespace"] = namespace
        key = (prefix, plural, namespace, meta["name"])
        old = self.objects.get(key)
        meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
        meta.setdefault(
            "creationTimestamp",
            (old or {}).get("metadata", {}).get("creationTimestamp") or "2026-12-01T09:00:00Z",
        )
        if plural in KINDS:
            obj.setdefault("kind", KINDS[plural])
        obj.setdefault("apiVersion", "v1" if prefix == "/api/v1" else prefix.split("/", 2)[2])
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self._emit("MODIFIED" if old else "ADDED", key, obj)
        if self.auto_schedule and plural in ("pods", "nodes"):
            asyncio.get_running_loop().call_soon(self.schedule)
        if (prefix, plural) == ("/apis/batch/v1", "jobs") and old is None:
            asyncio.get_running_loop().call_soon(self._job_controller, key)
        return obj

    # ----------------------------------------------------------------- Jobs

    def _job_controller(self, key: Key) -> None:
        """What the Job controller does for a new Job: one pod from its template."""
        job = self.objects.get(key)
        if job is None:
            return
        name, ns = job["metadata"]["name"], key[2]
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.setdefault("metadata", {})
        meta["name"] = f"{name}-{uuid.uuid4().hex[:5]}"
        meta["labels"] = {
            **(meta.get("labels") or {}),
            "job-name": name,
            "controller-uid": job["metadata"]["uid"],
        }
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"]}
        ]
        self.put("/api/v1", "pods", template, ns)

    def job_pod(self, namespace: str, job: str) -> dict[str, Any] | None:
        for pod in self.pods(namespace):
            if (pod["metadata"].get("labels") or {}).get("job-name") == job:
                return pod
        return None

    def write_log(self, namespace: str, pod: str, text: str) -> None:
        self.logs[(namespace, pod)] = self.logs.get((namespace, pod), "") + text

    def finish_job(self, namespace: str, job: str, exit_code: int) -> None:
        """The job's container exited: its pod and the Job say so, as kubelet and the Job
        controller would."""
        pod = copy.deepcopy(self.job_pod(namespace, job))
        assert pod is not None, f"job {job} has no pod"
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        for cs in pod["status"].get("containerStatuses") or []:
            cs["ready"] = False
            cs["state"] = {"terminated": {"exitCode": exit_code, "reason": "Completed"}}
        self.put("/api/v1", "pods", pod, namespace)
        obj = copy.deepcopy(self.objects[("/apis/batch/v1", "jobs", namespace, job)])
        obj["status"] = (
            {"succeeded": 1}
            if exit_code == 0
            else {
                "failed": 1,
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
                ],
            }
        )
        self.put("/apis/batch/v1", "jobs", obj, namespace)

    def delete(
        self, prefix: str, plural: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        key = (prefix, plural, namespace, name)
        obj = self.objects.pop(key, None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._emit("DELETED", key, obj)
            if (prefix, plural) == ("/api/v1", "pods"):
                for hook in list(self.on_pod_deleted):
                    hook(namespace, obj)
        return obj

    def get(
        self, prefix: str, plural: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        return self.objects.get((prefix, plural, namespace, name))

    def items(self, prefix: str, plural: str, namespace: str = "") -> list[dict[str, Any]]:
        return [
            o
            for (p, pl, ns, _), o in self.objects.items()
            if (p, pl) == (prefix, plural) and (not namespace or ns == namespace)
        ]

    def pods(self, namespace: str = "") -> list[dict[str, Any]]:
        return self.items("/api/v1", "pods", namespace)

    def compact(self) -> None:
        """Forget the history: a watch that resumes from any version handed out so far
        gets 410 Gone (a list now returns a newer one)."""
        self.compacted = self.rv
        self.rv += 1
        self.history.clear()

    def drop_watches(self) -> None:
        """Close every open watch, as a restarting API server or a lost connection does."""
        for w in self.watchers:
            w.queue.put_nowait(None)

    # ----------------------------------------------------------------- cluster side

    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str] | None = None,
        ready: bool = True,
        unschedulable: bool = False,
        taints: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        node = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {
                "allocatable": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "110",
                    **(allocatable or {}),
                },
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", **(allocatable or {})},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        return self.put("/api/v1", "nodes", node)

    def set_node_ready(self, name: str, ready: bool) -> None:
        node = copy.deepcopy(self.objects[("/api/v1", "nodes", "", name)])
        node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        self.put("/api/v1", "nodes", node)

    def event(
        self, namespace: str, pod: dict[str, Any], reason: str, message: str, kind: str = "Normal"
    ) -> None:
        self.put(
            "/api/v1",
            "events",
            {
                "metadata": {"generateName": pod["metadata"]["name"] + "."},
                "involvedObject": {
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "namespace": namespace,
                    "uid": pod["metadata"]["uid"],
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "lastTimestamp": "2026-12-01T09:00:01Z",
                "eventTime": None,
            },
            namespace,
        )

    def _nodes(self) -> Iterator[dict[str, Any]]:
        yield from self.items("/api/v1", "nodes")

    @staticmethod
    def node_ready(node: dict[str, Any]) -> bool:
        conds = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    def _fits(self, pod: dict[str, Any], node: dict[str, Any]) -> str | None:
        """None if `pod` may land on `node`, else the scheduler's reason."""
        spec = pod.get("spec") or {}
        labels = node["metadata"].get("labels") or {}
        if not self.node_ready(node) or (node.get("spec") or {}).get("unschedulable"):
            return "node(s) were unschedulable or not ready"
        for k, v in (spec.get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return "node(s) didn't match Pod's node affinity/selector"
        terms = (
            ((spec.get("affinity") or {}).get("nodeAffinity") or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms")
        )
        if terms and not any(_term_matches(t, labels) for t in terms):
            return "node(s) didn't match Pod's node affinity/selector"
        tolerations = spec.get("tolerations") or []
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                _tolerates(t, taint) for t in tolerations
            ):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        used: dict[str, int] = {}
        for other in self.pods():
            if (other.get("spec") or {}).get("nodeName") == node["metadata"]["name"]:
                for r, n in _extended_requests(other).items():
                    used[r] = used.get(r, 0) + n
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for r, n in _extended_requests(pod).items():
            if used.get(r, 0) + n > int(allocatable.get(r, "0")):
                return f"Insufficient {r}"
        return None

    def schedule(self) -> None:
        """One pass of the toy scheduler and kubelet over every pending pod."""
        for key, pod in list(self.objects.items()):
            if key[1] != "pods" or (pod.get("spec") or {}).get("nodeName"):
                continue
            if pod["metadata"].get("deletionTimestamp") or key not in self.objects:
                continue
            nodes = list(self._nodes())
            reasons: dict[str, int] = {}
            chosen = None
            for node in nodes:
                why = self._fits(pod, node)
                if why is None:
                    chosen = node
                    break
                reasons[why] = reasons.get(why, 0) + 1
            ns = key[2]
            if chosen is None:
                message = (
                    f"0/{len(nodes)} nodes are available: "
                    + ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
                    + "."
                )
                status = pod.get("status") or {}
                conds = status.get("conditions") or []
                if any(c.get("message") == message for c in conds):
                    continue  # said already
                new = copy.deepcopy(pod)
                new["status"] = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                        }
                    ],
                }
                self.put(key[0], "pods", new, ns)
                self.event(ns, new, "FailedScheduling", message, "Warning")
                continue
            name = chosen["metadata"]["name"]
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = name
            new["status"] = {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "ready": True,
                        "restartCount": 0,
                        "image": c.get("image", ""),
                        "imageID": "",
                        "state": {"running": {"startedAt": "2026-12-01T09:00:02Z"}},
                    }
                    for c in new["spec"].get("containers") or []
                ],
            }
            new = self.put(key[0], "pods", new, ns)
            self.event(
                ns,
                new,
                "Scheduled",
                f"Successfully assigned {ns}/{new['metadata']['name']} to {name}",
            )
            for hook in list(self.on_pod_running):
                hook(ns, new)

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


def _term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        value = labels.get(expr["key"])
        op = expr["operator"]
        if op == "In" and value not in expr.get("values", []):
            return False
        if op == "NotIn" and value in expr.get("values", []):
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


def _tolerates(tol: dict[str, Any], taint: dict[str, Any]) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    return tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", "")


def _extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """The pod's requests of countable extended resources (GPUs, MIG slices)."""
    out: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for r, v in merged.items():
            if "/" in r and str(v).isdigit():
                out[r] = out.get(r, 0) + int(v)
    return out
