"""The sessions the hub records on PostgreSQL: tests/unit/test_usage_sessions.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

import test_usage_sessions as on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

SQLITE_ONLY: set[str] = set()
collect_again(on_sqlite, globals(), except_for=SQLITE_ONLY)
