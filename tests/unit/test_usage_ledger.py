"""The usage ledger: its schema and migrations, the sessions the hub writes and the samples
the watchdog folds. Real SQLite files in tmp_path. How an end is read and the hub's duties
are in test_usage_ends.py, the writer thread, the culler and the watchdog in
test_usage_writers.py; all three use the fixtures ``url`` and ``ledger`` (tests/conftest.py)
and the helpers of tests/ledger_sessions.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from ledger_sessions import (
    HUB,
    LOG,
    OTHER_HUB,
    G,
    all_rows,
    group_rows,
    open_session,
    ran,
    row,
    usage,
)
from sqlalchemy import column, create_engine, insert, inspect, table, text

from spawner.usage.ledger import (
    REASONS,
    Ledger,
    LedgerNotReady,
    Sample,
    _alembic_config,
    current_revision,
    gpu_reserved,
    head_revision,
    make_engine,
)
from spawner.usage.schema import VERSION_TABLE, metadata

pytestmark = pytest.mark.usefixtures("quiet_alembic")


# every column of a session as the hub's open() leaves it, before anything else is known
FRESH = dict(
    container_id=None, gpus="", gpu_count=0, gpu_mode="", gpu_reserved=0.0, gpu_mem_limit=None,
    started=None, ready=None, stopped=None, reason=None, hint=None, detail=None,
    last_seen=None, cpu_samples=0, cpu_sum=0.0, cpu_peak=None, mem_samples=0, mem_sum=0.0,
    mem_peak=None, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
    gpu_mem_peak=None, oom_kills=0, home_size=None, home_peak=None)


# --- 1. schema and migrations -------------------------------------------------------------


def _shape(engine) -> dict:
    """Every table's columns, indexes (by name, with their columns) and foreign keys."""
    shape = {}
    with engine.connect() as connection:
        tables = [r[0] for r in connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for table in tables:
            indexes = {}
            for index in connection.exec_driver_sql(f"PRAGMA index_list({table})"):
                indexes[index[1]] = (index[2], [tuple(c) for c in connection.exec_driver_sql(
                    f"PRAGMA index_info({index[1]})")])
            shape[table] = {
                "columns": [tuple(c) for c in connection.exec_driver_sql(
                    f"PRAGMA table_info({table})")],
                "indexes": indexes,
                "foreign_keys": [tuple(f) for f in connection.exec_driver_sql(
                    f"PRAGMA foreign_key_list({table})")],
            }
    return shape


def test_the_migrations_from_empty_build_exactly_the_schema(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'migrated.sqlite'}")
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "head")
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={
            "version_table": VERSION_TABLE, "compare_type": True})
        assert compare_metadata(context, metadata) == []
        assert current_revision(connection) == head_revision() == "0009"
        tables = set(connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table'").scalars())
    assert tables == {"sessions", "session_groups", "table_versions", "role_requests",
                      "prewarm_schedules", "events", "state_documents", "event_claims",
                      VERSION_TABLE}
    # and a new ledger (created from the metadata, then stamped) is the same database
    created = Ledger(f"sqlite:///{tmp_path / 'created.sqlite'}", LOG)
    migrated = _shape(engine)
    assert migrated == _shape(created.engine)
    assert set(migrated["sessions"]["indexes"]) == {
        "ix_sessions_started", "ix_sessions_stopped", "ix_sessions_user_started",
        "ix_sessions_container"}
    assert migrated["session_groups"]["foreign_keys"] == [
        (0, 0, "sessions", "session_id", "id", "NO ACTION", "CASCADE", "NONE")]
    created.dispose()
    engine.dispose()


def test_a_ledger_twice_on_one_file_is_created_once_and_stamped_with_the_head(url, caplog):
    with caplog.at_level(logging.INFO, logger=LOG.name):
        first = Ledger(url, LOG)
        session = open_session(first)
        second = Ledger(url, LOG)  # a no-op: the ledger is at the head already
    assert [r.getMessage() for r in caplog.records if "Usage ledger" in r.getMessage()] == [
        f"Usage ledger created at {url}"]
    with second.engine.connect() as connection:
        assert current_revision(connection) == head_revision()
        assert connection.exec_driver_sql(
            f"SELECT version_num FROM {VERSION_TABLE}").scalars().all() == [head_revision()]
    assert second.open_containers(HUB) == {"jupyter-ada": session}  # nothing was recreated
    second.check_ready()
    Ledger(url, LOG, create=False).check_ready()
    first.dispose()
    second.dispose()


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_a_ledger_not_created_yet_is_not_ready_and_says_how_to_create_it(tmp_path, kind):
    path = tmp_path / "state" / "usage.sqlite"
    if kind == "empty":
        path.parent.mkdir()
        create_engine(f"sqlite:///{path}").connect().close()  # an empty database file
        assert path.exists()
    url = f"sqlite:///{path}"
    with pytest.raises(LedgerNotReady) as raised:
        Ledger(url, LOG, create=False)
    if kind == "missing":  # a reader makes no file (nor folder): only the hub creates it
        assert str(raised.value) == (
            f"the usage ledger at {url} does not exist yet; the hub creates it when it "
            "starts (or run: quota-spawner ledger upgrade)")
        assert not path.parent.exists()
    else:
        assert str(raised.value) == (
            f"the usage ledger at {url} is at revision none, not 0009; the hub creates or "
            "upgrades it when it starts (or run: quota-spawner ledger upgrade)")


def test_the_ledger_is_created_beside_jupyterhubs_own_alembic_version(tmp_path):
    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    hub_db = create_engine(url)
    with hub_db.begin() as connection:  # JupyterHub's version table, at a revision of its own
        connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        connection.execute(text("INSERT INTO alembic_version VALUES ('4621fec11365')"))
        connection.execute(text("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)"))
    hub_db.dispose()
    ledger = Ledger(url, LOG)
    with ledger.engine.connect() as connection:
        assert connection.exec_driver_sql(
            "SELECT version_num FROM alembic_version").scalars().all() == ["4621fec11365"]
        assert current_revision(connection) == "0009"
        tables = set(connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table'").scalars())
    assert tables == {"alembic_version", "users", "sessions", "session_groups", "table_versions",
                      "role_requests", "prewarm_schedules", "events", "state_documents", "event_claims",
                      VERSION_TABLE}
    assert open_session(ledger) == 1
    ledger.dispose()


# Sessions as a 0.1.0 hub left them (revision 0008): one ended, sampled, in a group, and
# one still running when the hub was upgraded.
OLD_SESSIONS = [
    dict(hub=HUB, user_name="ada", server_name="", container="jupyter-ada",
         container_id="cid-ada", role="gpu", image="torch", gpus="GPU-a", gpu_count=1,
         gpu_mode="exclusive", gpu_reserved=1.0, cpu_limit=4.0, mem_limit=16 * G,
         gpu_mem_limit=80 * G, requested=100.0, started=110.0, ready=115.0, stopped=200.0,
         reason="culled", hint="culled", detail=None, last_seen=195.0, cpu_samples=3,
         cpu_sum=1.5, cpu_peak=0.9, mem_samples=3, mem_sum=6.0 * G, mem_peak=3 * G,
         gpu_samples=3, gpu_util_sum=1.2, gpu_util_peak=0.6, gpu_mem_sum=3.0 * G,
         gpu_mem_peak=2 * G, oom_kills=0),
    dict(hub=HUB, user_name="bo", server_name="train", container="jupyter-bo",
         container_id="cid-bo", role="cpu", image="py", gpus="", gpu_count=0, gpu_mode="",
         gpu_reserved=0.0, cpu_limit=1.0, mem_limit=G, gpu_mem_limit=None, requested=150.0,
         started=151.0, ready=152.0, stopped=None, reason=None, hint=None, detail=None,
         last_seen=250.0, cpu_samples=1, cpu_sum=0.25, cpu_peak=None, mem_samples=1,
         mem_sum=float(G // 2), mem_peak=G // 2, gpu_samples=0, gpu_util_sum=0.0,
         gpu_util_peak=None, gpu_mem_sum=0.0, gpu_mem_peak=None, oom_kills=0),
]


def test_a_0008_ledger_keeps_its_sessions_and_their_homes_are_unknown(ledger_url):
    engine = make_engine(ledger_url)
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "0008")
        connection.execute(insert(table("sessions", *(column(k) for k in OLD_SESSIONS[0]))),
                           OLD_SESSIONS)
        connection.execute(insert(table("session_groups", column("session_id"),
                                        column("group_name"))),
                           [{"session_id": 1, "group_name": "cs101"},
                            {"session_id": 2, "group_name": "lab"}])
    engine.dispose()
    ledger = Ledger(ledger_url, LOG)  # as the hub's start upgrades it
    try:
        with ledger.engine.connect() as connection:
            assert current_revision(connection) == head_revision() == "0009"
        # every value kept; no size and no peak known for the homes of before
        assert all_rows(ledger) == [dict(s, id=i, home_size=None, home_peak=None)
                                    for i, s in enumerate(OLD_SESSIONS, 1)]
        assert group_rows(ledger) == [(1, "cs101"), (2, "lab")]
        # the session that ran on through the upgrade takes the watchdog's home samples
        assert ledger.fold([Sample(HUB, "jupyter-bo", 300.0, home_used=3 * G)]) == 1
        assert (row(ledger, 2)["home_peak"], row(ledger, 2)["mem_samples"]) == (3 * G, 1)
        assert ledger.close(HUB, "jupyter-bo", "stopped", when=310.0) == 2
        if ledger.engine.url.get_backend_name() == "sqlite":  # copied aside first
            assert Path(f"{ledger.engine.url.database}.0008.bak").is_file()
    finally:
        ledger.dispose()


def test_going_back_to_0008_keeps_every_session_and_its_groups(ledger):
    session = open_session(ledger, groups=["cs101", "lab"])
    ledger.started(HUB, "jupyter-ada", "cid-ada", when=110.0, home_size=20 * G)
    with ledger.engine.begin() as connection:
        command.downgrade(_alembic_config(connection), "0008")
    # the columns dropped in place: a copy of the table would cascade to session_groups
    assert "home_size" not in {c["name"] for c in inspect(ledger.engine).get_columns("sessions")}
    assert group_rows(ledger) == [(session, "cs101"), (session, "lab")]
    with ledger.engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "head")
    assert {k: row(ledger, session)[k] for k in ("container_id", "home_size", "home_peak")} == {
        "container_id": "cid-ada", "home_size": None, "home_peak": None}


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(ledger):
    with ledger.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


# --- 2. sessions ----------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "mode", "expected"), [
    (1, "exclusive", 1.0),
    (3, "exclusive", 3.0),
    (0, "", 0.0),
    (1, "shared:4", 0.25),
    (2, "shared:4", 0.5),
    (1, "shared:0", 1.0),  # never divided by zero
    (1, "shared:x", 1.0),  # a mode that does not parse holds its whole count
])
def test_gpu_reserved(count, mode, expected):
    assert gpu_reserved(count, mode) == expected


def test_a_session_from_open_to_close_fills_every_column(ledger):
    session = open_session(ledger, server="train", groups=["lab", "cs101", "lab"])
    assert row(ledger, session) == dict(
        FRESH, id=session, hub=HUB, user_name="ada", server_name="train",
        container="jupyter-ada", role="gpu", image="torch", cpu_limit=4.0, mem_limit=16 * G,
        requested=100.0)
    assert group_rows(ledger) == [(session, "cs101"), (session, "lab")]  # once each
    if ledger.engine.url.get_backend_name() == "sqlite":  # and written in sorted order
        with ledger.engine.connect() as connection:
            assert connection.exec_driver_sql(
                "SELECT group_name FROM session_groups ORDER BY rowid").scalars().all() == [
                "cs101", "lab"]
    ledger.set_gpus(HUB, "jupyter-ada", ["GPU-a", "GPU-b"], "exclusive", 80 * G)
    ledger.started(HUB, "jupyter-ada", "cid-ada", when=110.0)
    assert ledger.open_session(HUB, "jupyter-ada") == {
        "id": session, "container_id": "cid-ada", "started": 110.0, "requested": 100.0}
    ledger.ready(HUB, "jupyter-ada", when=115.0)
    assert ledger.close(HUB, "jupyter-ada", "stopped", when=200.0) == session
    assert row(ledger, session) == dict(
        FRESH, id=session, hub=HUB, user_name="ada", server_name="train",
        container="jupyter-ada", container_id="cid-ada", role="gpu", image="torch",
        gpus="GPU-a,GPU-b", gpu_count=2, gpu_mode="exclusive", gpu_reserved=2.0,
        gpu_mem_limit=80 * G, cpu_limit=4.0, mem_limit=16 * G, requested=100.0,
        started=110.0, ready=115.0, stopped=200.0, reason="stopped")
    assert ledger.open_session(HUB, "jupyter-ada") is None
    assert ledger.open_containers(HUB) == {}


def test_the_start_records_the_homes_size_and_none_is_no_limit(ledger):
    ada = open_session(ledger, "ada")
    bo = open_session(ledger, "bo")
    ledger.started(HUB, "jupyter-ada", "cid-ada", when=110.0, home_size=5 * 2**40)
    ledger.started(HUB, "jupyter-bo", "cid-bo", when=110.0)  # a role without a disk
    assert [(row(ledger, s)["home_size"], row(ledger, s)["home_peak"]) for s in (ada, bo)] == [
        (5 * 2**40, None), (None, None)]  # 5 TiB: a BigInteger; no peak before a sample


def test_a_shared_gpu_reserves_its_share(ledger):
    session = open_session(ledger)
    ledger.set_gpus(HUB, "jupyter-ada", ["GPU-a"], "shared:4", 20 * G)
    assert {k: row(ledger, session)[k] for k in (
        "gpus", "gpu_count", "gpu_mode", "gpu_reserved", "gpu_mem_limit")} == {
        "gpus": "GPU-a", "gpu_count": 1, "gpu_mode": "shared:4", "gpu_reserved": 0.25,
        "gpu_mem_limit": 20 * G}


def test_a_session_without_groups_has_no_group_rows_and_now_is_the_default_time(ledger):
    before = time.time()
    session = ledger.open(hub=HUB, user="bo", container="jupyter-bo", role="cpu", image="py",
                          cpu_limit=1.0, mem_limit=G)
    ledger.started(HUB, "jupyter-bo", "cid-bo")
    ledger.ready(HUB, "jupyter-bo")
    after = time.time()
    found = row(ledger, session)
    assert before <= found["requested"] <= found["started"] <= found["ready"] <= after
    assert group_rows(ledger) == []


def test_opening_again_closes_the_open_session_as_lost_at_its_last_known_time(ledger):
    old = open_session(ledger, groups=["cs101"])
    ran(ledger, started=110.0, ready=115.0)
    ledger.fold([Sample(HUB, "jupyter-ada", 150.0, cpu=1.0)])
    other_hub = open_session(ledger, hub=OTHER_HUB, requested=120.0)  # same name, other hub
    new = open_session(ledger, requested=300.0)
    assert new not in (old, other_hub)
    found = row(ledger, old)
    assert (found["stopped"], found["reason"], found["detail"]) == (150.0, "lost", None)
    assert row(ledger, new)["stopped"] is None
    assert row(ledger, other_hub)["stopped"] is None
    assert ledger.open_containers(HUB) == {"jupyter-ada": new}
    assert ledger.open_containers(OTHER_HUB) == {"jupyter-ada": other_hub}
    assert ledger.open_session(HUB, "jupyter-ada") == {
        "id": new, "container_id": None, "started": None, "requested": 300.0}


@pytest.mark.parametrize("hint", ["culled", "max-age", "preempted", "budget", "zombie"])
def test_a_hint_wins_over_stopped(ledger, hint):
    session = open_session(ledger)
    ran(ledger)
    assert ledger.hint(HUB, "jupyter-ada", hint) is True
    assert row(ledger, session)["hint"] == hint
    assert row(ledger, session)["stopped"] is None  # a hint alone closes nothing
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    found = row(ledger, session)
    assert (found["reason"], found["hint"], found["stopped"], found["detail"]) == (
        hint, hint, 200.0, None)


@pytest.mark.parametrize("own", ["oom", "failed", "lost"])
@pytest.mark.parametrize("hint", ["culled", "budget"])
def test_what_the_server_itself_showed_wins_over_a_hint(ledger, own, hint):
    session = open_session(ledger)
    ran(ledger)
    ledger.hint(HUB, "jupyter-ada", hint)
    ledger.close(HUB, "jupyter-ada", own, detail="why", when=200.0)
    found = row(ledger, session)
    assert (found["reason"], found["detail"], found["stopped"]) == (own, "why", 200.0)


def test_a_hint_also_wins_over_another_stop_reason_and_the_last_hint_counts(ledger):
    session = open_session(ledger)
    ran(ledger)
    ledger.hint(HUB, "jupyter-ada", "culled")
    ledger.hint(HUB, "jupyter-ada", "max-age")
    ledger.close(HUB, "jupyter-ada", "preempted", when=200.0)
    assert row(ledger, session)["reason"] == "max-age"


def test_stopped_before_it_was_ever_ready_is_a_failed_start(ledger):
    first = open_session(ledger)
    ran(ledger, ready=None)
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    found = row(ledger, first)
    assert (found["reason"], found["detail"]) == ("failed", "stopped before the server was ready")
    second = open_session(ledger, requested=300.0)
    ledger.close(HUB, "jupyter-ada", "stopped", detail="No GPU is free", when=301.0)
    found = row(ledger, second)
    assert (found["reason"], found["detail"]) == ("failed", "No GPU is free")  # its own detail kept
    third = open_session(ledger, requested=400.0)  # culled before it was ready: culled
    ledger.hint(HUB, "jupyter-ada", "culled")
    ledger.close(HUB, "jupyter-ada", "stopped", when=401.0)
    assert row(ledger, third)["reason"] == "culled"


@pytest.mark.parametrize(("started", "ready", "seen", "expected"), [
    (110.0, 115.0, 150.0, 150.0),  # its last sample
    (110.0, 115.0, None, 115.0),  # no sample: its readiness
    (110.0, None, None, 110.0),  # never ready: its start
])
def test_lost_without_a_time_ends_at_the_latest_known_time(ledger, started, ready, seen, expected):
    session = open_session(ledger)
    ran(ledger, started=started, ready=ready)
    if seen is not None:
        ledger.fold([Sample(HUB, "jupyter-ada", seen)])
    assert ledger.close(HUB, "jupyter-ada", "lost") == session
    assert (row(ledger, session)["stopped"], row(ledger, session)["reason"]) == (expected, "lost")


def test_without_a_time_a_close_is_now(ledger):
    lost = open_session(ledger, "ada")  # lost with nothing known but its request: now
    stopped = open_session(ledger, "bo")
    ran(ledger, "jupyter-bo", started=110.0, ready=115.0)
    ledger.fold([Sample(HUB, "jupyter-bo", 150.0)])
    before = time.time()
    ledger.close(HUB, "jupyter-ada", "lost")
    ledger.close(HUB, "jupyter-bo", "stopped")  # only "lost" uses the last sample
    after = time.time()
    assert before <= row(ledger, lost)["stopped"] <= after
    assert before <= row(ledger, stopped)["stopped"] <= after


def test_close_without_an_open_session_changes_nothing(ledger):
    assert ledger.close(HUB, "jupyter-nobody", "stopped") is None
    session = open_session(ledger)
    ran(ledger)
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    before = all_rows(ledger)
    assert ledger.close(HUB, "jupyter-ada", "oom", detail="later", when=300.0) is None
    assert ledger.close(OTHER_HUB, "jupyter-ada", "stopped") is None
    assert all_rows(ledger) == before
    assert before[0]["id"] == session and before[0]["reason"] == "stopped"


def test_a_hint_without_an_open_session_is_false_and_changes_nothing(ledger):
    assert ledger.hint(HUB, "jupyter-ada", "culled") is False
    open_session(ledger)
    assert ledger.hint(OTHER_HUB, "jupyter-ada", "culled") is False
    ledger.close(HUB, "jupyter-ada", "lost", when=200.0)
    before = all_rows(ledger)
    assert ledger.hint(HUB, "jupyter-ada", "culled") is False
    assert all_rows(ledger) == before


def test_hint_server_finds_the_open_session_by_user_and_server_name(ledger):
    default = open_session(ledger, container="jupyter-ada")
    named = open_session(ledger, container="jupyter-ada-train", server="train")
    bo = open_session(ledger, "bo", server="train")
    assert ledger.hint_server("ada", "train", "culled") is True
    assert [row(ledger, s)["hint"] for s in (default, named, bo)] == [None, "culled", None]
    assert ledger.hint_server("ada", "", "max-age") is True
    assert [row(ledger, s)["hint"] for s in (default, named, bo)] == ["max-age", "culled", None]
    assert ledger.hint_server("cy", "", "culled") is False
    ledger.close(HUB, "jupyter-bo", "stopped", when=200.0)
    assert ledger.hint_server("bo", "train", "culled") is False  # closed: not open any more
    assert row(ledger, bo)["hint"] is None


def test_an_unknown_reason_is_refused(ledger):
    open_session(ledger)
    with pytest.raises(AssertionError):
        ledger.close(HUB, "jupyter-ada", "bored")
    with pytest.raises(AssertionError):
        ledger.hint(HUB, "jupyter-ada", "bored")
    with pytest.raises(AssertionError):
        ledger.hint_server("ada", "", "bored")
    assert ledger.open_containers(HUB) == {"jupyter-ada": 1}
    assert row(ledger, 1)["hint"] is None
    assert REASONS == ("stopped", "culled", "max-age", "preempted", "oom", "failed", "zombie",
                       "budget", "lost")


def test_open_containers_lists_this_hubs_open_sessions_only(ledger):
    ada = open_session(ledger, "ada")
    bo = open_session(ledger, "bo")
    open_session(ledger, "cy", hub=OTHER_HUB)
    gone = open_session(ledger, "dee")
    ledger.close(HUB, "jupyter-dee", "lost", when=200.0)
    assert gone not in ledger.open_containers(HUB).values()
    assert ledger.open_containers(HUB) == {"jupyter-ada": ada, "jupyter-bo": bo}
    assert ledger.open_containers("hub-none") == {}
    assert ledger.open_session(HUB, "jupyter-cy") is None


def test_prune_deletes_only_sessions_stopped_before_the_cut_with_their_groups(ledger):
    old = open_session(ledger, "ada", groups=["cs101", "lab"])
    ledger.close(HUB, "jupyter-ada", "lost", when=50.0)
    at_cut = open_session(ledger, "bo", groups=["cs101"])
    ledger.close(HUB, "jupyter-bo", "lost", when=100.0)
    recent = open_session(ledger, "cy", groups=["lab"])
    ledger.close(HUB, "jupyter-cy", "lost", when=150.0)
    running = open_session(ledger, "dee", groups=["cs101"], requested=10.0)
    assert ledger.prune(100.0) == 1
    assert [r["id"] for r in all_rows(ledger)] == [at_cut, recent, running]
    assert group_rows(ledger) == [(at_cut, "cs101"), (recent, "lab"), (running, "cs101")]
    assert old not in (at_cut, recent, running)
    assert ledger.prune(100.0) == 0


# --- 3. fold --------------------------------------------------------------------------------


SAMPLES = [  # three cycles of one server
    dict(time=200.0, cpu=0.5, memory=1 * G, gpu_util=0.25, gpu_memory=2 * G, oom_kills=0),
    dict(time=210.0, cpu=None, memory=3 * G, gpu_util=None, gpu_memory=None, oom_kills=2),
    dict(time=220.0, cpu=1.5, memory=None, gpu_util=0.75, gpu_memory=1 * G, oom_kills=1),
]
FOLDED = dict(  # sums over the samples that had each value, peaks, the counter's highest
    last_seen=220.0, cpu_samples=2, cpu_sum=2.0, cpu_peak=1.5, mem_samples=2, mem_sum=4.0 * G,
    mem_peak=3 * G, gpu_samples=2, gpu_util_sum=1.0, gpu_util_peak=0.75, gpu_mem_sum=3.0 * G,
    gpu_mem_peak=2 * G, oom_kills=2)


def test_fold_cycle_by_cycle_sums_counts_and_peaks(ledger):
    session = open_session(ledger)
    ran(ledger)
    assert [ledger.fold([Sample(HUB, "jupyter-ada", **s)]) for s in SAMPLES] == [1, 1, 1]
    assert usage(ledger, session) == FOLDED


def test_fold_in_one_call_gives_the_same_and_counts_the_sessions(ledger):
    ada = open_session(ledger, "ada")
    bo = open_session(ledger, "bo")
    ran(ledger, "jupyter-ada")
    ran(ledger, "jupyter-bo")
    batch = [Sample(HUB, "jupyter-ada", **s) for s in SAMPLES] + [
        Sample(HUB, "jupyter-bo", 220.0, cpu=0.0, memory=0),
        Sample(HUB, "jupyter-nobody", 220.0, cpu=9.0),
        Sample(OTHER_HUB, "jupyter-ada", 220.0, cpu=9.0)]
    assert ledger.fold(batch) == 4  # three of ada's and bo's; the others have no session
    assert usage(ledger, ada) == FOLDED
    assert usage(ledger, bo) == dict(
        last_seen=220.0, cpu_samples=1, cpu_sum=0.0, cpu_peak=0.0, mem_samples=1, mem_sum=0.0,
        mem_peak=0, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
        gpu_mem_peak=None, oom_kills=0)


def test_a_sample_with_no_values_only_says_it_was_seen(ledger):
    session = open_session(ledger)
    assert ledger.fold([Sample(HUB, "jupyter-ada", 205.0)]) == 1
    assert usage(ledger, session) == dict(
        last_seen=205.0, cpu_samples=0, cpu_sum=0.0, cpu_peak=None, mem_samples=0, mem_sum=0.0,
        mem_peak=None, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
        gpu_mem_peak=None, oom_kills=0)


def test_fold_keeps_the_most_each_home_held(ledger):
    ada, bo, cy = (open_session(ledger, name) for name in ("ada", "bo", "cy"))
    for name in ("ada", "bo", "cy"):
        ran(ledger, f"jupyter-{name}", container_id=f"cid-{name}")
    cycles = [  # ada's home's use grows, shrinks after a clean-up; bo's stays empty
        (200.0, 3 * G, 0), (210.0, None, 0), (220.0, 7 * 2**40, 0), (230.0, 4 * G, None)]
    for time_, ada_home, bo_home in cycles:
        assert ledger.fold([
            Sample(HUB, "jupyter-ada", time_, cpu=0.5, home_used=ada_home),
            Sample(HUB, "jupyter-bo", time_, home_used=bo_home),
            Sample(HUB, "jupyter-cy", time_, cpu=0.25)]) == 3
    assert [row(ledger, s)["home_peak"] for s in (ada, bo, cy)] == [7 * 2**40, 0, None]
    # the home's use is a peak only: it counts no sample of anything else
    assert usage(ledger, bo) == dict(
        last_seen=230.0, cpu_samples=0, cpu_sum=0.0, cpu_peak=None, mem_samples=0, mem_sum=0.0,
        mem_peak=None, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
        gpu_mem_peak=None, oom_kills=0)
    assert usage(ledger, ada)["cpu_samples"] == 4
    ledger.close(HUB, "jupyter-ada", "stopped", when=240.0)
    ledger.fold([Sample(HUB, "jupyter-ada", 250.0, home_used=9 * 2**40)])  # after its close
    assert row(ledger, ada)["home_peak"] == 7 * 2**40


@pytest.mark.parametrize(("util", "memory", "expected"), [
    (0.5, None, (1, 0.5, 0.5, 0.0, 0)),  # utilisation only: its memory counts as 0
    (None, 4 * G, (1, 0.0, 0.0, 4.0 * G, 4 * G)),  # memory only (MIG: no utilisation)
])
def test_a_gpu_sample_counts_when_either_gpu_value_is_known(ledger, util, memory, expected):
    session = open_session(ledger)
    ledger.fold([Sample(HUB, "jupyter-ada", 200.0, gpu_util=util, gpu_memory=memory)])
    found = usage(ledger, session)
    assert (found["gpu_samples"], found["gpu_util_sum"], found["gpu_util_peak"],
            found["gpu_mem_sum"], found["gpu_mem_peak"]) == expected
    assert (found["cpu_samples"], found["mem_samples"]) == (0, 0)


def test_fold_leaves_out_servers_without_an_open_session(ledger):
    assert ledger.fold([]) == 0
    assert ledger.fold([Sample(HUB, "jupyter-ada", 200.0, cpu=1.0)]) == 0
    session = open_session(ledger)
    ran(ledger)
    assert ledger.fold([Sample(OTHER_HUB, "jupyter-ada", 200.0, cpu=1.0, oom_kills=3)]) == 0
    assert usage(ledger, session) == dict(
        last_seen=None, cpu_samples=0, cpu_sum=0.0, cpu_peak=None, mem_samples=0, mem_sum=0.0,
        mem_peak=None, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
        gpu_mem_peak=None, oom_kills=0)
    ledger.fold([Sample(HUB, "jupyter-ada", **SAMPLES[0])])
    ledger.close(HUB, "jupyter-ada", "stopped", when=205.0)
    before = all_rows(ledger)
    assert ledger.fold([Sample(HUB, "jupyter-ada", **SAMPLES[1])]) == 0  # after its close
    assert all_rows(ledger) == before
