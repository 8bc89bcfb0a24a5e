"""Homes limited by ext4 project quotas (docs/disk.md#xfs-and-ext4-project-quotas).

The filesystem has the ``project`` and ``quota`` features (``tune2fs -O project,quota``,
unmounted) and is mounted with ``prjquota``. The commands (e2fsprogs' chattr and the
quota tools):

- ``chattr -R -p ID +P HOME``: the home and everything in it get project ID, and folders
  the inherit flag (+P), so new files join it;
- ``setquota -P ID 0 N 0 0 MOUNT``: the hard block limit, N in KiB, no soft limit and
  no inode limits;
- ``repquota -P -n MOUNT``: every project with use, one line each after a header:
  ``#ID  --  USED  SOFT  HARD  [GRACE]  FILES  SOFT  HARD  [GRACE]``, blocks in KiB
  (quota-tools repquota.c).

ext4 refuses writes past the hard limit with EDQUOT ("Disk quota exceeded"). Root
(CAP_SYS_RESOURCE) is not held back by it; the notebook containers run as uid 1000 with
no capabilities, so they are.
"""

from __future__ import annotations

from pathlib import Path

from spawner.homes.projects import ProjectQuotaHomes, kib, report_rows


def parse_repquota(text: str) -> dict[int, tuple[int, int | None]]:
    """``repquota -P -n``: project id -> (used bytes, hard limit bytes or None)."""
    return report_rows(text, used_at=2, hard_at=4, status_at=1)


class Ext4Homes(ProjectQuotaHomes):
    mechanism = "ext4"
    fstype = "ext4"

    def describe(self) -> str:
        return (f"Homes are folders under {self.root}, each limited by an ext4 project quota "
                f"on {self.mount_point}")

    def _report(self) -> dict[int, tuple[int, int | None]]:
        return parse_repquota(self.run(["repquota", "-P", "-n", self.mount_point]))

    def _assign(self, path: Path, project: int) -> None:
        self.run(["chattr", "-R", "-p", str(project), "+P", str(path)])

    def _limit(self, project: int, size: int) -> None:
        self.run(["setquota", "-P", str(project), "0", str(kib(size)), "0", "0",
                  self.mount_point])
