"""Test helpers every test directory shares: a free port, waiting for a condition or for
a process to answer HTTP, stopping a process, a full disk, and the browser.

Imported as `helpers` (tests/ is on sys.path through tests/conftest.py). Beside it, shared
the same way: tests/gwutil.py, the one way every directory starts a gateway (a process or
in-process), and tests/hubutil.py, the real JupyterHub every Hub test runs. Per-directory
helpers live in uniquely named modules (srvutil, jobutil, kubeutil): when several test
directories run together, `from conftest import X` would find whichever conftest was
imported first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port free on the loopback address now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def wait_http(
    url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 30, *,
    headers: dict[str, str] | None = None, interval: float = 0.1,
    context: ssl.SSLContext | None = None,
) -> None:  # fmt: skip
    """Wait until `proc`, which writes to `log`, answers a GET of `url` with a 2xx.

    RuntimeError with the log's tail when it exits first; when `timeout` seconds pass it is
    stopped (nothing left running behind a failed start) and the same error says so.
    `context`: the TLS context of an https `url`."""

    def tail() -> str:
        try:
            return log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited {proc.returncode}: {tail()}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=1, context=context):
                return
        except OSError:
            if time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"{url} did not answer in {timeout} s: {tail()}") from None
            time.sleep(interval)


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


def tmpfs_mounts(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """The body of a fixture: `mount("2m")` mounts a tmpfs of that size under `tmp_path`
    (root only; the test is skipped, saying why, where mounting is refused); every mount is
    undone after the test. A full disk on cue, which no real disk here gives."""
    import pytest

    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path, name: str = "filler") -> Path:
    """Take every byte still free on `where`'s filesystem; the file is returned (delete it
    to free the space again)."""
    path = where / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return path


#: Debian's Chromium (scripts/ensure-system-deps.sh): Playwright's own browser download
#: cannot run on these machines. The flags keep it off the network it cannot reach.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright browser on Debian's Chromium, closed at the end; the test is skipped,
    saying why, where Chromium or Playwright is missing."""
    import pytest

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no /usr/bin/chromium: scripts/ensure-system-deps.sh installs it")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.asynccontextmanager
async def async_chromium() -> AsyncIterator[Any]:
    """`chromium()` for an asyncio test (Playwright's async API, on the test's own event
    loop, where the sync API cannot run): a browser on Debian's Chromium, closed at the
    end; skipped, saying why, where Chromium or Playwright is missing."""
    import pytest

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no /usr/bin/chromium: scripts/ensure-system-deps.sh installs it")
    async_api = pytest.importorskip("playwright.async_api")
    async with async_api.async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()


def new_page(
    browser: Any, width: int = 1280, height: int = 900, timeout_ms: int = 60_000,
    **context: Any,
) -> Any:  # fmt: skip
    """A page in a new context (its own cookies: one person) of `browser`, `width`×`height`,
    whose waits give up after `timeout_ms`; `context`: more of Playwright's new_context
    options (extra_http_headers, say). The `browser` fixture closes it after the test."""
    page = browser.new_context(viewport={"width": width, "height": height}, **context).new_page()
    page.set_default_timeout(timeout_ms)
    return page


@contextlib.contextmanager
def browser_page(width: int = 1280, height: int = 900, timeout_ms: int = 60_000) -> Iterator[Any]:
    """One page of a fresh `chromium()` browser, `width`×`height`, whose waits give up
    after `timeout_ms` (outside pytest; tests take the `browser` fixture's `new_page`)."""
    with chromium() as browser:
        yield new_page(browser, width, height, timeout_ms)


def notebook(source: str, kernel: str = "python3-gpu", display: str = "Python 3 (1 GPU)") -> str:
    """A notebook of one code cell on the kernelspec `kernel` (by default the demo's GPU
    kernelspec), as JupyterLab writes one."""
    return json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": "c0",
                    "metadata": {},
                    "outputs": [],
                    "source": source,
                }
            ],
            "metadata": {
                "kernelspec": {"name": kernel, "display_name": display, "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        },
        indent=1,
    )


#: JupyterLab's own commands, run in the page: open the notebook at `p` and run its
#: selected cell (as Shift+Enter does). `page.evaluate(RUN_CELL, path)`.
RUN_CELL = """async (p) => {
     const app = window.jupyterapp;
     await app.commands.execute('docmanager:open', {path: p});
     await app.shell.currentWidget.context.ready;
     await app.commands.execute('notebook:run-cell');
   }"""
