"""The hub's event log as a table: events.

Revision ID: 0005
Revises: 0004
Create Date: 2027-02-01 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('hub', sa.String(length=64), server_default='', nullable=False),
    sa.Column('event', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_hub', ['hub', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_hub')

    op.drop_table('events')
