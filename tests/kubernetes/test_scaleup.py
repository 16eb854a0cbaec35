"""Scale-up that ends in a Node, against the Kubernetes API DOUBLE (k8s_double.py; no API
server can run here) with the real gateway (`--devices kubernetes`) and, for the spawn,
the real QueuedKubeSpawner, for the kernel the real `gpuaas-kubernetes` provisioner and for
the job the real JobManager with the KubernetesJobRunner. The test plays the cluster
autoscaler: it adds the Node.

The whole path, for a GPU spawn, a GPU kernel and a job each: the queue grows, the
scale-up object is created, a Node joins in the double, the request is admitted on it,
the object is removed, the pod runs on that Node with the GPUs, and the end releases them.
A ProvisioningRequest stands for one capacity-blocked head: its PodTemplate asks for that
head's GPUs (1 for the kernel, 2 for the spawn), not for a whole node's; what the scaler
creates is validated against the published CRD and Kubernetes schemas (kubeschemas.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from k8s_double import KubernetesDouble
from kubefix import TOKENS
from kubeschemas import validate
from kubeutil import (
    POOL_A100,
    add_a100,
    api_verbs,
    connect,
    job_manager,
    kernel_cluster,
    kube_spawner,
    rule_verbs,
    run_cell,
)

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.gateway.cluster import BlockedHead, blocked_heads, heads_to_provision
from jupyter_gpuaas.kubeapi.meta import ClusterFlavor, Settings
from jupyter_gpuaas.kubeapi.scaleup import head_objects, placeholder_deployment
from jupyter_gpuaas.kubernetes.manifests import rules

PR = ("/apis/autoscaling.x-k8s.io/v1", "provisioningrequests")


def scale_up_request(k8s: KubernetesDouble, gpus: int) -> dict[str, Any]:
    """The one ProvisioningRequest in jhub, checked: one pod whose PodTemplate asks for
    exactly `gpus` of the flavor's resource (the blocked request's, not a node's) on the
    flavor's nodes; both valid by their schemas."""
    (request,) = k8s.items(*PR, "jhub")
    assert request["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    (pod_set,) = request["spec"]["podSets"]
    assert pod_set["count"] == 1
    template = k8s.get("/api/v1", "podtemplates", pod_set["podTemplateRef"]["name"], "jhub")
    assert template is not None
    validate(request)
    validate(template)
    spec = template["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "a100"}
    assert spec["tolerations"] == POOL_A100["tolerations"]
    (pause,) = spec["containers"]
    amount = {"nvidia.com/gpu": str(gpus)}
    assert pause["resources"] == {"requests": amount, "limits": amount}
    return request


def scale_up_removed(k8s: KubernetesDouble) -> bool:
    return not k8s.items(*PR, "jhub") and not k8s.items("/api/v1", "podtemplates", "jhub")


@pytest.mark.asyncio
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
    request = scale_up_request(k8s, gpus=2)  # the spawn's 2 GPUs
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
    assert request["metadata"]["labels"]["gpuaas.jupyter.org/request"] == rid
    await spawner.stop()
    await wait_until(lambda: not k8s.pods("jhub"), what="the server pod deleted")
    root = GatewayClient(gw.url, TOKENS["root"])
    assert (await root.get(rid))["state"] in ("finished", "cancelled")


@pytest.mark.asyncio
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
            # The queue grows: a ProvisioningRequest shaped like the kernel's request,
            # its 1 GPU (an a100 node has 2).
            await wait_until(lambda: k8s.items(*PR, "jhub"), what="a ProvisioningRequest")
            scale_up_request(k8s, gpus=1)
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_a_queued_job_ends_in_a_node_and_runs_there(
    k8s: KubernetesDouble, make_cluster_gateway: Any, tmp_path: Path
) -> None:
    """A job of 1 GPU queued for capacity: a ProvisioningRequest for that 1 GPU, the
    Node joins, the job is admitted on it, becomes a Kubernetes Job whose pod runs there
    with the GPU, the request is removed, and the job's end releases the grant."""
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
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        assert job.state == "queued"
        await wait_until(lambda: k8s.items(*PR, "jhub"), what="a ProvisioningRequest")
        scale_up_request(k8s, gpus=1)  # the job's 1 GPU
        assert k8s.get("/apis/batch/v1", "jobs", job_name(job.id), "jhub") is None
        add_a100(k8s, "a100-1")
        pod = await wait_until(
            lambda: (
                (p := k8s.job_pod("jhub", job_name(job.id))) and p["spec"].get("nodeName") and p
            ),
            what="the job's pod scheduled",
        )
        assert pod["spec"]["nodeName"] == "a100-1"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
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


# ----------------------------------------------------------------- one request per head


def requests_by_head(k8s: KubernetesDouble) -> dict[str, int]:
    """request id → GPUs its PodTemplate asks for, of every ProvisioningRequest in jhub."""
    out = {}
    for request in k8s.items(*PR, "jhub"):
        (pod_set,) = request["spec"]["podSets"]
        template = k8s.get("/api/v1", "podtemplates", pod_set["podTemplateRef"]["name"], "jhub")
        assert template is not None and pod_set["count"] == 1
        (pause,) = template["template"]["spec"]["containers"]
        gpus = int(pause["resources"]["limits"]["nvidia.com/gpu"])
        out[request["metadata"]["labels"]["gpuaas.jupyter.org/request"]] = gpus
    return out


@pytest.mark.asyncio
async def test_each_capacity_blocked_head_gets_its_own_provisioning_request(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    """Against the API DOUBLE, with the real gateway: two heads blocked by capacity (1
    and 2 GPUs, two buckets of one tenant) get one ProvisioningRequest each, shaped like
    each; a request queued behind a head of its bucket gets none; cancelling a head
    deletes its request and template (the others stay); the Node joining admits the
    other head and its objects go. The scaler uses only the verbs its Role grants."""
    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    await bob.submit("vision", "job", 2, flavor="a100")  # holds a100-0
    one = await alice.submit("vision", "job", 1, flavor="a100")
    two = await alice.submit("vision", "job", 2, flavor="a100")
    behind = await bob.submit("vision", "job", 1, flavor="a100")  # after `one`, its bucket
    assert {one["state"], two["state"], behind["state"]} == {"queued"}

    want = {one["id"]: 1, two["id"]: 2}
    await wait_until(lambda: requests_by_head(k8s) == want, what="one request per head")
    for request in k8s.items(*PR, "jhub"):
        validate(request)
    for template in k8s.items("/api/v1", "podtemplates", "jhub"):
        validate(template)

    await alice.cancel(two["id"])
    await wait_until(lambda: requests_by_head(k8s) == {one["id"]: 1}, what="two's deleted")
    assert len(k8s.items("/api/v1", "podtemplates", "jhub")) == 1  # its template went too

    add_a100(k8s, "a100-1")  # holds `one` and `behind`: 1 GPU each

    root = GatewayClient(gw.url, TOKENS["root"])

    async def admitted(rid: str) -> bool:
        return (await root.get(rid))["state"] == "admitted"

    await wait_until(lambda: admitted(one["id"]), what="one admitted")
    await wait_until(lambda: admitted(behind["id"]), what="the request behind it admitted")
    await wait_until(lambda: scale_up_removed(k8s), what="the scale-up objects removed")

    _, allowed = rules("provisioning-request")
    used = {v for v in api_verbs(k8s) if v[1] in ("provisioningrequests", "podtemplates")}
    assert used == rule_verbs(allowed)  # create, delete and the one list, nothing else


@pytest.mark.asyncio
async def test_a_new_leader_keeps_the_heads_objects_and_deletes_the_rest(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    """Against the API DOUBLE: objects an earlier gateway left behind (a request and
    template for a head since admitted, a template whose request was never made) are
    deleted at the first sync; the examples of the manifests (no request label) and
    objects of others are left alone."""
    settings = Settings(namespace="jhub")
    flavor = ClusterFlavor("a100", 2, POOL_A100["node_selector"])
    template, request = head_objects(("r-gone", "a100", 1), flavor, settings)
    half, _ = head_objects(("r-half", "a100", 2), flavor, settings)
    k8s.put("/api/v1", "podtemplates", template, "jhub")
    k8s.put(*PR, request, "jhub")
    k8s.put("/api/v1", "podtemplates", half, "jhub")
    example = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": "jupyter-gpuaas-example-a100",
            "labels": dict(template["metadata"]["labels"]),
        },
        "template": template["template"],
    }
    del example["metadata"]["labels"]["gpuaas.jupyter.org/request"]
    k8s.put("/api/v1", "podtemplates", example, "jhub")

    add_a100(k8s, "a100-0")
    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    await bob.submit("vision", "job", 2, flavor="a100")
    waiting = await bob.submit("vision", "job", 2, flavor="a100")
    await wait_until(lambda: requests_by_head(k8s) == {waiting["id"]: 2}, what="the head's own")
    names = {t["metadata"]["name"] for t in k8s.items("/api/v1", "podtemplates", "jhub")}
    assert names == {"jupyter-gpuaas-example-a100", f"jupyter-gpuaas-a100-{waiting['id']}"}


def test_a_heads_objects_ask_for_its_gpus_of_the_flavor() -> None:
    """The pure builder, by dict equality: a MIG flavor's resource, its node selector and
    tolerations, one pod of the head's GPUs, named and labelled by the head."""
    mig = ClusterFlavor(
        "mig",
        7,
        {"gpuaas.jupyter.org/flavor": "mig"},
        resource="nvidia.com/mig-1g.10gb",
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    )
    template, request = head_objects(("r-0a1b", "mig", 3), mig, Settings(namespace="lab"))
    name = "jupyter-gpuaas-mig-r-0a1b"
    labels = {
        **template["metadata"]["labels"],
        "gpuaas.jupyter.org/flavor": "mig",
        "gpuaas.jupyter.org/request": "r-0a1b",
    }
    assert template["metadata"] == {"name": name, "namespace": "lab", "labels": labels}
    amount = {"nvidia.com/mig-1g.10gb": "3"}
    assert template["template"] == {
        "metadata": {"labels": labels},
        "spec": {
            "nodeSelector": {"gpuaas.jupyter.org/flavor": "mig"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": amount, "limits": amount},
                }
            ],
        },
    }
    assert request == {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": "lab", "labels": labels},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [{"count": 1, "podTemplateRef": {"name": name}}],
        },
    }
    validate(template)
    validate(request)


def test_heads_get_requests_only_for_the_nodes_the_core_wants() -> None:
    """The heads that the wanted nodes would hold, packed as the core packs (first fit,
    widest first): never more than max_nodes allows, none wider than a node, none of a
    flavor that may not grow; the queue order is kept."""
    a = BlockedHead("r-a", "a100", 1)
    b = BlockedHead("r-b", "a100", 2)
    c = BlockedHead("r-c", "a100", 1)
    wide = BlockedHead("r-wide", "a100", 4)
    t4 = BlockedHead("r-t4", "t4", 1)
    per_node = {"a100": 2, "t4": 1}
    heads = [a, b, c, wide, t4]
    # Two new a100 nodes: b fills one, a and c share the other.
    assert heads_to_provision(heads, {"a100": 2, "t4": 0}, per_node) == [a, b, c]
    # One: the widest first (b), as the core sized it; a and c wait for the next.
    assert heads_to_provision(heads, {"a100": 1}, per_node) == [b]
    assert heads_to_provision(heads, {"a100": 0, "t4": 1}, per_node) == [t4]
    assert heads_to_provision([], {"a100": 2}, per_node) == []


def test_the_blocked_heads_are_the_requests_only_a_new_node_would_place() -> None:
    """On the real admission core: a head that quota admits but no node holds is one; the
    request queued behind it in its bucket and a head that quota stops are not. A head
    not looked at since its tenant's queue changed keeps what it was (`keep`)."""
    core = AdmissionCore(
        parse_config(
            {
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                "tenants": {"vision": {"quota": {"a100": 3}}},
                "policy": {"autoscale": {"a100": {"max_nodes": 3, "provision": False}}},
            }
        )
    )

    def submit(rid: str, gpus: int, t: float) -> None:
        core.submit(Request(rid, "vision", "ann", "job", gpus, t, flavor="a100"), t)
        core.schedule(t)

    submit("r-hold", 2, 0.0)  # a100-0 full, 1 GPU of quota left
    submit("r-one", 1, 1.0)  # quota admits it, no node holds it
    submit("r-behind", 1, 2.0)  # behind r-one in its bucket
    submit("r-two", 2, 3.0)  # quota stops it
    one = BlockedHead("r-one", "a100", 1)
    assert blocked_heads(core) == [one]
    assert core.desired_nodes() == {"a100": 2}
    # Submitted, not yet scheduled: no reason recorded for the tenant's requests.
    core.submit(Request("r-late", "vision", "ann", "job", 1, 4.0, flavor="a100"), 4.0)
    assert blocked_heads(core) == []
    assert blocked_heads(core, keep=[one, BlockedHead("r-gone", "a100", 1)]) == [one]
