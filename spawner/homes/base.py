"""The interface every home mechanism implements, and what it returns.

A ``HomeStore`` keeps the homes of one host under one root folder, one folder per user
named as the user's containers are (names.py). ``prepare(user, size)`` makes a home or
brings it to ``size`` and returns the host path to bind-mount; ``usage()`` reads the use
of every home in one query per call; ``space()`` is the filesystem under the homes;
``release()`` gives back what the store holds while the hub runs (mounts).

A smaller size never deletes a byte: the home's limit becomes the new size (or what it
holds, where the mechanism cannot set a limit below use), so writes are refused until
the user deletes files, and ``Home.over_size`` says so.

Every method blocks (commands, mounts, statvfs): call it from a thread. ``prepare`` of
one home is serialised by a lock per home; different homes may be prepared at once.
"""

from __future__ import annotations

import os
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from spawner.homes.commands import CommandRunner, Runner
from spawner.homes.errors import HomeError, HomesUnavailable
from spawner.homes.mounts import MOUNTINFO, Mount, mount_of, read_mounts
from spawner.homes.names import container_escape, home_name
from spawner.quota.units import format_human

NOTEBOOK_OWNER = (1000, 100)  # jovyan:users in the notebook images (images/common)
HOME_MODE = 0o700
DOCS = "docs/disk.md"


@dataclass(frozen=True)
class HomeUse:
    """One home's use, as its mechanism counts it. ``limit`` None: not limited."""

    name: str
    used: int
    limit: int | None

    @property
    def full(self) -> bool:
        return self.limit is not None and self.used >= self.limit


@dataclass(frozen=True)
class Space:
    """The filesystem that holds the homes, in bytes; ``free`` is what a user may still
    write there (statvfs's f_bavail)."""

    path: Path
    size: int
    used: int
    free: int


@dataclass(frozen=True)
class Home:
    """What ``prepare`` made of one user's home.

    ``path`` is the host folder to bind-mount as the home, or None where the backend keeps
    its own volume (no homes root). ``limit`` is what the mechanism enforces now (None: no
    limit); ``used`` is the bytes the home holds, None where unknown. ``change`` is
    "created", "grown", "shrunk", "limited" (an existing home that had no limit) or "",
    and ``previous_limit`` the limit before it."""

    user: str
    name: str
    path: Path | None
    size: int
    limit: int | None
    used: int | None
    change: str = ""
    previous_limit: int | None = None

    @property
    def over_size(self) -> bool:
        """Whether the home holds its size or more: writes are refused until files go."""
        return self.limit is not None and self.used is not None and self.used >= self.size

    def over_size_message(self) -> str:
        """The sentence for the user and the log when ``over_size``, else ""."""
        if not self.over_size or self.used is None:
            return ""
        return (f"The home of {self.user} holds {format_human(self.used)}, at or over its "
                f"size of {format_human(self.size)}: nothing was deleted, and writes are "
                "refused until files are deleted.")


def statvfs_space(path: Path) -> Space:
    found = os.statvfs(path)
    size = found.f_blocks * found.f_frsize
    return Space(path=path, size=size, used=size - found.f_bfree * found.f_frsize,
                 free=found.f_bavail * found.f_frsize)


class HomeStore(ABC):
    """The homes of this host under ``root``, kept by one mechanism.

    ``owner`` is the (uid, gid) a new home belongs to: the notebook containers' user.
    ``escape`` names a home from a user's name (DockerSpawner's ``escape``; names.py).
    ``runner`` runs every command (commands.py); ``mountinfo`` is read to find mounts."""

    mechanism: ClassVar[str]
    enforced: ClassVar[bool] = True

    def __init__(self, root: str | Path, *, owner: tuple[int, int] = NOTEBOOK_OWNER,
                 escape: Callable[[str], str] | None = None, runner: Runner | None = None,
                 mountinfo: str | Path | None = None):
        if not os.path.isabs(root):
            raise HomesUnavailable(f"the homes' root {str(root)!r} is not an absolute path")
        self.root = Path(os.path.realpath(root))
        self.owner = owner
        self.escape = escape or container_escape
        self.run: Runner = runner or CommandRunner()
        self.mountinfo = mountinfo or MOUNTINFO
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # --- what every mechanism has ------------------------------------------------

    @abstractmethod
    def describe(self) -> str:
        """One sentence for the hub's start log and ``validate --engine``."""

    def check(self) -> None:
        """Raise HomesUnavailable if this mechanism cannot work here (open_homes calls it)."""
        if not self.root.is_dir():
            raise HomesUnavailable(f"the homes' root {self.root} is not a folder")

    def home_name(self, user: str) -> str:
        return home_name(user, self.escape)

    def home_path(self, user: str) -> Path | None:
        return self.root / self.home_name(user)

    def prepare(self, user: str, size: int) -> Home:
        """The user's home, made if missing and brought to ``size`` bytes."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise HomeError(f"a home's size must be a positive number of bytes, not {size!r}")
        name = self.home_name(user)
        with self._lock(name):
            return self._prepare(user, name, size)

    @abstractmethod
    def _prepare(self, user: str, name: str, size: int) -> Home: ...

    @abstractmethod
    def usage(self) -> dict[str, HomeUse]:
        """Every home's use, by home name, in one query."""

    def promised(self) -> dict[str, int]:
        """What each home may take of the filesystem, by home name, whether its server
        runs or not: its limit (admission, spawner/host/disk.py). One query, as usage()."""
        return {name: use.limit for name, use in self.usage().items() if use.limit}

    def space(self) -> Space | None:
        """The filesystem under the homes; None where the store has no folder of its own."""
        return statvfs_space(self.root)

    def release(self) -> None:  # noqa: B027 - most mechanisms hold nothing
        """Give back what the store holds while the hub runs; nothing by default."""

    # --- helpers for the mechanisms ---------------------------------------------

    def _lock(self, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    def _mounts(self) -> list[Mount]:
        return read_mounts(self.mountinfo)

    def _mount(self) -> Mount:
        found = mount_of(self.root, self._mounts())
        if found is None:
            raise HomesUnavailable(f"no mount holds {self.root} (in {self.mountinfo})")
        return found

    def _existing(self, path: Path) -> os.stat_result | None:
        """``path``'s lstat if it exists; HomeError if it is anything but a folder (a
        symbolic link planted there would lead the hub's writes out of the root)."""
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(found.st_mode):
            raise HomeError(f"{path} exists and is not a folder; a home is not made there")
        return found

    def _own(self, path: Path) -> None:
        """A new home: the containers' user owns it, and no one else may look in."""
        os.chown(path, *self.owner, follow_symlinks=False)
        os.chmod(path, HOME_MODE)
