"""Batch jobs as Kubernetes Jobs: `KubernetesJobRunner` for the JobManager
(`c.JobManager.runner_class = "jupyter_gpuaas.kubernetes.jobs.KubernetesJobRunner"`).

Once the gateway admits a `job` request, the job becomes a `batch/v1` Job with
`backoffLimit: 0` (a failed run is the user's to look at, not to repeat on a GPU): the same
papermill or script command as the local runner, in the user's image (the server's own,
`$JUPYTER_IMAGE`, by default) with the user's volumes mounted where the server has them,
so the working directory and the outputs (`gpu-jobs/<id>/`) are on the user's volume. Its
pod holds exactly the grant: `grant_pod` (pods.py) gives it the flavor's resource, node
selector and tolerations and pins it to the granted node. The pod's log is streamed from
the log API into `gpu-jobs/<id>/output.log`. Cancel and preemption delete the Job with
foreground propagation (its pod goes first); the manager requeues a preempted job as
with local processes.

`job_manifest()` is pure and tested by dict equality. The runner's interface is the
JobManager's synchronous one, so the runner keeps its own event loop in a thread for
kubernetes_asyncio, and answers `poll()` from a cache refreshed there (never blocking
the server's loop on the API).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from abc import ABCMeta
from collections.abc import Mapping, Sequence
from typing import Any

from traitlets import Dict, Float, List, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_gpuaas.claim import Grant
from jupyter_gpuaas.jobs.model import Job
from jupyter_gpuaas.jobs.runner import UNKNOWN_STATUS, JobRunner, LocalProcessRunner
from jupyter_gpuaas.kubeapi.connect import api_client, own_namespace

from .pods import HOSTNAME_LABEL, grant_pod, kueue_labels

COMPONENT = "gpu-job"
JOB_LABEL = "gpuaas.jupyter.org/job"


def job_name(job_id: str) -> str:
    """A DNS-1123 name for the Job of a gateway request id."""
    slug = "".join(c if c.isalnum() else "-" for c in job_id.lower()).strip("-")
    return f"gpuaas-{slug}"[:63].rstrip("-")


def job_manifest(
    *,
    job_id: str,
    user: str,
    command: Sequence[str],
    cwd: str,
    image: str,
    request: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    volumes: Sequence[Mapping[str, Any]] = (),
    volume_mounts: Sequence[Mapping[str, Any]] = (),
    env: Mapping[str, str] | None = None,
    node_label: str = HOSTNAME_LABEL,
    service_account: str = "",
    queue: str = "",
    priority_class: str = "",
    pod_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job of an admitted job request (the gateway's request object).
    `queue`: Kueue mode, the tenant's LocalQueue (and `priority_class` its
    WorkloadPriorityClass), on the Job itself, with the request's id: the Job is made
    suspended at submit (`request` is then the queued request), and Kueue's batch/job
    integration unsuspends it once it admits it (its pods carry no queue: they are the
    Job's). `pod_annotations`: the configured annotations of its pods."""
    labels = {
        "app.kubernetes.io/name": "jupyter-gpuaas",
        "app.kubernetes.io/component": COMPONENT,
        JOB_LABEL: job_name(job_id).removeprefix("gpuaas-"),
    }
    container: dict[str, Any] = {
        "name": "job",
        "image": image,
        "command": list(command),
        "workingDir": cwd,
        "env": [
            {"name": k, "value": v}
            for k, v in {
                **(env or {}),
                "GPUAAS_JOB_ID": job_id,
                "PYTHONUNBUFFERED": "1",
            }.items()
        ],
        "volumeMounts": [dict(m) for m in volume_mounts],
    }
    pod: dict[str, Any] = {
        "metadata": {
            "labels": dict(labels),
            "annotations": {**(pod_annotations or {}), "gpuaas.jupyter.org/user": user},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [dict(v) for v in volumes],
        },
    }
    if service_account:
        pod["spec"]["serviceAccountName"] = service_account
    pod = grant_pod(pod, request=request, flavors=flavors, node_label=node_label, container="job")
    spec: dict[str, Any] = {"backoffLimit": 0, "template": pod}
    if queue:
        spec["suspend"] = True  # until Kueue admits it
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(job_id),
            "labels": {
                **labels,
                **kueue_labels(
                    queue,
                    user=user,
                    kind="job",
                    priority_class=priority_class,
                    request=job_id,
                ),
            },
        },
        "spec": spec,
    }


def exit_status(job: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> int | None:
    """None while the Job runs; its container's exit code once it ended (255: unknown)."""
    if job is None:
        return UNKNOWN_STATUS
    status = job.get("status") or {}
    if not status.get("succeeded") and not status.get("failed"):
        return None
    if status.get("succeeded"):
        return 0
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode") is not None:
            return int(terminated["exitCode"])
    return UNKNOWN_STATUS


class _RunnerMeta(type(LoggingConfigurable), ABCMeta):  # type: ignore[misc]
    """Traits (traitlets' metaclass) and the JobRunner ABC together."""


class KubernetesJobRunner(LoggingConfigurable, JobRunner, metaclass=_RunnerMeta):  # type: ignore[metaclass]
    """Runs each admitted job as a Kubernetes Job on the granted node."""

    namespace = Unicode(help="Namespace of the Jobs. Default: the server pod's own.").tag(
        config=True
    )

    @default("namespace")
    def _namespace_default(self) -> str:
        return own_namespace()

    image = Unicode(
        help="The jobs' image. Default: the server's own ($JUPYTER_IMAGE, set by KubeSpawner)."
    ).tag(config=True)

    @default("image")
    def _image_default(self) -> str:
        return os.environ.get("JUPYTER_IMAGE", "")

    volumes = List(
        Dict(),
        help="""Pod volumes of the jobs, e.g. the user's home claim:
        [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}].""",
    ).tag(config=True)

    volume_mounts = List(
        Dict(),
        help="""Where they are mounted, as in the server's pod (so the working directory and
        gpu-jobs/<id>/ are the same paths): [{"name": "home", "mountPath": "/home/jovyan"}].""",
    ).tag(config=True)

    flavors = Dict(
        help="""GPU flavors, as QueuedSpawnerMixin.flavors: resource, node_selector,
        tolerations of each.""",
    ).tag(config=True)

    pin_node_label = Unicode(
        HOSTNAME_LABEL, help="Node label that pins a job's pod to the granted node."
    ).tag(config=True)

    service_account = Unicode("", help="Service account of the jobs' pods.").tag(config=True)

    refresh_interval = Float(
        1.0, min=0.05, help="Seconds between reads of the jobs' state from the API."
    ).tag(config=True)

    request_timeout = Float(30.0, min=1.0, help="Seconds one API call may take.").tag(config=True)

    pod_annotations = Dict(
        Unicode(), help="Annotations of the jobs' pods (a service mesh's, a cost label, ...)."
    ).tag(config=True)

    kueue_queue = Unicode(
        "",
        help="""Kueue mode (the gateway's --admission kueue): the LocalQueue of the Jobs,
        `{tenant}` replaced by the request's tenant (`jupyter-gpuaas kueue manifests` names
        each tenant's LocalQueue after it: `{tenant}`). The Job is then created suspended
        as soon as the request is submitted, labelled with its LocalQueue and the
        request's id; Kueue's batch/job integration unsuspends it when Kueue admits it
        (that admission is the job's grant), suspends it again when Kueue preempts it,
        and requeues it. Empty: the gateway's grant first, then the Job.""",
    ).tag(config=True)

    kueue_priority_class = Unicode(
        "",
        help="Kueue mode: the WorkloadPriorityClass of the Jobs "
        "(`kueue.x-k8s.io/priority-class`). Empty: Kueue's default.",
    ).tag(config=True)

    @property
    def queues_itself(self) -> bool:  # type: ignore[override]
        return bool(self.kueue_queue)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local = LocalProcessRunner(env={})  # its command line, nothing else
        self._jobs: dict[str, dict[str, Any]] = {}  # Job name → object, from the API
        self._pods: dict[str, dict[str, Any]] = {}  # Job name → its pod
        self._refreshed = 0.0
        self._created: dict[str, float] = {}  # job id → when its Job was created
        self._creating: dict[str, Any] = {}  # job id → the creation's future
        self._client: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gpuaas-k8s-jobs", daemon=True
        )
        self._thread.start()
        self._refresher = asyncio.run_coroutine_threadsafe(self._refresh_loop(), self._loop)

    # ----------------------------------------------------------------- plumbing

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.request_timeout)

    async def _apis(self) -> tuple[Any, Any]:
        from kubernetes_asyncio import client

        if self._client is None:
            self._client = await api_client()
        return client.BatchV1Api(self._client), client.CoreV1Api(self._client)

    async def _refresh(self) -> None:
        batch, core = await self._apis()
        # As of when the reads began: a Job created during them may be missing.
        began = time.time()
        selector = f"app.kubernetes.io/component={COMPONENT}"
        jobs = await batch.list_namespaced_job(
            self.namespace, label_selector=selector, _preload_content=False
        )
        pods = await core.list_namespaced_pod(
            self.namespace, label_selector=selector, _preload_content=False
        )
        self._jobs = {j["metadata"]["name"]: j for j in (await jobs.json())["items"]}
        by_job: dict[str, dict[str, Any]] = {}
        for p in (await pods.json())["items"]:
            owner = (p["metadata"].get("labels") or {}).get("job-name")
            if owner:
                by_job[owner] = p
        self._pods = by_job
        self._refreshed = began

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self._refresh()
            except Exception as e:
                self.log.warning("gpuaas: reading the jobs from the API failed: %s", e)
            await asyncio.sleep(self.refresh_interval)

    # ----------------------------------------------------------------- JobRunner

    def _manifest(self, job: Job, request: Mapping[str, Any], queue: str = "") -> dict[str, Any]:
        if not self.image:
            raise OSError("no image for the job: set KubernetesJobRunner.image")
        return job_manifest(
            job_id=job.id,
            user=job.user,
            command=self._local.command(job),
            cwd=job.cwd,
            image=self.image,
            request=request,
            flavors=self.flavors,
            volumes=self.volumes,
            volume_mounts=self.volume_mounts,
            node_label=self.pin_node_label,
            service_account=self.service_account,
            queue=queue,
            priority_class=self.kueue_priority_class if queue else "",
            pod_annotations=self.pod_annotations,
        )

    def enqueue(self, job: Job, request: Mapping[str, Any]) -> None:
        """Kueue mode: the Job, suspended, in the tenant's LocalQueue (blocks: the
        manager calls it off its event loop)."""
        queue = self.kueue_queue.replace("{tenant}", str(request.get("tenant") or job.tenant))
        manifest = self._manifest(job, request, queue)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)

        async def create() -> None:
            batch, _ = await self._apis()
            await batch.create_namespaced_job(self.namespace, manifest)
            self._created[job.id] = time.time()

        self._call(create())

    def start(self, job: Job, grant: Grant) -> None:
        if self.queues_itself:
            # Kueue admitted the Job made at submit and unsuspended it (again, after a
            # preemption): its new pod's log is followed.
            self._creating[job.id] = asyncio.run_coroutine_threadsafe(
                self._follow_log(job), self._loop
            )
            return
        manifest = self._manifest(job, grant.request)  # the gateway's admitted request
        job.log_path.parent.mkdir(parents=True, exist_ok=True)

        async def create() -> None:
            batch, _ = await self._apis()
            await batch.create_namespaced_job(self.namespace, manifest)
            self._created[job.id] = time.time()
            await self._follow_log(job)

        # Not awaited here: the server's event loop never waits on the API server. A Job
        # that cannot be created ends the job at the next poll, with the reason in its log.
        self._creating[job.id] = asyncio.run_coroutine_threadsafe(create(), self._loop)

    async def _follow_log(self, job: Job) -> None:
        """Stream the pod's log into output.log until the pod ends."""
        name = job_name(job.id)
        _, core = await self._apis()
        while True:
            pod = self._pods.get(name)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if pod is not None and phase in ("Running", "Succeeded", "Failed"):
                break
            if name not in self._jobs and self._refreshed > self._created.get(job.id, 0) + 1:
                return  # deleted before it ran
            await asyncio.sleep(self.refresh_interval / 2)
        try:
            resp = await core.read_namespaced_pod_log(
                pod["metadata"]["name"],
                self.namespace,
                container="job",
                follow=True,
                _preload_content=False,
            )
            with open(job.log_path, "ab") as log:
                async for chunk in resp.content.iter_any():
                    log.write(chunk)
                    log.flush()
        except Exception as e:
            with open(job.log_path, "a") as log:
                log.write(f"\n[gpuaas] the pod's log could not be read: {e}\n")

    def poll(self, job: Job) -> int | None:
        name = job_name(job.id)
        creating = self._creating.get(job.id)
        if creating is not None and job.id not in self._created:
            if not creating.done():
                return None  # being created
            error = creating.exception()
            if error is not None:
                self._creating.pop(job.id, None)
                with open(job.log_path, "a") as log:
                    log.write(f"\n[gpuaas] the Kubernetes Job could not be created: {error}\n")
                return UNKNOWN_STATUS
        if self._refreshed <= self._created.get(job.id, 0):
            return None  # not read since it was created
        if name not in self._jobs and job.id not in self._created:
            return UNKNOWN_STATUS
        return exit_status(self._jobs.get(name), self._pods.get(name))

    def settle(self, job: Job) -> int | None:
        """`poll` after reading the Jobs afresh (blocks: called off the event loop)."""
        self._call(self._refresh())
        return self.poll(job)

    def alive(self, job: Job) -> bool:
        name = job_name(job.id)
        return name in self._jobs and exit_status(self._jobs[name], self._pods.get(name)) is None

    def cancel(self, job: Job, grace: float) -> None:
        """Delete the Job, its pod first (foreground), and wait until both are gone."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        name = job_name(job.id)

        async def delete() -> None:
            batch, _ = await self._apis()
            try:
                await batch.delete_namespaced_job(
                    name,
                    self.namespace,
                    body=client.V1DeleteOptions(
                        propagation_policy="Foreground", grace_period_seconds=int(grace)
                    ),
                )
            except ApiException as e:
                if e.status != 404:
                    raise

        self._call(delete())
        deadline = time.monotonic() + grace + 10
        since = time.time()
        while time.monotonic() < deadline:
            if self._refreshed > since and name not in self._jobs and name not in self._pods:
                break
            time.sleep(0.05)
        self._created.pop(job.id, None)
        self._creating.pop(job.id, None)

    def close(self) -> None:
        self._refresher.cancel()

        async def shut() -> None:
            if self._client is not None:
                await self._client.close()

        try:
            self._call(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
