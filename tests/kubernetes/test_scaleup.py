"""Scale-up that ends in a Node, against the Kubernetes API DOUBLE (k8s_double.py; no API
server can run here) with the real gateway (`--devices kubernetes`) and, for the spawn,
the real QueuedKubeSpawner, for the kernel the real `gpuaas-kubernetes` provisioner and for
the job the real JobManager with the KubernetesJobRunner. The test plays the cluster
autoscaler: it adds the Node.

The whole path, for a GPU spawn, a GPU kernel and a job each: the queue grows, the
scale-up object is created, a Node joins in the double, the request is admitted on it,
the object is removed, the pod runs on that Node with the GPUs, and the end releases them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from k8s_double import KubernetesDouble
from kubefix import TOKENS
from kubeutil import (
    POOL_A100,
    add_a100,
    connect,
    job_manager,
    kernel_cluster,
    kube_spawner,
    run_cell,
)

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.meta import ClusterFlavor, Settings
from jupyter_gpuaas.kubernetes.scaleup import placeholder_deployment

pytestmark = pytest.mark.asyncio

PR = ("/apis/autoscaling.x-k8s.io/v1", "provisioningrequests")


def scale_up_request(k8s: KubernetesDouble) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one ProvisioningRequest in jhub and the pause container of its PodTemplate."""
    (request,) = k8s.items(*PR, "jhub")
    assert request["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    (pod_set,) = request["spec"]["podSets"]
    assert pod_set["count"] == 1
    template = k8s.get("/api/v1", "podtemplates", pod_set["podTemplateRef"]["name"], "jhub")
    assert template is not None
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "a100"}
    (pause,) = template["template"]["spec"]["containers"]
    return request, pause


def scale_up_removed(k8s: KubernetesDouble) -> bool:
    return not k8s.items(*PR, "jhub") and not k8s.items("/api/v1", "podtemplates", "jhub")


async def test_a_queued_spawn_ends_in_a_node_via_a_provisioning_request(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    held = await bob.submit("vision", "job", 2, flavor="a100")
    assert held["grant"]["node"] == "a100-0"

    spawner = kube_spawner(k8s.url, gw.url, flavors={"a100": POOL_A100})
    spawner.user_options = {"tenant": "vision", "flavor": "a100", "gpus": 2}

    async def spawn() -> Any:
        await spawner.run_pre_spawn_hook()
        return await spawner.start()

    task = asyncio.ensure_future(spawn())
    # The queue grows: a ProvisioningRequest for one more a100 node, and its PodTemplate.
    await wait_until(lambda: k8s.items(*PR, "jhub"), what="a ProvisioningRequest")
    _, pause = scale_up_request(k8s)
    assert pause["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert not k8s.pods("jhub") and not task.done()  # no Pending pod while queued

    # The cluster autoscaler provisions: the Node joins, the spawn is admitted on it.
    add_a100(k8s, "a100-1")
    await asyncio.wait_for(task, 30)
    assert spawner._gp["grant"]["grant"]["node"] == "a100-1"
    (pod,) = k8s.pods("jhub")
    assert pod["spec"]["nodeName"] == "a100-1"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    # ... and the scale-up objects are removed.
    await wait_until(lambda: scale_up_removed(k8s), what="the scale-up objects removed")

    rid = spawner._gp["rid"]
    await spawner.stop()
    await wait_until(lambda: not k8s.pods("jhub"), what="the server pod deleted")
    root = GatewayClient(gw.url, TOKENS["root"])
    assert (await root.get(rid))["state"] in ("finished", "cancelled")


async def test_a_queued_gpu_kernel_ends_in_a_node_and_runs_in_its_own_pod_there(
    k8s: KubernetesDouble,
    make_cluster_gateway: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU kernel (the real `gpuaas-kubernetes` provisioner under jupyter_client's
    AsyncKernelManager) queued for capacity while the user's server pod runs CPU-only:
    a ProvisioningRequest, the Node joins, the kernel is admitted on it and its pod runs
    there with the GPU, the request is removed, and shutdown deletes the pod and releases
    the grant. The kernel pod's process is played by a LOCAL kernel (kubelet.py's
    LocalKubelet runs the pod's command, gateway_provisioners' launcher, on this machine)."""
    from jupyter_gpuaas.server.kernels import current_table

    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    held = await bob.submit("vision", "job", 2, flavor="a100")
    assert held["grant"]["node"] == "a100-0"

    async with kernel_cluster(k8s, gw.url, tmp_path, monkeypatch, {"a100": POOL_A100}) as cl:
        km = cl.kernel_manager()
        start = asyncio.ensure_future(km.start_kernel(cwd=str(cl.home / "proj")))
        try:
            record = await wait_until(
                lambda: (r := current_table().get(str(km.kernel_id))) and r.state == "queued" and r,
                what="the kernel queued",
            )
            # The queue grows: a ProvisioningRequest for one more a100 node (the scaler
            # asks for whole nodes of the flavor: 2 GPUs, though the kernel needs 1).
            await wait_until(lambda: k8s.items(*PR, "jhub"), what="a ProvisioningRequest")
            _, pause = scale_up_request(k8s)
            assert pause["resources"]["limits"] == {"nvidia.com/gpu": "2"}
            assert cl.pod(km) is None and not start.done()  # no kernel pod while queued

            # The cluster autoscaler provisions: the Node joins, the kernel is admitted.
            add_a100(k8s, "a100-1")
            await asyncio.wait_for(start, 90)
            rid = str(record.request_id)
            assert (await cl.request(rid))["grant"]["node"] == "a100-1"
            pod = cl.pod(km)
            assert pod is not None and pod["spec"]["nodeName"] == "a100-1"
            (container,) = pod["spec"]["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
            assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
            # The user's server pod stays CPU-only, where it was.
            server = k8s.get("/api/v1", "pods", "jupyter-alice", "jhub")
            assert server is not None and server["spec"]["nodeName"] == "cpu-0"
            await wait_until(lambda: scale_up_removed(k8s), what="the scale-up objects removed")

            client = await connect(km)
            got = await run_cell(client, "import os; print(os.environ['GPUAAS_NODE'])")
            assert got["out"] == "a100-1\n"
            client.stop_channels()

            # Shutdown: the pod goes, the grant is released.
            await km.shutdown_kernel()
            assert cl.pod(km) is None
            assert not cl.kubelet.procs
            assert (await cl.request(rid))["state"] in ("finished", "cancelled")
            assert record.state == "released"
        finally:
            if not start.done():
                start.cancel()
            if km.has_kernel:
                await km.shutdown_kernel(now=True)


async def test_placeholders_follow_the_nodes_wanted(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    deployment = placeholder_deployment(
        ClusterFlavor("a100", 2, POOL_A100["node_selector"]), Settings(namespace="jhub")
    )
    k8s.put("/apis/apps/v1", "deployments", deployment, "jhub")
    name = deployment["metadata"]["name"]

    def replicas() -> int:
        return int(k8s.get("/apis/apps/v1", "deployments", name, "jhub")["spec"]["replicas"])

    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("PlaceholderScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    await bob.submit("vision", "job", 2, flavor="a100")
    waiting = await alice.submit("vision", "job", 2, flavor="a100")
    assert waiting["state"] == "queued"
    await wait_until(lambda: replicas() == 1, what="one placeholder")
    add_a100(k8s, "a100-1")

    async def admitted() -> bool:
        return (await alice.get(waiting["id"]))["state"] == "admitted"

    await wait_until(admitted, what="the job admitted")
    await wait_until(lambda: replicas() == 0, what="no placeholder")


async def test_a_queued_job_ends_in_a_node_and_runs_there(
    k8s: KubernetesDouble, make_cluster_gateway: Any, tmp_path: Path
) -> None:
    """A job queued for capacity: ProvisioningRequest, the Node joins, the job is
    admitted on it, becomes a Kubernetes Job whose pod runs there with the GPUs, the
    request is removed, and the job's end releases the grant."""
    from jupyter_gpuaas.kubernetes.jobs import job_name

    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    await bob.submit("vision", "job", 2, flavor="a100")  # holds a100-0
    runner = {
        "namespace": "jhub",
        "image": "quay.io/jupyter/pytorch-notebook:2026-11",
        "flavors": {"a100": POOL_A100},
    }
    manager = job_manager(gw.url, tmp_path, runner)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 2, "tenant": "vision", "flavor": "a100"}
        )
        assert job.state == "queued"
        await wait_until(lambda: k8s.items(*PR, "jhub"), what="a ProvisioningRequest")
        _, pause = scale_up_request(k8s)
        assert pause["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert k8s.get("/apis/batch/v1", "jobs", job_name(job.id), "jhub") is None
        add_a100(k8s, "a100-1")
        pod = await wait_until(
            lambda: (
                (p := k8s.job_pod("jhub", job_name(job.id))) and p["spec"].get("nodeName") and p
            ),
            what="the job's pod scheduled",
        )
        assert pod["spec"]["nodeName"] == "a100-1"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        await wait_until(lambda: scale_up_removed(k8s), what="the scale-up objects removed")
        await wait_until(lambda: manager.get(job.id).state == "running", what="the job running")
        k8s.finish_job("jhub", job_name(job.id), 0)
        await wait_until(lambda: manager.get(job.id).state == "succeeded", what="succeeded")
        root = GatewayClient(gw.url, TOKENS["root"])

        async def released() -> bool:
            return (await root.get(job.id))["state"] == "finished"

        await wait_until(released, what="the grant released")
    finally:
        await manager.stop()
        manager.runner.close()
