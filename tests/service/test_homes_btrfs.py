"""Homes as btrfs subvolumes with qgroup limits, for real: one btrfs filesystem made in a
file on a loop device for the whole module (tests/loopfs.py), written to by real
processes as the notebook containers' uid (spawner/homes/btrfs.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
from loopfs import NOTEBOOK_GID, NOTEBOOK_UID, MiB, btrfs_filesystem, write_as

from spawner.homes.btrfs import BtrfsHomes
from spawner.homes.commands import CommandRunner
from spawner.homes.detect import open_homes
from spawner.homes.errors import HomeError

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def btrfs():
    with btrfs_filesystem() as mount:
        yield mount


class Recording(CommandRunner):
    """The real runner, counting what it runs."""

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "calls", [])

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        return super().__call__(argv, **kwargs)


@pytest.fixture
def runner() -> Recording:
    return Recording()


@pytest.fixture
def homes(btrfs, request, runner) -> BtrfsHomes:
    root = btrfs / request.node.name
    root.mkdir(mode=0o711)
    found = open_homes(root, "auto", runner=runner)
    assert isinstance(found, BtrfsHomes)
    return found


def commit(path) -> None:
    """btrfs counts extents at a transaction's commit: commit now."""
    subprocess.run(["btrfs", "filesystem", "sync", str(path)], check=True, capture_output=True)


def test_auto_finds_btrfs_with_quotas_and_says_so(homes):
    assert homes.describe() == (f"Homes are btrfs subvolumes under {homes.root}, each "
                                "limited by a qgroup")
    assert homes.space().size == 400 * MiB


def test_a_write_past_the_size_stops_there_and_the_next_home_keeps_accepting(homes):
    alice, bob = homes.prepare("alice", 50 * MiB), homes.prepare("bob", 50 * MiB)
    assert alice.change == "created" and alice.path == homes.root / "alice"
    found = os.stat(alice.path)
    assert (found.st_uid, found.st_gid, oct(found.st_mode & 0o777)) == (
        NOTEBOOK_UID, NOTEBOOK_GID, "0o700")
    written, failure = write_as(alice.path / "big", 80 * MiB)
    assert failure == "EDQUOT"  # "Disk quota exceeded"
    assert 46 * MiB <= written <= 50 * MiB
    assert write_as(bob.path / "data", 30 * MiB) == (30 * MiB, "")


def test_root_is_held_to_the_limit_too(homes):
    home = homes.prepare("carol", 20 * MiB)
    written, failure = write_as(home.path / "root-file", 40 * MiB, uid=0, gid=0)
    assert failure == "EDQUOT" and written <= 20 * MiB


def test_a_bigger_size_raises_the_limit_and_keeps_the_files(homes):
    homes.prepare("dave", 20 * MiB)
    written, failure = write_as(homes.root / "dave" / "a", 40 * MiB)
    assert failure == "EDQUOT"
    home = homes.prepare("dave", 60 * MiB)
    assert (home.change, home.previous_limit, home.limit) == ("grown", 20 * MiB, 60 * MiB)
    assert write_as(home.path / "b", 30 * MiB) == (30 * MiB, "")
    assert os.path.getsize(home.path / "a") == written


def test_a_smaller_size_below_use_deletes_nothing_refuses_writes_and_a_delete_frees(homes):
    home = homes.prepare("erin", 60 * MiB)
    assert write_as(home.path / "checkpoint", 30 * MiB) == (30 * MiB, "")
    assert write_as(home.path / "log", 5 * MiB) == (5 * MiB, "")
    commit(home.path)
    home = homes.prepare("erin", 20 * MiB)
    assert (home.change, home.limit) == ("shrunk", 20 * MiB)
    assert home.over_size and home.used >= 35 * MiB
    assert "writes are refused until files are deleted" in home.over_size_message()
    assert os.path.getsize(home.path / "checkpoint") == 30 * MiB  # nothing deleted
    assert write_as(home.path / "more", MiB)[1] == "EDQUOT"
    os.remove(home.path / "checkpoint")  # the user frees room: writes work at once
    assert write_as(home.path / "more", 10 * MiB) == (10 * MiB, "")


def test_the_use_of_many_homes_is_one_command(homes, runner):
    sizes = {f"user{n}": (n + 2) * 4 * MiB for n in range(12)}
    for n, (user, size) in enumerate(sizes.items()):
        home = homes.prepare(user, size)
        assert write_as(home.path / "f", (n + 1) * MiB) == ((n + 1) * MiB, "")
    commit(homes.root)
    homes.usage()  # the first reading learns the subvolumes' ids
    runner.calls.clear()
    found = homes.usage()
    assert runner.calls == [["btrfs", "qgroup", "show", "--raw", "-r", "-e", str(homes.root)]]
    assert set(found) == set(sizes)
    for n, (user, size) in enumerate(sizes.items()):
        assert found[user].limit == size
        assert (n + 1) * MiB <= found[user].used <= (n + 1) * MiB + 64 * 1024


def test_a_plain_folder_where_a_home_would_be_is_refused(homes):
    (homes.root / "frank").mkdir()
    with pytest.raises(HomeError, match="is a plain folder, not a btrfs subvolume"):
        homes.prepare("frank", 10 * MiB)


def test_a_size_that_is_not_a_positive_number_of_bytes_is_refused(homes):
    for size in (0, -1, 1.5, True, "10G"):
        with pytest.raises(HomeError, match="positive number of bytes"):
            homes.prepare("gina", size)
    assert not (homes.root / "gina").exists()
