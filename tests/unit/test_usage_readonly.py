"""What only reads the ledger changes nothing in a file it refuses: the report and ledger
status commands, the usage page's reader and the watchdog's fold, pointed at a SQLite file
that is not a ledger (a copy of the hub's own database, say). WAL mode, which a SQLite file
keeps, is set only by the ledger's owner, when it creates or upgrades the ledger."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from spawner.cli import main as cli_main
from spawner.usage.ledger import Ledger, LedgerNotReady, head_revision
from spawner.watchdog.app import QuotaWatchdog
from spawner.watchdog.model import Server, ServerSample, Snapshot
from spawner.webapp.reader import LedgerReader

LOG = logging.getLogger("test-usage-readonly")
HUB = "hub-a"


def journal_mode(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return connection.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        connection.close()


@pytest.fixture
def hub_db(tmp_path) -> Path:
    """A SQLite file with tables of its own, in the default (rollback journal) mode."""
    path = tmp_path / "jupyterhub.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode=DELETE")
    connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    connection.execute("INSERT INTO users (name) VALUES ('ada')")
    connection.commit()
    connection.close()
    assert journal_mode(path) == "delete"
    return path


class Unchanged:
    """The file's bytes and times now; ``check()`` that they still are, with no file
    beside it (-wal, -shm, -journal)."""

    def __init__(self, path: Path):
        self.path = path
        self.data = path.read_bytes()
        self.mtime = path.stat().st_mtime_ns
        self.around = sorted(p.name for p in path.parent.iterdir())

    def check(self) -> None:
        assert self.path.read_bytes() == self.data
        assert self.path.stat().st_mtime_ns == self.mtime
        assert sorted(p.name for p in self.path.parent.iterdir()) == self.around
        assert journal_mode(self.path) == "delete"


def test_the_report_refuses_a_file_that_is_not_a_ledger_and_leaves_it_as_it_was(
        hub_db, capsys):
    before = Unchanged(hub_db)
    assert cli_main(["report", "--db", f"sqlite:///{hub_db}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quota-spawner report: the usage ledger at sqlite:///{hub_db} "
                          f"is at revision none, not {head_revision()}")
    before.check()


def test_ledger_status_of_a_file_that_is_not_a_ledger_leaves_it_as_it_was(hub_db, capsys):
    before = Unchanged(hub_db)
    assert cli_main(["ledger", "status", "--db", f"sqlite:///{hub_db}"]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"Revision: none (needs an upgrade to {head_revision()} (run: quota-spawner ledger "
        "upgrade))",
        "Sessions: no sessions table"]
    before.check()


def test_a_reader_of_the_ledger_refuses_it_and_leaves_it_as_it_was(hub_db):
    before = Unchanged(hub_db)
    with pytest.raises(LedgerNotReady, match="is at revision none"):
        Ledger(f"sqlite:///{hub_db}", LOG, create=False)
    before.check()
    reader = LedgerReader(f"sqlite:///{hub_db}", threads=1)  # the usage page's
    with pytest.raises(LedgerNotReady):
        reader._open()
    before.check()


def test_the_watchdogs_fold_leaves_a_file_that_is_not_a_ledger_as_it_was(hub_db, caplog):
    before = Unchanged(hub_db)
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=f"sqlite:///{hub_db}")
    watchdog.log = LOG
    server = Server(container_id="id-ada", name="jupyter-ada", user="ada", role="r",
                    image="i", hub_id=HUB)
    snapshot = Snapshot(time=500.0, host="h", servers={
        "id-ada": ServerSample(server, cpu_used=0.5, memory_working_set=2**30)})
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        watchdog.record_usage(snapshot)
        watchdog.record_usage(snapshot)
    assert "is at revision none" in caplog.text
    before.check()


def test_the_ledgers_owner_puts_a_new_ledger_in_wal_mode(tmp_path, capsys):
    path = tmp_path / "usage.sqlite"
    Ledger(f"sqlite:///{path}", LOG).dispose()
    assert journal_mode(path) == "wal"
    # as does `ledger upgrade`, and a reader then opens it as it is
    other = tmp_path / "other.sqlite"
    assert cli_main(["ledger", "upgrade", "--db", f"sqlite:///{other}"]) == 0
    assert journal_mode(other) == "wal"
    capsys.readouterr()
    assert cli_main(["report", "--db", f"sqlite:///{other}", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("user,sessions,")
    assert journal_mode(other) == "wal"


def test_the_ledgers_owner_puts_a_ledger_it_upgrades_in_wal_mode(tmp_path):
    path = tmp_path / "usage.sqlite"
    Ledger(f"sqlite:///{path}", LOG).dispose()
    connection = sqlite3.connect(path)  # a ledger from before WAL, say
    connection.execute("PRAGMA journal_mode=DELETE")
    connection.close()
    Ledger(f"sqlite:///{path}", LOG, create=False).dispose()  # a reader leaves it be
    assert journal_mode(path) == "delete"
    Ledger(f"sqlite:///{path}", LOG).dispose()
    assert journal_mode(path) == "wal"
