"""Scale-up that ends in a Node, on the REAL control plane of the session (conftest.py's
`cluster`: kube-apiserver with the ProvisioningRequest CRD, the scheduler, the controller
manager's Deployment and Job controllers, KWOK's Nodes) with the real gateway
(`--devices kubernetes`, its inventory and scaler talking to the API server) and, for the
spawn, the real QueuedKubeSpawner, for the job the real JobManager with the
KubernetesJobRunner.

THE TEST PLAYS THE CLUSTER AUTOSCALER. Its kwok cloud provider cannot be built here (the Go
module proxy refuses every version of k8s.io/autoscaler/cluster-autoscaler with 403 "This
module version is not available"), so where the autoscaler would read a ProvisioningRequest
(or a Pending placeholder pod) and add a Node of its node group, the test adds the KWOK
Node of that flavor itself, as the kwok provider does. Everything else is real: the
ProvisioningRequest and its PodTemplate are objects of the API server (its CRD's schema
and RBAC's admission), the gateway sees the Node join through its watch, admits the head,
and the real scheduler binds the pod to that Node.

Each test has its own namespace and its own label on its Nodes (`gpuaas-test`), in the
flavor's selector and the inventory's label selector: the cluster's other Nodes stay out.

The whole path, for a GPU spawn and a job each: the queue grows, the scale-up object is
created, a Node joins, the request is admitted on it, the object is removed, the pod is
bound to that Node with the GPUs, and the end releases them. A ProvisioningRequest stands
for one capacity-blocked head: its PodTemplate asks for that head's GPUs (1 for a job of
1, 2 for the spawn), not for a whole node's.

For the GPU kernel, the kernel pod's process is a LOCAL kernel: kwok_kubelet.py's
KwokKubelet runs the pod's container command on this machine once KWOK has made the pod
Running (as test_kernels.py does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from helpers import wait_until
from kubefix import TOKENS
from kubeschemas import validate
from kubeutil import (
    GPU_TAINT,
    POOL_A100,
    SCALE_QUOTAS,
    KubeOnCluster,
    connect,
    job_manager,
    kernel_cluster,
    kube_spawner,
    run_cell,
    start_gateway,
)
from traitlets.config import Config

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.gateway.cluster import BlockedHead, blocked_heads, heads_to_provision
from jupyter_gpuaas.kubeapi.meta import ClusterFlavor, Settings
from jupyter_gpuaas.kubeapi.scaleup import head_objects, placeholder_deployment, priority_class
from jupyter_gpuaas.kubernetes.manifests import rules

PRS = "provisioningrequests.autoscaling.x-k8s.io"


class Scale:
    """One test's part of the real cluster: its namespace (`ns`), its a100 pool (the
    flavor POOL_A100 with the test's own label), and what is in the namespace."""

    def __init__(self, kube: KubeOnCluster) -> None:
        self.kube, self.ns = kube, kube.namespace
        self.mine = {"gpuaas-test": self.ns}
        self.pool = {
            **POOL_A100,
            "node_selector": {**POOL_A100["node_selector"], **self.mine},
        }

    def node(self, i: int) -> str:
        return f"{self.ns}-a100-{i}"

    def add_a100(self, i: int) -> str:
        """An a100 KWOK Node of 2 GPUs of this test's pool, tainted for GPU pods: what
        the autoscaler's kwok provider adds for the pool's node group."""
        name = self.node(i)
        self.kube.add_node(name, self.pool["node_selector"], {"nvidia.com/gpu": "2"}, GPU_TAINT)
        return name

    def occupy(self, name: str, node: str, gpus: int) -> None:
        """A pod of `gpus` GPUs the real scheduler binds to `node`: the workload of a
        grant made straight through the gateway's API (the scheduler, unlike the
        gateway, sees only pods)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "nodeSelector": {**self.pool["node_selector"], "kubernetes.io/hostname": node},
                "tolerations": POOL_A100["tolerations"],
                "containers": [
                    {
                        "name": "work",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        }
        self.kube.cluster.apply([pod])
        self.kube.cluster.kubectl(
            "wait", "--for=condition=PodScheduled", f"pod/{name}", "-n", self.ns, "--timeout=60s"
        )

    def items(self, kind: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.kube.get(kind, "-n", self.ns)["items"]
        return out

    def requests(self) -> list[dict[str, Any]]:
        return self.items(PRS)

    def template(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.kube.get("podtemplate", name, "-n", self.ns)
        return out

    def removed(self) -> bool:
        return not self.requests() and not self.items("podtemplates")


SCALE_UP = {
    "ProvisioningRequestScaler": "provisioning-request",
    "PlaceholderScaler": "placeholders",
}


def as_gateway_account(kube: KubeOnCluster, scaler: str, tmp_path: Path) -> Path:
    """A kubeconfig of a ServiceAccount bound to exactly the rules the manifests give the
    gateway for `scaler` (manifests.rules: Nodes cluster-wide, the scaler's verbs in the
    namespace), with the token the API server issues for it: the real authorizer refuses
    any verb the gateway uses beyond them."""
    ns = kube.namespace
    cluster_rules, namespaced = rules(SCALE_UP[scaler])
    subject = [{"kind": "ServiceAccount", "name": "gateway", "namespace": ns}]
    rbac = "rbac.authorization.k8s.io"
    kube.cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "gateway", "namespace": ns},
            },
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": ns},
                "rules": cluster_rules,
            },
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": ns},
                "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ns},
                "subjects": subject,
            },
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "Role",
                "metadata": {"name": "gateway", "namespace": ns},
                "rules": namespaced,
            },
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "gateway", "namespace": ns},
                "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "gateway"},
                "subjects": subject,
            },
        ]
    )
    token = kube.cluster.kubectl("create", "token", "gateway", "-n", ns).strip()
    config = yaml.safe_load(kube.cluster.kubeconfig.read_text())
    (ctx,) = [c for c in config["contexts"] if c["name"] == config["current-context"]]
    config["users"] = [{"name": "gateway", "user": {"token": token}}]
    ctx["context"]["user"] = "gateway"
    config["contexts"] = [ctx]
    path = tmp_path / "kubeconfig-gateway"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest_asyncio.fixture
async def scale(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    """`await make(scaler)`: a Scale, and the real gateway on its Nodes with a scaler of
    gateway/cluster.py (ProvisioningRequestScaler, PlaceholderScaler) acting in the
    test's namespace; quotas kubeutil.SCALE_QUOTAS (a100 autoscaled). With
    `as_account=True` the gateway talks to the API server as the ServiceAccount of
    `as_gateway_account` (RBAC enforced), else as the cluster's admin."""
    apps: list[Any] = []
    sc = Scale(kube)
    accounts: list[str] = []

    async def make(scaler: str, as_account: bool = False) -> tuple[Scale, Any]:
        if as_account:
            path = as_gateway_account(kube, scaler, tmp_path)
            accounts.append(kube.namespace)
            monkeypatch.setenv("KUBECONFIG", str(path))
            from kubernetes_asyncio.config import kube_config

            monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        per_node = SCALE_QUOTAS["flavors"]["a100"]["gpus_per_node"]
        config = {
            "ClusterInventory": {
                "flavors": {"a100": sc.pool},
                "label_selector": f"gpuaas-test={sc.ns}",
            },
            "ClusterScaler": {
                "namespace": sc.ns,
                "flavors": {"a100": {**sc.pool, "gpus_per_node": per_node}},
            },
        }
        app = await start_gateway(
            kube_tmp(tmp_path, len(apps)),
            quotas=SCALE_QUOTAS,
            devices="kubernetes",
            config=Config(config),
            scaler=f"jupyter_gpuaas.gateway.cluster.{scaler}",
        )
        apps.append(app)
        return sc, app

    try:
        yield make
    finally:
        for app in apps:
            await app.stop_server()
        for name in accounts:
            kube.cluster.kubectl(
                "delete", "clusterrolebinding,clusterrole", name, "--wait=false", check=False
            )


def kube_tmp(tmp_path: Path, i: int) -> Path:
    path = tmp_path / f"gateway-{i}"
    path.mkdir(exist_ok=True)
    return path


def scale_up_request(sc: Scale, gpus: int) -> dict[str, Any]:
    """The one ProvisioningRequest in the namespace, checked: one pod whose PodTemplate
    asks for exactly `gpus` of the flavor's resource (the blocked request's, not a node's)
    on the flavor's nodes; both accepted by the API server (schemas checked there) and by
    the published schemas."""
    (request,) = sc.requests()
    assert request["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    (pod_set,) = request["spec"]["podSets"]
    assert pod_set["count"] == 1
    template = sc.template(pod_set["podTemplateRef"]["name"])
    validate(request)
    validate(template)
    spec = template["template"]["spec"]
    assert spec["nodeSelector"] == sc.pool["node_selector"]
    assert spec["tolerations"] == POOL_A100["tolerations"]
    (pause,) = spec["containers"]
    amount = {"nvidia.com/gpu": str(gpus)}
    assert pause["resources"] == {"requests": amount, "limits": amount}
    return request


@pytest.mark.asyncio
async def test_a_queued_spawn_ends_in_a_node_via_a_provisioning_request(
    kube: KubeOnCluster, scale: Any
) -> None:
    sc, gw = await scale("ProvisioningRequestScaler")
    a0 = sc.add_a100(0)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    held = await wait_until(
        lambda: _admitted_on(bob, a0), timeout=30, what="bob's job admitted on a100-0"
    )
    assert held["grant"]["node"] == a0

    spawner = kube_spawner(
        kube.url, gw.url, namespace=sc.ns, flavors={"a100": sc.pool}, start_timeout=60
    )
    spawner.user_options = {"tenant": "vision", "flavor": "a100", "gpus": 2}

    async def spawn() -> Any:
        await spawner.run_pre_spawn_hook()
        return await spawner.start()

    task = asyncio.ensure_future(spawn())
    try:
        # The queue grows: a ProvisioningRequest for one more a100 node, and its PodTemplate.
        await wait_until(sc.requests, timeout=30, what="a ProvisioningRequest")
        request = scale_up_request(sc, gpus=2)  # the spawn's 2 GPUs
        assert not kube.pods() and not task.done()  # no Pending pod while queued

        # The autoscaler's part (see the module docstring): the Node of the flavor joins,
        # the spawn is admitted on it, and the real scheduler binds the pod there.
        a1 = sc.add_a100(1)
        await asyncio.wait_for(task, 90)
        assert spawner._gpu_claim.grant.node == a1
        (pod,) = kube.pods()
        assert pod["spec"]["nodeName"] == a1
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        # ... and the scale-up objects are removed.
        await wait_until(sc.removed, timeout=30, what="the scale-up objects removed")

        rid = spawner._rid
        assert request["metadata"]["labels"]["gpuaas.jupyter.org/request"] == rid
        await spawner.stop()
        await wait_until(lambda: not kube.pods(), timeout=60, what="the server pod deleted")
        root = GatewayClient(gw.url, TOKENS["root"])
        assert (await root.get(rid))["state"] in ("finished", "cancelled")
    finally:
        if not task.done():
            task.cancel()


async def _admitted_on(client: GatewayClient, node: str) -> Any:
    """Submit once a Node is in the gateway's inventory; the admitted request."""
    nodes = [n["name"] for n in (await client.devices())["nodes"]]
    if node not in nodes:
        return None
    req = await client.submit("vision", "job", 2, flavor="a100")
    assert req["state"] == "admitted", req
    return req


@pytest.mark.asyncio
async def test_a_queued_gpu_kernel_ends_in_a_node_and_runs_in_its_own_pod_there(
    kube: KubeOnCluster, scale: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU kernel (the real `gpuaas-kubernetes` provisioner under jupyter_client's
    AsyncKernelManager) queued for capacity while the user's server pod runs CPU-only:
    a ProvisioningRequest for the kernel's 1 GPU, the Node joins (the autoscaler's part,
    played by the test: see the module docstring), the kernel is admitted on it, its pod
    is bound there by the real scheduler with the GPU, the request is removed, a cell
    runs, and shutdown deletes the pod and releases the grant. The kernel pod's process
    is a LOCAL kernel (kwok_kubelet.py's KwokKubelet runs the pod's command,
    gateway_provisioners' launcher, once KWOK has made the pod Running). The gateway and
    the provisioner use the cluster's admin kubeconfig: the provisioner's RBAC is
    test_kernels.py's, the gateway's the other tests' here."""
    sc, gw = await scale("ProvisioningRequestScaler")
    a0 = sc.add_a100(0)
    cpu = f"{sc.ns}-cpu-0"
    server_node = {**sc.mine, "gpuaas-role": "cpu"}
    kube.add_node(cpu, server_node)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    held = await wait_until(
        lambda: _admitted_on(bob, a0), timeout=30, what="bob's job admitted on a100-0"
    )
    assert held["grant"]["node"] == a0

    async with kernel_cluster(
        kube, gw.url, tmp_path, monkeypatch, {"a100": sc.pool}, server_node
    ) as cl:
        km = cl.kernel_manager()
        start = asyncio.ensure_future(km.start_kernel(cwd=str(cl.home / "proj")))
        try:
            record = await wait_until(
                lambda: (
                    (r := getattr(km.provisioner, "record", None)) and r.state == "queued" and r
                ),
                timeout=30,
                what="the kernel queued",
            )
            # The queue grows: a ProvisioningRequest shaped like the kernel's request,
            # its 1 GPU (an a100 node has 2).
            await wait_until(sc.requests, timeout=30, what="a ProvisioningRequest")
            request = scale_up_request(sc, gpus=1)
            assert cl.pod(km) is None and not start.done()  # no kernel pod while queued

            # The autoscaler's part: the Node joins, the kernel is admitted on it.
            a1 = sc.add_a100(1)
            await asyncio.wait_for(start, 90)
            rid = str(record.request_id)
            assert request["metadata"]["labels"]["gpuaas.jupyter.org/request"] == rid
            assert (await cl.request(rid))["grant"]["node"] == a1
            pod = cl.pod(km)
            assert pod is not None and pod["spec"]["nodeName"] == a1  # the scheduler's
            assert pod["status"]["phase"] == "Running"
            (container,) = pod["spec"]["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
            assert pod["spec"]["nodeSelector"] == sc.pool["node_selector"]
            # The user's server pod stays CPU-only, where it was.
            server = cl.get("jupyter-alice")
            assert server is not None and server["spec"]["nodeName"] == cpu
            await wait_until(sc.removed, timeout=30, what="the scale-up objects removed")

            client = await connect(km)
            got = await run_cell(client, "import os; print(os.environ['GPUAAS_NODE'])")
            assert got["out"] == f"{a1}\n"
            client.stop_channels()

            # Shutdown: the pod goes, the grant is released.
            await km.shutdown_kernel()
            assert cl.pod(km) is None
            await wait_until(lambda: not cl.kubelet.procs, timeout=30, what="the kernel gone")
            assert (await cl.request(rid))["state"] in ("finished", "cancelled")
            assert record.state == "released"
        finally:
            if not start.done():
                start.cancel()
            if km.has_kernel:
                await km.shutdown_kernel(now=True)


@pytest.mark.asyncio
async def test_placeholders_follow_the_nodes_wanted(kube: KubeOnCluster, scale: Any) -> None:
    """The placeholder Deployment of the manifests on the real API server, scaled by the
    gateway through its scale subresource: its pod, made by the real Deployment
    controller, stays Pending (the real scheduler finds no a100 Node of this pool with
    room) until the autoscaler's part adds one; the job queued is then admitted and the
    placeholder scaled back to none. The gateway runs as the ServiceAccount the
    manifests' rules bind (as_gateway_account)."""
    sc, gw = await scale("PlaceholderScaler", as_account=True)
    settings = Settings(namespace=sc.ns)
    deployment = placeholder_deployment(
        ClusterFlavor(
            "a100", 2, sc.pool["node_selector"], tolerations=tuple(POOL_A100["tolerations"])
        ),
        settings,
    )
    kube.cluster.apply([priority_class(settings), deployment])
    name = deployment["metadata"]["name"]

    def replicas() -> int:
        return int(kube.get("deployment", name, "-n", sc.ns)["spec"]["replicas"])

    a0 = sc.add_a100(0)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    await wait_until(lambda: _admitted_on(bob, a0), timeout=30, what="bob admitted on a100-0")
    sc.occupy("bobs-job", a0, 2)  # what bob's grant runs there
    waiting = await alice.submit("vision", "job", 2, flavor="a100")
    assert waiting["state"] == "queued"
    await wait_until(lambda: replicas() == 1, timeout=30, what="one placeholder")

    def unschedulable() -> Any:
        for pod in kube.pods():
            if not pod["metadata"]["name"].startswith(name):
                continue
            for c in pod["status"].get("conditions") or []:
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return pod
        return None

    pending = await wait_until(unschedulable, timeout=30, what="the placeholder Pending")
    assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")
    assert pending["spec"]["priorityClassName"] == "jupyter-gpuaas-placeholder"

    sc.add_a100(1)

    async def admitted() -> bool:
        return (await alice.get(waiting["id"]))["state"] == "admitted"

    await wait_until(admitted, timeout=30, what="the job admitted")
    await wait_until(lambda: replicas() == 0, timeout=30, what="no placeholder")


@pytest.mark.asyncio
async def test_a_queued_job_ends_in_a_node_and_runs_there(
    kube: KubeOnCluster, scale: Any, tmp_path: Path
) -> None:
    """A job of 1 GPU queued for capacity: a ProvisioningRequest for that 1 GPU, the
    Node joins, the job is admitted on it, becomes a Kubernetes Job whose pod the real
    Job controller makes and the real scheduler binds there with the GPU, the request is
    removed, KWOK completes the pod (its pod-complete stage) and the job's end releases
    the grant."""
    from jupyter_gpuaas.kubernetes.jobs import job_name

    sc, gw = await scale("ProvisioningRequestScaler")
    a0 = sc.add_a100(0)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    await wait_until(lambda: _admitted_on(bob, a0), timeout=30, what="bob holds a100-0")
    runner = {
        "namespace": sc.ns,
        "image": "quay.io/jupyter/pytorch-notebook:2026-11",
        "flavors": {"a100": sc.pool},
    }
    manager = job_manager(gw.url, tmp_path, runner)
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 1, "tenant": "vision", "flavor": "a100"}
        )
        assert job.state == "queued"
        await wait_until(sc.requests, timeout=30, what="a ProvisioningRequest")
        scale_up_request(sc, gpus=1)  # the job's 1 GPU
        assert not sc.items("jobs")
        a1 = sc.add_a100(1)

        def job_pod() -> Any:
            for p in kube.pods():
                if p["metadata"].get("labels", {}).get("job-name") == job_name(job.id):
                    return p if p["spec"].get("nodeName") else None
            return None

        pod = await wait_until(job_pod, timeout=60, what="the job's pod scheduled")
        assert pod["spec"]["nodeName"] == a1
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        await wait_until(sc.removed, timeout=30, what="the scale-up objects removed")
        await wait_until(
            lambda: manager.get(job.id).state == "succeeded", timeout=60, what="succeeded"
        )
        root = GatewayClient(gw.url, TOKENS["root"])

        async def released() -> bool:
            return (await root.get(job.id))["state"] == "finished"

        await wait_until(released, timeout=30, what="the grant released")
    finally:
        await manager.stop()
        manager.runner.close()


# ----------------------------------------------------------------- one request per head


def requests_by_head(sc: Scale) -> dict[str, int]:
    """request id → GPUs its PodTemplate asks for, of every ProvisioningRequest there."""
    out = {}
    for request in sc.requests():
        (pod_set,) = request["spec"]["podSets"]
        template = sc.template(pod_set["podTemplateRef"]["name"])
        assert pod_set["count"] == 1
        (pause,) = template["template"]["spec"]["containers"]
        gpus = int(pause["resources"]["limits"]["nvidia.com/gpu"])
        out[request["metadata"]["labels"]["gpuaas.jupyter.org/request"]] = gpus
    return out


@pytest.mark.asyncio
async def test_each_capacity_blocked_head_gets_its_own_provisioning_request(
    kube: KubeOnCluster, scale: Any
) -> None:
    """On the real API server, with the real gateway: two heads blocked by capacity (1
    and 2 GPUs, two buckets of one tenant) get one ProvisioningRequest each, shaped like
    each; a request queued behind a head of its bucket gets none; cancelling a head
    deletes its request and template (the others stay); the Node joining admits the
    other head and its objects go. The gateway runs as the ServiceAccount the manifests'
    rules bind (as_gateway_account): a verb beyond them is refused by the API server."""
    sc, gw = await scale("ProvisioningRequestScaler", as_account=True)
    a0 = sc.add_a100(0)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    await wait_until(lambda: _admitted_on(bob, a0), timeout=30, what="bob holds a100-0")
    one = await alice.submit("vision", "job", 1, flavor="a100")
    two = await alice.submit("vision", "job", 2, flavor="a100")
    behind = await bob.submit("vision", "job", 1, flavor="a100")  # after `one`, its bucket
    assert {one["state"], two["state"], behind["state"]} == {"queued"}

    want = {one["id"]: 1, two["id"]: 2}
    await wait_until(lambda: requests_by_head(sc) == want, timeout=30, what="one per head")
    for request in sc.requests():
        validate(request)
    for template in sc.items("podtemplates"):
        validate(template)

    await alice.cancel(two["id"])
    await wait_until(
        lambda: requests_by_head(sc) == {one["id"]: 1}, timeout=30, what="two's deleted"
    )
    assert len(sc.items("podtemplates")) == 1  # its template went too

    sc.add_a100(1)  # holds `one` and `behind`: 1 GPU each

    root = GatewayClient(gw.url, TOKENS["root"])

    async def admitted(rid: str) -> bool:
        return (await root.get(rid))["state"] == "admitted"

    await wait_until(lambda: admitted(one["id"]), timeout=30, what="one admitted")
    await wait_until(lambda: admitted(behind["id"]), timeout=30, what="the one behind admitted")
    await wait_until(sc.removed, timeout=30, what="the scale-up objects removed")


@pytest.mark.asyncio
async def test_a_new_leader_keeps_the_heads_objects_and_deletes_the_rest(
    kube: KubeOnCluster, scale: Any
) -> None:
    """On the real API server: objects an earlier gateway left behind (a request and
    template for a head since admitted, a template whose request was never made) are
    deleted at the first sync; the examples of the manifests (no request label) are left
    alone."""
    sc = Scale(kube)
    settings = Settings(namespace=sc.ns)
    flavor = ClusterFlavor("a100", 2, sc.pool["node_selector"])
    template, request = head_objects(("r-gone", "a100", 1), flavor, settings)
    half, _ = head_objects(("r-half", "a100", 2), flavor, settings)
    example = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": "jupyter-gpuaas-example-a100",
            "namespace": sc.ns,
            "labels": dict(template["metadata"]["labels"]),
        },
        "template": template["template"],
    }
    del example["metadata"]["labels"]["gpuaas.jupyter.org/request"]
    kube.cluster.apply([template, request, half, example])

    sc, gw = await scale("ProvisioningRequestScaler")
    a0 = sc.add_a100(0)
    bob = GatewayClient(gw.url, TOKENS["bob"])
    await wait_until(lambda: _admitted_on(bob, a0), timeout=30, what="bob holds a100-0")
    waiting = await bob.submit("vision", "job", 2, flavor="a100")
    await wait_until(
        lambda: requests_by_head(sc) == {waiting["id"]: 2}, timeout=30, what="the head's own"
    )
    names = {t["metadata"]["name"] for t in sc.items("podtemplates")}
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
