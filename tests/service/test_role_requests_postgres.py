"""Role requests and grants on PostgreSQL: tests/unit/test_role_requests.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

SQLITE_ONLY: set[str] = {"test_upgrading_a_ledger_from_0002_to_0003_keeps_its_rows"}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_role_requests": SQLITE_ONLY}
