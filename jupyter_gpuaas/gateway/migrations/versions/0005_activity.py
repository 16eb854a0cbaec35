"""Holders' busy/idle transitions and peak utilization: a gateway's history, replayable.

`jupyter-gpuaas history export` turns the transitions into each request's `busy`
intervals; only changes are written (a heartbeat that repeats the last state writes
nothing here). `peak_utilization`, the highest a grant's heartbeats reported, is the
evidence `jupyter-gpuaas advise` gives for a smaller GPU.

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
    op.add_column("requests", sa.Column("peak_utilization", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("peak_utilization")
    op.drop_index("ix_activity_request_id", table_name="activity")
    op.drop_table("activity")
