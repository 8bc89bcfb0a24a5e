"""The hub's homes, opened from its settings, and the one sentence that says how they are
kept: which mechanism keeps each home at its role's size, or why disk is not enforced.
The hub's start log (docker/runtime.py) and ``quota-spawner validate --engine`` say the
same sentence (docs/disk.md#which-one-a-host-uses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from spawner.homes.base import HomeStore
from spawner.homes.detect import open_homes
from spawner.homes.errors import HomeError
from spawner.homes.names import container_escape
from spawner.host.disk import DiskCapacity
from spawner.quota.units import parse_size


def disk_capacity(size: int, reserve: str, ratio: float) -> DiskCapacity:
    """What the homes may be promised of their filesystem of ``size`` bytes, from the
    settings disk_reserve and disk_ratio (ValueError for one that cannot be used)."""
    return DiskCapacity(size, parse_size(reserve) if reserve else None, ratio)


@dataclass(frozen=True)
class OpenedHomes:
    """The homes as the hub opened them: the store (None where it could not be opened),
    the share of their filesystem (None where disk is not enforced), and the one sentence
    with its log level."""

    homes: HomeStore | None
    capacity: DiskCapacity | None
    sentence: str
    level: int


def open_hub_homes(root: str, mechanism: str, image_dir: str = "", ratio: float = 1.0,
                   reserve: str = "", escape: Callable[[str], str] | None = None
                   ) -> OpenedHomes:
    """The homes of the settings home_root, home_mechanism, home_image_dir, disk_ratio and
    disk_reserve, and the sentence that says how they are kept (blocks)."""
    try:
        homes = open_homes(root or None, mechanism, escape=escape or container_escape,
                           image_dir=image_dir or None)
        space = homes.space() if homes.enforced else None
        capacity = disk_capacity(space.size, reserve, ratio) if space is not None else None
    except (HomeError, OSError, ValueError) as e:
        return OpenedHomes(None, None, f"Disk is not enforced: {e}; every start of a role "
                           "with disk is refused until that is fixed (c.QuotaSpawner.home_*, "
                           "disk_*; docs/disk.md)", logging.ERROR)
    if capacity is None:  # today's volumes by default; a root that is not kept warns
        return OpenedHomes(homes, None, homes.describe(),
                           logging.WARNING if root else logging.INFO)
    return OpenedHomes(homes, capacity, f"{homes.describe()}; their filesystem: "
                       f"{capacity.describe()}", logging.INFO)
