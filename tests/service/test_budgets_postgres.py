"""GPU-hour budgets on PostgreSQL: tests/unit/test_budgets.py again, each test on a
fresh database of the private test server (tests/postgres.py), but for the tests about
SQLite files."""

from __future__ import annotations

SQLITE_ONLY: set[str] = set()
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_budgets": SQLITE_ONLY}
