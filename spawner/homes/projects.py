"""Homes limited by project quotas, on XFS or ext4 (docs/disk.md#xfs-and-ext4-project-quotas):
what both share. xfs.py and ext4.py say which commands do it.

Each home is a folder ``ROOT/NAME`` whose files all carry one project id, inherited by
every file made in it (the folder's inherit flag); the project's hard block limit is the
home's size. Writes past it fail with EDQUOT or ENOSPC. A limit may be set below what a
home holds: writes are refused, nothing is deleted.

A home's project id is chosen once and written down in ``ROOT/.quota-spawner-projects``
(``ProjectIds``), one ``ID NAME`` line per home, appended under a file lock and never
rewritten: an id is never given to another home, even after its home is gone, so a
stray file that still carries an old id is never counted in someone else's home.
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
from abc import abstractmethod
from pathlib import Path

from spawner.homes.base import HOME_MODE, Home, HomeStore, HomeUse
from spawner.homes.errors import HomeError, HomesUnavailable

RECORD = ".quota-spawner-projects"
FIRST_PROJECT_ID = 1_000_000  # far from the small ids admins give by hand in /etc/projid
MAX_PROJECT_ID = 2**32 - 2  # project ids are 32 bits; -1 means "none" to the tools
HEADER = ("# quota-spawner: the project id of each home in this folder (docs/disk.md). "
          "Lines are only ever added: an id is never reused.\n")


def report_rows(text: str, used_at: int, hard_at: int,
                status_at: int | None = None) -> dict[int, tuple[int, int | None]]:
    """A quota tool's report: project id -> (used bytes, hard limit bytes or None), from
    the rows whose first field is an id (``#ID`` or ``ID``) and whose fields at
    ``used_at`` and ``hard_at`` are KiB; with ``status_at``, only rows whose field there
    is a limits status (``--``, ``+-``, ``-+``, ``++``). Headers and other lines are
    skipped."""
    found: dict[int, tuple[int, int | None]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) <= max(used_at, hard_at):
            continue
        if status_at is not None and fields[status_at] not in ("--", "+-", "-+", "++"):
            continue
        try:
            project = int(fields[0].removeprefix("#"))
            used, hard = int(fields[used_at]), int(fields[hard_at])
        except ValueError:
            continue
        found[project] = (used * 1024, hard * 1024 or None)
    return found


def kib(size: int) -> int:
    """Bytes as the 1 KiB blocks the quota tools count in, rounded up."""
    return math.ceil(size / 1024)


class ProjectIds:
    """The project id of each home under ``root``: read from the record, chosen there."""

    def __init__(self, root: Path, first: int = FIRST_PROJECT_ID):
        if not 0 < first <= MAX_PROJECT_ID:
            raise HomesUnavailable(f"the first project id must be 1 to {MAX_PROJECT_ID}, "
                                   f"not {first}")
        self.path = root / RECORD
        self.first = first
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of what _ids holds
        self._ids: dict[str, int] = {}

    @staticmethod
    def _parse(text: str) -> dict[str, int]:
        ids: dict[str, int] = {}
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0].isdigit():
                ids.setdefault(fields[1], int(fields[0]))
        return ids

    def read(self) -> dict[str, int]:
        """Home name -> project id, as recorded (read again only when the file changed)."""
        with self._lock:
            try:
                found = os.stat(self.path)
            except FileNotFoundError:
                return {}
            if self._seen != (found.st_mtime_ns, found.st_size):
                self._ids = self._parse(self.path.read_text(encoding="utf-8"))
                self._seen = (found.st_mtime_ns, found.st_size)
            return dict(self._ids)

    def id_for(self, name: str) -> int:
        """``name``'s project id, chosen and recorded now if it has none."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with self._lock, os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another process may be choosing too
            f.seek(0)
            text = f.read()
            ids = self._parse(text)
            if name in ids:
                return ids[name]
            chosen = max([self.first - 1, *ids.values()]) + 1
            if chosen > MAX_PROJECT_ID:
                raise HomeError(f"no project id is left above {self.first} in {self.path}")
            f.write(("" if text else HEADER) + f"{chosen} {name}\n")
            f.flush()
            os.fsync(f.fileno())
            return chosen


class ProjectQuotaHomes(HomeStore):
    """What XFS and ext4 project quotas share; a subclass runs the tools."""

    fstype: str = ""

    def __init__(self, root: str | Path, *, first_project_id: int = FIRST_PROJECT_ID,
                 **kwargs):
        super().__init__(root, **kwargs)
        self.ids = ProjectIds(self.root, first_project_id)
        self._mount_point: str | None = None

    def check(self) -> None:
        super().check()
        mount = self._mount()
        if mount.fstype != self.fstype:
            raise HomesUnavailable(f"{self.root} is on {mount.fstype} ({mount.source} at "
                                   f"{mount.mount_point}), not {self.fstype}")
        if not mount.option("prjquota", "pquota"):
            raise HomesUnavailable(f"{self.root} is {self.fstype} mounted without prjquota "
                                   f"({mount.source} at {mount.mount_point})")
        if any(c.isspace() for c in str(self.root)):
            # xfs_quota's -c commands split on blanks, and the paths go in them
            raise HomesUnavailable(f"the homes' root {str(self.root)!r} holds a blank, which "
                                   "the quota tools' commands cannot carry")
        self._mount_point = mount.mount_point
        try:
            self._report()  # the tools are there and the filesystem answers
        except HomeError as e:
            raise HomesUnavailable(str(e)) from None

    @property
    def mount_point(self) -> str:
        if self._mount_point is None:
            self.check()
        assert self._mount_point is not None
        return self._mount_point

    @abstractmethod
    def _report(self) -> dict[int, tuple[int, int | None]]:
        """Every project's (used bytes, hard limit in bytes or None), in one command."""

    @abstractmethod
    def _assign(self, path: Path, project: int) -> None:
        """Give ``path`` and everything in it ``project``, inherited by new files."""

    @abstractmethod
    def _limit(self, project: int, size: int) -> None:
        """Set ``project``'s hard block limit to ``size`` bytes."""

    def _prepare(self, user: str, name: str, size: int) -> Home:
        path = self.root / name
        found = self._existing(path)
        project = self.ids.id_for(name)
        used, limit = self._report().get(project, (0, None))
        change = ""
        if found is None:
            os.mkdir(path, HOME_MODE)
            self._own(path)
            change = "created"
        if change or limit is None:
            # a new folder, or one never limited (a failed start, a home made by hand):
            # everything in it joins the project
            self._assign(path, project)
        target = kib(size) * 1024
        if limit != target:
            self._limit(project, size)
            if not change:
                change = "limited" if limit is None else "grown" if target > limit else "shrunk"
        return Home(user=user, name=name, path=path, size=size, limit=target, used=used,
                    change=change, previous_limit=None if change == "created" else limit)

    def usage(self) -> dict[str, HomeUse]:
        report = self._report()
        return {name: HomeUse(name, *report[project])
                for name, project in self.ids.read().items() if project in report}
