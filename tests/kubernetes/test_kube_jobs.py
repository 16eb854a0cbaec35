"""Batch jobs as Kubernetes Jobs: the pure Job builder by dict equality, then the real
JobManager with KubernetesJobRunner against the real gateway and the REAL control plane of
the session (conftest.py's `cluster`): the API server, the real Job controller (one pod
per Job, backoffLimit 0), the real scheduler binding the pod to the granted KWOK Node, the
garbage collector deleting in the foreground.

No container runs: KWOK plays the kubelet. Its pod stages turn the Job's pod Running, then
Succeeded after the job's duration (KWOK's `pod-complete` stage: 1 s plus up to 5 s of
jitter, as no duration annotation is set), and the Job controller completes the Job. The
container's log is what KWOK's kubelet endpoint serves for it (a ClusterLogs object naming
a file the test writes, in the CRI log format), read by the runner through the API
server's `pods/log`, which reaches KWOK on loopback at the Node's kubelet port. The runner
talks to the API server with the token of a ServiceAccount holding only the Role of the
users' servers (`--singleuser-access kernels-and-jobs`): a verb it misses fails the test."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import wait_until
from kubefix import FLAVORS, TOKENS
from kubeutil import (
    GPU_TAINT,
    KubeOnCluster,
    home_claim,
    job_manager,
    pod_logs,
    release_home,
    service_account_kubeconfig,
)

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.jobs import exit_status, job_manifest, job_name
from jupyter_gpuaas.kubernetes.manifests import singleuser_rules

REQUEST = {
    "id": "r-1a2b",
    "tenant": "vision",
    "gpus": 1,
    "grant": {"flavor": "a100", "node": "a100-0", "devices": [1]},
}
HOME = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]
MOUNTS = [{"name": "home", "mountPath": "/home/jovyan"}]


def test_job_manifest() -> None:
    got = job_manifest(
        job_id="r-1a2b",
        user="alice",
        command=["/opt/conda/bin/python", "-u", "/home/jovyan/train.py"],
        cwd="/home/jovyan",
        image="quay.io/jupyter/pytorch-notebook:2026-11",
        request=REQUEST,
        flavors=FLAVORS,
        volumes=HOME,
        volume_mounts=MOUNTS,
    )
    labels = {
        "app.kubernetes.io/name": "jupyter-gpuaas",
        "app.kubernetes.io/component": "gpu-job",
        "gpuaas.jupyter.org/job": "r-1a2b",
    }
    assert got == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gpuaas-r-1a2b", "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "gpuaas.jupyter.org/user": "alice",
                        "gpuaas.jupyter.org/request": "r-1a2b",
                        "gpuaas.jupyter.org/tenant": "vision",
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "job",
                            "image": "quay.io/jupyter/pytorch-notebook:2026-11",
                            "command": ["/opt/conda/bin/python", "-u", "/home/jovyan/train.py"],
                            "workingDir": "/home/jovyan",
                            "env": [
                                {"name": "GPUAAS_JOB_ID", "value": "r-1a2b"},
                                {"name": "PYTHONUNBUFFERED", "value": "1"},
                                {"name": "GPUAAS_REQUEST_ID", "value": "r-1a2b"},
                                {"name": "GPUAAS_TENANT", "value": "vision"},
                                {"name": "GPUAAS_FLAVOR", "value": "a100"},
                                {"name": "GPUAAS_NODE", "value": "a100-0"},
                            ],
                            "volumeMounts": MOUNTS,
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1"},
                                "requests": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                    "volumes": HOME,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": ["a100-0"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                },
            },
        },
    }
    assert job_name("R_99/x") == "gpuaas-r-99-x"


def test_exit_status() -> None:
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}]}}
    assert exit_status({"status": {}}, None) is None
    assert exit_status({"status": {"active": 1}}, pod) is None
    assert exit_status({"status": {"succeeded": 1}}, pod) == 0
    assert exit_status({"status": {"failed": 1}}, pod) == 3
    assert exit_status({"status": {"failed": 1}}, None) == 255
    assert exit_status(None, None) == 255


A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
RUNNER = {
    "image": "quay.io/jupyter/pytorch-notebook:2026-11",
    "flavors": FLAVORS,
    "volumes": HOME,
    "volume_mounts": MOUNTS,
}


def on_cluster(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **node: Any
) -> dict[str, Any]:
    """The KWOK Node a100-0 (named as the simulated gateway names its node), Alice's home
    claim, and the runner's config: the test's namespace, the API server reached as the
    ServiceAccount of the users' servers' Role."""
    kube.add_node("a100-0", A100, {"nvidia.com/gpu": "2"}, GPU_TAINT, **node)
    home_claim(kube, tmp_path / "home")
    config = service_account_kubeconfig(
        kube, "singleuser", singleuser_rules("kernels-and-jobs"), tmp_path / "sa-kubeconfig"
    )
    from kubernetes_asyncio.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    monkeypatch.setenv("KUBECONFIG", str(config))
    return {**RUNNER, "namespace": kube.namespace}


def kget(kube: KubeOnCluster, *args: str) -> Any:
    out = kube.cluster.kubectl("get", *args, "-n", kube.namespace, "-o", "json", check=False)
    return yaml.safe_load(out) if out.strip() else None


def job_pod(kube: KubeOnCluster, name: str) -> dict[str, Any] | None:
    items = kget(kube, "pods", "-l", f"job-name={name}")["items"]
    return items[0] if items else None


@pytest.mark.asyncio
async def test_a_job_runs_as_a_kubernetes_job(
    kube: KubeOnCluster, gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submit → a Job the real Job controller runs → its pod bound by the scheduler to
    the granted node → KWOK completes it → the job succeeded with the pod's log (as KWOK
    serves it) in output.log → the grant released."""
    runner = on_cluster(kube, tmp_path, monkeypatch)
    logs = f"logs-{kube.namespace}"
    pod_logs(kube, logs, "job", ["epoch 1", "epoch 2"])
    manager = job_manager(gateway.url, tmp_path, runner)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        name = job_name(job.id)
        kjob = await wait_until(lambda: kget(kube, "job", name), timeout=30)
        assert kjob["spec"]["backoffLimit"] == 0
        (container,) = kjob["spec"]["template"]["spec"]["containers"]
        assert container["command"][-1] == str(tmp_path / "home" / "train.py")
        assert container["workingDir"] == str(tmp_path / "home")
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        # The pod is the Job controller's, bound by the scheduler to the granted node.
        pod = await wait_until(
            lambda: (p := job_pod(kube, name)) and p["spec"].get("nodeName") and p, timeout=30
        )
        assert pod["spec"]["nodeName"] == "a100-0"
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Job", name)
        # KWOK completes the pod, the Job controller the Job, the runner the job.
        await wait_until(lambda: manager.get(job.id).state == "succeeded", timeout=60)
        assert manager.get(job.id).exit_status == 0
        assert kget(kube, "job", name)["status"]["succeeded"] == 1
        assert job_pod(kube, name)["status"]["phase"] == "Succeeded"
        assert "epoch 1\nepoch 2\n" in job.log_path.read_text()
        assert "could not be read" not in job.log_path.read_text()
        root = GatewayClient(gateway.url, TOKENS["root"])

        async def released() -> bool:
            return (await root.get(job.id))["state"] == "finished"

        await wait_until(released)
    finally:
        await manager.stop()
        manager.runner.close()
        kube.cluster.kubectl("delete", "clusterlogs", logs, "--wait=false", check=False)
        release_home(kube)


@pytest.mark.asyncio
async def test_cancel_deletes_the_job_in_the_foreground(
    kube: KubeOnCluster, gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel deletes the Job with propagationPolicy Foreground: the real garbage
    collector deletes its pod before the Job goes, and the runner waits for both. The
    node is cordoned, so the pod stays Pending and KWOK cannot complete it before the
    cancel (its stages need a bound pod); the test holds the pod with a finalizer of its
    own (as a slow kubelet would) until it has seen the Job wait for it."""
    runner = on_cluster(kube, tmp_path, monkeypatch, unschedulable=True)
    manager = job_manager(gateway.url, tmp_path, runner)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        name = job_name(job.id)
        pod = await wait_until(lambda: job_pod(kube, name), timeout=30)
        await wait_until(lambda: manager.get(job.id).state == "running")
        ns, pod_name = kube.namespace, pod["metadata"]["name"]
        kube.cluster.kubectl(
            "patch", "pod", pod_name, "-n", ns, "--type=merge",
            "-p", '{"metadata": {"finalizers": ["gpuaas.jupyter.org/test-hold"]}}',
        )  # fmt: skip
        waiting: list[dict[str, Any]] = []

        def hold_then_release() -> None:
            """Off the event loop (the runner's cancel waits on it): once the Job is
            being deleted, in the foreground, while its pod is still there, let it go."""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                kjob = kget(kube, "job", name)
                meta = (kjob or {}).get("metadata") or {}
                if meta.get("deletionTimestamp") and job_pod(kube, name) is not None:
                    waiting.append(kjob)
                    break
                time.sleep(0.1)
            kube.cluster.kubectl(
                "patch", "pod", pod_name, "-n", ns, "--type=merge",
                "-p", '{"metadata": {"finalizers": null}}', check=False,
            )  # fmt: skip

        holder = threading.Thread(target=hold_then_release)
        holder.start()
        try:
            await manager.cancel(job.id)
        finally:
            await asyncio.to_thread(holder.join)
        assert manager.get(job.id).state == "cancelled"
        # The Job waited for its pod: being deleted, with the garbage collector's
        # foregroundDeletion finalizer.
        (kjob,) = waiting
        assert "foregroundDeletion" in kjob["metadata"]["finalizers"]
        # The runner's cancel returned once both were gone.
        assert kget(kube, "job", name) is None
        assert job_pod(kube, name) is None
        root = GatewayClient(gateway.url, TOKENS["root"])
        assert (await root.get(job.id))["state"] in ("finished", "cancelled")  # released
    finally:
        await manager.stop()
        manager.runner.close()
        release_home(kube)
