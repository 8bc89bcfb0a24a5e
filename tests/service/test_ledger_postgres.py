"""The usage ledger on PostgreSQL: every test of tests/unit/test_usage_ledger.py that is
not about SQLite itself runs again here, against a fresh database of the private test
server (tests/postgres.py); then what only a server shows: the migrations build the
same schema as the metadata, and writers in several processes at once lose nothing."""

from __future__ import annotations

import logging
import multiprocessing

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from spawner.usage.ledger import (
    Ledger,
    Sample,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
)
from spawner.usage.schema import VERSION_TABLE, metadata, sessions

LOG = logging.getLogger("test-ledger-postgres")
# about the SQLite file itself (its pragmas, its tables, a file not made yet)
SQLITE_ONLY = {
    "test_the_migrations_from_empty_build_exactly_the_schema",
    "test_a_ledger_not_created_yet_is_not_ready_and_says_how_to_create_it",
    "test_the_ledger_is_created_beside_jupyterhubs_own_alembic_version",
    "test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout",
}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_usage_ledger": SQLITE_ONLY}


def test_the_migrations_build_exactly_the_schema_on_postgresql(url):
    engine = make_engine(url)
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "head")
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={
            "version_table": VERSION_TABLE, "compare_type": True})
        assert compare_metadata(context, metadata) == []
        assert current_revision(connection) == head_revision()
    tables = set(inspect(engine).get_table_names())
    assert tables == {"sessions", "session_groups", "table_versions", "role_requests",
                      "prewarm_schedules", "events", "state_documents", "event_claims",
                      VERSION_TABLE}
    engine.dispose()


def _write(url: str, worker: int, count: int) -> None:
    """One process's writes: ``count`` sessions opened, sampled and closed."""
    ledger = Ledger(url, LOG)  # every writer creates-or-upgrades, as hub and service do
    for i in range(count):
        user = f"w{worker}-{i}"
        ledger.open(hub="hub-a", user=user, container=f"jupyter-{user}", role="gpu",
                    image="torch", cpu_limit=1.0, mem_limit=2**30, groups=("lab",),
                    requested=100.0 + i)
        ledger.started("hub-a", f"jupyter-{user}", f"id-{user}", when=100.5 + i)
        ledger.ready("hub-a", f"jupyter-{user}", when=100.6 + i)
        ledger.fold([Sample(hub="hub-a", container=f"jupyter-{user}", time=101.0 + i,
                            cpu=0.5, memory=2**20)])
        ledger.close("hub-a", f"jupyter-{user}", "stopped", when=102.0 + i)
    ledger.dispose()


def test_writers_in_four_processes_at_once_lose_nothing(url):
    """The hub, the usage service and two watchdogs write the same ledger at once."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_write, args=(url, w, 25)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    found = Ledger(url, LOG, create=False)
    with found.engine.connect() as connection:
        rows = connection.execute(select(sessions.c.user_name, sessions.c.reason,
                                         sessions.c.cpu_samples)).all()
    found.dispose()
    assert len(rows) == 100
    assert {r.reason for r in rows} == {"stopped"} and {r.cpu_samples for r in rows} == {1}
