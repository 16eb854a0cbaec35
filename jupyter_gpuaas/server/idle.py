"""This server's own activity: what jupyter_server, JupyterHub and the gateway are told.

jupyter_server judges a server idle from `web_app.last_activity()`, the latest of its
API requests, its kernels' iopub activity and every `*_last_activity` web-app setting;
`shutdown_no_activity_timeout` also asks each extension's `current_activity()`.
jupyterhub-singleuser reports the same `last_activity` to the Hub (and `/api/status` shows
it), which is what jupyterhub-idle-culler reads. None of them sees GPU work that runs with
iopub silent (a background training thread) or a batch job running in the server.

Each heartbeat round of the extension ends here: the round's GPU kernels that were busy,
every other kernel's execution state, this server's own devices' NVML utilization and the
running jobs make one verdict. Busy stamps the `gpuaas_last_activity` setting (so
`/api/status`, the Hub and its culler see GPU work as activity) and keeps
`current_activity()` non-empty; and the verdict, busy or idle, is the heartbeat of this
server's own gateway request (`GPUAAS_REQUEST_ID`, set by the Hub's QueuedSpawner), so a
GPU server is culled by the gateway for its GPUs' idleness, not for the Hub's HTTP
activity. The spawner then only renews a lease nobody else renewed (an image without this
extension), see hub/spawner.py.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from traitlets import Bool, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_gpuaas.client import GatewayError
from jupyter_gpuaas.holder import Lease, grant_holder

from .activity import Holder, OwnComms, decide_busy, process_tree, visible_uuids

#: The web-app setting jupyter_server's `last_activity()` collects (any key ending so).
SETTING = "gpuaas_last_activity"
#: The holder key of this server's own devices in a utilization round.
SERVER_KEY = "(server)"


class ServerActivity(LoggingConfigurable):
    """The verdict of each round about this whole server, and whom it is told to."""

    server_request_id = Unicode(
        help="""The gateway request of this server itself (the `server` request the Hub's
        QueuedSpawner holds for it), which this server heartbeats with its own busy or
        idle: busy while a kernel executes or uses its GPUs, or a job runs. Default:
        GPUAAS_REQUEST_ID, which the spawner puts in the server's environment. Empty:
        a server started outside the queue, nothing to report.""",
    ).tag(config=True)

    @default("server_request_id")
    def _server_request_id_default(self) -> str:
        return os.environ.get("GPUAAS_REQUEST_ID", "")

    report_server_activity = Bool(
        True,
        help="""Heartbeat `server_request_id` with this server's own busy/idle. Off: the
        spawner renews the lease with the Hub's HTTP activity, as before.""",
    ).tag(config=True)

    def __init__(self, ext: Any, **kwargs: Any) -> None:
        super().__init__(parent=ext, **kwargs)
        self.ext = ext
        self.reasons: list[str] = []  # why the last round was busy; [] when idle
        self.since: datetime | None = None  # the previous round
        self.server_busy: bool | None = None  # the last heartbeat's verdict
        self._request_ended = False
        self._lease: Lease | None = None
        # Our widgets' comms, kept out of jupyter_server's kernel activity (activity.py).
        self.own_comms = OwnComms()

    @property
    def reports(self) -> bool:
        return bool(
            self.report_server_activity
            and self.server_request_id
            and self.ext.client is not None
            and not self._request_ended
        )

    def holders(self, running: list[Any]) -> list[Holder]:
        """For NVML: each running GPU kernel's process tree on its grant's devices, and
        this server's own process tree on its granted UUIDs (CUDA_VISIBLE_DEVICES)."""
        out = [
            Holder(
                r.kernel_id,
                r.node,
                r.devices,
                process_tree(int(r.provisioner.pid)),
                list((r.grant or {}).get("uuids") or []),
            )
            for r in running
            if r.provisioner.pid
        ]
        uuids = visible_uuids()
        if self.reports and uuids:
            out.append(Holder(SERVER_KEY, None, [], process_tree(os.getpid()), uuids))
        return out

    def judge(
        self, now: datetime, gpu_busy: dict[str, bool], server_utilization: float | None
    ) -> list[str]:
        """Why this server is busy now ([] when idle)."""
        ext = self.ext
        reasons = [f"GPU kernel {kid[:8]} is busy" for kid, busy in gpu_busy.items() if busy]
        mkm = ext.serverapp.kernel_manager
        for kid in list(mkm.list_kernel_ids()):
            if kid in gpu_busy or ext.table.get(kid) is not None:
                continue  # a GPU kernel: judged by its own heartbeat (waiting: not busy)
            km = mkm.get_kernel(kid)
            state = getattr(km, "execution_state", None)
            if decide_busy(state, getattr(km, "last_activity", None), self.since, None, 1.0):
                reasons.append(f"kernel {kid[:8]} is executing")
        if server_utilization is not None and server_utilization > ext.busy_utilization:
            reasons.append(f"this server's GPUs are {server_utilization:.0%} busy")
        jobs = ext.settings.get("gpuaas_jobs")
        if jobs is not None:
            reasons.extend(jobs.activity(self.since.timestamp() if self.since else None))
        return reasons

    async def round(
        self, now: datetime, gpu_busy: dict[str, bool], server_utilization: float | None
    ) -> None:
        """One round's verdict: stamp the setting when busy; the holder then renews the
        server's request with it (busy or idle) in the same round."""
        self.reasons = self.judge(now, gpu_busy, server_utilization)
        self.since = now
        if self.reasons:
            # The web app's own settings: the extension's `settings` were merged into them
            # once, at start, and are a copy.
            self.ext.serverapp.web_app.settings[SETTING] = now
        if not self.reports:
            return
        if self._lease is None:  # held by the process's holder, renewed after this hook
            self._lease = grant_holder().hold(
                Lease(
                    self.server_request_id,
                    self.ext.client,
                    on_lost=self._ended,
                    on_renewed=self._told,
                )
            )
        self._lease.busy = bool(self.reasons)
        self._lease.utilization = server_utilization

    def _ended(self, error: GatewayError) -> None:
        """Culled, released or preempted: the spawner stops us; no more heartbeats."""
        self._request_ended = True
        self.log.info(
            "gpuaas: this server's request %s has ended (%s): no more heartbeats",
            self.server_request_id,
            error,
        )

    def _told(self, answer: dict[str, Any]) -> None:
        """The gateway heard this round's verdict."""
        busy = bool(self.reasons)
        if busy != self.server_busy:
            self.log.info(
                "gpuaas: this server is %s",
                "busy: " + "; ".join(self.reasons) if busy else "idle on its GPUs",
            )
        self.server_busy = busy

    def close(self) -> None:
        """The server stops: its request is the spawner's to release."""
        if self._lease is not None:
            grant_holder().drop(self._lease)
            self._lease = None
