"""Homes as ext4 images on loop devices, for real, on an ordinary folder (the mechanism
for hosts without quota support), written to by real processes as the notebook
containers' uid (spawner/homes/image.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

import pytest
from loopfs import (
    NOTEBOOK_GID,
    NOTEBOOK_UID,
    MiB,
    attached_loops,
    need_root,
    scratch_folder,
    write_as,
)

from spawner.homes.detect import open_homes
from spawner.homes.errors import HomeError
from spawner.homes.image import ImageHomes
from spawner.homes.mounts import mount_of, read_mounts

pytestmark = pytest.mark.timeout(240)
EXACT = 64 * 1024  # a home's limit is its size within this (the reserve's own blocks)


@pytest.fixture(scope="module")
def folder():
    need_root()
    with scratch_folder("quota-images-") as found:
        yield found


@pytest.fixture
def homes(folder, request):
    root = folder / request.node.name
    root.mkdir(mode=0o711)
    found = open_homes(root, "image")
    assert isinstance(found, ImageHomes)
    yield found
    found.release()


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_sentence_and_a_new_home(homes):
    assert homes.describe() == (f"Homes are ext4 images in {homes.root}/.images, each "
                                f"mounted on a loop device under {homes.root} and limited "
                                "by its size")
    home = homes.prepare("alice", 64 * MiB)
    assert home.path == homes.root / "alice" / "home" == homes.home_path("alice")
    assert home.change == "created" and abs(home.limit - 64 * MiB) <= EXACT
    found = os.stat(home.path)
    assert (found.st_uid, found.st_gid, oct(found.st_mode & 0o777)) == (
        NOTEBOOK_UID, NOTEBOOK_GID, "0o700")
    assert mount_of(home.path, read_mounts()).source.startswith("/dev/loop")
    image = homes.image_of(homes.home_name("alice"))
    assert os.stat(image).st_blocks * 512 < 16 * MiB  # sparse: the reserve is not written


def test_a_write_past_the_size_stops_there_and_the_next_home_keeps_accepting(homes):
    alice, bob = homes.prepare("alice", 64 * MiB), homes.prepare("bob", 64 * MiB)
    written, failure = write_as(alice.path / "big", 100 * MiB)
    assert failure == "ENOSPC"  # "No space left on device"
    assert 60 * MiB <= written <= 64 * MiB
    assert write_as(bob.path / "data", 40 * MiB) == (40 * MiB, "")
    assert homes.space().free > 100 * MiB  # the host's filesystem is untouched


def test_root_is_held_to_the_size_too(homes):
    home = homes.prepare("carol", 32 * MiB)
    written, failure = write_as(home.path / "root-file", 64 * MiB, uid=0, gid=0)
    assert failure == "ENOSPC" and written <= 32 * MiB


def test_a_bigger_size_grows_the_image_and_keeps_the_files(homes):
    home = homes.prepare("dave", 32 * MiB)
    written, failure = write_as(home.path / "a", 64 * MiB)
    assert failure == "ENOSPC"
    before = digest(home.path / "a")
    home = homes.prepare("dave", 96 * MiB)
    assert home.change == "grown" and abs(home.limit - 96 * MiB) <= EXACT
    assert abs(home.previous_limit - 32 * MiB) <= EXACT
    assert digest(home.path / "a") == before
    assert write_as(home.path / "b", 50 * MiB) == (50 * MiB, "")


def test_a_smaller_size_below_use_deletes_nothing_refuses_writes_and_a_delete_frees(homes):
    home = homes.prepare("erin", 96 * MiB)
    assert write_as(home.path / "checkpoint", 40 * MiB) == (40 * MiB, "")
    before = digest(home.path / "checkpoint")
    home = homes.prepare("erin", 20 * MiB)
    assert home.change == "shrunk" and home.over_size
    assert 40 * MiB <= home.limit <= home.used + EXACT  # it may hold what it holds, no more
    assert digest(home.path / "checkpoint") == before  # nothing deleted
    assert write_as(home.path / "more", 2 * MiB)[1] == "ENOSPC"
    os.remove(home.path / "checkpoint")  # the user frees room: writes work again, at once
    assert write_as(home.path / "more", 10 * MiB) == (10 * MiB, "")
    home = homes.prepare("erin", 20 * MiB)  # the next start: down to its size
    assert abs(home.limit - 20 * MiB) <= EXACT and not home.over_size


def test_the_use_of_many_homes_is_read_without_a_command(homes):
    sizes = {f"user{n}": (n + 4) * 8 * MiB for n in range(6)}
    for n, (user, size) in enumerate(sizes.items()):
        home = homes.prepare(user, size)
        assert write_as(home.path / "f", (n + 1) * MiB) == ((n + 1) * MiB, "")

    def no_commands(argv, **_):
        raise AssertionError(f"usage ran {argv}")

    real, homes.run = homes.run, no_commands
    try:
        found = homes.usage()
    finally:
        homes.run = real
    assert set(found) == set(sizes)
    for n, (user, size) in enumerate(sizes.items()):
        assert abs(found[user].limit - size) <= EXACT
        assert (n + 1) * MiB <= found[user].used <= (n + 1) * MiB + EXACT


def test_release_unmounts_and_detaches_and_keeps_every_image(homes):
    home = homes.prepare("fay", 32 * MiB)
    assert write_as(home.path / "notes", 3 * MiB) == (3 * MiB, "")
    image = homes.image_of("fay")
    assert attached_loops(image)
    homes.release()
    assert image.exists()
    assert mount_of(homes.root / "fay", read_mounts()).mount_point != str(homes.root / "fay")
    assert not (homes.root / "fay" / "home").exists()  # the bare mount point
    deadline = time.monotonic() + 20  # the kernel lets a loop go after its last user
    while attached_loops(image) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert attached_loops(image) == []
    assert homes.usage() == {}
    home = homes.prepare("fay", 32 * MiB)  # the next start mounts it again, files and all
    assert home.change == "" and os.path.getsize(home.path / "notes") == 3 * MiB


def test_a_busy_home_grows_online_where_the_hub_may(homes):
    home = homes.prepare("gus", 32 * MiB)
    with open(home.path / "open-file", "w"):  # a server still has the home open
        status = open("/proc/self/status").read()
        effective = int(next(line for line in status.splitlines()
                             if line.startswith("CapEff:")).split()[1], 16)
        if effective & (1 << 24):  # CAP_SYS_RESOURCE: ext4 grows online
            grown = homes.prepare("gus", 64 * MiB)
            assert grown.change == "grown" and abs(grown.limit - 64 * MiB) <= EXACT
        else:  # a hub without it is told which command could not
            with pytest.raises(HomeError, match=r"`resize2fs /dev/loop\d+` failed"):
                homes.prepare("gus", 64 * MiB)


def test_a_home_still_mounted_by_a_running_server_is_never_resized_behind_its_back(homes):
    """A container keeps its home mounted in its own mount namespace, where the hub's
    unmount does not reach: checking or resizing the image file then would corrupt it."""
    home = homes.prepare("ida", 32 * MiB)
    assert write_as(home.path / "notes", 5 * MiB) == (5 * MiB, "")
    before = digest(home.path / "notes")
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare made no mount namespace"
            time.sleep(0.05)
        ran: list[list[str]] = []
        real = homes.run

        def recording(argv, **kwargs):
            ran.append(list(argv))
            return real(argv, **kwargs)

        homes.run, homes.detach_wait = recording, 2.0
        try:
            homes.prepare("ida", 64 * MiB)
            grown = True
        except HomeError as e:  # online needs CAP_SYS_RESOURCE, which this hub may lack
            assert "`resize2fs /dev/loop" in str(e)
            grown = False
        finally:
            homes.run = real
        assert not [argv for argv in ran if argv[0] == "e2fsck" or
                    (argv[0] == "resize2fs" and str(homes.image_of("ida")) in argv)]
        assert len(attached_loops(homes.image_of("ida"))) == 1  # one filesystem, one device
        assert digest(home.path / "notes") == before
        if grown:
            assert abs(homes.usage()["ida"].limit - 64 * MiB) <= EXACT
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_with_files_and_no_image_is_refused(homes):
    (homes.root / "hal").mkdir()
    (homes.root / "hal" / "old-notebook.ipynb").write_text("{}")
    with pytest.raises(HomeError, match="holds files but has no image"):
        homes.prepare("hal", 32 * MiB)
    assert not homes.image_of("hal").exists()
