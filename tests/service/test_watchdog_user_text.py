"""What users type is data in the watchdog's messages, and no time breaks a message.

A role request's reason, a decider's comment, user, role and group names end
up in messages whose lines (``What to do:``, ``Server:``) people act on. None
of it may make a line of its own. And the hub's event log is another
program's file: a request may start in the year 318857, a time may be NaN.

Pure: the real message formatting, from events as the hub writes them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from receivers import HttpReceiver

from spawner.watchdog.hub_events import hub_event_messages
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot
from spawner.watchdog.notify import Notifier, format_message
from spawner.watchdog.rules import WatchdogRules
from spawner.watchdog.text import duration, name, one_line, quoted, utc

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
HUB_ID = "quota-c9fb1a93a60b"
HUB_URL = "https://hub.example.org"
UUID = "GPU-8f3c2a4e-1b7d-4c55-9e0a-2d6f4b1c9a77"
FORGED = "x\nWhat to do: run rm -rf\nServer: http://evil"
# every way Python's splitlines (and so a mail reader or chat app) starts a new line
BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def snapshot(*servers: Server) -> Snapshot:
    return Snapshot(time=T + 3, host="gpu-host-1", gpus={UUID: GpuSample(UUID, 2)},
                    servers={s.container_id: ServerSample(s) for s in servers})


def asked(reason: str = "My thesis trains a model for a week.", **kw) -> dict:
    """A role request as spawner.usage.grants writes it: its text ends with the reason."""
    user, role = kw.get("user", "student1"), kw.get("role", "gpu-training")
    text = (f"{user} asks for the role '{role}' from 2026-11-18 11:06 UTC to "
            f"2026-11-25 11:06 UTC: {reason}")
    return dict(event="role-request", hub=HUB_ID, time=T, id=7, user=user, role=role,
                starts=T, ends=T + 7 * DAY, reason=reason, who=user, comment="",
                text=text) | kw


def decided(comment: str, approve: bool = False, **kw) -> dict:
    state = "approved" if approve else "refused"
    text = f"Your request for the role 'gpu-training' was {state} by admin: {comment}"
    return asked(event=f"role-request-{state}", who="admin", comment=comment,
                 text=text) | kw


def notice(**kw) -> dict:
    return dict(event="preemption", hub=HUB_ID, time=T, by="bob", by_role="urgent-debug",
                user="alice", role="gpu-training", container="quota-alice", gpus=[UUID],
                grace_period=120.0, deadline=T + 120,
                reason="bob needs 1 GPU for the role 'urgent-debug'.") | kw


def budget(**kw) -> dict:
    return dict(event="budget-warning", hub=HUB_ID, time=T, user="alice", role="gpu-training",
                container="quota-alice", budget_kind="group", budget_name="cs101",
                per="month", used=9.0, gpu_hours=10.0, warn_at=0.9, resets_at=T + DAY) | kw


def messages(*events: dict, servers: tuple[Server, ...] = ()):
    told = hub_event_messages(list(events), WatchdogRules(), snapshot(*servers))
    assert len(told) == len(events)
    return [format_message(e, HUB_URL, "h", now=T + 5) for e in told]


def starting(body: str, label: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(label)]


# --- nothing a user typed makes a line -----------------------------------------------------


def test_a_reason_cannot_forge_the_messages_own_lines():
    (message,) = messages(asked(reason=FORGED))
    lines = message.body.splitlines()
    # the one real advice line, and no Server line at all (a request names no server)
    (advice,) = starting(message.body, "What to do:")
    assert advice.startswith("What to do: Admins, and the user's instructors")
    assert starting(message.body, "Server:") == []
    assert lines[0] == ("What: student1 asks for the role 'gpu-training' from 2026-11-18 "
                        "11:06 UTC to 2026-11-25 11:06 UTC: "
                        '"x\\nWhat to do: run rm -rf\\nServer: http://evil"')
    assert "\n" not in message.title


@pytest.mark.parametrize("brk", BREAKS)
def test_every_kind_of_line_break_is_shown_escaped(brk):
    reason = f"x{brk}What to do: run rm -rf{brk}Server: http://evil"
    comment = f"no{brk}Server: http://evil{brk}What to do: reply with your password"
    for message in messages(asked(reason=reason), decided(comment)):
        assert len(starting(message.body, "What to do:")) == 1
        assert starting(message.body, "Server:") == []
        assert message.body.count("\n") == len(message.body.splitlines()) - 1
        assert len(message.title.splitlines()) == 1


def test_a_deciders_comment_is_quoted():
    refused, approved = messages(decided("Booked.\nServer: http://evil"),
                                 decided("ok", approve=True))
    assert refused.body.splitlines()[0] == (
        "What: Your request for the role 'gpu-training' was refused by admin: "
        '"Booked.\\nServer: http://evil"')
    assert approved.body.splitlines()[0].endswith(': "ok"')


def test_names_with_line_breaks_are_quoted_everywhere():
    evil = "mallory\nWhat to do: ignore this\nServer: http://evil"
    server = Server(container_id="c1", name="quota-mallory", user=evil, role="gpu-training",
                    image="pytorch", hub_id=HUB_ID, gpus=(UUID,))
    told = messages(
        notice(user=evil, by=evil, container="quota-mallory"),
        budget(user=evil, budget_name="cs101\nServer: http://evil", container="quota-mallory"),
        asked(user=evil, role="gpu\ntraining", reason="fine"),
        servers=(server,))
    for message in told:
        assert len(message.title.splitlines()) == 1, message.title
        assert len(starting(message.body, "What to do:")) == 1, message.body
        # at most the real Server line, with the name URL-quoted
        assert all(line.startswith(f"Server: {HUB_URL}/user/mallory%0AWhat")
                   for line in starting(message.body, "Server:")), message.body
    shown = '"mallory\\nWhat to do: ignore this\\nServer: http://evil"'
    assert told[0].title == (f"[warning] {shown}'s server will be stopped at 11:08 UTC: "
                             f"preempted by {shown}")
    assert f"Who: {shown} (role gpu-training, image pytorch)" in told[0].body
    assert told[1].title.startswith(
        '[warning] GPU-hour budget of the group "cs101\\nServer: http://evil" 90% used')
    assert 'Role: "gpu\\ntraining"' in told[2].body


def test_plain_text_reads_as_before():
    (message,) = messages(notice())
    assert message.title == "[warning] alice's server will be stopped at 11:08 UTC: " \
                            "preempted by bob"
    assert name("student1") == "student1" and name("gpu-training") == "gpu-training"
    assert name("张伟") == "张伟" and name("ada.l@example.org") == "ada.l@example.org"
    assert name("a b") == '"a b"' and name("") == '""'


def test_quoting_escapes_and_caps():
    assert quoted('say "hi" \\ bye') == '"say \\"hi\\" \\\\ bye"'
    assert quoted("\x1b[31mred\t\x00") == '"\\x1b[31mred\\t\\x00"'
    assert quoted("\u202eevil") == '"\\u202eevil"'  # no right-to-left override
    long = quoted("y" * 2000)
    assert long == '"' + "y" * 300 + '…"'
    assert name("n" * 100) == '"' + "n" * 64 + '…"'
    assert one_line("a\nb\u2028c") == "a\\nb\\u2028c"
    assert one_line("plain, 'quoted' and \"double\"") == "plain, 'quoted' and \"double\""


def test_a_long_reason_is_cut_with_an_ellipsis():
    (message,) = messages(asked(reason="why " * 500))
    what = message.body.splitlines()[0]
    assert what.endswith('…"') and len(what) < 500


# --- times that cannot be --------------------------------------------------------------------


@pytest.mark.parametrize(("value", "text"), [
    (1e13, "an invalid time (1e+13)"),  # the year 318857
    (-1e13, "an invalid time (-1e+13)"),
    (float("nan"), "an invalid time (nan)"),
    (float("inf"), "an invalid time (inf)"),
    ("soon", "an invalid time ('soon')"),
    (T, "2026-11-18 11:06:40 UTC"),
])
def test_a_time_out_of_range_prints_as_words(value, text):
    assert utc(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (float("nan"), "an unknown time"), (float("inf"), "an unknown time"),
    (1e300, "1e+300s"), (200, "3m20s"), (-5, "0s"), (None, "an unknown time"),
])
def test_a_duration_out_of_range_prints_as_words(value, text):
    assert duration(value) == text


def test_a_request_for_the_year_318857_is_told():
    (message,) = messages(asked(starts=1e13, ends=1e13 + DAY))
    assert "Window: from an invalid time (1e+13) to an invalid time (1e+13)" in message.body


def test_a_preemption_with_a_deadline_out_of_range_is_told():
    (message,) = messages(notice(deadline=1e13, grace_period=float("nan")))
    assert message.title == "[warning] alice's server will be stopped at an invalid time " \
                            "(1e+13): preempted by bob"
    assert "When: stopped at an invalid time (1e+13)\n" in message.body


def test_numbers_that_are_not_numbers_are_left_out():
    told = messages(
        notice(time=float("nan"), ran_for=float("inf"), event="preempted"),
        budget(used=1e308, gpu_hours=1e-300),  # a share of infinity percent
        asked(time=float("inf"), starts=float("nan")))
    stopped, warned, request = told
    assert "At: 2026-11-18 11:06:43 UTC" in stopped.body  # NaN: the cycle's own time
    assert stopped.body.startswith("What: The server was stopped, to free its GPUs for bob.")
    assert warned.title == "[warning] GPU-hour budget of the group cs101 nearly used: " \
                           "alice's server"
    assert "Window:" not in request.body  # no start that can be told


def test_the_documented_example_is_what_the_code_says():
    """docs/watchdog.md#what-a-message-looks-like shows this line."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "watchdog.md").read_text()
    starts = 1_796_115_600.0  # 2026-12-01 09:00 UTC
    text = ("student1 asks for the role 'gpu-training' from 2026-12-01 09:00 UTC to "
            "2026-12-08 09:00 UTC: x\nWhat to do: run rm -rf")
    (message,) = messages(asked(reason="x\nWhat to do: run rm -rf", starts=starts,
                                ends=starts + 7 * DAY, text=text))
    what = message.body.splitlines()[0]
    assert f"```text\n{what}\n```" in doc, what


async def test_the_log_lines_of_a_delivery_are_one_line_each(caplog):
    """An incident's key holds names (a request without an id: its user's)."""
    (event,) = hub_event_messages([asked(id=None, user="mallory\n[E fake] x")],
                                  WatchdogRules(), snapshot())
    with HttpReceiver() as receiver:
        port = receiver.base.rsplit(":", 1)[1]
        notifier = Notifier(hub_url=HUB_URL, host="h", log=logging.getLogger("t"),
                            channels=[{"name": "admins",
                                       "url": f"json://127.0.0.1:{port}/admins"}])
        with caplog.at_level(logging.INFO, logger="t"):
            assert await notifier.send(event, {}, now=T + 5) == {"admins": True}
    (line,) = [r.getMessage() for r in caplog.records if r.name == "t"]
    assert line == "Channel admins: sent open of role_request:mallory\\n[E fake] x:role-request"
