"""The usage ledger: its schema and migrations, the sessions the hub writes, the samples the
watchdog folds, how an end is read (engine state or events), the hub's periodic duties, the
writer thread, and the culler's and the watchdog's side. Real SQLite files in tmp_path; the
engine, the pool and the ledger of the writer tests are fakes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, select, text
from tornado.web import HTTPError

from spawner.contract import HUB_LABEL
from spawner.docker.engine import container_end, docker_time
from spawner.hubconfig.culling import CullReasons, make_arbiter
from spawner.usage import duties as duties_module
from spawner.usage.duties import PRUNE_EVERY, UsageDuties, record_end
from spawner.usage.ledger import (
    NO_LEDGER,
    REASONS,
    Ledger,
    LedgerNotReady,
    LedgerWriter,
    Sample,
    _alembic_config,
    current_revision,
    ended,
    failure,
    gpu_reserved,
    head_revision,
    make_engine,
)
from spawner.usage.schema import VERSION_TABLE, metadata, session_groups, sessions
from spawner.watchdog.app import QuotaWatchdog, usage_samples
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot

G = 2**30
HUB = "hub-a"
OTHER_HUB = "hub-b"
DAY = 86400.0
# 2024-05-06T07:08:09Z, and Docker's spelling of it with nanoseconds
FINISHED = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc).timestamp()
FINISHED_AT = "2024-05-06T07:08:09.123456789Z"
FINISHED_NANO = 1714979289123456789
LOG = logging.getLogger("test-usage-ledger")


@pytest.fixture(autouse=True)
def quiet_alembic():
    """Alembic's own INFO lines (when another test has turned the root logger up) are not
    what these tests read in caplog."""
    alembic = logging.getLogger("alembic")
    level = alembic.level
    alembic.setLevel(logging.WARNING)
    yield
    alembic.setLevel(level)

# every column of a session as the hub's open() leaves it, before anything else is known
FRESH = dict(
    container_id=None, gpus="", gpu_count=0, gpu_mode="", gpu_reserved=0.0, gpu_mem_limit=None,
    started=None, ready=None, stopped=None, reason=None, hint=None, detail=None,
    last_seen=None, cpu_samples=0, cpu_sum=0.0, cpu_peak=None, mem_samples=0, mem_sum=0.0,
    mem_peak=None, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None, gpu_mem_sum=0.0,
    gpu_mem_peak=None, oom_kills=0)


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'usage.sqlite'}"


@pytest.fixture
def ledger(url):
    ledger = Ledger(url, LOG)
    yield ledger
    ledger.dispose()


def open_session(ledger: Ledger, user: str = "ada", *, hub: str = HUB, container: str = "",
                 server: str = "", requested: float = 100.0, groups=(), role: str = "gpu",
                 ) -> int:
    return ledger.open(hub=hub, user=user, container=container or f"jupyter-{user}",
                       role=role, image="torch", cpu_limit=4.0, mem_limit=16 * G,
                       groups=groups, server=server, requested=requested)


def row(ledger: Ledger, session_id: int) -> dict:
    with ledger.engine.connect() as connection:
        found = connection.execute(select(sessions).where(sessions.c.id == session_id)).first()
    assert found is not None, session_id
    return dict(found._mapping)


def all_rows(ledger: Ledger) -> list[dict]:
    with ledger.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            select(sessions).order_by(sessions.c.id))]


def group_rows(ledger: Ledger) -> list[tuple[int, str]]:
    with ledger.engine.connect() as connection:
        return [tuple(r) for r in connection.execute(
            select(session_groups.c.session_id, session_groups.c.group_name)
            .order_by(session_groups.c.session_id, session_groups.c.group_name))]


def ran(ledger: Ledger, container: str = "jupyter-ada", *, started: float = 110.0,
        ready: float | None = 115.0, hub: str = HUB, container_id: str = "cid-ada") -> None:
    ledger.started(hub, container, container_id, when=started)
    if ready is not None:
        ledger.ready(hub, container, when=ready)


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
        assert current_revision(connection) == head_revision() == "0004"
        tables = set(connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table'").scalars())
    assert tables == {"sessions", "session_groups", "table_versions", "role_requests",
                      "prewarm_schedules", VERSION_TABLE}
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
            f"the usage ledger at {url} is at revision none, not 0004; the hub creates or "
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
        assert current_revision(connection) == "0004"
        tables = set(connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table'").scalars())
    assert tables == {"alembic_version", "users", "sessions", "session_groups", "table_versions",
                      "role_requests", "prewarm_schedules",
                      VERSION_TABLE}
    assert open_session(ledger) == 1
    ledger.dispose()


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
    with ledger.engine.connect() as connection:  # and written in sorted order
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


def usage(ledger: Ledger, session: int) -> dict:
    found = row(ledger, session)
    return {k: found[k] for k in (
        "last_seen", "cpu_samples", "cpu_sum", "cpu_peak", "mem_samples", "mem_sum", "mem_peak",
        "gpu_samples", "gpu_util_sum", "gpu_util_peak", "gpu_mem_sum", "gpu_mem_peak",
        "oom_kills")}


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


# --- 4. ended, failure, docker_time -------------------------------------------------------------


def test_a_running_container_was_stopped_by_the_hub():
    assert ended({"State": {"Running": True, "ExitCode": 0}}) == ("stopped", None, None)


def test_an_oom_killed_container_ended_by_memory_at_its_finish():
    reason, detail, when = ended({"State": {
        "Running": False, "OOMKilled": True, "ExitCode": 137, "FinishedAt": FINISHED_AT}})
    assert (reason, detail) == ("oom", "the container was killed for memory (exit code 137)")
    assert when == pytest.approx(FINISHED + 0.123456789, abs=1e-6)


@pytest.mark.parametrize(("code", "expected"), [
    (0, ("stopped", "the server exited by itself")),
    (1, ("lost", "the server ended without the hub stopping it (exit code 1)")),
    (139, ("lost", "the server ended without the hub stopping it (exit code 139)")),
])
def test_an_exited_container_by_its_exit_code(code, expected):
    reason, detail, when = ended({"State": {
        "Running": False, "OOMKilled": False, "ExitCode": code,
        "FinishedAt": "2024-05-06T07:08:09Z"}})
    assert (reason, detail, when) == (*expected, FINISHED)


def test_a_container_that_never_finished_has_no_time():
    assert ended({"State": {"Running": False, "ExitCode": 0,
                            "FinishedAt": "0001-01-01T00:00:00Z"}}) == (
        "stopped", "the server exited by itself", None)
    assert ended({}) == (  # no state at all: no exit code
        "lost", "the server ended without the hub stopping it (exit code None)", None)


@pytest.mark.parametrize(("end", "expected"), [
    ({"oom": True, "exit_code": 137, "finished": 500.0},
     ("oom", "the container was killed for memory (exit code 137)", 500.0)),
    ({"oom": False, "exit_code": 0, "finished": 500.0},
     ("stopped", "the server exited by itself", 500.0)),
    ({"oom": False, "exit_code": 2, "finished": 500.0},
     ("lost", "the server ended without the hub stopping it (exit code 2)", 500.0)),
    ({"oom": False, "exit_code": None, "finished": None},
     ("lost", "the server ended without the hub stopping it (exit code None)", None)),
    (None, ("lost", "its container was gone, with no record of its end", None)),
])
def test_an_end_from_the_engines_events(end, expected):
    assert ended(None, end) == expected


def test_neither_container_nor_end_is_lost():
    assert ended() == ("lost", "its container was gone, with no record of its end", None)


def test_failure_is_the_message_the_user_saw():
    assert failure(HTTPError(503, "No GPU is free for the role gpu")) == (
        "No GPU is free for the role gpu")
    assert failure(HTTPError(500)) == "HTTP 500: Internal Server Error"
    assert failure(RuntimeError("the image is missing")) == "the image is missing"
    assert failure(RuntimeError()) == "RuntimeError"


@pytest.mark.parametrize(("stamp", "expected"), [
    ("0001-01-01T00:00:00Z", None),
    (None, None),
    ("", None),
    ("not a time", None),
    ("2024-05-06T07:08:09Z", FINISHED),
    ("2024-05-06T07:08:09.5Z", FINISHED + 0.5),
    ("2024-05-06T09:08:09.25+02:00", FINISHED + 0.25),
])
def test_epoch(stamp, expected):
    assert docker_time(stamp) == expected


def test_epoch_keeps_nanoseconds():
    assert docker_time(FINISHED_AT) == pytest.approx(FINISHED + 0.123456789, abs=1e-6)


# --- 5. container_end -----------------------------------------------------------------------


class FakeDocker:
    """The engine's client as the ledger uses it: containers() and events()."""

    def __init__(self, names=(), events=None, fail: Exception | None = None):
        self.names = list(names)
        self.event_lists = events or {}  # container id: its events
        self.fail = fail
        self.event_calls: list[dict] = []
        self.container_calls: list[dict] = []

    def containers(self, all=False, filters=None):  # noqa: A002 (docker-py's own name)
        self.container_calls.append({"all": all, "filters": filters})
        return [{"Id": f"id-{n}", "Names": [f"/{n}"]} for n in self.names]

    def events(self, since=None, until=None, decode=None, filters=None):
        self.event_calls.append(
            {"since": since, "until": until, "decode": decode, "filters": filters})
        if self.fail is not None:
            raise self.fail
        yield from self.event_lists.get((filters or {}).get("container"), [])


def oom_event(cid: str) -> dict:
    return {"Type": "container", "Action": "oom", "status": "oom", "id": cid,
            "Actor": {"ID": cid, "Attributes": {"name": "jupyter-ada"}},
            "time": FINISHED_NANO // 10**9, "timeNano": FINISHED_NANO - 1000}


def die_event(cid: str, code: str = "137", nano: int | None = FINISHED_NANO) -> dict:
    event = {"Type": "container", "Action": "die", "status": "die", "id": cid,
             "Actor": {"ID": cid, "Attributes": {"exitCode": code, "name": "jupyter-ada"}},
             "time": FINISHED_NANO // 10**9}
    if nano is not None:
        event["timeNano"] = nano
    return event


def other_event(cid: str, action: str) -> dict:
    return {"Type": "container", "Action": action, "status": action, "id": cid,
            "Actor": {"ID": cid, "Attributes": {}}, "time": 1, "timeNano": 10**9}


def test_container_end_oom_then_die():
    docker = FakeDocker(events={"cid": [
        other_event("cid", "start"), oom_event("cid"), die_event("cid", "137"),
        other_event("cid", "destroy")]})
    before = int(time.time())
    end = container_end(docker, "cid", 1000.7)
    after = int(time.time())
    assert end == {"oom": True, "exit_code": 137,
                   "finished": pytest.approx(FINISHED + 0.123456789, abs=1e-6)}
    [call] = docker.event_calls
    assert call["since"] == 999  # a second before the start, in whole seconds
    assert before + 1 <= call["until"] <= after + 1
    assert (call["decode"], call["filters"]) == (True, {"type": "container", "container": "cid"})


@pytest.mark.parametrize(("code", "expected"), [("0", 0), ("1", 1), ("-1", -1), ("", None),
                                                ("x", None)])
def test_container_end_die_alone(code, expected):
    docker = FakeDocker(events={"cid": [other_event("cid", "start"), die_event("cid", code)]})
    assert container_end(docker, "cid", 1000.0) == {
        "oom": False, "exit_code": expected, "finished": FINISHED_NANO / 1e9}


def test_container_end_without_time_nano_uses_the_seconds():
    docker = FakeDocker(events={"cid": [die_event("cid", "0", nano=None)]})
    assert container_end(docker, "cid", 1000.0) == {
        "oom": False, "exit_code": 0, "finished": FINISHED_NANO // 10**9}


def test_container_end_understands_the_old_status_field():
    event = {"status": "die", "id": "cid", "Actor": {"Attributes": {"exitCode": "3"}},
             "timeNano": FINISHED_NANO}
    assert container_end(FakeDocker(events={"cid": [event]}), "cid", 1000.0) == {
        "oom": False, "exit_code": 3, "finished": FINISHED_NANO / 1e9}


def test_container_end_without_a_die_is_unknown():
    docker = FakeDocker(events={"cid": [other_event("cid", "start"), oom_event("cid")]})
    assert container_end(docker, "cid", 1000.0) is None
    assert container_end(FakeDocker(), "cid", 1000.0) is None


# --- 6. the hub's duties --------------------------------------------------------------------


class FakeEventLog:
    def __init__(self):
        self.appended: list[tuple[str, dict]] = []

    def append(self, event: str, **fields) -> None:
        self.appended.append((event, fields))


class FakePool:
    """The hub's GPU pool as UsageDuties uses it."""

    def __init__(self, docker: FakeDocker, hub_id: str = HUB):
        self.hub_id = hub_id
        self.docker_client = docker
        self.starting: set[str] = set()
        self.events = FakeEventLog()
        self.stopped: list[tuple[str, str]] = []

    async def stop_server(self, name: str, why: str) -> None:
        self.stopped.append((name, why))


def ran_session(ledger: Ledger, user: str, *, container_id: str | None = None,
                ready: float | None = 115.0, started: float | None = 110.0) -> int:
    session = open_session(ledger, user)
    container = f"jupyter-{user}"
    if started is not None:
        ledger.started(HUB, container, container_id or f"cid-{user}", when=started)
    if ready is not None:
        ledger.ready(HUB, container, when=ready)
    return session


def outcome(ledger: Ledger, session: int) -> tuple:
    found = row(ledger, session)
    return found["reason"], found["detail"], found["stopped"]


def test_record_end_from_the_inspected_container(ledger):
    docker = FakeDocker()
    ada = ran_session(ledger, "ada")
    assert record_end(ledger, docker, HUB, "jupyter-ada", {"State": {
        "Running": False, "OOMKilled": True, "ExitCode": 137,
        "FinishedAt": "2024-05-06T07:08:09Z"}}) == "oom"
    assert outcome(ledger, ada) == (
        "oom", "the container was killed for memory (exit code 137)", FINISHED)
    assert docker.event_calls == []  # the inspected state is enough


def test_record_end_from_the_engines_events_since_the_start(ledger):
    docker = FakeDocker(events={"cid-ada": [oom_event("cid-ada"), die_event("cid-ada")]})
    ada = ran_session(ledger, "ada", started=1000.5)
    assert record_end(ledger, docker, HUB, "jupyter-ada") == "oom"
    reason, detail, stopped = outcome(ledger, ada)
    assert (reason, detail) == ("oom", "the container was killed for memory (exit code 137)")
    assert stopped == pytest.approx(FINISHED + 0.123456789, abs=1e-6)
    assert [(c["since"], c["filters"]) for c in docker.event_calls] == [
        (999, {"type": "container", "container": "cid-ada"})]


def test_record_end_since_the_request_when_it_never_started(ledger):
    docker = FakeDocker()
    session = open_session(ledger, requested=2000.0)
    ledger.started(HUB, "jupyter-ada", "cid-ada", when=None)
    with ledger.engine.begin() as connection:  # a container id, but no start time known
        connection.execute(sessions.update().values(started=None))
    assert record_end(ledger, docker, HUB, "jupyter-ada") == "lost"
    assert [c["since"] for c in docker.event_calls] == [1999]
    assert outcome(ledger, session)[:2] == (
        "lost", "its container was gone, with no record of its end")


def test_record_end_without_a_container_id_or_open_session(ledger):
    docker = FakeDocker()
    assert record_end(ledger, docker, HUB, "jupyter-ada") is None
    session = open_session(ledger)  # asked for, never created
    assert record_end(ledger, docker, HUB, "jupyter-ada") == "lost"
    assert docker.event_calls == []
    reason, detail, _ = outcome(ledger, session)
    assert (reason, detail) == ("lost", "its container was gone, with no record of its end")


def test_record_end_when_the_engine_cannot_tell(ledger, caplog):
    docker = FakeDocker(fail=RuntimeError("engine unreachable"))
    ada = ran_session(ledger, "ada")
    ledger.fold([Sample(HUB, "jupyter-ada", 150.0)])
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert record_end(ledger, docker, HUB, "jupyter-ada", log=LOG) == "lost"
    assert outcome(ledger, ada) == (
        "lost", "its container was gone, with no record of its end", 150.0)
    assert [r.getMessage() for r in caplog.records] == [
        "Could not read how jupyter-ada ended from the engine: engine unreachable"]


def test_close_lost_closes_a_missing_container_at_the_second_check(ledger, caplog):
    docker = FakeDocker(names=["jupyter-ada"], events={
        "cid-bo": [oom_event("cid-bo"), die_event("cid-bo", "137")],
        "cid-cy": [die_event("cid-cy", "0", nano=None)]})
    pool = FakePool(docker)
    duties = UsageDuties(ledger, pool, retention_days=0, log=LOG)
    ada = ran_session(ledger, "ada")  # its container is there
    bo = ran_session(ledger, "bo")  # gone: killed for memory
    cy = ran_session(ledger, "cy")  # gone: exited by itself
    dee = ran_session(ledger, "dee")  # gone, the engine has no record of it
    ledger.fold([Sample(HUB, "jupyter-dee", 170.0)])
    eve = open_session(ledger, "eve")  # being started: no container yet
    pool.starting.add("jupyter-eve")
    assert duties.close_lost() == []
    assert set(ledger.open_containers(HUB).values()) == {ada, bo, cy, dee, eve}
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert duties.close_lost() == ["jupyter-bo", "jupyter-cy", "jupyter-dee"]
    assert ledger.open_containers(HUB) == {"jupyter-ada": ada, "jupyter-eve": eve}
    reason, detail, stopped = outcome(ledger, bo)
    assert (reason, detail) == ("oom", "the container was killed for memory (exit code 137)")
    assert stopped == pytest.approx(FINISHED + 0.123456789, abs=1e-6)
    assert outcome(ledger, cy) == (
        "stopped", "the server exited by itself", float(FINISHED_NANO // 10**9))
    assert outcome(ledger, dee) == (
        "lost", "its container was gone, with no record of its end", 170.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"Usage ledger: the session of jupyter-{name} closed ({reason}): its container is "
        "gone and no hub server stopped it" for name, reason in (
            ("bo", "oom"), ("cy", "stopped"), ("dee", "lost"))]
    assert docker.container_calls == [
        {"all": True, "filters": {"label": f"{HUB_LABEL}={HUB}"}}] * 2
    assert duties.close_lost() == []  # closed once


def test_close_lost_needs_two_checks_in_a_row(ledger):
    docker = FakeDocker(names=[])
    duties = UsageDuties(ledger, FakePool(docker), retention_days=0, log=LOG)
    ada = ran_session(ledger, "ada")
    assert duties.close_lost() == []  # missing once
    docker.names = ["jupyter-ada"]
    assert duties.close_lost() == []  # back: the count starts again
    docker.names = []
    assert duties.close_lost() == []  # missing once more
    assert row(ledger, ada)["stopped"] is None
    assert duties.close_lost() == ["jupyter-ada"]
    assert row(ledger, ada)["reason"] == "lost"


def test_close_lost_never_closes_a_server_being_started(ledger):
    pool = FakePool(FakeDocker(names=[]))
    duties = UsageDuties(ledger, pool, retention_days=0, log=LOG)
    ada = open_session(ledger)
    pool.starting.add("jupyter-ada")
    assert [duties.close_lost() for _ in range(3)] == [[], [], []]
    pool.starting.discard("jupyter-ada")  # its start failed without a close
    assert duties.close_lost() == []  # missing once, from here
    assert row(ledger, ada)["stopped"] is None
    assert duties.close_lost() == ["jupyter-ada"]


def test_close_lost_forgets_what_was_missing_once_nothing_is_open(ledger):
    docker = FakeDocker(names=[])
    duties = UsageDuties(ledger, FakePool(docker), retention_days=0, log=LOG)
    assert duties.close_lost() == []
    assert docker.container_calls == []  # nothing open: the engine is not asked
    ran_session(ledger, "ada")
    assert duties.close_lost() == []
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    assert duties.close_lost() == []  # nothing open: forgets ada's miss
    session = ran_session(ledger, "ada")  # a new session of the same container
    assert duties.close_lost() == []  # its first miss
    assert row(ledger, session)["stopped"] is None


def test_close_lost_leaves_other_hubs_sessions_alone(ledger):
    duties = UsageDuties(ledger, FakePool(FakeDocker(names=[])), retention_days=0, log=LOG)
    other = open_session(ledger, hub=OTHER_HUB)
    assert [duties.close_lost() for _ in range(3)] == [[], [], []]
    assert row(ledger, other)["stopped"] is None


def stopped_session(ledger: Ledger, user: str, stopped: float, groups=("cs101",)) -> int:
    session = open_session(ledger, user, groups=groups, requested=stopped - 10)
    ledger.close(HUB, f"jupyter-{user}", "lost", when=stopped)
    return session


def test_tick_prunes_past_the_retention_once_a_day(ledger, caplog):
    now = 1000 * DAY
    duties = UsageDuties(ledger, FakePool(FakeDocker(names=["jupyter-run"])),
                         retention_days=30, log=LOG)
    stopped_session(ledger, "old", now - 31 * DAY)
    kept = stopped_session(ledger, "kept", now - 29.5 * DAY)
    running = open_session(ledger, "run", requested=now - 400 * DAY)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(duties.tick(now))
    assert [r["id"] for r in all_rows(ledger)] == [kept, running]
    assert [r.getMessage() for r in caplog.records] == [
        "Usage ledger: 1 sessions older than 30 days deleted"]
    later = stopped_session(ledger, "later", now - 40 * DAY)
    asyncio.run(duties.tick(now + PRUNE_EVERY - 1))  # within a day of the last: not pruned
    assert [r["id"] for r in all_rows(ledger)] == [kept, running, later]
    asyncio.run(duties.tick(now + PRUNE_EVERY))
    assert [r["id"] for r in all_rows(ledger)] == [running]  # kept is 30.5 days old by then
    assert group_rows(ledger) == []


async def test_tick_without_a_retention_never_prunes_and_still_closes_the_lost(ledger):
    duties = UsageDuties(ledger, FakePool(FakeDocker(names=[])), retention_days=0, log=LOG)
    old = stopped_session(ledger, "old", 10.0)
    gone = ran_session(ledger, "gone")
    await duties.tick(1000 * DAY)
    await duties.tick(2000 * DAY)
    assert [r["id"] for r in all_rows(ledger)] == [old, gone]
    assert row(ledger, gone)["reason"] == "lost"


def test_the_duties_take_the_pools_hub(ledger):
    duties = UsageDuties(ledger, FakePool(FakeDocker(), hub_id="hub-z"), retention_days=1,
                         log=LOG)
    assert (duties.hub_id, duties.interval, duties_module.INTERVAL) == ("hub-z", 60.0, 60.0)


# --- 7. LedgerWriter ------------------------------------------------------------------------


class FakeSlowLedger:
    """Records which thread ran each call; the first call is the slowest."""

    def __init__(self):
        self.calls: list[tuple[str, int, str]] = []

    def note(self, label: str, delay: float) -> str:
        time.sleep(delay)
        current = threading.current_thread()
        self.calls.append((label, current.ident, current.name))
        return label.upper()


async def test_the_writer_runs_calls_in_order_on_one_thread_of_its_own():
    fake = FakeSlowLedger()
    writer = LedgerWriter(fake, LOG)
    labels = [f"call{i}" for i in range(6)]
    answers = await asyncio.gather(*(writer.note(label, 0.03 if i == 0 else 0.0)
                                     for i, label in enumerate(labels)))
    assert answers == [label.upper() for label in labels]
    assert [c[0] for c in fake.calls] == labels
    assert len({c[1] for c in fake.calls}) == 1
    assert fake.calls[0][1] != threading.get_ident()  # not the event loop's thread
    assert fake.calls[0][2].startswith("quota-ledger")


async def test_the_writer_on_a_real_ledger(ledger):
    writer = LedgerWriter(ledger, LOG)
    session = await writer.open(hub=HUB, user="ada", container="jupyter-ada", role="gpu",
                                image="torch", cpu_limit=4.0, mem_limit=16 * G,
                                requested=100.0)
    await writer.started(HUB, "jupyter-ada", "cid-ada", when=110.0)
    await writer.ready(HUB, "jupyter-ada", when=115.0)
    assert await writer.hint(HUB, "jupyter-ada", "preempted") is True
    assert await writer.close(HUB, "jupyter-ada", "stopped", when=200.0) == session
    assert outcome(ledger, session) == ("preempted", None, 200.0)


async def test_a_failing_call_is_logged_and_answers_none(ledger, caplog):
    writer = LedgerWriter(ledger, LOG)
    open_session(ledger)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        assert await writer.close(HUB, "jupyter-ada", "bored") is None
        assert await writer.call(ledger.hint, HUB, "jupyter-ada", "nope") is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "Usage ledger: close failed: bored"),
        (logging.ERROR, "Usage ledger: hint failed: nope")]
    assert await writer.open_containers(HUB) == {"jupyter-ada": 1}  # it goes on


async def test_no_ledger_answers_every_call_with_none():
    for name in ("open", "set_gpus", "started", "ready", "hint", "close", "anything"):
        call = getattr(NO_LEDGER, name)(HUB, "jupyter-ada", reason="stopped")
        assert asyncio.iscoroutine(call)
        assert await call is None


# --- 8. the culler's reasons and the watchdog's samples ------------------------------------


def culled_server(user: str = "ada", name: str = "", prefix: str = "/") -> dict:
    return {"name": name, "full_name": f"{user}/{name}",
            "url": f"{prefix}user/{user}/{name + '/' if name else ''}"}


def test_the_culler_hints_the_users_open_session_by_server_name(ledger):
    default = open_session(ledger, container="jupyter-ada")
    named = open_session(ledger, container="jupyter-ada-train", server="train")
    reasons = CullReasons(ledger.url, LOG)
    asyncio.run(reasons.tell(culled_server(name="train"), "culled"))
    assert [row(ledger, s)["hint"] for s in (default, named)] == [None, "culled"]
    asyncio.run(reasons.tell(culled_server(), "max-age"))
    assert [row(ledger, s)["hint"] for s in (default, named)] == ["max-age", "culled"]
    ledger.ready(HUB, "jupyter-ada", when=115.0)
    ledger.ready(HUB, "jupyter-ada-train", when=115.0)
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    ledger.close(HUB, "jupyter-ada-train", "stopped", when=200.0)
    assert [row(ledger, s)["reason"] for s in (default, named)] == ["max-age", "culled"]


def test_an_escaped_user_name_is_unquoted(ledger):
    session = open_session(ledger, "ada@lab.org", container="jupyter-ada-40lab-2eorg")
    asyncio.run(CullReasons(ledger.url, LOG).tell(
        {"name": "", "url": "/user/ada%40lab.org/"}, "culled"))
    assert row(ledger, session)["hint"] == "culled"


def test_a_ledger_not_created_yet_is_a_warning_and_the_next_cull_tries_again(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'later' / 'usage.sqlite'}"
    reasons = CullReasons(url, LOG)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        asyncio.run(reasons.tell(culled_server(), "culled"))  # does not raise
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(
        logging.WARNING,
        f"Could not tell the usage ledger why ada is culled: the usage ledger at {url} does "
        "not exist yet; the hub creates it when it starts (or run: quota-spawner ledger "
        "upgrade)")]
    ledger = Ledger(url, LOG)  # the hub starts
    session = open_session(ledger)
    asyncio.run(reasons.tell(culled_server(), "culled"))
    assert row(ledger, session)["hint"] == "culled"
    ledger.dispose()


def test_without_a_ledger_the_culler_tells_nothing(tmp_path):
    for url in ("", "none"):
        asyncio.run(CullReasons(url, LOG).tell(culled_server(), "culled"))
    assert list(tmp_path.iterdir()) == []


QUOTAS = """\
images:
  pt: {image: quota-spawner/pytorch:latest}
roles:
  quick: {cpus: 1, memory: 1G, images: [pt], idle_timeout: 20m}
  long-run: {cpus: 1, memory: 1G, images: [pt], max_age: 72h}
assignments:
  default: [quick]
"""


def test_the_arbiter_tells_the_ledger_culled_or_max_age(ledger, tmp_path):
    from datetime import timedelta

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    arbiter = make_arbiter(str(quotas), log=LOG, usage_db=ledger.url)
    idle = open_session(ledger, "ada")
    old = open_session(ledger, "bo")
    started = (datetime.now(timezone.utc) - timedelta(hours=80)).isoformat()
    assert asyncio.run(arbiter(
        inactive=timedelta(minutes=25), inactive_limit=3600,
        server=dict(culled_server("ada"), started=started,
                    user_options={"profile": "quick"})))
    assert asyncio.run(arbiter(
        inactive=timedelta(minutes=1), inactive_limit=3600,
        server=dict(culled_server("bo"), started=started,
                    user_options={"profile": "long-run"})))
    assert [row(ledger, s)["hint"] for s in (idle, old)] == ["culled", "max-age"]


def test_the_culler_hints_the_right_user_under_a_base_url(ledger):
    session = open_session(ledger)
    asyncio.run(CullReasons(ledger.url, LOG).tell(culled_server(prefix="/jhub/"), "culled"))
    assert row(ledger, session)["hint"] == "culled"


def nb_server(name: str, gpus=(), hub: str = HUB) -> Server:
    return Server(container_id=f"id-{name}", name=name, user=name, role="r", image="i",
                  hub_id=hub, gpus=tuple(gpus), gpu_mode="exclusive" if gpus else "")


def test_usage_samples_from_a_snapshot():
    snapshot = Snapshot(time=500.0, host="gpu-host-1", gpus={
        "GPU-a": GpuSample("GPU-a", 0, utilization=0.25),
        "GPU-b": GpuSample("GPU-b", 1, utilization=0.75),
        "GPU-c": GpuSample("GPU-c", 2, utilization=None, lost="GPU is lost"),
        "GPU-d": GpuSample("GPU-d", 3, utilization=1.0),  # nobody's
    }, servers={
        "id-two": ServerSample(nb_server("two", ["GPU-a", "GPU-b"]),
                               gpu_memory={"GPU-a": 3 * G, "GPU-b": G},
                               memory_working_set=2 * G, cpu_used=1.5, oom_kills=2),
        "id-cpu": ServerSample(nb_server("cpu", hub=OTHER_HUB), memory_working_set=G,
                               cpu_used=0.25, gpu_memory={"GPU-a": 5}),
        "id-blind": ServerSample(nb_server("blind", ["GPU-c", "GPU-gone"])),
    })
    assert usage_samples(snapshot) == [
        Sample(hub=HUB, container="two", time=500.0, cpu=1.5, memory=2 * G, gpu_util=0.5,
               gpu_memory=4 * G, oom_kills=2),
        Sample(hub=OTHER_HUB, container="cpu", time=500.0, cpu=0.25, memory=G,
               gpu_util=None, gpu_memory=None, oom_kills=0),
        Sample(hub=HUB, container="blind", time=500.0, cpu=None, memory=None, gpu_util=None,
               gpu_memory=0, oom_kills=0),
    ]
    assert usage_samples(Snapshot(time=1.0, host="h")) == []


def test_the_watchdog_folds_its_samples_once_the_hub_made_the_ledger(url, caplog):
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=url)
    watchdog.log = LOG
    snapshot = Snapshot(time=500.0, host="h", servers={
        "id-ada": ServerSample(nb_server("jupyter-ada"), cpu_used=0.5, memory_working_set=G)})
    with caplog.at_level(logging.INFO, logger=LOG.name):
        watchdog.record_usage(snapshot)
        watchdog.record_usage(snapshot)  # the same trouble is logged once
        ledger = Ledger(url, LOG)
        session = open_session(ledger)
        ran(ledger)
        caplog.clear()
        watchdog.record_usage(snapshot)
    assert [r.getMessage() for r in caplog.records if r.name == LOG.name] == [
        f"Recording usage samples in {url}", "Usage samples are recorded again"]
    assert usage(ledger, session) == dict(
        last_seen=500.0, cpu_samples=1, cpu_sum=0.5, cpu_peak=0.5, mem_samples=1,
        mem_sum=float(G), mem_peak=G, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None,
        gpu_mem_sum=0.0, gpu_mem_peak=None, oom_kills=0)
    ledger.dispose()


def test_the_watchdog_logs_a_missing_ledger_once(url, caplog):
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=url)
    watchdog.log = LOG
    with caplog.at_level(logging.INFO, logger=LOG.name):
        watchdog.record_usage(Snapshot(time=1.0, host="h"))
        watchdog.record_usage(Snapshot(time=2.0, host="h"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOG.name] == [(
        logging.WARNING,
        f"Cannot record usage samples (the usage ledger at {url} does not exist yet; the hub "
        "creates it when it starts (or run: quota-spawner ledger upgrade)); trying again "
        "each cycle")]


def test_the_watchdog_finds_the_hubs_ledger_in_the_hubs_state_folder(monkeypatch, tmp_path):
    from spawner.watchdog.app import QuotaWatchdog

    monkeypatch.delenv("QUOTA_SPAWNER_USAGE_DB", raising=False)
    monkeypatch.delenv("QUOTA_SPAWNER_STATE_DIR", raising=False)
    assert QuotaWatchdog().usage_db == ""  # no state folder named: no guess
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    assert QuotaWatchdog().usage_db == f"sqlite:///{tmp_path / 'quota-spawner-usage.sqlite'}"
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", "postgresql://q@db/usage")
    assert QuotaWatchdog().usage_db == "postgresql://q@db/usage"
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", "")  # set empty: not recorded
    assert QuotaWatchdog().usage_db == ""
