"""Fixtures of the fault suite: real gateway processes, a PostgreSQL server of the test's
own (it is frozen), small filesystems, and real signals (SIGSTOP/SIGCONT).

The launchers are tests/gateway/gwutil.py's (the same argv, readiness check and calls);
PostgreSQL is tests/pg.py's server. Every frozen process is resumed in teardown, whatever
the test did, so a failing test never leaves a stopped process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

from faultutil import Freezer
from gwutil import GatewayProcess, free_port, gateway_argv, wait_ready


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """`spawn(db_url, *flags)`: a `jupyter-gpuaas gateway` process, ready.

    These tests load one user with hundreds of queued requests, so the per-user queue limit
    (`max_queued_per_user`, tested in test_edge_gateway.py) is off unless a flag sets it."""
    procs: list[GatewayProcess] = []

    def start(db_url: str, *extra: str, **kw: Any) -> GatewayProcess:
        port = free_port()
        log = tmp_path / f"gateway-{len(procs)}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for k in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME"):
            env.pop(k, None)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                gateway_argv(
                    tmp_path, db_url, port, "--GatewayApp.max_queued_per_user=0", *extra, **kw
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
            )
        gp = GatewayProcess(proc, f"http://127.0.0.1:{port}/", log)
        procs.append(gp)
        wait_ready(gp.url, proc, log)
        return gp

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
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tiny{len(mounted)}"
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
