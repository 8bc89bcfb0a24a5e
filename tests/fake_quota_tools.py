"""A fake of the project-quota tools, at the homes' command boundary (spawner/homes/
commands.py's ``Runner``): ``xfs_quota``, ``chattr``, ``setquota`` and ``repquota``.

The machines the tests run on have no quota support in their kernel (``mount -o
prjquota`` is refused for XFS and ext4), so these tools cannot run here. The fake keeps
the state the kernel would (each project's files, use and hard limit), records every
command line it is given (``calls``), and answers in the tools' own formats, written
from their sources:

- ``xfs_quota -x -c 'report -p -b -n -N' MOUNT``: xfsprogs ``quota/report.c``
  (``report_mount``): per project ``"#%-10u"`` then ``" %10llu %10llu %10llu     %02d
  %9s"`` (used, soft and hard in KiB: basic blocks >> 1; warnings; the grace as
  ``[--------]`` when no timer runs), project 0 first, a blank line after the last. The
  header that ``-N`` leaves out (``"%s quota on %s (%s)"``, the ``Blocks`` line, the
  ``Project ID  Used  Soft  Hard  Warn/Grace`` line and the dashes) is in
  ``XFS_REPORT_WITH_HEADER``, a transcript of ``xfs_quota -x -c "report" /data`` published
  in the README of github.com/silenceper/xfsquota.
- ``xfs_quota -x -c 'project -s -p PATH ID' MOUNT``: ``quota/project.c`` prints
  ``"Setting up project %s (path %s)...\\n"`` and ``"Processed %d (%s and cmdline) paths
  for project %s with recursion depth %s (%d).\\n"``; ``limit`` prints nothing, and on a
  failure ``"xfs_quota: cannot set limits: %s"`` with exit code 1 (``quota/edit.c``).
- ``repquota -P -n MOUNT``: quota-tools ``repquota.c`` (``report_it``, ``print``): the
  ``"*** Report for %s quotas on device %s"`` and grace lines, the two heading lines and
  70 dashes, then per project ``"%-9s %c%c %7s %7s %7s %6s"`` and ``" %7s %5s %5s
  %6s"`` (name ``#ID`` with ``-n``; blocks in KiB), a blank line after. Projects with no
  use are left out, as repquota does without ``-v``. ``REPQUOTA_FROM_KERNEL_COMMIT`` is
  the ``repquota -P -a`` output quoted in Linux commit 57c32ea42f8e ("ext4: choose
  hardlimit when softlimit is larger than hardlimit in ext4_statfs_project()"), where
  project names were not resolved and printed as bare numbers.
- ``chattr -R -p ID +P PATH`` (e2fsprogs ``misc/chattr.c``) and ``setquota -P ID 0 KIB 0 0
  MOUNT`` print nothing on success; chattr's failure reads ``"chattr: %s while setting
  project on %s"``.

Failures are injected with ``fail``: the next command whose line contains the words
exits with that code and stderr, as the real runner reports it (``CommandError``).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spawner.homes.commands import CommandError

XFS_REPORT_WITH_HEADER = """\
Project quota on /data (/dev/vdb)
                               Blocks
Project ID       Used       Soft       Hard    Warn/Grace
---------- --------------------------------------------------
#0            7394256          0          0     00 [--------]
#2                  8   52428800   52428800     00 [--------]
#5               2360   52428800   52428800     00 [--------]
#9              10568   52428800   52428800     00 [--------]

"""

REPQUOTA_FROM_KERNEL_COMMIT = """\
*** Report for project quotas on device /dev/loop0
Block grace time: 7days; Inode grace time: 7days
                        Block limits                File limits
Project         used    soft    hard  grace    used  soft  hard  grace
----------------------------------------------------------------------
 0        --      13       0       0              2     0     0
 123      --   10237   20480   10240              5   200   100

"""


@dataclass
class Project:
    used_kib: int = 0
    hard_kib: int = 0
    files: int = 0
    paths: set[str] = field(default_factory=set)


@dataclass
class Failure:
    words: str
    code: int
    stderr: str


class FakeQuotaTools:
    """The project-quota tools of one filesystem mounted at ``mount`` from ``device``."""

    def __init__(self, mount: str | Path, device: str = "/dev/sdb1"):
        self.mount = str(mount)
        self.device = device
        self.calls: list[list[str]] = []
        self.projects: dict[int, Project] = {0: Project(used_kib=20, files=3)}
        self._failures: list[Failure] = []

    # --- the test's side ------------------------------------------------------

    def fail(self, words: str, code: int = 1, stderr: str = "") -> None:
        """The next command whose line contains ``words`` exits with ``code``."""
        self._failures.append(Failure(words, code, stderr))

    def use(self, project: int, kib: int, files: int = 1) -> None:
        """Files were written in ``project``'s tree: it now holds ``kib``."""
        found = self.projects.setdefault(project, Project())
        found.used_kib, found.files = kib, max(found.files, files)

    def lines(self, tool: str) -> list[str]:
        """The command lines run with ``tool``, as a shell would show them."""
        return [shlex.join(c) for c in self.calls if c[0] == tool]

    # --- the runner's side ----------------------------------------------------

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None,
                 ok: Collection[int] = (0,)) -> str:
        argv = list(argv)
        self.calls.append(argv)
        line = shlex.join(argv)
        for failure in self._failures:
            if failure.words in line:
                self._failures.remove(failure)
                if failure.code in ok:
                    return ""
                raise CommandError.exited(argv, failure.code, failure.stderr)
        tool = {"xfs_quota": self._xfs_quota, "chattr": self._chattr,
                "setquota": self._setquota, "repquota": self._repquota}.get(argv[0])
        if tool is None:
            raise CommandError.missing(argv)
        return tool(argv)

    def _project(self, project: str) -> Project:
        return self.projects.setdefault(int(project), Project())

    def _xfs_quota(self, argv: list[str]) -> str:
        assert argv[1:3] == ["-x", "-c"] and argv[4:] == [self.mount], argv
        words = argv[3].split()
        if words[:3] == ["project", "-s", "-p"] and len(words) == 5:
            path, project = words[3], words[4]
            found = self._project(project)
            found.paths.add(path)
            found.files = max(found.files, 1)
            found.used_kib = max(found.used_kib, 4)  # the folder's own block
            return (f"Setting up project {project} (path {path})...\n"
                    f"Processed 1 (/etc/projects and cmdline) paths for project {project} "
                    "with recursion depth infinite (-1).\n")
        if words[:2] == ["limit", "-p"] and len(words) == 4 and words[2].startswith("bhard="):
            value = words[2].removeprefix("bhard=")
            assert value.endswith("k"), value
            self._project(words[3]).hard_kib = int(value[:-1])
            return ""
        if words == ["report", "-p", "-b", "-n", "-N"]:
            rows = [f"#{pid:<10d} {p.used_kib:10d} {0:10d} {p.hard_kib:10d}     "
                    f"{0:02d} {'[--------]':>9s}\n" for pid, p in sorted(self.projects.items())]
            return "".join(rows) + "\n"
        raise AssertionError(f"xfs_quota command the fake does not know: {argv[3]!r}")

    def _chattr(self, argv: list[str]) -> str:
        assert argv[1:3] == ["-R", "-p"] and argv[4] == "+P" and len(argv) == 6, argv
        found = self._project(argv[3])
        found.paths.add(argv[5])
        found.files = max(found.files, 1)
        found.used_kib = max(found.used_kib, 4)
        return ""

    def _setquota(self, argv: list[str]) -> str:
        assert argv[1] == "-P" and argv[3] == "0" and argv[5:] == ["0", "0", self.mount], argv
        self._project(argv[2]).hard_kib = int(argv[4])
        return ""

    def _repquota(self, argv: list[str]) -> str:
        assert argv[1:] == ["-P", "-n", self.mount], argv
        out = [f"*** Report for project quotas on device {self.device}\n",
               "Block grace time: 7days; Inode grace time: 7days\n",
               "                        Block limits                File limits\n",
               f"{'Project':<9s}       used    soft    hard  grace    used  soft  hard  grace\n",
               "-" * 70 + "\n"]
        for pid, p in sorted(self.projects.items()):
            if not p.used_kib and not p.files:
                continue
            over = "+" if p.hard_kib and p.used_kib > p.hard_kib else "-"
            out.append(f"{'#' + str(pid):<9s} {over}- {p.used_kib:>7d} {0:>7d} "
                       f"{p.hard_kib:>7d} {'':>6s} {p.files:>7d} {0:>5d} {0:>5d} {'':>6s}\n")
        return "".join(out) + "\n"
