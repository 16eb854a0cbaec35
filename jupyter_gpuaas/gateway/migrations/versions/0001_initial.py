"""Initial schema: requests, decisions, nodes, tenant overrides.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(255), nullable=False, index=True),
        sa.Column("user", sa.String(255), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("flavor", sa.String(255), nullable=True),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("busy", sa.Boolean, nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("queue_time", sa.Float, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("assigned_flavor", sa.String(255), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("devices", sa.Text, nullable=False),
        sa.Column("first_admit", sa.Float, nullable=True),
        sa.Column("admit_time", sa.Float, nullable=True),
        sa.Column("idle_since", sa.Float, nullable=True),
        sa.Column("park_expires", sa.Float, nullable=True),
        sa.Column("lease_expires", sa.Float, nullable=True),
        sa.Column("wants_devices", sa.Boolean, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("culls", sa.Integer, nullable=False),
        sa.Column("utilization", sa.Float, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "decisions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True, index=True),
        sa.Column("fields", sa.Text, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("flavor", sa.String(255), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("autoscaled", sa.Boolean, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "tenant_overrides",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("tenant_overrides", "nodes", "decisions", "requests"):
        op.drop_table(table)
