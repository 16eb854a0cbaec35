"""Prometheus metrics of one gateway, with the names of INTERFACES.md.

Each `GatewayMetrics` owns its own `CollectorRegistry`, so several gateways in one test
process (or one process embedding two) never clash on the global registry.

Events (an admission's wait, a cull, a preemption) are counters and a histogram updated
as they happen. State (queues, quotas, devices) is a snapshot the gateway hands over after
each admission cycle and sampling tick; a custom collector renders the latest snapshot at
scrape time, so a series whose tenant, flavor or device disappeared disappears with it, and
a scrape never sees half of an old snapshot and half of a new one.

User names stay out of the labels by default: the device series keep their `user` label
(so the label set is the same whether or not it is filled, and dashboards need no second
query), but it is the empty string unless the gateway runs with `--metrics-user-label`.
A scrape can travel through the public proxy, and who computes on which GPU is not
something every scraper should read.

Replicas (leader.py): every gateway exports `gpuaas_leader` (1 on the leader, 0 on a
standby). A standby keeps a mirror of the same queue, quotas and devices, so were it to
export them, every `sum()` over the pods would count the queue twice; it exports none of
the snapshot gauges (only `gpuaas_leader`, `gpuaas_devices_simulated` and its counters,
which count only what it decided itself while it led). A query over all pods therefore
reads the leader's series alone, and a failover moves them to the new leader.

Joining NVIDIA's dcgm-exporter: the device series also carry dcgm-exporter's own labels
(`gpu`, `UUID`, `modelName`, `Hostname`, and `GPU_I_PROFILE` for a MIG instance, whose
`UUID` is then its GPU's, as dcgm-exporter labels it; `gpu` is empty where a position on
a node is not NVML's index), so `on(UUID)` joins the two.
`gpuaas_grant_info{UUID, GPU_I_PROFILE, Hostname, tenant, user, flavor}` (1 per granted
device with a known UUID) charges dcgm-exporter's series to tenants, e.g.
`DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(tenant) gpuaas_grant_info` (MIG instances of
one GPU share its UUID: join them on `GPU_I_PROFILE` too); its `user` follows the same
rule as the device series'. A device without a UUID (simulated; a cluster's Node, whose
GPUs the device plugin picks inside the pod) has `UUID=""` on its device series and no
grant_info from the inventory. In Kubernetes mode only the pod knows which GPUs it got:
its holder reports their UUIDs in its heartbeats (`uuids`, what the container sees), and
each whole GPU of those (`GPU-…`) is a grant_info series with `Hostname` the grant's
Node (dcgm-exporter's DaemonSet names its series by the Node it runs on) and no
`GPU_I_PROFILE`. A MIG instance's own `MIG-…` UUID is not the GPU's that dcgm-exporter
labels it with, so it is not exported; a holder that reported nothing (an older
client, no GPU visible) has no grant_info, and a gateway restart forgets the UUIDs until
the next heartbeat (they are not stored, as the device samples are not).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..devices import DeviceInfo, DeviceSample

# Admission waits range from an instant (free capacity) to hours (a busy pool at night).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, float("inf"))


@dataclass(frozen=True)
class TenantUsage:
    """GPUs of one tenant and flavor, as the quota ledger counts them."""

    tenant: str
    flavor: str
    quota: int
    admitted: int
    parked: int
    borrowed: int
    pending_gpus: int


@dataclass(frozen=True)
class PendingCount:
    tenant: str
    flavor: str
    kind: str
    count: int


# (sample, flavor, tenant or None, user or None): a device and who holds it, if anyone.
DeviceRow = tuple[DeviceSample, str, str | None, str | None]


@dataclass(frozen=True)
class ReportedGrant:
    """A granted GPU whose UUID only its holder knows (a cluster's Node: the device
    plugin picks the GPU inside the pod), as the holder's heartbeat reported it."""

    uuid: str
    hostname: str  # the Node's name: what dcgm-exporter's DaemonSet labels `Hostname`
    tenant: str
    user: str
    flavor: str


# The first five are INTERFACES.md's; the rest are dcgm-exporter's names for the same GPU.
_DEVICE_LABELS = [
    "node",
    "device",
    "flavor",
    "tenant",
    "user",
    "gpu",
    "UUID",
    "modelName",
    "Hostname",
    "GPU_I_PROFILE",
]
_GRANT_LABELS = ["UUID", "GPU_I_PROFILE", "Hostname", "tenant", "user", "flavor"]


@dataclass(frozen=True)
class _Snapshot:
    tenants: tuple[TenantUsage, ...] = ()
    pending: tuple[PendingCount, ...] = ()
    desired_nodes: tuple[tuple[str, int], ...] = ()
    idle_gpus: tuple[tuple[str, int], ...] = ()
    devices: tuple[DeviceRow, ...] = ()
    simulated: bool | None = None
    nodes: tuple[tuple[str, int], ...] = ()
    leader: bool = True
    reported: tuple[ReportedGrant, ...] = ()


class _SnapshotCollector(Collector):
    """Renders the gauges from whatever snapshot is current at scrape time."""

    def __init__(
        self,
        user_label: bool = False,
        devices: Callable[[], Iterable[DeviceInfo]] | None = None,
    ) -> None:
        self.snapshot = _Snapshot()
        self.user_label = user_label
        self.devices = devices

    def describe(self) -> list[Metric]:
        # Declared so the registry does not call collect() at registration, and so that
        # name clashes with the counters are caught then.
        return list(self._families(_Snapshot()))

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        # Read only where there are samples to label (a cluster's inventory has none).
        devices = self.devices() if self.devices and snap.devices else ()
        infos = {(d.node, d.index): d for d in devices}
        return iter(self._families(snap, self.user_label, infos))

    @staticmethod
    def _families(
        snap: _Snapshot,
        user_label: bool = False,
        infos: Mapping[tuple[str, int], DeviceInfo] | None = None,
    ) -> list[Metric]:
        infos = infos or {}
        # NVML's index is a device's position only on a host of whole GPUs of one model
        # (one node); elsewhere (several models, MIG) positions restart per node.
        named = [d for d in infos.values() if d.uuid]
        exact_gpu = len({d.node for d in named}) <= 1 and not any(d.mig_profile for d in named)
        tf = ["tenant", "flavor"]
        pending_req = GaugeMetricFamily(
            "gpuaas_pending_requests",
            "Queued requests per tenant, flavor and kind.",
            labels=["tenant", "flavor", "kind"],
        )
        pending_gpus = GaugeMetricFamily(
            "gpuaas_pending_gpus", "GPUs asked for by queued requests.", labels=tf
        )
        admitted = GaugeMetricFamily(
            "gpuaas_admitted_gpus", "GPUs bound to admitted requests.", labels=tf
        )
        parked = GaugeMetricFamily(
            "gpuaas_parked_gpus",
            "GPUs of quota reserved for parked (culled, resumable) requests.",
            labels=tf,
        )
        quota = GaugeMetricFamily("gpuaas_quota_gpus", "Nominal GPU quota.", labels=tf)
        borrowed = GaugeMetricFamily(
            "gpuaas_borrowed_gpus", "GPUs used beyond nominal quota, lent by the cohort.", labels=tf
        )
        desired = GaugeMetricFamily(
            "gpuaas_desired_nodes",
            "Nodes per flavor the queue needs: ready nodes plus the quota-admissible demand "
            "that capacity blocks (what KEDA scales on).",
            labels=["flavor"],
        )
        nodes = GaugeMetricFamily(
            "gpuaas_nodes",
            "Nodes per flavor the gateway places on now (desired minus this: the nodes a "
            "scale-up should add).",
            labels=["flavor"],
        )
        idle = GaugeMetricFamily(
            "gpuaas_idle_gpus",
            "GPUs held by grants that report idle (0 for a tenant with none).",
            labels=["tenant"],
        )
        util = GaugeMetricFamily(
            "gpuaas_device_utilization_ratio", "GPU utilization, 0..1.", labels=_DEVICE_LABELS
        )
        mem = GaugeMetricFamily(
            "gpuaas_device_memory_used_bytes", "GPU memory in use.", labels=_DEVICE_LABELS
        )
        temp = GaugeMetricFamily(
            "gpuaas_device_temperature_celsius", "GPU temperature.", labels=_DEVICE_LABELS
        )
        power = GaugeMetricFamily(
            "gpuaas_device_power_watts", "GPU power draw.", labels=_DEVICE_LABELS
        )
        healthy = GaugeMetricFamily(
            "gpuaas_device_healthy",
            "1 if the device answered every essential query in the last sample.",
            labels=_DEVICE_LABELS,
        )
        mem_total = GaugeMetricFamily(
            "gpuaas_device_memory_total_bytes",
            "GPU memory of the device (of the MIG instance, for one), used or not.",
            labels=_DEVICE_LABELS,
        )
        grant = GaugeMetricFamily(
            "gpuaas_grant_info",
            "1 per granted device with a UUID: who holds it, to charge dcgm-exporter's series "
            "(joined on UUID and Hostname) to tenants. In Kubernetes mode, 1 per whole GPU "
            "whose UUID the holder reported in its heartbeat, Hostname its Node. `user` is "
            "empty unless --metrics-user-label.",
            labels=_GRANT_LABELS,
        )
        simulated = GaugeMetricFamily(
            "gpuaas_devices_simulated", "1 if the inventory is simulated (no real GPUs)."
        )
        leader = GaugeMetricFamily(
            "gpuaas_leader",
            "1 on the gateway that decides, 0 on a standby (which exports no queue, quota "
            "or device gauges, so that sums over replicas count each once).",
        )
        leader.add_metric([], 1.0 if snap.leader else 0.0)
        if snap.simulated is not None:
            simulated.add_metric([], 1.0 if snap.simulated else 0.0)
        if not snap.leader:
            snap = _Snapshot()  # the families stay declared, without series

        for p in snap.pending:
            pending_req.add_metric([p.tenant, p.flavor, p.kind], p.count)
        for t in snap.tenants:
            labels = [t.tenant, t.flavor]
            pending_gpus.add_metric(labels, t.pending_gpus)
            admitted.add_metric(labels, t.admitted)
            parked.add_metric(labels, t.parked)
            quota.add_metric(labels, t.quota)
            borrowed.add_metric(labels, t.borrowed)
        for flavor, n in snap.desired_nodes:
            desired.add_metric([flavor], n)
        for flavor, n in snap.nodes:
            nodes.add_metric([flavor], n)
        # Every tenant, 0 included: an absent series would make averages over time (the
        # idle GPU-hours of the rules and the dashboard) count only the idle stretches.
        idle_of = dict(snap.idle_gpus)
        for tenant in dict.fromkeys([*(t.tenant for t in snap.tenants), *idle_of]):
            idle.add_metric([tenant], idle_of.get(tenant, 0))
        for s, dev_flavor, holder_tenant, holder_user in snap.devices:
            user = (holder_user or "") if user_label else ""
            info = infos.get((s.node, s.index))
            dcgm = _dcgm_labels(s, info, exact_gpu)
            labels = [s.node, str(s.index), dev_flavor, holder_tenant or "", user, *dcgm]
            if info is not None and info.memory_total:
                mem_total.add_metric(labels, info.memory_total)
            if holder_tenant and dcgm[1]:
                _, uuid, _, hostname, profile = dcgm
                grant.add_metric([uuid, profile, hostname, holder_tenant, user, dev_flavor], 1.0)
            util.add_metric(labels, s.utilization)
            mem.add_metric(labels, s.memory_used)
            if s.temperature is not None:
                temp.add_metric(labels, s.temperature)
            if s.power is not None:
                power.add_metric(labels, s.power)
            healthy.add_metric(labels, 1.0 if s.healthy else 0.0)
        for g in snap.reported:
            user = g.user if user_label else ""
            grant.add_metric([g.uuid, "", g.hostname, g.tenant, user, g.flavor], 1.0)
        return [
            leader,
            pending_req,
            pending_gpus,
            admitted,
            parked,
            quota,
            borrowed,
            desired,
            nodes,
            idle,
            util,
            mem,
            temp,
            power,
            healthy,
            mem_total,
            grant,
            simulated,
        ]


def _dcgm_labels(s: DeviceSample, info: DeviceInfo | None, exact_gpu: bool) -> list[str]:
    """dcgm-exporter's `gpu`, `UUID`, `modelName`, `Hostname`, `GPU_I_PROFILE` of a device.

    `gpu` is NVML's index where the position on the node is it (`exact_gpu`: a host of
    whole GPUs of one model), else empty (join on UUID). A MIG instance carries its GPU's
    UUID and its profile, as dcgm-exporter labels it. `Hostname`: NVML devices (the only
    ones with a UUID) are this machine's, which dcgm-exporter names by its host name;
    others (simulated, a cluster's Nodes, whose dcgm-exporter is told the Node's name)
    by their node.
    """
    if info is None:
        return [str(s.index), "", "", s.node, ""]
    uuid = info.parent_uuid if info.mig_profile else info.uuid
    hostname = socket.gethostname() if uuid else s.node
    gpu = str(s.index) if exact_gpu or not uuid else ""
    return [gpu, uuid, info.model, hostname, info.mig_profile]


class _StreamsCollector(Collector):
    """The event streams (api/events): open now, and dropped for falling behind."""

    def __init__(self) -> None:
        self.open = 0
        self.dropped = 0

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        streams = GaugeMetricFamily("gpuaas_event_streams", "Open event streams (api/events).")
        streams.add_metric([], self.open)
        dropped = CounterMetricFamily(
            "gpuaas_event_streams_dropped",
            "Event streams ended with a reset because their client fell too far behind.",
        )
        dropped.add_metric([], self.dropped)
        return [streams, dropped]


class GatewayMetrics:
    """All of one gateway's metrics and their rendering."""

    def __init__(
        self,
        *,
        user_label: bool = False,
        devices: Callable[[], Iterable[DeviceInfo]] | None = None,
    ) -> None:
        """`user_label`: name the holder in the device series' `user` label (else "").
        `devices`: the inventory's devices, read at each scrape for their UUID, model and
        memory (the dcgm-exporter labels); without it those labels are empty."""
        self.registry = CollectorRegistry()
        self._collector = _SnapshotCollector(user_label, devices)
        self.registry.register(self._collector)
        self._streams = _StreamsCollector()
        self.registry.register(self._streams)
        self.admission_wait = Histogram(
            "gpuaas_admission_wait_seconds",
            "Seconds from submit to admission.",
            ["tenant", "kind"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.culled = Counter(
            "gpuaas_culled",
            "Grants culled for idleness.",
            ["tenant", "kind"],
            registry=self.registry,
        )
        self.preempted = Counter(
            "gpuaas_preempted",
            "Admitted requests preempted to make room for others.",
            ["tenant", "kind"],
            registry=self.registry,
        )
        self.lease_expired = Counter(
            "gpuaas_lease_expired",
            "Grants ended because their holder stopped renewing the lease (a crashed "
            "server, kernel or job, or one cut off from the gateway).",
            ["tenant", "kind"],
            registry=self.registry,
        )

    def observe_wait(self, tenant: str, kind: str, seconds: float) -> None:
        self.admission_wait.labels(tenant=tenant, kind=kind).observe(max(0.0, seconds))

    def inc_culled(self, tenant: str, kind: str) -> None:
        self.culled.labels(tenant=tenant, kind=kind).inc()

    def inc_preempted(self, tenant: str, kind: str) -> None:
        self.preempted.labels(tenant=tenant, kind=kind).inc()

    def inc_lease_expired(self, tenant: str, kind: str) -> None:
        self.lease_expired.labels(tenant=tenant, kind=kind).inc()

    def set_snapshot(
        self,
        tenants: Iterable[TenantUsage],
        pending: Iterable[PendingCount],
        desired_nodes: Mapping[str, int],
        idle_gpus: Mapping[str, int],
        devices: Iterable[DeviceRow],
        simulated: bool | None = None,
        nodes: Mapping[str, int] | None = None,
        reported: Iterable[ReportedGrant] = (),
        leader: bool = True,
    ) -> None:
        """Replace every gauge's series with these; series absent here are dropped.

        `simulated`, when given, is exported as gpuaas_devices_simulated so dashboards can
        say that the numbers are invented. `leader`: False on a standby, whose gauges
        (a mirror of the leader's) are then left out; gpuaas_leader says which it is.
        `reported`: granted GPUs whose UUIDs their holders reported (gpuaas_grant_info
        where the inventory has no UUID: Kubernetes mode).
        """
        self._collector.snapshot = _Snapshot(
            tenants=tuple(tenants),
            pending=tuple(pending),
            desired_nodes=tuple(desired_nodes.items()),
            idle_gpus=tuple(idle_gpus.items()),
            devices=tuple(devices),
            simulated=simulated,
            nodes=tuple((nodes or {}).items()),
            leader=leader,
            reported=tuple(reported),
        )

    def set_event_streams(self, open_streams: int, dropped: int) -> None:
        """The event bus's counts, as of this scrape."""
        self._streams.open, self._streams.dropped = open_streams, dropped

    def render(self) -> tuple[bytes, str]:
        """The body and Content-Type of a `GET metrics` answer."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
