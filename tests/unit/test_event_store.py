"""The hub's event log in the ledger's database (spawner/usage/event_store.py), and the
event log that writes there too (spawner/usage/event_log.py ``store``). tests/service/
test_event_store_postgres.py runs the same on PostgreSQL."""

from __future__ import annotations

import json
import logging
import threading

from alembic import command
from ledger_sessions import open_session
from sqlalchemy import func, insert, select

from spawner.usage import event_store
from spawner.usage.event_log import EventLog
from spawner.usage.ledger import Ledger, _alembic_config, make_engine
from spawner.usage.schema import event_claims, events
from spawner.watchdog.hub_events import read_new_rows

LOG = logging.getLogger("test-event-store")



def record(n: int, **fields) -> dict:
    return {"version": 1, "time": 1000.0 + n, "event": "preemption", "hub": "hub-a",
            "user": f"u{n}", **fields}


def test_events_come_back_in_order_after_an_id(ledger):
    assert event_store.last_id(ledger.engine) == 0
    event_store.append(ledger.engine, [record(1), record(2)])
    event_store.append_one(ledger.engine, record(3, reason="o'brien <b> needs 1 GPU"))
    found, last = event_store.read_after(ledger.engine, 0)
    assert [e["user"] for e in found] == ["u1", "u2", "u3"]
    assert found[2] == record(3, reason="o'brien <b> needs 1 GPU")  # the whole record
    assert event_store.read_after(ledger.engine, last) == ([], last)
    after_first, _ = event_store.read_after(ledger.engine, last - 2)
    assert [e["user"] for e in after_first] == ["u2", "u3"]


def test_a_read_takes_at_most_its_limit_and_the_rest_comes_next(ledger):
    event_store.append(ledger.engine, [record(n) for n in range(5)])
    first, last = event_store.read_after(ledger.engine, 0, limit=3)
    rest, end = event_store.read_after(ledger.engine, last, limit=3)
    assert [e["user"] for e in first + rest] == [f"u{n}" for n in range(5)]
    assert end == event_store.last_id(ledger.engine)


def test_a_body_that_is_not_an_object_is_skipped(ledger):
    with ledger.engine.begin() as c:
        c.execute(insert(events), [{"time": 1.0, "hub": "h", "event": "x", "body": "{bad"},
                                   {"time": 2.0, "hub": "h", "event": "x", "body": "[1]"}])
    event_store.append_one(ledger.engine, record(1))
    found, _ = event_store.read_after(ledger.engine, 0)
    assert [e["user"] for e in found] == ["u1"]


def test_long_names_are_cut_to_the_columns_not_the_body(ledger):
    event_store.append_one(ledger.engine, record(1, hub="h" * 300, event="e" * 300))
    (found,), _ = event_store.read_after(ledger.engine, 0)
    assert found["hub"] == "h" * 300  # the body keeps it whole


def test_the_watchdog_reads_from_the_newest_then_what_follows(ledger):
    event_store.append(ledger.engine, [record(1), record(2)])
    where = "the events table of the test ledger"
    found, cursor = read_new_rows(ledger.engine, where, None, "node-a")
    assert found == []  # a watchdog that starts now tells nothing that came before it
    event_store.append_one(ledger.engine, record(3))
    found, cursor = read_new_rows(ledger.engine, where, cursor, "node-a")
    assert [e["user"] for e in found] == ["u3"]
    again, _ = read_new_rows(ledger.engine, where, cursor, "node-a")
    assert again == []
    moved, _ = read_new_rows(ledger.engine, "another ledger", cursor, "node-a")
    assert moved == []  # a cursor of another log starts at the end again


def test_with_a_watchdog_per_node_each_event_is_told_by_one(ledger):
    """Two watchdogs read the same events at once; each event goes to exactly one, and a
    watchdog that reads again after a restart (its cursor lost) tells none twice."""
    where = "the events table"
    cursors = {n: read_new_rows(ledger.engine, where, None, n)[1] for n in ("a", "b")}
    event_store.append(ledger.engine, [record(n) for n in range(30)])
    told: dict[str, list[str]] = {"a": [], "b": []}

    def read(node: str) -> None:
        found, cursors[node] = read_new_rows(ledger.engine, where, cursors[node], node)
        told[node] += [e["user"] for e in found]

    threads = [threading.Thread(target=read, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(told["a"] + told["b"]) == sorted(f"u{n}" for n in range(30))
    found, _ = event_store.claim_after(ledger.engine, 0, "c")  # from the start: all claimed
    assert found == []


def test_prune_forgets_old_events_and_their_claims_but_never_the_newest(ledger):
    """The retention's cut; a watchdog's cursor stays good, since the newest id stays (an
    emptied SQLite table would hand it out again)."""
    event_store.append(ledger.engine, [record(n) for n in range(4)])  # times 1000..1003
    event_store.claim_after(ledger.engine, 0, "node-a")
    newest = event_store.last_id(ledger.engine)
    assert event_store.prune(ledger.engine, 1002.0) == 2
    found, _ = event_store.read_after(ledger.engine, 0)
    assert [e["user"] for e in found] == ["u2", "u3"]
    assert event_store.prune(ledger.engine, 5000.0) == 1  # all old: the newest stays
    assert event_store.last_id(ledger.engine) == newest
    event_store.append_one(ledger.engine, record(9))
    assert event_store.last_id(ledger.engine) == newest + 1  # ids never go back
    with ledger.engine.connect() as c:  # the pruned events' claims went with them
        assert c.execute(select(func.count()).select_from(event_claims)).scalar() == 1


def test_writers_on_several_threads_lose_nothing_and_keep_each_ones_order(ledger):
    def write(t: int) -> None:
        for n in range(20):
            event_store.append_one(ledger.engine, record(n, writer=t))

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found, _ = event_store.read_after(ledger.engine, 0)
    assert len(found) == 80
    for t in range(4):
        assert [e["user"] for e in found if e["writer"] == t] == [f"u{n}" for n in range(20)]


def test_the_event_log_writes_the_database_too_and_a_failure_never_raises(ledger, tmp_path,
                                                                          caplog):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), LOG, store=lambda r: event_store.append_one(ledger.engine, r))
    written = log.append("preemption", hub="hub-a", user="ann")
    log.flush()
    (stored,), _ = event_store.read_after(ledger.engine, 0)
    assert stored == written == json.loads(path.read_text())

    def broken(_record):
        raise RuntimeError("the database is gone")

    failing = EventLog("", LOG, store=broken)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        failing.append("preemption", user="a")
        failing.append("preemption", user="b")
        failing.flush()
    said = [r.getMessage() for r in caplog.records if "could not add" in r.getMessage()]
    assert said == ["Event log: could not add preemption to the database (RuntimeError: the "
                    "database is gone)"]  # once, until it works again


def test_a_ledger_of_0004_is_upgraded_and_keeps_its_sessions(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = make_engine(url)
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "0004")
    engine.dispose()
    old = Ledger.__new__(Ledger)  # the 0004 ledger's sessions, written as that code did
    old.url, old.log, old.engine = url, LOG, make_engine(url)
    session = open_session(old)
    old.dispose()
    ledger = Ledger(url, LOG)  # the hub's start upgrades it
    assert ledger.open_containers("hub-a") == {"jupyter-ada": session}
    event_store.append_one(ledger.engine, record(1))
    assert event_store.read_after(ledger.engine, 0)[0] == [record(1)]
    ledger.dispose()
    assert (tmp_path / "old.sqlite.0004.bak").exists()  # copied aside first
