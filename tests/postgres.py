"""A fresh PostgreSQL database for one test, in the private test server that
scripts/test-postgres.sh starts (make test does): Debian's PostgreSQL, its own data
folder and socket. The state and ledger tests run against it as well as SQLite: each
tests/service/test_*_postgres.py names the modules whose tests it runs again there
(``AGAIN_ON_POSTGRESQL``), and tests/service/conftest.py collects it as
``AgainOnPostgreSQL``."""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

URL_FILE = Path("/run/quota-spawner-test/postgres/url")


def server_url() -> str:
    """The private server's URL (its ``postgres`` database); fails the test without it."""
    url = os.environ.get("QUOTA_SPAWNER_TEST_POSTGRES") or (
        URL_FILE.read_text().strip() if URL_FILE.exists() else "")
    if not url:
        pytest.fail("no PostgreSQL for the tests: run scripts/test-postgres.sh (make test "
                    "does), or set QUOTA_SPAWNER_TEST_POSTGRES to a server's URL")
    return url


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards (its connections too)."""
    server = make_url(server_url())
    name = f"qs_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture
def ledger_url() -> Iterator[str]:
    """The ledger's URL for a test module that runs on PostgreSQL: a fresh database."""
    with fresh_database() as url:
        yield url


def collect_again(module: Any, namespace: dict[str, Any], *, except_for: set[str]) -> None:
    """Put ``module``'s tests and fixtures into ``namespace`` (a test module's globals), so
    pytest runs them again there with that module's ``ledger_url``; ``except_for``: the
    tests about SQLite itself."""
    unknown = except_for - set(vars(module))
    assert not unknown, f"no such tests in {module.__name__}: {sorted(unknown)}"
    namespace.update({name: value for name, value in vars(module).items()
                      if not name.startswith("_") and name not in except_for
                      and name not in ("ledger_url", "pytest", "pytestmark")})


class AgainOnPostgreSQL(pytest.Module):
    """A test module that also runs other modules' tests, on PostgreSQL: every test and
    fixture of each module its ``AGAIN_ON_POSTGRESQL`` names ({module: the tests about
    SQLite itself, left out}), beside its own tests, with ``ledger_url`` a fresh database.
    Those modules are the ones pytest collects from their own folder (tests/unit is on
    the path), so their tests run once on SQLite there and once here; no test module
    imports another."""

    def collect(self):
        namespace = vars(self.obj)
        for name, except_for in getattr(self.obj, "AGAIN_ON_POSTGRESQL", {}).items():
            module = importlib.import_module(name)
            collect_again(module, namespace, except_for=except_for)
            marks = getattr(module, "pytestmark", [])  # read before: this module's own
            for mark in marks if isinstance(marks, list) else [marks]:
                self.add_marker(mark)
        namespace["ledger_url"] = ledger_url
        return super().collect()
