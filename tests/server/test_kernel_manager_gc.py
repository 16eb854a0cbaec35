"""A kernel manager dropped with a live socket cannot hang a garbage collection.

`make test` once hung for good in a request handler of tests/server: a collection freed a
server app left over from an earlier test, and jupyter_client's kernel manager finalizer
terminated its zmq context (`MultiKernelManager.__del__` → `Context.destroy` → `term`).
The collector had already cleared the context's weak set of sockets, so `destroy` closed
none of the sockets still open and `term` waited for them forever.

Each case runs in a child process of its own, since the failure is a hang: the child makes
a kernel manager of the given class, opens a socket on its context, ties both into a
reference cycle (as a server app's kernel manager is tied to its parent), drops them and
collects. jupyter_client's own class hangs there, which shows the check can fail;
`GpuaasKernelManager` collects, and the next kernel manager made closes the orphaned
context.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from jupyter_gpuaas.server.kernel_manager import GpuaasKernelManager

# Each case is a child process that waits for a hang it may not see (seconds).
pytestmark = pytest.mark.slow

CHILD = r"""
import gc, importlib, sys
import zmq
module, name = sys.argv[1].rsplit(".", 1)
cls = getattr(importlib.import_module(module), name)
gc.disable()  # only the explicit collection below frees the cycle
mkm = cls()
sock = mkm.context.socket(zmq.PUSH)  # live on the manager's context
context = mkm.context
box = [mkm, sock]
mkm.box = box  # manager -> box -> manager: a cycle, like manager -> server app -> manager
del mkm, sock, box
print("collecting", flush=True)
gc.collect()
print("collected", flush=True)
if "--then-another" in sys.argv:
    cls()  # a safe point: the next manager closes the orphaned context
    print("context closed" if context.closed else "context open", flush=True)
"""

OURS = f"{GpuaasKernelManager.__module__}.{GpuaasKernelManager.__qualname__}"
STOCK = "jupyter_client.multikernelmanager.MultiKernelManager"


class Child:
    """The child process, its output lines as they come."""

    def __init__(self, *argv: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<eof>")
            self._changed.notify_all()

    def said(self, line: str, within: float) -> bool:
        """Whether the child printed `line` within `within` seconds (False at its exit)."""
        deadline = time.monotonic() + within
        with self._changed:
            while line not in self.lines:
                left = deadline - time.monotonic()
                if "<eof>" in self.lines or left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def child() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        c.stop()


def test_jupyter_clients_own_kernel_manager_hangs_the_collection(child: list[Child]) -> None:
    """The control: the same steps with jupyter_client's class never get past gc.collect()
    (its finalizer waits in Context.term); given 15 s, it is stuck for good."""
    stock = Child(STOCK)
    child.append(stock)
    assert stock.said("collecting", 60), stock.lines
    assert not stock.said("collected", 15), stock.lines
    assert stock.proc.poll() is None  # still there, blocked


def test_our_kernel_manager_is_collected_and_its_context_closed_after(
    child: list[Child],
) -> None:
    ours = Child(OURS, "--then-another")
    child.append(ours)
    assert ours.said("collecting", 60), ours.lines
    assert ours.said("collected", 60), ours.lines
    assert ours.said("context closed", 60), ours.lines
    assert ours.proc.wait(60) == 0, ours.lines
