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

The request is a `Claim` (claim.py). Its wait is woken by the server's one event stream
(when the extension runs) and, whether or not an extension runs, by reading the request
every `poll_interval` seconds. A running kernel's lease is held by the process's grant
holder (holder.py): the extension's rounds say whether it is busy; without an extension it
is renewed as busy every `standalone_heartbeat` seconds.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import HasTraits, Integer, Unicode

from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.claim import Claim, ClaimError
from jupyter_gpuaas.client import GatewayClient, GatewayError
from jupyter_gpuaas.holder import Lease, Seconds, follower

from .kernels import DEFERRED, ENDED, GpuKernel, KernelTable, table_of


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


class GpuKernelHolder(GpuKernelKnobs):
    """What a GPU kernel's provisioner does about its GPUs, through one `Claim`: the
    local `gpuaas` provisioner and the `gpuaas-kubernetes` one (kubernetes/kernels.py)
    are both this and their own way to run the kernel.

    The kernel's record (kernels.py) lives in the server extension's table, reached
    through the kernel manager that made the provisioner; a provisioner used without the
    extension (nbclient, `jupyter console`) keeps a table of its own, and its client is
    the environment's (GPUAAS_URL, GPUAAS_TOKEN).
    """

    # Provided by the provisioner (jupyter_client's KernelProvisionerBase).
    kernel_id: Any
    kernel_spec: Any
    parent: Any
    log: Any

    record: GpuKernel | None = None
    claim: Claim | None = None
    _own_table: KernelTable | None = None
    _release_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ gateway

    def kernel_table(self) -> KernelTable:
        """The table of this server's GPU kernels (see the class's docstring)."""
        table = table_of(self.parent)
        if table is not None:
            return table
        if self._own_table is None:
            self._own_table = KernelTable()
        return self._own_table

    def _client(self) -> GatewayClient:
        table = self.kernel_table()
        if table.client is None:
            table.client = GatewayClient.from_env()
        return table.client

    @property
    def lease(self) -> Lease | None:
        return None if self.claim is None else self.claim.lease

    @property
    def grant_env(self) -> dict[str, str]:
        """The environment that confines the kernel to its granted devices."""
        grant = self.claim.grant if self.claim is not None and self.holds_grant() else None
        return {} if grant is None else grant.environment()

    def granted_request(self) -> dict[str, Any]:
        """The gateway's admitted request object of the grant held (a kernel pod's)."""
        assert self.claim is not None and self.claim.request is not None
        return self.claim.request

    def holds_grant(self) -> bool:
        return self.record is not None and self.record.state in ("admitted", "running")

    def _set_reason(self, text: str) -> None:
        # jupyter_server shows `reason` in the kernel model (GET api/kernels) while set.
        km = self.parent
        if km is not None and hasattr(km, "reason"):
            km.reason = text

    def _new_claim(self, request_id: str | None = None) -> Claim:
        name = getattr(self.kernel_spec, "display_name", "") or "GPU kernel"
        tenant = self.tenant or self.kernel_table().default_tenant or None
        return Claim(
            self._client,
            "kernel",
            int(self.gpus),
            self.flavor,
            tenant,
            priority=int(self.priority),
            name=f"{name} ({str(self.kernel_id)[:8]})",
            request_id=request_id,
        )

    async def acquire(
        self, before_wait: Callable[[Claim], Awaitable[None]] | None = None
    ) -> GpuKernel:
        """Submit a `kernel` request and wait until it is admitted. `before_wait(claim)`
        runs once the request is submitted (Kueue mode: the kernel's pod is created, and
        Kueue admits it); if it raises, the request is given back and the kernel fails."""
        if self._release_task is not None:
            await asyncio.shield(self._release_task)  # a death's release goes first
        table = self.kernel_table()
        kernel_id = str(self.kernel_id)
        name = getattr(self.kernel_spec, "display_name", "") or "GPU kernel"
        restored = self.record
        resume = (
            restored is not None
            and restored.waiting
            and restored.request_id is not None
            and self.claim is not None
        )
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
            self.claim = self._new_claim()
        claim = self.claim
        assert claim is not None
        # Shut down (or interrupted) before the provisioner even got here.
        record.abort_reason = table.aborts.pop(kernel_id, "") or record.abort_reason
        deferred = not resume and table.take_deferral(kernel_id)
        if deferred:
            record.state = DEFERRED
        self.record = table.add(record)
        if deferred:
            await self._until_run(record)
        started = time.perf_counter()
        try:
            if not resume:
                await self._submit(claim, record)
                if before_wait is not None:
                    try:
                        await before_wait(claim)
                    except Exception as e:
                        await claim.release()
                        raise GpuAdmissionError(str(e)) from None
            record.answer()
            await self._wait_admitted(claim, record)
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
        self._hold(claim, record)
        self._set_reason("")
        self.log.info(
            "GPU kernel %s admitted: request %s, devices %s on %s",
            kernel_id,
            record.request_id,
            record.devices,
            record.node,
        )
        return record

    async def _until_run(self, record: GpuKernel) -> None:
        """A notebook's kernel waits, asking the gateway for nothing, until its first cell
        runs (the kernel websocket's first `execute_request`: waiting.py calls
        `GpuKernel.run`); then `acquire` submits its request as for any other start.

        Why here, inside the pending start, rather than a kernel manager state of its
        own: the pending start already is "a kernel that exists and waits", with its
        websocket held open, its cells told, and shutdown and interrupt wired to the
        record; a deferred kernel is that same wait with no request yet. Shut down
        meanwhile, it leaves nothing at the gateway and no row in the history.
        """
        table = self.kernel_table()
        self._set_reason(record.sentence())
        record.answer()  # the start's first answer: there is nothing to ask yet
        watch = record.watch()
        try:
            while record.state == DEFERRED and not record.abort_reason:
                await watch.wait()
                watch.clear()
        finally:
            record.unwatch(watch)
        if record.abort_reason:
            record.end("cancelled", record.abort_reason)
            table.drop(record)
            self.record = None  # nothing to release, nothing for the history
            raise GpuAdmissionError(record.abort_reason)
        self.log.info("GPU kernel %s ran its first cell: asking for its GPUs", record.kernel_id)

    async def _submit(self, claim: Claim, record: GpuKernel) -> None:
        try:
            record.tenant = await claim.choose_tenant()
        except GatewayError as e:
            raise GpuAdmissionError(f"cannot ask the gateway for your tenants: {e}") from None
        except ClaimError as e:
            raise GpuAdmissionError(
                f"{e}, or set the kernelspec's provisioner config `tenant`", e.status
            ) from None
        try:
            record.apply(await claim.submit())
        except GatewayError as e:
            raise GpuAdmissionError(f"GPU request refused: {e.error}", e.status) from None

    async def _wait_admitted(self, claim: Claim, record: GpuKernel) -> None:
        """The claim's wait, woken by the server's one event stream (when the extension
        runs) and by any change of the record (an abort); the record follows the claim."""
        table = self.kernel_table()
        stream = follower(self._client()) if table.reporting else None

        def turn(claim: Claim) -> None:
            if claim.request is not None:
                record.apply(claim.request)
            if record.abort_reason or record.state in ENDED:
                raise _Abort()
            self._set_reason(record.sentence())

        watch = record.watch()
        timeout = float(self.admission_timeout) or None
        try:
            await claim.admitted(
                poll=float(self.poll_interval),
                timeout=timeout,
                stream=stream,
                wake=watch,
                on_turn=turn,
            )
        except _Abort:
            pass
        except ClaimError as e:
            if e.timed_out:
                await claim.release()
                reason = f"no GPU within {self.admission_timeout:.0f} s"
                record.end("cancelled", reason)
                raise GpuAdmissionError(reason) from None
            record.end("failed", str(e))
        finally:
            record.unwatch(watch)
        if record.abort_reason:  # shut down while waiting, or just as it was admitted
            await claim.release()
            record.end("cancelled", record.abort_reason)
            raise GpuAdmissionError(record.abort_reason)
        if record.state in ENDED:
            raise GpuAdmissionError(record.reason or f"GPU request {record.state}")

    def _hold(self, claim: Claim, record: GpuKernel) -> None:
        """Hand the grant's lease to the process's holder (replacing any earlier one):
        busy or idle as the extension's rounds judge it, else renewed as busy."""
        if record.request_id is None:
            return

        def renewed(answer: dict[str, Any]) -> None:
            grant = answer.get("grant") or {}
            record.lease_expires = grant.get("lease_expires", record.lease_expires)

        claim.hold(
            interval=None if self.kernel_table().reporting else float(self.standalone_heartbeat),
            on_lost=functools.partial(self._grant_lost, record),
            on_renewed=renewed,
            active=lambda: record.ended is None,
        )

    async def _grant_lost(self, record: GpuKernel, error: GatewayError) -> None:
        """A renewal found the grant ended: the extension finds out why and stops the
        kernel; without one the record says so."""
        lost = self.kernel_table().on_lost
        if lost is not None:
            await lost(record)
        elif record.ended is None:
            record.end("lost", f"GPU grant lost: {error.error}")

    async def release(self, state: str = "released", reason: str = "") -> None:
        """Give the devices back (idempotent). A culled request keeps its parked quota."""
        record = self.record
        if record is None or record.ended is not None:
            if record is not None:
                self.kernel_table().retire(record)
            return
        keep_parked = record.state == "culled"
        record.end(state, reason)
        self.kernel_table().retire(record)
        if self.claim is not None:
            await self.claim.release(reason, keep_parked=keep_parked)

    def _stopping(self) -> bool:
        return bool(getattr(self.parent, "shutting_down", False))

    def _died(self, reason: str) -> None:
        """The kernel died on its own (kill -9, segfault, OOM, its pod gone): nobody will
        call cleanup before an auto-restart, and the devices are idle now. Released in the
        background so is_alive() stays fast; a restart's acquire() waits for it."""
        if not self.holds_grant() or self._stopping():
            return
        self.log.warning("GPU kernel %s: %s; releasing its GPUs", self.kernel_id, reason)
        self._release_task = asyncio.ensure_future(self.release("released", reason))

    async def _shut_down(self) -> None:
        """The kernel is shut down: a waiting one gives up its wait (and its request),
        a running one its grant."""
        if self.record is not None and self.record.waiting:
            self.record.abort_reason = self.record.abort_reason or "kernel shut down"
            self.record.poke()
            return
        await self.release("released", "kernel shut down")

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.record is not None:
            info["gpuaas"] = self.record.to_json()
        return info

    async def _restore(self, provisioner_info: dict[str, Any]) -> None:
        """Take a kernel back after a server restart: its request, and its grant if held.

        The saved record says which request the kernel had; the gateway (the store) says
        where that request stands now. An admitted request is held again (heartbeats
        resume, the launch environment names its devices); a queued or parked one is
        waited on by the next launch instead of a second submission; an ended one is
        history. With the gateway unreachable, the saved record stands until a heartbeat
        or a poll learns better.
        """
        saved = provisioner_info.get("gpuaas")
        if not isinstance(saved, dict) or not saved.get("request_id"):
            return
        table = self.kernel_table()
        rid = str(saved["request_id"])
        record = GpuKernel(
            kernel_id=str(saved.get("kernel_id") or self.kernel_id),
            kernel_name=str(saved.get("kernel_name") or "GPU kernel"),
            gpus=int(saved.get("gpus") or self.gpus),
            flavor=saved.get("flavor", self.flavor),
            tenant=saved.get("tenant"),
            request_id=rid,
            node=saved.get("node"),
            devices=[int(d) for d in saved.get("devices") or []],
            lease_expires=saved.get("lease_expires"),
            created=float(saved.get("created") or time.time()),
            provisioner=self,
        )
        claim = self.claim = self._new_claim(rid)
        record.state = "running" if saved.get("state") in ("admitted", "running") else "queued"
        if saved.get("state") in ENDED:
            record.end(str(saved["state"]), str(saved.get("reason") or ""))
        else:
            try:
                obj: Mapping[str, Any] | None = await self._client().get(rid)
            except GatewayError as e:
                obj = {"state": "gone", "reason": e.error} if e.status in (404, 410) else None
            if obj is not None:
                self._restore_from(record, obj)
                claim.update(obj)
            elif record.state == "running":
                # The saved record stands: its grant as saved, until the gateway answers.
                grant = {"node": record.node, "devices": record.devices, "flavor": record.flavor}
                claim.update(
                    {"id": rid, "tenant": record.tenant, "state": "admitted", "grant": grant}
                )
        record.answer()
        self.record = record
        if record.ended is not None:
            table.retire(record)
            return
        table.add(record)
        if record.state == "running":
            self._hold(claim, record)

    @staticmethod
    def _restore_from(record: GpuKernel, obj: Mapping[str, Any]) -> None:
        state = obj.get("state")
        if state == State.ADMITTED and obj.get("grant"):
            record.state = "queued"  # apply() takes a grant only into a waiting record
            record.apply(obj)
            record.state = "running"
        elif state in (State.QUEUED, State.PARKED):
            record.state = "queued"
            record.apply(obj)
        else:
            reason = obj.get("reason") or f"GPU request {state}"
            record.end("lost", f"GPU grant lost while the server restarted: {reason}")


class _Abort(Exception):
    """The record says stop waiting (shut down, interrupted, ended by an event)."""


# jupyter_client builds its provisioners' metaclass at runtime (ABCMeta and traitlets'
# MetaHasTraits), which mypy cannot follow: it sees a conflict Python does not have.
class GpuaasProvisioner(GpuKernelHolder, LocalProvisioner):  # type: ignore[metaclass]
    """Launches a local kernel on GPUs granted by the jupyter-gpuaas gateway."""

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if not self.holds_grant():
            await self.acquire()
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"].update(self.grant_env)
        return kwargs

    async def poll(self) -> int | None:
        alive_before = self.process is not None
        ret: int | None = await super().poll()
        if alive_before and ret is not None:
            self._died(f"kernel died (exit status {ret})")
        return ret

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart:  # a restart keeps its grant; pre_launch reuses it
            await self._shut_down()

    async def get_provisioner_info(self) -> dict[str, Any]:
        return self._info(await super().get_provisioner_info())

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        await self._restore(provisioner_info)
