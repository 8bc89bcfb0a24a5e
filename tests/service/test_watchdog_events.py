"""The watchdog tells the hub's preemptions: its event log, read each cycle, to the channels.

Pure: a temporary event log written with the hub's own EventLog, the real
IncidentBook file, and the real local HTTP receivers (tests/receivers.py).
No engine, no NVML, no hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from receivers import HttpReceiver
from traitlets import TraitError

from spawner.usage import event_store
from spawner.usage.event_log import EventLog
from spawner.usage.ledger import Ledger
from spawner.watchdog.app import QuotaWatchdog
from spawner.watchdog.hub_events import facts, for_hub, preemption_events, read_new
from spawner.watchdog.metrics import WatchdogMetrics
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot
from spawner.watchdog.notify import Notifier, format_message
from spawner.watchdog.rules import (
    ALL_RULES,
    RULES,
    EventCursor,
    IncidentBook,
    WatchdogRules,
)
from spawner.watchdog.service import watchdog_service

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"
UUID = "GPU-8f3c2a4e-1b7d-4c55-9e0a-2d6f4b1c9a77"
REASON = ("bob needs 1 GPU for the role 'urgent-debug' (priority 1000000), which outranks "
          "this server's role 'gpu-training' (priority 300000).")
ALICE = Server(container_id="c0ffee", name="quota-alice", user="alice", role="gpu-training",
               image="pytorch", hub_id=HUB_ID, gpus=(UUID,), gpu_mode="exclusive")


def snapshot(at: float = T + 3, *servers: Server) -> Snapshot:
    servers = servers or (ALICE,)
    return Snapshot(time=at, host="gpu-host-1", gpus={UUID: GpuSample(UUID, 2)},
                    servers={s.container_id: ServerSample(s) for s in servers})


def notice(**kw) -> dict:
    """The hub's "preemption" event of alice's server, for bob, as the hub writes it."""
    return dict(hub=HUB_ID, time=T, by="bob", by_role="urgent-debug", by_priority=1000000,
                user="alice", role="gpu-training", priority=300000, container="quota-alice",
                gpus=[UUID], grace_period=120.0, deadline=T + 120, reason=REASON,
                server_url="/user/alice/") | kw


def stopped(**kw) -> dict:
    return dict(hub=HUB_ID, time=T + 121, user="alice", role="gpu-training",
                container="quota-alice", gpus=[UUID], by="bob", by_role="urgent-debug",
                ran_for=11520.0) | kw


def withdrawn(**kw) -> dict:
    return dict(hub=HUB_ID, time=T + 30, user="alice", role="gpu-training",
                container="quota-alice", by="bob", why="bob cancelled the request") | kw


def queued(**kw) -> dict:
    return dict(hub=HUB_ID, time=T, user="carol", role="gpu-training", priority=300000,
                waited=0.0) | kw


class Log:
    """The hub's event log in a temporary folder, written with the hub's own EventLog."""

    def __init__(self, path: Path):
        self.path = str(path)
        self._log = EventLog(self.path)

    def append(self, event: str, fields: dict) -> None:
        written = self._log.append(event, **fields)
        self._log.flush()  # the hub writes on the log's own thread
        assert "error" not in written

    def raw(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "quota-spawner-events.jsonl")


def kinds(events: list[dict]) -> list[str]:
    return [e["event"] for e in events]


# --- reading the log ---------------------------------------------------------------------


def test_the_first_start_begins_at_the_end(log):
    log.append("preemption", notice())
    log.append("preempted", stopped())
    found, cursor = read_new(log.path, None)
    assert found == []  # history is not told again
    assert cursor.offset == os.path.getsize(log.path) and cursor.path == log.path
    log.append("preemption", notice(user="dave"))
    found, cursor = read_new(log.path, cursor)
    assert kinds(found) == ["preemption"] and found[0]["user"] == "dave"
    assert read_new(log.path, cursor) == ([], cursor)


def test_the_first_start_leaves_a_half_written_line_for_the_next_cycle(log):
    log.append("preemption", notice(user="old"))
    line = json.dumps({"version": 1, "event": "preemption", **notice()}).encode() + b"\n"
    log.raw(line[:40])  # the hub is writing it as the watchdog starts
    found, cursor = read_new(log.path, None)
    assert found == [] and cursor.offset == os.path.getsize(log.path) - 40
    log.raw(line[40:])
    found, _ = read_new(log.path, cursor)
    assert [e["user"] for e in found] == ["alice"]


def test_a_half_written_last_line_is_read_on_the_next_cycle(log):
    _, cursor = read_new(log.path, None)
    log.append("preemption", notice(user="first"))
    line = json.dumps({"version": 1, "event": "preempted", **stopped()}).encode() + b"\n"
    log.raw(line[:25])
    found, cursor = read_new(log.path, cursor)
    assert [e["user"] for e in found] == ["first"]
    assert read_new(log.path, cursor)[0] == []  # still half: nothing, and no progress
    log.raw(line[25:])
    found, cursor = read_new(log.path, cursor)
    assert kinds(found) == ["preempted"]
    assert cursor.offset == os.path.getsize(log.path)


def test_a_log_the_hub_has_not_written_yet_is_read_from_its_start(log):
    found, cursor = read_new(log.path, None)
    assert (found, cursor) == ([], EventCursor(log.path, 0, None))
    log.append("preemption", notice())  # the hub's first event ever: told
    found, _ = read_new(log.path, cursor)
    assert kinds(found) == ["preemption"]


def test_a_rotated_or_truncated_log_is_read_from_its_start(log, tmp_path):
    _, cursor = read_new(log.path, None)
    for user in ("a", "b", "c"):
        log.append("preemption", notice(user=user))
    _, cursor = read_new(log.path, cursor)
    # rotated: the old file moved away, a new one (another inode) started
    os.rename(log.path, tmp_path / "old.jsonl")
    log.append("preempted", stopped(user="d"))
    log.append("preempted", stopped(user="e"))
    log.append("preempted", stopped(user="f"))
    log.append("preempted", stopped(user="g"))  # longer than the old one was read
    found, cursor = read_new(log.path, cursor)
    assert [e["user"] for e in found] == ["d", "e", "f", "g"]
    # truncated in place (copytruncate)
    os.truncate(log.path, 0)
    log.append("preemption", notice(user="h"))
    found, _ = read_new(log.path, cursor)
    assert [e["user"] for e in found] == ["h"]


def test_another_path_starts_at_its_end(log, tmp_path):
    log.append("preemption", notice())
    stale = EventCursor(str(tmp_path / "elsewhere.jsonl"), 10, 1)
    found, cursor = read_new(log.path, stale)
    assert found == [] and cursor.path == log.path
    assert cursor.offset == os.path.getsize(log.path)


def test_only_this_hubs_events():
    events = [notice(), notice(hub="quota-other"), notice(hub=None), stopped()]
    assert for_hub(events, HUB_ID) == [events[0], events[3]]
    assert for_hub(events, "") == events  # no hub id known yet: every hub's


# --- the position across restarts ------------------------------------------------------


def cycle(book: IncidentBook, log: Log, rules: WatchdogRules | None = None,
          at: float = T + 3) -> list[tuple[str, str]]:
    """One cycle's reading: (hub event, victim) of each message, as the app makes them."""
    found, book.events = read_new(log.path, book.events)
    told = preemption_events(for_hub(found, HUB_ID), rules or WatchdogRules(), snapshot(at))
    return [(e.incident.hub_event["event"], e.incident.server.user) for e in told]


def test_a_restart_tells_nothing_twice_and_misses_nothing(log, tmp_path):
    state = tmp_path / "watchdog-incidents.json"
    log.append("preemption", notice(user="before"))  # before the watchdog's first start
    book = IncidentBook.load(state)
    assert cycle(book, log) == []
    log.append("preemption", notice())
    assert cycle(book, log) == [("preemption", "alice")]
    book.save(state)

    # the watchdog restarts; meanwhile the grace ends and the hub stops alice's server
    log.append("preempted", stopped())
    book = IncidentBook.load(state)
    assert book.events is not None and book.events.offset > 0
    assert cycle(book, log) == [("preempted", "alice")]
    book.save(state)
    assert cycle(IncidentBook.load(state), log) == []  # and nothing again after another
    saved = json.loads(state.read_text())["events"]
    assert saved == {"path": log.path, "offset": os.path.getsize(log.path),
                     "inode": os.stat(log.path).st_ino}


@pytest.mark.parametrize("entry", [
    "nonsense", {"path": 3, "offset": 10}, {"path": "x", "offset": -1},
    {"offset": 10}, {"path": "x", "offset": "10"},
])
def test_an_unreadable_position_starts_at_the_end_again(tmp_path, caplog, entry):
    state = tmp_path / "watchdog-incidents.json"
    IncidentBook().save(state)
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "events": entry}))
    with caplog.at_level(logging.WARNING):
        book = IncidentBook.load(state, logging.getLogger("t"))
    assert book.events is None
    assert "Skipping the event log position" in caplog.text


def test_a_book_from_before_the_event_log_loads(tmp_path):
    state = tmp_path / "watchdog-incidents.json"
    state.write_text(json.dumps({"version": 1, "open": [], "pending": [], "oom": {}}))
    assert IncidentBook.load(state) == IncidentBook()
    book = IncidentBook(events=EventCursor("/x/quota-spawner-events.jsonl", 42, 7))
    book.save(state)
    assert IncidentBook.load(state) == book


# --- the messages ------------------------------------------------------------------------


def test_the_notice_says_who_where_what_when_and_what_to_do():
    (event,) = preemption_events([{"event": "preemption", **notice()}], WatchdogRules(),
                                 snapshot())
    assert event.kind == "open" and event.incident.severity == "warning"
    message = format_message(event, HUB_URL, "h", now=T + 5)
    assert message.title == "[warning] alice's server will be stopped at 11:08 UTC: " \
                            "preempted by bob"
    assert message.body.splitlines() == [
        f"What: Preempted by bob for the role urgent-debug. {REASON}",
        "When: stopped at 11:08 UTC, in 1m55s (a grace period of 2m)",
        "Who: alice (role gpu-training, image pytorch)",
        "Server: https://hub.example.org/user/alice/",
        "Container: quota-alice",
        f"GPU: GPU 2 ({UUID})",
        "Host: gpu-host-1",
        "At: 2026-11-18 11:06:40 UTC",
        "What to do: Save your notebooks and files now. The kernels were sent SIGTERM: "
        "those that called spawner.checkpoint.on_preempt() save their checkpoints now, the "
        "others have ended. At the deadline the server stops; the home folder is kept.",
        "Incident: preemption:quota-alice",
    ]
    # told late (the watchdog was down): the deadline is past, and says so
    late = format_message(event, HUB_URL, "h", now=T + 150).body
    assert "When: stopped at 11:08 UTC, 30s ago (a grace period of 2m)" in late


def test_the_follow_ups_are_short_and_keep_the_incident_key():
    told = preemption_events([{"event": "preempted", **stopped()},
                              {"event": "preemption-withdrawn", **withdrawn()}],
                             WatchdogRules(), snapshot(T + 122, Server(
                                 container_id="other", name="quota-zed", user="zed",
                                 role="cpu", image="base", hub_id=HUB_ID)))
    done, off = (format_message(e, HUB_URL, "h", now=T + 125) for e in told)
    assert [e.incident.severity for e in told] == ["info", "info"]
    assert done.title == "[info] alice's server was stopped: preempted by bob"
    assert done.body.splitlines() == [
        "What: The server was stopped after running for 3h12m, to free its GPUs for bob.",
        "Who: alice (role gpu-training)",  # its container is gone: no image to say
        "Server: https://hub.example.org/user/alice/",
        "Container: quota-alice",
        f"GPU: GPU 2 ({UUID})",
        "Host: gpu-host-1",
        "At: 2026-11-18 11:08:41 UTC",
        "What to do: Start the server again from the hub when a GPU is free; the home "
        "folder, with the checkpoints saved in it, is as it was.",
        "Incident: preemption:quota-alice",
    ]
    assert off.title == ("[info] alice's server will not be stopped: the preemption by bob "
                         "was called off")
    assert off.body.splitlines()[0] == ("What: The preemption for bob was called off: bob "
                                        "cancelled the request. The server keeps running.")
    assert "What to do:" not in off.body and "When:" not in off.body


def test_several_gpus_are_listed_and_odd_fields_do_not_break_a_cycle():
    two = notice(gpus=[UUID, "GPU-second"], deadline="soon", grace_period=None,
                 by_priority=True, reason=7)
    (event,) = preemption_events([{"event": "preemption", **two}], WatchdogRules(),
                                 snapshot(T + 3, Server(container_id="x", name="quota-x",
                                                        user="x", role="r", image="i",
                                                        hub_id=HUB_ID)))
    body = format_message(event, HUB_URL, "h", now=T).body
    assert f"GPUs: {UUID}, GPU-second" in body
    assert "When:" not in body  # no deadline to tell
    assert body.startswith("What: Preempted by bob for the role urgent-debug.\n")
    assert facts({"event": "preemption", "user": ["a"], "gpus": "GPU-1"}) == \
        {"event": "preemption"}
    # no user: nobody to tell; the queue's events are not told
    assert preemption_events([{"event": "preemption", **notice(user="")},
                              {"event": "queued", **queued()},
                              {"event": "queue-granted", **queued()}],
                             WatchdogRules(), snapshot()) == []


def test_the_rule_can_be_turned_off():
    assert "preemption" in ALL_RULES and "preemption" not in RULES  # no incidents to count
    rules = WatchdogRules(disabled_rules=["preemption"])
    assert preemption_events([{"event": "preemption", **notice()}], rules, snapshot()) == []
    with pytest.raises(TraitError, match="preemption"):  # the message lists it
        WatchdogRules(disabled_rules=["preemptions"])


# --- to the channels ---------------------------------------------------------------------


def channel(hub: HttpReceiver, name: str, **routing) -> dict:
    return {"name": name, "url": f"json://127.0.0.1:{hub.base.rsplit(':', 1)[1]}/{name}",
            **routing}


async def test_the_victims_channels_get_it_and_no_other(log):
    groups = {"alice": ["cs101"], "bob": ["cs202"]}
    with HttpReceiver() as receiver:
        notifier = Notifier(hub_url=HUB_URL, host="h", timeout=2.0, retry_delay=0.05,
                            channels=[
            channel(receiver, "admins"),
            channel(receiver, "cs101", groups=["cs101"]),  # alice's instructor
            channel(receiver, "cs202", groups=["cs202"]),  # bob's, not alice's
            channel(receiver, "training", roles=["gpu-training"]),
            channel(receiver, "alice", users=["alice"]),
            channel(receiver, "bob", users=["bob"]),
            channel(receiver, "oom-only", rules=["oom"]),
            channel(receiver, "preemptions", rules=["preemption"]),
        ])
        book = IncidentBook()
        cycle(book, log)
        log.append("preemption", notice())
        found, book.events = read_new(log.path, book.events)
        (event,) = preemption_events(found, WatchdogRules(), snapshot())
        sent = await notifier.send(event, groups, now=T + 5)
    assert sent == dict.fromkeys(["admins", "cs101", "training", "alice", "preemptions"], True)
    assert sorted(r.path for r in receiver.requests) == [
        "/admins", "/alice", "/cs101", "/preemptions", "/training"]
    body = receiver.requests[0].body
    assert body["type"] == "warning"
    assert body["title"] == "[warning] alice's server will be stopped at 11:08 UTC: " \
                            "preempted by bob"
    assert "Incident: preemption:quota-alice" in body["message"]


class Hub:
    """What the app asks the hub's API: a user's groups."""

    def __init__(self, groups: dict[str, list[str]]):
        self.groups = groups

    def groups_for(self, user: str) -> list[str]:
        return self.groups.get(user, [])


def app(log: Log, hub_id: str = HUB_ID, **kw) -> QuotaWatchdog:
    """The watchdog app with what a cycle's hub-event step uses, and no engine or NVML."""
    kw.setdefault("events_file", log.path)
    watchdog = QuotaWatchdog(hub_id=hub_id, hub_url=HUB_URL, host_name="gpu-host-1", **kw)
    watchdog.log = logging.getLogger("test-watchdog")  # the app's own does not propagate
    watchdog.rules = WatchdogRules(parent=watchdog)
    watchdog.notifier = Notifier(parent=watchdog, log=watchdog.log, timeout=2.0,
                                 retry_delay=0.05)
    watchdog.metrics = WatchdogMetrics()
    watchdog.book = IncidentBook()
    watchdog.hub = Hub({"alice": ["cs101"]})
    return watchdog


def preemptions(metrics: WatchdogMetrics, role: str, by_role: str) -> float | None:
    return metrics.registry.get_sample_value("quota_spawner_preemptions_total",
                                             {"role": role, "by_role": by_role})


async def test_the_app_tells_this_hubs_preemptions_in_order_and_counts_them(log):
    watchdog = app(log)
    assert await watchdog.hub_events(snapshot()) == []  # the first read: at the end
    log.append("preemption", notice())
    log.append("preemption", notice(hub="quota-other", user="mallory", by_role="x"))
    log.append("queued", queued())
    log.append("preempted", stopped())
    told = await watchdog.hub_events(snapshot(T + 122))
    assert [(e.incident.hub_event["event"], e.incident.server.user) for e in told] == [
        ("preemption", "alice"), ("preempted", "alice")]
    assert preemptions(watchdog.metrics, "gpu-training", "urgent-debug") == 1
    assert preemptions(watchdog.metrics, "gpu-training", "x") is None  # another hub's
    assert "quota_spawner_preemptions_total" in watchdog.metrics.metric_names()

    with HttpReceiver() as receiver:
        watchdog.notifier.channels = [channel(receiver, "cs101", groups=["cs101"])]
        await watchdog.notify_in_order(told)
        got = receiver.wait(2)
    assert [r.body["title"].split(": ")[0] for r in got] == [
        "[warning] alice's server will be stopped at 11:08 UTC",
        "[info] alice's server was stopped"]
    assert watchdog.metrics.registry.get_sample_value(
        "quota_spawner_watchdog_notifications_sent_total", {"channel": "cs101"}) == 2


async def test_the_app_counts_but_does_not_tell_when_the_rule_is_off(log):
    watchdog = app(log)
    watchdog.rules = WatchdogRules(disabled_rules=["preemption"])
    await watchdog.hub_events(snapshot())
    log.append("preemption", notice())
    assert await watchdog.hub_events(snapshot()) == []
    assert preemptions(watchdog.metrics, "gpu-training", "urgent-debug") == 1


async def test_with_no_hub_id_yet_every_hubs_events_are_told(log):
    watchdog = app(log, hub_id="")
    await watchdog.hub_events(snapshot())
    log.append("preemption", notice(hub="quota-other"))
    assert len(await watchdog.hub_events(snapshot())) == 1


async def test_an_unreadable_log_is_logged_once_and_holds_up_nothing(tmp_path, caplog):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    watchdog = app(Log(folder))
    watchdog.book.events = EventCursor(str(folder), 0, os.stat(folder).st_ino)
    with caplog.at_level(logging.INFO, logger="test-watchdog"):
        assert await watchdog.hub_events(snapshot()) == []
        assert await watchdog.hub_events(snapshot()) == []
        assert caplog.text.count("Cannot read the hub's event log") == 1
        folder.rmdir()
        Log(folder).append("preemption", notice())
        assert len(await watchdog.hub_events(snapshot())) == 1
        assert "can be read again" in caplog.text


async def test_an_empty_events_file_reads_nothing(log):
    watchdog = app(log, events_file="")
    log.append("preemption", notice())
    assert await watchdog.hub_events(snapshot()) == []
    assert watchdog.book.events is None


async def test_without_a_shared_folder_it_reads_the_hubs_events_from_the_ledger(
        tmp_path, ledger_url, caplog):
    """A watchdog on another machine: no events file, only the hub's database. The hub's
    own EventLog writes there (its ``store``), and the app tells them in order."""
    ledger = Ledger(ledger_url)  # the hub creates it
    hub_log = EventLog("", store=lambda r: event_store.append_one(ledger.engine, r))
    watchdog = app(Log(tmp_path / "unused.jsonl"), events_file="", usage_db=ledger_url)
    assert watchdog.events_source.startswith("the events table of ")
    hub_log.append("queued", **queued())
    hub_log.flush()
    assert await watchdog.hub_events(snapshot()) == []  # the first read: at the end
    hub_log.append("preemption", **notice())
    hub_log.append("preemption", **notice(hub="quota-other", user="mallory"))
    hub_log.append("preempted", **stopped())
    hub_log.flush()
    told = await watchdog.hub_events(snapshot(T + 122))
    assert [(e.incident.hub_event["event"], e.incident.server.user) for e in told] == [
        ("preemption", "alice"), ("preempted", "alice")]
    assert await watchdog.hub_events(snapshot(T + 123)) == []  # nothing twice
    assert watchdog.book.events.offset == event_store.last_id(ledger.engine)
    ledger.dispose()


async def test_a_ledger_not_made_yet_is_said_once_and_read_once_it_is(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'later.sqlite'}"
    watchdog = app(Log(tmp_path / "unused.jsonl"), events_file="", usage_db=url)
    with caplog.at_level(logging.INFO, logger="test-watchdog"):
        assert await watchdog.hub_events(snapshot()) == []
        assert await watchdog.hub_events(snapshot()) == []
        assert caplog.text.count("Cannot read the hub's event log the events table of") == 1
        ledger = Ledger(url)
        assert await watchdog.hub_events(snapshot()) == []  # starts at the end
        event_store.append_one(ledger.engine, {"event": "preemption", **notice()})
        assert len(await watchdog.hub_events(snapshot(T + 5))) == 1
        assert "can be read again" in caplog.text
    ledger.dispose()


# --- where the log is --------------------------------------------------------------------


TABLE = "the events table of "


@pytest.mark.parametrize(("env", "expected"), [
    # the hub's ledger in its state folder: its events table, where the hub writes too
    ({"QUOTA_SPAWNER_STATE_DIR": "/srv/state"},
     TABLE + "sqlite:////srv/state/quota-spawner-usage.sqlite"),
    # a watchdog with a state folder of its own, given the hub's database
    ({"QUOTA_SPAWNER_STATE_DIR": "/var/lib/watchdog",
      "QUOTA_SPAWNER_USAGE_DB": "postgresql+psycopg://quota:secret@db/quota"},
     TABLE + "postgresql+psycopg://quota:***@db/quota"),
    # a hub without a ledger: the file in its state folder
    ({"QUOTA_SPAWNER_STATE_DIR": "/srv/state", "QUOTA_SPAWNER_USAGE_DB": "none"},
     "/srv/state/quota-spawner-events.jsonl"),
    ({"QUOTA_SPAWNER_STATE_DIR": "/srv/state", "QUOTA_SPAWNER_EVENTS_FILE": "/var/e.jsonl"},
     "/var/e.jsonl"),
    ({"QUOTA_SPAWNER_EVENTS_FILE": "", "QUOTA_SPAWNER_USAGE_DB": ""}, ""),
    ({}, ""),  # no state folder known: no guess at the hub's
])
def test_where_the_hubs_events_are_read(monkeypatch, env, expected):
    for name in ("QUOTA_SPAWNER_STATE_DIR", "QUOTA_SPAWNER_EVENTS_FILE",
                 "QUOTA_SPAWNER_USAGE_DB"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert QuotaWatchdog().events_source == expected


def test_the_managed_service_is_told_where_the_log_is(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_COOKIE_SECRET", raising=False)
    service, _ = watchdog_service("http://127.0.0.1:8000", state_dir="/srv/state")
    assert service["environment"]["QUOTA_SPAWNER_STATE_DIR"] == "/srv/state"
    assert "QUOTA_SPAWNER_EVENTS_FILE" not in service["environment"]  # the state folder's
    service, _ = watchdog_service("http://127.0.0.1:8000", state_dir="/srv/state",
                                  events_file="/var/log/hub-events.jsonl")
    assert service["environment"]["QUOTA_SPAWNER_EVENTS_FILE"] == "/var/log/hub-events.jsonl"


def test_the_documented_examples_are_what_the_code_says():
    """docs/watchdog.md#preemptions shows these three, made from the same events."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "watchdog.md").read_text()
    at = 1_796_050_800.0  # 2026-11-30 15:00:00 UTC
    off = withdrawn(time=at + 40, why="bob got GPUs without needing this server's")
    cases = [({"event": "preemption", **notice(time=at, deadline=at + 120)}, at + 3, ALICE),
             ({"event": "preempted", **stopped(time=at + 120.4)}, at + 123, None),
             ({"event": "preemption-withdrawn", **off}, at + 43, ALICE)]
    for event, seen, server in cases:
        servers = (server,) if server else (Server("gone", "quota-zed", "zed", "r", "i", HUB_ID),)
        (told,) = preemption_events([event], WatchdogRules(), snapshot(seen, *servers))
        text = format_message(told, HUB_URL, "h", now=seen + 1).text
        assert f"```text\n{text}\n```" in doc, text
