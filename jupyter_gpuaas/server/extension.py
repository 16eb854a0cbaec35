"""The jupyter_server extension `jupyter_gpuaas`: the single-user side of GPU kernels.

It ties the `gpuaas` kernel provisioner to the server:

- kernels start as *pending* kernels, so the REST call that starts one returns while the
  kernel waits in the gateway's queue (only the gateway's first answer is awaited, so a
  request that can never be admitted fails the call at once with the reason);
- shutting down or interrupting a waiting kernel cancels its request;
- each round of the process's grant holder (holder.py) starts here: it notices dead
  kernels, judges each GPU kernel busy or idle for its lease's renewal, and the whole
  server for jupyter_server, the Hub and its own gateway request (idle.py); our widgets'
  comm traffic is no activity (activity.py);
- the process's one gateway event stream (holder.py; the job manager and the sidebar
  share it) brings admit, cull_warning, cull, preempt, finish, and the extension acts:
  wakes a waiting kernel, warns the user, shuts a culled kernel down;
- on server shutdown every grant is released and every wait cancelled.

Starts, shutdowns, restarts and interrupts of GPU kernels go through the server's kernel
manager, `GpuaasKernelManager` (kernel_manager.py), configured as
`ServerApp.kernel_manager_class`; the extension attaches itself to it at start.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Integer, Unicode, default

from jupyter_gpuaas.client import GatewayClient, GatewayError, gateway_from_env
from jupyter_gpuaas.holder import Seconds, follow, grant_holder
from jupyter_gpuaas.jobs import server_hook as jobs_hook
from jupyter_gpuaas.words import ended_words
from jupyter_gpuaas.words import format_duration as human_duration

from . import sidebar
from .activity import GpuUsage, decide_busy
from .idle import SERVER_KEY, ServerActivity
from .kernel_manager import GpuaasKernelManager
from .kernels import GpuKernel, KernelTable, Notification
from .provisioner import GpuaasProvisioner
from .waiting import one_session_per_path

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

#: What `ServerApp.kernel_manager_class` names (the packaged jupyter-config file does).
KERNEL_MANAGER_CLASS = "jupyter_gpuaas.server.GpuaasKernelManager"
EVENT_SCHEMA = Path(__file__).parent / "event_schemas" / "gpu_kernel.yaml"
EVENT_SCHEMA_ID = "https://events.jupyter.org/jupyter_gpuaas/gpu_kernel/v1"


class GpuaasExtension(ExtensionApp):
    name = "jupyter_gpuaas"
    description = "GPU kernels that start only on admitted GPUs and give them back when idle."

    gateway_url = Unicode(
        help="URL of the gpuaas gateway. Default: GPUAAS_URL, else (inside JupyterHub) "
        "<hub origin>/services/gpuaas/ derived from JUPYTERHUB_API_URL."
    ).tag(config=True)

    @default("gateway_url")
    def _gateway_url_default(self) -> str:
        try:
            return gateway_from_env()[0]
        except GatewayError:
            return ""

    gateway_token = Unicode(
        help="Token for the gateway. Default: GPUAAS_TOKEN, else JUPYTERHUB_API_TOKEN (the "
        "server's token, which needs the scope custom:gpuaas:use: see hub_config/)."
    ).tag(config=True)

    @default("gateway_token")
    def _gateway_token_default(self) -> str:
        return os.environ.get("GPUAAS_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN") or ""

    default_tenant = Unicode(
        "",
        help="Tenant charged by GPU kernels whose kernelspec names none. Empty: the user's "
        "only tenant, else the first the gateway lists for the user.",
    ).tag(config=True)

    heartbeat_interval = Seconds(
        30.0,
        help="Seconds between the rounds that renew this server's leases (its GPU kernels', "
        "its jobs' and its own), with busy or idle. Keep it well under the gateway's lease "
        "TTL (120 s by default) so one lost heartbeat does not lose a grant.",
    ).tag(config=True)

    busy_utilization = Float(
        0.05,
        min=0.0,
        max=1.0,
        help="GPU utilization (0..1) of a kernel's own processes above which it counts as "
        "busy even when it executes nothing (a background training thread).",
    ).tag(config=True)

    use_pending_kernels = Bool(
        True,
        help="Start GPU kernels as pending kernels, so starting one that must queue does "
        "not block the REST call (and the notebook) meanwhile. Other kernels start as "
        "the server is configured (jupyter_server's `use_pending_kernels`).",
    ).tag(config=True)

    tell_waiting = Bool(
        True,
        help="Open the websocket of a GPU kernel that waits for its GPUs at once, and show "
        'a cell run meanwhile where the kernel stands ("waiting for 1 a100 (position 2 '
        'in vision) …"), updated as the queue moves; the cell runs once the GPUs are '
        "granted. Off: jupyter_server holds the websocket until the kernel starts.",
    ).tag(config=True)

    take_gpu_at_first_run = Bool(
        True,
        help="A notebook's GPU kernel asks for its GPUs when its first cell runs, not when "
        "the notebook opens: JupyterLab starts the kernel of every notebook it opens, "
        "reopens or restores (after a page reload or a new login), and such a kernel "
        'waits with no GPU request, shown as "GPU kernel: takes a GPU when you run a '
        'cell", until a cell runs; then it queues and runs the cell once admitted. '
        "Kernels started through the REST API (POST api/kernels) ask at once. Needs "
        "use_pending_kernels and tell_waiting. Off: every GPU kernel asks for its GPUs "
        "as it starts.",
    ).tag(config=True)

    submit_wait = Seconds(
        5.0,
        help="Seconds a kernel start waits for the gateway's first answer, so a request "
        "that can never be admitted fails the start at once, with the reason.",
    ).tag(config=True)

    history_size = Integer(
        50, help="Ended GPU kernels (culled, failed, released) kept for /gpuaas/kernels."
    ).tag(config=True)

    reconnect_delay = Seconds(
        2.0,
        help="Seconds before reconnecting to the gateway's event stream after it drops "
        "(doubled at each failure, up to 10 s).",
    ).tag(config=True)

    request_timeout = Seconds(30.0, help="Seconds before a call to the gateway gives up.").tag(
        config=True
    )

    # ------------------------------------------------------------------ set-up

    table: KernelTable
    client: GatewayClient | None = None
    gpu_usage: GpuUsage
    _stops: list[Any]  # what stop_extension undoes: the round hook, the event follower
    activity: ServerActivity
    _idle_timeouts: dict[str, float] | None = None

    @property
    def _server(self) -> ServerApp:
        """The server this extension was loaded into: jupyter_server sets `serverapp`
        before it calls `initialize_settings`, so every method below has one."""
        assert self.serverapp is not None, "the gpuaas extension runs only inside a server"
        return self.serverapp

    def initialize_settings(self) -> None:
        self.client = None
        if self.gateway_url and self.gateway_token:
            self.client = GatewayClient(
                self.gateway_url, self.gateway_token, timeout=self.request_timeout
            )
        else:
            self.log.warning(
                "gpuaas: no gateway configured (set GPUAAS_URL and GPUAAS_TOKEN, or run "
                "inside JupyterHub): GPU kernels will fail to start"
            )
        self.table = KernelTable(self.client, self.history_size, self.default_tenant)
        self.table.reporting = True
        self.gpu_usage = GpuUsage()
        self.activity = ServerActivity(self)
        self._stops = []
        self.table.on_lost = self._grant_gone
        self.settings["gpuaas"] = self
        self._attach_kernel_manager(self._server.kernel_manager)
        self._tell_waiting_kernels()
        one_session_per_path(self._server.session_manager)
        self._stop_cleanly_on_sigint()
        events = self._server.event_logger
        try:
            if events is not None:
                events.register_event_schema(EVENT_SCHEMA)
        except Exception as e:  # an older jupyter_events: notices stay in /gpuaas/ only
            self.log.warning("gpuaas: cannot register the event schema: %s", e)
        self.table.on_notify.append(self._emit)
        jobs_hook.setup(self)  # batch jobs (jupyter_gpuaas/jobs/): JobManager

    def initialize_handlers(self) -> None:
        from .handlers import routes

        self.handlers.extend(routes())
        self.handlers.extend(jobs_hook.handlers())  # /gpuaas/jobs
        self.handlers.extend(sidebar.routes())  # /gpuaas/sidebar: the JupyterLab panel

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Join the process's renewal rounds and event stream once the server's loop runs."""
        holder = grant_holder()
        holder.configure(self.heartbeat_interval)
        self._stops = [holder.add_round(self.heartbeat_once)]
        if self.client is not None:
            self._stops.append(
                follow(self.client, self.on_event, reconnect_delay=self.reconnect_delay)
            )
        await jobs_hook.start(self)  # exports GPUAAS_SERVER_URL/TOKEN for %gpu in kernels
        self.log.info(
            "gpuaas: GPU kernels through the gateway at %s (heartbeat every %.0f s)",
            self.gateway_url or "(none)",
            self.heartbeat_interval,
        )

    async def stop_extension(self) -> None:
        """Leave the rounds and the stream, cancel every wait, release every grant."""
        await jobs_hook.stop(self)  # live jobs end, their GPUs are released
        for stop in self._stops:
            stop()
        self._stops = []
        self.activity.close()
        # Cancel the waits first: releasing a grant first could admit a waiting kernel.
        waiting = [r for r in self.table.live.values() if r.waiting]
        for record in waiting:
            record.abort_reason = "server shutting down"
            record.poke()
        await _until_ended(waiting, 5.0)
        releases = [
            r.provisioner.release("released", "server shut down")
            for r in list(self.table.live.values())
            if isinstance(r.provisioner, GpuaasProvisioner)
        ]
        if releases:
            await asyncio.gather(*releases, return_exceptions=True)
        self.gpu_usage.close()

    # ------------------------------------------------------------------ kernel manager hooks

    def _stop_cleanly_on_sigint(self) -> None:
        """Inside JupyterHub, SIGINT (the spawner's stop) stops the server cleanly.

        jupyterhub-singleuser maps SIGINT to a clean stop, but jupyter_server installs its
        SIGINT handler only when stdin is a terminal; a spawned server has none, so
        SIGINT raised KeyboardInterrupt and the process exited without stopping its
        extensions: GPU kernels kept their grants until the leases expired.
        """
        if "JUPYTERHUB_API_TOKEN" not in os.environ:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._server._signal_stop)

    def _attach_kernel_manager(self, mkm: Any) -> None:
        """GPU kernels need our kernel manager class; say plainly what fails without it."""
        if isinstance(mkm, GpuaasKernelManager):
            mkm.attach(self)
            gateway = getattr(self.serverapp, "gateway_config", None)
            if gateway is not None and gateway.gateway_enabled:
                self.log.warning(
                    "gpuaas: this server is configured for a kernel gateway (%s), but "
                    "ServerApp.kernel_manager_class is %s, so kernels start on this "
                    "host instead. Set ServerApp.kernel_manager_class to "
                    "jupyter_server.gateway.managers.GatewayMappingKernelManager to use "
                    "the kernel gateway (GPU kernels then run only through it).",
                    gateway.url,
                    KERNEL_MANAGER_CLASS,
                )
            return
        self.log.warning(
            "gpuaas: the server's kernel manager is %s.%s, not %s. GPU kernels still "
            "start on granted GPUs, but starting one blocks the notebook until its GPUs "
            "are granted, a refused start answers 500 without the reason, a waiting "
            "kernel cannot be shut down, interrupted or shown waiting in its cells, and "
            "the GPU widgets' refreshes count as kernel activity. Set "
            "ServerApp.kernel_manager_class = %r (a subclass of it if you need your own).",
            type(mkm).__module__,
            type(mkm).__qualname__,
            KERNEL_MANAGER_CLASS,
            KERNEL_MANAGER_CLASS,
        )

    def _tell_waiting_kernels(self) -> None:
        """Kernel websockets of waiting GPU kernels open at once and say why they wait."""
        if not self.tell_waiting:
            return
        from .waiting import waiting_connection_class

        # self.settings starts as a copy of the web app's and is merged back into it.
        ours = waiting_connection_class(self.settings.get("kernel_websocket_connection_class"))
        if ours is not None:
            self.settings["kernel_websocket_connection_class"] = ours

    # ------------------------------------------------------------------ heartbeats

    def current_activity(self) -> list[str]:
        """Why this server is busy ([] idle): `shutdown_no_activity_timeout` asks this."""
        return list(self.activity.reasons)

    async def heartbeat_once(self) -> None:
        """A round's hook: notice deaths, judge each GPU kernel and the server (idle.py);
        the holder then renews their leases with these verdicts."""
        running: list[GpuKernel] = []
        for record in list(self.table.live.values()):
            prov = record.provisioner
            if record.state != "running" or not isinstance(prov, GpuaasProvisioner):
                continue
            if prov.process is not None:
                await prov.poll()  # a dead kernel releases its grant here
            if record.state == "running" and record.request_id:
                running.append(record)
        holders = self.activity.holders(running)  # theirs, and this server's own devices
        utilization: dict[str, float | None] = {}
        if holders and self.gpu_usage.available:
            loop = asyncio.get_running_loop()
            utilization = await loop.run_in_executor(None, self.gpu_usage.utilization, holders)
        now = datetime.now(timezone.utc)
        busy = {r.kernel_id: self._judge(r, utilization.get(r.kernel_id), now) for r in running}
        await self.activity.round(now, busy, utilization.get(SERVER_KEY))

    def _judge(self, record: GpuKernel, utilization: float | None, now: datetime) -> bool:
        """Busy or idle since the kernel's last renewal: what its lease's next one says.

        A busy kernel's jupyter_server `last_activity` (the kernel model's, and the
        server's `last_kernel_activity`) moves to `now`, so jupyter_server's own culler
        (`cull_idle_timeout`, or a kernelspec's `metadata.cull_idle_timeout`) and the
        Hub's idle culler count as activity what the gateway counts: a training thread
        with iopub silent is not culled by them while the gateway keeps it.
        """
        km = record.provisioner.parent
        lease = record.provisioner.lease
        last_activity = getattr(km, "last_activity", None)
        if last_activity is not None and last_activity == record.activity_stamp:
            last_activity = None  # our own stamp of the last round is not new activity
        busy = decide_busy(
            getattr(km, "execution_state", None),
            last_activity,
            lease.renewed_at if lease is not None else None,
            utilization,
            self.busy_utilization,
        )
        record.utilization = utilization
        if busy:
            record.idle_since = None
            if record.warning is None or "preempt_at" not in record.warning:
                record.warning = None  # a busy kernel is not culled (a preemption stays)
            if km is not None and hasattr(km, "last_activity"):
                km.last_activity = record.activity_stamp = now
                mkm = getattr(self.serverapp, "kernel_manager", None)
                if mkm is not None:  # the server's own, for its /api/status and the Hub
                    mkm.last_kernel_activity = now
        elif record.idle_since is None:
            record.idle_since = time.time()
        if lease is not None:
            lease.busy, lease.utilization = busy, utilization
        return busy

    async def _grant_gone(self, record: GpuKernel) -> None:
        """A renewal found the grant ended (an event we missed): find out why, act."""
        assert self.client is not None and record.request_id is not None
        try:
            obj: Mapping[str, Any] = await self.client.get(record.request_id)
        except GatewayError:
            obj = {}
        state = obj.get("state")
        if state in ("parked", "culled"):
            await self._end_kernel(record, "culled", await self._cull_reason(record))
        elif state == "preempted":
            await self._end_kernel(record, "preempted", ended_words(obj))
        else:
            reason = obj.get("reason") or "its GPU grant ended"
            await self._end_kernel(record, "lost", ended_words({**obj, "reason": reason}))

    # ------------------------------------------------------------------ gateway events

    async def on_event(self, name: str, data: dict[str, Any]) -> None:
        request = data.get("request") or {}
        rid = data.get("id") or request.get("id")
        record = self.table.by_request(str(rid)) if rid else None
        if record is None:
            if rid and rid == os.environ.get("GPUAAS_REQUEST_ID") and name.startswith("preempt_"):
                self._preempt_notice(None, name, data, request)  # this server's own GPUs
            return
        if name == "admit":
            record.apply(request)
        elif name == "cull_warning":
            self._warn(record, data.get("cull_at"))
        elif name in ("preempt_warning", "preempt_withdrawn"):
            self._preempt_notice(record, name, data, request)
        elif name == "cull":
            await self._end_kernel(record, "culled", await self._cull_reason(record))
        elif name == "preempt":
            # The gateway's words ("preempted: nlp took back its GPU"), never the id of
            # the request that took it.
            await self._end_kernel(
                record, "preempted", ended_words({"state": "preempted", **request})
            )
        elif name in ("finish", "cancel", "expire", "reject"):
            reason = data.get("reason") or request.get("reason") or f"GPU request {name}ed"
            if record.waiting and record.abort_reason:  # our own cancel, heard first here
                record.end("cancelled", record.abort_reason)
                record.poke()
            elif record.waiting:
                record.end("failed", str(reason))
                record.poke()
            else:
                said = ended_words({"state": name, **request, "reason": str(reason)})
                await self._end_kernel(record, "lost", said)
        elif request:
            record.apply(request)  # queued positions and other updates

    def _warn(self, record: GpuKernel, cull_at: Any) -> None:
        seconds = max(0.0, float(cull_at) - time.time()) if cull_at else None
        when = f"in {human_duration(seconds)}" if seconds is not None else "soon"
        msg = (
            f"GPU kernel {record.kernel_name} ({record.kernel_id[:8]}) is idle on its GPUs and "
            f"will be shut down {when} to free them; run something to keep it."
        )
        record.warning = {"message": msg, "cull_at": cull_at, "t": time.time()}
        self.log.warning("gpuaas: %s", msg)
        self.table.notify(
            Notification(
                "cull_warning", record.kernel_id, record.request_id, msg, data={"cull_at": cull_at}
            )
        )

    def _preempt_notice(
        self, record: GpuKernel | None, name: str, data: dict[str, Any], request: dict[str, Any]
    ) -> None:
        """Preemption with grace: the kernel (record) or this server (None) keeps its GPUs
        until `at`, then is stopped. Shown at /gpuaas/kernels and /gpuaas/notifications."""
        what = "server" if record is None else f"kernel {record.kernel_name}"
        kid = "" if record is None else record.kernel_id
        if name == "preempt_withdrawn":
            if record is not None:
                record.warning = None
            self.log.info("gpuaas: your %s is no longer preempted", what)
            return
        if name != "preempt_warning":
            return
        at = data.get("at")
        left = human_duration(max(0.0, float(at) - time.time())) if at else "soon"
        why = request.get("preempt_reason") or "its GPUs are reclaimed"
        msg = f"your {what} will be stopped in {left}: {why}"
        if record is not None:
            record.warning = {"message": msg, "preempt_at": at, "t": time.time()}
        self.log.warning("gpuaas: %s", msg)
        note = Notification("preempt_warning", kid, str(data.get("id")), msg, data={})
        self.table.notify(note)

    async def _cull_reason(self, record: GpuKernel) -> str:
        """`culled: idle on GPU for 30 min`: the tenant's idle timeout, else what we saw."""
        if self._idle_timeouts is None and self.client is not None:
            try:
                tenants = (await self.client.tenants()).get("tenants") or []
                self._idle_timeouts = {
                    t["name"]: float(t.get("idle_timeout") or 0) for t in tenants
                }
            except (GatewayError, KeyError, TypeError, ValueError):
                self._idle_timeouts = {}
        idle = (self._idle_timeouts or {}).get(record.tenant or "", 0.0)
        if not idle and record.idle_since is not None:
            idle = time.time() - record.idle_since
        return f"culled: idle on GPU for {human_duration(idle)}" if idle else "culled: idle"

    async def _end_kernel(self, record: GpuKernel, state: str, reason: str) -> None:
        """The gateway took the GPUs away: record why, tell the user, stop the kernel."""
        if record.ended is not None:
            return
        record.end(state, reason)
        self.table.retire(record)
        self.log.warning("gpuaas: GPU kernel %s %s", record.kernel_id, reason)
        self.table.notify(Notification(state, record.kernel_id, record.request_id, f"{reason}"))
        mkm: Any = self._server.kernel_manager  # shutdown_kernel is untyped (run_sync)
        if record.kernel_id in mkm:
            try:
                await mkm.shutdown_kernel(record.kernel_id)
            except Exception as e:
                self.log.warning("gpuaas: shutting down kernel %s: %s", record.kernel_id, e)

    def _emit(self, note: Notification) -> None:
        data: dict[str, Any] = {
            "action": note.kind if note.kind != "released" else "lost",
            "kernel_id": note.kernel_id,
            "request_id": note.request_id,
            "msg": note.message,
        }
        if "cull_at" in note.data:
            data["cull_at"] = note.data["cull_at"]
        events = self._server.event_logger
        try:
            if events is not None:
                events.emit(schema_id=EVENT_SCHEMA_ID, data=data)
        except Exception as e:
            self.log.debug("gpuaas: event not emitted: %s", e)


async def _until_ended(records: list[GpuKernel], timeout: float) -> None:
    """Wait (up to `timeout` seconds) until every record has ended, woken by its changes."""

    async def ended(record: GpuKernel) -> None:
        event = record.watch()
        try:
            while record.ended is None:
                await event.wait()
                event.clear()
        finally:
            record.unwatch(event)

    tasks = [asyncio.ensure_future(ended(r)) for r in records]
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
