"""One user's flood of role requests: at most one waiting request per role and at most
``requests: max_open`` waiting requests per user, also when the asks come all at once
(threads, each with its own connection, as the usage service's workers and several
service processes ask), and a ledger that holds duplicates from before is upgraded.

tests/service/test_request_flood_postgres.py runs these again on PostgreSQL."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
from alembic import command
from sqlalchemy import insert, select

from spawner.quota.loader import parse_quota_table
from spawner.quota.model import QuotaTableError
from spawner.usage import grants as rr
from spawner.usage.ledger import (
    Ledger,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
)
from spawner.usage.schema import role_requests

LOG = logging.getLogger("test-request-flood")
ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0
NOW = 1_800_000_000.0
ROLES = [f"lab-{n:02d}" for n in range(40)]
SAME_ROLE = ("You already asked for the role 'lab-00' on 2027-01-15 08:00 UTC; that request "
             "is still waiting for a decision.")


def flood_table(requests: str = ""):
    roles = "".join(f"  {r}: {{cpus: 1, memory: 1G, images: [base]}}\n" for r in ROLES)
    return parse_quota_table(
        "images:\n  base: {image: 'quay.io/jupyter/base-notebook:2024-12-02'}\n"
        f"roles:\n  student: {{cpus: 1, memory: 1G, images: [base]}}\n{roles}"
        "assignments:\n  default: [student]\n"
        f"requests:\n  roles: [{', '.join(ROLES)}]\n{requests}", "q.yaml")


def limit_sentence(waiting: int, limit: int) -> str:
    have = f"{waiting} request{'' if waiting == 1 else 's'}"
    return (f"You have {have} waiting for a decision, and this hub allows {limit} at once: "
            "withdraw one on the requests page (its Withdraw button), or wait for a "
            "decision, before you ask for another.")


def ask(ledger, table, role="lab-00", user="ada", now=NOW):
    return rr.ask(ledger.engine, table, user, ("cs101",), role, now, now + DAY,
                  "An experiment for my thesis", now)


def at_once(count: int, one) -> list[rr.Outcome]:
    """``one(i)`` in ``count`` threads released together; what each returned."""
    start = threading.Barrier(count)
    found: list = [None] * count

    def run(i: int) -> None:
        start.wait()
        try:
            found[i] = one(i)
        except Exception as error:  # the test shows it, not a thread's traceback
            found[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return found


def stored(ledger) -> list[tuple[str, str, str]]:
    with ledger.engine.connect() as connection:
        return [tuple(r) for r in connection.execute(
            select(role_requests.c.user_name, role_requests.c.role, role_requests.c.state)
            .order_by(role_requests.c.id))]


# --- the table's max_open ---------------------------------------------------------------


def test_max_open_is_three_by_default_and_set_in_the_requests_section():
    assert flood_table().requests.max_open == 3
    assert flood_table("  max_open: 1\n").requests.max_open == 1
    for bad, problem in (("0", "a whole number of at least 1, not 0"),
                         ("2.5", "a whole number of at least 1, not 2.5"),
                         ("'3'", "a whole number of at least 1, not text '3'"),
                         ("101", "at most 100, not 101")):
        with pytest.raises(QuotaTableError) as raised:
            flood_table(f"  max_open: {bad}\n")
        assert [p.message for p in raised.value.problems] == [
            f"requests: max_open must be {problem}"]


def test_the_json_schema_takes_max_open_as_the_loader_does():
    schema = json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())
    data = yaml.safe_load("images: {}\nroles: {}\nassignments: {default: []}\n"
                          "requests: {max_open: 5}\n")
    jsonschema.validate(data, schema)
    for bad in (0, 2.5, "3", 101):
        data["requests"] = {"max_open": bad}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, schema)


# --- one after the other ----------------------------------------------------------------


def test_a_user_with_max_open_waiting_requests_is_refused_another_until_one_is_withdrawn(
        ledger):
    table = flood_table()
    first, second, third = (ask(ledger, table, role).request for role in ROLES[:3])
    refused = ask(ledger, table, "lab-03")
    assert (refused.done, refused.refusal, refused.event) == (
        False, limit_sentence(3, 3), None)
    assert ask(ledger, table, "lab-00", user="bob").done  # another user's count is theirs
    assert rr.withdraw(ledger.engine, second.id, "ada", NOW + 1).done
    assert ask(ledger, table, "lab-03").done
    # a decided request is no longer waiting: it makes room as well
    assert rr.decide(ledger.engine, table, first.id, "admin-ann", False, "No", True,
                     NOW + 2).done
    assert rr.decide(ledger.engine, table, third.id, "admin-ann", True, "", True,
                     NOW + 2).done
    assert ask(ledger, table, "lab-04").done and ask(ledger, table, "lab-05").done
    assert ask(ledger, table, "lab-06").refusal == limit_sentence(3, 3)
    # a table that lowers the limit refuses more, and says how many are waiting
    assert ask(ledger, flood_table("  max_open: 1\n"), "lab-07").refusal == (
        limit_sentence(3, 1))
    assert ask(ledger, flood_table("  max_open: 4\n"), "lab-07").done


# --- all at once ------------------------------------------------------------------------


def test_forty_asks_at_once_for_one_role_store_one(ledger):
    table = flood_table()
    for role in ROLES[:3]:  # three rounds: a race that one round may miss
        outcomes = at_once(40, lambda i, role=role: ask(ledger, table, role))
        assert Counter(o.refusal if isinstance(o, rr.Outcome) else repr(o)
                       for o in outcomes) == {None: 1, SAME_ROLE.replace("lab-00", role): 39}
    assert stored(ledger) == [("ada", role, "pending") for role in ROLES[:3]]


def test_forty_asks_at_once_for_forty_roles_store_max_open(ledger):
    table = flood_table()
    outcomes = at_once(40, lambda i: ask(ledger, table, ROLES[i]))
    assert Counter(o.refusal if isinstance(o, rr.Outcome) else repr(o)
                   for o in outcomes) == {None: 3, limit_sentence(3, 3): 37}
    assert [state for _, _, state in stored(ledger)] == ["pending"] * 3


def test_without_the_lock_the_unique_index_still_stores_one_and_says_why(ledger,
                                                                         monkeypatch):
    # another writer that does not take the lock (an older service, a script): the
    # database refuses the second open request, and the user gets the same sentence
    monkeypatch.setattr(rr, "one_at_a_time", lambda *args, **kwargs: None)
    table = flood_table()
    outcomes = at_once(40, lambda i: ask(ledger, table))
    assert Counter(o.refusal if isinstance(o, rr.Outcome) else repr(o)
                   for o in outcomes) == {None: 1, SAME_ROLE: 39}
    assert stored(ledger) == [("ada", "lab-00", "pending")]
    with pytest.raises(Exception, match="(?i)unique"):
        with ledger.engine.begin() as connection:
            connection.execute(insert(role_requests).values(
                user_name="ada", role="lab-00", starts=NOW, ends=NOW + DAY, reason="x",
                state="pending", asked_at=NOW + 5))


# --- the ledger's upgrade ---------------------------------------------------------------


def test_upgrading_a_ledger_with_duplicate_open_requests_keeps_the_oldest(ledger_url):
    engine = make_engine(ledger_url)
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "0007")
    rows = [("ada", "lab-00", "pending", NOW + 20), ("ada", "lab-00", "pending", NOW + 10),
            ("ada", "lab-00", "pending", NOW + 30), ("ada", "lab-00", "refused", NOW),
            ("ada", "lab-01", "pending", NOW), ("bob", "lab-00", "pending", NOW + 40),
            ("bob", "lab-00", "pending", NOW + 40)]
    with engine.begin() as connection:
        for user, role, state, asked in rows:
            connection.execute(insert(role_requests).values(
                user_name=user, role=role, starts=NOW, ends=NOW + DAY, reason="why",
                state=state, asked_at=asked))
    engine.dispose()
    ledger = Ledger(ledger_url, LOG)
    try:
        with ledger.engine.connect() as connection:
            assert current_revision(connection) == head_revision()
            found = {r.id: r for r in connection.execute(
                select(role_requests).order_by(role_requests.c.id))}
        assert {i: r.state for i, r in found.items()} == {
            1: "withdrawn", 2: "pending", 3: "withdrawn", 4: "refused", 5: "pending",
            6: "pending", 7: "withdrawn"}
        for withdrawn, kept in ((1, 2), (3, 2), (7, 6)):
            assert found[withdrawn].decision_comment == (
                "Withdrawn by the ledger's upgrade: a second request for the same role while "
                f"request {kept}, asked for first, was waiting. That one stays; a user has "
                "one waiting request per role.")
            assert found[withdrawn].decided_at is not None
        assert found[4].decision_comment == "" and found[2].decided_at is None
        # the index holds from now on
        refused = rr.ask(ledger.engine, flood_table(), "ada", (), "lab-00", NOW, NOW + DAY,
                         "again", NOW)
        assert refused.refusal == (
            "You already asked for the role 'lab-00' on 2027-01-15 08:00 UTC; that request "
            "is still waiting for a decision.")
    finally:
        ledger.dispose()
