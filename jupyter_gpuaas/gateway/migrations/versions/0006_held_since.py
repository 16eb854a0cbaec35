"""When each grant's current hold of quota began: the wait estimates' age of a grant.

A hold is one stretch of quota kept (admission/estimate.py `History`): it begins at an
admission, and a resume from a parked reservation, or a new request that takes the
reservation over, goes on with it. Without this column the start was guessed from the
request's own admissions, so a claim of a parked reservation began a hold of its own
(its user's session cut in two samples, both too short). Rows from before keep NULL
and the old guess (`hold_start`).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("held_since", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("held_since")
