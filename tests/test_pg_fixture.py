"""The postgres_url fixture gives a working, real PostgreSQL database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa


@pytest.mark.postgres
def test_postgres_fixture_connects(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("select 1")).scalar() == 1
            version = conn.execute(sa.text("show server_version")).scalar()
            assert version is not None and int(str(version).split(".")[0]) >= 13
            assert conn.execute(sa.text("select current_database()")).scalar() == "gpuaas_test"
    finally:
        engine.dispose()
