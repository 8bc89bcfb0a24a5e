"""One user's flood of role requests on PostgreSQL: tests/unit/test_request_flood.py
again, each test on a fresh database of the private test server (tests/postgres.py), where
the asks at once come on separate server connections and the per-user advisory lock and
the unique index are PostgreSQL's."""

from __future__ import annotations

SQLITE_ONLY: set[str] = set()
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_request_flood": SQLITE_ONLY}
