"""Helpers the Kubernetes test modules share (a module of its own: `conftest` is ambiguous
when tests/hub runs in the same session; the fixtures built on these are in conftest.py).

- `KubeOnCluster`: the session's real cluster (conftest.py's `cluster`) as one test uses it;
- `start_gateway`: the real gateway app in-process on a loopback port, with simulated
  devices or the cluster inventory (`--devices kubernetes`) of the real API server;
- `kube_spawner`: the real QueuedKubeSpawner on the API server and a gateway;
- `job_manager`: the real JobManager with the KubernetesJobRunner;
- `KernelCluster` / `kernel_cluster`: what a GPU kernel in its own pod needs around the
  real `gpuaas-kubernetes` provisioner: the user's home claim and server pod on the real
  cluster, a `--kubernetes` kernelspec, gateway_provisioners' response address on a free
  port, and kwok_kubelet.py's KwokKubelet, which runs the kernel pod's container as a
  LOCAL process once KWOK has made the pod Running;
- `service_account_kubeconfig`, `pod_logs`, `home_claim`: ServiceAccount tokens, pod logs
  served by KWOK, and a Bound home claim on the real cluster.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from gwutil import start_gateway_app
from helpers import free_port
from kubefix import TOKEN_FILE, TOKENS, HubUser
from kwok_kubelet import KwokKubelet
from traitlets.config import Config

from jupyter_gpuaas.client import GatewayClient

GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
# A node pool of a100 nodes (a pool label, the GPU taint tolerated): the flavor of the
# scale-up tests, as the gateway's inventory, its scaler, the spawner, the kernel
# provisioner and the job runner all name it.
POOL_A100 = {
    "node_selector": {"pool": "a100"},
    "resource": "nvidia.com/gpu",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
# One a100 node of 2 GPUs at start; the autoscaler may add two more.
SCALE_QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
    "tenants": {"vision": {"quota": {"a100": 8}}},
    "policy": {
        "idle_timeout": 0,
        "reservation_ttl": 0,
        "autoscale": {"a100": {"max_nodes": 3, "provision": False}},
    },
}


class KubeOnCluster:
    """The session's REAL cluster (conftest.py's `cluster`) as one test uses it: the API
    server's URL, a namespace of its own (`namespace`), its pods, and KWOK Nodes it adds
    (`add_node`), which leave with the test (`close`)."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.url: str = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"][
            "server"
        ]
        self._nodes: list[str] = []

    def get(self, *args: str) -> Any:
        import json

        return json.loads(self.cluster.kubectl("get", *args, "-o", "json"))

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("pods", "-n", namespace or self.namespace)["items"]
        return items

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        unschedulable: bool = False,
    ) -> None:
        """A Node KWOK plays, Ready once KWOK has seen it."""
        from gpuaas_cluster import kwok_node

        node = kwok_node(name, dict(labels or {}), dict(allocatable or {}), list(taints or []))
        node["spec"]["unschedulable"] = unschedulable
        self._nodes.append(name)
        self.cluster.apply([node])
        self.cluster.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")

    def left_behind(self) -> set[str]:
        """What the namespace holds beyond what Kubernetes puts in every one."""
        names = self.cluster.kubectl(
            "get",
            "pods,services,secrets,configmaps,persistentvolumeclaims,serviceaccounts",
            "-n",
            self.namespace,
            "-o",
            "name",
        ).split()
        return set(names) - {"configmap/kube-root-ca.crt", "serviceaccount/default"}

    def close(self) -> None:
        for name in self._nodes:
            self.cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


async def start_gateway(
    tmp_path: Path,
    *,
    quotas: Mapping[str, Any],
    devices: str,
    config: Config | None = None,
    scaler: str | None = None,
    db_url: str | None = None,
) -> Any:
    """The real gateway (GatewayApp) on a free loopback port (tests/gwutil.py's
    `start_gateway_app`, with this directory's tokens); `app.url` is its base URL. Stop it
    with `await app.stop_server()`."""
    kw: dict[str, Any] = {} if scaler is None else {"scaler": scaler}
    return await start_gateway_app(
        tmp_path, db_url, quotas=quotas, tokens=TOKEN_FILE, devices=devices,
        config=config or Config(), **kw,
    )  # fmt: skip


def kube_spawner(k8s_url: str, gateway_url: str, user: str = "alice", **traits: Any) -> Any:
    """The real QueuedKubeSpawner (a KubeSpawner) for `user` of the group vision, on the
    API server at `k8s_url` and the gateway at `gateway_url`, with a stand-in for
    the Hub's user object (kubefix.HubUser). `traits` override the defaults."""
    from jupyterhub.objects import Hub

    from jupyter_gpuaas.hub.kube import QueuedKubeSpawner

    hub_user = HubUser(user, ["vision"])
    kw: dict[str, Any] = dict(
        user=hub_user,
        orm_spawner=hub_user.orm_spawner(),
        hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
        namespace="jhub",
        k8s_api_host=k8s_url,
        gateway_url=gateway_url,
        image="quay.io/jupyter/base-notebook:2026-11",
        cmd=["jupyterhub-singleuser"],
        start_timeout=20,
        refresh_interval=0.5,
        heartbeat_interval=0.5,
        api_token="hub-token-for-the-server",
    )
    kw.update(traits)
    return QueuedKubeSpawner(**kw)


def job_manager(gateway_url: str, tmp_path: Path, runner: Mapping[str, Any]) -> Any:
    """Alice's real JobManager running jobs as Kubernetes Jobs (KubernetesJobRunner with
    `runner` as its config), her home in tmp_path/home with a train.py; loaded, not
    started."""
    from jupyter_gpuaas.jobs.manager import JobManager

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "train.py").write_text("print('epoch 1')\n")
    manager = JobManager(
        GatewayClient(gateway_url, TOKENS["alice"]),
        str(home),
        config=Config({"KubernetesJobRunner": {"refresh_interval": 0.1, **runner}}),
        runner_class="jupyter_gpuaas.kubernetes.jobs.KubernetesJobRunner",
        state_dir=str(tmp_path / "state"),
        poll_interval=0.1,
        heartbeat_interval=0.5,
    )
    manager.load()
    return manager


# ------------------------------------------------------------------------- GPU kernels

HOME_CLAIM = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]


class KernelCluster:
    """Alice's server pod (CPU-only, on a KWOK Node of the caller's) and GPU kernels in
    pods of their own, in the test's namespace of the real cluster; `kubelet` plays the
    kernel pods' containers."""

    def __init__(
        self,
        kube: KubeOnCluster,
        gateway_url: str,
        home: Path,
        kubelet: KwokKubelet,
        flavors: Mapping[str, Any],
    ) -> None:
        self.kube, self.gateway_url, self.home, self.kubelet = kube, gateway_url, home, kubelet
        self.flavors = dict(flavors)
        self.root = GatewayClient(gateway_url, TOKENS["root"])

    def kernel_manager(self, kernel_name: str = "gpu-pod", **traits: Any) -> Any:
        """jupyter_client's own AsyncKernelManager for the `gpu-pod` kernelspec (1 a100,
        provisioner gpuaas-kubernetes), or `kernel_name`'s, configured as a server's
        config would, with `traits` over the provisioner's."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager

        config = Config(
            {
                "GpuaasKubernetesProvisioner": {
                    "namespace": self.kube.namespace,
                    "flavors": self.flavors,
                    "server_pod_name": "jupyter-alice",
                    "image_name": "quay.io/jupyter/pytorch-notebook:2026-11",
                    "poll_interval": 0.2,
                    "pod_poll_interval": 0.1,
                    "launch_timeout": 60,
                    "tenant": "vision",
                    **traits,
                }
            }
        )
        ksm = KernelSpecManager(kernel_dirs=[str(self.home.parent / "kernels")])
        return AsyncKernelManager(kernel_name=kernel_name, kernel_spec_manager=ksm, config=config)

    def get(self, name: str) -> dict[str, Any] | None:
        out = self.kube.cluster.kubectl(
            "get", "pod", name, "-n", self.kube.namespace, "-o", "json", "--ignore-not-found"
        )
        return yaml.safe_load(out) if out.strip() else None

    def pod(self, km: Any) -> dict[str, Any] | None:
        return self.get(f"alice-{km.kernel_id}")

    async def request(self, rid: str) -> dict[str, Any]:
        return await self.root.get(rid)


@contextlib.asynccontextmanager
async def kernel_cluster(
    kube: KubeOnCluster,
    gateway_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flavors: Mapping[str, Any],
    server_node: Mapping[str, str],
    kubeconfig: Path | None = None,
) -> AsyncIterator[KernelCluster]:
    """Alice's home claim and her CPU server pod, bound by the real scheduler to the Node
    of `server_node`'s labels (the caller adds it, and the GPU Nodes), the server
    extension's kernel table on the gateway at `gateway_url`, a `gpu-pod` kernelspec, and
    a KwokKubelet running the kernel pods' containers as LOCAL processes. With
    `kubeconfig` the provisioner's API client reads it (a ServiceAccount's token), else
    the cluster's admin kubeconfig of the `kube` fixture."""
    import gateway_provisioners.response_manager as rm

    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    home_claim(kube, home)
    server = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-alice",
            "namespace": kube.namespace,
            "labels": {"component": "singleuser-server"},
        },
        "spec": {
            "nodeSelector": dict(server_node),
            "containers": [
                {
                    "name": "notebook",
                    "image": "img",
                    "volumeMounts": [{"name": "home", "mountPath": str(home)}],
                }
            ],
            "volumes": HOME_CLAIM,
        },
    }
    kube.cluster.apply([server])
    kube.cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/jupyter-alice", "-n", kube.namespace,
        "--timeout=60s",
    )  # fmt: skip
    if kubeconfig is not None:
        from kubernetes_asyncio.config import kube_config

        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # gateway_provisioners' response address: a free port, not its fixed 8877.
    monkeypatch.setattr(rm, "desired_response_port", free_port())
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("GPUAAS_TEST_SETTING", "from the user's environment")
    # No server extension: the provisioner's own client, from the environment.
    monkeypatch.setenv("GPUAAS_URL", gateway_url)
    monkeypatch.setenv("GPUAAS_TOKEN", TOKENS["alice"])
    write_spec(tmp_path / "kernels" / "gpu-pod", 1, "a100", kubernetes=True)
    kubelet = KwokKubelet(kube.cluster.kubeconfig, kube.namespace, "component=kernel", tmp_path)
    await kubelet.start()
    try:
        yield KernelCluster(kube, gateway_url, home, kubelet, flavors)
    finally:
        await kubelet.close()
        if rm.ResponseManager.initialized():
            manager = rm.ResponseManager.instance()
            sock = manager._response_socket
            manager.stop_response_manager()
            if sock is not None:
                sock.close()
            rm.ResponseManager.clear_instance()
        release_home(kube)


async def run_cell(client: Any, code: str, timeout: float = 30.0) -> dict[str, Any]:
    """Execute `code` on a kernel client: its stdout and its reply."""
    msg_id = client.execute(code)
    out = ""
    while True:
        msg = await client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = await client.get_shell_msg(timeout=timeout)
    return {"out": out, "reply": reply["content"]}


async def connect(km: Any) -> Any:
    """A started client of the kernel manager's kernel, once the kernel answers."""
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    return client


# ------------------------------------------------- the real cluster as a ServiceAccount


def service_account_kubeconfig(
    kube: KubeOnCluster, name: str, rules: list[dict[str, Any]], path: Path
) -> Path:
    """A kubeconfig at `path` that holds the token the API server issues for a new
    ServiceAccount `name` of the test's namespace, bound there to a Role of `rules`
    only: RBAC, not the admin certificate, decides what a client of it may do."""
    ns = kube.namespace
    kube.cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": name},
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        ],
        "-n",
        ns,
    )
    token = kube.cluster.kubectl("create", "token", name, "-n", ns).strip()
    admin = yaml.safe_load(kube.cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "cluster", "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def pod_logs(kube: KubeOnCluster, name: str, container: str, lines: list[str]) -> Path:
    """What KWOK's kubelet endpoint serves as the log of `container` in the test's pods,
    through the API server's pods/log: a ClusterLogs object `name` of KWOK for the
    namespace (cluster-wide: the caller deletes it) naming a file of `lines` in the CRI
    log format kubelet reads, written beside the cluster's logs. KWOK reads the file
    once, when asked (no `follow`): write it before the pod runs."""
    path = kube.cluster.root / f"pod-logs-{kube.namespace}-{container}.log"
    path.write_text(
        "".join(f"2026-12-06T08:00:00.{i:09d}Z stdout F {x}\n" for i, x in enumerate(lines))
    )
    kube.cluster.apply(
        [
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchNamespaces": [kube.namespace]},
                    "logs": [{"containers": [container], "logsFile": str(path)}],
                },
            }
        ]
    )
    return path


def home_claim(kube: KubeOnCluster, home: Path) -> None:
    """Alice's home claim `claim-alice` in the test's namespace, Bound (the scheduler binds
    no pod whose claim is not) by the PersistentVolume controller to a hostPath
    PersistentVolume of `home`, which `release_home` deletes (volumes are cluster-wide)."""
    ns = kube.namespace
    volume = f"home-{ns}"
    kube.cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "hostPath": {"path": str(home)},
                    "storageClassName": "",
                    "claimRef": {"namespace": ns, "name": "claim-alice"},
                },
            }
        ]
    )
    # The claim once the controller has seen the volume: a claim it syncs before that
    # waits for its periodic resync (15 s) to bind.
    kube.cluster.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Available", f"pv/{volume}", "--timeout=60s"
    )
    kube.cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "claim-alice", "namespace": ns},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                    "volumeName": volume,
                },
            }
        ]
    )
    kube.cluster.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/claim-alice", "-n", ns,
        "--timeout=60s",
    )  # fmt: skip


def release_home(kube: KubeOnCluster) -> None:
    kube.cluster.kubectl("delete", "pv", f"home-{kube.namespace}", "--wait=false", check=False)
