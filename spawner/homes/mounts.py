"""What is mounted where, from ``/proc/self/mountinfo``: the filesystem that holds a
path (its type, device and quota options) and the mounts inside a folder (the image
mechanism's homes). One read of the file per call, no command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # the kernel writes space, tab, newline and backslash as \040, \011, \012, \134
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo."""

    mount_point: str
    fstype: str
    source: str
    root: str  # the folder of the filesystem mounted there ("/" unless a bind or subvolume)
    options: frozenset[str]  # the mount's and the superblock's options together

    def option(self, *names: str) -> bool:
        return any(name in self.options for name in names)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)
            fstype, source, super_options = fields[dash + 1:dash + 4]
        except ValueError:
            continue  # not a mount line (no " - " separator where it belongs)
        options = set(fields[5].split(",")) | set(super_options.split(","))
        mounts.append(Mount(mount_point=_unescape(fields[4]), fstype=fstype,
                            source=_unescape(source), root=_unescape(fields[3]),
                            options=frozenset(options)))
    return mounts


def read_mounts(mountinfo: str | Path = MOUNTINFO) -> list[Mount]:
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        return parse_mountinfo(f.read())


def _within(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


def mount_of(path: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path`` (resolved): the last mounted at its longest prefix."""
    real = os.path.realpath(path)
    found = None
    for mount in mounts:  # in mount order: a later mount on the same point hides earlier
        if _within(real, mount.mount_point) and (
                found is None or len(mount.mount_point) >= len(found.mount_point)):
            found = mount
    return found


def mounts_at(points: set[str], mounts: list[Mount]) -> dict[str, Mount]:
    """The visible mount on each of ``points`` that has one (the last one mounted)."""
    return {m.mount_point: m for m in mounts if m.mount_point in points}
