"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real, empty PostgreSQL database for this test session (see tests/pg.py).

    Skips (with the reason) where the PostgreSQL binaries are missing;
    `scripts/ensure-system-deps.sh` installs them on Debian.
    """
    import os

    try:
        from pg import PostgresServer, PostgresUnavailable
    except ImportError:  # tests/ became a package
        from tests.pg import PostgresServer, PostgresUnavailable

    external = os.environ.get("GPUAAS_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    try:
        yield server.start()
    finally:
        server.stop()
