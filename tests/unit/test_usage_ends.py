"""How a session's end is read and recorded: the engine's state or its events
(``ended``, ``failure``, ``docker_time``, ``container_end``), and the hub's periodic duties
(``record_end``, closing the lost, pruning). Real SQLite files in tmp_path; the engine, the
pool and the event log are fakes. The ledger's fixtures are tests/conftest.py's, its
helpers tests/ledger_sessions.py's."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from ledger_sessions import (
    DAY,
    FINISHED,
    FINISHED_AT,
    FINISHED_NANO,
    HUB,
    LOG,
    OTHER_HUB,
    all_rows,
    group_rows,
    open_session,
    outcome,
    row,
)
from tornado.web import HTTPError

from spawner.contract import HUB_LABEL
from spawner.docker.engine import container_end, docker_time
from spawner.usage import duties as duties_module
from spawner.usage import event_store
from spawner.usage.duties import PRUNE_EVERY, UsageDuties, record_end
from spawner.usage.ledger import (
    Ledger,
    Sample,
    ended,
    failure,
)
from spawner.usage.schema import sessions

pytestmark = pytest.mark.usefixtures("quiet_alembic")

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
    event_store.append(ledger.engine, [{"time": now - 31 * DAY, "event": "old"},
                                       {"time": now - 29 * DAY, "event": "kept"}])
    later = stopped_session(ledger, "later", now - 40 * DAY)
    asyncio.run(duties.tick(now + PRUNE_EVERY - 1))  # within a day of the last: not pruned
    assert [r["id"] for r in all_rows(ledger)] == [kept, running, later]
    asyncio.run(duties.tick(now + PRUNE_EVERY))
    assert [r["id"] for r in all_rows(ledger)] == [running]  # kept is 30.5 days old by then
    assert group_rows(ledger) == []
    # the event log has the same retention
    assert [e["event"] for e in event_store.read_after(ledger.engine, 0)[0]] == ["kept"]


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
