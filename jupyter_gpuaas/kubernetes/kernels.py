"""The `gpuaas-kubernetes` kernel provisioner: a GPU kernel in a pod of its own.

The ★ of the project on a cluster: the user's server pod stays CPU-only all day, and a
GPU kernel runs in its own pod on the granted node only while it runs. A kernelspec names
it (`jupyter-gpuaas kernelspec install --kubernetes --gpus 1 --flavor a100`):
`metadata.kernel_provisioner = {"provisioner_name": "gpuaas-kubernetes", "config":
{"gpus": 1, "flavor": "a100"}}`.

It is Jupyter's own gateway_provisioners' `KubernetesProvisioner`, not a protocol of ours:

- before launch it submits the `kernel` request and waits for admission exactly as the
  local `gpuaas` provisioner does: both are a `GpuKernelHolder` (server/provisioner.py),
  whose one `Claim` holds the request and whose record the server extension sees like
  any GPU kernel's (waiting reason, leases, cull, release at server stop);
- once admitted it creates the kernel's pod (`kernel_pods.kernel_pod_manifest`: the
  flavor's resource, node selector and tolerations, pinned to the granted node, in the
  user's image with the user's environment and volumes) running gateway_provisioners'
  kernel launcher, which sends the kernel's connection info back to the response address
  of gateway_provisioners' `ResponseManager`; interrupts go to the launcher's listener;
- it talks to the API server through kubernetes_asyncio, on the server's event loop,
  where gateway_provisioners calls the blocking client: status is answered from the pod
  this provisioner last read, and deletions are awaited;
- restart deletes the pod and makes a new one, keeping the grant; shutdown deletes it and
  releases the grant (a culled kernel's quota stays parked); a pod that ends or is
  deleted under the kernel is a dead kernel: its grant is released at once, and an
  auto-restart asks again.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import time
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default

from jupyter_gpuaas.kubeapi.connect import api_client, own_namespace
from jupyter_gpuaas.server.provisioner import GpuKernelHolder

from .kernel_pods import (
    DEFAULT_ENV_EXCLUDE,
    dns_label,
    kernel_env,
    kernel_pod_manifest,
    shared_volumes,
)
from .pods import HOSTNAME_LABEL
from .prestop import prestop_lifecycle

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _import_gateway_provisioners() -> tuple[Any, Any]:
    """gateway_provisioners.k8s loads the blocking client's configuration when imported
    (in-cluster unless told otherwise), and fails where there is none. This provisioner
    never uses that client: outside a cluster it reads the kubeconfig, and where there is
    none either the import skips the load (with the switch its own tests use)."""
    in_cluster = os.path.exists(f"{_SA_DIR}/token")
    os.environ.setdefault("GP_USE_INCLUSTER_CONFIG", "true" if in_cluster else "false")
    kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
    skip = not in_cluster and not os.path.exists(os.path.expanduser(kubeconfig))
    skip = skip and "PYTEST_RUN_CONFIG" not in os.environ
    if skip:
        os.environ["PYTEST_RUN_CONFIG"] = "jupyter-gpuaas: no cluster configuration"
    try:
        from gateway_provisioners.k8s import KubernetesProvisioner
        from gateway_provisioners.remote_provisioner import RemoteProvisionerBase
    finally:
        if skip:
            os.environ.pop("PYTEST_RUN_CONFIG", None)
    return KubernetesProvisioner, RemoteProvisionerBase


if TYPE_CHECKING:  # untyped (no stubs): Any to mypy, as the import below makes them
    from gateway_provisioners.k8s import KubernetesProvisioner
    from gateway_provisioners.remote_provisioner import RemoteProvisionerBase
else:
    KubernetesProvisioner, RemoteProvisionerBase = _import_gateway_provisioners()

ENDED_PHASES = ("Succeeded", "Failed")


class GpuaasKubernetesProvisioner(GpuKernelHolder, KubernetesProvisioner):  # type: ignore[misc]
    """A GPU kernel in its own pod on the node the jupyter-gpuaas gateway granted. Its
    request (knobs, claim, record) is the local `gpuaas` provisioner's: `GpuKernelHolder`."""

    assigned_host: str  # gateway_provisioners' RemoteProvisionerBase: the kernel pod's name

    namespace = Unicode(
        help="Namespace of the kernel pods. Default: the server pod's own ($KERNEL_NAMESPACE "
        "overrides), else `default`."
    ).tag(config=True)

    @default("namespace")
    def _namespace_default(self) -> str:
        return own_namespace()

    # Kernels on a new GPU node wait for its image pull: far longer than the 30 s that
    # gateway_provisioners allows a kernel by default ($GP_LAUNCH_TIMEOUT still wins).
    launch_timeout_default_value = 600

    @default("image_name")
    def _image_default(self) -> str:
        env = os.environ
        return (
            env.get("GP_IMAGE_NAME")
            or env.get("JUPYTER_IMAGE_SPEC")
            or env.get("JUPYTER_IMAGE", "")
        )

    flavors = Dict(
        help="""GPU flavors, as QueuedKubeSpawner.flavors: the `resource`, `node_selector`
        and `tolerations` of each (e.g. {"a100": {"node_selector":
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}).""",
    ).tag(config=True)

    volumes = List(
        Dict(),
        default_value=None,
        allow_none=True,
        help="""The kernel pods' volumes, e.g. [{"name": "home", "persistentVolumeClaim":
        {"claimName": "claim-alice"}}]. Unset: the server pod's own claims and network
        volumes (read from the API), so the notebook's relative paths work in the kernel.
        A ReadWriteOnce claim cannot be mounted on a second node: the home volume must be
        ReadWriteMany (NFS, CephFS, a cloud file store) for kernels on GPU nodes.""",
    ).tag(config=True)

    volume_mounts = List(
        Dict(),
        help="""Where `volumes` are mounted, as in the server's pod, e.g. [{"name": "home",
        "mountPath": "/home/jovyan"}] (unset `volumes`: the server container's mounts).""",
    ).tag(config=True)

    server_pod_name = Unicode(
        help="The user's server pod, whose volumes the kernel pods share. Default: $HOSTNAME "
        "(a pod's hostname is its name)."
    ).tag(config=True)

    @default("server_pod_name")
    def _server_pod_default(self) -> str:
        return os.environ.get("HOSTNAME", "") if os.path.exists(_SA_DIR) else ""

    server_container = Unicode(
        "notebook", help="The server pod's container whose mounts are copied (KubeSpawner's)."
    ).tag(config=True)

    env_exclude = List(
        Unicode(),
        default_value=list(DEFAULT_ENV_EXCLUDE),
        help="""Names (fnmatch patterns) of the server's environment that the kernel pod does
        not inherit; the rest is the user's environment, as a local kernel has it.""",
    ).tag(config=True)

    extra_env = Dict(value_trait=Unicode(), help="Environment added to every kernel pod.").tag(
        config=True
    )

    pin_node_label = Unicode(
        HOSTNAME_LABEL,
        help="Node label that pins the kernel pod to the granted node ('' leaves it unpinned).",
    ).tag(config=True)

    service_account = Unicode("", help="Service account of the kernel pods ('' : default).").tag(
        config=True
    )

    kueue_queue = Unicode(
        "",
        help="""Kueue mode (the gateway's --admission kueue): the LocalQueue of the kernel
        pods, `{tenant}` replaced by the request's tenant (`jupyter-gpuaas kueue
        manifests` names each tenant's LocalQueue after it: `{tenant}`). The pod is then
        created as soon as the request is submitted, labelled with its LocalQueue and the
        request's id, and Kueue's pod integration holds it (scheduling gate) until Kueue
        admits it: that admission is the kernel's grant. A restart deletes the pod, so
        the new pod asks Kueue again. Empty: the gateway's grant first, then the pod.""",
    ).tag(config=True)

    kueue_priority_class = Unicode(
        "",
        help="Kueue mode: the WorkloadPriorityClass of the kernel pods "
        "(`kueue.x-k8s.io/priority-class`). Empty: Kueue's default.",
    ).tag(config=True)

    automount_service_account_token = Bool(
        False,
        help="""Mount the service account's API token in the kernel pods. Off: a kernel
        talks to the server over its ZMQ ports and needs no Kubernetes API access, so user
        code in it gets no credentials. Turn on only for kernels that call the API.""",
    ).tag(config=True)

    pod_poll_interval = Float(
        1.0, min=0.05, help="Seconds between reads of the kernel pod (to see it end)."
    ).tag(config=True)

    delete_grace = Integer(
        5, min=0, help="Seconds a deleted kernel pod's process gets to exit (SIGTERM first)."
    ).tag(config=True)

    prestop_hook = Bool(
        True,
        help="""Kueue mode: the kernel pod's preStop hook (`python -m
        jupyter_gpuaas.kubernetes.prestop`) holds SIGTERM back while a preemption warning
        stands, so that the kernel runs until the time the user was told, not until the
        eviction. Off, or outside Kueue mode (where the gateway warns before it deletes
        the pod): no hook.""",
    ).tag(config=True)

    delete_timeout = Float(
        120.0,
        min=1.0,
        help="Seconds to wait for a deleted kernel pod to be gone (a restart's new pod "
        "takes the same name and the same GPUs).",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # gateway_provisioners' ResponseManager accepts the launchers' connections with
        # loop.sock_accept() on a socket with a 10 ms timeout, every 0.1 ms: each accept
        # then blocks the server's event loop for its timeout, nearly all the time. A
        # non-blocking socket makes the same accept wait on the loop instead.
        sock = getattr(self.response_manager, "_response_socket", None)
        if sock is not None and sock.gettimeout() != 0:
            sock.setblocking(False)
        self._api: Any = None
        self._pod: dict[str, Any] | None = None  # the kernel pod as last read
        self._follow: asyncio.Task[None] | None = None
        self._deleting = False

    # ------------------------------------------------------------------ the API

    async def _core(self) -> Any:
        from kubernetes_asyncio import client

        if self._api is None:
            self._api = await api_client()
        return client.CoreV1Api(self._api)

    async def _read_pod(self, name: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        core = await self._core()
        try:
            resp = await core.read_namespaced_pod(
                name, self.kernel_namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        # Unread (_preload_content=False), an error status comes back as a response.
        if resp.status == 404:
            return None
        pod: dict[str, Any] = await resp.json()
        if resp.status >= 400:
            raise RuntimeError(f"reading pod {name}: {resp.status} {pod.get('message', '')}")
        return pod

    async def _server_volumes(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self.volumes is not None:
            return [dict(v) for v in self.volumes], [dict(m) for m in self.volume_mounts]
        if not self.server_pod_name:
            return [], []
        try:
            pod = await self._read_pod(self.server_pod_name)
        except Exception as e:
            self.log.warning("gpuaas: cannot read the server pod's volumes: %s", e)
            return [], []
        return shared_volumes(pod, self.server_container)

    # ------------------------------------------------------------------ provisioner API

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if not self.holds_grant() and not self.kueue_queue:
            await self.acquire()  # a restart keeps its grant (Kueue mode: launch_kernel)
        env = dict(kwargs.pop("env", None) or os.environ)
        # The pod's name and KERNEL_USERNAME: the Hub's user, not the image's (jovyan).
        env.setdefault("KERNEL_USERNAME", os.environ.get("JUPYTERHUB_USER") or getpass.getuser())
        result: dict[str, Any] = await super().pre_launch(env=env, **kwargs)
        return result

    def _determine_kernel_pod_name(self, **kwargs: Any) -> str:
        name = dns_label(str(super()._determine_kernel_pod_name(**kwargs)))
        kwargs["env"]["KERNEL_POD_NAME"] = name
        return name

    def _determine_kernel_namespace(self, **kwargs: Any) -> str:
        namespace = str(kwargs["env"].get("KERNEL_NAMESPACE") or self.namespace)
        kwargs["env"]["KERNEL_NAMESPACE"] = namespace
        return namespace

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        if not self.image_name:
            raise RuntimeError(
                "no image for the GPU kernel pod: set GpuaasKubernetesProvisioner.image_name "
                "(the server's own is read from $JUPYTER_IMAGE_SPEC)"
            )
        volumes, mounts = await self._server_volumes()

        def manifest(request: dict[str, Any], queue: str = "") -> dict[str, Any]:
            return kernel_pod_manifest(
                name=self.kernel_pod_name,
                kernel_id=str(self.kernel_id),
                user=str(self.kernel_username),
                command=cmd,
                image=str(self.image_name),
                request=request,
                flavors=self.flavors,
                env=kernel_env(kwargs.get("env") or {}, self.env_exclude, self.extra_env),
                cwd=kwargs.get("cwd"),
                volumes=volumes,
                volume_mounts=mounts,
                node_label=self.pin_node_label,
                service_account=self.service_account,
                automount_token=self.automount_service_account_token,
                queue=queue,
                priority_class=self.kueue_priority_class if queue else "",
                lifecycle=prestop_lifecycle() if queue and self.prestop_hook else None,
            )

        if self.kueue_queue:
            # Kueue mode: the pod is the request's Workload, created gated; Kueue's
            # admission is the grant (pre_launch asked for none).
            async def create(claim: Any) -> None:
                queue = self.kueue_queue.replace("{tenant}", str(claim.tenant or ""))
                await self._create_pod(manifest(dict(claim.request or {}), queue))

            try:
                await self.acquire(before_wait=create)
            except BaseException:
                await self._delete_pod()
                raise
        else:
            try:
                await self._create_pod(manifest(self.granted_request()))
            except RuntimeError:
                await self.release("released", "the kernel pod could not be created")
                raise
        self._deleting = False
        self.container_name = self.kernel_pod_name
        assert self._pod is not None
        self._follow = asyncio.ensure_future(self._follow_pod(self._pod))
        self.log_kernel_launch(cmd)
        try:
            await self.confirm_remote_startup()
        except BaseException as e:
            await self._delete_pod()
            await self.release("released", f"the kernel pod did not start: {e}")
            raise
        return self.connection_info

    async def _create_pod(self, manifest: dict[str, Any]) -> None:
        core = await self._core()
        resp = await core.create_namespaced_pod(
            self.kernel_namespace, manifest, _preload_content=False
        )
        created = await resp.json()
        if resp.status >= 400:
            raise RuntimeError(
                f"the kernel pod could not be created: {created.get('message') or resp.status}"
            )
        self._pod = created
        self.container_name = self.kernel_pod_name

    def get_container_status(self, iteration: str | None) -> str:
        """The kernel pod's phase (lowercase) as last read; '' once it is gone."""
        pod = self._pod
        if pod is None:
            return ""
        status = pod.get("status") or {}
        phase = str(status.get("phase") or "Pending").lower()
        if phase == "running" and not self.assigned_host and status.get("podIP"):
            self.assigned_ip = status["podIP"]
            self.assigned_host = pod["metadata"]["name"]
            self.assigned_node_ip = status.get("hostIP")
        return phase

    async def _follow_pod(self, created: dict[str, Any]) -> None:
        """Read the pod until it ends; one that ends under the kernel is a dead kernel."""
        name, uid = created["metadata"]["name"], created["metadata"].get("uid")
        while True:
            await asyncio.sleep(self.pod_poll_interval)
            try:
                pod = await self._read_pod(name)
            except Exception as e:
                self.log.warning("gpuaas: reading kernel pod %s: %s", name, e)
                continue
            if pod is not None and uid and pod["metadata"].get("uid") != uid:
                pod = None  # a newer pod of the same name: ours is gone
            if self._deleting:
                return
            self._pod = pod
            phase = ((pod or {}).get("status") or {}).get("phase")
            if pod is None or phase in ENDED_PHASES:
                self._pod_ended(name, "deleted" if pod is None else f"ended ({phase})")
                return

    def _pod_ended(self, name: str, how: str) -> None:
        # As a local kernel that died: released at once; a restart's acquire waits for it.
        self._died(f"kernel pod {name} {how}")

    async def _delete_pod(self) -> None:
        """Delete the kernel pod and wait until it is gone (idempotent)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        name = self.container_name
        if not name:
            return
        if self.kueue_queue and self.holds_grant():
            # Kueue mode: the pod is the grant's Workload, which ends with it: given
            # back first, so that its end is no lost grant (a restart asks again).
            await self.release("released", "the kernel pod was deleted")
        self._deleting = True
        if self._follow is not None:
            self._follow.cancel()
            self._follow = None
        core = await self._core()
        try:
            await core.delete_namespaced_pod(
                name,
                self.kernel_namespace,
                body=client.V1DeleteOptions(grace_period_seconds=int(self.delete_grace)),
            )
        except ApiException as e:
            if e.status != 404:
                self.log.warning("gpuaas: deleting kernel pod %s: %s", name, e)
        deadline = time.monotonic() + float(self.delete_timeout)
        while time.monotonic() < deadline:
            try:
                if await self._read_pod(name) is None:
                    break
            except Exception as e:
                self.log.warning("gpuaas: reading kernel pod %s: %s", name, e)
            await asyncio.sleep(min(0.2, float(self.pod_poll_interval)))
        else:
            self.log.warning("gpuaas: kernel pod %s still there after its deletion", name)
        self._pod = None
        self.container_name = None
        self.assigned_host = ""

    async def kill(self, restart: bool = False) -> None:
        await self._delete_pod()

    async def terminate(self, restart: bool = False) -> None:
        await self._delete_pod()

    async def shutdown_listener(self, restart: bool) -> None:
        # The launcher's listener is told to exit, then the pod goes.
        await RemoteProvisionerBase.shutdown_listener(self, restart)
        await self._delete_pod()

    def terminate_container_resources(self, restart: bool = False) -> bool | None:
        # The base's blocking deletion; kill/terminate/shutdown_listener delete instead.
        return None

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if restart:
            return  # a restart keeps its grant; pre_launch reuses it
        await self._delete_pod()
        await self._shut_down()
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        return self._info(await super().get_provisioner_info())
