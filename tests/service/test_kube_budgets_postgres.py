"""GPU-hour budgets of running servers on Kubernetes on PostgreSQL, the cluster's ledger:
tests/service/test_kube_budgets.py again, each test on a fresh database of the private
test server (tests/postgres.py), but for the tests that need no ledger."""

from __future__ import annotations

NO_LEDGER = {"test_without_a_ledger_there_are_no_duties",
             "test_the_check_interval_is_the_same_setting_on_both_backends"}
# {module: its tests left out}, run here again (tests/postgres.py AgainOnPostgreSQL)
AGAIN_ON_POSTGRESQL = {"test_kube_budgets": NO_LEDGER}
