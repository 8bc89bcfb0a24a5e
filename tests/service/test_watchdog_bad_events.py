"""One bad hub event never silences the rest of the cycle.

Any user can make a role request that starts in the year 318857, and the hub's
event log is another program's file: NaN, wrong types. The watchdog reads,
words and sends each event on its own, so the good ones around a bad one are
delivered, in the log's order, and the bad one is one line in the log.

Pure: the hub's event log in a temporary folder, the watchdog app without an
engine or NVML (as test_watchdog_events.py builds it), and the real local HTTP
receiver (tests/receivers.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from receivers import HttpReceiver

from spawner.usage.events import RoleRequestEvent
from spawner.watchdog import hub_words
from spawner.watchdog.app import QuotaWatchdog, describe_hub_event
from spawner.watchdog.hub_words import Words
from spawner.watchdog.metrics import WatchdogMetrics
from spawner.watchdog.model import Snapshot
from spawner.watchdog.notify import Notifier
from spawner.watchdog.rules import Event, IncidentBook, WatchdogRules

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"


class Hub:
    """What the app asks the hub's API: a user's groups."""

    def groups_for(self, user: str) -> list[str]:
        return {"student1": ["cs101"], "mallory": ["cs101"]}.get(user, [])


def app(events_file: Path) -> QuotaWatchdog:
    watchdog = QuotaWatchdog(hub_id=HUB_ID, hub_url=HUB_URL, host_name="gpu-host-1",
                             events_file=str(events_file))
    watchdog.log = logging.getLogger("test-watchdog")  # the app's own does not propagate
    watchdog.rules = WatchdogRules(parent=watchdog)
    watchdog.notifier = Notifier(parent=watchdog, log=watchdog.log, timeout=2.0,
                                 retry_delay=0.05)
    watchdog.metrics = WatchdogMetrics()
    watchdog.book = IncidentBook()
    watchdog.hub = Hub()
    watchdog._sending = set()
    return watchdog


def asked(**kw) -> dict:
    return dict(event="role-request", hub=HUB_ID, time=T, id=1, user="student1",
                role="gpu-training", starts=T, ends=T + 7 * DAY, reason="For my thesis.",
                who="student1", comment="",
                text="student1 asks for the role 'gpu-training' from 2026-11-18 11:06 UTC "
                     "to 2026-11-25 11:06 UTC: For my thesis.") | kw


def approved(**kw) -> dict:
    return asked(event="role-request-approved", who="prof-ada", comment="ok",
                 text="Your request for the role 'gpu-training' was approved by prof-ada; "
                      "you hold it from 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC: ok"
                 ) | kw


# Each broken in its own way, as a user (or a damaged file) can make them.
BROKEN = [
    # a request for the year 318857, as the usage service wrote it
    asked(id=2, user="mallory", starts=1e13, ends=1e13 + DAY, text=""),
    # NaN and infinity where times are
    asked(id=3, user="mallory", time=float("nan"), starts=float("nan"), ends=float("inf")),
    # wrong types everywhere
    asked(id=[4], user="mallory", time="yesterday", starts={"a": 1}, ends=None, role=7,
          reason=["x"], text={"t": 1}),
    # a preemption whose deadline is out of range, a budget of infinite share
    dict(event="preemption", hub=HUB_ID, time=T, user="mallory", by="bob",
         container="quota-mallory", deadline=1e13, grace_period=float("inf"), ran_for=-1e300),
    dict(event="budget-spent", hub=HUB_ID, time=1e13, user="mallory", budget_kind="group",
         budget_name="cs101", used=1e308, gpu_hours=1e-308, resets_at=float("nan")),
]


def write(path: Path, *events: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:  # NaN as Python's json writes it
        for event in events:
            f.write(json.dumps({"version": 1, **event}) + "\n")


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    path = tmp_path / "quota-spawner-events.jsonl"
    path.write_text("")
    return path


def titles(receiver: HttpReceiver, count: int) -> list[str]:
    return [r.body["title"] for r in receiver.wait(count)]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda e: f"{e['event']}-{e.get('id', '')}")
async def test_a_broken_event_between_two_good_ones(events_file, broken, caplog):
    watchdog = app(events_file)
    snapshot = Snapshot(time=T + 3, host="gpu-host-1")
    assert await watchdog.hub_events(snapshot) == []  # the first read starts at the end
    write(events_file, asked(), broken, approved())
    with caplog.at_level(logging.INFO, logger="test-watchdog"):
        told = await watchdog.hub_events(snapshot)
        with HttpReceiver() as receiver:
            port = receiver.base.rsplit(":", 1)[1]
            watchdog.notifier.channels = [{"name": "admins",
                                           "url": f"json://127.0.0.1:{port}/admins"}]
            await watchdog.notify_in_order(told)
            got = titles(receiver, len(told))
    # both good ones, in the log's order around the broken one
    good = [t for t in got if "student1" in t]
    assert good == ["[info] student1 asks for the role gpu-training",
                    "[info] student1's request for the role gpu-training approved by "
                    "prof-ada"]
    assert got.index(good[0]) == 0 and got.index(good[1]) == len(got) - 1
    assert "Traceback" not in caplog.text and "Task exception" not in caplog.text
    assert "an invalid time" not in "".join(good)


async def test_the_year_318857_is_told_as_an_invalid_time(events_file):
    watchdog = app(events_file)
    await watchdog.hub_events(Snapshot(time=T + 3, host="gpu-host-1"))
    write(events_file, BROKEN[0])
    (event,) = await watchdog.hub_events(Snapshot(time=T + 3, host="gpu-host-1"))
    body = watchdog.notifier.message(event, now=T + 5).body
    assert "Window: from an invalid time (1e+13) to an invalid time (1e+13)" in body


async def test_an_event_that_cannot_be_worded_is_one_line_and_the_rest_go_on(
        events_file, caplog, monkeypatch):
    """Whatever else may break in wording an event: the others are told, in order."""
    real = hub_words.role_request

    def fragile(event: RoleRequestEvent) -> Words:
        if event.id == 2:
            raise ValueError("year 318857 is out of range")
        return real(event)

    monkeypatch.setattr(hub_words, "role_request", fragile)
    watchdog = app(events_file)
    snapshot = Snapshot(time=T + 3, host="gpu-host-1")
    await watchdog.hub_events(snapshot)
    write(events_file, asked(), asked(id=2, user="mallory"), approved())
    with caplog.at_level(logging.INFO, logger="test-watchdog"):
        told = await watchdog.hub_events(snapshot)
        assert await watchdog.hub_events(snapshot) == []  # read once: logged once
    assert [e.incident.key for e in told] == ["role_request:1:role-request",
                                              "role_request:1:role-request-approved"]
    (line,) = [r for r in caplog.records if "Cannot tell" in r.getMessage()]
    assert line.getMessage() == (
        f"Cannot tell the hub's event role-request 2 of mallory at {T:g} (ValueError: year "
        "318857 is out of range); it is skipped")
    assert line.exc_info is None and "Traceback" not in caplog.text


async def test_a_message_that_cannot_be_made_is_one_line_and_the_rest_go_on(
        events_file, caplog, monkeypatch):
    watchdog = app(events_file)
    await watchdog.hub_events(Snapshot(time=T + 3, host="gpu-host-1"))
    write(events_file, asked(), asked(id=2, user="mallory"), approved())
    told = await watchdog.hub_events(Snapshot(time=T + 3, host="gpu-host-1"))
    real = watchdog.notifier.message

    def fragile(event: Event, now: float | None = None):
        if event.incident.key == "role_request:2:role-request":
            raise ValueError("year 318857 is out of range")
        return real(event, now)

    monkeypatch.setattr(watchdog.notifier, "message", fragile)
    with caplog.at_level(logging.INFO, logger="test-watchdog"), HttpReceiver() as receiver:
        port = receiver.base.rsplit(":", 1)[1]
        watchdog.notifier.channels = [{"name": "admins",
                                       "url": f"json://127.0.0.1:{port}/admins"}]
        watchdog._spawn(watchdog.notify_in_order(told))  # as a cycle sends them
        await asyncio.gather(*watchdog._sending)
        got = titles(receiver, 2)
    assert got == ["[info] student1 asks for the role gpu-training",
                   "[info] student1's request for the role gpu-training approved by prof-ada"]
    (line,) = [r for r in caplog.records if "Cannot tell" in r.getMessage()]
    assert line.getMessage() == ("Cannot tell open of role_request:2:role-request "
                                 "(ValueError: year 318857 is out of range); it is skipped")
    assert "Traceback" not in caplog.text


async def test_a_sending_task_that_fails_is_one_line(caplog):
    watchdog = app(Path("/nonexistent"))

    async def broken() -> None:
        raise RuntimeError("a bug\nwith two lines")

    with caplog.at_level(logging.INFO, logger="test-watchdog"):
        watchdog._spawn(broken())
        await asyncio.gather(*watchdog._sending, return_exceptions=True)
        await asyncio.sleep(0)  # the done callback
    assert "Sending failed (RuntimeError: a bug\\nwith two lines)" in caplog.text
    assert not watchdog._sending


def test_an_event_is_named_safely_in_the_log():
    assert describe_hub_event(asked(id=7)) == f"role-request 7 of student1 at {T:g}"
    assert describe_hub_event({"event": "x\ny", "id": [1], "user": 3, "time": "now"}) == \
        '"x\\ny" "[1]" at "\'now\'"'
    assert describe_hub_event({}) == "(no kind)"
