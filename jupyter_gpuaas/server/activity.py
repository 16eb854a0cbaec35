"""Activity of GPU kernels, turned into the gateway's lease heartbeats.

A kernel is busy when it executes (jupyter_server's execution state and last activity,
read from the kernel's iopub) or when its processes use its GPUs (NVML per-process
utilization of the kernel's process tree), so a training loop started in a background
thread — iopub silent, GPU at 95 % — is not culled as idle. The decision is the pure
function `decide_busy`; NVML is optional and absent on most CI machines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger("jupyter_gpuaas.server")


def decide_busy(
    execution_state: str | None,
    last_activity: datetime | None,
    since: datetime | None,
    utilization: float | None,
    threshold: float,
) -> bool:
    """Whether a kernel counts as busy for the heartbeat covering `since` .. now.

    Busy when it is executing now, when it showed activity on iopub after `since` (an
    execution that began and ended between two heartbeats), or when its own processes'
    GPU utilization is above `threshold`. Unknown utilization (no NVML) says nothing.
    """
    if execution_state == "busy":
        return True
    if last_activity is not None and since is not None and last_activity > since:
        return True
    return utilization is not None and utilization > threshold


def process_tree(pid: int) -> set[int]:
    """The kernel's PID and all its descendants (a kernel may run CUDA in a child)."""
    pids = {pid}
    try:
        import psutil

        for child in psutil.Process(pid).children(recursive=True):
            pids.add(child.pid)
    except Exception:  # psutil missing, or the process just ended: the PID alone
        pass
    return pids


@dataclass
class _Holder:
    kernel_id: str
    node: str | None
    devices: list[int]
    pids: set[int]


class GpuUsage:
    """Per-kernel GPU utilization through NVML, or nothing where NVML is absent.

    Uses the NVML inventory of `jupyter_gpuaas.devices`, which samples
    every device with its per-process utilization, and its `attribute` helper. The kernel
    runs on this machine, so a grant's device indices are this host's NVML node indices.
    """

    def __init__(self) -> None:
        self._inventory: Any = None
        self._tried = False
        self.message = ""

    @property
    def available(self) -> bool:
        self._open()
        return self._inventory is not None

    def _open(self) -> None:
        if self._tried:
            return
        self._tried = True
        try:
            from jupyter_gpuaas.devices import NvmlInventory

            inventory = NvmlInventory(quiet=True)  # no NVML library: no utilization, no alarm
        except Exception as e:  # nvidia-ml-py missing or broken
            self.message = f"no NVML: {e}"
            return
        if not inventory.devices():
            self.message = getattr(inventory, "message", "") or "NVML sees no GPU"
            inventory.close()
            return
        self._inventory = inventory

    def utilization(self, holders: Iterable[_Holder]) -> dict[str, float | None]:
        """Kernel id → max utilization (0..1) of its processes on its devices, or None."""
        holders = list(holders)
        out: dict[str, float | None] = {h.kernel_id: None for h in holders}
        self._open()
        if self._inventory is None or not holders:
            return out
        from jupyter_gpuaas.devices import attribute

        try:
            samples = self._inventory.sample()
        except Exception as e:
            log.warning("NVML sampling failed: %s", e)
            return out
        local_nodes = {d.node for d in self._inventory.devices()}
        by_key: dict[tuple[str, int], tuple[str, str, str, set[int]]] = {}
        for h in holders:
            node = h.node if h.node in local_nodes else next(iter(local_nodes))
            for index in h.devices:
                by_key[(node, index)] = (h.kernel_id, "", "", h.pids)
        for kernel_id, a in attribute(samples, by_key).items():
            out[str(kernel_id)] = a.process_utilization if a.process_seen else 0.0
        return out

    def close(self) -> None:
        if self._inventory is not None:
            self._inventory.close()
            self._inventory = None


Holder = _Holder
