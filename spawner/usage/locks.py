"""One writer at a time, for a ledger transaction that reads before it writes.

A transaction that decides by what it reads (is this the newest table version? how many
requests does this user have open?) must not have another writer come between its read
and its write. ``one_at_a_time`` is its first statement:

- on PostgreSQL, a transaction-scoped advisory lock (``pg_advisory_xact_lock``), held
  until the commit or rollback, on every server process and machine alike: ``key`` alone
  for one lock of the whole ledger (the events' order, the table's versions, the schema's
  upgrade), or ``key`` with a ``name`` for one lock per name (a user's requests), so that
  other names never wait;
- on SQLite, the database's write lock, taken at once (``BEGIN IMMEDIATE``). Python's
  sqlite3 otherwise begins a transaction only at the first write, so two transactions
  read, both find nothing, and both write; and with WAL a reader that writes later may
  fail at once instead of waiting its turn. SQLite has one writer per file, so ``name``
  narrows nothing there.

Blocking, as every ledger call: run it on a thread.
"""

from __future__ import annotations

import zlib

from sqlalchemy import Connection

INT4 = 1 << 31


def one_at_a_time(connection: Connection, key: int, name: str | None = None) -> None:
    """Wait for, then hold until the transaction ends, the lock ``key`` (with ``name``:
    that name's lock of the kind ``key``, which must then fit in 32 bits). Call it first
    in the transaction."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        # Literal integers: the two-key form takes int4s, which a bound Python int may
        # not be sent as. A name shares its lock with another of the same CRC-32 only.
        keys = str(key) if name is None else f"{_int4(key)}, {_int4(zlib.crc32(name.encode()))}"
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({keys})")
    elif dialect == "sqlite":
        # A transaction begun already has written, so it holds the write lock
        if not connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def _int4(value: int) -> int:
    """``value``'s low 32 bits as PostgreSQL's signed ``integer``."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= INT4 else value
