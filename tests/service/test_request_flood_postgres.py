"""One user's flood of role requests on PostgreSQL: tests/unit/test_request_flood.py
again, each test on a fresh database of the private test server (tests/postgres.py), where
the asks at once come on separate server connections and the per-user advisory lock and
the unique index are PostgreSQL's."""

from __future__ import annotations

import test_request_flood as on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

SQLITE_ONLY: set[str] = set()
collect_again(on_sqlite, globals(), except_for=SQLITE_ONLY)
