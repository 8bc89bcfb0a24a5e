"""The quota table's audit trail on PostgreSQL: tests/unit/test_table_edit.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

SQLITE_ONLY: set[str] = {"test_upgrading_a_ledger_from_0001_to_0002_keeps_its_sessions"}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_table_edit": SQLITE_ONLY}
