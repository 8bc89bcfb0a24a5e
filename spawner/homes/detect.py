"""Which mechanism keeps the homes of this host, and the one sentence that says so.

``open_homes(root, mechanism)`` returns a checked ``HomeStore``. ``auto`` picks by the
filesystem that holds ``root``: btrfs with quotas enabled, XFS or ext4 mounted with
``prjquota``; anything else (or none of those ready) is not enforced, with the reason
in ``describe()``. The image mechanism is never picked by itself: it costs a loop
device and a mount per home, so an admin chooses it. A mechanism named explicitly that
cannot work here raises HomesUnavailable with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spawner.homes.base import HomeStore
from spawner.homes.btrfs import BtrfsHomes
from spawner.homes.errors import HomesUnavailable
from spawner.homes.ext4 import Ext4Homes
from spawner.homes.image import ImageHomes
from spawner.homes.projects import FIRST_PROJECT_ID
from spawner.homes.unenforced import UnenforcedHomes
from spawner.homes.xfs import XfsHomes

MECHANISMS: dict[str, type[HomeStore]] = {
    "btrfs": BtrfsHomes, "xfs": XfsHomes, "ext4": Ext4Homes, "image": ImageHomes}
CHOICES = ("auto", *MECHANISMS, "none")
NO_ROOT = "no homes' root is set, so homes are Docker volumes, which have no size"


def _build(mechanism: str, root: str | Path, first_project_id: int,
           image_dir: str | Path | None, common: dict[str, Any]) -> HomeStore:
    if mechanism in ("xfs", "ext4"):
        return MECHANISMS[mechanism](root, first_project_id=first_project_id, **common)
    if mechanism == "image":
        return ImageHomes(root, image_dir=image_dir, **common)
    return MECHANISMS[mechanism](root, **common)


def open_homes(root: str | Path | None, mechanism: str = "auto", *,
               first_project_id: int = FIRST_PROJECT_ID, image_dir: str | Path | None = None,
               **common: Any) -> HomeStore:
    """The homes under ``root`` kept by ``mechanism`` (one of CHOICES), checked.

    ``common`` goes to every store: ``owner``, ``escape``, ``runner``, ``mountinfo``."""
    if mechanism not in CHOICES:
        raise ValueError(f"the homes' mechanism must be one of {', '.join(CHOICES)}, "
                         f"not {mechanism!r}")
    if root is None:
        if mechanism not in ("auto", "none"):
            raise HomesUnavailable(f"the {mechanism} mechanism needs a homes' root folder")
        return UnenforcedHomes(None, reason=NO_ROOT, **common)
    if mechanism == "none":
        store: HomeStore = UnenforcedHomes(root, reason="the homes' mechanism is none",
                                           **common)
        store.check()
        return store
    if mechanism != "auto":
        store = _build(mechanism, root, first_project_id, image_dir, common)
        store.check()
        return store
    probe = UnenforcedHomes(root, reason="", **common)
    probe.check()  # a root that is missing is a mistake, not a reason to go unlimited
    mount = probe._mount()
    if mount.fstype not in ("btrfs", "xfs", "ext4"):
        return UnenforcedHomes(
            root, reason=f"{probe.root} is on {mount.fstype} ({mount.source} at "
            f"{mount.mount_point}), which has no quota these homes can use (the image "
            "mechanism works on any filesystem)", **common)
    store = _build(mount.fstype, root, first_project_id, image_dir, common)
    try:
        store.check()
    except HomesUnavailable as e:
        return UnenforcedHomes(root, reason=str(e), **common)
    return store
