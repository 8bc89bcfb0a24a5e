"""Usage accounting: the ledger of server sessions, reports, budgets, the usage page.

docs/usage.md describes what is recorded and how each report column is computed.
"""
