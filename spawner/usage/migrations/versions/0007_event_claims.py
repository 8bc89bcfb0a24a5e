"""Which watchdog tells each event: event_claims.

Revision ID: 0007
Revises: 0006
Create Date: 2027-02-16 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('event_claims',
    sa.Column('event_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('event_id')
    )


def downgrade() -> None:
    op.drop_table('event_claims')
