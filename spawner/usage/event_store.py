"""The hub's event log in the ledger's database: the ``events`` table.

Every process that writes events (the hub's spawners, the web app's role requests)
appends its records here as well as to the state folder's file (spawner/usage/event_log.py), so
a watchdog on another machine, given only the database's URL, reads them in order
(``read_after``) and tells the people concerned.

Order: ids are the order of the log. On a server, concurrent writers could commit ids
out of order (a reader might then pass over one that commits later), so each append
first takes a transaction-scoped advisory lock (usage/locks.py): appends commit one at a
time, in id order. SQLite's writers take turns anyway. Blocking: call from a thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from spawner.usage.locks import one_at_a_time
from spawner.usage.schema import event_claims, events

# pg_advisory_xact_lock's key for appending events ("events" in ASCII)
APPEND_LOCK = 0x6576656E7473
READ_LIMIT = 1000  # events per read; the rest come with the next


def append(engine: Engine, records: Sequence[Mapping[str, Any]]) -> None:
    """Add ``records`` (the event log's, each with ``time`` and ``event``) in one
    transaction, after every event appended before."""
    if not records:
        return
    rows = [{"time": float(r.get("time") or 0.0), "hub": str(r.get("hub") or "")[:64],
             "event": str(r.get("event") or "")[:64],
             "body": json.dumps(dict(r), sort_keys=True, default=str)} for r in records]
    with engine.begin() as connection:
        one_at_a_time(connection, APPEND_LOCK)
        connection.execute(insert(events), rows)


def append_one(engine: Engine, record: Mapping[str, Any]) -> None:
    """``append`` of one record: the event log's ``store`` (spawner/usage/event_log.py)."""
    append(engine, [record])


def last_id(engine: Engine) -> int:
    """The id of the newest event; 0 when there is none."""
    with engine.connect() as connection:
        return int(connection.execute(select(func.max(events.c.id))).scalar() or 0)


def read_after(engine: Engine, after: int,
               limit: int = READ_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """The events after id ``after``, oldest first (at most ``limit``), and the id to read
    after next. A body that is not a JSON object is skipped, as a bad line of the file is."""
    rows = _rows_after(engine, after, limit)
    found = [value for value in (_record(row.body) for row in rows) if value is not None]
    return found, (rows[-1].id if rows else after)


def claim_after(engine: Engine, after: int, node: str,
                limit: int = READ_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """``read_after`` for a watchdog among several: only the events it claimed
    (``event_claims``), each claimed by the first watchdog that reads it, so that every
    event is told once however many watchdogs read the table."""
    rows = _rows_after(engine, after, limit)
    found = []
    for row in rows:
        value = _record(row.body)
        if value is None:
            continue
        try:
            with engine.begin() as connection:
                connection.execute(insert(event_claims).values(
                    event_id=row.id, node=node[:253], time=time.time()))
        except IntegrityError:
            continue  # another watchdog tells it
        found.append(value)
    return found, (rows[-1].id if rows else after)


def _rows_after(engine: Engine, after: int, limit: int) -> list[Any]:
    query = (select(events.c.id, events.c.body).where(events.c.id > after)
             .order_by(events.c.id).limit(limit))
    with engine.connect() as connection:
        return list(connection.execute(query).all())


def _record(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def prune(engine: Engine, before: float) -> int:
    """Forget the events logged before ``before`` (the ledger's retention) and who told
    them; returns how many. The newest event always stays: SQLite gives a table emptied
    of its highest id that id again, and a watchdog's cursor past it would skip the next
    events."""
    newest = select(func.max(events.c.id)).scalar_subquery()
    old = select(events.c.id).where(events.c.time < before, events.c.id < newest)
    with engine.begin() as connection:
        connection.execute(delete(event_claims).where(event_claims.c.event_id.in_(old)))
        done = connection.execute(delete(events).where(events.c.id.in_(old)))
    return int(done.rowcount or 0)
