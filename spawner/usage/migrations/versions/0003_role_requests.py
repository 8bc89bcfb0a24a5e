"""Requests for a bigger role and their grants: role_requests.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-20 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('role_requests',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('user_name', sa.String(length=255), nullable=False),
    sa.Column('groups', sa.Text(), server_default='', nullable=False),
    sa.Column('role', sa.String(length=255), nullable=False),
    sa.Column('starts', sa.Float(), nullable=False),
    sa.Column('ends', sa.Float(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('asked_at', sa.Float(), nullable=False),
    sa.Column('decided_by', sa.String(length=255), nullable=True),
    sa.Column('decided_at', sa.Float(), nullable=True),
    sa.Column('decision_comment', sa.Text(), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('role_requests', schema=None) as batch_op:
        batch_op.create_index('ix_role_requests_state', ['state', 'ends'], unique=False)
        batch_op.create_index('ix_role_requests_user', ['user_name', 'state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('role_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_role_requests_user')
        batch_op.drop_index('ix_role_requests_state')

    op.drop_table('role_requests')
