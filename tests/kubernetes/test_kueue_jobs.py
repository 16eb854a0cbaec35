"""Batch jobs through Kueue (issue 42, Kueue mode) on the REAL control plane: the real
JobManager with the KubernetesJobRunner in Kueue mode (`kueue_queue`), the real gateway
with `--admission kueue`, the real Kueue 0.19 controller and its batch/job integration,
the real Job controller and scheduler, KWOK as the kubelets.

A job's Job is made at submit, suspended, in the tenant's LocalQueue with the request's
id and the configured WorkloadPriorityClass; the job's request waits with Kueue's reason
and position while a Job from outside holds the tenant's one GPU; Kueue admits it (the
Job unsuspended, its pod bound), KWOK completes the pod and the job succeeds with its
request finished. A second, long job is admitted next, preempted by a Job of a higher
WorkloadPriorityClass (Kueue suspends it and requeues it: the manager's job is queued
again, its Job kept), admitted again once that Job goes, and cancelled by its user (the
Job deleted, the request ended). A third job, cancelled while queued, has its suspended
Job deleted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from kubefix import TOKENS
from kubeutil import KubeOnCluster, home_claim, job_manager, release_home
from test_kueue_mode import KueueQuota, admitted, field_is_id, gone, job, requests_of

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.jobs import job_name

pytestmark = pytest.mark.asyncio

HOME = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]
#: KWOK completes a Job's pod after this (its pod-complete stage): a job that runs long.
LONG = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "3600s",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "3600s",
}


def kjob(kube: KubeOnCluster, name: str) -> dict[str, Any] | None:
    out = kube.cluster.kubectl(
        "get", "job", name, "-n", kube.namespace, "-o", "json", "--ignore-not-found"
    )
    return json.loads(out) if out.strip() else None


def job_pod(kube: KubeOnCluster, name: str) -> dict[str, Any] | None:
    out = kube.cluster.kubectl("get", "pods", "-l", f"job-name={name}", "-n", kube.namespace,
                               "-o", "json")  # fmt: skip
    items = json.loads(out)["items"]
    return items[-1] if items else None


def priority_class(kube: KubeOnCluster, name: str, value: int) -> None:
    kube.cluster.apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        ]
    )


async def test_a_notebook_job_goes_through_kueue(kube: KubeOnCluster, tmp_path: Path) -> None:
    await gone(kube, "clusterqueue", "vision")  # an earlier test's, deleted without waiting
    quota = KueueQuota(kube, tmp_path, name="vision", preemption={"within_tenant": "LowerPriority"})
    tenant, flavor, node, tag = quota.tenant, quota.flavor, quota.node, quota.tag
    low, high = f"kq-low-{tag}", f"kq-high-{tag}"
    priority_class(kube, low, 0)  # as the blocker's (no class): it preempts nothing
    priority_class(kube, high, 1000)
    home_claim(kube, tmp_path / "home")
    gw = await quota.gateway(tmp_path)
    root = GatewayClient(gw.url, TOKENS["root"])
    runner = {
        "image": "quay.io/jupyter/pytorch-notebook:2026-11",
        "namespace": kube.namespace,
        "flavors": {
            flavor: {
                "node_selector": {"gpuaas.jupyter.org/flavor": flavor},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            }
        },
        "volumes": HOME,
        "volume_mounts": [{"name": "home", "mountPath": str(tmp_path / "home")}],
        "kueue_queue": "{tenant}",
        "kueue_priority_class": low,
    }
    manager = job_manager(gw.url, tmp_path, runner)
    await manager.start()
    spec = {"kind": "script", "path": "train.py", "gpus": 1, "tenant": tenant, "flavor": flavor}
    try:
        quota.run(job("blocker", tenant, seconds=3600))
        blocker = await wait_until(
            lambda: admitted(gw.url, "blocker"), timeout=60, what="the blocker admitted"
        )

        # Submitted: its Job exists at once, suspended, in the tenant's queue, named for
        # the request; the request waits with Kueue's reason and position.
        first = await manager.submit(spec)
        made = kjob(kube, job_name(first.id))
        assert made is not None and made["spec"]["suspend"] is True
        labels = made["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == tenant
        assert labels["kueue.x-k8s.io/priority-class"] == low
        assert labels["gpuaas.jupyter.org/request"] == first.id
        assert labels["gpuaas.jupyter.org/kind"] == "job"
        queued = await wait_until(
            lambda: field_is_id(
                gw.url,
                first.id,
                lambda r: r.get("position") and (r.get("waiting_for") or {}).get("kind") == "quota",
            ),
            timeout=60,
            what="the job's request with Kueue's position and reason",
        )
        assert f"all of {tenant}'s {flavor} quota is in use" in queued["waiting_for"]["message"]
        assert queued["position"]["tenant"] == 1
        await wait_until(lambda: manager.get(first.id).position is not None, timeout=30)
        assert manager.get(first.id).state == "queued"

        # A second job, long, queued behind it.
        manager.runner.pod_annotations = LONG
        second = await manager.submit(spec)
        manager.runner.pod_annotations = {}

        # The blocker goes: Kueue admits the first Job (unsuspended, its pod bound), KWOK
        # completes its pod, the job succeeds and its request finishes.
        await root.cancel(blocker["id"])
        await wait_until(
            lambda: manager.get(first.id).state == "running", timeout=60, what="first running"
        )
        request = await root.get(first.id)
        assert request["grant"]["flavor"] == flavor and request["grant"]["lease_expires"] is None
        await wait_until(
            lambda: manager.get(first.id).state == "succeeded", timeout=90, what="first done"
        )
        assert manager.get(first.id).exit_status == 0
        done = await wait_until(
            lambda: field_is_id(gw.url, first.id, lambda r: r["state"] == "finished"),
            timeout=60,
            what="the first request finished",
        )
        assert done["admitted_at"] is not None
        names = [
            n for n in (await requests_of(gw.url)) if n.startswith(f"Job {job_name(first.id)}")
        ]
        assert names == []  # the Workload drove the job's own request: none of its own

        # Then the second: admitted, running on the flavor's node.
        await wait_until(
            lambda: manager.get(second.id).state == "running", timeout=90, what="second running"
        )
        pod = await wait_until(
            lambda: (p := job_pod(kube, job_name(second.id))) and p["spec"].get("nodeName") and p,
            timeout=60,
            what="the second Job's pod bound",
        )
        assert pod["spec"]["nodeName"] == node

        # A Job of a higher WorkloadPriorityClass: Kueue preempts the second job (its Job
        # suspended, kept) and requeues it; the manager's job is queued again.
        urgent = job("urgent", tenant, seconds=3600)
        urgent["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = high
        quota.run(urgent)
        await wait_until(
            lambda: manager.get(second.id).state == "queued", timeout=60, what="second requeued"
        )
        assert manager.get(second.id).reason == (
            f"preempted by Kueue for a workload of higher priority in {tenant}; queued again"
        )
        again = await root.get(second.id)
        assert again["state"] == "queued" and again["admitted_at"] is not None
        await wait_until(
            lambda: (j := kjob(kube, job_name(second.id))) and j["spec"].get("suspend") is True,
            timeout=30,
            what="the second Job suspended by Kueue",
        )
        logged = [d.event for d in gw.arbiter.store.decisions(second.id)]
        assert logged == ["submit", "admit", "preempt", "requeue"], logged
        assert "[gpuaas] preempted: stopped, queued again" in second.log_path.read_text()

        # The urgent Job goes: Kueue admits the second again, the same Job runs again.
        kube.cluster.kubectl("delete", "job", "urgent", "-n", kube.namespace, "--wait=false")
        await wait_until(
            lambda: manager.get(second.id).state == "running", timeout=90, what="second again"
        )
        assert (await root.get(second.id))["state"] == "admitted"
        rerun = await wait_until(
            lambda: (
                (p := job_pod(kube, job_name(second.id)))
                and p["metadata"]["uid"] != pod["metadata"]["uid"]
                and p["spec"].get("nodeName")
                and p
            ),
            timeout=60,
            what="the second Job's new pod bound",
        )
        assert rerun["spec"]["nodeName"] == node
        status = kjob(kube, job_name(second.id))["status"]
        assert not status.get("failed"), status  # Kueue's stop was no failure of the job

        # A third job waits behind it; cancelled while queued, its Job goes.
        third = await manager.submit(spec)
        assert kjob(kube, job_name(third.id)) is not None
        await manager.cancel(third.id)
        assert kjob(kube, job_name(third.id)) is None
        assert (await root.get(third.id))["state"] == "cancelled"

        # The second cancelled by its user while it runs: the Job deleted, the request
        # ended.
        await manager.cancel(second.id)
        assert manager.get(second.id).state == "cancelled"
        await wait_until(
            lambda: kjob(kube, job_name(second.id)) is None, timeout=60, what="the Job deleted"
        )
        await wait_until(
            lambda: field_is_id(gw.url, second.id, lambda r: r["state"] == "finished"),
            timeout=60,
            what="the second request ended",
        )
    finally:
        await manager.stop()
        manager.runner.close()
        await gw.stop_server()
        for name in ("blocker", "urgent"):
            kube.cluster.kubectl("delete", "job", name, "-n", kube.namespace, check=False)
        kube.cluster.kubectl(
            "delete", "workloadpriorityclass", low, high, "--wait=false", check=False
        )
        quota.close()
        release_home(kube)
