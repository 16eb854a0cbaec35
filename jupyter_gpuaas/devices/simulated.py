"""Simulated GPUs: invented nodes for the demo, the tests and the simulator's gateway.

They say loudly that they are simulated (in their model names and the inventory's
message) and have no UUID, so a launch environment names plain indices and never a UUID
that looks real.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import SLUG_RE, DeviceInfo, DeviceSample, GiB, Inventory, MiB, NodeInfo, log

# Plausible figures for well-known flavors, so the demo's pages and dashboards look real.
# (model, memory bytes, idle watts, max watts)
_KNOWN_FLAVORS: dict[str, tuple[str, int, float, float]] = {
    "a100": ("NVIDIA A100-SXM4-80GB", 80 * GiB, 60.0, 400.0),
    "a10": ("NVIDIA A10", 24 * GiB, 30.0, 150.0),
    "h100": ("NVIDIA H100 80GB HBM3", 80 * GiB, 70.0, 700.0),
    "h200": ("NVIDIA H200", 141 * GiB, 75.0, 700.0),
    "l4": ("NVIDIA L4", 24 * GiB, 16.0, 72.0),
    "l40s": ("NVIDIA L40S", 48 * GiB, 35.0, 350.0),
    "t4": ("Tesla T4", 15360 * MiB, 10.0, 70.0),
    "v100": ("Tesla V100-SXM2-32GB", 32 * GiB, 40.0, 300.0),
}


@dataclass
class _Load:
    utilization: float = 0.0
    memory_used: int | None = None
    processes: dict[int, float] = field(default_factory=dict)
    healthy: bool = True


class SimulatedInventory(Inventory):
    """Invented nodes named `<flavor>-<n>` (from 0, as the simulator names them).

    Samples are idle unless `set_load` says otherwise, so tests and the demo decide what
    looks busy. Nodes come and go through `add_node`/`remove_node`, which the simulated
    scaler calls when the core decides a node is ready or gone.
    """

    simulated = True

    def __init__(self, shapes: Mapping[str, tuple[int, int]]) -> None:
        """`shapes`: flavor → (nodes, GPUs per node), in the spec's order."""
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._next: dict[str, int] = {}
        self._loads: dict[tuple[str, int], _Load] = {}
        self.gpus_per_node: dict[str, int] = {}
        for flavor, (count, gpus) in shapes.items():
            self.gpus_per_node[flavor] = gpus
            for _ in range(count):
                self.add_node(flavor, gpus)
        spec = ",".join(f"{f}={n}x{g}" for f, (n, g) in shapes.items())
        self.message = f"simulated devices: {spec} (no real GPUs)"

    def nodes(self) -> list[NodeInfo]:
        with self._lock:
            return list(self._nodes.values())

    def devices(self) -> list[DeviceInfo]:
        return [self._device(node, index) for node in self.nodes() for index in range(node.gpus)]

    def uuids(self, node: str, indices: Iterable[int]) -> list[str] | None:
        return None  # simulated devices have no UUID (see the module docstring)

    def _device(self, node: NodeInfo, index: int) -> DeviceInfo:
        model, memory, _, _ = self._figures(node.flavor)
        return DeviceInfo(
            node=node.name,
            index=index,
            flavor=node.flavor,
            model=f"{model} (simulated)",
            uuid="",  # nothing real to name: launchers fall back to the index
            memory_total=memory,
        )

    @staticmethod
    def _figures(flavor: str) -> tuple[str, int, float, float]:
        return _KNOWN_FLAVORS.get(flavor, (f"Simulated {flavor.upper()}", 16 * GiB, 30.0, 250.0))

    def set_load(
        self,
        node: str,
        index: int,
        utilization: float,
        *,
        memory_used: int | None = None,
        processes: Mapping[int, float] | None = None,
        healthy: bool = True,
    ) -> None:
        """Make a device look busy (or idle, or broken) from now on.

        Memory defaults to half the device scaled by utilization, so a busy device also
        looks like it holds memory; pass `memory_used` to say exactly.
        """
        if not 0.0 <= utilization <= 1.0:
            raise ValueError(f"utilization must be within 0..1, not {utilization}")
        self._loads[(node, index)] = _Load(
            utilization=utilization,
            memory_used=memory_used,
            processes=dict(processes or {}),
            healthy=healthy,
        )

    def sample(self) -> list[DeviceSample]:
        samples = []
        for node in self.nodes():
            _, memory, idle_w, max_w = self._figures(node.flavor)
            for index in range(node.gpus):
                load = self._loads.get((node.name, index), _Load())
                util = load.utilization
                used = load.memory_used
                if used is None:
                    used = int(memory * util * 0.5)
                samples.append(
                    DeviceSample(
                        node=node.name,
                        index=index,
                        utilization=util,
                        memory_used=used,
                        temperature=round(32.0 + 50.0 * util, 1),
                        power=round(idle_w + (max_w - idle_w) * util, 1),
                        healthy=load.healthy,
                        processes=dict(load.processes),
                        error="" if load.healthy else "simulated failure",
                    )
                )
        return samples

    def add_node(self, flavor: str, gpus: int | None = None, name: str | None = None) -> NodeInfo:
        """Add a node; `name` is the core's when it decided node_ready, else the next free."""
        if not SLUG_RE.match(flavor):
            raise ValueError(f"bad flavor name {flavor!r}: use lower case letters, digits, -")
        if gpus is None:
            if flavor not in self.gpus_per_node:
                raise ValueError(f"unknown flavor {flavor!r}: say how many GPUs its nodes have")
            gpus = self.gpus_per_node[flavor]
        if gpus < 1:
            raise ValueError(f"a node needs at least one GPU, not {gpus}")
        with self._lock:
            self.gpus_per_node.setdefault(flavor, gpus)
            n = self._next.get(flavor, 0)
            if name is None:
                while f"{flavor}-{n}" in self._nodes:
                    n += 1
                name = f"{flavor}-{n}"
                self._next[flavor] = n + 1
            elif name in self._nodes:
                raise ValueError(f"node {name!r} already exists")
            else:
                # Keep the counter past any name the core chose, so a name is never
                # reused while the core may still remember it.
                suffix = name.removeprefix(f"{flavor}-")
                if suffix.isdigit():
                    self._next[flavor] = max(n, int(suffix) + 1)
            info = NodeInfo(name=name, flavor=flavor, gpus=gpus)
            self._nodes[name] = info
        log.info("simulated node %s added: %d× %s", name, gpus, flavor)
        return info

    def remove_node(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is None:
                raise KeyError(f"no node named {name!r}")
            for key in [k for k in self._loads if k[0] == name]:
                del self._loads[key]
        log.info("simulated node %s removed", name)
