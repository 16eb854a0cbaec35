"""`--devices kubernetes`: the inventory is the cluster's GPU Nodes, followed live.

The Node list and watch live in `jupyter_gpuaas.kubernetes.nodes` (on the floor above the
gateway, beside hub/: ARCHITECTURE.md). The gateway does not import it: like a scaler
given by dotted name, the node source is loaded by name (`ClusterInventory.source`), so
no import arrow points up from the gateway, and the source never sees the gateway either:
it only yields joins and leaves of plain (name, flavor, GPUs) nodes.

The arbiter asks for two things an inventory read once at start cannot give:
`prepare()` lists the Nodes before the queue is restored (so restored grants find their
nodes), and `follow(joined, left)` hands every later join and leave to the core, so a
scale-up ends when its Node really joins and a Node that dies releases its grants.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from traitlets import Dict, Unicode, default
from traitlets.config import LoggingConfigurable
from traitlets.utils.importstring import import_item

from ..devices import DeviceInfo, DeviceSample, Inventory, NodeInfo
from .scalers import Scaler

log = logging.getLogger("jupyter_gpuaas.devices")
MiB = 1024**2
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

Joined = Callable[[NodeInfo], Awaitable[None]]
Left = Callable[[str, str], Awaitable[None]]


class ClusterInventory(LoggingConfigurable, Inventory):
    """GPU nodes from the cluster's API (Kubernetes Nodes by default)."""

    flavors = Dict(
        help="""GPU flavors by name, as the spawners' flavors: {"a100": {"node_selector":
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "resource": "nvidia.com/gpu"}}.
        A Node of a flavor is one whose labels match its node_selector; its GPUs are its
        status.allocatable of the resource. `jupyter-gpuaas kubernetes manifests` writes
        this into the gateway's config.""",
    ).tag(config=True)

    source = Unicode(
        "jupyter_gpuaas.kubernetes.nodes.NodeWatch",
        help="""Dotted name of the node source: a class taking flavors= and
        label_selector=, with `async list_nodes()` and `changes()` (an async iterator of joins
        and leaves).""",
    ).tag(config=True)

    label_selector = Unicode(
        "", help="Only Nodes with these labels are listed (e.g. `node-role/gpu=true`)."
    ).tag(config=True)

    simulated = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._nodes: dict[str, Any] = {}
        try:
            self._source = import_item(self.source)(
                flavors=self.flavors, label_selector=self.label_selector
            )
        except ImportError as e:
            raise ValueError(
                f"kubernetes: {e}; install the kubernetes extra (jupyter-gpuaas[kubernetes])"
            ) from None
        self.message = "devices from the cluster's Nodes (utilization comes from the holders)"

    async def prepare(self) -> None:
        """List the Nodes once, before the arbiter restores its queue."""
        self._nodes = {n.name: n for n in await self._source.list_nodes()}

    async def follow(self, joined: Joined, left: Left) -> None:
        """Hand every join and leave to the arbiter, for as long as the gateway runs."""
        async for change in self._source.changes():
            if change.kind == "join":
                self._nodes[change.name] = change.node
                log.info(
                    "node %s joined: %d× %s", change.name, change.node.gpus, change.node.flavor
                )
                await joined(self._info(change.node))
            else:
                self._nodes.pop(change.name, None)
                log.warning("node %s left: %s", change.name, change.reason)
                await left(change.name, change.reason)

    @staticmethod
    def _info(node: Any) -> NodeInfo:
        return NodeInfo(name=node.name, flavor=node.flavor, gpus=node.gpus)

    def nodes(self) -> list[NodeInfo]:
        return [self._info(n) for n in self._nodes.values()]

    def devices(self) -> list[DeviceInfo]:
        # The gateway grants slots 0..N-1 of a node; which physical GPU backs a slot is
        # the device plugin's choice inside the pod, so there is no UUID to show.
        return [
            DeviceInfo(
                node=n.name,
                index=i,
                flavor=n.flavor,
                model=n.model or n.flavor,
                uuid="",
                memory_total=n.memory_mib * MiB,
            )
            for n in self._nodes.values()
            for i in range(n.gpus)
        ]

    def sample(self) -> list[DeviceSample]:
        # No NVML in the gateway's pod: nothing measured here is better than zeros.
        return []

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        await self._source.close()


class ClusterScaler(Scaler):
    """Scale-up through cluster objects: the nodes wanted per flavor (desired minus
    ready) handed to a target loaded by name from `jupyter_gpuaas.kubernetes.scaleup`.
    The target creates what makes the cluster autoscaler add Nodes; the Nodes then join
    through ClusterInventory, and the wanted count (and the object) goes back to 0."""

    target = Unicode(help="Dotted name of the scale-up target class.").tag(config=True)

    namespace = Unicode(
        help="Namespace of the scale-up objects. Default: the gateway pod's own."
    ).tag(config=True)

    @default("namespace")
    def _namespace_default(self) -> str:
        try:
            with open(_SA_NAMESPACE, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            return "default"

    flavors = Dict(
        help="""Flavors to scale: {"a100": {"node_selector": {...}, "resource":
        "nvidia.com/gpu", "tolerations": [...], "gpus_per_node": 8}} (written by
        `jupyter-gpuaas kubernetes manifests`).""",
    ).tag(config=True)

    provisioning_class = Unicode(
        "check-capacity.autoscaling.x-k8s.io",
        help="""ProvisioningRequest class: check-capacity.autoscaling.x-k8s.io, or
        best-effort-atomic-scale-up.autoscaling.x-k8s.io.""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._target = import_item(self.target)(
            self.flavors, namespace=self.namespace, provisioning_class=self.provisioning_class
        )

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        wanted = {f: max(0, n - ready.get(f, 0)) for f, n in desired.items()}
        async with self._apply_lock:
            try:
                await self._target.apply(wanted)
            except Exception as e:  # never into the gateway: retried on the next change
                self.log.error("scale-up through %s failed: %s", self.target, e)
                return
            self.last_applied.update(desired)

    async def close(self) -> None:
        await self._target.close()


class ProvisioningRequestScaler(ClusterScaler):
    """A ProvisioningRequest per flavor that needs nodes (cluster autoscaler)."""

    @default("target")
    def _target_default(self) -> str:
        return "jupyter_gpuaas.kubernetes.scaleup.ProvisioningRequests"


class PlaceholderScaler(ClusterScaler):
    """Placeholder Deployments' replicas set to the nodes wanted (cluster autoscaler)."""

    @default("target")
    def _target_default(self) -> str:
        return "jupyter_gpuaas.kubernetes.scaleup.Placeholders"
