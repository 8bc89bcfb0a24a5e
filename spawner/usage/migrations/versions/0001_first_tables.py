"""The ledger's first tables: sessions and their groups.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 23:08:23.304269
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('sessions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('hub', sa.String(length=64), server_default='', nullable=False),
    sa.Column('user_name', sa.String(length=255), nullable=False),
    sa.Column('server_name', sa.String(length=255), server_default='', nullable=False),
    sa.Column('container', sa.String(length=255), nullable=False),
    sa.Column('container_id', sa.String(length=64), nullable=True),
    sa.Column('role', sa.String(length=255), nullable=False),
    sa.Column('image', sa.String(length=255), server_default='', nullable=False),
    sa.Column('gpus', sa.Text(), server_default='', nullable=False),
    sa.Column('gpu_count', sa.Integer(), server_default='0', nullable=False),
    sa.Column('gpu_mode', sa.String(length=32), server_default='', nullable=False),
    sa.Column('gpu_reserved', sa.Float(), server_default='0', nullable=False),
    sa.Column('cpu_limit', sa.Float(), nullable=False),
    sa.Column('mem_limit', sa.BigInteger(), nullable=False),
    sa.Column('gpu_mem_limit', sa.BigInteger(), nullable=True),
    sa.Column('requested', sa.Float(), nullable=False),
    sa.Column('started', sa.Float(), nullable=True),
    sa.Column('ready', sa.Float(), nullable=True),
    sa.Column('stopped', sa.Float(), nullable=True),
    sa.Column('reason', sa.String(length=32), nullable=True),
    sa.Column('hint', sa.String(length=32), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('last_seen', sa.Float(), nullable=True),
    sa.Column('cpu_samples', sa.Integer(), server_default='0', nullable=False),
    sa.Column('cpu_sum', sa.Float(), server_default='0', nullable=False),
    sa.Column('cpu_peak', sa.Float(), nullable=True),
    sa.Column('mem_samples', sa.Integer(), server_default='0', nullable=False),
    sa.Column('mem_sum', sa.Float(), server_default='0', nullable=False),
    sa.Column('mem_peak', sa.BigInteger(), nullable=True),
    sa.Column('gpu_samples', sa.Integer(), server_default='0', nullable=False),
    sa.Column('gpu_util_sum', sa.Float(), server_default='0', nullable=False),
    sa.Column('gpu_util_peak', sa.Float(), nullable=True),
    sa.Column('gpu_mem_sum', sa.Float(), server_default='0', nullable=False),
    sa.Column('gpu_mem_peak', sa.BigInteger(), nullable=True),
    sa.Column('oom_kills', sa.Integer(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index('ix_sessions_container', ['hub', 'container', 'stopped'],
                              unique=False)
        batch_op.create_index('ix_sessions_started', ['started'], unique=False)
        batch_op.create_index('ix_sessions_stopped', ['stopped'], unique=False)
        batch_op.create_index('ix_sessions_user_started', ['user_name', 'started'], unique=False)

    op.create_table('session_groups',
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('group_name', sa.String(length=255), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('session_id', 'group_name')
    )
    with op.batch_alter_table('session_groups', schema=None) as batch_op:
        batch_op.create_index('ix_session_groups_group', ['group_name'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('session_groups', schema=None) as batch_op:
        batch_op.drop_index('ix_session_groups_group')

    op.drop_table('session_groups')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index('ix_sessions_user_started')
        batch_op.drop_index('ix_sessions_stopped')
        batch_op.drop_index('ix_sessions_started')
        batch_op.drop_index('ix_sessions_container')

    op.drop_table('sessions')

