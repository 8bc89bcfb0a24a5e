"""Requests for a bigger role: the table's requests section, asking, deciding,
withdrawing, grants that end by themselves, and the spawner honouring them."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml
from alembic import command
from sqlalchemy import select

from spawner.docker.choices import ChoicesMixin
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import QuotaTableError, RequestRules
from spawner.quota.options import OptionsError, resolve_choice
from spawner.usage import grants as rr
from spawner.usage.event_log import EventLog, read_events
from spawner.usage.ledger import (
    Ledger,
    LedgerWriter,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
)
from spawner.usage.schema import role_requests, sessions, table_versions

LOG = logging.getLogger("test-role-requests")
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())
DAY = 86400.0
NOW = 1_800_000_000.0

TABLE = """\
images:
  base: {image: "quay.io/jupyter/base-notebook:2024-12-02"}
roles:
  student: {cpus: 1, memory: 2G, images: [base]}
  gpu-training: {cpus: 8, memory: 32G, images: [base]}
  senior-engineer: {cpus: 16, memory: 64G, images: [base]}
  instructor: {cpus: 2, memory: 4G, images: [base]}
assignments:
  default: [student]
  groups:
    cs101: [student]
  users:
    zoe: [student, gpu-training]
"""
REQUESTS = "requests: {roles: [gpu-training, senior-engineer], max_days: 14, " \
           "instructors_approve: true}\n"


def table(requests: str = REQUESTS):
    return parse_quota_table(TABLE + requests, "q.yaml")


def problems(requests: str) -> list[str]:
    with pytest.raises(QuotaTableError) as raised:
        table(requests)
    return [str(p) for p in raised.value.problems]



def ask(ledger, t, user="ada", role="gpu-training", starts=NOW, ends=NOW + 7 * DAY,
        reason="Training a model for my thesis", groups=("cs101",), now=NOW):
    return rr.ask(ledger.engine, t, user, groups, role, starts, ends, reason, now)


# --- the table's requests section ---------------------------------------------------------


def test_the_requests_section_is_read_and_off_by_default():
    t = table()
    assert t.requests == RequestRules(("gpu-training", "senior-engineer"), 14.0, True)
    assert t.requests.max_seconds == 14 * DAY
    assert table("").requests == RequestRules((), 14.0, False)
    assert table("requests: {roles: [gpu-training]}\n").requests == RequestRules(
        ("gpu-training",), 14.0, False)
    jsonschema.validate(yaml.safe_load(TABLE + REQUESTS), SCHEMA)


def test_every_mistake_in_requests_is_reported_with_its_line():
    assert problems("requests:\n  roles: [gpu-training, boss]\n  max_days: 0\n"
                    "  instructors_approve: 'yes'\n  expires: 3\n") == [
        "q.yaml:15: requests: roles names role 'boss', which is not under roles (known: "
        "gpu-training, instructor, senior-engineer, student)",
        "q.yaml:16: requests: max_days must be greater than 0, not 0",
        "q.yaml:17: requests: instructors_approve must be true or false, not text 'yes'; "
        "write true or false without quotes",
        "q.yaml:18: unknown key 'expires' in requests; expected one of: roles, max_days, "
        "instructors_approve, max_open",
    ]
    assert problems("requests: {max_days: -2}\n") == [
        "q.yaml:14: requests: max_days must be greater than 0, not -2"]
    assert problems("requests: {max_days: 400}\n") == [
        "q.yaml:14: requests: max_days must be at most 366, not 400"]
    for bad in ({"roles": ["gpu-training"], "max_days": 0}, {"extra": 1},
                {"instructors_approve": "yes"}):
        data = yaml.safe_load(TABLE)
        data["requests"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, SCHEMA)


# --- asking ---------------------------------------------------------------------------------


def test_asking_records_a_pending_request_and_its_event(ledger):
    outcome = ask(ledger, table())
    assert outcome.done and outcome.event == rr.ASKED
    request = outcome.request
    assert (request.user_name, request.role, request.state, request.groups) == (
        "ada", "gpu-training", rr.PENDING, ("cs101",))
    assert rr.get(ledger.engine, request.id) == request
    assert outcome.fields == {
        "id": request.id, "user": "ada", "role": "gpu-training", "starts": NOW,
        "ends": NOW + 7 * DAY, "reason": "Training a model for my thesis", "who": "ada",
        "comment": "",
        "text": "ada asks for the role 'gpu-training' from 2027-01-15 08:00 UTC to "
                "2027-01-22 08:00 UTC: Training a model for my thesis"}
    assert rr.pending(ledger.engine) == [request]
    assert rr.pending(ledger.engine, ["cs101", "other"]) == [request]
    assert rr.pending(ledger.engine, ["ml"]) == []
    assert rr.requests_of(ledger.engine, "ada") == [request]


@pytest.mark.parametrize("kwargs, sentence", [
    (dict(role="instructor"), "The role 'instructor' cannot be requested; these can: "
                              "gpu-training, senior-engineer."),
    (dict(role="nope"), "The role 'nope' cannot be requested; these can: "
                        "gpu-training, senior-engineer."),
    (dict(user="zoe"), "You already hold the role 'gpu-training'."),
    (dict(starts=NOW - 9 * DAY, ends=NOW - DAY),
     "The window you asked for has already ended; choose an end in the future."),
    (dict(starts=NOW + 2 * DAY, ends=NOW + DAY), "The window must end after it starts."),
    (dict(ends=NOW + 15 * DAY),
     "The window you asked for is 15 days long; the longest this hub grants is 14 days."),
    (dict(reason="   "), "Please say why you need this role; admins decide on the reason."),
    (dict(reason="x" * 2001), "Please keep the reason under 2000 characters."),
])
def test_a_request_that_cannot_be_made_is_refused_with_a_sentence(ledger, kwargs, sentence):
    outcome = ask(ledger, table(), **kwargs)
    assert (outcome.done, outcome.refusal, outcome.event) == (False, sentence, None)
    assert rr.pending(ledger.engine) == []


def test_no_requests_section_means_nothing_can_be_requested(ledger):
    assert ask(ledger, table("")).refusal == (
        "Roles cannot be requested on this hub; ask an admin.")


def test_a_window_that_began_already_starts_now(ledger):
    request = ask(ledger, table(), starts=NOW - DAY, ends=NOW + 13.5 * DAY).request
    assert (request.starts, request.ends) == (NOW, NOW + 13.5 * DAY)


def test_a_second_request_for_the_same_role_waits_for_the_first(ledger):
    t = table()
    first = ask(ledger, t).request
    assert ask(ledger, t, ends=NOW + 2 * DAY).refusal == (
        "You already asked for the role 'gpu-training' on 2027-01-15 08:00 UTC; that "
        "request is still waiting for a decision.")
    assert ask(ledger, t, role="senior-engineer").done  # another role is another request
    rr.decide(ledger.engine, t, first.id, "admin-ann", True, "", True, NOW)
    assert ask(ledger, t, starts=NOW + DAY, ends=NOW + 3 * DAY).refusal == (
        "You already have the role 'gpu-training' granted from 2027-01-15 08:00 UTC to "
        "2027-01-22 08:00 UTC.")
    # after the grant, a new window may be asked for
    assert ask(ledger, t, starts=NOW + 7 * DAY, ends=NOW + 10 * DAY).done


# --- deciding -------------------------------------------------------------------------------


def test_an_approval_is_a_grant_for_its_window_only(ledger, tmp_path):
    t = table()
    request = ask(ledger, t, starts=NOW + DAY, ends=NOW + 3 * DAY).request
    outcome = rr.decide(ledger.engine, t, request.id, "admin-ann", True, "  Go ahead ", True,
                        NOW + 60)
    assert outcome.done and outcome.event == rr.APPROVED_EVENT
    assert outcome.request.state == rr.APPROVED
    assert (outcome.request.decided_by, outcome.request.decided_at,
            outcome.request.decision_comment) == ("admin-ann", NOW + 60, "Go ahead")
    assert outcome.fields["who"] == "admin-ann" and outcome.fields["comment"] == "Go ahead"
    assert outcome.fields["text"] == (
        "Your request for the role 'gpu-training' was approved by admin-ann; you hold it "
        "from 2027-01-16 08:00 UTC to 2027-01-18 08:00 UTC: Go ahead")
    assert rr.get(ledger.engine, request.id) == outcome.request  # the audit row
    assert rr.pending(ledger.engine) == []
    # the grant ends by itself: nothing before the window, the role inside, nothing after
    assert rr.granted_roles(ledger.engine, "ada", NOW) == set()
    assert rr.granted_roles(ledger.engine, "ada", NOW + DAY) == {"gpu-training"}
    assert rr.granted_roles(ledger.engine, "ada", NOW + 3 * DAY - 1) == {"gpu-training"}
    assert rr.granted_roles(ledger.engine, "ada", NOW + 3 * DAY) == set()
    assert rr.granted_roles(ledger.engine, "bob", NOW + DAY) == set()
    # the caller appends the event: the user is told through the watchdog
    events = EventLog(str(tmp_path / "events.jsonl"))
    outcome.emit(events, hub="hub-a")
    events.flush()
    (written,), _ = read_events(str(tmp_path / "events.jsonl"))
    assert written["event"] == "role-request-approved" and written["hub"] == "hub-a"
    assert (written["user"], written["role"], written["ends"]) == (
        "ada", "gpu-training", NOW + 3 * DAY)


def test_a_refusal_needs_a_comment_and_tells_the_user(ledger):
    t = table()
    request = ask(ledger, t).request
    assert rr.decide(ledger.engine, t, request.id, "admin-ann", False, " ", True,
                     NOW).refusal == "Please say why you refuse: the user is told."
    outcome = rr.decide(ledger.engine, t, request.id, "admin-ann", False,
                        "Use the shared queue", True, NOW)
    assert outcome.event == rr.REFUSED_EVENT and outcome.request.state == rr.REFUSED
    assert outcome.fields["text"] == (
        "Your request for the role 'gpu-training' was refused by admin-ann: "
        "Use the shared queue")
    assert rr.granted_roles(ledger.engine, "ada", NOW + DAY) == set()
    # decided once only
    again = rr.decide(ledger.engine, t, request.id, "admin-bo", True, "", True, NOW)
    assert again.refusal == "This request was already refused by admin-ann."
    assert rr.decide(ledger.engine, t, 999, "admin-ann", True, "", True, NOW).refusal == (
        "There is no request 999.")


def test_approvals_that_cannot_hold_are_refused(ledger):
    t = table()
    request = ask(ledger, t, ends=NOW + DAY).request
    assert rr.decide(ledger.engine, t, request.id, "ada", True, "", True, NOW).refusal == (
        "You cannot decide your own request.")
    assert rr.decide(ledger.engine, t, request.id, "admin-ann", True, "", True,
                     NOW + DAY).refusal == (
        "The window of this request has already ended; it can only be refused.")
    gone = parse_quota_table(TABLE.replace(
        "  gpu-training: {cpus: 8, memory: 32G, images: [base]}\n", "").replace(
        ", gpu-training]", "]"), "q.yaml")
    assert rr.decide(ledger.engine, gone, request.id, "admin-ann", True, "", True,
                     NOW).refusal == (
        "The role 'gpu-training' is no longer in the quota table; refuse this request.")
    assert rr.get(ledger.engine, request.id).state == rr.PENDING


def test_an_instructor_decides_only_for_their_group_and_only_when_the_table_allows(ledger):
    t = table()
    ada = ask(ledger, t, user="ada", groups=("cs101",)).request
    max_ = ask(ledger, t, user="max", groups=("ml",)).request
    teacher = rr.decider(t, admin=False, instructor_of=["cs101"])
    assert rr.decide(ledger.engine, t, max_.id, "prof-kim", True, "", teacher,
                     NOW).refusal == "You may not decide the requests of max."
    assert rr.decide(ledger.engine, t, ada.id, "prof-kim", True, "", teacher, NOW).done
    # the requester's groups now, when the caller knows them, win over those when asked
    now_in_cs101 = rr.decider(t, admin=False, instructor_of=["cs101"],
                              groups_of=lambda user: ["cs101"])
    assert now_in_cs101(max_)
    assert not rr.decider(t, admin=False, instructor_of=["cs101"],
                          groups_of=lambda user: [])(max_)
    # a table without instructors_approve: only admins
    strict = table("requests: {roles: [gpu-training]}\n")
    assert not rr.decider(strict, admin=False, instructor_of=["cs101"])(max_)
    assert not rr.decider(t, admin=False)(max_)
    assert rr.decider(strict, admin=True)(max_)
    assert rr.decide(ledger.engine, strict, max_.id, "prof-kim", True, "",
                     rr.decider(strict, admin=False, instructor_of=["ml"]), NOW).refusal == (
        "You may not decide the requests of max.")
    assert rr.decide(ledger.engine, strict, max_.id, "admin-ann", True, "", True, NOW).done


def test_withdrawing_a_request_or_a_grant(ledger):
    t = table()
    request = ask(ledger, t).request
    assert rr.withdraw(ledger.engine, request.id, "bob", NOW).refusal == (
        f"You have no request {request.id}.")
    outcome = rr.withdraw(ledger.engine, request.id, "ada", NOW + 5)
    assert outcome.event == rr.WITHDRAWN_EVENT and outcome.request.state == rr.WITHDRAWN
    assert outcome.fields["text"] == "ada withdrew the request for the role 'gpu-training'."
    assert rr.decide(ledger.engine, t, request.id, "admin-ann", True, "", True,
                     NOW).refusal == "This request was already withdrawn by ada."
    assert rr.withdraw(ledger.engine, request.id, "ada", NOW).refusal == (
        "This request is withdrawn and has nothing to withdraw.")
    # a grant given up ends at once
    grant = ask(ledger, t).request
    rr.decide(ledger.engine, t, grant.id, "admin-ann", True, "", True, NOW)
    assert rr.granted_roles(ledger.engine, "ada", NOW + 1) == {"gpu-training"}
    assert rr.withdraw(ledger.engine, grant.id, "ada", NOW + 2).done
    assert rr.granted_roles(ledger.engine, "ada", NOW + 3) == set()
    ended = ask(ledger, t, ends=NOW + DAY).request
    rr.decide(ledger.engine, t, ended.id, "admin-ann", True, "", True, NOW)
    assert rr.withdraw(ledger.engine, ended.id, "ada", NOW + DAY).refusal == (
        "This grant has already ended.")
    assert [r.state for r in rr.requests_of(ledger.engine, "ada")] == [
        rr.APPROVED, rr.WITHDRAWN, rr.WITHDRAWN]


# --- the spawner honours grants -------------------------------------------------------------


def test_a_granted_role_is_offered_and_accepted():
    t = table()
    assert [c.key for c in t.choices_for("ada", ["cs101"])] == ["student/base"]
    with pytest.raises(OptionsError):
        resolve_choice(t.choices_for("ada", ["cs101"]), {"profile": "gpu-training"})
    choices = t.choices_for("ada", ["cs101"], {"gpu-training", "gone-from-the-table"})
    assert [c.key for c in choices] == ["student/base", "gpu-training/base"]
    assert resolve_choice(choices, {"profile": "gpu-training"}).role.name == "gpu-training"
    # a user under default keeps default's roles beside the grant
    assert t.role_names_for("bob", [], ["senior-engineer"]) == ["student", "senior-engineer"]


def test_the_spawner_reads_grants_from_the_ledger_and_nothing_without_one(ledger):
    t = table()
    now = time.time()  # the spawner asks at the real now
    grant = ask(ledger, t, starts=now, ends=now + DAY, now=now).request
    rr.decide(ledger.engine, t, grant.id, "admin-ann", True, "", True, now)
    spawner = SimpleNamespace(user=SimpleNamespace(name="ada"), log=LOG)

    async def read(pool):
        return await ChoicesMixin.granted_roles(spawner, pool)

    assert asyncio.run(read(SimpleNamespace(usage=None))) == set()
    writer = LedgerWriter(ledger, LOG)
    assert asyncio.run(read(SimpleNamespace(usage=writer))) == {"gpu-training"}
    ledger.dispose()  # a ledger that cannot be read: logged, no grant
    broken = LedgerWriter(SimpleNamespace(engine=None), LOG)
    assert asyncio.run(read(SimpleNamespace(usage=broken))) == set()


# --- the ledger's migration -----------------------------------------------------------------


def test_upgrading_a_ledger_from_0002_to_0003_keeps_its_rows(tmp_path):
    path = tmp_path / "usage.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "0002")
    with engine.begin() as connection:
        connection.execute(sessions.insert().values(
            hub="hub-a", user_name="ada", container="jupyter-ada", role="student",
            cpu_limit=1.0, mem_limit=2**31, requested=100.0))
        connection.execute(table_versions.insert().values(
            path="/q.yaml", at=1.0, who="ann", comment="first", sha256="0" * 64, text="x"))
    engine.dispose()
    ledger = Ledger(f"sqlite:///{path}", LOG)
    with ledger.engine.connect() as connection:
        assert current_revision(connection) == head_revision()  # 0003 or later
        assert connection.execute(select(sessions.c.user_name)).scalars().all() == ["ada"]
        assert connection.execute(select(table_versions.c.who)).scalars().all() == ["ann"]
        assert connection.execute(select(role_requests)).all() == []
    assert (tmp_path / "usage.sqlite.0002.bak").exists()
    assert ask(ledger, table()).done
    ledger.dispose()


def test_the_events_are_documented():
    doc = (ROOT / "docs" / "role-requests.md").read_text()
    for event in (rr.ASKED, rr.APPROVED_EVENT, rr.REFUSED_EVENT, rr.WITHDRAWN_EVENT):
        assert f"`{event}`" in doc
