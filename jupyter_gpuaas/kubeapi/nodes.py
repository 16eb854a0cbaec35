"""The cluster's GPU Nodes, listed and watched through kubernetes_asyncio.

A flavor is a label selector (`{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}` from GPU
feature discovery, or a node pool label) and a resource name; a Node's GPUs are its
`status.allocatable` of that resource (`nvidia.com/gpu`, or a MIG resource such as
`nvidia.com/mig-1g.10gb`). A Node counts only while it is Ready and schedulable and
allocates at least one; its taints are kept, to be tolerated. Ready means its Ready
condition, and no not-ready or unreachable taint of the node lifecycle controller: a Node
that has just turned Ready keeps that taint a moment more, and its removal would otherwise
read as a change of shape (a leave and a join) that releases what was placed on it.

`node_view()` is the pure mapping (tested by dict equality). `NodeWatch` lists the Nodes
once (`list_nodes()`), then turns the watch into joins and leaves (`changes()`): it resumes from
the last resourceVersion after a disconnect and relists on 410 Gone, reporting what
changed in between. It knows nothing of the gateway, which imports it (gateway/cluster.py's
`ClusterInventory`): this package is on the floor below the gateway and imports nothing
above it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .connect import api_client, resumable_watch
from .meta import DEFAULT_RESOURCE

log = logging.getLogger("jupyter_gpuaas.kubeapi.nodes")

#: Labels of NVIDIA's GPU feature discovery, read for the devices page when present.
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB
#: Taints the node lifecycle controller puts on a Node the scheduler must not use yet.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(frozen=True)
class ClusterNode:
    """A Node that counts: Ready, schedulable, of a flavor, with GPUs to allocate."""

    name: str
    flavor: str
    gpus: int
    model: str = ""
    memory_mib: int = 0
    taints: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class NodeChange:
    """`join` (a Node starts counting) or `leave` (it stops: `reason` says why)."""

    kind: str
    name: str
    node: ClusterNode | None = None
    reason: str = ""


def check_flavors(flavors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The flavors config (`{name: {node_selector, resource, tolerations}}`), checked."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(flavors, Mapping) or not flavors:
        raise ValueError("flavors: name at least one flavor with its node_selector")
    for name, spec in flavors.items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"flavors.{name}: must be a mapping")
        selector = spec.get("node_selector")
        if not isinstance(selector, Mapping) or not selector:
            raise ValueError(
                f"flavors.{name}.node_selector: the labels of the flavor's nodes are required"
            )
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
            raise ValueError(f"flavors.{name}.node_selector: must map label names to strings")
        resource = spec.get("resource", DEFAULT_RESOURCE)
        if not isinstance(resource, str) or "/" not in resource:
            raise ValueError(f"flavors.{name}.resource: must be an extended resource name")
        out[str(name)] = {**dict(spec), "resource": resource}
    return out


def _quantity(value: Any) -> int:
    """A countable extended resource's quantity ("4"); anything else counts as none."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def flavor_of(labels: Mapping[str, str], flavors: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The first configured flavor whose selector the labels satisfy."""
    for name, spec in flavors.items():
        if all(labels.get(k) == v for k, v in (spec.get("node_selector") or {}).items()):
            return name
    return None


def node_view(
    node: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]
) -> tuple[ClusterNode | None, str]:
    """(the Node as the gateway counts it, or None with the reason it does not count)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    flavor = flavor_of(labels, flavors)
    if flavor is None:
        return None, "no flavor's labels"
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if not ready:
        return None, "NotReady"
    held = [t["key"] for t in spec.get("taints") or [] if t.get("key") in NOT_READY_TAINTS]
    if held:
        return None, f"NotReady (tainted {held[0]})"
    if spec.get("unschedulable"):
        return None, "cordoned (unschedulable)"
    resource = str(flavors[flavor].get("resource") or DEFAULT_RESOURCE)
    gpus = _quantity((status.get("allocatable") or {}).get(resource))
    if gpus < 1:
        return None, f"no allocatable {resource}"
    taints = tuple(
        {k: str(v) for k, v in t.items() if k in ("key", "value", "effect")}
        for t in spec.get("taints") or []
    )
    return (
        ClusterNode(
            name=name,
            flavor=flavor,
            gpus=gpus,
            model=str(labels.get(PRODUCT_LABEL) or ""),
            memory_mib=_quantity(labels.get(MEMORY_LABEL)),
            taints=taints,
        ),
        "",
    )


def diff(
    before: Mapping[str, ClusterNode], after: Mapping[str, ClusterNode], why: Mapping[str, str]
) -> list[NodeChange]:
    """Leaves, then joins, that turn `before` into `after` (a changed Node leaves and
    joins again: its grants were for the old shape)."""
    out = [
        NodeChange("leave", name, reason=why.get(name, "gone"))
        for name, old in before.items()
        if after.get(name) != old
    ]
    out += [
        NodeChange("join", name, node=new) for name, new in after.items() if before.get(name) != new
    ]
    return out


@dataclass
class NodeWatch:
    """List and watch the cluster's Nodes; see the module docstring."""

    flavors: Mapping[str, Mapping[str, Any]]
    label_selector: str = ""
    timeout_seconds: int = 300  # the API server closes each watch after this; we resume
    max_backoff: float = 30.0
    nodes: dict[str, ClusterNode] = field(default_factory=dict)
    resource_version: str = ""
    relists: int = 0  # how often a 410 Gone made us list again (for tests and the log)
    _api: Any = None
    _client: Any = None

    def __post_init__(self) -> None:
        self.flavors = check_flavors(self.flavors)

    async def _core(self) -> Any:
        if self._api is None:
            from kubernetes_asyncio import client

            self._client = await api_client()
            self._api = client.CoreV1Api(self._client)
        return self._api

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = self._api = None

    async def _list(self) -> tuple[dict[str, ClusterNode], dict[str, str], str]:
        api = await self._core()
        raw = await api.list_node(label_selector=self.label_selector, _preload_content=False)
        data = await raw.json()
        nodes: dict[str, ClusterNode] = {}
        why: dict[str, str] = {}
        for item in data.get("items") or []:
            view, reason = node_view(item, self.flavors)
            name = item["metadata"]["name"]
            if view is not None:
                nodes[name] = view
            else:
                why[name] = reason
        return nodes, why, str(data["metadata"]["resourceVersion"])

    async def list_nodes(self) -> list[ClusterNode]:
        """The Nodes that count now; the watch starts from this list's version."""
        self.nodes, _, self.resource_version = await self._list()
        log.info(
            "cluster inventory: %d GPU nodes (%s)",
            len(self.nodes),
            ", ".join(f"{n.name}: {n.gpus}x {n.flavor}" for n in self.nodes.values()) or "none",
        )
        return list(self.nodes.values())

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> list[NodeChange]:
        name = str(obj["metadata"]["name"])
        rv = obj["metadata"].get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return []
        old = self.nodes.get(name)
        if kind == "DELETED":
            view, reason = None, "deleted"
        else:
            view, reason = node_view(obj, self.flavors)
        if view == old:
            return []
        changes = diff({name: old} if old else {}, {name: view} if view else {}, {name: reason})
        if view is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = view
        return changes

    async def changes(self) -> AsyncIterator[NodeChange]:
        """Joins and leaves from the last list on, for as long as the caller iterates."""
        api = await self._core()
        async for change in resumable_watch(
            "node",
            api.list_node,
            label_selector=self.label_selector,
            version=lambda: self.resource_version,
            apply=self._apply,
            relist=self._relist,
            timeout_seconds=self.timeout_seconds,
            max_backoff=self.max_backoff,
        ):
            yield change

    async def _relist(self) -> list[NodeChange]:
        """After the watch's version expired: the Nodes now, and the joins and leaves since."""
        self.relists += 1
        nodes, why, rv = await self._list()
        changes = diff(self.nodes, nodes, why)
        self.nodes, self.resource_version = nodes, rv
        return changes
