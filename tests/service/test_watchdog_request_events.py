"""The watchdog tells the hub's requests for a bigger role: ``role-request`` to admins and
the user's groups' channels (their instructors), ``role-request-approved``, ``-refused``
and ``-withdrawn`` to the user, in the style of the budget notices
(test_watchdog_budget_events.py).

Pure: the real backend (spawner.usage.grants) on a temporary SQLite ledger, the hub's
own EventLog, and the real local HTTP receivers. No engine, no NVML, no hub.
"""

from __future__ import annotations

from pathlib import Path

from receivers import HttpReceiver

from spawner.quota.loader import parse_quota_table
from spawner.usage import grants as rr
from spawner.usage.event_log import EventLog
from spawner.usage.ledger import Ledger
from spawner.watchdog.hub_events import (
    for_hub,
    hub_event_messages,
    read_new,
    request_facts,
    role_request_events,
)
from spawner.watchdog.model import Snapshot
from spawner.watchdog.notify import Notifier, format_message, routes
from spawner.watchdog.rules import ALL_RULES, RULES, WatchdogRules

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"
ASK_TEXT = ("student1 asks for the role 'gpu-training' from 2026-11-18 11:06 UTC to "
            "2026-11-25 11:06 UTC: My thesis trains a model for a week.")
# as the message shows it: the user's words in quotes
ASK_SHOWN = ("student1 asks for the role 'gpu-training' from 2026-11-18 11:06 UTC to "
             "2026-11-25 11:06 UTC: \"My thesis trains a model for a week.\"")


def asked(**kw) -> dict:
    """The hub's "role-request" event, as spawner.usage.grants words it."""
    return dict(event="role-request", hub=HUB_ID, time=T, id=7, user="student1",
                role="gpu-training", starts=T, ends=T + 7 * DAY,
                reason="My thesis trains a model for a week.", who="student1", comment="",
                text=ASK_TEXT) | kw


def approved(**kw) -> dict:
    return asked(event="role-request-approved", who="prof-ada", comment="for the thesis",
                 text="Your request for the role 'gpu-training' was approved by prof-ada; "
                      "you hold it from 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC: for "
                      "the thesis") | kw


def refused(**kw) -> dict:
    return asked(event="role-request-refused", who="admin", comment="The GPUs are booked.",
                 text="Your request for the role 'gpu-training' was refused by admin: The "
                      "GPUs are booked.") | kw


def withdrawn(**kw) -> dict:
    return asked(event="role-request-withdrawn",
                 text="student1 withdrew the request for the role 'gpu-training'.") | kw


def snapshot(at: float = T + 3) -> Snapshot:
    return Snapshot(time=at, host="gpu-host-1")


def told(*events: dict, rules: WatchdogRules | None = None):
    return role_request_events(list(events), rules or WatchdogRules(), snapshot())


# --- the messages ------------------------------------------------------------------------


def test_a_request_says_who_asks_for_what_and_why():
    (event,) = told(asked())
    assert event.kind == "open" and event.incident.rule == "role_request"
    assert event.incident.severity == "info"
    message = format_message(event, HUB_URL, "h", now=T + 5)
    assert message.title == "[info] student1 asks for the role gpu-training"
    assert message.body.splitlines() == [
        f"What: {ASK_SHOWN}",
        "Who: student1",
        "Role: gpu-training",
        "Window: from 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC",
        "Host: gpu-host-1",
        "At: 2026-11-18 11:06:40 UTC",
        "What to do: Admins, and the user's instructors when the quota table allows it, "
        "approve or refuse it in the usage service's requests; a refusal needs a comment, "
        "which the user is told.",
        "Incident: role_request:7:role-request",
    ]
    # about a user, not a server: no server link nor container
    assert "Server:" not in message.body and "Container:" not in message.body


def test_decisions_and_withdrawals():
    yes, no, gone = told(approved(), refused(), withdrawn())
    yes_text = format_message(yes, HUB_URL, "h", now=T)
    assert yes_text.title == "[info] student1's request for the role gpu-training approved " \
                             "by prof-ada"
    assert yes_text.body.splitlines()[0] == (
        "What: Your request for the role 'gpu-training' was approved by prof-ada; you hold it "
        "from 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC: \"for the thesis\"")
    assert "What to do: Choose the role on the spawn form while the window holds" in \
        yes_text.body
    no_text = format_message(no, HUB_URL, "h", now=T)
    assert no_text.title == "[info] student1's request for the role gpu-training refused " \
                            "by admin"
    assert 'was refused by admin: "The GPUs are booked."\n' in no_text.body
    assert "What to do: Ask again with another window or a clearer reason" in no_text.body
    gone_text = format_message(gone, HUB_URL, "h", now=T)
    assert gone_text.title == "[info] student1 withdrew the request for the role gpu-training"
    assert "What to do" not in gone_text.body
    assert [e.incident.key for e in (yes, no, gone)] == [
        "role_request:7:role-request-approved", "role_request:7:role-request-refused",
        "role_request:7:role-request-withdrawn"]


def test_odd_fields_do_not_break_a_cycle_and_other_events_are_not_told():
    (event,) = told(asked(id="seven", starts="now", text=3, role=["x"]))
    message = format_message(event, HUB_URL, "h", now=T)
    assert message.title == "[info] student1 asks for a role"
    assert message.body.startswith("What: student1 asks for a role.\nWho: student1\nHost:")
    assert event.incident.key == "role_request:student1:role-request"
    (event,) = told(approved(text="", comment=""))
    assert format_message(event, HUB_URL, "h").body.startswith(
        "What: The request for the role 'gpu-training' was approved by prof-ada.\n")
    assert request_facts({"event": "role-request", "id": True, "user": 1}) == \
        {"event": "role-request"}
    assert told(asked(user=""), {"event": "budget-warning", "user": "student1"},
                {"event": "preemption", "user": "student1"}) == []


def test_the_rule_can_be_turned_off_alone():
    assert "role_request" in ALL_RULES and "role_request" not in RULES
    assert told(asked(), rules=WatchdogRules(disabled_rules=["role_request"])) == []
    assert len(told(asked(), rules=WatchdogRules(disabled_rules=["budget"]))) == 1


def test_in_the_logs_order_with_the_other_hub_events():
    events = [asked(), {"event": "budget-warning", "hub": HUB_ID, "time": T,
                        "user": "alice", "text": "Nearly spent."}, approved()]
    found = hub_event_messages(events, WatchdogRules(), snapshot())
    assert [e.incident.hub_event["event"] for e in found] == [
        "role-request", "budget-warning", "role-request-approved"]


# --- who gets it ---------------------------------------------------------------------------

CHANNELS = [
    {"name": "admins"},
    {"name": "cs101", "groups": ["cs101"]},  # the student's class: its instructors
    {"name": "ml", "groups": ["ml"]},
    {"name": "training", "roles": ["gpu-training"]},  # the role asked for: not concerned
    {"name": "student1", "users": ["student1"]},
    {"name": "bob", "users": ["bob"]},
    {"name": "oom-only", "rules": ["oom"]},
    {"name": "requests", "rules": ["role_request"]},
]


def routed(event: dict) -> list[str]:
    (one,) = told(event)
    return [c["name"] for c in CHANNELS if routes(c, one.incident, ["cs101"])]


def test_a_request_goes_to_admins_and_the_users_groups():
    assert routed(asked()) == ["admins", "cs101", "requests"]


def test_decisions_and_withdrawals_go_to_the_user():
    for event in (approved(), refused(), withdrawn()):
        assert routed(event) == ["admins", "student1", "requests"], event["event"]


async def test_from_the_backend_to_the_channels(tmp_path: Path):
    """The backend's outcomes, appended as the usage service does, read and sent."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    table = parse_quota_table(
        "images: {pytorch: {image: x}}\n"
        "roles: {student: {cpus: 1, memory: 1G, images: [pytorch]},\n"
        "        gpu-training: {cpus: 2, memory: 1G, images: [pytorch]}}\n"
        "assignments: {default: [student]}\n"
        "requests: {roles: [gpu-training], instructors_approve: true}\n", "q.yaml")
    log_path = str(tmp_path / "quota-spawner-events.jsonl")
    _, cursor = read_new(log_path, None)
    events = EventLog(log_path)
    ask = rr.ask(ledger.engine, table, "student1", ["cs101"], "gpu-training", T, T + DAY,
                 "For the project.", T)
    ask.emit(events, hub=HUB_ID)
    may = rr.decider(table, admin=False, instructor_of=["cs101"])
    rr.decide(ledger.engine, table, ask.request.id, "prof-ada", True, "", may,
              T + 60).emit(events, hub=HUB_ID)
    ledger.dispose()
    events.flush()
    read, _ = read_new(log_path, cursor)
    first, second = role_request_events(for_hub(read, HUB_ID), WatchdogRules(), snapshot())
    with HttpReceiver() as receiver:
        port = receiver.base.rsplit(":", 1)[1]
        notifier = Notifier(hub_url=HUB_URL, host="h", timeout=2.0, retry_delay=0.05,
                            channels=[
            {"name": name, "url": f"json://127.0.0.1:{port}/{name}", **routing}
            for name, routing in (("admins", {}), ("cs101", {"groups": ["cs101"]}),
                                  ("student1", {"users": ["student1"]}))
        ])
        groups = {"student1": ["cs101"]}
        assert await notifier.send(first, groups, now=T + 5) == \
            dict.fromkeys(["admins", "cs101"], True)
        assert await notifier.send(second, groups, now=T + 65) == \
            dict.fromkeys(["admins", "student1"], True)
    titles = sorted((r.path, r.body["title"]) for r in receiver.requests)
    assert titles == [
        ("/admins", "[info] student1 asks for the role gpu-training"),
        ("/admins", "[info] student1's request for the role gpu-training approved by "
                    "prof-ada"),
        ("/cs101", "[info] student1 asks for the role gpu-training"),
        ("/student1", "[info] student1's request for the role gpu-training approved by "
                      "prof-ada"),
    ]
