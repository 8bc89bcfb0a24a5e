"""Collection for the service layer: the modules that run the ledger's tests again on
PostgreSQL (tests/postgres.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from postgres import AgainOnPostgreSQL


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    """Each test_*_postgres.py runs the tests its ``AGAIN_ON_POSTGRESQL`` names on a fresh
    PostgreSQL database, besides its own."""
    if module_path.name.endswith("_postgres.py"):
        return AgainOnPostgreSQL.from_parent(parent, path=module_path)
    return None

