"""The gateway's view of GPUs: an inventory of nodes and devices, and their live samples.

Two inventories exist. `NvmlInventory` reads this machine's GPUs through NVML
(nvidia-ml-py, imported as `pynvml`); without an NVML library it holds zero GPUs and says
so in one log line and in `message`, because silently scheduling onto nothing is the
failure mode this project exists to remove. `SimulatedInventory` invents nodes from a spec
(`simulated:a100=2x4,t4=1x8`) for the demo and tests, and says loudly that it is simulated.

`sample()` is synchronous, fast and never raises: the gateway calls it every few seconds
(in an executor if it likes) and a device that fails to answer is reported unhealthy, not
turned into an exception that would stop the sampling loop for every other device.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import uuid
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("jupyter_gpuaas.devices")

GiB = 1024**3
MiB = 1024**2

_SLUG_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the admission core sees it: a device index on a node of a flavor."""

    node: str
    index: int
    flavor: str
    model: str
    uuid: str
    memory_total: int  # bytes


@dataclass
class DeviceSample:
    """One reading of one GPU.

    `temperature` and `power` are None where the device does not report them (NVML's
    NotSupported), rather than a made-up zero that a dashboard would plot as real.
    `processes` maps host PIDs seen on the device to their utilization (0..1); a PID that
    holds a context but was idle in the last window shows with 0.0.
    """

    node: str
    index: int
    utilization: float  # 0..1
    memory_used: int  # bytes
    temperature: float | None  # °C
    power: float | None  # W
    healthy: bool
    processes: dict[int, float] = field(default_factory=dict)
    error: str = ""  # why the device is unhealthy, for the log and the devices page


@dataclass(frozen=True)
class NodeInfo:
    name: str
    flavor: str
    gpus: int


def slugify(text: str) -> str:
    """A label-safe name: lower case, [a-z0-9-], no leading or trailing dash."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "gpu"


# Words in NVML model names that say nothing about which pool a GPU belongs to.
_MODEL_NOISE = re.compile(
    r"^(nvidia|tesla|geforce|quadro|generation|pcie|sxm\d*|nvl|hbm\d*e?|\d+gb|\d+g|oam)$"
)


def flavor_from_model(model: str) -> str:
    """Derive a flavor slug from an NVML model name.

    "NVIDIA H200" → "h200", "NVIDIA A100-SXM4-80GB" → "a100", "Tesla T4" → "t4",
    "NVIDIA H100 80GB HBM3" → "h100", "NVIDIA GeForce RTX 4090" → "rtx-4090". Memory size
    and form factor are dropped on purpose: a flavor is what a user asks for, and an
    80 GB A100 next to a 40 GB one is a distinction to make with `nvml:flavor=` if it
    matters.
    """
    words = [w for w in re.split(r"[\s_\-/]+", model.lower()) if w]
    kept = [w for w in words if not _MODEL_NOISE.match(w)]
    return slugify("-".join(kept))


class Inventory:
    """Nodes and devices the gateway may grant, plus live samples of them."""

    simulated: bool = False
    message: str = ""

    def nodes(self) -> list[NodeInfo]:
        raise NotImplementedError

    def devices(self) -> list[DeviceInfo]:
        raise NotImplementedError

    def sample(self) -> list[DeviceSample]:
        raise NotImplementedError

    def add_node(self, flavor: str, gpus: int | None = None, name: str | None = None) -> NodeInfo:
        raise NotImplementedError(f"{type(self).__name__} cannot add nodes: only simulated ones")

    def remove_node(self, name: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot remove nodes: only simulated ones")

    def close(self) -> None:
        """Release the library handle, if any. Safe to call twice."""

    def to_json(self, samples: Iterable[DeviceSample] | None = None) -> dict[str, Any]:
        """The shape of `jupyter-gpuaas devices --json` (and a base for `GET api/devices`)."""
        by_key = {(s.node, s.index): s for s in (samples or ())}
        devices = []
        for d in self.devices():
            entry: dict[str, Any] = asdict(d)
            s = by_key.get((d.node, d.index))
            if s is not None:
                entry.update(
                    utilization=s.utilization,
                    memory_used=s.memory_used,
                    temperature=s.temperature,
                    power=s.power,
                    healthy=s.healthy,
                    processes={str(pid): u for pid, u in s.processes.items()},
                    error=s.error,
                )
            devices.append(entry)
        return {
            "simulated": self.simulated,
            "message": self.message,
            "nodes": [asdict(n) for n in self.nodes()],
            "devices": devices,
        }


# --- simulated -------------------------------------------------------------------------

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
_UUID_NS = uuid.UUID("5f1f6a4e-0c3b-4b8e-9a43-6a7e0c1d2b11")


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

    def _device(self, node: NodeInfo, index: int) -> DeviceInfo:
        model, memory, _, _ = self._figures(node.flavor)
        return DeviceInfo(
            node=node.name,
            index=index,
            flavor=node.flavor,
            model=f"{model} (simulated)",
            uuid=f"GPU-{uuid.uuid5(_UUID_NS, f'{node.name}/{index}')}",
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
        if not _SLUG_RE.match(flavor):
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


# --- NVML ------------------------------------------------------------------------------


class NvmlInventory(Inventory):
    """This machine's GPUs through NVML, as one node named after the host.

    A host with several GPU models becomes one node per flavor (`<host>-<flavor>`), since
    a node has one flavor; device indices are then positions within that node and the
    launcher should select devices by `uuid` (CUDA_VISIBLE_DEVICES accepts UUIDs).
    PIDs in `processes` are as NVML reports them: host PIDs, which differ from the
    container's own when the gateway runs in a separate PID namespace.
    """

    def __init__(
        self, flavor: str | None = None, node: str | None = None, quiet: bool = False
    ) -> None:
        """`quiet`: a machine without the NVML library is expected (a probe for GPU
        utilization on a CPU-only host), so say so at debug level, not as a warning."""
        # nvidia-ml-py is a dependency, but the C library it loads may be absent.
        import pynvml  # type: ignore[import-untyped]

        self._nvml = pynvml
        self._lock = threading.Lock()
        self._initialized = False
        self._handles: dict[tuple[str, int], Any] = {}
        self._devices: list[DeviceInfo] = []
        self._last_seen: dict[tuple[str, int], int] = {}
        host = node or slugify(socket.gethostname().split(".")[0])
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self.message = "no NVML library found: this gateway sees 0 GPUs"
            (log.debug if quiet else log.warning)(
                "%s (install the NVIDIA driver, or use --devices simulated:…)", self.message
            )
            return
        except pynvml.NVMLError as e:
            self.message = f"NVML failed to start ({e}): this gateway sees 0 GPUs"
            log.warning(self.message)
            return
        self._initialized = True
        found: list[tuple[int, Any, str, str, int]] = []
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            count = 0
            log.warning("NVML could not count devices: %s", e)
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(pynvml.nvmlDeviceGetName(handle))
                dev_uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError as e:
                # A device that cannot even describe itself is not grantable.
                log.warning("NVML device %d skipped: %s", i, e)
                continue
            found.append((i, handle, name, dev_uuid, memory))
        flavors = {flavor or flavor_from_model(name) for _, _, name, _, _ in found}
        positions: dict[str, int] = {}
        for _, handle, name, dev_uuid, memory in found:
            fl = flavor or flavor_from_model(name)
            node_name = host if len(flavors) == 1 else f"{host}-{fl}"
            index = positions.get(node_name, 0)
            positions[node_name] = index + 1
            self._handles[(node_name, index)] = handle
            self._devices.append(DeviceInfo(node_name, index, fl, name, dev_uuid, memory))
        summary = ", ".join(f"{n.name}: {n.gpus}× {n.flavor}" for n in self.nodes()) or "no devices"
        self.message = f"NVML: {summary}"
        log.info(self.message)

    def nodes(self) -> list[NodeInfo]:
        nodes: dict[str, NodeInfo] = {}
        for d in self._devices:
            prev = nodes.get(d.node)
            nodes[d.node] = NodeInfo(d.node, d.flavor, (prev.gpus if prev else 0) + 1)
        return list(nodes.values())

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def sample(self) -> list[DeviceSample]:
        with self._lock:
            return [self._sample_one(d) for d in self._devices]

    def _sample_one(self, d: DeviceInfo) -> DeviceSample:
        nv = self._nvml
        handle = self._handles[(d.node, d.index)]
        errors: list[str] = []

        def ask(what: str, fn: Any, *args: Any, essential: bool = True) -> Any:
            # NotSupported is a property of the model (no power sensor on some boards),
            # not a sign of ill health; any other error on an essential call is.
            try:
                return fn(handle, *args)
            except nv.NVMLError_NotSupported:
                return None
            except nv.NVMLError as e:
                if essential:
                    errors.append(f"{what}: {e}")
                return None
            except Exception as e:  # never let one device stop the sampling loop
                errors.append(f"{what}: {e!r}")
                return None

        util = ask("utilization", nv.nvmlDeviceGetUtilizationRates)
        mem = ask("memory", nv.nvmlDeviceGetMemoryInfo)
        temp = ask("temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        power_mw = ask("power", nv.nvmlDeviceGetPowerUsage, essential=False)
        processes = self._processes(d, handle)
        return DeviceSample(
            node=d.node,
            index=d.index,
            utilization=(util.gpu / 100.0) if util is not None else 0.0,
            memory_used=int(mem.used) if mem is not None else 0,
            temperature=float(temp) if temp is not None else None,
            power=power_mw / 1000.0 if power_mw is not None else None,
            healthy=not errors,
            processes=processes,
            error="; ".join(errors),
        )

    def _processes(self, d: DeviceInfo, handle: Any) -> dict[int, float]:
        """PIDs on the device: every compute context (0.0), then their recent SM share."""
        nv = self._nvml
        out: dict[int, float] = {}
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                out[int(p.pid)] = 0.0
        except Exception:
            pass  # NotSupported on some boards and in some containers
        key = (d.node, d.index)
        try:
            # Samples newer than the last one we saw, so utilization is this window's.
            rows = nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(key, 0))
        except Exception:
            rows = []  # NotFound when no process ran since then; NotSupported on old GPUs
        for row in rows:
            pid = int(row.pid)
            out[pid] = max(out.get(pid, 0.0), min(1.0, row.smUtil / 100.0))
            self._last_seen[key] = max(self._last_seen.get(key, 0), int(row.timeStamp))
        return out

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py returned bytes; current versions return str.
    return value.decode() if isinstance(value, bytes) else value


# --- spec ------------------------------------------------------------------------------

_SHAPE_RE = re.compile(r"^(\d+)x(\d+)$")


def parse_devices_spec(spec: str) -> Inventory:
    """`nvml`, `nvml:flavor=a100[,node=NAME]` or `simulated:a100=2x4,t4=1x8`.

    Raises ValueError with a one-line message naming what is wrong and what is expected.
    """
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "nvml":
        opts: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or key not in ("flavor", "node") or not value:
                raise ValueError(f"bad nvml option {item!r}: expected flavor=NAME or node=NAME")
            if not _SLUG_RE.match(value):
                raise ValueError(f"bad {key} {value!r}: use lower case letters, digits and -")
            opts[key] = value
        return NvmlInventory(flavor=opts.get("flavor"), node=opts.get("node"))
    if kind == "simulated":
        shapes: dict[str, tuple[int, int]] = {}
        items = [p.strip() for p in rest.split(",") if p.strip()]
        if not items:
            raise ValueError("simulated needs flavors, e.g. simulated:a100=2x4,t4=1x8")
        for item in items:
            flavor, eq, shape = (s.strip() for s in item.partition("="))
            m = _SHAPE_RE.match(shape)
            if not eq or not m:
                raise ValueError(
                    f"bad simulated flavor {item!r}: expected FLAVOR=NODESxGPUS, e.g. a100=2x4"
                )
            if not _SLUG_RE.match(flavor):
                raise ValueError(f"bad flavor {flavor!r}: use lower case letters, digits and -")
            if flavor in shapes:
                raise ValueError(f"flavor {flavor!r} given twice in {spec!r}")
            nodes, gpus = int(m.group(1)), int(m.group(2))
            if gpus < 1:
                raise ValueError(f"flavor {flavor!r} needs at least 1 GPU per node")
            shapes[flavor] = (nodes, gpus)
        return SimulatedInventory(shapes)
    raise ValueError(
        f"bad devices spec {spec!r}: expected nvml, nvml:flavor=NAME or "
        "simulated:FLAVOR=NODESxGPUS[,…]"
    )


# --- attribution -----------------------------------------------------------------------


@dataclass
class Attribution:
    """What the devices say about one request's activity."""

    request_id: Hashable
    user: str
    tenant: str
    devices: list[tuple[str, int]]
    utilization: float  # max device utilization over its devices (0..1)
    process_seen: bool  # any of its PIDs shows on any of its devices
    process_utilization: float | None  # max utilization of its own PIDs, None if unseen


Holder = tuple[Hashable, str, str, Iterable[int]]


def attribute(
    samples: Iterable[DeviceSample], holders: Mapping[tuple[str, int], Holder]
) -> dict[Hashable, Attribution]:
    """Per request: its max utilization and whether its processes show on its devices.

    `holders` maps (node, index) → (request_id, user, tenant, pids). Grants are exclusive,
    so a device's utilization is its holder's; `process_seen` tells the idle policy that a
    kernel still holds a context even while its utilization is zero. A device without a
    sample (gone, or not sampled yet) contributes nothing.
    """
    by_key = {(s.node, s.index): s for s in samples}
    out: dict[Hashable, Attribution] = {}
    for key, (request_id, user, tenant, pids) in holders.items():
        a = out.get(request_id)
        if a is None:
            a = out[request_id] = Attribution(request_id, user, tenant, [], 0.0, False, None)
        a.devices.append(key)
        s = by_key.get(key)
        if s is None:
            continue
        a.utilization = max(a.utilization, s.utilization)
        for pid in pids:
            if pid in s.processes:
                a.process_seen = True
                a.process_utilization = max(a.process_utilization or 0.0, s.processes[pid])
    return out
