"""The processes' shared documents on PostgreSQL: tests/unit/test_state_docs.py again,
each test on a fresh database of the private test server (tests/postgres.py)."""

from __future__ import annotations

import test_state_docs as on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

collect_again(on_sqlite, globals(), except_for=set())
