"""Fixtures of the gateway tests: real gateways on real sockets, real HTTP.

`make_gateway` starts the gateway in-process (tornado on a loopback port, the same app the
CLI runs) with simulated devices, a temp quota file and token file; `spawn_gateway` starts
`jupyter-gpuaas gateway` as a subprocess (restart and kill -9 tests); both through
tests/gwutil.py, the one launcher of every test directory. `db_url` is
parametrized over SQLite and PostgreSQL (a fresh database per test on the session server
of tests/pg.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from gwutil import (
    Gateway,
    GatewayProcess,
    fresh_pg_database,
    launch_gateway,
    start_gateway_app,
)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    return fresh_pg_database(request.getfixturevalue("postgres_url"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"


@pytest_asyncio.fixture
async def make_gateway(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[Any] = []

    async def make(
        db_url: str | None = None, quotas: dict[str, Any] | None = None, **traits: Any
    ) -> Gateway:
        app = await start_gateway_app(tmp_path, db_url, quotas=quotas, **traits)
        started.append(app)
        return Gateway(app, app.url)

    yield make
    for app in started:
        await app.stop_server()


@pytest_asyncio.fixture
async def gw(make_gateway: Callable[..., Any], sqlite_url: str) -> Gateway:
    gateway: Gateway = await make_gateway(sqlite_url)
    return gateway


# --- subprocess gateways -----------------------------------------------------------------


@pytest.fixture
def spawn_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    procs: list[GatewayProcess] = []

    def spawn(db_url: str, *extra: str, port: int | None = None, **kw: Any) -> GatewayProcess:
        procs.append(launch_gateway(tmp_path, db_url, *extra, port=port, **kw))
        return procs[-1]

    yield spawn
    for gp in procs:
        gp.stop()
