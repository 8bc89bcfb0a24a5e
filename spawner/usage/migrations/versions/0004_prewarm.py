"""Scheduled class pre-warms: prewarm_schedules.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-05 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('prewarm_schedules',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('group_name', sa.String(length=255), nullable=False),
    sa.Column('role', sa.String(length=255), nullable=False),
    sa.Column('image', sa.String(length=255), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('created_by', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('result', sa.Text(), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('prewarm_schedules', schema=None) as batch_op:
        batch_op.create_index('ix_prewarm_schedules_group', ['group_name', 'at'], unique=False)
        batch_op.create_index('ix_prewarm_schedules_state', ['state', 'at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('prewarm_schedules', schema=None) as batch_op:
        batch_op.drop_index('ix_prewarm_schedules_state')
        batch_op.drop_index('ix_prewarm_schedules_group')

    op.drop_table('prewarm_schedules')
