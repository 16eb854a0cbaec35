"""Kueue's Workloads, read and watched through kubernetes_asyncio, and its visibility API.

Kueue makes a Workload for every job it manages (a `batch/v1` Job, a pod of its `pod`
integration, a RayJob, ...), and records its decisions in the Workload's status: the
`QuotaReserved` and `Admitted` conditions and `status.admission` (the ClusterQueue and, per
pod set, the flavor of each resource) when it admits, `Evicted` and `Preempted` when it
takes the quota back, `Finished` when the job ended. `workload_view()` is the pure mapping
of one Workload onto what the gateway shows of a request (tested by equality);
`waiting_words()` turns the reason Kueue gives for not reserving quota into one of our
three kinds of wait and a sentence. `WorkloadWatch` lists the Workloads, then watches them
(resuming after a disconnect, listing again on 410 Gone); `pending_positions()` asks the
visibility API (`visibility.kueue.x-k8s.io`, `pendingworkloads` of a ClusterQueue) where
each pending Workload stands; `bound_nodes()` finds the node each admitted Workload's pod
was bound to. Nothing here knows the gateway, which imports it (gateway/kueue_engine.py).
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.admission.model import KINDS

from .connect import api_client, resumable_watch

log = logging.getLogger("jupyter_gpuaas.kubeapi.workloads")

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
PLURAL = "workloads"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"
#: The label that puts a job in a LocalQueue (Kueue's `kueue.x-k8s.io/queue-name`).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
#: Who submitted a job, and what it is, when jupyter-gpuaas made it (or a person said so):
#: labels of the job that Kueue copies onto its Workload (`labelKeysToCopy`), or the
#: Workload's own labels or annotations.
USER_KEY = "gpuaas.jupyter.org/user"
KIND_KEY = "gpuaas.jupyter.org/kind"
#: The request of ours a holder's pod was made for (its id, a label Kueue copies onto the
#: Workload): the gateway's Kueue mode binds that request to the Workload.
REQUEST_KEY = "gpuaas.jupyter.org/request"
OUTSIDE = "outside jupyter-gpuaas"
#: A pod's termination grace when its spec names none (Kubernetes' default).
DEFAULT_GRACE = 30.0
# Kueue's preemption message names the preemptor (pkg/scheduler/preemption/preemption.go):
# "Preempted to accommodate a workload (UID: <uid>, JobUID: <uid>) due to ...".
_PREEMPTOR = re.compile(r"accommodate a workload \(UID: ([^,)\s]+)")


@dataclass(frozen=True)
class WorkloadView:
    """One Workload as the gateway shows it: `state` is queued, admitted or finished."""

    uid: str
    name: str
    namespace: str
    queue: str
    user: str
    kind: str
    owner: str  # "Job train-7" ("Kind name" of the job Kueue made it for)
    owner_uid: str
    gpus: int
    priority: int
    created: float
    state: str
    flavor: str | None = None
    reason: str = ""  # QuotaReserved=False: Kueue's reason (WaitingForQuota, ...)
    message: str = ""  # ... and its message
    evicted: str = ""  # Evicted=True: why, in Kueue's words ("Preempted: ...")
    finished: str = ""  # Finished=True: how it ended ("Succeeded: ...")
    request: str = ""  # the request of a holder of ours it was made for (REQUEST_KEY)
    evicted_at: float = 0.0  # when Kueue evicted it (the Evicted condition's transition)
    preemptor: str = ""  # Preempted: the uid of the Workload it was preempted for
    grace: float = DEFAULT_GRACE  # its pods' termination grace (seconds)


def _time(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _quantity(value: Any) -> int:
    text = str(value)
    try:
        return int(float(text))
    except ValueError:
        return 0


def _is_gpu(resource: str, resources: Sequence[str]) -> bool:
    return resource in resources if resources else resource.startswith("nvidia.com/")


def _gpus(spec: Mapping[str, Any], resources: Sequence[str]) -> int:
    """GPUs the Workload asks for: count times each container's request (or limit)."""
    total = 0
    for ps in spec.get("podSets") or []:
        pod = (ps.get("template") or {}).get("spec") or {}
        each = 0
        for c in list(pod.get("containers") or []):
            res = c.get("resources") or {}
            asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
            each += sum(_quantity(v) for k, v in asked.items() if _is_gpu(k, resources))
        total += each * int(ps.get("count") or 1)
    return total


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == kind:
            return c  # type: ignore[no-any-return]
    return None


def _true(c: Mapping[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "True"


def _said(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return ""
    reason, message = str(c.get("reason") or ""), str(c.get("message") or "")
    return f"{reason}: {message}" if reason and message else reason or message


def _grace(spec: Mapping[str, Any]) -> float:
    """The longest termination grace of the Workload's pods (what an eviction gives them)."""
    graces = [
        ((ps.get("template") or {}).get("spec") or {}).get("terminationGracePeriodSeconds")
        for ps in spec.get("podSets") or []
    ]
    return max((float(g) for g in graces if g is not None), default=DEFAULT_GRACE)


def _flavor(status: Mapping[str, Any], resources: Sequence[str]) -> str | None:
    """The flavor Kueue assigned the GPUs (any resource's, when no GPU is asked for)."""
    anyone = None
    for psa in (status.get("admission") or {}).get("podSetAssignments") or []:
        for resource, flavor in (psa.get("flavors") or {}).items():
            if _is_gpu(resource, resources):
                return str(flavor)
            anyone = anyone or str(flavor)
    return anyone


def workload_view(obj: Mapping[str, Any], resources: Sequence[str] = ()) -> WorkloadView:
    """What the gateway shows of one Workload (`resources`: the GPU resources; default
    every `nvidia.com/` one)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    said = {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
    owners = meta.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    owner_kind = str(owner.get("kind") or "")
    reserved = _condition(status, "QuotaReserved")
    finished = _condition(status, "Finished")
    evicted = _condition(status, "Evicted")
    if _true(finished):
        state = "finished"
    elif _true(reserved) and status.get("admission"):
        state = "admitted"
    elif spec.get("active") is False:
        state = "finished"  # deactivated: Kueue will not admit it again
    else:
        state = "queued"
    ev: Mapping[str, Any] = evicted if evicted is not None and _true(evicted) else {}
    kind = said.get(KIND_KEY, "")
    if kind not in KINDS:  # unsaid, or not one of ours: what its owner is
        kind = "job" if owner_kind != "Pod" else "kernel"
    return WorkloadView(
        uid=str(meta.get("uid") or ""),
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        queue=str(spec.get("queueName") or ""),
        user=said.get(USER_KEY) or OUTSIDE,
        kind=kind,
        owner=f"{owner_kind} {owner.get('name')}" if owner else f"Workload {meta.get('name')}",
        owner_uid=str(owner.get("uid") or ""),
        gpus=_gpus(spec, resources),
        priority=int(spec.get("priority") or 0),
        created=_time(meta.get("creationTimestamp")),
        state=state,
        flavor=_flavor(status, resources) if state == "admitted" else None,
        reason=str(reserved.get("reason") or "") if reserved and not _true(reserved) else "",
        message=str(reserved.get("message") or "") if reserved and not _true(reserved) else "",
        evicted=_said(evicted) if _true(evicted) else "",
        finished=_said(finished) if _true(finished) or state == "finished" else "",
        request=str(said.get(REQUEST_KEY) or ""),
        evicted_at=_time(ev.get("lastTransitionTime")),
        preemptor=m.group(1) if (m := _PREEMPTOR.search(str(ev.get("message") or ""))) else "",
        grace=_grace(spec),
    )


# Kueue's reasons for not reserving quota (apis/kueue/v1beta2/workload_types.go), as our
# three kinds of wait (words.py): the quota is used, no node fits, or others go first.
QUOTA_REASONS = {
    "WaitingForQuota",
    "ExceedsMaxQuota",
    "WaitingForPreemptedWorkloads",
    "Misconfigured",
    "Suspended",
}
CAPACITY_REASONS = {"NoMatchingFlavor", "TopologyPlacementFailed"}
_UNUSED = re.compile(r"insufficient unused quota for (\S+) in flavor (\S+), (\S+) more needed")
_MAX = re.compile(r"insufficient quota for (\S+) in flavor (\S+)")


def _gpu_words(n: str) -> str:
    return f"{n} more GPU" if n == "1" else f"{n} more GPUs"


def waiting_words(queue: str, reason: str, message: str) -> tuple[str, str]:
    """(kind, sentence) of a pending Workload: kind is quota, capacity or fifo."""
    unused = _UNUSED.search(message)
    if unused is not None:
        flavor, more = unused.group(2), unused.group(3)
        return "quota", (
            f"all of {queue}'s {flavor} quota is in use: {_gpu_words(more)} must be freed first"
        )
    if _MAX.search(message) or reason == "ExceedsMaxQuota":
        return "quota", f"this asks for more than {queue} may ever use at once"
    if reason == "WaitingForPreemptedWorkloads":
        return "quota", "waiting for the workloads Kueue preempted for it to give their GPUs back"
    if reason == "Suspended":
        return "quota", f"the queue {queue} is stopped by an admin"
    if reason == "Misconfigured":
        return "quota", f"the queue {queue} is not set up in Kueue ({message or reason})"
    if reason in CAPACITY_REASONS or "does not match" in message or "untolerated" in message:
        return "capacity", "no GPU flavor of this queue has nodes that fit it"
    if reason in QUOTA_REASONS:
        return "quota", f"waiting for quota in {queue}"
    if reason == "WaitingForPodsReady":
        return "fifo", "waiting for the workloads admitted before it to start"
    return "fifo", "waiting for its turn in Kueue's queue"


# Why Kueue preempted (pkg/scheduler/preemption `HumanReadablePreemptionReasons`, in the
# Evicted condition's message), and its other reasons for evicting, in words.
_PREEMPTED_FOR = (
    ("prioritization in the ClusterQueue", "for a workload of higher priority in {queue}"),
    ("reclamation within the cohort", "because its cohort took back quota {queue} borrowed"),
    ("Fair Sharing within the cohort", "to share its cohort fairly"),
)
_EVICTED_FOR = {
    "PodsReadyTimeout": "its pods did not start in time",
    "InactiveWorkload": "it was deactivated",
    "ClusterQueueStopped": "its queue was stopped by an admin",
    "LocalQueueStopped": "its queue was stopped by an admin",
    "NodeFailures": "a node it ran on failed",
}


def eviction_words(queue: str, evicted: str) -> str:
    """A Workload's eviction (`WorkloadView.evicted`: "Reason: message") in words."""
    reason, _, message = evicted.partition(": ")
    if reason == "Preempted":
        for said, words in _PREEMPTED_FOR:
            if said in message:
                return "preempted by Kueue " + words.format(queue=queue)
        return "preempted by Kueue"
    why = _EVICTED_FOR.get(reason)
    if why is not None:
        return f"evicted by Kueue: {why}"
    return f"evicted by Kueue ({reason or 'no reason given'})"


@dataclass(frozen=True)
class WorkloadChange:
    """A Workload added or changed (`view`), or deleted (`view` as last seen, `gone`)."""

    view: WorkloadView
    gone: bool = False


@dataclass
class WorkloadWatch:
    """List and watch Workloads in `namespace` (every namespace when empty)."""

    namespace: str = ""
    resources: Sequence[str] = ()
    timeout_seconds: int = 300
    max_backoff: float = 30.0
    resource_version: str = ""
    relists: int = 0
    seen: dict[str, WorkloadView] = field(default_factory=dict)
    _client: Any = None

    async def client(self) -> Any:
        """The API client (in-cluster config, else the kubeconfig), made once."""
        if self._client is None:
            self._client = await api_client()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _objects(self) -> Any:
        from kubernetes_asyncio import client

        return client.CustomObjectsApi(await self.client())

    def _lister(self, api: Any) -> Any:
        if self.namespace:
            return api.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL)
        return api.list_cluster_custom_object, (GROUP, VERSION, PLURAL)

    async def list_workloads(self) -> list[WorkloadView]:
        """Every Workload now; the watch starts from this list's version."""
        fn, args = self._lister(await self._objects())
        data = await fn(*args)
        self.resource_version = str(data["metadata"]["resourceVersion"])
        views = [workload_view(o, self.resources) for o in data.get("items") or []]
        self.seen = {v.uid: v for v in views}
        return views

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> list[WorkloadChange]:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind in ("BOOKMARK", "ERROR"):
            return []
        view = workload_view(obj, self.resources)
        if kind == "DELETED":
            self.seen.pop(view.uid, None)
            return [WorkloadChange(view, gone=True)]
        if self.seen.get(view.uid) == view:
            return []
        self.seen[view.uid] = view
        return [WorkloadChange(view)]

    async def changes(self) -> AsyncIterator[WorkloadChange]:
        """Changes from the last list on, for as long as the caller iterates."""
        fn, args = self._lister(await self._objects())
        async for change in resumable_watch(
            "workload",
            fn,
            *args,
            version=lambda: self.resource_version,
            apply=self._apply,
            relist=self._relist,
            timeout_seconds=self.timeout_seconds,
            max_backoff=self.max_backoff,
        ):
            yield change

    async def _relist(self) -> list[WorkloadChange]:
        """After the watch's version expired: what changed and what went in the gap."""
        self.relists += 1
        before = dict(self.seen)
        changes = []
        for view in await self.list_workloads():
            if before.pop(view.uid, None) != view:
                changes.append(WorkloadChange(view))
        changes += [WorkloadChange(view, gone=True) for view in before.values()]
        return changes

    async def pending_positions(
        self, cluster_queue: str
    ) -> dict[tuple[str, str], tuple[int, int, int]]:
        """{(namespace, Workload name): (position in its ClusterQueue, position in its
        LocalQueue, pending in the ClusterQueue)}, 1-based, from Kueue's visibility API
        (its PendingWorkload names a Workload, without its uid)."""
        api = await self.client()
        data, _, _ = await api.call_api(
            f"{VISIBILITY}/clusterqueues/{cluster_queue}/pendingworkloads",
            "GET",
            query_params=[("limit", 1000)],
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=False,
        )
        items = data.get("items") or []
        out: dict[tuple[str, str], tuple[int, int, int]] = {}
        for item in items:
            meta = item.get("metadata") or {}
            out[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = (
                int(item.get("positionInClusterQueue") or 0) + 1,
                int(item.get("positionInLocalQueue") or 0) + 1,
                len(items),
            )
        return out

    async def stop(self, view: WorkloadView) -> None:
        """End a Workload's job, for a cancel or a release through the gateway's API: a
        pod of Kueue's pod integration is deleted (the pod is the job: it gets its
        termination grace, and Kueue finishes the Workload once it is gone); any other
        job's Workload is deactivated (`spec.active: false`: Kueue evicts and stops the
        job, a Job is suspended, and admits it no more), its job left for its owner to
        delete. Gone already: nothing to do."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.client()
        kind, _, name = view.owner.partition(" ")
        try:
            if kind == "Pod":
                await client.CoreV1Api(api).delete_namespaced_pod(name, view.namespace)
            else:
                objects: Any = client.CustomObjectsApi(api)  # untyped: _content_type
                await objects.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    view.namespace,
                    PLURAL,
                    view.name,
                    {"spec": {"active": False}},
                    _content_type="application/merge-patch+json",
                )
        except ApiException as e:
            if e.status != 404:
                raise

    async def pod_exists(self, namespace: str, owner: str, uid: str) -> bool:
        """Is the pod of a Workload's `owner` ("Pod <name>") still in the API server (the
        same pod: its uid), deleting or not? What ends a preempted pod's request: the pod
        object goes once its container has stopped (kubelet's last delete)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        _, _, name = owner.partition(" ")
        try:
            pod = await client.CoreV1Api(await self.client()).read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return not uid or pod.metadata.uid == uid

    async def bound_nodes(self, namespace: str, owners: set[str]) -> dict[str, str]:
        """{owner uid: node} for the pods bound to a node whose owner (a Job) or whose own
        uid (a pod of Kueue's pod integration) is one of `owners`."""
        from kubernetes_asyncio import client

        api: Any = client.CoreV1Api(await self.client())
        raw = await api.list_namespaced_pod(namespace, _preload_content=False)
        data = await raw.json()
        out: dict[str, str] = {}
        for pod in data.get("items") or []:
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                continue
            meta = pod.get("metadata") or {}
            for uid in [meta.get("uid")] + [
                o.get("uid") for o in meta.get("ownerReferences") or []
            ]:
                if uid in owners:
                    out[str(uid)] = str(node)
        return out
