"""The quota table's audit trail on PostgreSQL: tests/unit/test_table_edit.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

import test_table_edit as on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

SQLITE_ONLY: set[str] = {"test_upgrading_a_ledger_from_0001_to_0002_keeps_its_sessions"}
collect_again(on_sqlite, globals(), except_for=SQLITE_ONLY)
