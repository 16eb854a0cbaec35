"""A waiting GPU kernel tells the notebook where it stands, over the kernel's websocket.

jupyter_server holds a kernel's websocket handshake until a pending kernel is ready
(`ZMQChannelsWebsocketConnection.prepare` awaits `kernel_manager.ready`), so while a GPU
kernel waits in the gateway's queue JupyterLab can only say "Connecting". This connection
class accepts the websocket of a *waiting GPU kernel* at once instead, and until the
kernel starts:

- sends an iopub `status` of `starting`, so JupyterLab shows the kernel starting, not lost;
- for a *deferred* kernel (a notebook's, which asks for its GPUs at its first run:
  kernel_manager.py), sends `idle` instead, and the first `execute_request` is the run
  that makes it ask (`GpuKernel.run`), then `starting`;
- holds every message the notebook sends, in order, and hands them to the kernel once it
  runs (so a cell run while waiting runs on the GPUs, with its outputs in its cell);
- answers each `execute_request` it holds with a `display_data` in that cell, "waiting
  for 1 a100 (position 2 in vision) …", and updates it in place (`update_display_data`,
  one display id per kernel) whenever the gateway moves the request; the display is
  cleared just before the held requests reach the kernel;
- if the kernel never starts (shut down while waiting, refused), says why in those cells
  and closes the websocket.

None of these messages pass through the kernel's ZMQ channels, so jupyter_server's
activity tracking (`execution_state`, `last_activity`) and with it culling and the Hub's
activity see a waiting kernel as what it is: starting, not busy. Kernels that are not
waiting GPU kernels get jupyter_server's own behaviour unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from .kernels import DEFERRED, GpuKernel, gpu_words, table_of

V1 = "v1.kernel.websocket.jupyter.org"
#: Seconds between looks at a waiting kernel's record when no change wakes us sooner.
RECHECK = 5.0


class WaitingGpuKernelConnection(ZMQChannelsWebsocketConnection):
    """jupyter_server's kernel websocket connection, plus the waiting of GPU kernels."""

    _phase = "normal"  # normal | waiting | joining | connected | closed
    _task: asyncio.Task[None] | None = None
    _held: list[Any]
    _parents: list[dict[str, Any]]
    _text = ""
    _display_id = ""
    _record: GpuKernel | None = None  # the kernel's GPU record, once the provisioner made it

    # ------------------------------------------------------------------ lifecycle

    def _live_record(self) -> GpuKernel | None:
        table = table_of(self.kernel_manager)
        return None if table is None else table.get(self.kernel_id)

    def _waiting_gpu_kernel(self) -> bool:
        # A live record that waits: a kernel being shut down or restarted also has a
        # pending `ready`, but its record has ended (or it holds its grant). A deferred
        # kernel whose provisioner has not made its record yet waits too (its websocket
        # held by jupyter_server, it would never see the run that starts it).
        record = self._live_record()
        table = table_of(self.kernel_manager)
        marked = table is not None and self.kernel_id in table.deferrals
        ready = getattr(self.kernel_manager, "ready", None)
        waits = marked or (record is not None and record.waiting)
        return waits and ready is not None and not ready.done()

    async def prepare(self) -> None:
        if not self._waiting_gpu_kernel():
            await super().prepare()  # type: ignore[no-untyped-call]  # jupyter_server: unannotated
            return
        self._phase = "waiting"
        self._held = []
        self._parents = []
        self._display_id = f"gpuaas-wait-{self.kernel_id}"
        self._text = self._first_text()

    # jupyter_server's ZMQChannelsWebsocketConnection makes the base's coroutines plain
    # methods (connect answers a Future or None): these keep its signatures.
    def connect(self) -> asyncio.Future[None] | None:  # type: ignore[override]
        if self._phase != "waiting":
            return super().connect()
        # Counted as a connection while it waits (culling of connected kernels, the
        # kernel model's `connections`); handed over to the real connect below.
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        ZMQChannelsWebsocketConnection._open_sockets.add(self)
        self._task = asyncio.ensure_future(self._wait_then_connect())
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def disconnect(self) -> None:  # type: ignore[override]
        was_waiting = self._phase == "waiting"
        self._phase = "closed"
        if self._task is not None and not self._task.done():
            self._task.cancel()
        super().disconnect()  # type: ignore[no-untyped-call]  # jupyter_server: unannotated
        if was_waiting and self.kernel_id in self.multi_kernel_manager:
            # The base class keeps the channels of a last connection for a reconnect; a
            # waiting connection has none, and an empty buffer would break that reconnect.
            self.multi_kernel_manager.stop_buffering(self.kernel_id)

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._phase in ("waiting", "joining"):  # joining: held ones go first, in order
            self._held.append(incoming_msg)
            if self._phase != "waiting":
                return
            header = self._header_of(incoming_msg)
            if header is not None and header.get("msg_type") == "execute_request":
                self._parents.append(header)
                self._run_deferred()
                self._send("display_data", self._display_content(), header)
            return
        super().handle_incoming_message(incoming_msg)

    async def _wait_then_connect(self) -> None:
        try:
            await self._wait_then_connect_inner()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never an unobserved task error: say it and close
            self.log.exception("gpuaas: connecting the waiting kernel %s", self.kernel_id)
            self._fail(f"the kernel connection failed: {e}")

    async def _wait_then_connect_inner(self) -> None:
        km = self.kernel_manager
        ready = km.ready
        if not isinstance(ready, asyncio.Future):
            ready = asyncio.wrap_future(ready)
        telling = asyncio.ensure_future(self._tell_while_waiting())
        try:
            await asyncio.wait([ready])  # never cancels `ready` when we are cancelled
        finally:
            telling.cancel()
        if ready.cancelled() or ready.exception() is not None:
            # The record knows why (jupyter_server cancels the start of a kernel shut
            # down while pending, which loses the provisioner's reason).
            record = self._live_record() or self._record
            error = ready.exception() if not ready.cancelled() else None
            known = (record.reason or record.abort_reason) if record is not None else ""
            reason = known or str(error or "")
            self._fail(reason or "the kernel start was cancelled")
            return
        for parent in self._parents:  # the wait is over: the cells show the kernel's own
            self._send("clear_output", {"wait": False}, parent)
        try:
            await super().prepare()  # type: ignore[no-untyped-call]  # ready now: registers the session, asks kernel_info
        except Exception as e:
            self._fail(f"the kernel started but did not answer: {e}")
            return
        if self._phase != "waiting":
            return
        self.multi_kernel_manager.notify_disconnect(self.kernel_id)  # connect() counts it
        self._phase = "joining"
        connected = super().connect()
        if connected is None:
            return
        await connected
        while self._held and self._phase == "joining":
            super().handle_incoming_message(self._held.pop(0))
        if self._phase == "joining":
            self._phase = "connected"

    def _run_deferred(self) -> None:
        """A cell was run: a deferred kernel (a notebook's, before its first run) goes on
        to ask for its GPUs now. Nothing else the notebook sends (kernel_info, comm_info,
        a widget's comm) wakes it: opening or reloading a page is no run."""
        record = self._live_record()
        if record is not None and self._parents and record.run():
            self._text = record.sentence()
            self._send("status", {"execution_state": "starting"}, {})

    def _fail(self, reason: str) -> None:
        text = f"The GPU kernel did not start: {reason}\n"
        for parent in self._parents:
            self._send("clear_output", {"wait": False}, parent)
            self._send("stream", {"name": "stderr", "text": text}, parent)
        self._send("status", {"execution_state": "dead"}, {})
        self._held = []
        try:
            self.websocket_handler.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ telling

    async def _tell_while_waiting(self) -> None:
        # A deferred kernel reads as idle: it is ready to take a cell, which starts it.
        record = self._live_record()
        state = "idle" if record is not None and record.state == DEFERRED else "starting"
        self._send("status", {"execution_state": state}, {})
        watched = None
        event = None
        try:
            while True:
                record = self._live_record()
                if record is not None and record is not watched:
                    if watched is not None and event is not None:
                        watched.unwatch(event)
                    watched, event = record, record.watch()
                    self._record = record
                    self._run_deferred()  # a cell run before the record was made
                if event is not None:
                    event.clear()
                text = record.sentence() if record is not None else self._first_text()
                if text != self._text:
                    self._text = text
                    for parent in self._parents:
                        self._send("update_display_data", self._display_content(), parent)
                if event is None:
                    await asyncio.sleep(0.2)  # the provisioner has not made its record yet
                    continue
                try:
                    await asyncio.wait_for(event.wait(), RECHECK)
                except asyncio.TimeoutError:
                    pass
        finally:
            if watched is not None and event is not None:
                watched.unwatch(event)

    def _first_text(self) -> str:
        try:
            meta = self.kernel_manager.kernel_spec.metadata.get("kernel_provisioner") or {}
            config = meta.get("config") or {}
            what = gpu_words(int(config.get("gpus") or 1), config.get("flavor"))
        except Exception:
            what = "a GPU"
        return f"asking the GPU gateway for {what} …"

    def _display_content(self) -> dict[str, Any]:
        return {
            "data": {"text/plain": self._text},
            "metadata": {},
            "transient": {"display_id": self._display_id},
        }

    # ------------------------------------------------------------------ wire

    def _header_of(self, ws_msg: Any) -> dict[str, Any] | None:
        try:
            if self.subprotocol == V1:
                channel, parts = deserialize_msg_from_ws_v1(ws_msg)
                header = self.session.unpack(parts[0]) if channel == "shell" else None
            else:
                msg = (
                    deserialize_binary_message(ws_msg)
                    if isinstance(ws_msg, bytes)
                    else json.loads(ws_msg)
                )
                header = msg.get("header") if msg.get("channel", "shell") == "shell" else None
        except Exception:
            return None
        return header if isinstance(header, dict) else None

    def _send(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        """An iopub message of our own to this websocket only (never to the kernel)."""
        msg = _SESSION.msg(msg_type, content, parent=parent)
        msg["buffers"] = []
        try:
            if self.subprotocol == V1:
                data = serialize_msg_to_ws_v1(msg, "iopub", pack=self.session.pack)
                self.websocket_handler.write_message(data, binary=True)
            else:
                msg["channel"] = "iopub"
                self.websocket_handler.write_message(json.dumps(msg, default=json_default))
        except Exception as e:  # closed meanwhile: disconnect() follows
            self.log.debug("gpuaas: waiting message not sent: %s", e)


# The sender of the waiting messages: a session of its own, so nobody mistakes them for
# the kernel's (JupyterLab reads the kernel's session from its replies).
_SESSION = Session(username="gpuaas", session="gpuaas-waiting")


def waiting_connection_class(base: Any) -> type[Any] | None:
    """The connection class to use instead of `base` (None: leave `base` alone)."""
    if base is ZMQChannelsWebsocketConnection:
        return WaitingGpuKernelConnection
    if isinstance(base, type) and issubclass(base, ZMQChannelsWebsocketConnection):
        return type(f"WaitingGpu{base.__name__}", (WaitingGpuKernelConnection, base), {})
    return None  # e.g. a gateway's websocket: its kernels are not ours


def one_session_per_path(sm: Any) -> None:
    """Concurrent session starts for one notebook make one session, not two kernels.

    JupyterLab may ask for a notebook's session twice at once; jupyter_server answers the
    second with the first only if the first already exists. Starting a GPU kernel waits
    for the gateway's first answer, long enough for both to start kernels, one of which
    JupyterLab then shuts down: a GPU request queued and cancelled for nothing. So a
    `session_exists(path)` waits for a creation of that path in flight.
    """
    creating: dict[str, asyncio.Future[None]] = {}
    orig_exists = sm.session_exists
    orig_create = sm.create_session

    async def session_exists(path: str) -> bool:
        pending = creating.get(path)
        if pending is not None:
            await asyncio.wait([pending])
        return bool(await orig_exists(path=path))

    async def create_session(*args: Any, path: str | None = None, **kwargs: Any) -> Any:
        if path is None:
            return await orig_create(*args, path=path, **kwargs)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        creating[path] = done
        try:
            return await orig_create(*args, path=path, **kwargs)
        finally:
            done.set_result(None)
            if creating.get(path) is done:
                del creating[path]

    sm.session_exists = session_exists
    sm.create_session = create_session
