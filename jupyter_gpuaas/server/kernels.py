"""The GPU kernels of this server: one record per kernel, shared by the provisioner (which
owns the kernel's request) and the extension (which reports activity, listens to the
gateway's events and answers `/gpuaas/kernels`).

Kernel provisioners are created by jupyter_client's factory with the kernel manager as
parent, and that manager's parent is the server's `GpuaasKernelManager`, which knows the
extension and so its `KernelTable` (`table_of`). Provisioners used without the extension
(nbclient, `jupyter console`) keep a table of their own, and nobody reports for them but
their own polling.

Everything runs on the server's event loop thread; no locks.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jupyter_gpuaas.words import DEFERRED_KERNEL

if TYPE_CHECKING:
    from jupyter_gpuaas.client import GatewayClient

#: Kernel-side states (`GpuKernel.state`): what the kernel is doing about its GPUs.
#: `deferred`: a notebook's kernel that has asked for nothing yet and will at its first
#: cell run (`GpuKernel.run`); it waits as the others do, only without a request.
DEFERRED = "deferred"
WAITING = (DEFERRED, "submitting", "queued", "parked")
RUNNING = "running"
ENDED = ("released", "culled", "preempted", "failed", "cancelled", "lost")


@dataclass
class GpuKernel:
    """What this server knows about one GPU kernel and its gateway request."""

    kernel_id: str
    kernel_name: str
    gpus: int
    flavor: str | None
    tenant: str | None = None
    request_id: str | None = None
    state: str = "submitting"
    position: dict[str, Any] | None = None
    estimated_wait: dict[str, Any] | None = None
    waiting_for: dict[str, Any] | None = None  # the gateway's why, in words, while queued
    node: str | None = None
    devices: list[int] = field(default_factory=list)
    grant: dict[str, Any] | None = None  # the gateway's grant: launch_environment reads it
    lease_expires: float | None = None
    reason: str = ""  # why it ended, or why it cannot start
    warning: dict[str, Any] | None = None  # the last cull warning, until busy again
    created: float = field(default_factory=time.time)
    ended: float | None = None
    idle_since: float | None = None
    waited: float | None = None  # seconds from submit to admission (queue + round trips)
    utilization: float | None = None
    # The `last_activity` the extension last gave the kernel for being busy (not the
    # kernel's own activity, so it does not make the next round busy by itself).
    activity_stamp: datetime | None = field(default=None, repr=False)
    # Set whenever the record changes: the provisioner waiting for admission wakes on it.
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # Resolved with the gateway's first answer (queued, admitted or refused).
    answered: asyncio.Future[None] | None = field(default=None, repr=False)
    # Set by the extension to make a waiting provisioner give up (shutdown, interrupt).
    abort_reason: str = ""
    # The provisioner, for polling and for the extension's shutdown of all grants.
    provisioner: Any = field(default=None, repr=False)
    # Events of other watchers (kernel websockets telling the notebook), set with `changed`.
    watchers: list[asyncio.Event] = field(default_factory=list, repr=False)

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def holds_devices(self) -> bool:
        return self.state == RUNNING and self.request_id is not None

    def answer(self) -> None:
        """The gateway answered the submit (or the submit failed): release the waiters."""
        fut = self.answered_future()
        if not fut.done():
            fut.set_result(None)

    def answered_future(self) -> asyncio.Future[None]:
        if self.answered is None:
            self.answered = asyncio.get_running_loop().create_future()
        return self.answered

    def run(self) -> bool:
        """A cell was run: a deferred kernel goes on to ask for its GPUs (True if it was
        deferred; any other kernel is already on its way)."""
        if self.state != DEFERRED or self.ended is not None:
            return False
        self.state = "submitting"
        self.poke()
        return True

    def poke(self) -> None:
        self.changed.set()
        for event in self.watchers:
            event.set()

    def watch(self) -> asyncio.Event:
        """An event set at every change of this record, until `unwatch`."""
        event = asyncio.Event()
        self.watchers.append(event)
        return event

    def unwatch(self, event: asyncio.Event) -> None:
        if event in self.watchers:
            self.watchers.remove(event)

    def sentence(self) -> str:
        """Where this kernel stands, in words: `waiting for 1 a100 (position 2 in vision) …`."""
        what = gpu_words(self.gpus, self.flavor)
        if self.state == DEFERRED:
            return DEFERRED_KERNEL
        if self.state == "submitting":
            return f"asking the GPU gateway for {what} …"
        if self.state == "parked":
            team = f"{self.tenant}'s" if self.tenant else "its"
            return f"resuming {what} from {team} reservation …"
        if self.state == "queued":
            pos = self.position or {}
            place = pos.get("tenant") or pos.get("overall")
            where = f" in {self.tenant}" if self.tenant else ""
            if place:
                return f"waiting for {what} (position {place}{where}) …"
            return f"waiting for {what}{where} …"
        if self.state in ("admitted", RUNNING):
            on = ", ".join(str(d) for d in self.devices)
            device = "device" if len(self.devices) == 1 else "devices"
            node = f" of {self.node}" if self.node else ""
            return f"running on {what}: {device} {on}{node}" if on else f"running on {what}"
        return f"{self.state}: {self.reason}" if self.reason else self.state

    def apply(self, obj: Mapping[str, Any]) -> None:
        """Take in a request object of the gateway (from an answer or an event)."""
        self.request_id = obj.get("id", self.request_id)
        self.tenant = obj.get("tenant", self.tenant)
        gw_state = obj.get("state")
        grant = obj.get("grant")
        if gw_state == "admitted" and grant:
            self.node = grant.get("node")
            self.devices = [int(d) for d in grant.get("devices") or []]
            self.grant = dict(grant)
            self.lease_expires = grant.get("lease_expires")
            self.position = None
            self.estimated_wait = self.waiting_for = None
            if self.state in WAITING:
                self.state = "admitted"  # the provisioner turns it into running
        elif gw_state in ("queued", "parked") and self.state in WAITING:
            self.state = gw_state
            self.position = obj.get("position")
            self.estimated_wait = obj.get("estimated_wait")
            self.waiting_for = obj.get("waiting_for")
        self.poke()

    def end(self, state: str, reason: str = "") -> None:
        if self.ended is None:
            self.state = state
            self.reason = reason or self.reason
            self.ended = time.time()
            self.position = None
            self.devices = [] if state != "culled" else self.devices
        self.answer()
        self.poke()

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "request_id": self.request_id,
            "state": self.state,
            "gpus": self.gpus,
            "flavor": self.flavor,
            "tenant": self.tenant,
            "position": self.position,
            "estimated_wait": self.estimated_wait,
            "waiting_for": self.waiting_for,
            "node": self.node,
            "devices": list(self.devices),
            "lease_expires": self.lease_expires,
            "reason": self.reason or None,
            "warning": self.warning,
            "utilization": self.utilization,
            "idle_since": self.idle_since,
            "waited": self.waited,
            "message": self.sentence(),
            "created": self.created,
            "ended": self.ended,
        }


def is_gpu_spec(spec: Any) -> bool:
    """Whether a kernelspec starts through a gpuaas provisioner: `gpuaas` (a local
    process), or `gpuaas-kubernetes` (the same request, in a pod of its own:
    kubernetes/kernels.py)."""
    meta = (getattr(spec, "metadata", None) or {}).get("kernel_provisioner") or {}
    return meta.get("provisioner_name") in ("gpuaas", "gpuaas-kubernetes")


def gpu_words(gpus: int, flavor: str | None) -> str:
    """`1 a100`, `2 a100`, `1 GPU`, `2 GPUs`."""
    if flavor:
        return f"{gpus} {flavor}"
    return f"{gpus} GPU" + ("" if gpus == 1 else "s")


@dataclass
class Notification:
    """A message for the user (a cull warning, a cull), shown by the sidebar."""

    kind: str
    kernel_id: str
    request_id: str | None
    message: str
    t: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "kernel_id": self.kernel_id,
            "request_id": self.request_id,
            "message": self.message,
            "t": self.t,
            **self.data,
        }


class KernelTable:
    """Live GPU kernels by kernel id, plus a bounded history of ended ones."""

    def __init__(
        self, client: GatewayClient | None = None, history_size: int = 50, tenant: str = ""
    ) -> None:
        self.client = client
        self.default_tenant = tenant
        # True when the server extension judges its kernels busy or idle; else their
        # leases are renewed as busy (a kernel run by nbclient or `jupyter console`).
        self.reporting = False
        # What a renewal that found a grant ended calls (the extension: find out why,
        # stop the kernel); None: the provisioner marks the record lost.
        self.on_lost: Callable[[GpuKernel], Awaitable[None]] | None = None
        self.live: dict[str, GpuKernel] = {}
        self.history: collections.deque[GpuKernel] = collections.deque(maxlen=history_size)
        self.notifications: collections.deque[Notification] = collections.deque(maxlen=100)
        self.on_notify: list[Callable[[Notification], None]] = []
        # Kernels shut down before their provisioner even made a record: why, by kernel id.
        self.aborts: dict[str, str] = {}
        # Kernels whose first start asks for nothing until a cell runs (the kernel
        # manager marks a notebook's; the provisioner takes the mark: `take_deferral`).
        self.deferrals: set[str] = set()
        # First answers awaited (the kernel manager's start) before the record was made.
        self._answers: dict[str, asyncio.Future[None]] = {}

    def add(self, kernel: GpuKernel) -> GpuKernel:
        self.live[kernel.kernel_id] = kernel
        early = self._answers.get(kernel.kernel_id)
        if early is not None:  # someone waits for this kernel's first answer already

            def relay(_: asyncio.Future[None]) -> None:
                if not early.done():
                    early.set_result(None)

            kernel.answered_future().add_done_callback(relay)
        return kernel

    def first_answer(self, kernel_id: str) -> asyncio.Future[None]:
        """Resolved with the gateway's first answer for this kernel (or its failure),
        whether or not its provisioner has made its record yet; `forget_answer` after."""
        record = self.find(kernel_id)  # an ended one too: a refusal may come first
        if record is not None:
            return record.answered_future()
        early = self._answers.get(kernel_id)
        if early is None:
            early = self._answers[kernel_id] = asyncio.get_running_loop().create_future()
        return early

    def forget_answer(self, kernel_id: str) -> None:
        self._answers.pop(kernel_id, None)

    def find(self, kernel_id: str) -> GpuKernel | None:
        """The live record of a kernel, else its latest ended one."""
        return next((k for k in self.all() if k.kernel_id == kernel_id), None)

    def get(self, kernel_id: str) -> GpuKernel | None:
        return self.live.get(kernel_id)

    def by_request(self, request_id: str) -> GpuKernel | None:
        for k in self.live.values():
            if k.request_id == request_id:
                return k
        return None

    def take_deferral(self, kernel_id: str) -> bool:
        """Whether this start of the kernel waits for its first cell run (asked once)."""
        if kernel_id not in self.deferrals:
            return False
        self.deferrals.discard(kernel_id)
        return True

    def drop(self, kernel: GpuKernel) -> None:
        """A deferred kernel shut down before it ran a cell leaves no history: it never
        asked the gateway for anything."""
        if self.live.get(kernel.kernel_id) is kernel:
            del self.live[kernel.kernel_id]

    def retire(self, kernel: GpuKernel) -> None:
        """A kernel that ended leaves the live table; its record stays in the history."""
        if self.live.get(kernel.kernel_id) is kernel:
            del self.live[kernel.kernel_id]
        if kernel not in self.history:
            self.history.append(kernel)

    def all(self) -> Iterable[GpuKernel]:
        yield from self.live.values()
        seen = set(self.live)
        for k in reversed(self.history):
            if k.kernel_id not in seen:
                seen.add(k.kernel_id)
                yield k

    def notify(self, note: Notification) -> None:
        self.notifications.append(note)
        for callback in list(self.on_notify):
            try:
                callback(note)
            except Exception:  # a broken listener must not stop the others
                pass


def table_of(kernel_manager: Any) -> KernelTable | None:
    """The GPU kernel table of the server a kernel's manager belongs to: its parent, the
    server's `GpuaasKernelManager`, knows the extension (None: no extension runs)."""
    extension = getattr(getattr(kernel_manager, "parent", None), "gpuaas", None)
    table = getattr(extension, "table", None)
    return table if isinstance(table, KernelTable) else None
