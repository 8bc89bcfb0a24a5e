"""One user's flood reaches no one else: a channel gets at most
``Notifier.user_message_limit`` messages about one user in ``user_message_period``, and
one digest of the rest once it ends; the user's own channel gets every message about
them (the decisions on their requests among them). The counts are kept with the
incidents, so a restart neither lifts the limit nor loses a digest.

Real notifier and watchdog app, real local HTTP receivers (tests/receivers.py), the
hub's own event log; the clock is the test's where the notifier takes one. No engine, no
NVML, no hub.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

import pytest
from receivers import HttpReceiver
from traitlets import TraitError

from spawner.usage.event_log import EventLog
from spawner.watchdog.app import QuotaWatchdog
from spawner.watchdog.hub_events import role_request_events
from spawner.watchdog.limits import MessageLimits
from spawner.watchdog.metrics import WatchdogMetrics
from spawner.watchdog.model import Snapshot
from spawner.watchdog.notify import Notifier
from spawner.watchdog.rules import Event, Incident, IncidentBook, WatchdogRules

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
HOUR = 3600.0
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"
GROUPS = {"student1": ["cs101"], "bob": ["cs101"]}


def request_event(n: int, kind: str = "role-request", user: str = "student1", **kw) -> dict:
    """The hub's event of request ``n``, as spawner.usage.grants words it."""
    role = f"lab-{n:02d}"
    texts = {"role-request": f"{user} asks for the role '{role}' from 2026-11-18 11:06 UTC "
                             "to 2026-11-19 11:06 UTC: let me in",
             "role-request-withdrawn": f"{user} withdrew the request for the role '{role}'.",
             "role-request-approved": f"Your request for the role '{role}' was approved by "
                                      "admin; you hold it from 2026-11-18 11:06 UTC to "
                                      "2026-11-19 11:06 UTC.",
             "role-request-refused": f"Your request for the role '{role}' was refused by "
                                     "admin: no"}
    who = "admin" if kind in ("role-request-approved", "role-request-refused") else user
    return dict(event=kind, hub=HUB_ID, time=T + n, id=n, user=user, role=role, starts=T,
                ends=T + DAY, reason="let me in", who=who, comment="", text=texts[kind]) | kw


def told(events: list[dict]) -> list[Event]:
    return role_request_events(events, WatchdogRules(), Snapshot(time=T, host="gpu-host-1"))


def notifier(receiver: HttpReceiver, **kw) -> Notifier:
    port = receiver.base.rsplit(":", 1)[1]
    return Notifier(hub_url=HUB_URL, host="gpu-host-1", timeout=2.0, retry_delay=0.05,
                    channels=[{"name": name, "url": f"json://127.0.0.1:{port}/{name}",
                               **routing}
                              for name, routing in (("admins", {}),
                                                    ("cs101", {"groups": ["cs101"]}),
                                                    ("student1", {"users": ["student1"]}))],
                    **kw)


def titles(receiver: HttpReceiver, path: str) -> list[str]:
    return [r.body["title"] for r in list(receiver.requests) if r.path == f"/{path}"]


def digest_lines(held: int, kinds: str, user: str = "student1") -> list[str]:
    return [
        f"What: From 2026-11-18 11:06 UTC to 2026-11-18 12:06 UTC, {held + 5} messages about "
        f"{user} came for this channel; the first 5 were sent and these {held} held: {kinds}.",
        f"Who: {user}",
        "Host: gpu-host-1",
        "At: 2026-11-18 12:06:40 UTC",
        "What to do: Each held message is in the watchdog's log in full. The usage service's "
        "requests page lists the user's role requests, and the quota table's requests: "
        "max_open limits how many may wait.",
        f"Incident: digest:{user}",
    ]


async def test_a_flood_of_fifty_requests_is_five_messages_and_one_digest_per_channel():
    """50 requests of student1 (an ask and a withdrawal, 25 times): admins and the class's
    channel each get 5 messages and, when the hour ends, one digest of the other 45; the
    user's own channel, every withdrawal; another user's request goes through at once."""
    flood = [request_event(n, "role-request" if n % 2 == 0 else "role-request-withdrawn")
             for n in range(50)]
    with HttpReceiver() as receiver:
        channels = notifier(receiver)
        for n, event in enumerate(told(flood)):
            await channels.send(event, GROUPS, now=T + n)
        bob = await channels.send(told([request_event(7, user="bob")])[0], GROUPS, now=T + 60)
        assert bob == {"admins": True, "cs101": True}
        assert await channels.send_digests(now=T + HOUR - 1) == []  # the hour goes on
        sent = await channels.send_digests(now=T + HOUR)
        assert await channels.send_digests(now=T + HOUR + 5) == []  # each told once
    assert sorted(sent) == [("admins", True), ("cs101", True)]
    admins = titles(receiver, "admins")
    assert len(admins) == 5 + 1 + 1  # student1's five, bob's one, the digest
    assert admins[:5] == [
        "[info] student1 asks for the role lab-00",
        "[info] student1 withdrew the request for the role lab-01",
        "[info] student1 asks for the role lab-02",
        "[info] student1 withdrew the request for the role lab-03",
        "[info] student1 asks for the role lab-04"]
    assert admins[5] == "[info] bob asks for the role lab-07"
    assert admins[6] == "[info] 45 messages about student1 held: over 5 in 1h"
    digest = [r.body["message"] for r in receiver.requests if r.path == "/admins"][-1]
    assert digest.splitlines() == digest_lines(
        45, "23 role-request-withdrawn, 22 role-request")
    # the class's channel gets the asks only (25): 5, and a digest of the other 20
    cs101 = titles(receiver, "cs101")
    assert cs101[:5] == [f"[info] student1 asks for the role lab-{n:02d}"
                         for n in range(0, 10, 2)]
    assert cs101[5:] == ["[info] bob asks for the role lab-07",
                         "[info] 20 messages about student1 held: over 5 in 1h"]
    # the user's own channel: every withdrawal of theirs, none held
    assert len(titles(receiver, "student1")) == 25


async def test_the_decisions_always_reach_the_user_past_their_own_flood():
    flood = [request_event(n, "role-request-withdrawn") for n in range(30)]
    decisions = [request_event(40, "role-request-approved"),
                 request_event(41, "role-request-refused")]
    with HttpReceiver() as receiver:
        channels = notifier(receiver)
        for n, event in enumerate(told(flood + decisions)):
            await channels.send(event, GROUPS, now=T + n)
        await channels.send_digests(now=T + 2 * HOUR)
    mine = titles(receiver, "student1")
    assert len(mine) == 32 and mine[-2:] == [
        "[info] student1's request for the role lab-40 approved by admin",
        "[info] student1's request for the role lab-41 refused by admin"]
    admins = titles(receiver, "admins")
    assert len(admins) == 6 and admins[-1] == (
        "[info] 27 messages about student1 held: over 5 in 1h")
    digest = [r.body["message"] for r in receiver.requests if r.path == "/admins"][-1]
    assert "these 27 held: 25 role-request-withdrawn, 1 role-request-approved, " \
           "1 role-request-refused." in digest


async def test_each_hour_of_a_long_flood_is_five_messages_and_a_digest():
    with HttpReceiver() as receiver:
        channels = notifier(receiver, user_message_limit=2)
        limits = MessageLimits()
        for n in range(12):  # one ask every 15 minutes, for three hours
            (event,) = told([request_event(n)])
            await channels.send(event, GROUPS, now=T + n * 900, limits=limits)
            await channels.send_digests(limits, now=T + n * 900)
        await channels.send_digests(limits, now=T + 12 * 900)
    assert Counter(t.split(" about ")[0] if "held" in t else "ask"
                   for t in titles(receiver, "admins")) == {
        "ask": 6, "[info] 2 messages": 3}


async def test_messages_about_no_user_and_zero_are_never_held():
    gpu = Event("open", Incident(key="gpu_lost:GPU-1", rule="gpu_lost", severity="critical",
                                 server=None, since=T, gpu_uuid="GPU-1", what="lost"))
    with HttpReceiver() as receiver:
        channels = notifier(receiver)
        for n in range(8):
            assert await channels.send(gpu, GROUPS, now=T + n) == {"admins": True}
        unlimited = notifier(receiver, user_message_limit=0)
        for n, event in enumerate(told([request_event(n) for n in range(8)])):
            await unlimited.send(event, GROUPS, now=T + n)
        assert await unlimited.send_digests(now=T + 2 * HOUR) == []
    assert len(titles(receiver, "admins")) == 16


def test_the_settings_are_checked():
    assert (Notifier().user_message_limit, Notifier().user_message_period) == (5, 3600.0)
    with pytest.raises(TraitError, match="user_message_limit must be 0"):
        Notifier(user_message_limit=-1)
    with pytest.raises(TraitError, match="user_message_period must be seconds above 0"):
        Notifier(user_message_period=0)


# --- the watchdog app --------------------------------------------------------------------


class Hub:
    def groups_for(self, user: str) -> list[str]:
        return GROUPS.get(user, [])


def app(tmp_path: Path, receiver: HttpReceiver) -> QuotaWatchdog:
    """The watchdog app with what its hub-event and telling steps use: no engine or NVML."""
    watchdog = QuotaWatchdog(hub_id=HUB_ID, hub_url=HUB_URL, host_name="gpu-host-1",
                             events_file=str(tmp_path / "events.jsonl"),
                             state_file=str(tmp_path / "watchdog-incidents.json"))
    watchdog.log = logging.getLogger("test-watchdog")
    watchdog.rules = WatchdogRules(parent=watchdog)
    watchdog.notifier = notifier(receiver)
    watchdog.metrics = WatchdogMetrics()
    watchdog.book = IncidentBook.load(watchdog.state_file)
    watchdog.hub = Hub()
    return watchdog


def sent_total(watchdog: QuotaWatchdog, channel: str) -> float | None:
    return watchdog.metrics.registry.get_sample_value(
        "quota_spawner_watchdog_notifications_sent_total", {"channel": channel})


async def test_the_app_holds_a_flood_keeps_the_count_over_a_restart_and_sends_the_digest(
        tmp_path):
    hub_log = EventLog(str(tmp_path / "events.jsonl"))
    snapshot = Snapshot(time=time.time(), host="gpu-host-1")
    with HttpReceiver() as receiver:
        watchdog = app(tmp_path, receiver)
        assert await watchdog.hub_events(snapshot) == []  # the first read: at the end
        for n in range(30):
            hub_log.append(**request_event(n))
        hub_log.flush()
        await watchdog.notify_in_order(await watchdog.hub_events(snapshot))
        assert len(titles(receiver, "admins")) == 5
        watchdog.book.save(watchdog.state_file)

        # a restart: the counts come back with the incidents, and still hold
        watchdog = app(tmp_path, receiver)
        assert watchdog.book.messages.held("admins", "student1") == 25
        for n in range(30, 50):
            hub_log.append(**request_event(n))
        hub_log.flush()
        await watchdog.notify_in_order(await watchdog.hub_events(snapshot))
        assert len(titles(receiver, "admins")) == 5
        await watchdog.send_digests()
        assert len(titles(receiver, "admins")) == 5  # the hour goes on
        for window in watchdog.book.messages.windows.values():
            window.start -= HOUR  # the hour has passed
        await watchdog.send_digests()
        receiver.wait(5 + 1, path="/admins")
    assert titles(receiver, "admins")[-1] == (
        "[info] 45 messages about student1 held: over 5 in 1h")
    assert titles(receiver, "cs101")[-1] == (
        "[info] 45 messages about student1 held: over 5 in 1h")
    assert sent_total(watchdog, "admins") == 1  # this run's: the digest
    assert watchdog.book.messages.to_json() == {"windows": [], "ended": []}


def test_a_book_keeps_its_windows_and_skips_a_bad_one(tmp_path, caplog):
    book = IncidentBook()
    limits = book.messages
    for n in range(7):
        limits.admit("admins", "student1", "role-request", T + n, 5, HOUR)
    limits.admit("admins", "bob", "oom", T, 5, HOUR)
    path = tmp_path / "incidents.json"
    book.save(path)
    again = IncidentBook.load(path)
    assert again.messages == limits
    assert again.messages.held("admins", "student1") == 2
    data = book.to_json()
    data["messages"]["windows"][0]["start"] = "yesterday"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        loaded = IncidentBook.load(path, logging.getLogger("test-watchdog"))
    assert list(loaded.messages.windows) == [("admins", "student1")]
    assert "Skipping an unreadable window of messages" in caplog.text


def test_a_book_from_before_the_limits_loads(tmp_path):
    path = tmp_path / "incidents.json"
    path.write_text('{"version": 1, "open": [], "pending": [], "oom": {}, "events": null}')
    assert IncidentBook.load(path).messages == MessageLimits()
