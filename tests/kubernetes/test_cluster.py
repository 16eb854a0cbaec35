"""The real control plane itself (issue 39): the pinned release answers, KWOK's GPU nodes
carry their pools' labels, GPUs and taints, the real scheduler binds a GPU pod only where
its selector, toleration and GPU count fit, the real Job controller runs a Job whose pod
KWOK completes after the job's duration, and Kueue admits a queued Job through its
webhooks reached by URL on loopback. Pods here have no process: KWOK plays their kubelet.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import helpers
import pytest

T = TypeVar("T")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll `probe` until it returns something; fail naming `what` after `timeout`."""
    return helpers.wait_for(probe, timeout, what, interval=0.25)  # type: ignore[no-any-return]


def get(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


@pytest.fixture
def namespace(cluster: Any) -> Iterator[str]:
    name = "t-" + uuid.uuid4().hex[:10]
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def gpu_pod(name: str, ns: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "registry.example/notebook:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            **spec,
        },
    }


def test_the_api_server_is_the_pinned_release(cluster: Any) -> None:
    from gpuaas_cluster import required_version

    version = json.loads(cluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == required_version(
        "kubernetes", "k8s.io/kubernetes"
    )


def test_kwok_gpu_nodes_carry_their_pools(cluster: Any) -> None:
    from gpuaas_cluster import NODES

    nodes = {n["metadata"]["name"]: n for n in get(cluster, "nodes")["items"]}
    for name, spec in NODES.items():
        node = nodes[name]
        for key, value in spec["labels"].items():
            assert node["metadata"]["labels"][key] == value
        for resource, count in spec["resources"].items():
            assert node["status"]["allocatable"][resource] == count
        assert (node["spec"].get("taints") or []) == spec["taints"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", f"{name} is not Ready"


def _scheduled(cluster: Any, ns: str, name: str) -> dict[str, Any] | None:
    pod = get(cluster, "pod", "-n", ns, name)
    cond = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    return cond[0] if cond and (cond[0]["status"] == "True" or cond[0].get("reason")) else None


def test_the_scheduler_binds_a_gpu_pod_only_where_it_fits(cluster: Any, namespace: str) -> None:
    fits = gpu_pod(
        "fits",
        namespace,
        2,
        nodeSelector={"pool": "a100"},
        tolerations=[GPU_TOLERATION],
    )
    untolerated = gpu_pod("untolerated", namespace, 1, nodeSelector={"pool": "a100"})
    too_big = gpu_pod(
        "too-big", namespace, 3, nodeSelector={"pool": "a100"}, tolerations=[GPU_TOLERATION]
    )
    cluster.apply([fits, untolerated, too_big])
    assert (
        wait_for("fits scheduled", lambda: _scheduled(cluster, namespace, "fits"))["status"]
        == "True"
    )
    pod = wait_for(
        "fits running",
        lambda: (
            (p := get(cluster, "pod", "-n", namespace, "fits"))["status"].get("phase") == "Running"
            and p
        ),
    )
    assert pod["spec"]["nodeName"] == "gpu-a100-0"
    for name, why in (
        ("untolerated", "untolerated taint"),
        ("too-big", "Insufficient nvidia.com/gpu"),
    ):
        cond = wait_for(f"{name} refused", lambda n=name: _scheduled(cluster, namespace, n))
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert why in cond["message"]


def test_the_job_controller_runs_a_job_kwok_completes(cluster: Any, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    # The job's duration, as KWOK's pod-complete stage reads it.
                    "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": "2s",
                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "2s",
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"pool": "t4"},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }
    cluster.apply([job])

    def complete() -> dict[str, Any] | None:
        status = get(cluster, "job", "-n", namespace, "train")["status"]
        done = [c for c in status.get("conditions", []) if c["type"] in ("Complete", "Failed")]
        return status if done else None

    status = wait_for("the job finishing", complete)
    assert status.get("succeeded") == 1
    (pod,) = get(cluster, "pods", "-n", namespace, "-l", "job-name=train")["items"]
    assert (pod["spec"]["nodeName"], pod["status"]["phase"]) == ("gpu-t4-0", "Succeeded")


def test_kueue_admits_a_queued_job_by_its_quota(cluster: Any, namespace: str) -> None:
    flavor = "f-" + namespace
    queue = "cq-" + namespace
    cluster.apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"pool": "t4"}, "tolerations": [GPU_TOLERATION]},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": queue},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "gpus", "namespace": namespace},
                "spec": {"clusterQueue": queue},
            },
        ]
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "queued",
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": "gpus"},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                }
            }
        },
    }
    cluster.apply([job])
    # Kueue's mutating webhook suspended it; its admission unsuspends it and puts the
    # flavor's node labels and tolerations on the pod, which the scheduler then binds.
    workload = wait_for(
        "the workload admitted",
        lambda: next(
            (
                w
                for w in get(cluster, "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
                if w.get("status", {}).get("admission")
            ),
            None,
        ),
    )
    assigned = workload["status"]["admission"]["podSetAssignments"][0]["flavors"]
    assert assigned == {"nvidia.com/gpu": flavor}
    pods = wait_for(
        "the admitted job's pod bound",
        lambda: [
            p
            for p in get(cluster, "pods", "-n", namespace, "-l", "job-name=queued")["items"]
            if p["spec"].get("nodeName")
        ],
    )
    assert pods[0]["spec"]["nodeName"] == "gpu-t4-0"


def test_kueue_objects_read_back_in_both_served_versions(cluster: Any, namespace: str) -> None:
    """A client of v1beta1 (Kueue's deprecated version, still served) reads the objects
    written in v1beta2: through Kueue's conversion webhook for the kinds it converts
    (a ClusterQueue), by the API server alone for the others (a ResourceFlavor, a
    WorkloadPriorityClass), which a conversion webhook would refuse to convert."""
    objects = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "f-" + namespace},
            "spec": {"nodeLabels": {"pool": "t4"}},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "p-" + namespace},
            "value": 7,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "cq-" + namespace},
            "spec": {"namespaceSelector": {}},
        },
    ]
    cluster.apply(objects)
    try:
        for obj in objects:
            plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues"}.get(
                obj["kind"], "workloadpriorityclasses"
            )
            for version in ("v1beta1", "v1beta2"):
                got = get(cluster, f"{plural}.{version}.kueue.x-k8s.io", obj["metadata"]["name"])
                assert got["apiVersion"] == f"kueue.x-k8s.io/{version}", got
    finally:
        for obj in objects:
            cluster.kubectl(
                "delete", obj["kind"].lower() + ".kueue.x-k8s.io", obj["metadata"]["name"],
                "--wait=false", check=False,
            )  # fmt: skip
