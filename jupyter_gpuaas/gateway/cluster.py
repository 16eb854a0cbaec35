"""`--devices kubernetes`: the inventory is the cluster's GPU Nodes, followed live.

The Node list and watch live in `jupyter_gpuaas.kubeapi.nodes`, and the scale-up objects
in `jupyter_gpuaas.kubeapi.scaleup`: on the floor below the gateway (ARCHITECTURE.md), so
the gateway imports them as it imports the core, and they never see the gateway: the
source only yields joins and leaves of plain (name, flavor, GPUs) nodes. A deployment may
still name another source or target class in its config (`source`, `target`).

The arbiter asks for two things an inventory read once at start cannot give:
`prepare()` lists the Nodes before the queue is restored (so restored grants find their
nodes), and `follow(joined, left)` hands every later join and leave to the core, so a
scale-up ends when its Node really joins and a Node that dies releases its grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from traitlets import Dict, Unicode, default
from traitlets.config import LoggingConfigurable
from traitlets.utils.importstring import import_item

from ..admission.model import State
from ..devices import DeviceInfo, DeviceSample, Inventory, NodeInfo
from ..kubeapi.connect import own_namespace
from ..kubeapi.nodes import NodeWatch
from ..kubeapi.scaleup import Placeholders, ProvisioningRequests
from .scalers import Scaler

if TYPE_CHECKING:
    from ..admission.core import AdmissionCore

log = logging.getLogger("jupyter_gpuaas.devices")
MiB = 1024**2

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
        "",
        help="""Dotted name of another node source than the cluster's Nodes
        (`jupyter_gpuaas.kubeapi.nodes.NodeWatch`): a class taking flavors= and
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
            source: Any = import_item(self.source) if self.source else NodeWatch
            self._source = source(flavors=self.flavors, label_selector=self.label_selector)
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
    ready) handed to a target of `jupyter_gpuaas.kubeapi.scaleup` (`target_class`).
    The target creates what makes the cluster autoscaler add Nodes; the Nodes then join
    through ClusterInventory, and the wanted count (and the object) goes back to 0."""

    target = Unicode(
        help="Dotted name of another scale-up target class than the scaler's own."
    ).tag(config=True)

    # The scale-up target each scaler drives unless `target` names another.
    target_class: Any = None

    namespace = Unicode(
        help="Namespace of the scale-up objects. Default: the gateway pod's own."
    ).tag(config=True)

    @default("namespace")
    def _namespace_default(self) -> str:
        return own_namespace()

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
        target: Any = import_item(self.target) if self.target else self.target_class
        if target is None:
            raise ValueError(f"{type(self).__name__}: no scale-up target: set `target`")
        self._target_name = self.target or f"{target.__module__}.{target.__qualname__}"
        self._target = target(
            self.flavors, namespace=self.namespace, provisioning_class=self.provisioning_class
        )

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        wanted = {f: max(0, n - ready.get(f, 0)) for f, n in desired.items()}
        async with self._apply_lock:
            try:
                await self._target.apply(wanted)
            except Exception as e:  # never into the gateway: retried on the next change
                self.log.error("scale-up through %s failed: %s", self._target_name, e)
                return
            self.last_applied.update(desired)

    async def close(self) -> None:
        await self._target.close()


class BlockedHead(NamedTuple):
    """A queued request that quota would admit but no node can hold yet."""

    request: str
    flavor: str
    gpus: int


def blocked_heads(core: AdmissionCore, keep: Sequence[BlockedHead] = ()) -> list[BlockedHead]:
    """The capacity-blocked heads, in queue order (priority, then arrival): queued
    requests at the head of their bucket whose reason is `capacity`. A request behind
    such a head waits on that head, not on a node, so it asks for nothing of its own.
    A head of `keep` that nomination has not looked at since it changed (no reason yet)
    stays one: deleting and recreating its request would restart its provisioning."""
    kept = {h.request: h for h in keep}
    found: list[tuple[tuple[int, float, str], BlockedHead]] = []
    for req in core.live_requests():
        if req.state is not State.QUEUED:
            continue
        why = core.waiting_for(req.id)
        if why is None:
            if req.id not in kept:
                continue
            head = kept[req.id]
        elif why[0] != "capacity" or why[1].get("head"):
            continue
        else:
            head = BlockedHead(req.id, str(why[1]["flavor"]), int(why[1]["gpus"]))
        found.append(((-req.priority, req.submit_time, req.id), head))
    return [head for _, head in sorted(found)]


def heads_to_provision(
    heads: Sequence[BlockedHead], wanted: Mapping[str, int], per_node: Mapping[str, int]
) -> list[BlockedHead]:
    """The heads that the nodes still wanted would hold, in their order.

    The core sized `wanted` (desired minus ready nodes per flavor) by packing the waiting
    sizes first-fit decreasing, capped by policy.autoscale's max_nodes; packing the heads
    the same way into those nodes asks the autoscaler for no more than that cap. A head
    wider than a node, or of a flavor that may not grow, gets nothing.
    """
    chosen: set[BlockedHead] = set()
    for flavor in {h.flavor for h in heads}:
        free = [per_node.get(flavor, 0)] * wanted.get(flavor, 0)
        mine = [h for h in heads if h.flavor == flavor]
        for head in sorted(mine, key=lambda h: -h.gpus):  # stable: queue order per size
            for i, room in enumerate(free):
                if room >= head.gpus:
                    free[i] = room - head.gpus
                    chosen.add(head)
                    break
    return [h for h in heads if h in chosen]


class ProvisioningRequestScaler(ClusterScaler):
    """A ProvisioningRequest per capacity-blocked head (cluster autoscaler).

    Each head gets one, of one pod shaped like it: its own GPUs of the flavor's
    resource, not a whole node's. The set follows the queue after every committed change
    (`queue_changed`), not only when the node counts do: a head admitted on a node that
    joined, cancelled, or ended has its request and template deleted, and the next head
    in its place gets its own. Syncs run one at a time; a change that comes during one is
    synced right after it, and a sync that fails is retried on the next change.
    """

    target_class = ProvisioningRequests

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan: list[BlockedHead] = []  # the heads the objects should stand for
        self._synced: list[BlockedHead] | None = None  # what they were last made to say
        self._desired: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def queue_changed(self, core: AdmissionCore) -> None:
        desired = dict(core.desired_nodes())
        ready: dict[str, int] = {}
        for node in core.nodes():
            ready[node.flavor] = ready.get(node.flavor, 0) + 1
        wanted = {f: max(0, n - ready.get(f, 0)) for f, n in desired.items()}
        per_node = {name: f.gpus_per_node for name, f in core.config.flavors.items()}
        # With no node wanted no head can be provisioned: skip the scan of the whole queue
        # that finding the blocked heads costs (it runs after every committed change).
        heads = blocked_heads(core, keep=self._plan) if any(wanted.values()) else []
        self._plan = heads_to_provision(heads, wanted, per_node)
        self._desired = desired
        if self._plan == self._synced or (self._task is not None and not self._task.done()):
            return  # in sync, or the running sync takes the new plan when it is done
        try:
            self._task = asyncio.get_running_loop().create_task(self._sync())
        except RuntimeError:  # no loop (restore before serving): the next change syncs
            pass

    async def _sync(self) -> None:
        async with self._apply_lock:
            while self._plan != self._synced:
                plan, desired = self._plan, self._desired
                try:
                    await self._target.sync([tuple(h) for h in plan])
                except Exception as e:  # never into the gateway: retried on the next change
                    self.log.error("scale-up through %s failed: %s", self._target_name, e)
                    return
                self._synced = plan
                self.last_applied.update(desired)

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        """Nothing per flavor: the requests follow the heads (`queue_changed`)."""

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await super().close()


class PlaceholderScaler(ClusterScaler):
    """Placeholder Deployments' replicas set to the nodes wanted (cluster autoscaler)."""

    target_class = Placeholders
