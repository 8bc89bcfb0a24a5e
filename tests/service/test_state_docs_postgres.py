"""The processes' shared documents on PostgreSQL: tests/unit/test_state_docs.py again,
each test on a fresh database of the private test server (tests/postgres.py)."""

from __future__ import annotations

# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_state_docs": set()}
