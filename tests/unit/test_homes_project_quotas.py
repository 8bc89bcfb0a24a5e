"""Homes limited by XFS and ext4 project quotas, against the recorded fake of the quota
tools (tests/fake_quota_tools.py): this kernel cannot enforce project quotas, so what is
tested is what the hub does at the tools' boundary: the reports read, the commands run
to create, grow and shrink a home, the project ids chosen once and never reused, and
the errors."""

from __future__ import annotations

import os
import shlex
import threading
from pathlib import Path

import pytest
from fake_quota_tools import REPQUOTA_FROM_KERNEL_COMMIT, XFS_REPORT_WITH_HEADER, FakeQuotaTools

from spawner.homes.commands import CommandError
from spawner.homes.detect import open_homes
from spawner.homes.errors import HomeError, HomesUnavailable
from spawner.homes.ext4 import Ext4Homes, parse_repquota
from spawner.homes.projects import RECORD, ProjectIds
from spawner.homes.unenforced import UnenforcedHomes
from spawner.homes.xfs import XfsHomes, parse_xfs_report

GiB = 2**30
FIRST = 1_000_000


def mountinfo(tmp_path: Path, fstype: str, options: str) -> Path:
    line = (f"36 25 8:17 / {tmp_path} rw,relatime shared:1 - {fstype} /dev/sdb1 "
            f"rw,{options}\n")
    found = tmp_path / "mountinfo"
    found.write_text("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" + line)
    return found


@pytest.fixture(params=["xfs", "ext4"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def tools(tmp_path) -> FakeQuotaTools:
    return FakeQuotaTools(tmp_path)


@pytest.fixture
def root(tmp_path) -> Path:
    found = tmp_path / "homes"
    found.mkdir()
    return found


def store(kind: str, root: Path, tools: FakeQuotaTools, *, quota: str = "prjquota",
          fstype: str = "", **kw):
    return open_homes(root, kind, runner=tools, owner=(os.getuid(), os.getgid()),
                      mountinfo=mountinfo(root.parent, fstype or kind, f"attr2,{quota}"), **kw)


def setup_lines(kind: str, path: Path, project: int) -> list[str]:
    if kind == "xfs":
        return [f"xfs_quota -x -c 'project -s -p {path} {project}' {path.parent.parent}"]
    return [f"chattr -R -p {project} +P {path}"]


def limit_lines(kind: str, project: int, kib: int, mount: Path) -> list[str]:
    if kind == "xfs":
        return [f"xfs_quota -x -c 'limit -p bhard={kib}k {project}' {mount}"]
    return [f"setquota -P {project} 0 {kib} 0 0 {mount}"]


def changes(tools: FakeQuotaTools) -> list[str]:
    """The command lines run that change something: all but the reports."""
    lines = [shlex.join(c) for c in tools.calls]
    return [line for line in lines if "report -p" not in line and
            not line.startswith("repquota")]


# --- the reports ----------------------------------------------------------------


def test_the_xfs_report_is_read_with_or_without_its_header():
    assert parse_xfs_report(XFS_REPORT_WITH_HEADER) == {
        0: (7394256 * 1024, None), 2: (8 * 1024, 52428800 * 1024),
        5: (2360 * 1024, 52428800 * 1024), 9: (10568 * 1024, 52428800 * 1024)}
    tools = FakeQuotaTools("/srv")
    tools.use(1000000, 12345)
    tools(["xfs_quota", "-x", "-c", "limit -p bhard=20480k 1000000", "/srv"])
    rendered = tools(["xfs_quota", "-x", "-c", "report -p -b -n -N", "/srv"])
    assert rendered.splitlines()[1].startswith("#1000000         12345          0      20480")
    assert parse_xfs_report(rendered)[1000000] == (12345 * 1024, 20480 * 1024)


def test_repquota_is_read_with_ids_numeric_or_bare_and_the_rest_skipped():
    assert parse_repquota(REPQUOTA_FROM_KERNEL_COMMIT) == {
        0: (13 * 1024, None), 123: (10237 * 1024, 10240 * 1024)}
    tools = FakeQuotaTools("/srv")
    tools.use(1000001, 99, files=7)
    tools(["setquota", "-P", "1000001", "0", "50", "0", "0", "/srv"])
    rendered = tools(["repquota", "-P", "-n", "/srv"])
    assert "#1000001  +-      99       0      50" in rendered  # over its limit: "+-"
    assert parse_repquota(rendered) == {0: (20 * 1024, None), 1000001: (99 * 1024, 50 * 1024)}


# --- making, growing, shrinking ---------------------------------------------------


def test_a_new_home_gets_a_recorded_project_its_setup_and_its_limit(kind, root, tools):
    homes = store(kind, root, tools)
    tools.calls.clear()
    home = homes.prepare("alice", 10 * GiB)
    path = root / "alice"
    assert home.path == path and path.is_dir() and home.change == "created"
    assert (home.limit, home.size, home.previous_limit) == (10 * GiB, 10 * GiB, None)
    assert oct(path.stat().st_mode & 0o777) == "0o700"
    assert changes(tools) == (setup_lines(kind, path, FIRST) +
                                    limit_lines(kind, FIRST, 10 * 2**20, root.parent))
    assert f"{FIRST} alice\n" in (root / RECORD).read_text()
    assert "homes/alice" not in str(homes.describe()) and str(root.parent) in homes.describe()


def test_a_bigger_size_only_raises_the_limit(kind, root, tools):
    homes = store(kind, root, tools)
    homes.prepare("alice", 10 * GiB)
    tools.calls.clear()
    home = homes.prepare("alice", 20 * GiB)
    assert (home.change, home.previous_limit, home.limit) == ("grown", 10 * GiB, 20 * GiB)
    assert changes(tools) == limit_lines(kind, FIRST, 20 * 2**20, root.parent)
    tools.calls.clear()
    assert homes.prepare("alice", 20 * GiB).change == ""
    assert changes(tools) == []  # the same size: a report, nothing changed


def test_a_smaller_size_below_use_deletes_nothing_and_says_the_home_is_over(kind, root, tools):
    homes = store(kind, root, tools)
    homes.prepare("bob", 10 * GiB)
    (root / "bob" / "checkpoint.pt").write_bytes(b"weights")
    tools.use(FIRST, 15 * 2**20)  # 15 GiB written
    tools.calls.clear()
    home = homes.prepare("bob", 5 * GiB)
    assert (home.change, home.limit, home.used) == ("shrunk", 5 * GiB, 15 * GiB)
    assert home.over_size
    assert home.over_size_message() == (
        "The home of bob holds 15 GiB, at or over its size of 5 GiB: nothing was deleted, "
        "and writes are refused until files are deleted.")
    assert changes(tools) == limit_lines(kind, FIRST, 5 * 2**20, root.parent)
    assert (root / "bob" / "checkpoint.pt").read_bytes() == b"weights"


def test_project_ids_are_chosen_once_recorded_and_never_reused(kind, root, tools):
    homes = store(kind, root, tools)
    homes.prepare("alice", GiB)
    homes.prepare("bob", GiB)
    (root / "alice").rmdir()  # an admin removed alice's home
    again = store(kind, root, tools)  # a restarted hub reads the record
    assert again.prepare("bob", 2 * GiB).change == "grown"
    assert again.prepare("carol", GiB).change == "created"
    assert ProjectIds(root).read() == {"alice": FIRST, "bob": FIRST + 1, "carol": FIRST + 2}
    home = again.prepare("alice", GiB)  # alice back: her id, her folder made again
    assert home.change == "created" and ProjectIds(root).read()["alice"] == FIRST
    assert setup_lines(kind, root / "alice", FIRST)[0] in changes(tools)[-2:]


def test_ids_chosen_at_once_by_many_threads_are_all_different(root):
    ids = ProjectIds(root, first=500)
    found: list[int] = []
    threads = [threading.Thread(target=lambda n=n: found.append(ids.id_for(f"u{n}")))
               for n in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(found) == list(range(500, 524))
    recorded = ProjectIds(root, first=500).read()
    assert sorted(recorded) == sorted(f"u{n}" for n in range(24))
    assert sorted(recorded.values()) == sorted(found)


def test_the_use_of_every_home_is_one_report(kind, root, tools):
    homes = store(kind, root, tools)
    for n in range(5):
        homes.prepare(f"user{n}", (n + 1) * GiB)
        tools.use(FIRST + n, (n + 1) * 1000)
    tools.calls.clear()
    found = homes.usage()
    assert len(tools.calls) == 1
    assert {name: (u.used, u.limit) for name, u in found.items()} == {
        f"user{n}": ((n + 1) * 1000 * 1024, (n + 1) * GiB) for n in range(5)}


# --- errors -------------------------------------------------------------------------


def test_a_failed_limit_says_the_command_its_code_and_its_stderr_and_is_redone(kind, root,
                                                                                tools):
    homes = store(kind, root, tools)
    stderr = ("xfs_quota: cannot set limits: Operation not permitted" if kind == "xfs" else
              "setquota: Cannot set quota for project 1000000 from kernel on /dev/sdb1: "
              "Operation not permitted")
    tools.fail("bhard=" if kind == "xfs" else "setquota", 1, stderr + "\n")
    with pytest.raises(CommandError) as failed:
        homes.prepare("alice", GiB)
    line = limit_lines(kind, FIRST, 2**20, root.parent)[0]
    assert str(failed.value) == f"`{line}` failed with exit code 1: {stderr}"
    assert failed.value.returncode == 1
    tools.calls.clear()
    home = homes.prepare("alice", GiB)  # the next start sets the home up again
    assert home.limit == GiB and home.change == "limited"
    assert changes(tools) == (setup_lines(kind, root / "alice", FIRST) +
                                    limit_lines(kind, FIRST, 2**20, root.parent))


def test_a_failed_setup_is_an_error_and_no_limit_is_set(root, tools):
    homes = store("ext4", root, tools)
    tools.fail("chattr", 1, f"chattr: Operation not supported while setting project on "
               f"{root}/alice\n")
    with pytest.raises(HomeError, match="exit code 1: chattr: Operation not supported"):
        homes.prepare("alice", GiB)
    assert not tools.lines("setquota")


def test_a_name_that_would_leave_the_root_is_refused_and_nothing_is_made(kind, root, tools):
    for escape in (lambda u: "../" + u, lambda u: ".", lambda u: "", lambda u: "a/b",
                   lambda u: ".hidden"):
        homes = store(kind, root, tools, escape=escape)
        with pytest.raises(HomeError, match="cannot be named"):
            homes.prepare("alice", GiB)
    assert sorted(p.name for p in root.parent.iterdir()) == ["homes", "mountinfo"]
    assert list(root.iterdir()) == []


def test_a_link_planted_as_a_home_is_refused(kind, root, tools, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "mallory").symlink_to(elsewhere)
    homes = store(kind, root, tools)
    with pytest.raises(HomeError, match="exists and is not a folder"):
        homes.prepare("mallory", GiB)
    assert not changes(tools)


# --- which mechanism --------------------------------------------------------------


def test_auto_picks_project_quotas_where_the_mount_has_prjquota(kind, root, tools):
    homes = store("auto", root, tools, fstype=kind)
    assert isinstance(homes, {"xfs": XfsHomes, "ext4": Ext4Homes}[kind])
    word = {"xfs": "an XFS", "ext4": "an ext4"}[kind]
    assert homes.describe() == (f"Homes are folders under {root}, each limited by {word} "
                                f"project quota on {root.parent}")


def test_without_prjquota_auto_says_disk_is_not_enforced_and_an_explicit_choice_fails(
        kind, root, tools):
    info = mountinfo(root.parent, kind, "relatime")
    homes = open_homes(root, "auto", runner=tools, mountinfo=info)
    assert isinstance(homes, UnenforcedHomes) and not homes.enforced
    assert homes.describe() == (f"Disk is not enforced: {root} is {kind} mounted without "
                                f"prjquota (/dev/sdb1 at {root.parent}); see docs/disk.md")
    with pytest.raises(HomesUnavailable, match="mounted without prjquota"):
        open_homes(root, kind, runner=tools, mountinfo=info)
    assert tools.calls == []  # no quota tool was run on a filesystem without quotas


def test_missing_tools_fail_an_explicit_choice_and_make_auto_unenforced(kind, root):
    def nothing_installed(argv, **_):
        raise CommandError.missing(argv)

    info = mountinfo(root.parent, kind, "prjquota")
    tool = {"xfs": "xfs_quota", "ext4": "repquota"}[kind]
    with pytest.raises(HomesUnavailable, match=f"{tool} is not installed"):
        open_homes(root, kind, runner=nothing_installed, mountinfo=info)
    found = open_homes(root, "auto", runner=nothing_installed, mountinfo=info)
    assert found.describe().startswith("Disk is not enforced: `") and \
        f"{tool} is not installed" in found.describe()


def test_a_filesystem_without_quotas_is_named_in_the_sentence(root, tools):
    info = mountinfo(root.parent, "tmpfs", "size=1g")
    homes = open_homes(root, "auto", runner=tools, mountinfo=info)
    assert homes.describe() == (
        f"Disk is not enforced: {root} is on tmpfs (/dev/sdb1 at {root.parent}), which has "
        "no quota these homes can use (the image mechanism works on any filesystem); see "
        "docs/disk.md")
    with pytest.raises(HomesUnavailable, match="is on tmpfs .*, not xfs"):
        open_homes(root, "xfs", runner=tools, mountinfo=info)
