"""History indexes: a user's list by (user, created), the decision log by time.

`GET api/requests` of a user without view is `WHERE user = ? ORDER BY created DESC`:
with only an index on `user` it sorts every row of that user's history. The (user,
created) index answers it, and its keyset pages, in index order; it replaces the index
on `user` alone. `decisions.t` serves the retention pruning (`Store.prune`).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_requests_user_created", "requests", ["user", "created"])
    op.drop_index("ix_requests_user", table_name="requests")
    op.create_index("ix_decisions_t", "decisions", ["t"])


def downgrade() -> None:
    op.drop_index("ix_decisions_t", table_name="decisions")
    op.create_index("ix_requests_user", "requests", ["user"])
    op.drop_index("ix_requests_user_created", table_name="requests")
