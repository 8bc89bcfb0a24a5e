"""The watchdog and the users' homes (spawner/watchdog/homes.py, rules.py, disk_words.py):
a home at 90% of its size told to its user and the admins once, and resolved once; the
filesystem that holds the homes at 90% told to the admins; the gauges; each server's
home.json; this node's homes document. Pure but for the files, in tmp_path; the real
filesystem and containers are tests/service/test_watchdog_homes.py's."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from spawner.homes.base import HomeUse, Space
from spawner.usage.documents import DiskUsage
from spawner.watchdog.app import QuotaWatchdog
from spawner.watchdog.homes import HomeUseFiles, disk_document
from spawner.watchdog.metrics import PREFIX, WatchdogMetrics
from spawner.watchdog.model import DiskReading, Server, ServerSample, Snapshot
from spawner.watchdog.notify import Notifier, about, format_message, routes
from spawner.watchdog.rules import (
    HOME_DISK,
    HOMES_FILESYSTEM,
    RULES,
    Event,
    IncidentBook,
    WatchdogRules,
)
from spawner.watchdog.service import watchdog_service

MiB, GiB = 2**20, 2**30
T = 1_800_000_000.0
ROOT = Path("/srv/homes")
LOG = logging.getLogger("test.watchdog_disk")


def server(user: str = "alice", disk: int | None = 20 * GiB, cid: str = "") -> Server:
    return Server(container_id=cid or f"id-{user}", name=f"quota-{user}", user=user,
                  role="student", image="pytorch", hub_id="hub-1", disk=disk, pid=1)


def homes(**used: int | tuple[int, int | None]) -> dict[str, HomeUse]:
    """Home name -> use; a number is bytes used under a 20 GiB quota."""
    return {name: HomeUse(name, *(u if isinstance(u, tuple) else (u, 20 * GiB)))
            for name, u in used.items()}


def space(used: int, free: int, size: int | None = None) -> Space:
    return Space(ROOT, size or used + free, used, free)


def cycle(t: float, *servers: Server, found: dict[str, HomeUse] | None = None,
          room: Space | None = None, enforced: bool | None = True) -> Snapshot:
    """A cycle with ``servers`` running, each on the home named after its user."""
    disk = DiskReading("btrfs", enforced, "Homes are btrfs subvolumes under /srv/homes, "
                       "each limited by a qgroup", found, room)
    return Snapshot(time=t, host="gpu-host-1", disk=disk,
                    servers={s.container_id: ServerSample(s, home=s.user) for s in servers})


def rules(**settings) -> WatchdogRules:
    return WatchdogRules(**{"home_disk_hold": 60.0, "homes_filesystem_hold": 60.0,
                            **settings})


def told(events: list[Event], rule: str) -> list[str]:
    return [e.kind for e in events if e.incident.rule == rule]


# --- a home at 90% of its size -------------------------------------------------------------


def test_a_home_past_90_percent_is_told_once_after_its_hold_and_resolved_once():
    book, r, alice = IncidentBook(), rules(), server()
    assert book.evaluate(cycle(T, alice, found=homes(alice=18 * GiB)), r) == []  # 90%: held
    assert book.evaluate(cycle(T + 30, alice, found=homes(alice=19 * GiB)), r) == []
    (opened,) = book.evaluate(cycle(T + 60, alice, found=homes(alice=19 * GiB)), r)
    assert (opened.kind, opened.incident.key, opened.incident.severity) == (
        "open", "home_disk:alice", "warning")
    assert opened.incident.server == alice and opened.incident.percent == 95.0
    for t in (T + 65, T + 600, T + 3600):  # at 88%, between the clear and the high: open
        assert book.evaluate(cycle(t, alice, found=homes(alice=int(17.6 * GiB))), r) == []
    (resolved,) = book.evaluate(cycle(T + 3700, alice, found=homes(alice=14 * GiB)), r)
    assert resolved.kind == "resolve" and resolved.incident.reason == (
        "The home is down to 70% of its size.")
    assert book.open == {} and book.evaluate(cycle(T + 3705, alice,
                                                   found=homes(alice=14 * GiB)), r) == []


def test_a_dip_below_the_clear_level_starts_the_hold_again():
    book, r, alice = IncidentBook(), rules(), server()
    book.evaluate(cycle(T, alice, found=homes(alice=19 * GiB)), r)
    book.evaluate(cycle(T + 40, alice, found=homes(alice=10 * GiB)), r)
    assert book.evaluate(cycle(T + 70, alice, found=homes(alice=19 * GiB)), r) == []
    assert told(book.evaluate(cycle(T + 130, alice, found=homes(alice=19 * GiB)), r),
                HOME_DISK) == ["open"]


def test_the_size_is_the_servers_label_else_the_quotas_limit_and_none_is_not_judged():
    book, r = IncidentBook(), rules(home_disk_hold=0)
    labelled = server("alice", disk=10 * GiB)  # the label: 9.5 of 10 GiB, whatever the quota
    unlabelled = server("bob", disk=None)  # the quota's limit: 9.5 of 20 GiB
    no_size = server("carol", disk=None)
    found = homes(alice=int(9.5 * GiB), bob=int(9.5 * GiB), carol=(int(9.5 * GiB), None))
    events = book.evaluate(cycle(T, labelled, unlabelled, no_size, found=found), r)
    assert [e.incident.key for e in events] == ["home_disk:alice"]
    assert events[0].incident.limit == 10 * GiB


def test_a_users_two_servers_are_one_home_and_one_incident():
    book, r = IncidentBook(), rules(home_disk_hold=0)
    one, two = server("alice", cid="id-1"), server("alice", cid="id-2")
    two = Server(**{**two.__dict__, "name": "quota-alice-gpu"})
    events = book.evaluate(cycle(T, one, two, found=homes(alice=19 * GiB)), r)
    assert [(e.kind, e.incident.key) for e in events] == [("open", "home_disk:alice")]


def test_a_full_home_stays_open_while_its_user_is_away_and_ends_when_it_reads_clear():
    """The home does not empty when the server stops: no 'resolved' that is not true, and
    no second message when the user comes back to a home still full."""
    book, r, alice = IncidentBook(), rules(home_disk_hold=0), server()
    assert told(book.evaluate(cycle(T, alice, found=homes(alice=19 * GiB)), r),
                HOME_DISK) == ["open"]
    assert book.evaluate(cycle(T + 5, found=homes(alice=19 * GiB)), r) == []  # stopped
    back = server(cid="id-alice-again")
    assert book.evaluate(cycle(T + 500, back, found=homes(alice=19 * GiB)), r) == []
    (resolved,) = book.evaluate(cycle(T + 505, back, found=homes(alice=GiB)), r)
    assert resolved.kind == "resolve" and resolved.incident.server == back


def test_a_cycle_that_cannot_read_the_homes_changes_nothing_and_a_home_that_goes_ends():
    book, r, alice = IncidentBook(), rules(home_disk_hold=0), server()
    book.evaluate(cycle(T, alice, found=homes(alice=19 * GiB)), r)
    assert book.evaluate(cycle(T + 5, alice, found=None), r) == []  # the query failed
    assert book.evaluate(cycle(T + 10, found=None), r) == []
    (gone,) = book.evaluate(cycle(T + 15, found=homes(bob=GiB)), r)  # deleted by an admin
    assert gone.kind == "resolve" and gone.incident.reason == "The home is gone."


def test_turning_the_rule_off_resolves_it_and_the_names_are_rules():
    assert {HOME_DISK, HOMES_FILESYSTEM} <= set(RULES)
    book, alice = IncidentBook(), server()
    book.evaluate(cycle(T, alice, found=homes(alice=19 * GiB)), rules(home_disk_hold=0))
    (off,) = book.evaluate(cycle(T + 5, alice, found=homes(alice=19 * GiB)),
                           rules(disabled_rules=[HOME_DISK]))
    assert off.kind == "resolve" and off.incident.reason == "the rule was turned off"


def test_a_clear_level_above_the_high_one_is_refused():
    with pytest.raises(ValueError, match="home_disk_clear"):
        rules(home_disk_high=0.8, home_disk_clear=0.9).check()
    with pytest.raises(ValueError, match="homes_filesystem_clear"):
        rules(homes_filesystem_high=0.5, homes_filesystem_clear=0.6).check()


def test_the_incident_and_its_home_survive_a_restart(tmp_path):
    book, r, alice = IncidentBook(), rules(home_disk_hold=0), server()
    book.evaluate(cycle(T, alice, found=homes(alice=19 * GiB)), r)
    book.save(tmp_path / "incidents.json")
    again = IncidentBook.load(tmp_path / "incidents.json", LOG)
    assert again.open["home_disk:alice"].home == "alice"
    assert again.evaluate(cycle(T + 5, alice, found=homes(alice=19 * GiB)), r) == []


# --- the homes' filesystem at 90% ----------------------------------------------------------


def test_the_homes_filesystem_past_90_percent_is_told_once_and_resolved_once():
    book, r = IncidentBook(), rules()
    full = space(used=92 * GiB, free=8 * GiB, size=110 * GiB)  # df: 92 of 100, 92%
    assert book.evaluate(cycle(T, found={}, room=full), r) == []
    (opened,) = book.evaluate(cycle(T + 60, found={}, room=full), r)
    assert (opened.kind, opened.incident.key, opened.incident.server) == (
        "open", HOMES_FILESYSTEM, None)
    assert opened.incident.percent == 92.0
    assert book.evaluate(cycle(T + 65, found={}, room=None), r) == []  # unreadable: kept
    assert book.evaluate(cycle(T + 70, found={}, room=space(88 * GiB, 12 * GiB)), r) == []
    (resolved,) = book.evaluate(cycle(T + 75, found={}, room=space(50 * GiB, 50 * GiB)), r)
    assert resolved.kind == "resolve" and resolved.incident.reason == (
        "The homes' filesystem is down to 50%.")


def test_the_filesystem_is_watched_where_homes_are_plain_folders_too():
    book = IncidentBook()
    events = book.evaluate(cycle(T, found={}, room=space(95 * GiB, 5 * GiB), enforced=False),
                           rules(homes_filesystem_hold=0))
    assert told(events, HOMES_FILESYSTEM) == ["open"]
    (ended,) = book.evaluate(Snapshot(time=T + 5, host="gpu-host-1"), rules())
    assert ended.kind == "resolve" and ended.incident.reason == "the homes are no longer watched"


# --- the messages and who gets them --------------------------------------------------------


def opened_home() -> Event:
    book = IncidentBook()
    alice = server()
    (event,) = book.evaluate(cycle(T, alice, found=homes(alice=int(18.5 * GiB))),
                             rules(home_disk_hold=0))
    return event


def test_the_home_message_says_whose_home_how_full_and_what_to_do():
    message = format_message(opened_home(), "https://hub.example.org", "gpu-host-1", T + 65)
    assert message.title == "[warning] alice's home at 92% of its size"
    lines = message.body.splitlines()
    assert lines[0] == "What: The home holds 18.5 GiB (92%) of its size, 20 GiB."
    assert "Who: alice (role student, image pytorch)" in lines
    assert "Server: https://hub.example.org/user/alice/" in lines
    assert lines[-2].startswith("What to do: Delete what you no longer need from your home")
    assert lines[-1] == "Incident: home_disk:alice"


def test_the_resolved_home_message_has_no_numbers_in_its_title():
    event = opened_home()
    book = IncidentBook(open={event.incident.key: event.incident})
    (resolved,) = book.evaluate(cycle(T + 125, server(), found=homes(alice=4 * GiB)),
                                rules())
    message = format_message(resolved, "https://hub.example.org", "gpu-host-1", T + 125)
    assert message.title == "[resolved] alice's home nearly full: resolved after 2m05s"
    assert message.body.splitlines()[0] == (
        "Resolved after 2m05s: The home is down to 20% of its size.")
    assert "What to do" not in message.body


def test_the_filesystem_message_names_the_path_the_room_and_the_reservations():
    book = IncidentBook()
    found = homes(alice=GiB, bob=GiB, carol=GiB)  # three homes of 20 GiB: 60 GiB reserved
    (event,) = book.evaluate(cycle(T, found=found, room=space(46 * GiB, 4 * GiB)),
                             rules(homes_filesystem_hold=0))
    message = format_message(event, "https://hub.example.org", "gpu-host-1", T)
    assert message.title == "[warning] the homes' filesystem on gpu-host-1 at 92%"
    assert message.body.splitlines()[0] == (
        "What: The homes' filesystem /srv/homes holds 46 GiB (92%), with 4 GiB free; the "
        "homes' sizes reserve 60 GiB of it together.")
    assert "Who:" not in message.body and "Incident: homes_filesystem" in message.body
    assert "What to do: Admins: when this filesystem is full" in message.body


CHANNELS = [{"name": "admins"}, {"name": "alice", "users": ["alice"]},
            {"name": "class", "groups": ["cs101"]}, {"name": "students", "roles": ["student"]},
            {"name": "bob", "users": ["bob"]}]


def test_a_home_goes_to_its_user_and_the_admins_and_the_filesystem_to_the_admins():
    home = opened_home().incident
    assert [c["name"] for c in CHANNELS if routes(c, home, ["cs101"])] == ["admins", "alice"]
    assert about(home) == "alice"  # counted against the per-user limit, with a digest
    book = IncidentBook()
    (fs,) = book.evaluate(cycle(T, found={}, room=space(95 * GiB, 5 * GiB)),
                          rules(homes_filesystem_hold=0))
    assert [c["name"] for c in CHANNELS if routes(c, fs.incident, [])] == ["admins"]
    assert about(fs.incident) == ""
    # a channel's rules narrow it, as for every rule
    assert not routes({"name": "oom-only", "rules": ["oom"]}, home, [])


async def test_past_the_per_user_limit_a_home_message_waits_for_the_digest():
    notifier = Notifier(channels=[{"name": "admins", "url": "feishu://token/secret"}],
                        user_message_limit=1)
    event = opened_home()
    assert [c["name"] for c in notifier.held_back(event, notifier.channels, T,
                                                  notifier.limits)] == ["admins"]
    assert notifier.held_back(event, notifier.channels, T + 1, notifier.limits) == []


# --- the gauges --------------------------------------------------------------------------


def test_the_gauges_give_each_running_home_and_the_filesystem():
    metrics = WatchdogMetrics()
    found = homes(alice=5 * GiB, bob=(GiB, 10 * GiB), gone=(3 * GiB, 30 * GiB))
    metrics.update(cycle(T, server("alice", disk=8 * GiB), server("bob", disk=None),
                         found=found, room=Space(ROOT, 120 * GiB, 60 * GiB, 50 * GiB)))
    value = metrics.registry.get_sample_value
    alice = {"user": "alice", "role": "student", "home": "alice"}
    assert value(PREFIX + "home_used_bytes", alice) == 5 * GiB
    assert value(PREFIX + "home_limit_bytes", alice) == 8 * GiB  # its label's size
    assert value(PREFIX + "home_limit_bytes", {**alice, "user": "bob", "home": "bob"}) == \
        10 * GiB
    assert value(PREFIX + "home_used_bytes", {**alice, "user": "gone", "home": "gone"}) is None
    assert value(PREFIX + "homes_reserved_bytes") == 60 * GiB  # every home's size
    assert value(PREFIX + "homes_filesystem_size_bytes") == 120 * GiB
    assert value(PREFIX + "homes_filesystem_used_bytes") == 60 * GiB
    assert value(PREFIX + "homes_filesystem_free_bytes") == 50 * GiB
    metrics.update(Snapshot(time=T + 5, host="gpu-host-1"))  # not watched: no series
    assert value(PREFIX + "homes_filesystem_size_bytes") is None
    assert value(PREFIX + "home_used_bytes", alice) is None


# --- what each container sees: home.json ----------------------------------------------------


def test_home_json_is_written_whole_when_it_changes_and_every_minute(tmp_path):
    files = HomeUseFiles(tmp_path, LOG)
    (tmp_path / "alice").mkdir()  # the hub makes the folder it mounts; bob's it did not
    running = (server("alice"), server("bob"))
    assert files.write(cycle(T, *running, found=homes(alice=GiB, bob=GiB))) == ["alice"]
    path = tmp_path / "alice" / "home.json"
    assert json.loads(path.read_text()) == {"version": 1, "used": GiB, "limit": 20 * GiB,
                                            "at": T, "mechanism": "btrfs", "full": False}
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(tmp_path / "alice")) == ["home.json"]  # nothing else
    assert not (tmp_path / "bob").exists()
    assert files.write(cycle(T + 5, *running, found=homes(alice=GiB, bob=GiB))) == []
    assert files.write(cycle(T + 10, *running, found=homes(alice=20 * GiB))) == ["alice"]
    assert json.loads(path.read_text())["full"] is True
    assert files.write(cycle(T + 65, *running, found=homes(alice=20 * GiB))) == []
    assert files.write(cycle(T + 70, *running, found=homes(alice=20 * GiB))) == ["alice"]
    assert json.loads(path.read_text())["at"] == T + 70
    assert sorted(os.listdir(tmp_path / "alice")) == ["home.json"]


def test_no_home_json_without_a_size_or_a_reading(tmp_path):
    files = HomeUseFiles(tmp_path, LOG)
    (tmp_path / "alice").mkdir()
    alice = server(disk=None)
    assert files.write(cycle(T, alice, found=homes(alice=(GiB, None)))) == []
    assert files.write(cycle(T, server(), found=None)) == []
    assert files.write(cycle(T, server(), found={}, enforced=False)) == []
    assert os.listdir(tmp_path / "alice") == []


# --- this node's homes document --------------------------------------------------------------


def test_the_homes_document_lists_every_home_with_its_running_user():
    snapshot = cycle(T, server("alice", disk=8 * GiB),
                     found=homes(alice=GiB, bob=(2 * GiB, 5 * GiB)),
                     room=Space(ROOT, 100 * GiB, 40 * GiB, 55 * GiB))
    document = disk_document(snapshot, 5.0, "gpu-host-1")
    assert document.to_json() == {
        "version": 1, "node": "gpu-host-1", "at": T, "interval": 5.0, "mechanism": "btrfs",
        "enforced": True,
        "sentence": "Homes are btrfs subvolumes under /srv/homes, each limited by a qgroup",
        "filesystem": {"path": "/srv/homes", "size": 100 * GiB, "used": 40 * GiB,
                       "free": 55 * GiB, "reserved": 25 * GiB},
        "homes": [{"user": "alice", "name": "alice", "used": GiB, "limit": 8 * GiB},
                  {"user": None, "name": "bob", "used": 2 * GiB, "limit": 5 * GiB}]}
    assert DiskUsage.from_text(document.to_text()) == document
    failed = Snapshot(time=T, host="h", disk=DiskReading(
        "btrfs", True, "Homes are btrfs subvolumes", error="btrfs qgroup show: exit 1"))
    unread = disk_document(failed, 5.0, "n")
    assert unread.homes == () and unread.filesystem is None
    assert unread.sentence == ("Homes are btrfs subvolumes; their use cannot be read now "
                               "(btrfs qgroup show: exit 1)")
    assert disk_document(Snapshot(time=T, host="h"), 5.0, "n") is None


# --- the settings ---------------------------------------------------------------------


def test_the_hub_gives_its_managed_watchdog_its_homes_and_the_watchdog_reads_them(
        monkeypatch, tmp_path):
    service, _ = watchdog_service("http://hub", home_root="/srv/homes", home_mechanism="btrfs")
    environment = service["environment"]
    assert (environment["QUOTA_SPAWNER_HOME_ROOT"],
            environment["QUOTA_SPAWNER_HOME_MECHANISM"]) == ("/srv/homes", "btrfs")
    bare, _ = watchdog_service("http://hub", home_mechanism="btrfs")  # no root: nothing
    assert not {"QUOTA_SPAWNER_HOME_ROOT", "QUOTA_SPAWNER_HOME_MECHANISM"} & set(
        bare["environment"])
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    app = QuotaWatchdog()
    assert (app.home_root, app.home_mechanism, app.home_use_dir) == (
        "/srv/homes", "btrfs", str(tmp_path / "home-use"))
    monkeypatch.delenv("QUOTA_SPAWNER_HOME_MECHANISM")
    monkeypatch.delenv("QUOTA_SPAWNER_STATE_DIR")
    assert (QuotaWatchdog().home_mechanism, QuotaWatchdog().home_use_dir) == ("auto", "")
