"""Preemption with grace: a warned victim's eviction deadline and its preemptor.

Both are kept on the victim's row, so a gateway restarted (even after `kill -9`) within a
grace period evicts at the deadline it announced, and the preemptor keeps waiting for it.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("preempt_at", sa.Float, nullable=True))
    op.add_column("requests", sa.Column("preempted_by", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("preempted_by")
        batch.drop_column("preempt_at")
