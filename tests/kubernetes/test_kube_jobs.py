"""Batch jobs as Kubernetes Jobs: the pure Job builder by dict equality, then the real
JobManager with KubernetesJobRunner against the real gateway and the Kubernetes API
DOUBLE (k8s_double.py; no API server can run here). The double plays the Job controller
(one pod per Job) and the scheduler; the test plays the container: it writes the pod's
log and says how it exited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from k8s_double import KubernetesDouble
from kubefix import FLAVORS, TOKENS
from kubeutil import add_a100, api_verbs, job_manager, rule_verbs

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


def cluster(k8s: KubernetesDouble) -> None:
    add_a100(k8s, "a100-0", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})


# What the manifests' Role of the users' servers allows for Kubernetes Jobs beyond kernels.
JOB_VERBS = rule_verbs(singleuser_rules("kernels-and-jobs")) - rule_verbs(
    singleuser_rules("kernels")
)
RUNNER = {
    "namespace": "jhub",
    "image": "quay.io/jupyter/pytorch-notebook:2026-11",
    "flavors": FLAVORS,
    "volumes": HOME,
    "volume_mounts": MOUNTS,
}


@pytest.mark.asyncio
async def test_a_job_runs_as_a_kubernetes_job(
    k8s: KubernetesDouble, gateway: Any, tmp_path: Path
) -> None:
    cluster(k8s)
    manager = job_manager(gateway.url, tmp_path, RUNNER)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        name = job_name(job.id)
        kjob = await wait_until(lambda: k8s.get("/apis/batch/v1", "jobs", name, "jhub"))
        assert kjob["spec"]["backoffLimit"] == 0
        (container,) = kjob["spec"]["template"]["spec"]["containers"]
        assert container["command"][-1] == str(tmp_path / "home" / "train.py")
        assert container["workingDir"] == str(tmp_path / "home")
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        pod = await wait_until(lambda: k8s.job_pod("jhub", name))
        pod = await wait_until(
            lambda: (p := k8s.job_pod("jhub", name)) and p["spec"].get("nodeName") and p
        )
        assert pod["spec"]["nodeName"] == "a100-0"
        # The container prints and exits 0: the log reaches output.log, the job ends.
        k8s.write_log("jhub", pod["metadata"]["name"], "epoch 1\nepoch 2\n")
        await wait_until(
            lambda: "epoch 2" in (job.log_path.read_text() if job.log_path.exists() else "")
        )
        k8s.finish_job("jhub", name, 0)
        await wait_until(lambda: manager.get(job.id).state == "succeeded")
        assert manager.get(job.id).exit_status == 0
        assert "epoch 1\nepoch 2\n" in job.log_path.read_text()
        root = GatewayClient(gateway.url, TOKENS["root"])

        async def released() -> bool:
            return (await root.get(job.id))["state"] == "finished"

        await wait_until(released)
        # A job's run used what the Role of the users' servers adds for jobs
        # (`--singleuser-access kernels-and-jobs`) but the deletion, which only a cancel
        # uses (next test).
        assert api_verbs(k8s, "jhub") == JOB_VERBS - {("batch", "jobs", "delete")}
    finally:
        await manager.stop()
        manager.runner.close()


@pytest.mark.asyncio
async def test_cancel_deletes_the_job_in_the_foreground(
    k8s: KubernetesDouble, gateway: Any, tmp_path: Path
) -> None:
    cluster(k8s)
    manager = job_manager(gateway.url, tmp_path, RUNNER)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        name = job_name(job.id)
        await wait_until(lambda: (p := k8s.job_pod("jhub", name)) and p["spec"].get("nodeName"))
        await wait_until(lambda: manager.get(job.id).state == "running")
        await manager.cancel(job.id)
        assert manager.get(job.id).state == "cancelled"
        assert k8s.get("/apis/batch/v1", "jobs", name, "jhub") is None
        assert k8s.job_pod("jhub", name) is None
        body = next(b for p, b in k8s.deletes if p.endswith(f"/jobs/{name}"))
        assert body["propagationPolicy"] == "Foreground"
        root = GatewayClient(gateway.url, TOKENS["root"])
        assert (await root.get(job.id))["state"] in ("finished", "cancelled")  # released
        used = api_verbs(k8s, "jhub")
        assert ("batch", "jobs", "delete") in used and used <= JOB_VERBS
    finally:
        await manager.stop()
        manager.runner.close()
