"""Alembic's environment for the ledger: run on the connection the ledger passes."""

from alembic import context

from spawner.usage.schema import VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata,
                  version_table=VERSION_TABLE, transaction_per_migration=True,
                  render_as_batch=True)  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
