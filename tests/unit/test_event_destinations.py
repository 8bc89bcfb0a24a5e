"""Where the hub's event log goes (spawner/usage/event_log.py ``events_path``): with a ledger, its
``events`` table only; the file quota-spawner-events.jsonl in the state folder only
without a ledger, or a file an admin names (``events_file``) besides the table. Both the
hub's runtime (spawner/docker/runtime.py) and the usage service (spawner/webapp/app.py)
choose so; a database that fails is logged and never fails the caller."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from runtime_source import LOG, source
from sqlalchemy import create_engine

from spawner.common.registry import Registry
from spawner.docker.runtime import HubRuntime
from spawner.policy import hub as hub_object
from spawner.policy.config import QuotaConfig
from spawner.usage import event_store
from spawner.usage.event_log import EVENTS_FILE, TABLE, events_path
from spawner.usage.ledger import Ledger
from spawner.watchdog.service import watchdog_service
from spawner.webapp.app import QuotaWebApp, webapp_service


@pytest.fixture(autouse=True)
def fresh_runtimes(monkeypatch):
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    monkeypatch.delenv("QUOTA_SPAWNER_EVENTS_FILE", raising=False)
    monkeypatch.delenv("QUOTA_SPAWNER_USAGE_DB", raising=False)
    yield
    for runtime in hub_object.HUBS.values():
        runtime.close()


def stored(url: str) -> list[dict]:
    engine = create_engine(url)
    try:
        return event_store.read_after(engine, 0)[0]
    finally:
        engine.dispose()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("state, named, ledger, path", [
    ("/srv/state", "", True, ""),  # the table only
    ("/srv/state", "", False, f"/srv/state/{EVENTS_FILE}"),
    ("", "", False, ""),  # nowhere to put it (the usage service without a state folder)
    ("/srv/state", "/var/log/hub.jsonl", True, "/var/log/hub.jsonl"),
    ("/srv/state", "hub.jsonl", True, "/srv/state/hub.jsonl"),  # relative: in the folder
    ("/srv/state", "hub.jsonl", False, "/srv/state/hub.jsonl"),
    ("", "hub.jsonl", True, "hub.jsonl"),
])
def test_the_file_only_without_a_ledger_or_when_named(state, named, ledger, path):
    assert events_path(state, named, ledger) == path


def test_the_spawners_setting_is_the_watchdogs_variable(monkeypatch):
    assert QuotaConfig().events_file == ""
    monkeypatch.setenv("QUOTA_SPAWNER_EVENTS_FILE", "/var/log/hub.jsonl")
    assert QuotaConfig().events_file == "/var/log/hub.jsonl"
    assert QuotaWebApp().events_file == "/var/log/hub.jsonl"
    # the hub's managed services are given it, so all three mean the same file
    service, _, _ = webapp_service("http://hub", "sqlite:///x", "quotas.yaml")
    assert service["environment"]["QUOTA_SPAWNER_EVENTS_FILE"] == "/var/log/hub.jsonl"
    watchdog, _ = watchdog_service("http://hub", state_dir="/srv/state")
    assert watchdog["environment"]["QUOTA_SPAWNER_EVENTS_FILE"] == "/var/log/hub.jsonl"


# --- the hub's runtime --------------------------------------------------------------------


async def built(tmp_path: Path, **settings) -> HubRuntime:
    spawner = source(tmp_path, **settings)
    return await HubRuntime.of(spawner).built(spawner)


async def test_with_a_ledger_the_hub_writes_the_table_and_no_file(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    with caplog.at_level(logging.INFO, logger=LOG.name):
        runtime = await built(tmp_path, usage_db=url)
    written = runtime.events.append("queued", hub="hub-rt", user="ann", position=1)
    runtime.events.flush()
    assert stored(url) == [written]
    assert not (tmp_path / EVENTS_FILE).exists()
    assert runtime.events.path == "" and runtime.events.where == TABLE
    assert any(r.getMessage().endswith(f"event log {TABLE}") for r in caplog.records)


async def test_without_a_ledger_the_hub_writes_the_state_folders_file(tmp_path):
    runtime = await built(tmp_path, usage_db="none")
    written = runtime.events.append("queued", hub="hub-rt", user="ann", position=1)
    runtime.events.flush()
    assert runtime.events.store is None
    assert lines(tmp_path / EVENTS_FILE) == [written]


async def test_a_named_file_is_written_beside_the_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    runtime = await built(tmp_path, usage_db=url, events_file="hub-events.jsonl")
    written = runtime.events.append("preempted", hub="hub-rt", user="ann")
    runtime.events.flush()
    assert stored(url) == [written] == lines(tmp_path / "hub-events.jsonl")
    assert not (tmp_path / EVENTS_FILE).exists()
    assert runtime.events.where == f"{TABLE} and {tmp_path / 'hub-events.jsonl'}"


async def test_a_ledger_that_cannot_be_opened_leaves_the_events_in_the_file(tmp_path):
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a database, " * 512)
    runtime = await built(tmp_path, usage_db=f"sqlite:///{broken}")
    assert runtime.usage is None  # the hub runs without its ledger (logged)
    written = runtime.events.append("queued", hub="hub-rt", user="ann", position=1)
    runtime.events.flush()
    assert lines(tmp_path / EVENTS_FILE) == [written]


async def test_a_table_that_fails_is_logged_and_the_append_returns(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    runtime = await built(tmp_path, usage_db=url)
    with runtime.usage.ledger.engine.begin() as db:
        db.exec_driver_sql("DROP TABLE events")
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        written = runtime.events.append("queued", hub="hub-rt", user="ann", position=1)
        runtime.events.flush()
    assert written["event"] == "queued"
    assert [r.getMessage().split(" (")[0] for r in caplog.records
            if "Event log" in r.getMessage()] == ["Event log: could not add queued to the "
                                                   "database"]
    assert not (tmp_path / EVENTS_FILE).exists()  # no file unless named


# --- the usage service (role requests) ----------------------------------------------------


def service_log(tmp_path: Path, **settings):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return QuotaWebApp(state_dir=str(state), hub_id="hub-u", **settings).setup().events, state


def test_with_a_ledger_the_service_writes_the_table_and_no_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    log, state = service_log(tmp_path, usage_db=url)
    written = log.append("role-request", hub="hub-u", user="ann")
    log.flush()
    assert stored(url) == [written]
    assert list(state.iterdir()) == []


def test_without_a_ledger_the_service_writes_the_file(tmp_path):
    log, state = service_log(tmp_path, usage_db="none")
    written = log.append("role-request", hub="hub-u", user="ann")
    log.flush()
    assert log.store is None  # "none" is no URL to write to
    assert lines(state / EVENTS_FILE) == [written]


def test_the_service_writes_a_named_file_beside_the_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    named = tmp_path / "hub-events.jsonl"
    log, state = service_log(tmp_path, usage_db=url, events_file=str(named))
    written = log.append("role-request", hub="hub-u", user="ann")
    log.flush()
    assert stored(url) == [written] == lines(named)
    assert list(state.iterdir()) == []
