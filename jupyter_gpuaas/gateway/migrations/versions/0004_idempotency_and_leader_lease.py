"""Safe retries and a fenced leader: a submission's Idempotency-Key, and the leader lease.

`requests.idempotency_key`: the `Idempotency-Key` header of `POST api/requests`, unique per
user, so a retried submission finds the request the first one created. NULL (no header)
is never a duplicate: both SQLite and PostgreSQL treat NULLs as distinct in a unique index.

`leader_lease`: one row, the leader election's lease (leader.py): who leads, its epoch
(the fencing token every write transaction checks) and when it last renewed (the
database's clock, so hosts whose clocks differ agree on its age).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("idempotency_key", sa.String(255), nullable=True))
    op.create_index(
        "ux_requests_user_idempotency_key", "requests", ["user", "idempotency_key"], unique=True
    )
    op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("renewed", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_lease")
    op.drop_index("ux_requests_user_idempotency_key", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("idempotency_key")
