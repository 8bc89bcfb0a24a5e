"""Each session's home: home_size, the size its home started with, and home_peak, the
most the home held in the watchdog's samples.

Both are NULL in the sessions recorded before: their homes had no size, and nobody
read their use. NULL is also what a session of a role without a disk keeps.

Revision ID: 0009
Revises: 0008
Create Date: 2027-03-16 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('sessions', sa.Column('home_size', sa.BigInteger(), nullable=True))
    op.add_column('sessions', sa.Column('home_peak', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), not a batch's copy of the
    # table: dropping the old table would delete session_groups' rows by their cascade
    op.drop_column('sessions', 'home_peak')
    op.drop_column('sessions', 'home_size')
