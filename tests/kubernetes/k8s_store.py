"""The store and watch machinery of the Kubernetes API double (k8s_double.py).

Every object under one key (api prefix, plural, namespace, name), one resourceVersion
counter for everything, and an event history that watches resume from (`compacted` marks
what is gone: a watch from there or older gets 410 Gone). The label and field selector
grammars are here because lists and watches both filter with them. `Store` is the base
of k8s_cluster.py's `Cluster`; `KubernetesDouble` owns the state, which the bases
declare (the pattern of the admission core's mixins).
"""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


class Store:
    """Objects, resourceVersions and the history: what writes and watches share."""

    objects: dict[Key, dict[str, Any]]
    rv: int
    history: list[tuple[int, str, Key, dict[str, Any]]]
    history_limit: int
    compacted: int  # a watch from this version or older gets 410 Gone
    watchers: list[Watcher]
    auto_schedule: bool
    on_pod_deleted: list[Callable[[str, dict[str, Any]], None]]
    # What a write sets off, in Cluster (k8s_cluster.py): the scheduler's pass over pending
    # pods, and the Job controller's pod for a new Job.
    schedule: Callable[[], None]
    _job_controller: Callable[[Key], None]

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
