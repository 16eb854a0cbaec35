"""The server's kernel manager: jupyter_server's own, with what GPU kernels need.

`GpuaasKernelManager` is jupyter_server's `AsyncMappingKernelManager`, configured as
`ServerApp.kernel_manager_class` (the packaged jupyter-config file sets it beside the
extension's enablement). Every kernel that is not a GPU kernel is managed exactly as
jupyter_server manages it. For a GPU kernel (a kernelspec whose provisioner is `gpuaas`
or `gpuaas-kubernetes`), once the extension is attached (`attach`):

- a notebook's GPU kernel (one JupyterLab starts through a session, also when it reopens
  or restores a notebook) asks for its GPUs only when its first cell runs
  (`GpuaasExtension.take_gpu_at_first_run`); until then it waits with no request;
- it starts as a *pending* kernel, so the REST call that starts it returns while the
  kernel waits in the gateway's queue; the call waits only for the gateway's first
  answer (`GpuaasExtension.submit_wait`), so a request that can never be admitted fails
  it at once, as HTTP 422 with the reason;
- shutting it down or interrupting it while it waits cancels its request; restarting it
  while it waits is refused in a sentence;
- our own widgets' comm traffic on its iopub is not activity (activity.py).

Every kernel's `history_request` (a notebook asks it at each connection: every page load,
reload or restore) is not activity either (`untracked_message_types`).

Only overridable methods are overridden (each says why), and no attribute of
jupyter_client or jupyter_server that they keep private is read or written.

Its zmq context is never terminated by a finalizer. jupyter_client's `__del__` terminates
a context it created, and run by the garbage collector that can hang for good: a dropped
server app is one reference cycle (kernel manager → parent server app → kernel manager),
so only a collection frees it; the collector clears the context's weak set of sockets
before it runs any finalizer, `Context.destroy()` then closes none of the sockets still
open, and `Context.term()` waits for them forever. So this manager makes its context
itself, keeps it referenced here until it is closed (pyzmq's own `Context.__del__` would
terminate it the same way), closes it with linger 0 on the server's shutdown path
(`shutdown_all`, which jupyter_server calls as it stops), and a context whose manager was
dropped without that is closed by the next manager made, outside any collection.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from typing import TYPE_CHECKING, Any

import zmq.asyncio
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import Bool, default, observe

from .kernels import DEFERRED, is_gpu_spec

if TYPE_CHECKING:
    from .extension import GpuaasExtension

#: The task of a GPU kernel's start in progress (`_PendingForGpuStarts` reads it).
_starting_gpu_kernel: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "gpuaas_starting_gpu_kernel", default=None
)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: no start in progress either
        return None


class _PendingForGpuStarts(Bool[bool, bool]):
    """`use_pending_kernels`: the server's configured value, and True within the start of
    a GPU kernel.

    jupyter_client and jupyter_server read the flag by name while they start a kernel (and
    again to shut one down or restart it), and offer no per-kernel choice. The start of a
    GPU kernel marks its own task in a context variable; the flag reads True only for
    code run by that very task, so the start of any other kernel, at the same moment or
    later, and any task the start spawns, read the configured value.
    """

    def get(self, obj: Any, cls: Any = None) -> Any:
        configured = super().get(obj, cls)
        task = _starting_gpu_kernel.get()
        return bool(configured) or (task is not None and task is _current_task())


# ---------------------------------------------------------------------------- contexts

#: Contexts made by GpuaasKernelManagers and not yet closed, with a weak reference to
#: their manager: referenced here, a context is never finalized (nor terminated) by a
#: garbage collection while it is open.
_open_contexts: dict[int, tuple[zmq.Context[Any], weakref.ref[Any]]] = {}


def _hold_context(context: zmq.Context[Any], owner: Any) -> None:
    _open_contexts[id(context)] = (context, weakref.ref(owner))


def close_orphaned_contexts() -> int:
    """Close (linger 0) the open contexts whose kernel manager is gone; how many.

    Never called from a finalizer: outside a collection every socket still open is in
    its context's weak set, so `destroy` closes them all and `term` returns at once.
    """
    closed = 0
    for key, (context, owner) in list(_open_contexts.items()):
        if context.closed:
            del _open_contexts[key]
        elif owner() is None:
            context.destroy(linger=0)
            del _open_contexts[key]
            closed += 1
    return closed


class GpuaasKernelManager(AsyncMappingKernelManager):
    """jupyter_server's kernel manager, plus pending starts and waits for GPU kernels.

    (jupyter_client types its kernel methods as synchronous, the async ones included, and
    jupyter_server leaves its own untyped: hence the `type: ignore`s of the overrides.)
    """

    # Redefined (same name, same default, same config) so that GPU kernels alone start
    # as pending kernels: see _PendingForGpuStarts.
    use_pending_kernels = _PendingForGpuStarts(
        False,
        help="""Whether to make kernels available before the process has started. GPU
        kernels start as pending kernels whatever this says (unless
        GpuaasExtension.use_pending_kernels is off): they may wait long for their GPUs.""",
    ).tag(config=True)

    @default("untracked_message_types")
    def _untracked_with_history(self) -> list[str]:
        # A notebook asks its kernel for its input history (`history_request`) each time
        # it connects: every page load, reload or restore. jupyter_server counts that as
        # activity (it is not among its untracked types), which made a reload reset the
        # idle clock of every kernel (the gateway's, through decide_busy, and the Hub's).
        # Opening a page is not work; configured values still win.
        trait = AsyncMappingKernelManager.class_traits()["untracked_message_types"]
        default_types = [str(t) for t in trait.default() or []]
        return [*default_types, "history_request", "history_reply"]

    #: The extension, once it attached itself; None: a plain AsyncMappingKernelManager.
    gpuaas: GpuaasExtension | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        close_orphaned_contexts()  # a safe point: see the module's docstring

    def attach(self, extension: GpuaasExtension) -> None:
        """Manage GPU kernels for `extension` (its table, its settings)."""
        self.gpuaas = extension

    # ------------------------------------------------------------------ the zmq context

    @default("context")
    def _gpuaas_context(self) -> zmq.asyncio.Context:
        # Our own, so that jupyter_client's finalizer never terminates it (it terminates
        # only a context it made itself); held until closed (the module's docstring).
        context = zmq.asyncio.Context()
        _hold_context(context, self)
        return context

    @observe("context")
    def _hold_new_context(self, change: Any) -> None:
        # jupyter_client makes a fresh context when a kernel starts after the shared one
        # was closed: held as ours are.
        context = change["new"]
        if context is not None and not context.closed:
            _hold_context(context, self)

    def close_context(self) -> None:
        """Close this manager's zmq context and every socket still on it (linger 0)."""
        if not self.trait_has_value("context"):
            return  # never made: nothing to close
        context = self.context
        if context is not None and not context.closed:
            context.destroy(linger=0)
        _open_contexts.pop(id(context), None)

    def __del__(self) -> None:
        # Replaces jupyter_client's finalizer, which terminates the context and can hang
        # a garbage collection for good (the module's docstring). Nothing is terminated
        # here: shutdown_all closed the context, or the next manager made will.
        pass

    # ------------------------------------------------------------------ GPU kernels

    def _is_gpu_kernelspec(self, kernel_name: str | None) -> bool:
        specs = self.kernel_spec_manager
        if specs is None:
            return False
        try:
            spec = specs.get_kernel_spec(kernel_name or self.default_kernel_name)
        except Exception:  # an unknown name: the start itself reports it
            return False
        return is_gpu_spec(spec)

    async def start_kernel(self, **kwargs: Any) -> str:  # type: ignore[override]
        """A GPU kernel starts pending and waits for the gateway's first answer only."""
        # Overridden: jupyter_server has no per-kernel choice of pending starts, and no
        # hook to turn a refused start into a 422 with the reason.
        from .provisioner import GpuAdmissionError

        ext = self.gpuaas
        new = kwargs.get("kernel_id") is None or kwargs["kernel_id"] not in self
        if ext is None or not new or not self._is_gpu_kernelspec(kwargs.get("kernel_name")):
            kernel_id: str = await super().start_kernel(**kwargs)
            return kernel_id
        token = None
        if ext.use_pending_kernels:
            token = _starting_gpu_kernel.set(_current_task())
        deferred = None
        if self._takes_gpu_at_first_run(ext, kwargs):
            deferred = kwargs["kernel_id"] = kwargs.get("kernel_id") or self.new_kernel_id()
            ext.table.deferrals.add(deferred)  # the provisioner's acquire() takes it
        try:
            kernel_id = await super().start_kernel(**kwargs)
        except GpuAdmissionError as e:  # not pending: the start itself failed
            raise http_error(e) from None
        finally:
            if token is not None:
                _starting_gpu_kernel.reset(token)
            if deferred is not None and deferred not in self:  # failed before it began
                ext.table.deferrals.discard(deferred)
        await self._first_answer(ext, kernel_id)
        return kernel_id

    @staticmethod
    def _takes_gpu_at_first_run(ext: GpuaasExtension, kwargs: dict[str, Any]) -> bool:
        """Whether this start is a notebook's (or a console's), whose kernel asks for its
        GPUs only when its first cell runs (`GpuaasExtension.take_gpu_at_first_run`).

        JupyterLab starts every kernel it opens, reopens or restores through a session
        (`POST api/sessions`), and the session manager alone puts `JPY_SESSION_NAME` in
        the kernel's environment: that is how such a start is told from a program's
        `POST api/kernels`, which asked for a kernel to use now and keeps its GPU request
        (and its immediate 422 when the request can never be admitted). The first run
        reaches the kernel over its websocket, which only the waiting connection class
        (`tell_waiting`) accepts before the kernel starts, and only a pending start
        returns before it: without both, the start takes its GPU at once, as before.
        """
        env = kwargs.get("env") or {}
        return bool(
            ext.take_gpu_at_first_run
            and ext.use_pending_kernels
            and ext.tell_waiting
            and "JPY_SESSION_NAME" in env
        )

    async def _first_answer(self, ext: GpuaasExtension, kernel_id: str) -> None:
        """Wait (up to `submit_wait`) for the gateway's first answer; a refusal is a 422."""
        ready = self.get_kernel(kernel_id).ready
        if not isinstance(ready, asyncio.Future):
            ready = asyncio.wrap_future(ready)
        answered = ext.table.first_answer(kernel_id)
        try:
            await asyncio.wait(
                [answered, ready], timeout=ext.submit_wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ext.table.forget_answer(kernel_id)
        record = ext.table.find(kernel_id)
        refused = record is not None and record.state == "failed"
        failed = ready.done() and not ready.cancelled() and ready.exception() is not None
        if not (refused or failed):
            return  # queued, admitted, or still talking to the gateway: it stays pending
        if not ready.done():  # the provisioner's failure is on its way to `ready`
            await asyncio.wait([ready], timeout=5)
        error = ready.exception() if ready.done() and not ready.cancelled() else None
        await self.shutdown_kernel(kernel_id)  # the failed kernel leaves the map
        reason = record.reason if record is not None else "the GPU kernel failed to start"
        raise http_error(error or RuntimeError(reason))

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> Any:  # type: ignore[override]
        """A GPU kernel still waiting for its GPUs cannot restart: said in a sentence."""
        # Overridden: jupyter_client refuses to restart a pending kernel only while the
        # server's `use_pending_kernels` is on, and then in words about pending states.
        record = self.gpuaas.table.get(kernel_id) if self.gpuaas is not None else None
        if record is not None and record.state == DEFERRED:
            return None  # it has run nothing yet: it already is what a restart makes
        if record is not None and record.waiting:
            raise RuntimeError(
                "the kernel is still waiting for a GPU: it cannot restart before it starts"
            )
        return await super().restart_kernel(kernel_id, now=now)  # type: ignore[no-untyped-call]

    async def shutdown_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False, restart: bool = False
    ) -> Any:
        """Shutting down a waiting GPU kernel cancels its request first."""
        # Overridden: the provisioner waits for admission inside the kernel's start,
        # which jupyter_client awaits before it shuts the kernel down; told first, the
        # provisioner gives up the wait (and cancels the request) at once.
        ext = self.gpuaas
        if ext is not None:
            record = ext.table.get(kernel_id)
            if record is not None and record.waiting:
                record.abort_reason = "kernel shut down while waiting for a GPU"
                record.poke()
            elif record is None and kernel_id in self and self._is_gpu(kernel_id):
                # Its provisioner has not made its record yet: it reads this first.
                ext.table.aborts[kernel_id] = "kernel shut down while waiting for a GPU"
        return await super().shutdown_kernel(  # type: ignore[no-untyped-call]
            kernel_id, now=now, restart=restart
        )

    def interrupt_kernel(self, kernel_id: str) -> Any:
        """Interrupting a waiting GPU kernel gives up its wait (and its request)."""
        # Overridden: jupyter_client refuses to interrupt a pending kernel; a notebook's
        # interrupt button is how a user stops waiting.
        record = self.gpuaas.table.get(kernel_id) if self.gpuaas is not None else None
        if record is not None and record.state == DEFERRED:
            return None  # nothing runs, nothing is asked for: nothing to interrupt
        if record is not None and record.waiting:
            record.abort_reason = "interrupted while waiting for a GPU"
            record.poke()
            return None
        return super().interrupt_kernel(kernel_id)

    def _is_gpu(self, kernel_id: str) -> bool:
        try:
            return is_gpu_spec(self.get_kernel(kernel_id).kernel_spec)
        except Exception:
            return False

    def start_watching_activity(self, kernel_id: str) -> None:
        """jupyter_server's activity watching, minus our widgets' comm traffic."""
        # Overridden: called at each start and restart with a new iopub stream, which
        # our filter (activity.py) must be put in front of again.
        super().start_watching_activity(kernel_id)  # type: ignore[no-untyped-call]
        if self.gpuaas is not None:
            self.gpuaas.activity.own_comms.watch(self.get_kernel(kernel_id))

    async def shutdown_all(self, now: bool = False) -> None:  # type: ignore[override]
        """Shut every kernel down, each on its own; then close the zmq context."""
        # Overridden: jupyter_client also shuts down each id it still lists as starting,
        # and a start that failed stays listed there after its kernel left the map (a
        # GPU kernel the gateway refused): jupyter_server answers that id with a 404
        # that fails the whole shutdown, and with it the server's. And this is the
        # server's shutdown path (ServerApp.cleanup_kernels), where the context closes.
        kernel_ids = self.list_kernel_ids()
        kernels = [self.get_kernel(k) for k in kernel_ids]
        results = await asyncio.gather(
            *(self.shutdown_kernel(k, now=now) for k in kernel_ids), return_exceptions=True
        )
        for kernel_id, result in zip(kernel_ids, results, strict=True):
            if isinstance(result, Exception):
                self.log.warning("Shutting down kernel %s failed: %s", kernel_id, result)
        if self.use_pending_kernels:
            # The server's `use_pending_kernels` is on: a shutdown returned before the
            # kernel was down; its `ready` resolves once it is.
            for km in kernels:
                ready = km.ready
                if not isinstance(ready, asyncio.Future):
                    ready = asyncio.wrap_future(ready)
                try:
                    await ready
                except (Exception, asyncio.CancelledError):  # logged, or cancelled: down
                    pass
        await self._close_websockets()
        self.close_context()

    async def _close_websockets(self) -> None:
        """Close the kernels' websockets before their sockets' context closes.

        The server closes them right after `shutdown_all` (ServerApp._cleanup); closed
        here first, their streams close their own sockets instead of finding them closed.
        """
        connections = getattr(self.parent, "kernel_websocket_connection_class", None)
        close_all = getattr(connections, "close_all", None)
        if close_all is not None:
            try:
                await close_all()
            except Exception as e:
                self.log.debug("gpuaas: closing kernel websockets: %s", e)


def http_error(error: BaseException) -> web.HTTPError:
    """A refused GPU kernel start as the REST call's answer: 422, 403 or 503, in words."""
    status = getattr(error, "status", 0)
    code = 422 if status == 422 else 403 if status == 403 else 503
    message = str(error) or type(error).__name__
    err = web.HTTPError(code, message)
    err.reason = "GPU kernel cannot start"
    return err
