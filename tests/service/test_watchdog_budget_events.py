"""The watchdog tells the hub's GPU-hour budget events: ``budget-warning`` and
``budget-spent`` from its event log, to the user and, for a group's budget, that group's
channels, in the style of the preemption notices (test_watchdog_events.py).

Pure: the hub's own EventLog and BudgetWatch on a temporary SQLite ledger, and the real
local HTTP receivers. No engine, no NVML, no hub.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from receivers import HttpReceiver

from spawner.quota.loader import parse_quota_table
from spawner.usage.budgets import BudgetWatch, running_gpu_sessions
from spawner.usage.event_log import EventLog
from spawner.usage.ledger import Ledger
from spawner.watchdog.hub_events import (
    budget_events,
    budget_facts,
    for_hub,
    hub_event_messages,
    preemption_events,
    read_new,
)
from spawner.watchdog.model import Server, ServerSample, Snapshot
from spawner.watchdog.notify import Notifier, format_message, routes
from spawner.watchdog.rules import ALL_RULES, RULES, WatchdogRules

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"
ALICE = Server(container_id="c0ffee", name="quota-alice", user="alice", role="gpu-training",
               image="pytorch", hub_id=HUB_ID, gpus=("GPU-1",), gpu_mode="exclusive")
WARNING_TEXT = (
    "The GPU-hour budget of the group cs101 is 90% used: 180.2 of 200 GPU-hours used this "
    "month. Budgets count the time GPUs were reserved, busy or not. When it is spent, no new "
    "GPU server can start until it resets; running servers keep running. It resets on "
    "1 December 2026 at 00:00 UTC.")


def snapshot(at: float = T + 3, *servers: Server) -> Snapshot:
    servers = servers or (ALICE,)
    return Snapshot(time=at, host="gpu-host-1",
                    servers={s.container_id: ServerSample(s) for s in servers})


def warning(**kw) -> dict:
    """The hub's "budget-warning" event of alice under cs101's budget, as BudgetWatch says."""
    return dict(event="budget-warning", hub=HUB_ID, time=T, user="alice", budget_kind="group",
                budget_name="cs101", used=180.2, gpu_hours=200.0, per="month", warn_at=0.9,
                resets_at=1_796_083_200.0, text=WARNING_TEXT, stopping=False,
                container="quota-alice", role="gpu-training") | kw


def spent(**kw) -> dict:
    return warning(event="budget-spent", used=200.1, text=(
        "The GPU-hour budget of the group cs101 is spent: 200.1 of 200 GPU-hours used this "
        "month. Your GPU servers are being stopped now, as the quota table says; the home "
        "folder is kept. Budgets count the time GPUs were reserved, busy or not. It resets "
        "on 1 December 2026 at 00:00 UTC. Roles without GPUs can still be started."),
        stopping=True) | kw


def told(*events: dict, rules: WatchdogRules | None = None, at: float = T + 3):
    return budget_events(list(events), rules or WatchdogRules(), snapshot(at))


# --- the messages ------------------------------------------------------------------------


def test_the_warning_says_whose_budget_how_much_and_what_to_do():
    (event,) = told(warning())
    assert event.kind == "open" and event.incident.severity == "warning"
    assert event.incident.rule == "budget"
    message = format_message(event, HUB_URL, "h", now=T + 5)
    assert message.title == ("[warning] GPU-hour budget of the group cs101 90% used: "
                             "alice's server")
    assert message.body.splitlines() == [
        f"What: {WARNING_TEXT}",
        "Who: alice (role gpu-training, image pytorch)",
        "Server: https://hub.example.org/user/alice/",
        "Container: quota-alice",
        "Host: gpu-host-1",
        "At: 2026-11-18 11:06:40 UTC",
        "What to do: Stop the GPU servers you do not need: a budget counts the time GPUs are "
        "reserved, busy or not. Roles without GPUs do not count against it.",
        "Incident: budget:group:cs101:alice",
    ]


def test_spent_with_a_stop_and_without():
    stopping, running = told(spent(), spent(stopping=False, budget_kind="user",
                                            budget_name="alice", text=""))
    stop = format_message(stopping, HUB_URL, "h", now=T + 5)
    assert stop.title == ("[warning] alice's server will be stopped: GPU-hour budget of the "
                          "group cs101 spent")
    assert stop.body.splitlines()[0].startswith(
        "What: The GPU-hour budget of the group cs101 is spent: 200.1 of 200 GPU-hours")
    assert ("What to do: Go on with a role without GPUs, which budgets do not count; the home "
            "folder is kept. GPU roles can be started again when the budget resets.") in stop.body
    kept = format_message(running, HUB_URL, "h", now=T + 5)
    assert kept.title == "[warning] GPU-hour budget of alice spent: alice's server keeps running"
    # no sentence from the hub: one made of the numbers
    assert kept.body.splitlines()[0] == ("What: The GPU-hour budget of alice is spent: 200.1 "
                                         "of 200 GPU-hours used this month.")
    assert "What to do: Save your work and stop the server when you are done" in kept.body
    assert "Incident: budget:user:alice\n" in kept.body + "\n"


def test_a_server_gone_from_the_snapshot_is_named_as_the_event_names_it():
    (event,) = budget_events([warning(container="quota-alice-2")], WatchdogRules(),
                             snapshot(T + 3))
    assert (event.incident.server.name, event.incident.server.image) == ("quota-alice-2", "")
    assert "Who: alice (role gpu-training)\n" in format_message(event, HUB_URL, "h").body


def test_odd_fields_do_not_break_a_cycle_and_other_events_are_not_told():
    odd = warning(used="much", gpu_hours=None, stopping="yes", budget_kind="team", text=7)
    (event,) = told(odd)
    message = format_message(event, HUB_URL, "h", now=T)
    assert message.title == "[warning] GPU-hour budget of cs101 nearly used: alice's server"
    assert message.body.startswith("What: The GPU-hour budget of cs101 is nearly spent.\n")
    assert budget_facts({"event": "budget-spent", "user": ["a"], "stopping": 1}) == \
        {"event": "budget-spent"}
    assert told(warning(user=""), {"event": "preemption", "user": "alice"},
                {"event": "queued", "user": "alice"}) == []


def test_the_rule_can_be_turned_off_alone():
    assert "budget" in ALL_RULES and "budget" not in RULES  # no incidents to count
    assert told(warning(), rules=WatchdogRules(disabled_rules=["budget"])) == []
    assert len(told(warning(), rules=WatchdogRules(disabled_rules=["preemption"]))) == 1


def test_preemptions_and_budgets_in_the_logs_order():
    events = [warning(), {"event": "preemption", "hub": HUB_ID, "time": T, "user": "alice",
                          "container": "quota-alice", "by": "bob"}, spent()]
    both = hub_event_messages(events, WatchdogRules(), snapshot())
    assert [e.incident.hub_event["event"] for e in both] == [
        "budget-warning", "preemption", "budget-spent"]
    assert len(preemption_events(events, WatchdogRules(), snapshot())) == 1


# --- who gets it ---------------------------------------------------------------------------

CHANNELS = [
    {"name": "admins"},
    {"name": "cs101", "groups": ["cs101"]},  # the instructors of the budget's group
    {"name": "ml", "groups": ["ml"]},  # alice's other group
    {"name": "training", "roles": ["gpu-training"]},
    {"name": "alice", "users": ["alice"]},
    {"name": "bob", "users": ["bob"]},
    {"name": "oom-only", "rules": ["oom"]},
    {"name": "budgets", "rules": ["budget"]},
    {"name": "cs101-budgets", "groups": ["cs101"], "rules": ["budget"]},
]


def routed(event: dict) -> list[str]:
    (told_event,) = told(event)
    return [c["name"] for c in CHANNELS if routes(c, told_event.incident, ["cs101", "ml"])]


def test_a_groups_budget_goes_to_the_user_and_that_group_only():
    assert routed(warning()) == ["admins", "cs101", "alice", "budgets", "cs101-budgets"]
    assert routed(spent()) == ["admins", "cs101", "alice", "budgets", "cs101-budgets"]


def test_a_users_budget_goes_to_the_user_not_their_groups():
    assert routed(warning(budget_kind="user", budget_name="alice")) == [
        "admins", "alice", "budgets"]


async def test_from_the_hubs_watch_to_the_channels(tmp_path: Path):
    """BudgetWatch's notice, appended by the hub as it will, read and sent by the watchdog."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    ledger.open(hub=HUB_ID, user="alice", container="quota-alice", role="gpu-training",
                image="pytorch", cpu_limit=2, mem_limit=2**30, groups=["cs101"],
                requested=T - 9 * 3600)
    ledger.set_gpus(HUB_ID, "quota-alice", ["GPU-1"], "exclusive", None)
    ledger.started(HUB_ID, "quota-alice", "c0ffee", when=T - 9 * 3600)
    table = parse_quota_table(
        "images: {pytorch: {image: x}}\n"
        "roles: {gpu-training: {cpus: 2, memory: 1G, images: [pytorch], gpus: 1}}\n"
        "assignments: {default: [gpu-training]}\n"
        "budgets: {groups: {cs101: {gpu_hours: 10, per: month}}}\n", "q.yaml")
    log_path = str(tmp_path / "quota-spawner-events.jsonl")
    _, cursor = read_new(log_path, None)
    events = EventLog(log_path)
    found = BudgetWatch().check(ledger.engine, table, running_gpu_sessions(ledger.engine), T)
    ledger.dispose()
    for notice in found.notices:  # what the hub does with them
        events.append(notice.event, **notice.fields())
    events.flush()
    read, _ = read_new(log_path, cursor)
    (event,) = budget_events(for_hub(read, HUB_ID), WatchdogRules(), snapshot())
    with HttpReceiver() as receiver:
        port = receiver.base.rsplit(":", 1)[1]
        notifier = Notifier(hub_url=HUB_URL, host="h", timeout=2.0, retry_delay=0.05,
                            channels=[
            {"name": name, "url": f"json://127.0.0.1:{port}/{name}", **routing}
            for name, routing in (("admins", {}), ("cs101", {"groups": ["cs101"]}),
                                  ("ml", {"groups": ["ml"]}), ("alice", {"users": ["alice"]}))
        ])
        sent = await notifier.send(event, {"alice": ["cs101", "ml"]}, now=T + 5)
    assert sent == dict.fromkeys(["admins", "cs101", "alice"], True)
    assert sorted(r.path for r in receiver.requests) == ["/admins", "/alice", "/cs101"]
    body = receiver.requests[0].body
    assert body["title"] == "[warning] GPU-hour budget of the group cs101 90% used: " \
                            "alice's server"
    assert ("What: The GPU-hour budget of the group cs101 is 90% used: 9 of 10 GPU-hours used "
            "this month.") in body["message"]


@pytest.mark.parametrize("event", ["budget-warning", "budget-spent"])
def test_the_documented_messages_are_what_the_code_says(event):
    """docs/usage.md#gpu-hour-budgets shows these, made from the same events."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    (message,) = told(warning() if event == "budget-warning" else spent())
    text = format_message(message, HUB_URL, "h", now=T + 5).text
    assert f"```text\n{text}\n```" in doc, text
