"""The quota table kept in the ledger's database, on PostgreSQL: tests/unit/test_table_database.py
and the editor's API of tests/service/test_table_database_api.py again, each test on a
fresh database of the private test server (tests/postgres.py): the advisory lock that lets
one save through at a time, and the seeding by several processes at once, there."""

from __future__ import annotations

import test_table_database as store_on_sqlite
import test_table_database_api as api_on_sqlite
from postgres import collect_again, ledger_url  # noqa: F401 -- this module's ledger_url

# the tests that touch no ledger
NO_LEDGER: set[str] = {"test_a_table_name_is_letters_digits_dots_dashes_and_underscores",
                       "test_the_services_are_told_the_source",
                       "test_the_shipped_config_passes_the_source_on_and_seeds_nothing"}
collect_again(store_on_sqlite, globals(), except_for=NO_LEDGER)
collect_again(api_on_sqlite, globals(), except_for=set())
