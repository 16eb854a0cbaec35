"""Fixtures of the fault suite: real gateway processes, a PostgreSQL server of the test's
own (it is frozen), small filesystems, and real signals (SIGSTOP/SIGCONT).

The launchers are tests/gwutil.py's (the same argv, readiness check and calls);
PostgreSQL is tests/pg.py's server. Every frozen process is resumed in teardown, whatever
the test did, so a failing test never leaves a stopped process behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultutil import Freezer
from gwutil import GatewayProcess, launch_gateway
from helpers import tmpfs_mounts


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """`spawn(db_url, *flags)`: a `jupyter-gpuaas gateway` process, ready.

    These tests load one user with hundreds of queued requests, so the per-user queue limit
    (`max_queued_per_user`, tested in test_edge_gateway.py) is off unless a flag sets it."""
    procs: list[GatewayProcess] = []

    def start(db_url: str, *extra: str, **kw: Any) -> GatewayProcess:
        flags = ("--GatewayApp.max_queued_per_user=0", *extra)
        procs.append(launch_gateway(tmp_path, db_url, *flags, **kw))
        return procs[-1]

    yield start
    for gp in procs:
        if gp.proc.poll() is None:
            os.kill(gp.proc.pid, signal.SIGCONT)
        gp.stop()


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    f = Freezer()
    yield f
    f.resume()


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL server of this test alone (it is frozen)."""
    from pg import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    url = server.start()
    server.url_ = url
    yield server
    server.stop()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`tiny_fs("2m")`: a tmpfs of that size (root may mount; skipped where refused)."""
    yield from tmpfs_mounts(tmp_path)
