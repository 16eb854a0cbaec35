"""Scale-up that ends in a Node, against the Kubernetes API DOUBLE (k8s_double.py; no API
server can run here) with the real gateway (`--devices kubernetes`) and, for the spawn,
the real QueuedKubeSpawner. The test plays the cluster autoscaler: it adds the Node.

The whole path: the queue grows, the scale-up object is created, a Node joins in the
double, the request is admitted on it, the object is removed, the pod runs on that Node
with the GPUs, and stopping releases them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from k8s_double import KubernetesDouble
from kubefix import TOKEN_FILE, TOKENS, HubUser
from traitlets.config import Config

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.meta import ClusterFlavor, Settings
from jupyter_gpuaas.kubernetes.scaleup import placeholder_deployment

pytestmark = pytest.mark.asyncio

PR = ("/apis/autoscaling.x-k8s.io/v1", "provisioningrequests")
FLAVOR = {
    "node_selector": {"pool": "a100"},
    "resource": "nvidia.com/gpu",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
QUOTAS = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
    "tenants": {"vision": {"quota": {"a100": 8}}},
    "policy": {
        "idle_timeout": 0,
        "reservation_ttl": 0,
        "autoscale": {"a100": {"max_nodes": 3, "provision": False}},
    },
}
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def a100(k8s: KubernetesDouble, name: str) -> None:
    k8s.add_node(
        name, labels={"pool": "a100"}, allocatable={"nvidia.com/gpu": "2"}, taints=GPU_TAINT
    )


async def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not reached in time")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def make_cluster_gateway(k8s: KubernetesDouble, tmp_path: Path) -> Any:
    from jupyter_gpuaas.gateway.app import GatewayApp

    apps: list[Any] = []

    async def make(scaler: str) -> Any:
        a100(k8s, "a100-0")
        q = tmp_path / "quotas.yaml"
        q.write_text(yaml.safe_dump(QUOTAS))
        t = tmp_path / "tokens.yaml"
        t.write_text(yaml.safe_dump(TOKEN_FILE))
        config = Config(
            {
                "ClusterInventory": {"flavors": {"a100": FLAVOR}},
                "ClusterScaler": {
                    "namespace": "jhub",
                    "flavors": {"a100": {**FLAVOR, "gpus_per_node": 2}},
                },
            }
        )
        app = GatewayApp(
            config=config,
            ip="127.0.0.1",
            port=0,
            quotas=str(q),
            tokens=str(t),
            devices="kubernetes",
            scaler=f"jupyter_gpuaas.gateway.cluster.{scaler}",
            db_url=f"sqlite:///{tmp_path / 'gpuaas.sqlite'}",
            keepalive_interval=0.3,
            tick_interval=0.1,
            hub_service=False,
        )
        port = await app.start_server()
        app.url = f"http://127.0.0.1:{port}{app.base_url}"
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.stop_server()


async def test_a_queued_spawn_ends_in_a_node_via_a_provisioning_request(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    from jupyterhub.objects import Hub

    from jupyter_gpuaas.hub.kube import QueuedKubeSpawner

    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    held = await bob.submit("vision", "job", 2, flavor="a100")
    assert held["grant"]["node"] == "a100-0"

    user = HubUser("alice", ["vision"])
    spawner = QueuedKubeSpawner(
        user=user,
        orm_spawner=user.orm_spawner(),
        hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
        namespace="jhub",
        k8s_api_host=k8s.url,
        gateway_url=gw.url,
        flavors={"a100": FLAVOR},
        image="quay.io/jupyter/base-notebook:2026-11",
        cmd=["jupyterhub-singleuser"],
        start_timeout=20,
        refresh_interval=0.5,
        heartbeat_interval=0.5,
        api_token="hub-token-for-the-server",
    )
    spawner.user_options = {"tenant": "vision", "flavor": "a100", "gpus": 2}

    async def spawn() -> Any:
        await spawner.run_pre_spawn_hook()
        return await spawner.start()

    task = asyncio.ensure_future(spawn())
    # The queue grows: a ProvisioningRequest for one more a100 node, and its PodTemplate.
    (request,) = await until(lambda: k8s.items(*PR, "jhub"))
    assert request["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    (pod_set,) = request["spec"]["podSets"]
    assert pod_set["count"] == 1
    template = k8s.get("/api/v1", "podtemplates", pod_set["podTemplateRef"]["name"], "jhub")
    assert template is not None
    (pause,) = template["template"]["spec"]["containers"]
    assert pause["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "a100"}
    assert not k8s.pods("jhub") and not task.done()  # no Pending pod while queued

    # The cluster autoscaler provisions: the Node joins, the spawn is admitted on it.
    a100(k8s, "a100-1")
    await asyncio.wait_for(task, 30)
    assert spawner._gp["grant"]["grant"]["node"] == "a100-1"
    (pod,) = k8s.pods("jhub")
    assert pod["spec"]["nodeName"] == "a100-1"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    # ... and the scale-up objects are removed.
    await until(lambda: not k8s.items(*PR, "jhub"))
    assert not k8s.items("/api/v1", "podtemplates", "jhub")

    rid = spawner._gp["rid"]
    await spawner.stop()
    await until(lambda: not k8s.pods("jhub"))
    root = GatewayClient(gw.url, TOKENS["root"])
    assert (await root.get(rid))["state"] in ("finished", "cancelled")


async def test_placeholders_follow_the_nodes_wanted(
    k8s: KubernetesDouble, make_cluster_gateway: Any
) -> None:
    deployment = placeholder_deployment(
        ClusterFlavor("a100", 2, FLAVOR["node_selector"]), Settings(namespace="jhub")
    )
    k8s.put("/apis/apps/v1", "deployments", deployment, "jhub")
    name = deployment["metadata"]["name"]

    def replicas() -> int:
        return int(k8s.get("/apis/apps/v1", "deployments", name, "jhub")["spec"]["replicas"])

    gw = await make_cluster_gateway("PlaceholderScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    alice = GatewayClient(gw.url, TOKENS["alice"])
    await bob.submit("vision", "job", 2, flavor="a100")
    waiting = await alice.submit("vision", "job", 2, flavor="a100")
    assert waiting["state"] == "queued"
    await until(lambda: replicas() == 1)
    a100(k8s, "a100-1")

    async def admitted() -> bool:
        return (await alice.get(waiting["id"]))["state"] == "admitted"

    await until(admitted)
    await until(lambda: replicas() == 0)


async def test_a_queued_job_ends_in_a_node_and_runs_there(
    k8s: KubernetesDouble, make_cluster_gateway: Any, tmp_path: Path
) -> None:
    """A job queued for capacity: ProvisioningRequest, the Node joins, the job is
    admitted on it, becomes a Kubernetes Job whose pod runs there with the GPUs, the
    request is removed, and the job's end releases the grant."""
    from jupyter_gpuaas.jobs.manager import JobManager
    from jupyter_gpuaas.kubernetes.jobs import job_name

    gw = await make_cluster_gateway("ProvisioningRequestScaler")
    bob = GatewayClient(gw.url, TOKENS["bob"])
    await bob.submit("vision", "job", 2, flavor="a100")  # holds a100-0
    home = tmp_path / "home"
    home.mkdir()
    (home / "train.py").write_text("print('epoch 1')\n")
    runner = {
        "namespace": "jhub",
        "image": "quay.io/jupyter/pytorch-notebook:2026-11",
        "flavors": {"a100": FLAVOR},
        "refresh_interval": 0.1,
    }
    manager = JobManager(
        GatewayClient(gw.url, TOKENS["alice"]),
        str(home),
        config=Config({"KubernetesJobRunner": runner}),
        runner_class="jupyter_gpuaas.kubernetes.jobs.KubernetesJobRunner",
        state_dir=str(tmp_path / "state"),
        poll_interval=0.1,
        heartbeat_interval=0.5,
    )
    manager.load()
    await manager.start()
    try:
        job = await manager.submit(
            {"kind": "script", "path": "train.py", "gpus": 2, "tenant": "vision", "flavor": "a100"}
        )
        assert job.state == "queued"
        await until(lambda: k8s.items(*PR, "jhub"))
        assert k8s.get("/apis/batch/v1", "jobs", job_name(job.id), "jhub") is None
        a100(k8s, "a100-1")
        pod = await until(
            lambda: (p := k8s.job_pod("jhub", job_name(job.id))) and p["spec"].get("nodeName") and p
        )
        assert pod["spec"]["nodeName"] == "a100-1"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        await until(lambda: not k8s.items(*PR, "jhub"))
        await until(lambda: manager.get(job.id).state == "running")
        k8s.finish_job("jhub", job_name(job.id), 0)
        await until(lambda: manager.get(job.id).state == "succeeded")
        root = GatewayClient(gw.url, TOKENS["root"])

        async def released() -> bool:
            return (await root.get(job.id))["state"] == "finished"

        await until(released)
    finally:
        await manager.stop()
        manager.runner.close()
