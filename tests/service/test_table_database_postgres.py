"""The quota table kept in the ledger's database, on PostgreSQL: tests/unit/test_table_database.py
and the editor's API of tests/service/test_table_database_api.py again, each test on a
fresh database of the private test server (tests/postgres.py): the advisory lock that lets
one save through at a time, and the seeding by several processes at once, there."""

from __future__ import annotations

# the tests that touch no ledger
NO_LEDGER: set[str] = {"test_a_table_name_is_letters_digits_dots_dashes_and_underscores",
                       "test_the_services_are_told_the_source",
                       "test_the_shipped_config_passes_the_source_on_and_seeds_nothing"}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_table_database": NO_LEDGER, "test_table_database_api": set()}
