"""The cluster side of the Kubernetes API double (k8s_double.py): what the scheduler, the
kubelet and the Job controller would do.

A toy scheduler and kubelet for pods (one pass over every pending pod: a Ready,
schedulable Node whose labels, taints and allocatable extended resources fit; a
`Scheduled` or `FailedScheduling` Event), the Job controller (one pod per new Job, and
what its container's exit makes of the pod and the Job), Nodes and Events as tests add
them. `Cluster` is a base of `KubernetesDouble`, on top of k8s_store.py's `Store`.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from k8s_store import Key, Store


class Cluster(Store):
    """The controllers' and kubelet's side: they write through `put`, as real ones do."""

    logs: dict[tuple[str, str], str]  # (namespace, pod) → its container's log
    on_pod_running: list[Callable[[str, dict[str, Any]], None]]

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
