"""The quota table kept in the ledger's database (quota_source "database"): the hub's store
reading the newest version (seeded from the file once), the editor saving versions with
the same checks and conflict detection, restores, and the key every machine shares.
Real files and a real ledger: SQLite here, PostgreSQL in
tests/service/test_table_database_postgres.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import pytest
from shipped_config import load_hub_config
from sqlalchemy import event

from spawner.hubconfig.culling import culler_service, make_arbiter
from spawner.quota.editing import (
    CONFLICT,
    FROM_FILE,
    INVALID,
    NO_COMMENT,
    NOT_FOUND,
    SAVED,
    UNCHANGED,
    TableFile,
    TableVersions,
    database_key,
    version_of,
)
from spawner.quota.model import GpuCapacity, QuotaTableError
from spawner.quota.store import QuotaStore
from spawner.usage.ledger import Ledger
from spawner.usage.table_versions import (
    NO_LEDGER,
    PAGE,
    Audit,
    DatabaseSource,
    newest_good,
    table_store,
)
from spawner.webapp.app import webapp_service

pytestmark = pytest.mark.usefixtures("quiet_alembic")

LOG = logging.getLogger("test-table-database")
KEY = "database:default"

TABLE = """\
images:
  py:
    image: quay.io/jupyter/scipy-notebook:2024-05-06
roles:
  small:
    cpus: 1
    memory: 2G
    images: [py]
    idle_timeout: 20m
assignments:
  default: [small]
"""
CPUS_LINE = 6  # "    cpus: 1"
BIGGER = TABLE.replace("memory: 2G", "memory: 4G")
BAD = TABLE.replace("cpus: 1", "cpus: one")
BAD_PROBLEM = "role 'small': cpus must be a number, like 2 or 0.5, not text 'one'"




@pytest.fixture
def audit(ledger):
    return Audit(ledger.engine)


@pytest.fixture
def seed(tmp_path):
    """The quota file, in a folder of its own (the ledger's SQLite file is in tmp_path)."""
    path = tmp_path / "config" / "quotas.yaml"
    path.parent.mkdir()
    path.write_text(TABLE)
    return path


def store_of(ledger, seed, name: str = "default") -> QuotaStore:
    """A hub process's store of the database table ``name``, ``seed`` its file."""
    return QuotaStore(DatabaseSource(lambda: ledger.engine, name, str(seed) if seed else ""))


def statements(engine) -> list[str]:
    """Every SQL statement ``engine`` runs from now on."""
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *args: seen.append(statement))
    return seen


# --- the hub's store -------------------------------------------------------------------


def test_the_file_seeds_the_first_version_once_and_then_only_the_database_counts(
        ledger, audit, seed, tmp_path):
    store = store_of(ledger, seed)
    assert store.get(LOG).roles["small"].memory == 2 * 2**30
    [first] = audit.versions(KEY)
    assert (first.who, first.text, first.sha256) == (FROM_FILE, TABLE, version_of(TABLE.encode()))
    assert str(seed) in first.comment
    # another machine: its file is elsewhere and says something else; the key is the same
    elsewhere = tmp_path / "other-machine" / "quotas.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(BIGGER)
    assert store_of(ledger, elsewhere).get(LOG).roles["small"].memory == 2 * 2**30
    # an edit of the file changes nothing any more, and seeds nothing
    seed.write_text(BIGGER)
    assert store.get(LOG).roles["small"].memory == 2 * 2**30
    assert [v.id for v in audit.versions(KEY)] == [first.id]


def test_a_new_version_applies_at_the_next_read(ledger, audit, seed, caplog):
    store = store_of(ledger, seed)
    store.get(LOG)
    new_id = audit.record(path=KEY, who="ann", comment="more memory", text=BIGGER,
                          previous=TABLE)
    with caplog.at_level(logging.INFO, LOG.name):
        assert store.get(LOG).roles["small"].memory == 4 * 2**30
    assert f"Quota table (database, version {new_id}) reloaded" in caplog.text


def test_a_bad_version_is_refused_with_its_line_and_the_newest_good_stays(
        ledger, audit, seed, caplog):
    store = store_of(ledger, seed)
    good = store.get(LOG)
    [seeded] = audit.versions(KEY)
    # saved by some other route than the editor, which would refuse it
    bad_id = audit.record(path=KEY, who="a script", comment="oops", text=BAD, previous=TABLE)
    where = f"quota table (database, version {bad_id})"
    with caplog.at_level(logging.INFO, LOG.name):
        assert store.get(LOG) == good
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.getMessage() == (
        f"Quota table (database, version {bad_id}) is invalid; using version {seeded.id}, "
        f"the newest good version instead:\n{where}:{CPUS_LINE}: {BAD_PROBLEM}")
    assert [str(p) for p in store.problems] == [f"{where}:{CPUS_LINE}: {BAD_PROBLEM}"]

    caplog.clear()
    with caplog.at_level(logging.INFO, LOG.name):
        assert store.get(LOG) == good  # the same bad version: one line, not the problems
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING and warning.getMessage() == (
        f"Quota table (database, version {bad_id}) still has 1 problem(s); using version "
        f"{seeded.id}, the newest good version")

    audit.record(path=KEY, who="ann", comment="fixed", text=BIGGER, previous=BAD)
    assert store.get(LOG).roles["small"].memory == 4 * 2**30
    assert store.problems == []


def test_a_restarted_hub_runs_the_newest_good_version_under_bad_ones(ledger, audit, caplog):
    """Versions 1 to 3 good, 4 and 5 bad (one for its text, one for the hub's GPUs): a
    hub process that starts now runs 3, and says why once, with each bad line."""
    texts = [TABLE, BIGGER, TABLE.replace("memory: 2G", "memory: 3G"), BAD,
             TABLE.replace("cpus: 1\n", "cpus: 1\n    gpus: 4\n")]
    ids = [audit.record(path=KEY, who="a script", comment=f"v{n}", text=text, previous=None)
           for n, text in enumerate(texts, 1)]
    store = store_of(ledger, None)  # a new process: nothing good in memory
    with caplog.at_level(logging.INFO, LOG.name):
        table = store.get(LOG, GpuCapacity(3))
        assert store.get(LOG, GpuCapacity(3)) is table
    assert table.roles["small"].memory == 3 * 2**30 and table.path == (
        f"quota table (database, version {ids[2]})")
    [error, warning] = caplog.records
    assert error.levelno == logging.ERROR and error.getMessage() == (
        f"Quota table (database, version {ids[4]}) is invalid; using version {ids[2]}, the "
        "newest good version instead:\n"
        f"quota table (database, version {ids[4]}):{CPUS_LINE + 1}: role 'small': gpus is 4, "
        "but this hub has only 3 GPUs\n"
        f"quota table (database, version {ids[3]}):{CPUS_LINE}: {BAD_PROBLEM}")
    assert warning.levelno == logging.WARNING
    # with 4 GPUs, version 5 is good: it runs, as it would for the editor's check
    assert store.get(LOG, GpuCapacity(4)).roles["small"].gpus == 4
    assert store.problems == []


def test_the_newest_good_version_is_looked_for_past_a_page_of_bad_ones(ledger, audit):
    good_id = audit.record(path=KEY, who="ann", comment="good", text=TABLE, previous=None)
    bad_ids = [audit.record(path=KEY, who="a script", comment="bad", text=BAD, previous=None)
               for _ in range(PAGE + 3)]
    found = newest_good(audit, KEY, None)
    assert found.version.id == good_id
    assert [v.id for v, _ in found.passed_over] == bad_ids[::-1]
    assert newest_good(audit, "database:nothing-here", None) is None


def test_a_bad_version_before_any_good_one_is_a_quota_table_error(ledger, audit):
    bad_id = audit.record(path=KEY, who="a script", comment="oops", text=BAD, previous=None)
    with pytest.raises(QuotaTableError) as info:
        store_of(ledger, None).get(LOG)
    assert str(info.value) == (
        f"quota table (database, version {bad_id}):{CPUS_LINE}: {BAD_PROBLEM}")


def test_reading_at_every_spawn_loads_the_text_only_when_it_changed(ledger, audit, seed):
    store = store_of(ledger, seed)
    store.get(LOG)
    seen = statements(ledger.engine)
    for _ in range(3):
        store.get(LOG)
    selects = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 3
    assert all(".text" not in s for s in selects)  # the id and sha256 only
    audit.record(path=KEY, who="ann", comment="more memory", text=BIGGER, previous=TABLE)
    seen.clear()
    store.get(LOG)
    assert sum(".text" in s for s in seen) == 1


def test_a_bad_file_is_never_seeded_and_is_refused_with_its_line(ledger, audit, seed):
    seed.write_text(BAD)
    store = store_of(ledger, seed)
    with pytest.raises(QuotaTableError) as info:
        store.get(LOG)
    assert str(info.value) == f"{seed}:{CPUS_LINE}: {BAD_PROBLEM}"
    assert audit.versions(KEY) == []
    seed.write_text(TABLE)  # fixed before anything was seeded: it is the first version
    assert store.get(LOG).roles["small"].cpus == 1
    assert [v.who for v in audit.versions(KEY)] == [FROM_FILE]


def test_without_a_version_or_a_file_there_is_no_table(ledger, tmp_path):
    with pytest.raises(QuotaTableError) as info:
        store_of(ledger, tmp_path / "missing.yaml").get(LOG)
    assert "the database has no version of the table yet" in str(info.value)
    assert "missing.yaml to seed it from cannot be read" in str(info.value)


def test_a_database_that_cannot_be_reached_keeps_the_last_good_table(ledger, seed, caplog):
    down = threading.Event()

    def engine():
        if down.is_set():
            raise ConnectionError("the database server is gone")
        return ledger.engine

    store = QuotaStore(DatabaseSource(engine, "default", str(seed)))
    good = store.get(LOG)
    down.set()
    with caplog.at_level(logging.INFO, LOG.name):
        assert store.get(LOG) is good
    assert ("Quota table (database:default) cannot be read (ConnectionError: the database "
            "server is gone); using the last good table loaded at ") in caplog.text
    with pytest.raises(QuotaTableError):
        QuotaStore(DatabaseSource(engine, "default", str(seed))).get(LOG)  # none yet


def test_two_processes_seeding_at_once_record_one_first_version(ledger, audit, seed):
    stores = [store_of(ledger, seed) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def first_look(store: QuotaStore) -> None:
        barrier.wait()
        try:
            store.get(LOG)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=first_look, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [v.who for v in audit.versions(KEY)] == [FROM_FILE]


def test_tables_of_other_names_and_files_are_kept_apart(ledger, audit, seed, tmp_path):
    store_of(ledger, seed).get(LOG)
    other = tmp_path / "lab.yaml"
    other.write_text(BIGGER)
    assert store_of(ledger, other, "lab").get(LOG).roles["small"].memory == 4 * 2**30
    assert store_of(ledger, seed).get(LOG).roles["small"].memory == 2 * 2**30
    # a file table's history, keyed by its path as before, is neither of them
    file = TableFile(seed)
    saved = file.save(BIGGER, file.read()[1], "ann", "more memory", audit)
    assert saved.saved
    assert [v.path for v in audit.versions(str(seed))] == [str(seed)] * 2
    assert [v.path for v in audit.versions(KEY)] == [KEY]
    assert [v.path for v in audit.versions("database:lab")] == ["database:lab"]


@pytest.mark.parametrize("name", ["", "a b", "../x", "-x", "x" * 101, "ü"])
def test_a_table_name_is_letters_digits_dots_dashes_and_underscores(name):
    with pytest.raises(ValueError):
        database_key(name)


def test_the_stores_of_the_settings(ledger_url, seed, tmp_path):
    assert table_store("file", str(seed), ledger_url, "default", LOG) is \
        QuotaStore.for_path(str(seed))
    store = table_store("database", str(seed), ledger_url, "default", LOG)
    assert store is table_store("database", str(seed), ledger_url, "default", LOG)
    assert store is not table_store("database", str(seed), ledger_url, "lab", LOG)
    assert store.get(LOG).roles["small"].cpus == 1
    with pytest.raises(QuotaTableError) as info:
        table_store("database", str(seed), "none", "default", LOG).get(LOG)
    assert NO_LEDGER in str(info.value)


def test_the_culler_reads_the_database_table(ledger, audit, seed):
    store_of(ledger, seed).get(LOG)  # seeded: idle_timeout 20m
    audit.record(path=KEY, who="ann", comment="shorter", text=TABLE.replace("20m", "5m"),
                 previous=TABLE)
    hook = make_arbiter(str(seed), log=LOG, usage_db=str(ledger.url), quota_source="database",
                        quota_table_name="default")
    server = {"name": "", "url": "/user/ada/", "user_options": {"profile": "small"}}
    assert asyncio.run(hook(inactive=timedelta(minutes=6), inactive_limit=3600, server=server))


def test_the_services_are_told_the_source(monkeypatch):
    monkeypatch.delenv("QUOTA_SPAWNER_QUOTA_SOURCE", raising=False)
    monkeypatch.delenv("QUOTA_SPAWNER_QUOTA_TABLE_NAME", raising=False)
    culler, _ = culler_service("/q.yaml", quota_source="database", quota_table_name="lab")
    service, _, _ = webapp_service("http://hub", "sqlite:///u", "/q.yaml",
                                  quota_source="database", quota_table_name="lab")
    for environment in (culler["environment"], service["environment"]):
        assert environment["QUOTA_SPAWNER_QUOTA_SOURCE"] == "database"
        assert environment["QUOTA_SPAWNER_QUOTA_TABLE_NAME"] == "lab"
    culler, _ = culler_service("/q.yaml")
    assert "QUOTA_SPAWNER_QUOTA_SOURCE" not in culler["environment"]
    monkeypatch.setenv("QUOTA_SPAWNER_QUOTA_SOURCE", "database")  # the hub's own variable
    service, _, _ = webapp_service("http://hub", "sqlite:///u", "/q.yaml")
    assert service["environment"]["QUOTA_SPAWNER_QUOTA_SOURCE"] == "database"


def test_the_shipped_config_passes_the_source_on_and_seeds_nothing(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_QUOTA_SOURCE="database",
                        QUOTA_SPAWNER_QUOTA_TABLE_NAME="lab")
    assert (c.QuotaSpawner.quota_source, c.QuotaSpawner.quota_table_name) == ("database", "lab")
    for name in ("idle-culler", "usage"):
        environment = next(s for s in c.JupyterHub.services if s["name"] == name)["environment"]
        assert environment["QUOTA_SPAWNER_QUOTA_SOURCE"] == "database"
        assert environment["QUOTA_SPAWNER_QUOTA_TABLE_NAME"] == "lab"
    # the first version is the spawners' file, which a config including this one may change
    ledger = Ledger(c.QuotaSpawner.usage_db, LOG, create=False)
    try:
        assert Audit(ledger.engine).versions("database:lab") == []
    finally:
        ledger.dispose()


# --- the editor -------------------------------------------------------------------------


@pytest.fixture
def read_only(seed):
    """The file and its folder read-only, as a ConfigMap is: nothing may be written there."""
    seed.chmod(0o444)
    seed.parent.chmod(0o555)
    yield seed
    seed.parent.chmod(0o755)


def test_the_editor_saves_a_version_and_never_writes_the_file(ledger, audit, read_only):
    table = TableVersions("default", audit, str(read_only))
    text, version = table.read()  # nothing recorded yet: the file's text
    assert (text, version) == (TABLE, version_of(TABLE.encode()))
    store = store_of(ledger, read_only)
    result = table.save(BIGGER, version, "ann", "more memory", audit)
    assert result.outcome == SAVED and result.message == (
        "Saved; the hub uses it from the next spawn.")
    assert "-    memory: 2G\n+    memory: 4G\n" in result.diff
    assert table.read() == (BIGGER, result.version) and result.version == version_of(
        BIGGER.encode())
    first, saved = reversed(audit.versions(KEY))
    assert (first.who, first.text, first.diff) == (FROM_FILE, TABLE, "")
    assert (saved.id, saved.who, saved.comment) == (result.audit_id, "ann", "more memory")
    assert "+    memory: 4G" in saved.diff
    assert read_only.read_text() == TABLE and sorted(read_only.parent.iterdir()) == [read_only]
    assert store.get(LOG).roles["small"].memory == 4 * 2**30


def test_the_editor_refuses_as_it_does_for_a_file(ledger, audit, seed):
    table = TableVersions("default", audit, str(seed))
    version = table.read()[1]
    invalid = table.save(BAD, version, "ann", "a typo", audit)
    assert invalid.outcome == INVALID
    assert [str(p) for p in invalid.problems] == [f"{KEY}:{CPUS_LINE}: {BAD_PROBLEM}"]
    assert table.save(BIGGER, version, "ann", "  ", audit).outcome == NO_COMMENT
    assert table.save(TABLE, version, "ann", "same", audit).outcome == UNCHANGED
    assert audit.versions(KEY) == []


def test_two_admins_on_one_version_the_second_gets_the_conflict(audit, seed):
    ann = TableVersions("default", audit, str(seed))
    bo = TableVersions("default", audit, str(seed))
    base = ann.read()[1]
    assert bo.read()[1] == base
    assert ann.save(BIGGER, base, "ann", "more memory", audit).saved
    late = bo.save(TABLE.replace("cpus: 1", "cpus: 2"), base, "bo", "more cpus", audit)
    assert late.outcome == CONFLICT and not late.saved
    assert late.message.startswith("The table was changed by ann at ")
    assert "-    memory: 2G\n+    memory: 4G\n" in late.diff  # since bo's version
    # what bo's text would change in the current table: ann's memory back, and bo's cpus
    assert {"-    cpus: 1", "-    memory: 4G", "+    cpus: 2", "+    memory: 2G"} <= set(
        late.yours.splitlines())
    assert late.current_text == BIGGER and late.base_text == TABLE
    assert [v.who for v in audit.versions(KEY)] == ["ann", FROM_FILE]


def test_saves_at_once_on_one_version_let_exactly_one_through(ledger, seed):
    base = version_of(TABLE.encode())
    barrier = threading.Barrier(4)
    results: list = []

    def save(n: int) -> None:
        audit = Audit(ledger.engine)  # as the editors of two machines would
        table = TableVersions("default", audit, str(seed))
        barrier.wait()
        results.append(table.save(TABLE.replace("cpus: 1", f"cpus: {n + 2}"), base,
                                  f"admin{n}", "mine", audit).outcome)

    threads = [threading.Thread(target=save, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [CONFLICT] * 3 + [SAVED]
    assert len(Audit(ledger.engine).versions(KEY)) == 2  # the seed and the one save


def test_restore_saves_an_earlier_version_again_through_the_same_checks(ledger, audit, seed):
    table = TableVersions("default", audit, str(seed))
    store = store_of(ledger, seed)
    first_save = table.save(BIGGER, table.read()[1], "ann", "more memory", audit)
    [_, seeded] = audit.versions(KEY)
    restored = audit.restore(seeded.id, "bo", "back to 2G", table,
                             base_version=first_save.version)
    assert restored.saved and restored.version == version_of(TABLE.encode())
    assert audit.latest(KEY).restored_from == seeded.id
    assert store.get(LOG).roles["small"].memory == 2 * 2**30
    # a stale version is refused as any save is; another table's version is not this one's
    assert audit.restore(seeded.id, "bo", "again", table,
                         base_version=first_save.version).outcome == CONFLICT
    file_version = audit.record(path=str(seed), who="x", comment="a file's", text=TABLE,
                                previous=None)
    assert audit.restore(file_version, "bo", "wrong table", table).outcome == NOT_FOUND
