"""Role requests and grants on PostgreSQL: tests/unit/test_role_requests.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

import test_role_requests as on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

SQLITE_ONLY: set[str] = {"test_upgrading_a_ledger_from_0002_to_0003_keeps_its_rows"}
collect_again(on_sqlite, globals(), except_for=SQLITE_ONLY)
