"""GPU-hour budgets: the table's `budgets`, the periods, the hours used, the refusal of a
start with its sentence, the reset, and the hub's watch of running servers (the warning
at warn_at, the stop with `stop: true`, told once and remembered across a restart).

Plain pytest on a real SQLite ledger in a temporary folder; no engine, no hub.
"""

from __future__ import annotations

import itertools
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import jsonschema
import pytest
import yaml
from quota_tables import budget_table as table

from harness import line_of
from spawner.cli import main as cli_main
from spawner.quota.loader import TOP_FIELDS, parse_quota_table
from spawner.quota.model import Budget, QuotaTable, QuotaTableError, Role
from spawner.quota.units import hours_text
from spawner.usage.budgets import (
    BudgetCheck,
    BudgetState,
    BudgetWatch,
    budget_spent,
    budget_warning,
    check_start,
    local_time,
    period,
    running_gpu_sessions,
    states_for,
    used_gpu_hours,
)
from spawner.usage.documents import BUDGET_MEMORY, DatabaseDocuments, FolderDocuments
from spawner.usage.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())
UTC = timezone.utc
HUB = "quota-c9fb1a93a60b"
GPU = Role(name="gpu", cpus=1, memory=2**30, images=("pytorch",), gpus=1)
CPU = Role(name="cpu", cpus=1, memory=2**30, images=("pytorch",))
RESERVED = "Budgets count the time GPUs were reserved, busy or not."


def at(*when: int, tz=UTC) -> float:
    """Epoch seconds of a wall time: at(2026, 11, 18, 12) is 18 Nov 2026 12:00 UTC."""
    return datetime(*when, tzinfo=tz).timestamp()


HOUR = 3600.0
NOW = at(2026, 11, 18, 12)  # a Wednesday


def problems(text: str) -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, "q.yaml")
    return [str(p) for p in info.value.problems]


# --- the table ---------------------------------------------------------------------------

FULL = (
    "  timezone: Europe/Berlin\n"
    "  groups:\n"
    "    cs101: {gpu_hours: 200, per: month}\n"
    "    ml-platform:\n"
    "      gpu_hours: 1000.5\n"
    "      per: week\n"
    "      stop: true\n"
    "      warn_at: 0.75\n"
    "  users:\n"
    "    alice: {gpu_hours: 8, per: day}\n"
    "    'o''brien': {gpu_hours: 1, per: day}\n"
)


def test_budgets_are_read_with_their_defaults():
    t = parse_quota_table(table(FULL), "q.yaml")
    assert t.budgets == (
        Budget("group", "cs101", 200.0, "month"),
        Budget("group", "ml-platform", 1000.5, "week", stop=True, warn_at=0.75),
        Budget("user", "alice", 8.0, "day"),
        Budget("user", "o'brien", 1.0, "day"),
    )
    assert (t.budgets[0].stop, t.budgets[0].warn_at) == (False, 0.9)
    assert t.budget_timezone == "Europe/Berlin"
    assert str(t.budget_zone) == "Europe/Berlin"
    # their own first, then each of their groups'; names found nowhere else are fine
    assert [b.key for b in t.budgets_for("alice", ["cs101", "other", "ml-platform"])] == [
        "user:alice", "group:cs101", "group:ml-platform"]
    assert t.budgets_for("bob", ["other"]) == []


def test_no_budgets_is_none_and_utc():
    t = parse_quota_table(table("  {}\n"), "q.yaml")
    assert (t.budgets, t.budget_timezone, t.budget_zone) == ((), "UTC", UTC)
    plain = table("").replace("budgets:\n", "")
    t = parse_quota_table(plain, "q.yaml")
    assert (t.budgets, t.budget_timezone) == ((), "UTC")
    assert TOP_FIELDS == ("images", "roles", "assignments", "budgets", "requests")


def test_the_schema_takes_budgets_and_refuses_what_the_loader_refuses():
    jsonschema.validate(yaml.safe_load(table(FULL)), SCHEMA)
    for bad in ("  groups: {cs101: {gpu_hours: 200, per: year}}\n",
                "  groups: {cs101: {gpu_hours: 0, per: month}}\n",
                "  groups: {cs101: {gpu_hours: 200}}\n",
                "  users: {a: {gpu_hours: 2, per: day, warn_at: 1.5}}\n",
                "  users: {a: {gpu_hours: 2, per: day, hours: 3}}\n",
                "  owners: {}\n"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(table(bad)), SCHEMA)
        assert problems(table(bad))


@pytest.mark.parametrize("budgets, needle, message", [
    ("  groups:\n    cs101: {gpu_hours: 200, per: month, hours: 3}\n", "hours: 3",
     "unknown key 'hours' in budgets: group 'cs101'; expected one of: gpu_hours, per, stop, "
     "warn_at"),
    ("  groups:\n    cs101: {gpu_hours: 0, per: month}\n", "cs101",
     "budgets: group 'cs101': gpu_hours must be greater than 0, not 0"),
    ("  users:\n    alice: {gpu_hours: -5, per: month}\n", "alice",
     "budgets: user 'alice': gpu_hours must be greater than 0, not -5"),
    ("  users:\n    alice: {gpu_hours: 200h, per: month}\n", "alice",
     "budgets: user 'alice': gpu_hours must be a number, like 2 or 0.5, not text '200h'"),
    ("  users:\n    alice: {gpu_hours: .inf, per: month}\n", "alice",
     "budgets: user 'alice': gpu_hours must be a finite number, not .inf"),
    ("  groups:\n    cs101: {gpu_hours: 200, per: year}\n", "cs101",
     "budgets: group 'cs101': per must be one of day, week, month, not text 'year'"),
    ("  groups:\n    cs101:\n      gpu_hours: 200\n      per: month\n      stop: 'yes'\n",
     "stop:", "budgets: group 'cs101': stop must be true or false, not text 'yes'; "
              "write true or false without quotes"),
    ("  groups:\n    cs101: {gpu_hours: 200, per: month, warn_at: 90}\n", "cs101",
     "budgets: group 'cs101': warn_at (a fraction, like 0.9) must be at most 1, not 90"),
    ("  groups:\n    cs101: {gpu_hours: 200, per: month, warn_at: 0}\n", "cs101",
     "budgets: group 'cs101': warn_at (a fraction, like 0.9) must be greater than 0, not 0"),
    ("  groups:\n    cs101: {gpu_hours: 200}\n", "cs101",
     "budgets: group 'cs101' needs per, like {gpu_hours: 200, per: month}"),
    ("  groups:\n    cs101: {}\n", "cs101",
     "budgets: group 'cs101' needs gpu_hours and per, like {gpu_hours: 200, per: month}"),
    ("  groups:\n    cs101: 200\n", "cs101",
     "budgets: group 'cs101' must be a mapping of keys to values"),
    ("  timezone: Mars/Olympus\n", "timezone",
     "budgets: timezone 'Mars/Olympus' is not a time zone this machine knows; write an IANA "
     "name such as UTC, Europe/Berlin or America/New_York"),
    ("  timezone: ../../etc/passwd\n", "timezone",
     "budgets: timezone '../../etc/passwd' is not a time zone this machine knows; write an "
     "IANA name such as UTC, Europe/Berlin or America/New_York"),
    ("  timezone: 3\n", "timezone", "budgets: timezone must be text"),
    ("  roles:\n    x: {gpu_hours: 1, per: day}\n", "roles:",
     "unknown key 'roles' in budgets; expected one of: timezone, groups, users"),
    ("  users:\n    0123: {gpu_hours: 1, per: day}\n", "0123",
     "the user name 0123 is read by YAML as the number 83; write it in quotes: '0123'"),
    ("  groups:\n    cs101: {gpu_hours: 1, per: day}\n    cs101: {gpu_hours: 2, per: day}\n",
     "gpu_hours: 2", "duplicate key 'cs101' in budgets: groups (first at line 11)"),
    ("  - cs101\n", "- cs101", "budgets must be a mapping of keys to values"),
])
def test_each_mistake_is_refused_with_its_line(budgets, needle, message):
    text = table(budgets)
    line = line_of(text, needle, after="budgets:")
    assert problems(text) == [f"q.yaml:{line}: {message}"]


def test_every_mistake_at_once_and_the_others_still_checked():
    text = table("  groups:\n    a: {gpu_hours: 0, per: year}\n  users:\n    b: {per: day}\n")
    assert problems(text) == [
        "q.yaml:11: budgets: group 'a': gpu_hours must be greater than 0, not 0",
        "q.yaml:11: budgets: group 'a': per must be one of day, week, month, not text 'year'",
        "q.yaml:13: budgets: user 'b' needs gpu_hours, like {gpu_hours: 200, per: month}",
    ]
    assert problems(table("  {}\n").replace("budgets:\n  {}\n", "extra: 1\n")) == [
        "q.yaml:9: unknown key 'extra' in the quota table; expected one of: images, roles, "
        "assignments, budgets, requests"]


def test_show_prints_one_line_per_budget(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(table(FULL))
    assert cli_main(["show", str(path), "--user", "alice", "--group", "cs101"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-3:] == [
        "alice is under 2 GPU-hour budgets (GPU roles only; each applies):",
        "  user alice: 8 GPU-hours per day (from midnight Europe/Berlin) · warned at 90% · "
        "running servers keep running when it is spent",
        "  group cs101: 200 GPU-hours per month (from midnight Europe/Berlin on the 1st), "
        "shared by the group · warned at 90% · running servers keep running when it is spent",
    ]
    assert cli_main(["show", str(path), "--user", "x", "--group", "ml-platform"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  group ml-platform: 1,000.5 GPU-hours per week (from midnight Europe/Berlin on "
        "Mondays), shared by the group · warned at 75% · GPU servers stopped when it is spent")
    assert cli_main(["show", str(path), "--user", "nobody"]) == 0
    assert "budget" not in capsys.readouterr().out
    assert cli_main(["show", str(path), "--user", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budgets"] == [
        {"kind": "user", "name": "alice", "gpu_hours": 8.0, "per": "day", "stop": False,
         "warn_at": 0.9, "timezone": "Europe/Berlin"}]


def test_show_keeps_a_small_or_large_budgets_size(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(table("  users:\n    alice: {gpu_hours: 0.005, per: day}\n"
                          "  groups:\n    big: {gpu_hours: 1000000, per: month}\n"))
    assert cli_main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert cli_main(["show", str(path), "--user", "alice", "--group", "big"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # not '0.005' read as 0, and not '1e+06'
    assert lines[-2].startswith("  user alice: 0.005 GPU-hours per day ")
    assert lines[-1].startswith("  group big: 1,000,000 GPU-hours per month ")


# --- periods ----------------------------------------------------------------------------


def span(per: str, now: float, tz="UTC") -> tuple[str, str]:
    start, end = period(per, now, tz)
    zone = UTC if tz == "UTC" else ZoneInfo(tz)
    return tuple(datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M %Z")
                 for t in (start, end))


def test_day_week_and_month_in_utc():
    assert span("day", NOW) == ("2026-11-18 00:00 UTC", "2026-11-19 00:00 UTC")
    assert span("week", NOW) == ("2026-11-16 00:00 UTC", "2026-11-23 00:00 UTC")
    assert span("month", NOW) == ("2026-11-01 00:00 UTC", "2026-12-01 00:00 UTC")


def test_a_period_holds_its_first_second_not_its_end():
    midnight = at(2026, 11, 23)  # a Monday
    assert span("day", midnight) == ("2026-11-23 00:00 UTC", "2026-11-24 00:00 UTC")
    assert span("week", midnight) == ("2026-11-23 00:00 UTC", "2026-11-30 00:00 UTC")
    assert span("week", midnight - 1) == ("2026-11-16 00:00 UTC", "2026-11-23 00:00 UTC")
    assert span("month", at(2026, 12, 1) - 1) == ("2026-11-01 00:00 UTC",
                                                  "2026-12-01 00:00 UTC")


def test_month_ends_and_leap_years():
    assert span("month", at(2026, 12, 31, 23, 59)) == ("2026-12-01 00:00 UTC",
                                                       "2027-01-01 00:00 UTC")
    assert span("month", at(2027, 1, 31, 12)) == ("2027-01-01 00:00 UTC", "2027-02-01 00:00 UTC")
    start, end = period("month", at(2028, 2, 29, 12), "UTC")
    assert (end - start) / 86400 == 29 and span("month", at(2028, 2, 29, 12))[1].startswith(
        "2028-03-01")
    start, end = period("month", at(2027, 2, 14), "UTC")
    assert (end - start) / 86400 == 28
    assert span("week", at(2026, 12, 31)) == ("2026-12-28 00:00 UTC", "2027-01-04 00:00 UTC")


def test_local_midnight_and_daylight_saving():
    berlin = "Europe/Berlin"
    # 23:30 UTC on 28 March is already 29 March in Berlin
    assert span("day", at(2026, 3, 28, 23, 30), berlin) == ("2026-03-29 00:00 CET",
                                                            "2026-03-30 00:00 CEST")
    hours = {per: (lambda s: (s[1] - s[0]) / HOUR)(period(per, at(2026, 3, 29, 12), berlin))
             for per in ("day", "week", "month")}
    assert hours == {"day": 23, "week": 167, "month": 743}  # the clocks went forward
    start, end = period("day", at(2026, 10, 25, 12), berlin)
    assert (end - start) / HOUR == 25  # and back
    assert start == at(2026, 10, 24, 22)  # midnight CEST is 22:00 UTC
    with pytest.raises(ValueError):
        period("year", NOW, "UTC")


# --- hours used ---------------------------------------------------------------------------


class Sessions:
    """Sessions written with the hub's own Ledger calls, at the times given."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._n = itertools.count(1)

    def add(self, user: str, start: float, stop: float | None = None, gpus: int = 1,
            mode: str = "exclusive", groups: tuple[str, ...] = (), hub: str = HUB,
            started: bool = True) -> str:
        container = f"quota-{user}-{next(self._n)}"
        self.ledger.open(hub=hub, user=user, container=container, role="gpu" if gpus else "cpu",
                         image="pytorch", cpu_limit=1, mem_limit=2**30, groups=groups,
                         requested=start - 5)
        if gpus:
            self.ledger.set_gpus(hub, container, [f"GPU-{i}" for i in range(gpus)], mode, None)
        if started:
            self.ledger.started(hub, container, "c0ffee", when=start)
        if stop is not None:
            self.ledger.close(hub, container, "stopped", when=stop)
        return container


@pytest.fixture
def ledger(ledger_url: str) -> Ledger:
    ledger = Ledger(ledger_url)
    yield ledger
    ledger.dispose()


@pytest.fixture
def s(ledger: Ledger) -> Sessions:
    return Sessions(ledger)


def month_used(ledger: Ledger, kind: str, name: str, now: float = NOW, **kw) -> float:
    start, end = period("month", now, "UTC")
    return used_gpu_hours(ledger.engine, kind, name, start, end, now, **kw)


def test_reserved_hours_in_the_period(ledger, s):
    s.add("alice", at(2026, 10, 31, 22), at(2026, 11, 1, 2))  # 2 of its 4 hours in November
    s.add("alice", at(2026, 11, 2), at(2026, 11, 2, 3), gpus=2)  # 2 GPUs for 3 hours: 6
    s.add("alice", at(2026, 11, 3), at(2026, 11, 3, 4), mode="shared:4")  # a quarter for 4: 1
    s.add("alice", at(2026, 11, 18, 10))  # running, 2 hours up to NOW
    s.add("alice", at(2026, 11, 5), at(2026, 11, 5, 9), gpus=0)  # CPU only: nothing
    s.add("alice", at(2026, 11, 6), started=False)  # never started: nothing reserved
    s.add("alice", at(2026, 10, 3), at(2026, 10, 4))  # last month
    s.add("bob", at(2026, 11, 4), at(2026, 11, 4, 5))
    assert month_used(ledger, "user", "alice") == pytest.approx(2 + 6 + 1 + 2)
    assert month_used(ledger, "user", "bob") == pytest.approx(5)
    assert month_used(ledger, "user", "carol") == 0.0
    # what ran after "now" does not count yet: at 11:00 the running one has 1 hour
    assert month_used(ledger, "user", "alice", at(2026, 11, 18, 11)) == pytest.approx(10)


def test_a_groups_hours_are_its_sessions_whoever_started_them(ledger, s):
    s.add("alice", at(2026, 11, 2), at(2026, 11, 2, 3), groups=("cs101", "ml"))
    s.add("bob", at(2026, 11, 2), at(2026, 11, 2, 2), groups=("cs101",))
    s.add("alice", at(2026, 11, 3), at(2026, 11, 3, 7), groups=("ml",))  # not cs101's
    s.add("carol", at(2026, 11, 4), groups=("cs101",), gpus=2)  # running since 00:00 on the 4th
    running = (NOW - at(2026, 11, 4)) / HOUR * 2
    assert month_used(ledger, "group", "cs101") == pytest.approx(3 + 2 + running)
    assert month_used(ledger, "group", "ml") == pytest.approx(3 + 7)
    assert month_used(ledger, "user", "alice") == pytest.approx(10)
    with pytest.raises(ValueError):
        month_used(ledger, "team", "x")


def test_only_one_hubs_sessions_when_asked(ledger, s):
    s.add("alice", at(2026, 11, 2), at(2026, 11, 2, 3))
    s.add("alice", at(2026, 11, 2), at(2026, 11, 2, 1), hub="quota-other")
    assert month_used(ledger, "user", "alice") == pytest.approx(4)
    assert month_used(ledger, "user", "alice", hub=HUB) == pytest.approx(3)


# --- refusing a start ---------------------------------------------------------------------

CS101 = "  groups:\n    cs101: {gpu_hours: 200, per: month}\n"


def test_a_spent_group_budget_refuses_a_gpu_start_with_the_sentence(ledger, s):
    t = parse_quota_table(table(CS101), "q.yaml")
    s.add("bob", at(2026, 11, 10), at(2026, 11, 12, 2, 6), gpus=4, groups=("cs101",))  # 200.4
    refusal = check_start(ledger.engine, t, "alice", ["cs101"], GPU, NOW)
    assert refusal == (
        "The GPU-hour budget of the group cs101 is spent: 200.4 of 200 GPU-hours used this "
        f"month. {RESERVED} It resets on 1 December 2026 at 00:00 UTC. Roles without GPUs "
        "can still be started.")
    assert check_start(ledger.engine, t, "alice", ["cs101"], CPU, NOW) is None
    assert check_start(ledger.engine, t, "alice", ["other"], GPU, NOW) is None
    (state,) = states_for(ledger.engine, t, "alice", ["cs101"], NOW)
    assert (state.used, state.spent) == (pytest.approx(200.4), True)
    assert (state.start, state.resets_at) == (at(2026, 11, 1), at(2026, 12, 1))


def test_a_budget_not_yet_spent_lets_the_start_through(ledger, s):
    t = parse_quota_table(table(CS101), "q.yaml")
    s.add("bob", at(2026, 11, 10), at(2026, 11, 12, 1, 57), gpus=4, groups=("cs101",))  # 199.8
    assert check_start(ledger.engine, t, "alice", ["cs101"], GPU, NOW) is None
    s.add("bob", at(2026, 11, 13), at(2026, 11, 13, 0, 12), groups=("cs101",))  # exactly 200
    assert check_start(ledger.engine, t, "alice", ["cs101"], GPU, NOW) is not None


def test_the_budget_resets_with_the_period(ledger, s):
    t = parse_quota_table(table(CS101), "q.yaml")
    s.add("bob", at(2026, 11, 10), at(2026, 11, 12, 2, 6), gpus=4, groups=("cs101",))
    assert check_start(ledger.engine, t, "bob", ["cs101"], GPU, at(2026, 12, 1) - 1)
    assert check_start(ledger.engine, t, "bob", ["cs101"], GPU, at(2026, 12, 1)) is None
    (state,) = states_for(ledger.engine, t, "bob", ["cs101"], at(2026, 12, 1))
    assert (state.used, state.resets_at) == (0.0, at(2027, 1, 1))


def test_a_users_own_budget_says_you_and_the_one_that_resets_last_is_named(ledger, s):
    t = parse_quota_table(table(
        "  groups:\n    cs101: {gpu_hours: 4, per: day}\n"
        "  users:\n    alice: {gpu_hours: 10, per: week}\n"), "q.yaml")
    s.add("alice", at(2026, 11, 16, 8), at(2026, 11, 16, 18))  # 10 on Monday, no group
    assert check_start(ledger.engine, t, "alice", ["cs101"], GPU, NOW) == (
        "Your GPU-hour budget is spent: 10 of 10 GPU-hours used this week. "
        f"{RESERVED} It resets on 23 November 2026 at 00:00 UTC. Roles without GPUs can "
        "still be started.")
    assert check_start(ledger.engine, t, "bob", ["cs101"], GPU, NOW) is None
    s.add("bob", at(2026, 11, 18, 6), at(2026, 11, 18, 10), groups=("cs101",))  # 4 today
    refusal = check_start(ledger.engine, t, "alice", ["cs101"], GPU, NOW)
    assert refusal.startswith("Your GPU-hour budget is spent")  # the week's ends last
    assert check_start(ledger.engine, t, "bob", ["cs101"], GPU, NOW).startswith(
        "The GPU-hour budget of the group cs101 is spent: 4 of 4 GPU-hours used today.")


def test_the_reset_is_said_in_the_tables_time_zone(ledger, s):
    t = parse_quota_table(table("  timezone: Europe/Berlin\n" + CS101), "q.yaml")
    s.add("bob", at(2026, 11, 10), at(2026, 11, 19), gpus=1, groups=("cs101",))  # 204 to NOW
    # 23:00 UTC on 31 October is midnight on 1 November in Berlin
    s.add("bob", at(2026, 10, 31, 22), at(2026, 11, 1), gpus=1, groups=("cs101",))
    refusal = check_start(ledger.engine, t, "bob", ["cs101"], GPU, NOW)
    assert "205 of 200 GPU-hours used this month" in refusal
    assert "It resets on 1 December 2026 at 00:00 CET." in refusal
    summer = BudgetState(t.budgets[0], 200.0, 0, at(2026, 7, 1, tz=t.budget_zone))
    assert "It resets on 1 July 2026 at 00:00 CEST." in budget_spent(summer, t.budget_zone)


def test_a_small_budget_is_not_read_as_zero(ledger, s):
    t = parse_quota_table(table("  users:\n    alice: {gpu_hours: 0.005, per: day}\n"),
                          "q.yaml")
    s.add("alice", NOW - 36, NOW)  # 36 seconds of a GPU: 0.01 GPU-hours
    assert check_start(ledger.engine, t, "alice", [], GPU, NOW) == (
        "Your GPU-hour budget is spent: 0.01 of 0.005 GPU-hours used today. "
        f"{RESERVED} It resets on 19 November 2026 at 00:00 UTC. Roles without GPUs can "
        "still be started.")
    (state,) = states_for(ledger.engine, t, "alice", [], NOW)
    half = BudgetState(state.budget, 0.0025, state.start, state.resets_at)
    assert "is 50% used: 0.0025 of 0.005 GPU-hours used today." in budget_warning(half, UTC)
    tiny = BudgetState(state.budget, 0.0001, state.start, state.resets_at)
    assert "is 2% used: <0.001 of 0.005 GPU-hours used today." in budget_warning(tiny, UTC)


def test_hours_text_keeps_small_amounts_and_shortens_large_ones():
    cases = {0: "0", 0.005: "0.005", 0.0123456: "0.0123", 0.05: "0.05", 0.1: "0.1",
             0.00278: "0.00278", 0.001: "0.001", 0.000999: "<0.001", 1e-9: "<0.001",
             1.0: "1", 4.5: "4.5", 9.876: "9.88", 9.9999: "10", 10.04: "10",
             200.4: "200.4", 1234.56: "1,234.6", 1e6: "1,000,000",
             1e16: "10,000,000,000,000,000", -2.5: "-2.5"}
    assert {h: hours_text(h) for h in cases} == cases
    assert all("e" not in hours_text(10.0 ** k) for k in range(-12, 20))


def test_the_sentences_numbers_and_times():
    assert [hours_text(h) for h in (200.4, 200.0, 200.04, 0.05, 1234.56)] == [
        "200.4", "200", "200", "0.05", "1,234.6"]
    assert local_time(at(2026, 12, 1), UTC) == "1 December 2026 at 00:00 UTC"
    # a zone whose abbreviation is a number is named by its offset
    assert local_time(at(2026, 12, 1, 3), ZoneInfo("America/Sao_Paulo")) == \
        "1 December 2026 at 00:00 UTC-03:00"
    assert local_time(at(2026, 12, 1), ZoneInfo("Asia/Kolkata")) == \
        "1 December 2026 at 05:30 IST"


# --- the watch of running servers -------------------------------------------------------

DAY10 = "  groups:\n    cs101: {gpu_hours: 10, per: day%s}\n"
DAY = at(2026, 11, 18)


def watch_table(extra: str = "") -> QuotaTable:
    return parse_quota_table(table(DAY10 % extra), "q.yaml")


def check(watch: BudgetWatch, ledger: Ledger, t: QuotaTable, now: float) -> BudgetCheck:
    return watch.check(ledger.engine, t, running_gpu_sessions(ledger.engine), now)


def test_a_small_budgets_warning_keeps_its_numbers(ledger, s):
    t = parse_quota_table(table("  users:\n    alice: {gpu_hours: 0.005, per: day}\n"),
                          "q.yaml")
    s.add("alice", DAY)
    now = DAY + 0.0046 * HOUR  # 92% of the budget, past its warn_at
    (notice,) = BudgetWatch().check(ledger.engine, t, running_gpu_sessions(ledger.engine),
                                    now).notices
    assert notice.event == "budget-warning"
    assert "% used: 0.0046 of 0.005 GPU-hours used today." in notice.text
    assert (notice.fields()["used"], notice.fields()["gpu_hours"]) == (
        pytest.approx(0.0046), 0.005)


def test_running_sessions_are_the_open_gpu_ones_with_their_groups(ledger, s):
    alice = s.add("alice", DAY, groups=("ml", "cs101"))
    s.add("bob", DAY, gpus=0, groups=("cs101",))  # CPU only
    s.add("carol", DAY, DAY + HOUR, groups=("cs101",))  # stopped
    dave = s.add("dave", DAY, mode="shared:2", hub="quota-other")
    found = running_gpu_sessions(ledger.engine)
    assert [(r.user, r.container, r.groups, r.gpu_reserved) for r in found] == [
        ("alice", alice, ("cs101", "ml"), 1.0), ("dave", dave, (), 0.5)]
    assert [r.user for r in running_gpu_sessions(ledger.engine, hub=HUB)] == ["alice"]


def test_warned_once_at_90_percent_not_at_89(ledger, s, tmp_path):
    t = watch_table()
    container = s.add("alice", DAY, groups=("cs101",))  # 1 GPU from midnight
    watch = BudgetWatch(FolderDocuments(str(tmp_path)))
    assert check(watch, ledger, t, DAY + 8.9 * HOUR).notices == []  # 89%
    found = check(watch, ledger, t, DAY + 9 * HOUR)  # 90%
    (notice,) = found.notices
    assert found.stops == []
    assert (notice.event, notice.user, notice.stopping) == ("budget-warning", "alice", False)
    assert notice.text == (
        "The GPU-hour budget of the group cs101 is 90% used: 9 of 10 GPU-hours used today. "
        f"{RESERVED} When it is spent, no new GPU server can start until it resets; running "
        "servers keep running. It resets on 19 November 2026 at 00:00 UTC.")
    assert notice.fields() == {
        "hub": HUB, "user": "alice", "budget_kind": "group", "budget_name": "cs101",
        "used": 9.0, "gpu_hours": 10.0, "per": "day", "warn_at": 0.9, "period_start": DAY,
        "resets_at": DAY + 24 * HOUR, "text": notice.text, "stopping": False,
        "container": container, "server_name": "", "role": "gpu", "containers": [container]}
    assert check(watch, ledger, t, DAY + 9.5 * HOUR).notices == []  # once


def test_spent_is_told_once_and_the_server_keeps_running_without_stop(ledger, s):
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))
    watch = BudgetWatch()
    check(watch, ledger, t, DAY + 9 * HOUR)
    found = check(watch, ledger, t, DAY + 10 * HOUR)
    (notice,) = found.notices
    assert (notice.event, notice.stopping, found.stops) == ("budget-spent", False, [])
    assert notice.text == (
        "The GPU-hour budget of the group cs101 is spent: 10 of 10 GPU-hours used today. "
        "Your running servers keep running, but no new GPU server can start. "
        f"{RESERVED} It resets on 19 November 2026 at 00:00 UTC. Roles without GPUs can "
        "still be started.")
    assert check(watch, ledger, t, DAY + 11 * HOUR) == BudgetCheck([], [])


def test_stop_true_stops_every_check_and_tells_once(ledger, s):
    t = watch_table(", stop: true")
    first = s.add("alice", DAY, groups=("cs101",))
    second = s.add("alice", DAY + 4 * HOUR, groups=("cs101",))  # a named server
    s.add("alice", DAY + 4 * HOUR, groups=("ml",))  # not under cs101's budget
    watch = BudgetWatch()
    warned = check(watch, ledger, t, DAY + 6 * HOUR)  # 6 + 2 of cs101's: 80%
    assert warned.notices == [] and warned.stops == []
    found = check(watch, ledger, t, DAY + 7 * HOUR)  # 7 + 3
    (notice,) = found.notices  # spent at once: no warning first
    assert (notice.event, notice.stopping) == ("budget-spent", True)
    assert [n.container for n in notice.sessions] == [first, second]
    assert notice.text.startswith(
        "The GPU-hour budget of the group cs101 is spent: 10 of 10 GPU-hours used today. "
        "Your GPU servers are being stopped now, as the quota table says; the home folder "
        "is kept.")
    assert [(x.session.container, x.text) for x in found.stops] == [
        (first, notice.text), (second, notice.text)]
    again = check(watch, ledger, t, DAY + 7 * HOUR + 60)  # not stopped yet: asked again
    assert again.notices == [] and len(again.stops) == 2


def test_the_next_period_warns_again(ledger, s):
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))  # runs on past midnight
    watch = BudgetWatch()
    assert [n.event for n in check(watch, ledger, t, DAY + 9 * HOUR).notices] == [
        "budget-warning"]
    assert [n.event for n in check(watch, ledger, t, DAY + 10 * HOUR).notices] == [
        "budget-spent"]
    tomorrow = DAY + 24 * HOUR
    assert check(watch, ledger, t, tomorrow + 8 * HOUR).notices == []
    (notice,) = check(watch, ledger, t, tomorrow + 9 * HOUR).notices
    assert notice.event == "budget-warning" and notice.state.start == tomorrow


def test_each_user_under_a_group_budget_is_told(ledger, s):
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))
    s.add("bob", DAY + 2 * HOUR, groups=("cs101",))
    s.add("carol", DAY, groups=("other",))
    watch = BudgetWatch()
    found = check(watch, ledger, t, DAY + 5.5 * HOUR)  # 5.5 + 3.5 = 9
    assert [(n.user, n.event) for n in found.notices] == [
        ("alice", "budget-warning"), ("bob", "budget-warning")]
    assert check(watch, ledger, t, DAY + 5.6 * HOUR).notices == []


def test_a_users_budget_and_a_raised_budget(ledger, s):
    t = parse_quota_table(table("  users:\n    alice: {gpu_hours: 2, per: week}\n"), "q.yaml")
    s.add("alice", DAY)
    watch = BudgetWatch()
    (notice,) = check(watch, ledger, t, DAY + 1.8 * HOUR).notices
    assert notice.text.startswith("Your GPU-hour budget is 90% used: 1.8 of 2 GPU-hours used "
                                  "this week.")
    assert notice.fields()["budget_kind"] == "user"
    # the admin raises it: a new budget, warned of again when it nears its end
    raised = parse_quota_table(table("  users:\n    alice: {gpu_hours: 4, per: week}\n"),
                               "q.yaml")
    assert check(watch, ledger, raised, DAY + 2 * HOUR).notices == []
    assert len(check(watch, ledger, raised, DAY + 3.6 * HOUR).notices) == 1


def test_what_was_told_survives_a_new_watch_and_is_forgotten_with_its_period(ledger, s):
    """In the ledger's database (SQLite here, PostgreSQL in test_budgets_postgres.py)."""
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))
    memory = DatabaseDocuments(ledger.engine, "hub-1")
    assert len(check(BudgetWatch(memory), ledger, t, DAY + 9 * HOUR).notices) == 1
    saved = json.loads(memory.read(BUDGET_MEMORY).text)
    assert saved == {"version": 1, "told": [
        {"event": "budget-warning", "budget": "group:cs101", "gpu_hours": 10.0, "period": DAY,
         "user": "alice", "resets_at": DAY + 24 * HOUR}]}
    # another hub's memory is its own
    assert DatabaseDocuments(ledger.engine, "hub-2").read(BUDGET_MEMORY) is None
    # the hub restarts
    assert check(BudgetWatch(memory), ledger, t, DAY + 9.5 * HOUR).notices == []
    watch = BudgetWatch(memory)
    assert [n.event for n in check(watch, ledger, t, DAY + 10 * HOUR).notices] == [
        "budget-spent"]
    assert check(BudgetWatch(memory), ledger, t, DAY + 11 * HOUR).notices == []
    # a new day: yesterday's entries are gone
    check(BudgetWatch(memory), ledger, t, DAY + 25 * HOUR)
    assert json.loads(memory.read(BUDGET_MEMORY).text)["told"] == []


def test_the_memory_of_a_hub_before_its_upgrade_is_read_from_its_file(ledger, s, tmp_path):
    """The state folder's file, from before the memory moved to the database, is read
    while the database has none; from the first save on, the database's row."""
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))
    BudgetWatch(FolderDocuments(str(tmp_path))).check(
        ledger.engine, t, running_gpu_sessions(ledger.engine), DAY + 9 * HOUR)
    assert (tmp_path / BUDGET_MEMORY.file).exists()
    upgraded = DatabaseDocuments(ledger.engine, "hub-1", fallback=FolderDocuments(str(tmp_path)))
    assert check(BudgetWatch(upgraded), ledger, t, DAY + 9.5 * HOUR).notices == []
    assert [n.event for n in check(BudgetWatch(upgraded), ledger, t, DAY + 10 * HOUR).notices
            ] == ["budget-spent"]
    assert DatabaseDocuments(ledger.engine, "hub-1").read(BUDGET_MEMORY) is not None


def test_a_damaged_memory_is_logged_and_started_afresh(ledger, s, tmp_path, caplog):
    t = watch_table()
    s.add("alice", DAY, groups=("cs101",))
    memory = FolderDocuments(str(tmp_path))
    (tmp_path / BUDGET_MEMORY.file).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        watch = BudgetWatch(memory)
    assert "cannot read" in caplog.text
    assert len(check(watch, ledger, t, DAY + 9 * HOUR).notices) == 1
    assert json.loads((tmp_path / BUDGET_MEMORY.file).read_text())["version"] == 1


def test_no_budgets_reads_nothing(ledger, s):
    s.add("alice", DAY, groups=("cs101",))
    t = parse_quota_table(table("  {}\n"), "q.yaml")
    found = check(BudgetWatch(), ledger, t, DAY + 23 * HOUR)
    assert (found.notices, found.stops) == ([], [])
