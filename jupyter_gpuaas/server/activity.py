"""Activity of GPU kernels, turned into the gateway's lease heartbeats and into this
server's own last activity.

A kernel is busy when it executes (jupyter_server's execution state and last activity,
read from the kernel's iopub) or when its processes use its GPUs (NVML per-process
utilization of the kernel's process tree, matched to this host's devices by UUID), so a
training loop started in a background thread — iopub silent, GPU at 95 % — is not culled
as idle. The decision is the pure function `decide_busy`; NVML is optional and absent on
most CI machines.

Our own live widgets (`%gpu status`, a job's view) refresh from a thread of the kernel,
which publishes `comm_msg`s on iopub; jupyter_server counts those as kernel activity, so
a kernel showing `%gpu status` and doing nothing else would read busy for the widget's
whole life. `OwnComms` drops exactly those messages (the comms of widgets carrying the
`WIDGET_CLASS` DOM class) before jupyter_server's activity watcher sees them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyter_gpuaas.jobs.views import WIDGET_CLASS

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


_COMM_TYPES = ("comm_open", "comm_msg", "comm_close")


class OwnComms:
    """Filters our live widgets' comm messages out of a kernel's iopub activity stream.

    jupyter_server watches every kernel's iopub on a ZMQStream (`kernel._activity_stream`)
    and marks the kernel (and the server) active at each tracked message. `watch(kernel)`
    puts a filter in front of its callback: a `comm_open` of a widget whose state names
    `WIDGET_CLASS` records its comm id, and that comm's `comm_msg`s and `comm_close` never
    reach the watcher. Only comm messages are unpacked; everything else passes untouched.
    A user's click on such a widget still counts: it arrives on the shell channel, and the
    kernel's busy/idle status around it is not a comm message.
    """

    def __init__(self) -> None:
        self.comm_ids: set[str] = set()
        self.dropped = 0  # messages kept from the activity watcher (tests read it)

    def watch(self, kernel: Any) -> bool:
        """Filter `kernel`'s activity stream; False where jupyter_server has none."""
        stream = getattr(kernel, "_activity_stream", None)
        callback = getattr(stream, "_recv_callback", None)
        if stream is None or callback is None:
            return False
        from jupyter_client.session import Session

        # A session of our own, as jupyter_server's watcher has: sessions keep a history
        # of the signatures they have seen and refuse a message seen twice.
        session = Session(config=kernel.session.config, key=kernel.session.key)
        stream.on_recv(self.wrap(session, callback))
        return True

    def wrap(self, session: Any, callback: Callable[[list[bytes]], Any]) -> Callable[..., Any]:
        def filtered(msg_list: list[bytes]) -> Any:
            if self.is_ours(session, msg_list):
                self.dropped += 1
                return None
            return callback(msg_list)

        return filtered

    def is_ours(self, session: Any, msg_list: list[bytes]) -> bool:
        try:
            _, fed = session.feed_identities(msg_list, copy=True)
            msg = session.deserialize(fed, content=False)
            if msg["header"]["msg_type"] not in _COMM_TYPES:
                return False
            content = session.unpack(msg["content"])
            return self.judge(msg["header"]["msg_type"], content)
        except Exception:  # anything unreadable is jupyter_server's to judge
            return False

    def judge(self, msg_type: str, content: dict[str, Any]) -> bool:
        comm_id = str(content.get("comm_id") or "")
        if msg_type == "comm_open":
            state = ((content.get("data") or {}).get("state")) or {}
            if WIDGET_CLASS in (state.get("_dom_classes") or []):
                self.comm_ids.add(comm_id)
                return True
            return False
        if comm_id not in self.comm_ids:
            return False
        if msg_type == "comm_close":
            self.comm_ids.discard(comm_id)
        return True


def visible_uuids(env: dict[str, str] | None = None) -> list[str]:
    """The device UUIDs this process was confined to (CUDA_VISIBLE_DEVICES), if named so."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES") or ""
    return [u for u in (p.strip() for p in raw.split(",")) if u.startswith(("GPU-", "MIG-"))]


@dataclass
class _Holder:
    kernel_id: str
    node: str | None
    devices: list[int]
    pids: set[int]
    uuids: list[str] = field(default_factory=list)  # the grant's, where it has them


class GpuUsage:
    """Per-kernel GPU utilization through NVML, or nothing where NVML is absent.

    Uses the NVML inventory of `jupyter_gpuaas.devices`, which samples every device with
    its per-process utilization, and its `attribute` helper. A holder's devices are found
    on this host by the grant's UUIDs: the gateway's node names and positions need not be
    this host's (one node per model on a mixed host, or a gateway elsewhere). A grant
    without UUIDs (simulated devices) falls back to node and index.
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
        local = list(self._inventory.devices())
        by_uuid = {d.uuid: (d.node, d.index) for d in local if d.uuid}
        local_nodes = {d.node for d in local}
        by_key: dict[tuple[str, int], tuple[str, str, str, set[int]]] = {}
        for h in holders:
            if h.uuids:
                keys = [by_uuid[u] for u in h.uuids if u in by_uuid]
            else:
                node = h.node if h.node in local_nodes else next(iter(local_nodes))
                keys = [(str(node), index) for index in h.devices]
            if not keys:
                continue  # none of its devices is on this host: NVML cannot say
            for key in keys:
                by_key[key] = (h.kernel_id, "", "", h.pids)
        for kernel_id, a in attribute(samples, by_key).items():
            out[str(kernel_id)] = a.process_utilization if a.process_seen else 0.0
        return out

    def close(self) -> None:
        if self._inventory is not None:
            self._inventory.close()
            self._inventory = None


Holder = _Holder
