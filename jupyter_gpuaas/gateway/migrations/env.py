"""Alembic environment for the gateway's store.

The gateway runs migrations itself at start (`store.upgrade`), handing over an open
connection in `config.attributes["connection"]`: starting the gateway on a store upgrades
it. No alembic.ini is shipped; the `-x url=` branch below serves an ini of one's own.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from jupyter_gpuaas.gateway.store import Base

target_metadata = Base.metadata


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database to migrate: pass -x url=... or set sqlalchemy.url")
    engine = create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


run()
