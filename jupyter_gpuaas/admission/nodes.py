"""Nodes and devices: where an admitted request's GPUs physically are.

A request runs on one node. Placement is best fit: the node of the flavor with the fewest
free devices that still has enough, lowest node index on a tie, lowest device indices
first. Best fit keeps whole nodes free for wide requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .heap import heappop, heappush
from .model import Request


@dataclass
class Node:
    name: str
    flavor: str
    gpus: int
    order: int  # tie-breaker for placement: creation order
    autoscaled: bool = False
    holders: dict[int, str] = field(default_factory=dict)  # device index -> request id
    empty_since: float | None = None  # for scale-down; None while any device is bound
    free: int = -1  # devices without a holder, kept by bind/unbind (placement reads it a lot)

    def __post_init__(self) -> None:
        self.free = self.gpus - len(self.holders)

    def free_devices(self, n: int) -> tuple[int, ...]:
        out = []
        for d in range(self.gpus):
            if d not in self.holders:
                out.append(d)
                if len(out) == n:
                    break
        return tuple(out)


class Cluster:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self._by_flavor: dict[str, list[Node]] = {}
        self._free: dict[str, int] = {}  # free devices per flavor
        # flavor -> free devices -> nodes with exactly that many free: best fit looks at
        # a handful of these instead of every node.
        self._by_free: dict[str, dict[int, dict[str, Node]]] = {}
        # The same nodes as heaps of (creation order, name), so that best fit's oldest node
        # is found without a look at each of thousands: a node that moved on to another
        # free count (or went) stays behind, stale, until it reaches the top.
        self._oldest: dict[tuple[str, int], list[tuple[int, str]]] = {}
        self._widest: dict[str, int] = {}  # most devices of one node, per flavor
        # Most free devices on one node, per flavor: "does anything fit?" is the question
        # the admission cycle asks most, so it is kept up to date rather than searched.
        self._gap: dict[str, int] = {}
        self._order = 0

    def add(self, flavor: str, name: str, gpus: int, autoscaled: bool = False) -> Node:
        if name in self.nodes:
            raise ValueError(f"node {name!r} exists")
        node = Node(name, flavor, gpus, self._order, autoscaled)
        self._order += 1
        self.nodes[name] = node
        self._by_flavor.setdefault(flavor, []).append(node)
        self._free[flavor] = self._free.get(flavor, 0) + node.free
        self._by_free.setdefault(flavor, {}).setdefault(node.free, {})[name] = node
        self._file_oldest(node)
        self._widest[flavor] = max(self._widest.get(flavor, 0), gpus)
        self._gap[flavor] = max(self._gap.get(flavor, 0), node.free)
        return node

    def remove(self, name: str) -> Node:
        node = self.nodes.pop(name)
        self._by_flavor[node.flavor].remove(node)
        self._free[node.flavor] -= node.free
        del self._by_free[node.flavor][node.free][name]
        self._gap[node.flavor] = self._search_gap(node.flavor)
        return node

    def of(self, flavor: str) -> list[Node]:
        return self._by_flavor.get(flavor, [])

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def free_in(self, flavor: str) -> int:
        return self._free.get(flavor, 0)

    def widest_gap(self, flavor: str) -> int:
        """The most free devices on one node of the flavor: the widest request it can take."""
        return self._gap.get(flavor, 0)

    def _search_gap(self, flavor: str) -> int:
        by_free = self._by_free.get(flavor, {})
        for free in range(self._widest.get(flavor, 0), 0, -1):
            if by_free.get(free):
                return free
        return 0

    def has_room(self, flavor: str, gpus: int, freed: dict[str, int]) -> bool:
        """Would some node of the flavor fit `gpus`, counting `freed` devices (by node
        name) as free too? The preemption search asks this for every victim it adds."""
        if self._gap.get(flavor, 0) >= gpus:
            return True
        nodes = self.nodes
        for name, n in freed.items():
            node = nodes.get(name)
            if n and node is not None and node.flavor == flavor and node.free + n >= gpus:
                return True
        return False

    def has_room_without(self, flavor: str, gpus: int, holders: Iterable[Request]) -> bool:
        """Would some node of the flavor fit `gpus` with all of `holders` gone? Where a node
        has the room already (most preemption searches wait for quota), no tally."""
        if self._gap.get(flavor, 0) >= gpus:
            return True
        freed: dict[str, int] = {}
        for v in holders:
            node = v.node or ""
            freed[node] = freed.get(node, 0) + v.gpus
        return self.has_room(flavor, gpus, freed)

    def best_fit(self, flavor: str, gpus: int) -> Node | None:
        """The node to place `gpus` on: fewest free devices that suffice, oldest on a tie."""
        by_free = self._by_free.get(flavor, {})
        for free in range(gpus, self._gap.get(flavor, 0) + 1):
            nodes = by_free.get(free)
            if nodes:
                heap = self._oldest[(flavor, free)]
                while True:
                    order, name = heap[0]
                    node = nodes.get(name)
                    if node is not None and node.order == order:
                        return node
                    heappop(heap)
        return None

    def _file_oldest(self, node: Node) -> None:
        key = (node.flavor, node.free)
        heap = self._oldest.setdefault(key, [])
        heappush(heap, (node.order, node.name))
        if len(heap) > 2 * len(self._by_free[node.flavor][node.free]) + 64:
            nodes = self._by_free[node.flavor][node.free]
            heap[:] = sorted((n.order, n.name) for n in nodes.values())  # sorted: a heap

    def bind(self, node: Node, rid: str, devices: Iterable[int]) -> None:
        before = node.free
        for d in devices:
            if d in node.holders:  # never two holders for one device
                raise RuntimeError(f"device {node.name}:{d} already held by {node.holders[d]}")
            node.holders[d] = rid
            node.free -= 1
            self._free[node.flavor] -= 1
        self._refile(node, before)
        node.empty_since = None

    def unbind(self, node_name: str, devices: Iterable[int], now: float) -> Node | None:
        node = self.nodes.get(node_name)
        if node is None:
            return None
        before = node.free
        for d in devices:
            if node.holders.pop(d, None) is not None:
                node.free += 1
                self._free[node.flavor] += 1
        self._refile(node, before)
        if not node.holders:
            node.empty_since = now
        return node

    def _refile(self, node: Node, before: int) -> None:
        free = node.free
        if free != before:
            flavor = node.flavor
            by_free = self._by_free[flavor]
            left = by_free[before]
            del left[node.name]
            by_free.setdefault(free, {})[node.name] = node
            self._file_oldest(node)
            gap = self._gap[flavor]
            if free > gap:
                self._gap[flavor] = free
            elif before == gap and not left:
                self._gap[flavor] = self._search_gap(flavor)

    def capacity(self, flavor: str) -> int:
        return sum(n.gpus for n in self._by_flavor.get(flavor, ()))
