"""Usage reports: numbers against hand-computed values on a seeded ledger, in every format;
the right-sizing advice on seeded sessions; the report and ledger commands."""

import csv
import io
import json
from dataclasses import asdict
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, update

from spawner.cli import main as cli_main
from spawner.quota.model import QuotaTable, Role
from spawner.usage.ledger import Ledger, head_revision
from spawner.usage.report import (
    Advice,
    Report,
    Row,
    build_report,
    daily_gpu_hours,
    format_report,
    home_size_for,
    month_start,
    parse_time,
    user_sessions,
)
from spawner.usage.schema import session_groups, sessions

G = 2**30
H = 3600.0
UTC = timezone.utc
SINCE, UNTIL, NOW = 100 * H, 200 * H, 250 * H
LIMITS = {  # role: cpu_limit, mem_limit, gpu_count, gpu_mode, gpu_reserved
    "small": (1.0, 2 * G, 0, "", 0.0),
    "big": (2.0, 4 * G, 0, "", 0.0),
    "gpu": (4.0, 16 * G, 1, "exclusive", 1.0),
    "shared": (2.0, 8 * G, 1, "shared:4", 0.25),
}


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=1e-12)


def add(connection, user, role, *, started, stopped=None, requested=None, reason=None,
        image="py", groups=(), cpu=None, mem=None, gpu=None, gpu_mem=None, home=(None, None)):
    """One session. cpu, mem, gpu, gpu_mem: (samples, sum, peak) folded from samples;
    home: (its size, its peak)."""
    cpu_limit, mem_limit, gpu_count, mode, reserved = LIMITS[role]
    values = dict(
        hub="", user_name=user, container=f"jupyter-{user}", role=role, image=image,
        gpus=",".join(f"GPU-{i}" for i in range(gpu_count)), gpu_count=gpu_count,
        gpu_mode=mode, gpu_reserved=reserved, cpu_limit=cpu_limit, mem_limit=mem_limit,
        requested=requested if requested is not None else started, started=started,
        ready=None if started is None else started + 5, stopped=stopped,
        reason=reason if stopped is not None else None, home_size=home[0], home_peak=home[1])
    if cpu:
        values.update(cpu_samples=cpu[0], cpu_sum=cpu[1], cpu_peak=cpu[2])
    if mem:
        values.update(mem_samples=mem[0], mem_sum=mem[1], mem_peak=mem[2])
    if gpu:
        values.update(gpu_samples=gpu[0], gpu_util_sum=gpu[1], gpu_util_peak=gpu[2],
                      gpu_mem_sum=0.0, gpu_mem_peak=gpu_mem)
    session_id = connection.execute(insert(sessions).values(**values)).inserted_primary_key[0]
    for name in groups:
        connection.execute(insert(session_groups).values(session_id=session_id,
                                                         group_name=name))
    return session_id


@pytest.fixture
def ledger(ledger_url):
    """Sessions around the window [100 h, 200 h), now 250 h; the hours in each comment."""
    ledger = Ledger(ledger_url)
    with ledger.engine.begin() as c:
        # 1: crosses the window's start: 10 h; CPU mean 0.5, memory mean 1 GiB
        add(c, "alice", "big", started=90 * H, stopped=110 * H, reason="culled",
            groups=["cs101"], cpu=(10, 5.0, 0.8), mem=(10, 10 * G, int(1.5 * G)),
            home=(10 * G, 3 * G))
        # 2: inside: 4 h; CPU mean 1, memory mean 2 GiB; her home grew to 20 GiB
        add(c, "alice", "big", started=120 * H, stopped=124 * H, reason="stopped",
            groups=["cs101"], cpu=(4, 4.0, 1.5), mem=(4, 8 * G, 3 * G), home=(20 * G, 5 * G))
        # 3: still running: clipped at the window's end, 30 h; GPU mean 0.5; its home
        # never sampled
        add(c, "bob", "gpu", started=170 * H, image="torch", groups=["cs101", "lab"],
            cpu=(10, 20.0, 3.0), mem=(10, 40 * G, 6 * G), gpu=(10, 5.0, 0.9),
            gpu_mem=8 * G, home=(20 * G, None))
        # 4: a quarter of a shared GPU for 20 h, never sampled
        add(c, "bob", "shared", started=140 * H, stopped=160 * H, reason="preempted",
            image="torch", groups=["lab"])
        # 5: crosses the window's end: 10 h in it, still running at its end
        add(c, "carol", "big", started=190 * H, stopped=210 * H, reason="oom", image="r",
            cpu=(2, 3.0, 2.0), mem=(2, 6 * G, 4 * G))
        # 6: a failed start asked for in the window: a session, no hours
        add(c, "carol", "big", started=None, requested=150 * H, stopped=150.1 * H,
            reason="failed", image="r")
        # 7: starts exactly at the window's start: 2 h of a quarter GPU, never busy; a
        # home without a size
        add(c, "erin", "shared", started=100 * H, stopped=102 * H, reason="oom",
            image="torch", groups=["lab"], cpu=(4, 2.0, 1.0), mem=(4, 8 * G, 3 * G),
            gpu=(4, 0.0, 0.0), gpu_mem=0, home=(None, G))
        # not in the window: before it, ending at its start, after it, a failed start before
        add(c, "dave", "big", started=50 * H, stopped=90 * H, reason="stopped",
            groups=["cs101"])
        add(c, "dave", "big", started=80 * H, stopped=100 * H, reason="stopped")
        add(c, "dave", "big", started=200 * H, stopped=220 * H, reason="stopped",
            home=(50 * G, 40 * G))
        add(c, "dave", "big", started=None, requested=95 * H, stopped=96 * H,
            reason="failed")
    yield ledger
    ledger.dispose()


def row(key, sessions, ended, gpu_hours, gpu_used, cpu_hours, cpu_used, mem_hours, mem_used,
        home=(None, None)):
    return Row(key=key, sessions=sessions, ended=ended, gpu_hours=gpu_hours,
               gpu_used=gpu_used, cpu_hours=cpu_hours, cpu_used=cpu_used,
               memory_gib_hours=mem_hours, memory_used=mem_used, home_size=home[0],
               home_peak=home[1])


# Worked by hand from the fixture's comments: hours x limit; used = mean x hours over the
# reserved hours of the sampled sessions.
BY_USER = [
    row("alice", 2, {"stopped": 1, "culled": 1}, 0.0, None,
        2 * 14, (0.5 * 10 + 1 * 4) / 28, 4 * 14, (1 * 10 + 2 * 4) / 56, (20 * G, 5 * G)),
    row("bob", 2, {"preempted": 1, "running": 1}, 1 * 30 + 0.25 * 20, 0.5 * 30 / 30,
        4 * 30 + 2 * 20, 2 * 30 / (4 * 30), 16 * 30 + 8 * 20, 4 * 30 / (16 * 30),
        (20 * G, None)),
    row("carol", 2, {"failed": 1, "running": 1}, 0.0, None,
        2 * 10, 1.5 * 10 / 20, 4 * 10, 3 * 10 / 40),
    row("erin", 1, {"oom": 1}, 0.25 * 2, 0.0, 2 * 2, 0.5 * 2 / 4, 8 * 2, 2 * 2 / 16,
        (None, G)),
]
TOTAL = row("", 7, {"stopped": 1, "culled": 1, "preempted": 1, "oom": 1, "failed": 1,
                    "running": 2},
            35.5, 15 / 30.5, 212.0, (9 + 60 + 15 + 1) / (28 + 120 + 20 + 4),
            752.0, (18 + 120 + 30 + 4) / (56 + 480 + 40 + 16), (20 * G, 5 * G))
BY_ROLE = [
    row("big", 4, {"stopped": 1, "culled": 1, "failed": 1, "running": 1}, 0.0, None,
        48.0, (9 + 15) / 48, 96.0, (18 + 30) / 96, (20 * G, 5 * G)),
    row("gpu", 1, {"running": 1}, 30.0, 0.5, 120.0, 0.5, 480.0, 0.25, (20 * G, None)),
    row("shared", 2, {"preempted": 1, "oom": 1}, 5.5, 0.0, 44.0, 1 / 4, 176.0, 4 / 16,
        (None, G)),
]
BY_GROUP = [  # a session in two groups counts in both, and once in the total
    row("(no group)", 2, {"failed": 1, "running": 1}, 0.0, None, 20.0, 0.75, 40.0, 0.75),
    row("cs101", 3, {"stopped": 1, "culled": 1, "running": 1}, 30.0, 0.5,
        148.0, (9 + 60) / 148, 536.0, (18 + 120) / 536, (20 * G, 5 * G)),
    # the largest size (bob's) and the largest peak (erin's), of different homes
    row("lab", 3, {"preempted": 1, "oom": 1, "running": 1}, 35.5, 15 / 30.5,
        164.0, (60 + 1) / (120 + 4), 656.0, (120 + 4) / (480 + 16), (20 * G, G)),
]
BY_IMAGE = [
    row("py", 2, {"stopped": 1, "culled": 1}, 0.0, None, 28.0, 9 / 28, 56.0, 18 / 56,
        (20 * G, 5 * G)),
    row("r", 2, {"failed": 1, "running": 1}, 0.0, None, 20.0, 0.75, 40.0, 0.75),
    row("torch", 3, {"preempted": 1, "oom": 1, "running": 1}, 35.5, 15 / 30.5,
        164.0, 61 / 124, 656.0, 124 / 496, (20 * G, G)),
]
EXPECTED = {"user": BY_USER, "role": BY_ROLE, "group": BY_GROUP, "image": BY_IMAGE}
NUMBERS = ("gpu_hours", "gpu_used", "cpu_hours", "cpu_used", "memory_gib_hours", "memory_used")
HOMES = ("home_size", "home_peak")  # bytes, exact


def assert_row(found, expected):
    assert (found.key, found.sessions, found.ended) == (
        expected.key, expected.sessions, expected.ended)
    assert list(found.ended) == list(expected.ended)  # the reasons' order, then running
    for name in NUMBERS:
        want = getattr(expected, name)
        got = getattr(found, name)
        assert (got is None) == (want is None), (found.key, name, got)
        if want is not None:
            assert got == approx(want), (found.key, name)
    assert [getattr(found, name) for name in HOMES] == [
        getattr(expected, name) for name in HOMES], found.key


@pytest.mark.parametrize("by", ["user", "role", "group", "image"])
def test_report_rows(ledger, by):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by=by, now=NOW)
    assert [r.key for r in report.rows] == [r.key for r in EXPECTED[by]]
    for found, expected in zip(report.rows, EXPECTED[by], strict=True):
        assert_row(found, expected)
    assert_row(report.total, TOTAL)
    assert report.advice == []
    assert (report.since, report.until, report.now, report.by) == (SINCE, UNTIL, NOW, by)


def test_running_session_ends_now(ledger):
    """Before the window's end, a running session counts up to now."""
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by="user", now=180 * H)
    bob = next(r for r in report.rows if r.key == "bob")
    assert bob.gpu_hours == approx(10 + 5)  # 170 h to 180 h, and session 4
    assert bob.cpu_hours == approx(4 * 10 + 2 * 20)


def test_report_of_one_group(ledger):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by="user", group="lab",
                          now=NOW)
    assert [r.key for r in report.rows] == ["bob", "erin"]
    assert_row(report.rows[0], BY_USER[1])
    assert_row(report.rows[1], BY_USER[3])
    assert report.total.sessions == 3
    assert report.total.gpu_hours == approx(35.5)
    assert report.group == "lab"


def test_unknown_by_is_refused(ledger):
    with pytest.raises(ValueError, match="by must be one of user, role, group, image"):
        build_report(ledger.engine, since=SINCE, until=UNTIL, by="hub", now=NOW)


def test_table_format(ledger):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by="user", now=NOW)
    assert format_report(report, "table") == """\
Usage from 1970-01-05 04:00 UTC to 1970-01-09 08:00 UTC, by user

User     Sessions  GPU-h  GPU used  CPU-h  CPU used  Mem GiB-h  Mem used             Home  Ended
alice           2      0         -     28       32%         56       32%  5 GiB of 20 GiB  1 stopped, 1 culled
bob             2     35       50%    160       50%        640       25%      - of 20 GiB  1 preempted, 1 running
carol           2      0         -     20       75%         40       75%                -  1 failed, 1 running
erin            1    0.5        0%      4       25%         16       25%            1 GiB  1 oom
------------------------------------------------------------------------------------------------
(total)         7   35.5       49%    212       49%        752       29%  5 GiB of 20 GiB  1 stopped, 1 culled, 1 preempted, 1 oom, 1 failed, 2 running
"""


@pytest.mark.parametrize("by", ["user", "role", "group", "image"])
def test_csv_format(ledger, by):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by=by, now=NOW)
    rows = list(csv.DictReader(io.StringIO(format_report(report, "csv"))))
    reasons = ["stopped", "culled", "max-age", "preempted", "oom", "failed", "zombie",
               "budget", "lost", "running"]
    assert list(rows[0]) == [by, "sessions", *(f"ended_{r}" for r in reasons), *NUMBERS,
                             *HOMES]
    assert [r[by] for r in rows] == [r.key for r in EXPECTED[by]] + ["(total)"]
    for found, expected in zip(rows, [*EXPECTED[by], TOTAL], strict=True):
        assert int(found["sessions"]) == expected.sessions
        assert {r: int(found[f"ended_{r}"]) for r in reasons} == {
            r: expected.ended.get(r, 0) for r in reasons}
        for name in NUMBERS:
            want = getattr(expected, name)
            if want is None:
                assert found[name] == ""
            else:
                assert float(found[name]) == approx(want), (found[by], name)
        # bytes as integers; empty: no size, never sampled
        assert [found[name] for name in HOMES] == [
            "" if getattr(expected, name) is None else str(getattr(expected, name))
            for name in HOMES], found[by]


@pytest.mark.parametrize("by", ["user", "role", "group", "image"])
def test_json_format(ledger, by):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by=by, now=NOW)
    data = json.loads(format_report(report, "json"))
    assert (data["since"], data["until"], data["now"], data["by"]) == (SINCE, UNTIL, NOW, by)
    assert data["advice"] == []
    found = [Row(**r) for r in data["rows"]]
    assert [r.key for r in found] == [r.key for r in EXPECTED[by]]
    for got, expected in zip(found, EXPECTED[by], strict=True):
        assert_row(got, expected)
    assert_row(Row(**data["total"]), TOTAL)


def test_unknown_format_is_refused(ledger):
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, now=NOW)
    with pytest.raises(ValueError, match="format must be one of table, csv, json"):
        format_report(report, "xml")


# Names JupyterHub accepts that a spreadsheet would run as formulas (OWASP, "CSV Injection")
FORMULAS = ["=rt+7", "+41", "-2+3", "@SUM(A1)", "\tx", "\rx", '=HYPERLINK("http://x","y")']


@pytest.mark.parametrize("by", ["user", "role", "group", "image"])
def test_csv_cells_from_names_are_not_formulas(ledger_url, by):
    ledger = Ledger(ledger_url)
    names = [*FORMULAS, "alice", "o'brien", "two\rlines", "two\nlines"]
    with ledger.engine.begin() as c:
        for i, name in enumerate(names):
            session = add(c, name, "small", started=(120 + i) * H, stopped=(121 + i) * H,
                          reason="stopped", image=name, groups=[name])
            c.execute(update(sessions).where(sessions.c.id == session).values(role=name))
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, by=by, now=NOW)
    ledger.dispose()
    text = format_report(report, "csv")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    found = {r[0] for r in rows[1:-1]}
    assert found == {"'" + n for n in FORMULAS} | {"alice", "o'brien", "two\rlines",
                                                   "two\nlines"}
    assert len(rows) == len(names) + 2 and rows[-1][0] == "(total)"
    # the numbers are ours, written as numbers
    assert [float(r[rows[0].index("cpu_hours")]) for r in rows[1:-1]] == [1.0] * len(names)
    # the other formats keep the names as they are
    assert {r["key"] for r in json.loads(format_report(report, "json"))["rows"]} == set(names)


def test_csv_numbers_are_not_quoted_even_when_negative():
    numbers = Row(key="-x", sessions=1, ended={}, gpu_hours=-1.5, gpu_used=-0.25,
                  cpu_hours=2.0, cpu_used=None, memory_gib_hours=-3.0, memory_used=0.5,
                  home_size=None, home_peak=-7)
    report = Report(since=0.0, until=1.0, now=1.0, by="user", rows=[numbers],
                    total=numbers, advice=[])
    lines = format_report(report, "csv").splitlines()
    assert lines[1].startswith("'-x,1,")
    assert lines[1].endswith(",-1.5,-0.25,2.0,,-3.0,0.5,,-7")


def test_table_keeps_the_size_of_short_sessions(ledger_url):
    ledger = Ledger(ledger_url)
    with ledger.engine.begin() as c:
        add(c, "ann", "gpu", started=120 * H, stopped=120 * H + 10, reason="stopped")
        add(c, "ben", "small", started=120 * H, stopped=120 * H + 1, reason="stopped")
    report = build_report(ledger.engine, since=SINCE, until=UNTIL, now=NOW)
    ledger.dispose()
    lines = format_report(report, "table").splitlines()
    # 10 s of 1 GPU, 4 CPUs and 16 GiB; 1 s of 1 CPU and 2 GiB: never "0.0"
    assert lines[3].split()[:7] == ["ann", "1", "0.00278", "-", "0.0111", "-", "0.0444"]
    assert lines[4].split()[:7] == ["ben", "1", "0", "-", "<0.001", "-", "<0.001"]
    assert lines[6].split()[:7] == ["(total)", "2", "0.00278", "-", "0.0114", "-", "0.045"]


def test_the_usage_page_keeps_the_size_of_short_sessions():
    from spawner.webapp.base import templates

    page = templates().from_string("{% for h in hours %}[{{ h|hours }}]{% endfor %}")
    assert page.render(hours=[0.0, 0.00278, 0.0004, 4.5, 200.04, 1234.56]) == (
        "[0][0.00278][&lt;0.001][4.5][200][1,234.6]")  # escaped, as all of the page


def test_daily_gpu_hours_split_across_days(ledger):
    # UTC days: 1970-01-05 is 96 h to 120 h; the window starts at 100 h
    assert daily_gpu_hours(ledger.engine, since=SINCE, until=UNTIL, now=NOW) == [
        ("1970-01-05", "shared", approx(0.5), 0.0),  # erin, 100 h to 102 h
        ("1970-01-06", "shared", approx(1.0), 0.0),  # bob, 140 h to 144 h, not sampled
        ("1970-01-07", "shared", approx(4.0), 0.0),  # bob, 144 h to 160 h
        ("1970-01-08", "gpu", approx(22.0), approx(11.0)),  # bob, 170 h to 192 h, half busy
        ("1970-01-09", "gpu", approx(8.0), approx(4.0)),  # to the window's end
    ]


def test_daily_gpu_hours_in_another_time_zone(ledger):
    # at UTC+2 the days start at 22 h UTC: 94 h, 118 h, 142 h, 166 h, 190 h
    east = timezone(timedelta(hours=2))
    assert daily_gpu_hours(ledger.engine, since=SINCE, until=UNTIL, now=NOW, tz=east) == [
        ("1970-01-05", "shared", approx(0.5), 0.0),
        ("1970-01-06", "shared", approx(0.5), 0.0),  # 140 h to 142 h
        ("1970-01-07", "shared", approx(4.5), 0.0),  # 142 h to 160 h
        ("1970-01-08", "gpu", approx(20.0), approx(10.0)),  # 170 h to 190 h
        ("1970-01-09", "gpu", approx(10.0), approx(5.0)),
    ]
    assert daily_gpu_hours(ledger.engine, since=SINCE, until=UNTIL, now=NOW,
                           group="cs101") == [
        ("1970-01-08", "gpu", approx(22.0), approx(11.0)),
        ("1970-01-09", "gpu", approx(8.0), approx(4.0)),
    ]


def test_user_sessions(ledger):
    found = user_sessions(ledger.engine, "bob", since=SINCE, until=UNTIL, now=NOW)
    assert [s["requested"] for s in found] == [140 * H, 170 * H]  # oldest first
    shared, gpu = found
    assert shared == {
        "id": 4, "role": "shared", "image": "torch", "gpus": ["GPU-0"],
        "requested": 140 * H, "started": 140 * H, "ready": 140 * H + 5, "stopped": 160 * H,
        "reason": "preempted", "cpu_limit": 2.0, "mem_limit": 8 * G, "gpu_reserved": 0.25,
        "cpu_avg": None, "cpu_peak": None, "mem_avg": None, "mem_peak": None,
        "gpu_util_avg": None, "gpu_util_peak": None, "gpu_mem_peak": None,
        "home_size": None, "home_peak": None}
    assert (gpu["stopped"], gpu["reason"]) == (None, None)
    assert (gpu["cpu_avg"], gpu["cpu_peak"]) == (2.0, 3.0)
    assert (gpu["mem_avg"], gpu["mem_peak"]) == (4 * G, 6 * G)
    assert (gpu["gpu_util_avg"], gpu["gpu_util_peak"], gpu["gpu_mem_peak"]) == (0.5, 0.9, 8 * G)
    assert (gpu["home_size"], gpu["home_peak"]) == (20 * G, None)
    latest = user_sessions(ledger.engine, "bob", since=SINCE, until=UNTIL, now=NOW, limit=1)
    assert [s["id"] for s in latest] == [3]
    failed = user_sessions(ledger.engine, "carol", since=SINCE, until=UNTIL, now=NOW)
    assert [(s["started"], s["reason"]) for s in failed] == [(None, "failed"), (190 * H, "oom")]
    assert user_sessions(ledger.engine, "bob", since=SINCE, until=UNTIL, now=NOW,
                         group="cs101")[0]["id"] == 3


# --- right-sizing advice -------------------------------------------------------------


def role(name, cpus, memory, gpus=0, mode="exclusive", share=1, gpu_memory=None):
    return Role(name=name, cpus=cpus, memory=memory, images=("py",), gpus=gpus,
                gpu_mode=mode, gpu_share=share, gpu_memory=gpu_memory)


TABLE = QuotaTable(
    path="quotas.yaml", images={},
    roles={r.name: r for r in (
        role("small", 1, 2 * G),
        role("big", 2, 4 * G),
        role("cpu-large", 4, 16 * G),
        role("shared", 2, 8 * G, gpus=1, mode="shared", share=4, gpu_memory=10 * G),
        role("gpu", 4, 16 * G, gpus=1),
    )},
    groups={"cs101": ("small", "big"), "ml": ("cpu-large", "shared", "gpu")},
    users={"ivan": ("big",)},
)


@pytest.fixture
def advice_ledger(ledger_url):
    ledger = Ledger(ledger_url)

    def many(c, user, role, peaks, groups, gpu=None):
        for i, (mem, cpu) in enumerate(peaks):
            add(c, user, role, started=(10 + i) * H, stopped=(10.5 + i) * H, reason="stopped",
                groups=groups, cpu=(6, cpu * 3, cpu), mem=(6, mem * 3, mem),
                gpu=gpu and (6, gpu[0] * 3, gpu[0]), gpu_mem=gpu and gpu[1])

    with ledger.engine.begin() as c:
        # alice (cs101: small, big): 9 sessions fit in small, one peaks at 1.9 GiB, over
        # 90% of small's 2 GiB; two more were never sampled
        many(c, "alice", "big", [(int(1.1 * G), 0.4)] * 9 + [(int(1.9 * G), 0.3)], ["cs101"])
        for i in range(2):
            add(c, "alice", "big", started=(30 + i) * H, stopped=(31 + i) * H,
                reason="culled", groups=["cs101"])
        # bob (cs101): 2 of 6 would fit in small
        many(c, "bob", "big", [(1 * G, 0.5)] * 2 + [(3 * G, 1.5)] * 4, ["cs101"])
        # grace (ml) held a GPU and never touched it
        many(c, "grace", "gpu", [(6 * G, 3.0)] * 5, ["ml"], gpu=(0.0, 0))
        # jack (ml) used a third of his GPU and 5 GiB of its memory
        many(c, "jack", "gpu", [(4 * G, 1.5)] * 5, ["ml"], gpu=(0.3, 5 * G))
        # kate (ml) needed her whole GPU: neither smaller role would have served
        many(c, "kate", "gpu", [(15 * G, 3.9)] * 5, ["ml"], gpu=(0.95, 30 * G))
        # henry (cs101): too few sessions
        many(c, "henry", "big", [(1 * G, 0.2)] * 3, ["cs101"])
        # ivan holds big only
        many(c, "ivan", "big", [(1 * G, 0.2)] * 5, [])
    yield ledger
    ledger.dispose()


def advice_of(ledger, **kwargs):
    report = build_report(ledger.engine, since=0, until=100 * H, by="user", table=TABLE,
                          now=100 * H, **kwargs)
    return {a.user: a for a in report.advice}


def test_advice_suggests_a_smaller_role(advice_ledger):
    alice = advice_of(advice_ledger)["alice"]
    assert alice == Advice(
        user="alice", role="big", sessions=10, memory_peak=int(1.9 * G), memory_limit=4 * G,
        cpu_peak=0.4, cpu_limit=2.0, gpu_memory_peak=None, gpu_util_peak=None,
        suggestion="small", served=9,
        text="alice used at most 1.9 GiB of 4 GiB and 0.4 of 2 CPUs over 10 sessions as "
             "big; small with 2 GiB and 1 CPU would have served 9 of them.")


def test_advice_when_no_smaller_role_would_have_served(advice_ledger):
    bob = advice_of(advice_ledger)["bob"]
    assert (bob.suggestion, bob.served, bob.sessions) == (None, 2, 6)
    assert bob.text == (
        "bob used at most 3 GiB of 4 GiB and 1.5 of 2 CPUs over 6 sessions as big; "
        "no smaller role would have served: small with 2 GiB and 1 CPU would have served "
        "only 2 of them.")


def test_advice_suggests_a_cpu_role_for_an_unused_gpu(advice_ledger):
    grace = advice_of(advice_ledger)["grace"]
    assert (grace.suggestion, grace.served) == ("cpu-large", 5)
    assert (grace.gpu_util_peak, grace.gpu_memory_peak) == (0.0, 0)
    assert grace.text == (
        "grace used at most 6 GiB of 16 GiB and 3 of 4 CPUs and never used its GPU over "
        "5 sessions as gpu; cpu-large with 16 GiB, 4 CPUs and no GPU would have served 5 "
        "of them.")


def test_advice_suggests_a_shared_gpu_that_fits(advice_ledger):
    jack = advice_of(advice_ledger)["jack"]
    assert (jack.suggestion, jack.served) == ("shared", 5)
    assert jack.text == (
        "jack used at most 4 GiB of 16 GiB and 1.5 of 4 CPUs, its GPU at most 30% busy "
        "with 5 GiB of GPU memory over 5 sessions as gpu; shared with 8 GiB, 2 CPUs and "
        "1 GPU shared 4 ways (10 GiB of GPU memory) would have served 5 of them.")


def test_advice_names_the_closest_smaller_role(advice_ledger):
    kate = advice_of(advice_ledger)["kate"]
    assert (kate.suggestion, kate.served) == (None, 0)
    assert kate.text == (
        "kate used at most 15 GiB of 16 GiB and 3.9 of 4 CPUs, its GPU at most 95% busy "
        "with 30 GiB of GPU memory over 5 sessions as gpu; no smaller role would have "
        "served: shared with 8 GiB, 2 CPUs and 1 GPU shared 4 ways (10 GiB of GPU memory) "
        "would have served only 0 of them.")


def test_advice_needs_enough_sessions(advice_ledger):
    henry = advice_of(advice_ledger)["henry"]
    assert (henry.suggestion, henry.served, henry.sessions) == (None, 0, 3)
    assert henry.text == (
        "henry used at most 1 GiB of 4 GiB and 0.2 of 2 CPUs over 3 sessions as big: "
        "too few to advise on (5 sessions with samples needed).")


def test_advice_without_a_smaller_role(advice_ledger):
    ivan = advice_of(advice_ledger)["ivan"]
    assert ivan.suggestion is None
    assert ivan.text == (
        "ivan used at most 1 GiB of 4 GiB and 0.2 of 2 CPUs over 5 sessions as big; "
        "ivan holds no smaller role.")


def test_advice_in_every_format(advice_ledger):
    report = build_report(advice_ledger.engine, since=0, until=100 * H, table=TABLE,
                          now=100 * H)
    assert [a.user for a in report.advice] == ["alice", "bob", "grace", "henry", "ivan",
                                               "jack", "kate"]
    table = format_report(report, "table")
    assert table.split("Right-sizing advice:\n", 1)[1] == "".join(
        f"- {a.text}\n" for a in report.advice)
    data = json.loads(format_report(report, "json"))
    assert [Advice(**a) for a in data["advice"]] == report.advice
    assert "advice" not in format_report(report, "csv")
    only = advice_of(advice_ledger, group="ml")
    assert sorted(only) == ["grace", "jack", "kate"]


# --- the home in the advice -------------------------------------------------------------


HOME_TABLE = QuotaTable(
    path="quotas.yaml", images={},
    roles={
        "small": Role(name="small", cpus=1, memory=2 * G, images=("py",), disk=2 * G),
        "big": Role(name="big", cpus=2, memory=4 * G, images=("py",), disk=20 * G),
    },
    groups={"cs101": ("small", "big")},
)


@pytest.fixture
def home_ledger(ledger_url):
    """Users of big (2 CPUs, 4 GiB, a 20 GiB home) whose memory and CPUs fit in small's
    (a 2 GiB home); only their homes differ: (its size, the peaks of their sessions)."""
    ledger = Ledger(ledger_url)
    homes = {
        "hana": (20 * G, [G] * 5),  # fits small's home, 90% of 2 GiB
        "omar": (20 * G, [3 * G] * 5),  # fits only 5 GiB of home: small does not serve
        "pia": (20 * G, [6 * G] * 4 + [20 * G]),  # full once is enough
        "quin": (20 * G, [18.5 * G] * 5),  # past 90%: nearly full
        "rolf": (20 * G, [12 * G] * 5),  # 12 GiB needs more than 10 GiB, less than 20
        "sam": (20 * G, [G] * 4 + [None]),  # four homes sampled: too few for the home
        "tess": (None, [3 * G] * 5),  # a home without a size: nothing to size
        "uma": (20 * G, [G] * 3),  # too few sessions for any advice
    }
    with ledger.engine.begin() as c:
        for user, (size, peaks) in homes.items():
            for i, peak in enumerate(peaks):
                add(c, user, "big", started=(10 + i) * H, stopped=(10.5 + i) * H,
                    reason="stopped", groups=["cs101"], cpu=(6, 1.5, 0.5),
                    mem=(6, 3.0 * G, G), home=(size, None if peak is None else int(peak)))
    yield ledger
    ledger.dispose()


EVIDENCE = "used at most 1 GiB of 4 GiB and 0.5 of 2 CPUs, its home at most"
SMALL = "small with 2 GiB, 1 CPU and a 2 GiB home"


@pytest.mark.parametrize(("user", "text", "fields"), [
    ("hana", f"hana {EVIDENCE} 1 GiB of 20 GiB over 5 sessions as big; {SMALL} would have "
     "served 5 of them; a home of 2 GiB would do.",
     dict(suggestion="small", served=5, home_suggestion=2 * G, home_bigger=False)),
    ("omar", f"omar {EVIDENCE} 3 GiB of 20 GiB over 5 sessions as big; no smaller role "
     f"would have served: {SMALL} would have served only 0 of them; a home of 5 GiB would do.",
     dict(suggestion=None, served=0, home_suggestion=5 * G, home_bigger=False)),
    ("pia", f"pia {EVIDENCE} 20 GiB of 20 GiB over 5 sessions as big; no smaller role "
     f"would have served: {SMALL} would have served only 0 of them; its home was full: "
     "a bigger one is needed.",
     dict(suggestion=None, served=0, home_suggestion=None, home_bigger=True)),
    ("quin", f"quin {EVIDENCE} 18.5 GiB of 20 GiB over 5 sessions as big; no smaller role "
     f"would have served: {SMALL} would have served only 0 of them; its home was nearly "
     "full: a bigger one is needed.",
     dict(suggestion=None, served=0, home_suggestion=None, home_bigger=True)),
    ("rolf", f"rolf {EVIDENCE} 12 GiB of 20 GiB over 5 sessions as big; no smaller role "
     f"would have served: {SMALL} would have served only 0 of them.",
     dict(suggestion=None, served=0, home_suggestion=None, home_bigger=False)),
    ("sam", f"sam {EVIDENCE} 1 GiB of 20 GiB over 5 sessions as big; {SMALL} would have "
     "served 5 of them.",
     dict(suggestion="small", served=5, home_suggestion=None, home_bigger=False)),
    ("tess", f"tess {EVIDENCE} 3 GiB, with no size limit over 5 sessions as big; no smaller "
     f"role would have served: {SMALL} would have served only 0 of them.",
     dict(suggestion=None, served=0, home_suggestion=None, home_bigger=False)),
    ("uma", f"uma {EVIDENCE} 1 GiB of 20 GiB over 3 sessions as big: too few to advise on "
     "(5 sessions with samples needed).",
     dict(suggestion=None, served=0, home_suggestion=None, home_bigger=False)),
])
def test_advice_on_the_home(home_ledger, user, text, fields):
    report = build_report(home_ledger.engine, since=0, until=100 * H, table=HOME_TABLE,
                          now=100 * H)
    found = {a.user: a for a in report.advice}[user]
    assert found.text == text
    assert {k: getattr(found, k) for k in fields} == fields
    assert json.loads(format_report(report, "json"))["advice"][
        report.advice.index(found)] == asdict(found)


def test_the_home_sizes_the_advice_names():
    assert [home_size_for(int(peak)) for peak in (
        0, 57 * 2**20, 58 * 2**20, 0.9 * G, 0.91 * G, 1.8 * G, 4.5 * G, 9 * G, 9.1 * G,
        450 * G, 451 * G)] == [
        64 * 2**20, 64 * 2**20, 128 * 2**20, G, 2 * G, 2 * G, 5 * G, 10 * G, 20 * G,
        500 * G, 1000 * G]


# --- times and the commands ------------------------------------------------------------


def test_parse_time():
    now = datetime(2025, 3, 15, 12, tzinfo=UTC).timestamp()
    assert parse_time("30d", now) == now - 30 * 86400
    assert parse_time("12h", now) == now - 12 * 3600
    assert parse_time("2w", now) == now - 14 * 86400
    assert parse_time("2025-03-01", now) == datetime(2025, 3, 1, tzinfo=UTC).timestamp()
    assert parse_time("2025-03-01T10:00+02:00", now) == datetime(
        2025, 3, 1, 8, tzinfo=UTC).timestamp()
    assert parse_time("2025-03-01T10:00Z", now) == datetime(
        2025, 3, 1, 10, tzinfo=UTC).timestamp()
    assert month_start(now) == datetime(2025, 3, 1, tzinfo=UTC).timestamp()
    with pytest.raises(ValueError, match="cannot read 'last week' as a time"):
        parse_time("last week", now)


def iso(t):
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_report_command_in_every_format(ledger, capsys):
    url = ledger.url
    assert cli_main(["report", "--db", url, "--since", iso(SINCE), "--until", iso(UNTIL),
                     "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in data["rows"]] == ["alice", "bob", "carol", "erin"]
    assert data["total"]["gpu_hours"] == approx(35.5)
    assert cli_main(["report", "--db", url, "--since", iso(SINCE), "--until", iso(UNTIL),
                     "--by", "group", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["group"], r["sessions"]) for r in rows] == [
        ("(no group)", "2"), ("cs101", "3"), ("lab", "3"), ("(total)", "7")]
    assert cli_main(["report", "--db", url, "--since", iso(SINCE), "--until", iso(UNTIL),
                     "--group", "lab"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage from 1970-01-05 04:00 UTC to 1970-01-09 08:00 UTC, "
                          "by user, group lab\n")
    assert [line.split()[0] for line in out.splitlines()[3:5]] == ["bob", "erin"]


def test_report_command_with_advice(advice_ledger, tmp_path, capsys):
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("""\
images:
  py: {image: "quay.io/jupyter/base-notebook:latest", display_name: Python}
roles:
  small: {cpus: 1, memory: 2G, images: [py]}
  big: {cpus: 2, memory: 4G, images: [py]}
assignments:
  groups:
    cs101: [small, big]
""")
    assert cli_main(["report", "--db", advice_ledger.url, "--quota-file", str(quotas),
                     "--since", "1970-01-01", "--until", "1970-01-05"]) == 0
    out = capsys.readouterr().out
    assert ("- alice used at most 1.9 GiB of 4 GiB and 0.4 of 2 CPUs over 10 sessions as big; "
            "small with 2 GiB and 1 CPU would have served 9 of them.\n") in out
    assert "none for this window" not in out
    # a window with no sampled session: the table says why there is no advice
    assert cli_main(["report", "--db", advice_ledger.url, "--quota-file", str(quotas),
                     "--since", "1980-01-01", "--until", "1980-01-05"]) == 0
    assert capsys.readouterr().out.endswith(
        "\nRight-sizing advice: none for this window; it needs sessions with samples from "
        "the watchdog.\n")


def test_report_command_defaults_to_this_month(ledger, capsys, monkeypatch):
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", ledger.url)
    assert cli_main(["report", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["since"] == month_start(data["now"])
    assert data["until"] == data["now"]
    # only bob's session runs in this month, from its first second to now
    assert [(r["key"], r["ended"]) for r in data["rows"]] == [("bob", {"running": 1})]
    assert data["rows"][0]["gpu_hours"] == approx((data["now"] - data["since"]) / 3600)


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "quota-spawner report: cannot read 'yesterday' as a time"),
    (["--since", "2025-02-01", "--until", "2025-01-01"],
     "quota-spawner report: --since must be before --until"),
])
def test_report_command_refuses_bad_times(ledger, capsys, args, message):
    assert cli_main(["report", "--db", ledger.url, *args]) == 2
    assert capsys.readouterr().err.startswith(message)


def test_report_command_without_a_ledger(tmp_path, capsys):
    missing = tmp_path / "state" / "quota-spawner-usage.sqlite"
    assert cli_main(["report", "--db", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err
    assert err == (f"quota-spawner report: no usage ledger at {missing}: the hub creates it "
                   "when it starts (or run: quota-spawner ledger upgrade)\n")
    assert not missing.exists() and not missing.parent.exists()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_text("not a database")
    assert cli_main(["report", "--db", f"sqlite:///{garbage}"]) == 2
    assert capsys.readouterr().err == (
        "quota-spawner report: the usage ledger could not be read: file is not a database\n")


def test_ledger_upgrade_and_status(tmp_path, capsys, monkeypatch):
    path = tmp_path / "quota-spawner-usage.sqlite"
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("QUOTA_SPAWNER_USAGE_DB", raising=False)
    assert cli_main(["ledger", "status"]) == 2
    assert "no usage ledger at" in capsys.readouterr().err
    assert cli_main(["ledger", "upgrade"]) == 0
    head = head_revision()
    assert capsys.readouterr().out == f"Usage ledger at sqlite:///{path} is at revision {head}.\n"
    ledger = Ledger(f"sqlite:///{path}", create=False)
    with ledger.engine.begin() as c:
        add(c, "alice", "big", started=1.0, stopped=2.0, reason="stopped")
        add(c, "bob", "big", started=1.0)
    ledger.dispose()
    assert cli_main(["ledger", "status"]) == 0
    assert capsys.readouterr().out == (
        f"URL:      sqlite:///{path}\n"
        f"Revision: {head} (up to date)\n"
        "Sessions: 2 (1 open)\n")
    assert cli_main(["ledger", "upgrade", "--db", f"sqlite:///{path}"]) == 0  # idempotent
    assert f"revision {head}" in capsys.readouterr().out
