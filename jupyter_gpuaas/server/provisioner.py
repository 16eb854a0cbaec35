"""The `gpuaas` kernel provisioner: a local kernel that starts only on admitted GPUs.

A GPU kernelspec names it (`metadata.kernel_provisioner = {"provisioner_name": "gpuaas",
"config": {"gpus": 1, "flavor": "a100"}}`). Before launch it submits a `kernel` request to
the gateway and waits for admission; the kernel then runs with CUDA_VISIBLE_DEVICES and
NVIDIA_VISIBLE_DEVICES set to exactly the granted devices.

Lifecycle, in jupyter_client's terms:

- `pre_launch`: acquire a grant unless one is held (a restart keeps its grant);
- `cleanup(restart=True)`: keep the grant; `cleanup(restart=False)`: release it (unless the
  gateway culled it: then its quota is parked for the user's relaunch and must stay so);
- `poll()` seeing the process gone outside a shutdown: the kernel died, release at once
  (an auto-restart asks again);
- a crashed server cannot release anything: its grants end when their leases expire.

Waiting is woken by the extension's event listener and, whether or not an extension runs,
by polling the request every `poll_interval` seconds. A running kernel's lease is held by
the process's grant holder (holder.py): the extension's rounds say whether it is busy;
without an extension it is renewed as busy every `standalone_heartbeat` seconds.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import HasTraits, Integer, Unicode

from jupyter_gpuaas.client import GatewayClient, GatewayError, launch_environment
from jupyter_gpuaas.holder import TERMINAL_STATES, Lease, Seconds, grant_holder

from .kernels import ENDED, GpuKernel, KernelTable, current_table


class GpuAdmissionError(RuntimeError):
    """The kernel cannot start on GPUs: refused, cancelled, or the gateway is unreachable.

    `status` is the gateway's HTTP status where there was one (422: can never be admitted).
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class GpuKernelKnobs(HasTraits):
    """What a GPU kernelspec's provisioner `config` says about the request, and how its
    provisioner waits and renews: one definition for the local `gpuaas` provisioner and
    the `gpuaas-kubernetes` one (kubernetes/kernels.py), which hands them to the local
    one it holds."""

    gpus = Integer(1, min=1, help="GPUs the kernel needs (kernelspec config `gpus`).").tag(
        config=True
    )
    flavor = Unicode(
        None,
        allow_none=True,
        help="GPU flavor (a100, t4, ...); unset: the tenant's flavors in quota order.",
    ).tag(config=True)
    tenant = Unicode(
        None,
        allow_none=True,
        help="Tenant (team) charged; unset: the user's only tenant, else the first the "
        "gateway lists for the user.",
    ).tag(config=True)
    priority = Integer(0, help="Request priority within the tenant (higher first).").tag(
        config=True
    )
    poll_interval = Seconds(
        2.0,
        help="Seconds between polls of a waiting request (events usually wake it sooner).",
    ).tag(config=True)
    admission_timeout = Seconds(
        0.0,
        zero_ok=True,
        help="Seconds to wait for admission before giving up (0: wait as long as it takes; "
        "shutting the kernel down cancels the wait).",
    ).tag(config=True)

    standalone_heartbeat = Seconds(
        30.0,
        help="Seconds between lease renewals when no jupyter_gpuaas server extension reports "
        "activity (nbclient, jupyter console). Such a kernel always reports busy: whoever "
        "runs it without a server is running code, and there is nobody to cull it for.",
    ).tag(config=True)


# jupyter_client builds its provisioners' metaclass at runtime (ABCMeta and traitlets'
# MetaHasTraits), which mypy cannot follow: it sees a conflict Python does not have.
class GpuaasProvisioner(GpuKernelKnobs, LocalProvisioner):  # type: ignore[metaclass]
    """Launches a local kernel on GPUs granted by the jupyter-gpuaas gateway."""

    record: GpuKernel | None = None
    lease: Lease | None = None
    _release_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ gateway

    def _table(self) -> KernelTable:
        return current_table()

    def _client(self) -> GatewayClient:
        table = self._table()
        if table.client is None:
            table.client = GatewayClient.from_env()
        return table.client

    async def _pick_tenant(self, client: GatewayClient) -> str:
        if self.tenant:
            return str(self.tenant)
        table = self._table()
        if table.default_tenant:
            return table.default_tenant
        try:
            tenants = await table.chargeable_tenants(client)
        except GatewayError as e:
            raise GpuAdmissionError(f"cannot ask the gateway for your tenants: {e}") from None
        if not tenants:
            raise GpuAdmissionError(
                "you are not a member of any GPU tenant: ask an administrator to add you to "
                "a tenant group, or set the kernelspec's provisioner config `tenant`"
            )
        return tenants[0]

    @property
    def grant_env(self) -> dict[str, str]:
        """The environment that confines the kernel to its granted devices."""
        if self.record is None:
            return {}
        r = self.record
        grant = r.grant or {"node": r.node, "devices": r.devices}
        return launch_environment({"id": r.request_id, "tenant": r.tenant, "grant": grant})

    def _has_grant(self) -> bool:
        return self.record is not None and self.record.state in ("admitted", "running")

    def _set_reason(self, text: str) -> None:
        # jupyter_server shows `reason` in the kernel model (GET api/kernels) while set.
        km = self.parent
        if km is not None and hasattr(km, "reason"):
            km.reason = text

    async def acquire(self) -> GpuKernel:
        """Submit a `kernel` request and wait until it is admitted."""
        if self._release_task is not None:
            await asyncio.shield(self._release_task)  # a death's release goes first
        table = self._table()
        kernel_id = str(self.kernel_id)
        name = getattr(self.kernel_spec, "display_name", "") or "GPU kernel"
        restored = self.record
        resume = restored is not None and restored.waiting and restored.request_id is not None
        if resume:  # a queued request restored by load_provisioner_info: wait on it
            assert restored is not None
            record = restored
        else:
            record = GpuKernel(
                kernel_id=kernel_id,
                kernel_name=str(getattr(self.parent, "kernel_name", "") or name),
                gpus=int(self.gpus),
                flavor=self.flavor,
                provisioner=self,
            )
        # Shut down (or interrupted) before the provisioner even got here.
        record.abort_reason = table.aborts.pop(kernel_id, "") or record.abort_reason
        self.record = table.add(record)
        started = time.perf_counter()
        try:
            client = self._client()
            if not resume:
                tenant = await self._pick_tenant(client)
                record.tenant = tenant
                try:
                    obj = await client.submit(
                        tenant,
                        "kernel",
                        int(self.gpus),
                        flavor=self.flavor,
                        priority=int(self.priority),
                        name=f"{name} ({kernel_id[:8]})",
                    )
                except GatewayError as e:
                    raise GpuAdmissionError(f"GPU request refused: {e.error}", e.status) from None
                record.apply(obj)
            record.answer()
            await self._wait_admitted(client, record)
        except GpuAdmissionError as e:
            if record.ended is None:
                record.end("failed", str(e))
            table.retire(record)
            self._set_reason(str(e))
            raise
        except GatewayError as e:  # no answer at all (status 0)
            record.end("failed", f"gateway unreachable: {e}")
            table.retire(record)
            raise GpuAdmissionError(record.reason) from None
        record.state = "running"
        record.waited = time.perf_counter() - started
        self._hold(record)
        self._set_reason("")
        self.log.info(
            "GPU kernel %s admitted: request %s, devices %s on %s",
            kernel_id,
            record.request_id,
            record.devices,
            record.node,
        )
        return record

    async def _wait_admitted(self, client: GatewayClient, record: GpuKernel) -> None:
        started = time.monotonic()
        while record.state != "admitted":
            if record.abort_reason:
                await self._cancel_quietly(client, record)
                record.end("cancelled", record.abort_reason)
                raise GpuAdmissionError(record.abort_reason)
            if record.state in ENDED:
                raise GpuAdmissionError(record.reason or f"GPU request {record.state}")
            self._set_reason(record.sentence())
            timeout = float(self.poll_interval)
            if self.admission_timeout > 0:
                left = self.admission_timeout - (time.monotonic() - started)
                if left <= 0:
                    await self._cancel_quietly(client, record)
                    reason = f"no GPU within {self.admission_timeout:.0f} s"
                    record.end("cancelled", reason)
                    raise GpuAdmissionError(reason)
                timeout = min(timeout, left)
            record.changed.clear()
            try:
                await asyncio.wait_for(record.changed.wait(), timeout)
                continue  # woken by an event or an abort: look again before polling
            except asyncio.TimeoutError:
                pass
            if record.request_id is None:
                continue
            try:
                obj = await client.get(record.request_id)
            except GatewayError as e:
                self.log.warning("polling GPU request %s: %s", record.request_id, e)
                continue
            if obj.get("state") in TERMINAL_STATES:
                record.end("failed", obj.get("reason") or f"GPU request {obj.get('state')}")
            else:
                record.apply(obj)
        if record.abort_reason:  # admitted just as the kernel was shut down: give it back
            await self._cancel_quietly(client, record)
            record.end("cancelled", record.abort_reason)
            raise GpuAdmissionError(record.abort_reason)

    async def _cancel_quietly(self, client: GatewayClient, record: GpuKernel) -> None:
        if record.request_id is None:
            return
        try:
            await client.cancel(record.request_id)
        except GatewayError as e:
            if e.status != 409:  # 409: it already ended, which is what we want
                self.log.warning("cancelling GPU request %s: %s", record.request_id, e)

    def _hold(self, record: GpuKernel) -> None:
        """Hand the grant's lease to the process's holder (replacing any earlier one)."""
        if record.request_id is None:
            return
        holder = grant_holder()
        if not self._table().reporting:  # no extension judges it: renewed as busy
            holder.configure(float(self.standalone_heartbeat))

        def renewed(answer: dict[str, Any]) -> None:
            grant = answer.get("grant") or {}
            record.lease_expires = grant.get("lease_expires", record.lease_expires)

        self.lease = holder.hold(
            Lease(
                record.request_id,
                self._client(),
                on_lost=functools.partial(self._grant_lost, record),
                on_renewed=renewed,
                active=lambda: record.ended is None,
            )
        )

    async def _grant_lost(self, record: GpuKernel, error: GatewayError) -> None:
        """A renewal found the grant ended: the extension finds out why and stops the
        kernel; without one the record says so."""
        lost = self._table().on_lost
        if lost is not None:
            await lost(record)
        elif record.ended is None:
            record.end("lost", f"GPU grant lost: {error.error}")

    async def release(self, state: str = "released", reason: str = "") -> None:
        """Give the devices back (idempotent). A culled request keeps its parked quota."""
        record = self.record
        if record is None or record.ended is not None:
            if record is not None:
                self._table().retire(record)
            return
        if self.lease is not None:
            grant_holder().drop(self.lease)
            self.lease = None
        keep_parked = record.state == "culled"
        record.end(state, reason)
        self._table().retire(record)
        if keep_parked or record.request_id is None:
            return
        try:
            await self._cancel_quietly(self._client(), record)
        except GatewayError as e:
            self.log.warning("releasing GPU request %s: %s", record.request_id, e)

    # ------------------------------------------------------------------ provisioner API

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if not self._has_grant():
            await self.acquire()
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"].update(self.grant_env)
        return kwargs

    async def poll(self) -> int | None:
        alive_before = self.process is not None
        ret: int | None = await super().poll()
        if alive_before and ret is not None and self._has_grant() and not self._stopping():
            # Died on its own (kill -9, segfault, OOM): nobody will call cleanup before an
            # auto-restart, and the devices are idle now. Release in the background so
            # is_alive() stays fast; a restart's acquire() waits for it.
            assert self.record is not None
            reason = f"kernel died (exit status {ret})"
            self.log.warning("GPU kernel %s: %s; releasing its GPUs", self.kernel_id, reason)
            self._release_task = asyncio.ensure_future(self.release("released", reason))
        return ret

    def _stopping(self) -> bool:
        return bool(getattr(self.parent, "shutting_down", False))

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if restart:
            return  # a restart keeps its grant; pre_launch reuses it
        if self.record is not None and self.record.waiting:
            self.record.abort_reason = self.record.abort_reason or "kernel shut down"
            self.record.poke()
            return
        await self.release("released", "kernel shut down")

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        if self.record is not None:
            info["gpuaas"] = self.record.to_json()
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Take a kernel back after a server restart: its request, and its grant if held.

        The saved record says which request the kernel had; the gateway (the store) says
        where that request stands now. An admitted request is held again (heartbeats
        resume, the launch environment names its devices); a queued or parked one is
        waited on by the next launch instead of a second submission; an ended one is
        history. With the gateway unreachable, the saved record stands until a heartbeat
        or a poll learns better.
        """
        await super().load_provisioner_info(provisioner_info)
        saved = provisioner_info.get("gpuaas")
        if not isinstance(saved, dict) or not saved.get("request_id"):
            return
        table = self._table()
        record = GpuKernel(
            kernel_id=str(saved.get("kernel_id") or self.kernel_id),
            kernel_name=str(saved.get("kernel_name") or "GPU kernel"),
            gpus=int(saved.get("gpus") or self.gpus),
            flavor=saved.get("flavor", self.flavor),
            tenant=saved.get("tenant"),
            request_id=str(saved["request_id"]),
            node=saved.get("node"),
            devices=[int(d) for d in saved.get("devices") or []],
            lease_expires=saved.get("lease_expires"),
            created=float(saved.get("created") or time.time()),
            provisioner=self,
        )
        record.state = "running" if saved.get("state") in ("admitted", "running") else "queued"
        if saved.get("state") in ENDED:
            record.end(str(saved["state"]), str(saved.get("reason") or ""))
        else:
            try:
                obj: Mapping[str, Any] | None = await self._client().get(str(saved["request_id"]))
            except GatewayError as e:
                obj = {"state": "gone", "reason": e.error} if e.status in (404, 410) else None
            if obj is not None:
                self._restore_from(record, obj)
        record.answer()
        self.record = record
        if record.ended is not None:
            table.retire(record)
            return
        table.add(record)
        if record.state == "running":
            self._hold(record)

    @staticmethod
    def _restore_from(record: GpuKernel, obj: Mapping[str, Any]) -> None:
        state = obj.get("state")
        if state == "admitted" and obj.get("grant"):
            record.state = "queued"  # apply() takes a grant only into a waiting record
            record.apply(obj)
            record.state = "running"
        elif state in ("queued", "parked"):
            record.state = "queued"
            record.apply(obj)
        else:
            reason = obj.get("reason") or f"GPU request {state}"
            record.end("lost", f"GPU grant lost while the server restarted: {reason}")
