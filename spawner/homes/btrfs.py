"""Homes as btrfs subvolumes, each limited by its qgroup (docs/disk.md#btrfs).

A home is a subvolume ``ROOT/NAME``; btrfs gives every subvolume a level-0 qgroup
``0/ID`` (ID: the subvolume's id), and its limit on *referenced* bytes is the home's
size: every extent the home can reach counts, shared ones (reflinks) too. Writes past
it fail with EDQUOT ("Disk quota exceeded"), for root as well as for the containers'
user. A limit may be set below what a home holds: its writes are then refused and
nothing is deleted.

The use of every home is one ``btrfs qgroup show --raw -r -e`` of the filesystem
(btrfs-progs 5.x and 6.x print the same first five columns; 6.x adds a path, which is
not used). The id of each home's subvolume comes from an ioctl (what ``btrfs
inspect-internal rootid`` does), kept per home while the subvolume's device number
stays the same, so a cycle runs one command and a ``scandir`` of the root.

The numbers trail the writes by up to a transaction commit (30 s by default): btrfs
counts extents when they are committed. The limit does not trail.

Privileges: creating a subvolume needs root (or user_subvol_rm_allowed), and setting a
qgroup limit needs CAP_SYS_ADMIN; reading the qgroups needs CAP_SYS_ADMIN too.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from pathlib import Path

from spawner.homes.base import Home, HomeStore, HomeUse
from spawner.homes.errors import HomeError, HomesUnavailable

SUBVOLUME_INODE = 256  # BTRFS_FIRST_FREE_OBJECTID: the root folder of every subvolume
# BTRFS_IOC_INO_LOOKUP = _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args), 4096 bytes:
# with objectid 256 it answers the subvolume's id (treeid), without privileges.
_INO_LOOKUP = (3 << 30) | (4096 << 16) | (0x94 << 8) | 18
_ARGS = struct.Struct("QQ")


def subvolume_id(path: Path) -> int:
    """The id of the subvolume whose root folder is ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        args = bytearray(4096)
        _ARGS.pack_into(args, 0, 0, SUBVOLUME_INODE)
        fcntl.ioctl(fd, _INO_LOOKUP, args)
        return _ARGS.unpack_from(args)[0]
    finally:
        os.close(fd)


def parse_qgroups(text: str) -> dict[int, tuple[int, int | None]]:
    """``btrfs qgroup show --raw -r -e``'s level-0 rows: subvolume id -> (referenced
    bytes, referenced limit or None). The header (``Qgroupid``/``qgroupid``) and the
    dashes are skipped; so is a row that does not parse."""
    found: dict[int, tuple[int, int | None]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[0].startswith("0/"):
            continue
        try:
            subvol = int(fields[0][2:])
            referenced = int(fields[1])
            limit = None if fields[3] == "none" else int(fields[3])
        except ValueError:
            continue
        found[subvol] = (referenced, limit)
    return found


class BtrfsHomes(HomeStore):
    mechanism = "btrfs"

    def __init__(self, root: str | Path, **kwargs):
        super().__init__(root, **kwargs)
        self._ids: dict[str, tuple[int, int]] = {}  # home -> (st_dev, subvolume id)

    def describe(self) -> str:
        return f"Homes are btrfs subvolumes under {self.root}, each limited by a qgroup"

    def check(self) -> None:
        super().check()
        mount = self._mount()
        if mount.fstype != "btrfs":
            raise HomesUnavailable(f"{self.root} is on {mount.fstype} ({mount.source} at "
                                   f"{mount.mount_point}), not btrfs")
        try:
            self._qgroups()
        except HomeError as e:
            if "quotas not enabled" in str(e) or "not enabled" in str(e):
                raise HomesUnavailable(
                    f"{self.root} is btrfs without quotas (run `btrfs quota enable "
                    f"{mount.mount_point}`)") from None
            raise HomesUnavailable(str(e)) from None

    def _qgroups(self) -> dict[int, tuple[int, int | None]]:
        return parse_qgroups(self.run(["btrfs", "qgroup", "show", "--raw", "-r", "-e",
                                       str(self.root)]))

    def _subvolume(self, name: str, found: os.stat_result) -> int:
        known = self._ids.get(name)
        if known and known[0] == found.st_dev:
            return known[1]
        subvol = subvolume_id(self.root / name)
        self._ids[name] = (found.st_dev, subvol)
        return subvol

    def _prepare(self, user: str, name: str, size: int) -> Home:
        path = self.root / name
        found = self._existing(path)
        change = ""
        if found is None:
            self.run(["btrfs", "subvolume", "create", str(path)])
            self._own(path)
            found = os.lstat(path)
            change = "created"
        elif found.st_ino != SUBVOLUME_INODE:
            raise HomeError(f"{path} is a plain folder, not a btrfs subvolume, so it cannot "
                            "be limited; move its files into a subvolume (docs/disk.md#btrfs)")
        subvol = self._subvolume(name, found)
        used, limit = self._qgroups().get(subvol, (0, None))
        if limit != size:
            # The qgroup is named and the path is the root: a limit set through the
            # home's own path needs room in that home, which a full home does not have.
            self.run(["btrfs", "qgroup", "limit", str(size), f"0/{subvol}", str(self.root)])
            if not change:
                change = "limited" if limit is None else "grown" if size > limit else "shrunk"
        return Home(user=user, name=name, path=path, size=size, limit=size, used=used,
                    change=change, previous_limit=limit if change != "created" else None)

    def usage(self) -> dict[str, HomeUse]:
        subvolumes: dict[int, str] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                found = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(found.st_mode) and found.st_ino == SUBVOLUME_INODE:
                    subvolumes[self._subvolume(entry.name, found)] = entry.name
        qgroups = self._qgroups()
        return {name: HomeUse(name, *qgroups[subvol]) for subvol, name in subvolumes.items()
                if subvol in qgroups}
