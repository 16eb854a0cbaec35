"""Test helpers every test directory shares: waiting for a condition, stopping a process.

Imported as `helpers` (tests/ is on sys.path through tests/conftest.py). Per-directory
helpers live in uniquely named modules (gwutil, srvutil, jobutil, hubutil): when several
test directories run together, `from conftest import X` would find whichever conftest
was imported first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30, what: str = "condition", *,
    interval: float = 0.1, detail: Callable[[], str] | None = None,
) -> Any:  # fmt: skip
    """Poll `predicate` until it returns something true (returned) or `timeout` seconds
    pass (AssertionError naming `what`, plus `detail()`: a log tail, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{more}")
        time.sleep(interval)


async def wait_until(
    predicate: Callable[[], Any], timeout: float = 20, what: str = "condition", *,
    interval: float = 0.1,
) -> Any:  # fmt: skip
    """`wait_for` on the event loop: `predicate` may be a plain or an async function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def stop(proc: subprocess.Popen[Any] | None, timeout: float = 10, *, group: bool = False) -> None:
    """SIGTERM `proc` (its whole process group with `group`, for one started with
    start_new_session), wait up to `timeout` seconds, then SIGKILL. Nothing if it ended."""
    if proc is None or proc.poll() is not None:
        return

    def send(sig: signal.Signals) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout)
