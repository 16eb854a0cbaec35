"""GPU kernels as pods (`gpuaas-kubernetes`): the pure pod builder by dict equality, then
the real provisioner under jupyter_client's own AsyncKernelManager, against the real
gateway (in-process) and the REAL control plane of the session (conftest.py's `cluster`):
the API server (RBAC: the provisioner holds only the token of a ServiceAccount bound to
the Role of the users' servers, `--singleuser-access kernels`), the real scheduler binding
the kernel pod to the granted KWOK Node, KWOK turning it Running with a loopback IP.

The kernel pod's process is played by a LOCAL kernel: when KWOK has made a kernel pod
Running, kwok_kubelet.py's KwokKubelet runs the pod's container command (gateway_provisioners'
own kernel launcher, with the response address and public key the provisioner put in it)
on this machine, with the pod's env and working directory; it listens on every address,
so the provisioner reaches it at the pod's IP (KWOK's 127.20.0.0/16), and the launcher
sends the kernel's connection info back to the server's response address, as it would
from a pod. When the process exits, KwokKubelet reports the pod Failed or Succeeded.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from helpers import wait_until
from kubefix import FLAVORS, TOKENS
from kubeutil import (
    GPU_TAINT,
    HOME_CLAIM,
    KernelCluster,
    KubeOnCluster,
    connect,
    kernel_cluster,
    run_cell,
    service_account_kubeconfig,
)
from traitlets import TraitError

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.kernel_pods import (
    dns_label,
    kernel_env,
    kernel_pod_manifest,
    shared_volumes,
    working_dir,
)
from jupyter_gpuaas.kubernetes.kernels import GpuaasKubernetesProvisioner
from jupyter_gpuaas.kubernetes.manifests import singleuser_rules
from jupyter_gpuaas.server.provisioner import GpuaasProvisioner, GpuKernelKnobs

REQUEST = {
    "id": "r-77",
    "tenant": "vision",
    "gpus": 1,
    "grant": {"flavor": "a100", "node": "a100-0", "devices": [0]},
}
HOME = HOME_CLAIM  # the server pod's home claim (kubeutil's server pod has it)
MOUNTS = [{"name": "home", "mountPath": "/home/jovyan"}]


def test_kernel_pod_manifest() -> None:
    got = kernel_pod_manifest(
        name="alice-k1",
        kernel_id="k1",
        user="alice",
        command=["python", "-m", "jupyter_gpuaas.kubernetes.kernel_launcher"],
        image="quay.io/jupyter/pytorch-notebook:2026-11",
        request=REQUEST,
        flavors=FLAVORS,
        env={"MY_VAR": "1"},
        cwd="/home/jovyan/proj",
        volumes=HOME,
        volume_mounts=MOUNTS,
    )
    assert got == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "alice-k1",
            "labels": {
                "app": "gateway-provisioners",
                "component": "kernel",
                "kernel_id": "k1",
                "app.kubernetes.io/name": "jupyter-gpuaas",
                "app.kubernetes.io/component": "gpu-kernel",
            },
            "annotations": {
                "gpuaas.jupyter.org/user": "alice",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                "gpuaas.jupyter.org/request": "r-77",
                "gpuaas.jupyter.org/tenant": "vision",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            # A kernel needs no API access: no service-account token in its pod.
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "kernel",
                    "image": "quay.io/jupyter/pytorch-notebook:2026-11",
                    "command": ["python", "-m", "jupyter_gpuaas.kubernetes.kernel_launcher"],
                    "env": [
                        {"name": "MY_VAR", "value": "1"},
                        {"name": "GPUAAS_REQUEST_ID", "value": "r-77"},
                        {"name": "GPUAAS_TENANT", "value": "vision"},
                        {"name": "GPUAAS_FLAVOR", "value": "a100"},
                        {"name": "GPUAAS_NODE", "value": "a100-0"},
                    ],
                    "volumeMounts": MOUNTS,
                    "workingDir": "/home/jovyan/proj",
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
    }


def test_the_api_token_is_mounted_only_when_configured() -> None:
    common: dict[str, Any] = dict(
        name="alice-k1",
        kernel_id="k1",
        user="alice",
        command=["python"],
        image="img",
        request=REQUEST,
        flavors=FLAVORS,
    )
    default = kernel_pod_manifest(**common)
    mounted = kernel_pod_manifest(**common, automount_token=True, service_account="kernels")
    assert mounted["spec"] == {
        **default["spec"],
        "automountServiceAccountToken": True,
        "serviceAccountName": "kernels",
    }
    assert default["spec"]["automountServiceAccountToken"] is False


def test_shared_volumes_are_the_server_pods_claims() -> None:
    server = {
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "volumeMounts": [
                        *MOUNTS,
                        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets"},
                        {"name": "scratch", "mountPath": "/tmp"},
                        {"name": "data", "mountPath": "/data", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                *HOME,
                {"name": "kube-api-access-x", "projected": {"sources": []}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "data", "nfs": {"server": "nfs", "path": "/data"}},
                {"name": "unused", "persistentVolumeClaim": {"claimName": "other"}},
            ],
        }
    }
    volumes, mounts = shared_volumes(server)
    assert volumes == [*HOME, {"name": "data", "nfs": {"server": "nfs", "path": "/data"}}]
    assert mounts == [*MOUNTS, {"name": "data", "mountPath": "/data", "readOnly": True}]
    assert shared_volumes(None) == ([], [])


def test_long_pod_names_keep_the_kernel_id() -> None:
    kid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    assert dns_label(f"alice-{kid}") == f"alice-{kid}"
    long = dns_label(f"{'a-very-long-user-name' * 2}-{kid}")
    assert len(long) <= 63 and long.endswith(kid) and long[0].isalnum()


def test_working_dir_only_on_a_shared_volume() -> None:
    assert working_dir("/home/jovyan", MOUNTS) == "/home/jovyan"
    assert working_dir("/home/jovyan/a/b", MOUNTS) == "/home/jovyan/a/b"
    assert working_dir("/home/jovyanother", MOUNTS) is None
    assert working_dir("/srv", MOUNTS) is None
    assert working_dir(None, MOUNTS) is None


def test_kernel_env_is_the_users_less_the_pods_own() -> None:
    env = {
        "HOSTNAME": "jupyter-alice",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "PATH": "/opt/conda/bin",
        "CUDA_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "JUPYTERHUB_USER": "alice",
        "MY_VAR": "1",
    }
    assert kernel_env(env, extra={"EXTRA": "2"}) == {
        "JUPYTERHUB_USER": "alice",
        "MY_VAR": "1",
        "EXTRA": "2",
    }


def test_kernelspec_for_pods(tmp_path: Path) -> None:
    from jupyter_gpuaas.server.kernelspec_cli import POD_ARGV, write_spec

    path = write_spec(tmp_path / "k", 1, "a100", kubernetes=True, image="img:1")
    spec = json.loads((path / "kernel.json").read_text())
    assert spec["argv"] == POD_ARGV
    assert spec["display_name"] == "Python 3 (1 A100, own pod)"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpuaas-kubernetes",
        "config": {"gpus": 1, "flavor": "a100", "image_name": "img:1"},
    }


def test_both_provisioners_read_a_kernelspecs_request_alike() -> None:
    """One definition of the request's knobs (GpuKernelKnobs): the local and the pod
    provisioner have the very same traits, so the same config is read the same way and
    the same bad values are refused. (Checked on the mixin and the classes: a pod
    provisioner built here would set gateway_provisioners' process-wide response address
    before the cluster tests do.)"""
    knobs = GpuKernelKnobs.class_traits(config=True)
    assert len(knobs) == 7
    for provisioner in (GpuaasProvisioner, GpuaasKubernetesProvisioner):
        traits = provisioner.class_traits(config=True)
        assert all(traits[name] is trait for name, trait in knobs.items()), provisioner
    k = GpuKernelKnobs(gpus=2, flavor="a100", tenant="vision", poll_interval=0.5)
    assert (k.gpus, k.flavor, k.tenant, k.poll_interval) == (2, "a100", "vision", 0.5)
    assert (k.admission_timeout, k.standalone_heartbeat) == (0.0, 30.0)
    for bad in ({"gpus": 0}, {"poll_interval": 0}, {"admission_timeout": -1}):
        with pytest.raises(TraitError):
            GpuKernelKnobs(**bad)


def test_kernelspec_install_kubernetes_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jupyter-gpuaas kernelspec install --kubernetes`: the command z2jh's postStart runs
    (hub_config/kubernetes/values.yaml) installs a spec of the pod provisioner."""
    from jupyter_gpuaas.cli import main
    from jupyter_gpuaas.server.kernelspec_cli import POD_ARGV

    args = ["kernelspec", "install", "--kubernetes", "--gpus", "2", "--flavor", "a100"]
    assert main([*args, "--image", "img:2", "--prefix", str(tmp_path)]) == 0
    assert "Installed GPU kernelspec python3-2gpu-a100-pod" in capsys.readouterr().out
    spec = json.loads(
        (tmp_path / "share/jupyter/kernels/python3-2gpu-a100-pod/kernel.json").read_text()
    )
    assert spec["argv"] == POD_ARGV
    assert spec["display_name"] == "Python 3 (2 A100, own pod)"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpuaas-kubernetes",
        "config": {"gpus": 2, "flavor": "a100", "image_name": "img:2"},
    }
    # --image means the pod's image: without --kubernetes it is refused in one line.
    assert main(["kernelspec", "install", "--gpus", "1", "--image", "img:2"]) == 2
    assert capsys.readouterr().err == "jupyter-gpuaas kernelspec: --image needs --kubernetes\n"


# ------------------------------------------------------------------ on the real cluster

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


@pytest_asyncio.fixture
async def cluster(
    kube: KubeOnCluster, gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[KernelCluster]:
    """KWOK Nodes a100-0 (2 GPUs, named as the simulated gateway names its node) and
    cpu-0, and kubeutil's kernel_cluster around them: Alice's home claim and her CPU
    server pod bound to cpu-0 by the scheduler, the kernel table on the gateway, a
    `gpu-pod` kernelspec, KwokKubelet playing the kernel pods' containers; the
    provisioner's API client holds the token of the users' servers' ServiceAccount (the
    Role of `--singleuser-access kernels` only)."""
    kube.add_node("a100-0", A100, {"nvidia.com/gpu": "2"}, GPU_TAINT)
    mine = {"gpuaas-test": kube.namespace}
    kube.add_node("cpu-0", mine)
    config = service_account_kubeconfig(
        kube, "singleuser", singleuser_rules("kernels"), tmp_path / "sa-kubeconfig"
    )
    async with kernel_cluster(
        kube, gateway.url, tmp_path, monkeypatch, FLAVORS, mine, kubeconfig=config
    ) as cl:
        yield cl


@pytest.mark.asyncio
async def test_gpu_kernel_runs_in_its_own_pod_on_the_granted_node(cluster: KernelCluster) -> None:
    """queued → admitted → a pod bound by the scheduler to the granted node with the GPU →
    a cell runs → an interrupt reaches it → restart keeps the grant → shutdown deletes the
    pod and releases the grant, all as the ServiceAccount of the users' servers. The
    kernel pod's process is a LOCAL kernel run by KwokKubelet, reached at the pod's IP."""
    bob = GatewayClient(cluster.gateway_url, TOKENS["bob"])
    blocker = await bob.submit("vision", "kernel", 2, flavor="a100", name="bob's kernel")
    assert blocker["state"] == "admitted"
    km = cluster.kernel_manager()
    start = asyncio.ensure_future(km.start_kernel(cwd=str(cluster.home / "proj")))
    try:
        record = await wait_until(
            lambda: (r := getattr(km.provisioner, "record", None)) and r.state == "queued" and r
        )
        assert record.tenant == "vision" and record.flavor == "a100"
        assert cluster.pod(km) is None  # no pod while queued
        await bob.cancel(blocker["id"])
        await asyncio.wait_for(start, 90)
        pod = cluster.pod(km)
        assert pod is not None
        assert pod["spec"]["nodeName"] == "a100-0"  # the scheduler's binding
        assert pod["status"]["phase"] == "Running"
        # The kernel is reached at the pod's IP, which KWOK handed out of its range.
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(
            sys.modules["gpuaas_cluster"].POD_CIDR  # scripts/cluster.py, as conftest loaded it
        )
        assert km.get_connection_info()["ip"] == pod["status"]["podIP"]
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert container["image"] == "quay.io/jupyter/pytorch-notebook:2026-11"
        assert pod["spec"]["volumes"] == HOME  # the server pod's home claim
        assert pod["spec"]["automountServiceAccountToken"] is False  # the trait's default
        assert container["volumeMounts"] == [{"name": "home", "mountPath": str(cluster.home)}]
        # The API server leaves "value" out of a variable whose value is empty (omitempty):
        # CI's environment has such variables, and the pod keeps them with no value.
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        assert env["GPUAAS_REQUEST_ID"] == record.request_id
        assert "HOSTNAME" not in env
        rid = record.request_id
        assert (await cluster.request(rid))["state"] == "admitted"
        # The user's server pod stays CPU-only and where it was.
        server = cluster.get("jupyter-alice")
        assert server is not None and server["spec"]["nodeName"] == "cpu-0"
        assert (
            "resources" not in server["spec"]["containers"][0]
            or not (server["spec"]["containers"][0]["resources"])
        )

        client = await connect(km)
        got = await run_cell(
            client,
            "import os; open('made-by-the-kernel.txt', 'w').write('x')\n"
            "print(os.environ['GPUAAS_NODE'], os.environ['GPUAAS_TEST_SETTING'], os.getcwd())",
        )
        assert got["out"] == f"a100-0 from the user's environment {cluster.home / 'proj'}\n"
        assert (cluster.home / "proj" / "made-by-the-kernel.txt").exists()  # relative paths

        # Interrupt: through the launcher's listener, as gateway_provisioners does.
        # Interrupt once the cell runs: a SIGINT that reaches ipykernel between the
        # execute_input and the cell's code is caught by its main loop, and the request
        # then gets no reply at all.
        msg_id = client.execute("import time; print('sleeping', flush=True); time.sleep(120)")
        while True:
            msg = await client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        await km.interrupt_kernel()
        reply = await client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        client.stop_channels()

        # Restart: a new pod, the same grant.
        first_uid = pod["metadata"]["uid"]
        await km.restart_kernel()
        pod2 = cluster.pod(km)
        assert pod2 is not None and pod2["metadata"]["uid"] != first_uid
        assert pod2["spec"]["nodeName"] == "a100-0"
        assert record.request_id == rid and record.state == "running"
        assert (await cluster.request(rid))["state"] == "admitted"
        client = await connect(km)
        assert (await run_cell(client, "print(6 * 7)"))["out"] == "42\n"
        client.stop_channels()

        # Shutdown: the pod goes, the grant is released.
        await km.shutdown_kernel()
        assert cluster.pod(km) is None
        await wait_until(lambda: not cluster.kubelet.procs)
        assert (await cluster.request(rid))["state"] in ("finished", "cancelled")
        assert record.state == "released"
        assert [p["metadata"]["uid"] for p in cluster.kubelet.started] == [
            first_uid,
            pod2["metadata"]["uid"],
        ]
    finally:
        if not start.done():
            start.cancel()
        if km.has_kernel:
            await km.shutdown_kernel(now=True)


@pytest.mark.asyncio
async def test_a_pod_deleted_under_the_kernel_is_a_dead_kernel(cluster: KernelCluster) -> None:
    """A kernel pod deleted by someone else (kubectl, an eviction, a node drain): the
    kernel is dead and its grant released at once. The kernel pod's process is a LOCAL
    kernel run by KwokKubelet, which stops it when the pod is deleted."""
    km = cluster.kernel_manager()
    await asyncio.wait_for(km.start_kernel(cwd=str(cluster.home)), 90)
    try:
        record = km.provisioner.record
        assert record is not None and record.state == "running"
        rid = record.request_id
        pod = cluster.pod(km)
        assert pod is not None
        name = pod["metadata"]["name"]
        assert cluster.kubelet.alive(name)
        cluster.kube.cluster.kubectl("delete", "pod", name, "-n", cluster.kube.namespace)

        async def released() -> bool:
            return (await cluster.request(rid))["state"] in ("finished", "cancelled")

        await wait_until(released)
        assert record.state == "released"
        assert record.reason == f"kernel pod {name} deleted"
        assert not await km.is_alive()
        await wait_until(lambda: not cluster.kubelet.alive(name))
    finally:
        await km.shutdown_kernel(now=True)
    assert cluster.pod(km) is None
    assert os.environ.get("GPUAAS_TEST_SETTING")  # the fixture's, still set


@pytest.mark.asyncio
async def test_culling_deletes_the_pod_and_leaves_the_parked_quota(cluster: KernelCluster) -> None:
    """The server extension culls a GPU kernel the gateway culled by marking its record
    and shutting the kernel down (extension.py `_end_kernel`); done the same here: the pod
    is deleted, and the request is not cancelled (the gateway parks its quota for the
    user's relaunch). The kernel pod's process is a LOCAL kernel run by KwokKubelet."""
    km = cluster.kernel_manager()
    await asyncio.wait_for(km.start_kernel(cwd=str(cluster.home)), 90)
    table = km.provisioner.kernel_table()
    record = table.get(str(km.kernel_id))
    assert record is not None and record.state == "running"
    name = f"alice-{km.kernel_id}"
    assert cluster.kubelet.alive(name)
    record.end("culled", "culled: idle on GPU for 30 min")
    table.retire(record)
    await km.shutdown_kernel()
    assert cluster.pod(km) is None
    await wait_until(lambda: not cluster.kubelet.alive(name))
    assert record.state == "culled"
    assert (await cluster.request(str(record.request_id)))["state"] == "admitted"


@pytest.mark.asyncio
async def test_a_kernel_process_that_dies_fails_its_pod_and_releases(
    cluster: KernelCluster,
) -> None:
    """The kernel exits on its own (a crash): its pod turns Failed, the kernel is dead and
    its grant released. The kernel pod's process is a LOCAL kernel run by KwokKubelet,
    which reports its exit status in the pod's status, as kubelet would (KWOK's stages
    leave a Running pod's phase alone)."""
    km = cluster.kernel_manager()
    await asyncio.wait_for(km.start_kernel(cwd=str(cluster.home)), 90)
    try:
        record = km.provisioner.record
        assert record is not None
        client = await connect(km)
        client.execute("import os; os._exit(3)")
        name = f"alice-{km.kernel_id}"

        async def released() -> bool:
            return (await cluster.request(str(record.request_id)))["state"] != "admitted"

        await wait_until(released, timeout=30)
        pod = cluster.pod(km)
        assert pod is not None and pod["status"]["phase"] == "Failed"
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["state"]["terminated"]["exitCode"] == 3
        assert record.reason == f"kernel pod {name} ended (Failed)"
        assert not await km.is_alive()
        client.stop_channels()
    finally:
        await km.shutdown_kernel(now=True)
    assert cluster.pod(km) is None  # shutdown deletes the failed pod
