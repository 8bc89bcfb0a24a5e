"""At most one open request per user and role: uq_role_requests_open, a unique index on
the pending requests' (user_name, role).

Before it, two requests sent at once could both be stored. Where a ledger holds such
duplicates, the oldest stays pending and the later ones become withdrawn, with a comment
that says why, so that the index can be made and the rows stay the grants' record.

Revision ID: 0008
Revises: 0007
Create Date: 2027-03-02 10:00:00.000000
"""

import time

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

requests = sa.table('role_requests', sa.column('id', sa.Integer), sa.column('user_name'),
                    sa.column('role'), sa.column('state'), sa.column('asked_at'),
                    sa.column('decided_at'), sa.column('decision_comment'))
PENDING = sa.text("state = 'pending'")


def upgrade() -> None:
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(requests.c.id, requests.c.user_name, requests.c.role)
        .where(requests.c.state == 'pending')
        .order_by(requests.c.user_name, requests.c.role, requests.c.asked_at, requests.c.id))
    kept: dict[tuple[str, str], int] = {}
    now = time.time()
    for row in rows.all():
        first = kept.setdefault((row.user_name, row.role), row.id)
        if first != row.id:
            connection.execute(
                sa.update(requests).where(requests.c.id == row.id).values(
                    state='withdrawn', decided_at=now,
                    decision_comment=(
                        f"Withdrawn by the ledger's upgrade: a second request for the same "
                        f"role while request {first}, asked for first, was waiting. That "
                        "one stays; a user has one waiting request per role.")))
    op.create_index('uq_role_requests_open', 'role_requests', ['user_name', 'role'],
                    unique=True, sqlite_where=PENDING, postgresql_where=PENDING)


def downgrade() -> None:
    op.drop_index('uq_role_requests_open', table_name='role_requests')
