"""The hub's events are typed in one module (spawner/usage/events.py): each kind's name is
defined there once, each has one payload, writers record payloads and the log writes
today's fields, and a record of another version, or another program's, reads back field
by field (docs/preemption.md#the-event-log)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from spawner.usage.event_log import EventLog, read_events
from spawner.usage.events import (
    PAYLOADS,
    BudgetSpent,
    EventKind,
    HubEvent,
    Preemption,
    QueueGranted,
    RoleRequestApproved,
    RoleRequestAsked,
    RoleRequestRefused,
    RoleRequestWithdrawn,
)

ROOT = Path(__file__).resolve().parents[2]
EVENTS_MODULE = Path("spawner/usage/events.py")
T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0

# The names in ledgers and events files since 0.1: they never change.
NAMES = ["preemption", "preempted", "preemption-withdrawn", "queued", "queue-granted",
         "queue-timeout", "queue-left", "budget-warning", "budget-spent", "role-request",
         "role-request-approved", "role-request-refused", "role-request-withdrawn"]

# The same words naming something else, where they are defined (the only ones allowed).
OTHER_MEANINGS = {
    ("spawner/usage/ledger.py", "preempted"): "how a session ended (ledger.PREEMPTED)",
    ("spawner/webapp/charts.py", "preempted"): "that ending's colour and words on the charts",
    ("spawner/watchdog/rules.py", "preemption"): "the watchdog's rule (rules.PREEMPTION)",
}

# The fields each kind writes (docs/preemption.md#the-event-log), besides version, time
# and event.
SERVER = {"hub", "user", "role", "container"}
BUDGET = SERVER | {"budget_kind", "budget_name", "used", "gpu_hours", "per", "warn_at",
                   "period_start", "resets_at", "text", "stopping", "server_name",
                   "containers"}
REQUEST = {"hub", "id", "user", "role", "starts", "ends", "reason", "who", "comment", "text"}
FIELDS = {
    "preemption": SERVER | {"priority", "by", "by_role", "by_priority", "for_container",
                            "gpus", "for_gpus", "grace_period", "deadline", "ran_for",
                            "reason", "server_url"},
    "preempted": SERVER | {"gpus", "by", "by_role", "ran_for"},
    "preemption-withdrawn": SERVER | {"by", "why"},
    "queued": SERVER | {"priority", "position"},
    "queue-granted": SERVER | {"priority", "waited", "preempted"},
    "queue-timeout": SERVER | {"priority", "waited"},
    "queue-left": SERVER | {"priority", "waited"},
    "budget-warning": BUDGET, "budget-spent": BUDGET,
    **dict.fromkeys(NAMES[-4:], REQUEST),
}


def test_every_kind_keeps_its_name_and_has_one_payload():
    assert [k.value for k in EventKind] == NAMES
    assert set(PAYLOADS) == set(EventKind)
    assert all(payload.kind == kind for kind, payload in PAYLOADS.items())
    for kind, payload in PAYLOADS.items():
        assert set(payload().fields()) == FIELDS[kind], kind
        # every field is one from_json reads by its type
        assert all(str(f.type) in ("str", "float | None", "int | None", "bool",
                                   "tuple[str, ...]") for f in dataclasses.fields(payload))


def string_literals(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_each_event_name_is_written_once_in_spawner():
    """No module but usage/events.py spells an event's name: writers and readers use
    EventKind and the payloads, so grep finds each name defined once."""
    found = {}
    for path in sorted((ROOT / "spawner").rglob("*.py")):
        relative = path.relative_to(ROOT)
        for line, value in string_literals(path):
            if value in NAMES and relative != EVENTS_MODULE \
                    and (str(relative), value) not in OTHER_MEANINGS:
                found.setdefault(f"{relative}:{line}", value)
    assert found == {}
    defined = [value for _, value in string_literals(ROOT / EVENTS_MODULE) if value in NAMES]
    assert sorted(defined) == sorted(NAMES)  # each once


def test_a_payload_is_written_with_todays_fields_and_read_back(tmp_path):
    log = EventLog(str(tmp_path / "events.jsonl"))
    preemption = Preemption(
        hub="hub-a", user="frank", role="long-training", priority=300000,
        container="quota-frank", by="bob", by_role="urgent-debug", by_priority=1000000,
        for_container="quota-bob", gpus=("GPU-1",), for_gpus=("GPU-1",),
        grace_period=600.0, deadline=T + 600, ran_for=4500.0,
        reason="bob needs 1 GPU for the role 'urgent-debug' (priority 1000000), which "
               "outranks this server's role 'long-training' (priority 300000).",
        server_url="/user/frank/")
    written = log.append(preemption)
    log.append(QueueGranted(hub="hub-a", user="bob", role="urgent-debug", priority=1000000,
                            container="quota-bob", waited=602.3, preempted=True))
    log.flush()
    first, second = read_events(str(tmp_path / "events.jsonl"))[0]
    assert first == written
    assert first["version"] == 1 and first["event"] == "preemption"
    assert first["gpus"] == ["GPU-1"] and first["priority"] == 300000
    assert set(first) - {"version", "time", "event"} == FIELDS["preemption"]
    read = HubEvent.from_json(first)
    assert read == dataclasses.replace(preemption, time=first["time"], priority=300000.0,
                                       by_priority=1000000.0)
    assert (second["event"], second["preempted"], second["waited"]) == (
        "queue-granted", True, 602.3)
    # the log takes a kind's name and fields as they are too (tools, tests)
    assert log.append("queued", hub="h", user="u")["event"] == "queued"


def request(kind, **kw):
    fields = dict(id=7, user="student1", role="gpu-training", starts=T, ends=T + 7 * DAY,
                  reason="For my thesis.", who="student1", comment="") | kw
    return kind(hub="hub-a", **fields)


def test_a_role_requests_sentence_is_worded_from_its_fields():
    window = "from 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC"
    assert request(RoleRequestAsked).fields()["text"] == (
        f"student1 asks for the role 'gpu-training' {window}: For my thesis.")
    approved = request(RoleRequestApproved, who="prof-ada", comment="ok")
    assert approved.fields()["text"] == (
        f"Your request for the role 'gpu-training' was approved by prof-ada; you hold it "
        f"{window}: ok")
    assert approved.sentence(quote=lambda said: f"<{said}>").endswith(": <ok>")
    assert request(RoleRequestApproved, who="prof-ada").fields()["text"].endswith(
        f"{window}.")
    assert request(RoleRequestRefused, who="admin", comment="Booked.").fields()["text"] == (
        "Your request for the role 'gpu-training' was refused by admin: Booked.")
    assert request(RoleRequestWithdrawn).fields()["text"] == (
        "student1 withdrew the request for the role 'gpu-training'.")


def test_a_record_of_0_1_reads_as_its_payload():
    """As 0.1.0 wrote it: the same fields, its sentence in ``text``."""
    line = ('{"comment": "", "ends": 1795604800.0, "event": "role-request", "hub": "quota-1",'
            ' "id": 3, "reason": "For my thesis.", "role": "gpu-training", "starts": '
            '1795000000.0, "text": "student1 asks for the role \'gpu-training\' from '
            '2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC: For my thesis.", "time": '
            '1795000000.5, "user": "student1", "version": 1, "who": "student1"}')
    read = HubEvent.from_json(json.loads(line))
    assert read == dataclasses.replace(request(RoleRequestAsked, id=3), hub="quota-1",
                                       time=1795000000.5)
    assert read.whole and read.fields()["text"] == json.loads(line)["text"]


@pytest.mark.parametrize("record", [
    {"event": "role-request", "id": True, "user": 1, "starts": float("nan"), "text": 3},
    {"event": "budget-spent", "user": ["a"], "stopping": 1, "used": "much",
     "budget_kind": "team", "containers": "quota-a"},
    {"event": "preemption", "user": "a", "gpus": ["GPU-1", 2, ""], "deadline": 1e400},
])
def test_a_field_of_another_type_is_left_at_its_default(record):
    read = HubEvent.from_json(record)
    assert read is not None and type(read) is PAYLOADS[EventKind(record["event"])]
    facts = read.facts()
    assert facts["event"] == record["event"]
    kept = {k: v for k, v in facts.items() if k != "event"}
    assert kept in ({}, {"user": "a", "gpus": ["GPU-1"]})
    assert HubEvent.from_json(facts) == read  # what a reader keeps reads the same
    if isinstance(read, BudgetSpent):
        assert (read.stopping, read.budget_kind, read.containers) == (False, "", ())


def test_a_kind_this_version_does_not_know_is_none():
    assert HubEvent.from_json({"event": "gpu-melted", "user": "a"}) is None
    assert HubEvent.from_json({"event": ["preemption"]}) is None
    assert HubEvent.from_json({}) is None
