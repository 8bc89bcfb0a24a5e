"""The shared state documents: state_documents (GPU holders, each watchdog's readings,
preemptions in their grace, budget warnings told).

Revision ID: 0006
Revises: 0005
Create Date: 2027-02-15 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('state_documents',
    sa.Column('hub', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('hub', 'kind', 'node')
    )


def downgrade() -> None:
    op.drop_table('state_documents')
