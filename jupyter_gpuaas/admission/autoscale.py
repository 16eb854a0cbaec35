"""The scale side of the core: nodes asked for, on their way, and given back.

Only requests that quota would admit but no node can hold ask for nodes (the core collects
their sizes); this module turns them into node counts, names the new nodes, and removes
autoscaled nodes that stay empty for `scale_down_after`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Final

from .ledger import Ledger
from .model import Config, Decision
from .nodes import Cluster, Node
from .queues import BucketKey, TenantQueue
from .timers import Timers

# Timer kinds (Final: compiled, a plain module constant is a dict lookup at each use).
READY: Final = "node_ready"
SCALE_DOWN: Final = "scale_down"


def capacity_flavor(
    tenant: str, bkey: BucketKey, flavors: Iterable[str], ledger: Ledger, cluster: Cluster
) -> str | None:
    """The flavor a capacity-blocked head waits for devices of, as its nomination would
    name it now: the first of its flavors whose quota would admit it and where no node
    has room (None: quota holds it back everywhere). Asked afresh, not remembered: an
    admission or a release of its tree may have moved quota from one flavor to another
    while the head slept, and its demand for nodes moves with it."""
    pin, gpus = bkey
    for f in (pin,) if pin else flavors:
        if ledger.fits(tenant, f, gpus) and cluster.widest_gap(f) < gpus:
            return f
    return None


def scale_sizes(
    config: Config,
    capacity_blocked: dict[tuple[str, BucketKey], str],
    queues: Mapping[str, TenantQueue],
    ledger: Ledger,
    cluster: Cluster,
    resume_blocked: Mapping[str, tuple[str, int]],
) -> dict[str, list[int]]:
    """Sizes of the requests that only more nodes could place, per autoscaled flavor.

    Bucket heads held back by capacity count as many of their bucket as quota admits
    together (tried on the ledger, then undone), in the flavor `capacity_flavor` names
    now; parked requests waiting to resume (`resume_blocked`:
    id -> flavor, gpus) count too. Buckets that are gone are dropped from
    `capacity_blocked`.
    """
    sizes: dict[str, list[int]] = defaultdict(list)
    if not capacity_blocked and not resume_blocked:
        return sizes  # (most cycles: asked after each one)
    tentative: list[tuple[str, str, int]] = []
    # The trial admissions are taken back with the pools' versions, so this question,
    # asked at every cycle, does not look like a change of usage to the bounds.
    versions: dict[tuple[str, str], int] = {}
    autoscale = config.policy.autoscale
    for tenant, bkey in list(capacity_blocked):
        bucket = queues[tenant].buckets.get(bkey)
        if bucket is None:
            del capacity_blocked[(tenant, bkey)]
            continue
        pin, gpus = bkey
        if pin is not None and pin not in autoscale:
            continue  # (pinned: no other flavor to move to)
        flavor = capacity_flavor(tenant, bkey, config.tenants[tenant].quota, ledger, cluster)
        if flavor is None or flavor not in autoscale:
            continue  # (None: quota holds it back now; its next nomination drops it)
        n = 0
        while n < bucket.count and ledger.fits(tenant, flavor, gpus):
            pool = ledger.pool_of(tenant, flavor)
            if pool not in versions:
                versions[pool] = ledger.version(pool).n
            ledger.add(tenant, flavor, gpus)
            tentative.append((tenant, flavor, gpus))
            n += 1
        sizes[flavor] += [gpus] * n
    ledger.undo(tentative, versions)
    for flavor, gpus in resume_blocked.values():
        if flavor in autoscale:
            sizes[flavor].append(gpus)
    return sizes


def nodes_needed(sizes: Iterable[int], gpus_per_node: int, provisioning: int, limit: int) -> int:
    """New nodes to ask for so that requests of `sizes` GPUs can each be placed on one node.

    First-fit decreasing over the `provisioning` nodes already on their way, then over new
    ones; never more than `limit` new nodes. Sizes wider than a node are skipped: no node
    of this flavor will ever hold them.
    """
    free = [gpus_per_node] * provisioning
    new = 0
    for size in sorted(sizes, reverse=True):
        if size > gpus_per_node:
            continue
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                break
        else:
            if new >= limit:
                break
            new += 1
            free.append(gpus_per_node - size)
    return new


class Autoscaler:
    def __init__(self, cluster: Cluster, timers: Timers) -> None:
        self._cluster = cluster
        self._timers = timers
        self.provisioning: dict[str, dict[str, float]] = defaultdict(dict)  # flavor->node->t
        self.desired: dict[str, int] = {}

    def plan(self, config: Config, sizes: Mapping[str, list[int]], now: float) -> list[Decision]:
        """Ask for the nodes that waiting `sizes` (GPUs per request, by flavor) need."""
        out: list[Decision] = []
        for flavor, auto in config.policy.autoscale.items():
            spec = config.flavors[flavor]
            ready = len(self._cluster.of(flavor))
            coming = len(self.provisioning[flavor]) if auto.provision else 0
            room = max(0, auto.max_nodes - ready - coming)
            wanted = sizes.get(flavor)
            new = nodes_needed(wanted, spec.gpus_per_node, coming, room) if wanted else 0
            if new and auto.provision:
                for name in self._new_names(flavor, new):
                    self.provisioning[flavor][name] = now + auto.provision_delay
                    self._timers.set(READY, name, now + auto.provision_delay)
                out.append(Decision(now, "scale_up", None, {"flavor": flavor, "nodes": new}))
                coming += new
                new = 0
            # Without provisioning of its own (a real scaler), the core only says how many.
            self.desired[flavor] = ready + coming + new
        return out

    def _new_names(self, flavor: str, n: int) -> list[str]:
        taken = set(self._cluster.nodes) | set(self.provisioning[flavor])
        names: list[str] = []
        i = 0
        while len(names) < n:
            name = f"{flavor}-{i}"
            if name not in taken:
                names.append(name)
            i += 1
        return names

    def joined(self, flavor: str, name: str) -> None:
        """A node the driver added: it is no longer on its way."""
        self.provisioning[flavor].pop(name, None)

    def node_ready(self, config: Config, name: str, now: float) -> Node | None:
        flavor = next((f for f, p in self.provisioning.items() if name in p), None)
        if flavor is None:
            return None
        del self.provisioning[flavor][name]
        node = self._cluster.add(flavor, name, config.flavors[flavor].gpus_per_node, True)
        self.arm_scale_down(config, node, now)
        return node

    def arm_scale_down(self, config: Config, node: Node, now: float) -> None:
        auto = config.policy.autoscale.get(node.flavor)
        if node.autoscaled and auto is not None and auto.provision:
            node.empty_since = now
            self._timers.set(SCALE_DOWN, node.name, now + auto.scale_down_after)

    def scale_down(self, name: str, now: float) -> Decision | None:
        node = self._cluster.nodes.get(name)
        if node is None or node.holders:
            return None
        self._cluster.remove(name)
        self.desired[node.flavor] = max(0, self.desired.get(node.flavor, 0) - 1)
        return Decision(now, "scale_down", None, {"flavor": node.flavor, "node": name})
