"""Real filesystems on loop devices for the homes' tests (tests/service/test_homes_*.py):
a btrfs filesystem made in a file, with quotas on, and folders for the image mechanism;
each in a folder under /tmp that the notebooks' user can reach, and all of it removed
after (unmounted, loop devices detached, files deleted), whatever failed.

Loop devices and mounts need root: without it the tests that use these are skipped.
``write_as`` writes the way a notebook does: a real process, as the containers' uid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawner.homes.mounts import read_mounts

NOTEBOOK_UID, NOTEBOOK_GID = 1000, 100  # jovyan:users, as in the notebook images
MiB = 2**20

WRITER = r"""
import errno, os, sys
path, total, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
written, failure = 0, ""
block = b"\x5a" * chunk
try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while written < total:
            written += os.write(fd, block[:min(chunk, total - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
except OSError as e:
    failure = errno.errorcode.get(e.errno, str(e.errno))
print(written, failure)
"""


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices and mounts")


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def write_as(path: Path, total: int, *, uid: int = NOTEBOOK_UID, gid: int = NOTEBOOK_GID,
             chunk: int = MiB) -> tuple[int, str]:
    """Append up to ``total`` bytes to ``path`` as ``uid``:``gid`` in a new process, then
    fsync: (bytes written, the errno's name that stopped it or "")."""
    done = subprocess.run(["/usr/bin/python3", "-c", WRITER, str(path), str(total), str(chunk)],
                          user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                          timeout=120, check=True)
    written, _, failure = done.stdout.strip().partition(" ")
    return int(written), failure


def _unmount_below(folder: Path) -> None:
    # deepest first; a busy one is detached lazily so the folder can still go
    inside = sorted((m.mount_point for m in read_mounts()
                     if m.mount_point.startswith(str(folder) + "/")), key=len, reverse=True)
    for point in inside:
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True)


def _detach_loops_of(folder: Path) -> None:
    listed = subprocess.run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"],
                            capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name, _, backing = line.strip().partition(" ")
        if backing.strip().startswith(str(folder) + "/"):
            subprocess.run(["losetup", "-d", name], capture_output=True)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A folder under /tmp the notebooks' uid can pass through (pytest's tmp_path cannot
    be: its parents are root's alone); everything mounted below it goes with it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        _unmount_below(folder)
        _detach_loops_of(folder)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def btrfs_filesystem(size: str = "400M") -> Iterator[Path]:
    """A btrfs filesystem of ``size`` in a file, mounted on a loop device, quotas on."""
    need_root()
    with scratch_folder("quota-btrfs-") as folder:
        image, mount = folder / "btrfs.img", folder / "mnt"
        run("truncate", "-s", size, str(image))
        run("mkfs.btrfs", "-q", str(image))
        mount.mkdir()
        run("mount", "-o", "loop", str(image), str(mount))
        mount.chmod(0o711)
        run("btrfs", "quota", "enable", str(mount))
        yield mount


def attached_loops(image: Path) -> list[str]:
    """The loop devices that hold ``image`` now."""
    out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    return [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]
