"""Homes limited by XFS project quotas (docs/disk.md#xfs-and-ext4-project-quotas).

The filesystem is mounted with ``prjquota`` (XFS needs it at mount time; a root
filesystem needs it on the kernel's command line). The commands, all through
``xfs_quota -x`` on the mount point:

- ``project -s -p HOME ID``: the home and everything in it get project ID, with the
  inherit flag on folders (no /etc/projects needed; it is also read if present);
- ``limit -p bhard=Nk ID``: the hard block limit, in KiB;
- ``report -p -b -n -N``: every project's blocks, one line each, no header:
  ``#ID  USED  SOFT  HARD  WARNS  GRACE`` in KiB (xfsprogs quota/report.c).

XFS counts root's writes too, and refuses them with ENOSPC ("No space left on device")
once a project is at its hard limit.
"""

from __future__ import annotations

from pathlib import Path

from spawner.homes.projects import ProjectQuotaHomes, kib, report_rows


def parse_xfs_report(text: str) -> dict[int, tuple[int, int | None]]:
    """``report -p -b -n [-N]``: project id -> (used bytes, hard limit bytes or None)."""
    return report_rows(text, used_at=1, hard_at=3)


class XfsHomes(ProjectQuotaHomes):
    mechanism = "xfs"
    fstype = "xfs"

    def describe(self) -> str:
        return (f"Homes are folders under {self.root}, each limited by an XFS project quota "
                f"on {self.mount_point}")

    def _xfs_quota(self, command: str) -> str:
        return self.run(["xfs_quota", "-x", "-c", command, self.mount_point])

    def _report(self) -> dict[int, tuple[int, int | None]]:
        return parse_xfs_report(self._xfs_quota("report -p -b -n -N"))

    def _assign(self, path: Path, project: int) -> None:
        self._xfs_quota(f"project -s -p {path} {project}")

    def _limit(self, project: int, size: int) -> None:
        self._xfs_quota(f"limit -p bhard={kib(size)}k {project}")
