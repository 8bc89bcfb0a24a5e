"""The hub's event log in the ledger's database, on PostgreSQL: tests/unit/
test_event_store.py again, each test on a fresh database of the private test server
(tests/postgres.py); there, appends are serialised by an advisory lock, so a reader
never passes over an event that commits late."""

from __future__ import annotations

SQLITE_ONLY = {"test_a_ledger_of_0004_is_upgraded_and_keeps_its_sessions"}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_event_store": SQLITE_ONLY}
