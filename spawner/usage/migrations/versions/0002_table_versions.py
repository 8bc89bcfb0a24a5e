"""The quota table's audit trail: table_versions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-14 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('table_versions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('who', sa.String(length=255), nullable=False),
    sa.Column('comment', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('diff', sa.Text(), server_default='', nullable=False),
    sa.Column('restored_from', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['restored_from'], ['table_versions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('table_versions', schema=None) as batch_op:
        batch_op.create_index('ix_table_versions_path', ['path', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('table_versions', schema=None) as batch_op:
        batch_op.drop_index('ix_table_versions_path')

    op.drop_table('table_versions')
