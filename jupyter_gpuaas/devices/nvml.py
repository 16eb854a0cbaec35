"""This machine's GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Without an NVML library the inventory holds zero GPUs and says so in one log line and in
`message`, because silently scheduling onto nothing is the failure mode this project
exists to remove.

Every device carries NVML's UUID, which is what launchers name in `CUDA_VISIBLE_DEVICES`
and `NVIDIA_VISIBLE_DEVICES` (both accept `GPU-…` and `MIG-…` UUIDs): a device's index is
only its position within its node. A GPU in MIG mode is not grantable as a whole (CUDA
cannot run on it); its MIG instances are, each as a device of its own flavor
(`a100-mig-1g.10gb`) with its own `MIG-…` UUID.

`sample()` is synchronous, fast and never raises: the gateway calls it every few seconds
(in an executor) and a device that fails to answer is reported unhealthy, not turned into
an exception that would stop the sampling loop for every other device.
"""

from __future__ import annotations

import math
import os
import re
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .model import (
    DeviceInfo,
    DeviceSample,
    Inventory,
    MiB,
    NodeInfo,
    flavor_from_model,
    log,
    mig_flavor,
    slugify,
)

# "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb": what
# nvmlDeviceGetName answers for a MIG device handle.
_MIG_NAME_RE = re.compile(r"\bMIG\s+(\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class _Found:
    handle: Any
    model: str
    uuid: str
    memory: int
    flavor: str
    mig_profile: str = ""
    parent: Any = None  # a MIG instance's GPU handle, for the board's temperature
    parent_uuid: str = ""


class NvmlInventory(Inventory):
    """This machine's GPUs (and MIG instances) as one node named after the host.

    A host with several flavors (GPU models, or MIG profiles next to whole GPUs) becomes
    one node per flavor (`<host>-<flavor>`), since a node has one flavor; device indices
    are then positions within that node, and only the UUID names the device on the host.
    PIDs in `processes` are as NVML reports them: host PIDs, which differ from the
    container's own when the gateway runs in a separate PID namespace.

    `nvml` is the NVML module to use (`pynvml` by default): tests pass a fake one.
    `quiet`: a host without the NVML library is expected (the servers' probe for GPU
    utilization on a CPU-only host), so its absence is said at debug level, not warned.
    """

    def __init__(
        self,
        flavor: str | None = None,
        node: str | None = None,
        nvml: Any = None,
        quiet: bool = False,
    ) -> None:
        if nvml is None:
            # nvidia-ml-py is a dependency, but the C library it loads may be absent.
            import pynvml  # type: ignore[import-untyped]

            nvml = pynvml
        self._nvml = nvml
        self._lock = threading.Lock()
        self._initialized = False
        self._handles: dict[tuple[str, int], Any] = {}
        self._parents: dict[tuple[str, int], Any] = {}
        self._devices: list[DeviceInfo] = []
        self._uuids: dict[tuple[str, int], str] = {}
        self._last_seen: dict[tuple[str, int], int] = {}
        host = node or slugify(socket.gethostname().split(".")[0])
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound:
            self.message = "no NVML library found: this gateway sees 0 GPUs"
            (log.debug if quiet else log.warning)(
                "%s (install the NVIDIA driver, or use --devices simulated:…)", self.message
            )
            return
        except nvml.NVMLError as e:
            self.message = f"NVML failed to start ({e}): this gateway sees 0 GPUs"
            log.warning(self.message)
            return
        self._initialized = True
        found = self._discover(flavor)
        flavors = {f.flavor for f in found}
        positions: dict[str, int] = {}
        for f in found:
            node_name = host if len(flavors) == 1 else f"{host}-{slugify(f.flavor)}"
            index = positions.get(node_name, 0)
            positions[node_name] = index + 1
            key = (node_name, index)
            self._handles[key] = f.handle
            if f.parent is not None:
                self._parents[key] = f.parent
            self._uuids[key] = f.uuid
            self._devices.append(
                DeviceInfo(
                    node_name,
                    index,
                    f.flavor,
                    f.model,
                    f.uuid,
                    f.memory,
                    f.mig_profile,
                    f.parent_uuid,
                )
            )
        summary = ", ".join(f"{n.name}: {n.gpus}× {n.flavor}" for n in self.nodes()) or "no devices"
        self.message = f"NVML: {summary}"
        log.info(self.message)

    # ------------------------------------------------------------------ discovery

    def _discover(self, flavor: str | None) -> list[_Found]:
        """Every grantable device, in NVML's order: whole GPUs, and the MIG instances of
        GPUs in MIG mode in their slot order."""
        nv = self._nvml
        found: list[_Found] = []
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            log.warning("NVML could not count devices: %s", e)
            return found
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                name = _text(nv.nvmlDeviceGetName(handle))
                dev_uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as e:
                # A device that cannot even describe itself is not grantable.
                log.warning("NVML device %d skipped: %s", i, e)
                continue
            gpu_flavor = flavor or flavor_from_model(name)
            if self._mig_enabled(handle):
                instances = self._mig_instances(i, handle, name, dev_uuid, gpu_flavor)
                if not instances:
                    log.warning(
                        "NVML device %d (%s) is in MIG mode with no MIG instances: "
                        "nothing on it can be granted until an administrator creates some",
                        i,
                        name,
                    )
                found.extend(instances)
                continue
            try:
                memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
            except nv.NVMLError as e:
                log.warning("NVML device %d skipped: %s", i, e)
                continue
            found.append(_Found(handle, name, dev_uuid, memory, gpu_flavor))
        return found

    def _mig_enabled(self, handle: Any) -> bool:
        nv = self._nvml
        get_mode = getattr(nv, "nvmlDeviceGetMigMode", None)
        if get_mode is None:  # an nvidia-ml-py older than MIG
            return False
        try:
            current, _pending = get_mode(handle)
        except nv.NVMLError:  # NotSupported: a model without MIG (T4, V100, consumer GPUs)
            return False
        return bool(current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def _mig_instances(
        self, i: int, handle: Any, name: str, gpu_uuid: str, gpu_flavor: str
    ) -> list[_Found]:
        nv = self._nvml
        try:
            # The most instances this GPU could hold, not how many exist: empty slots
            # answer NotFound.
            slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
        except nv.NVMLError as e:
            log.warning("NVML device %d: cannot count MIG instances: %s", i, e)
            return []
        out: list[_Found] = []
        for slot in range(slots):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue
            except nv.NVMLError as e:
                log.warning("NVML device %d MIG slot %d skipped: %s", i, slot, e)
                continue
            try:
                mig_uuid = _text(nv.nvmlDeviceGetUUID(mig))
                mig_name = _text(nv.nvmlDeviceGetName(mig))
                profile = self._mig_profile(mig, mig_name)
                memory = int(nv.nvmlDeviceGetMemoryInfo(mig).total)
                fl = mig_flavor(gpu_flavor, profile)
            except (nv.NVMLError, ValueError) as e:
                log.warning("NVML device %d MIG slot %d skipped: %s", i, slot, e)
                continue
            model = mig_name if _MIG_NAME_RE.search(mig_name) else f"{name} MIG {profile}"
            out.append(_Found(mig, model, mig_uuid, memory, fl, profile, handle, gpu_uuid))
        return out

    def _mig_profile(self, mig: Any, mig_name: str) -> str:
        """`1g.10gb`: from the MIG device's name, else from its attributes (slices and
        memory, rounded up to whole GB as NVIDIA's profile names are)."""
        m = _MIG_NAME_RE.search(mig_name)
        if m:
            return m.group(1).lower()
        attrs = self._nvml.nvmlDeviceGetAttributes(mig)
        gb = math.ceil(int(attrs.memorySizeMB) * MiB / 1024**3)
        gi, ci = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
        return f"{gi}g.{gb}gb" if ci in (0, gi) else f"{ci}c.{gi}g.{gb}gb"

    # ------------------------------------------------------------------ Inventory

    def nodes(self) -> list[NodeInfo]:
        nodes: dict[str, NodeInfo] = {}
        for d in self._devices:
            prev = nodes.get(d.node)
            nodes[d.node] = NodeInfo(d.node, d.flavor, (prev.gpus if prev else 0) + 1)
        return list(nodes.values())

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def uuids(self, node: str, indices: Iterable[int]) -> list[str] | None:
        out = [self._uuids.get((node, i), "") for i in indices]
        return out if all(out) else None

    def sample(self) -> list[DeviceSample]:
        with self._lock:
            return [self._sample_one(d) for d in self._devices]

    def _sample_one(self, d: DeviceInfo) -> DeviceSample:
        nv = self._nvml
        key = (d.node, d.index)
        handle = self._handles[key]
        parent = self._parents.get(key)
        errors: list[str] = []

        def ask(what: str, fn: Any, *args: Any, on: Any = handle, essential: bool = True) -> Any:
            # NotSupported is a property of the model (no power sensor on some boards, no
            # utilization for a MIG instance), not a sign of ill health; any other error
            # on an essential call is.
            try:
                return fn(on, *args)
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
        # A MIG instance has no sensor of its own: its board's temperature is its own, but
        # the board's power is shared by every instance on it, so it is not attributed.
        temp = ask(
            "temperature",
            nv.nvmlDeviceGetTemperature,
            nv.NVML_TEMPERATURE_GPU,
            on=parent if parent is not None else handle,
        )
        power_mw = (
            None
            if parent is not None
            else ask("power", nv.nvmlDeviceGetPowerUsage, essential=False)
        )
        processes = self._processes(key, handle)
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

    def _processes(self, key: tuple[str, int], handle: Any) -> dict[int, float]:
        """PIDs on the device: every compute context (0.0), then their recent SM share.

        On a MIG instance's handle NVML lists the instance's own processes; per-process
        utilization is not supported there, so its busy signal is the process list.
        """
        nv = self._nvml
        out: dict[int, float] = {}
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                out[int(p.pid)] = 0.0
        except Exception:
            pass  # NotSupported on some boards and in some containers
        try:
            # Samples newer than the last one we saw, so utilization is this window's.
            rows = nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(key, 0))
        except Exception:
            rows = []  # NotFound when no process ran since then; NotSupported on old GPUs
        starts: dict[int, float | None] = {}  # a PID may have several samples here
        for row in rows:
            pid, stamp = int(row.pid), int(row.timeStamp)
            self._last_seen[key] = max(self._last_seen.get(key, 0), stamp)
            if pid not in starts:
                starts[pid] = process_start(pid)
            started = starts[pid]
            if started is not None and stamp / 1e6 < started - START_SLACK:
                # Seen on an H200: the first window after a process starts can carry the
                # previous holder's last sample (92-99 % from a process that has exited),
                # stamped before this PID existed. It is not this process's work.
                continue
            out[pid] = max(out.get(pid, 0.0), min(1.0, row.smUtil / 100.0))
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


#: Seconds a process's start time may be off: /proc counts it in clock ticks (10 ms).
START_SLACK = 0.05


def process_start(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (NVML's sample clock), to a
    clock tick; None where this host cannot say (no /proc, the process is gone or in
    another PID namespace)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # Field 22, starttime, in ticks since boot; the command name (field 2) may hold
        # spaces, so count from its closing parenthesis (field 3 is the next one).
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
