"""Holders' busy/idle transitions, so a gateway's history can be replayed with its idleness.

`jupyter-gpuaas history export` turns them into each request's `busy` intervals; only
changes are written (a heartbeat that repeats the last state writes nothing here).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "activity",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("busy", sa.Boolean, nullable=False),
        sa.Column("utilization", sa.Float, nullable=True),
    )
    op.create_index("ix_activity_request_id", "activity", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_activity_request_id", table_name="activity")
    op.drop_table("activity")
