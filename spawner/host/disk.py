"""The homes' filesystem as a resource: each home's size is promised on it.

A home reserves its size on the filesystem that holds the homes from the moment it is
made, whether its server runs or not: its files stay. The homes may be promised, in
all, what the filesystem has less a reserve for the system (and, where they share it,
the hub's database and ledger), times an overcommit ratio:

    share = (size - reserve) * ratio

Making a home, or growing one, is admitted while the sizes promised to the other homes
plus its new size stay within the share. A home that keeps its size (or shrinks) is
never refused: it takes nothing new. Pure bookkeeping: no filesystem, no engine; the
Docker backend reads the sizes (spawner/homes) and asks here (docs/disk.md#admission).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from spawner.quota.units import format_human

GiB = 2**30
# The documented defaults (docs/disk.md#admission): a tenth of the filesystem kept free,
# at most 100 GiB (a big filesystem needs no more to keep working), and no overcommit:
# a home's size is a promise that its user may fill it.
RESERVE_SHARE = 0.10
RESERVE_MAX = 100 * GiB
DISK_RATIO = 1.0


def default_reserve(size: int) -> int:
    """What is kept free on a homes' filesystem of ``size`` bytes: a tenth, at most
    RESERVE_MAX."""
    return min(RESERVE_MAX, int(size * RESERVE_SHARE))


@dataclass(frozen=True)
class DiskCapacity:
    """What the homes together may be promised of the filesystem that holds them."""

    size: int  # the filesystem's size in bytes
    reserve: int | None = None  # None: default_reserve(size)
    ratio: float = DISK_RATIO

    def __post_init__(self) -> None:
        if self.size < 0 or (self.reserve or 0) < 0:
            raise ValueError("disk sizes must be 0 or more")
        if not math.isfinite(self.ratio) or self.ratio < 1:
            # below 1 would keep back more: that is what the reserve is for
            raise ValueError(f"the disk's overcommit ratio is at least 1 (got {self.ratio!r})")

    @property
    def kept(self) -> int:
        return default_reserve(self.size) if self.reserve is None else min(self.size,
                                                                           self.reserve)

    @property
    def share(self) -> int:
        """What the homes together may be promised."""
        return int((self.size - self.kept) * self.ratio)

    def describe(self) -> str:
        """'400 GiB; 40 GiB kept free; homes may be promised 360 GiB (1x)'."""
        return (f"{format_human(self.size)}; {format_human(self.kept)} kept free; homes "
                f"may be promised {format_human(self.share)} ({self.ratio:g}x)")


@dataclass(frozen=True)
class DiskShortfall:
    """Why a home cannot be made or grown: what the others are promised, how many they
    are, the share, and what this home needs."""

    promised: int  # to the other homes
    homes: int  # how many other homes
    share: int
    need: int  # this home's size

    def sentence(self) -> str:
        """'The homes' disk is fully reserved: 380 GiB of 400 GiB are promised to 19
        homes; this role's home needs 20 GiB.'"""
        homes = f"{self.homes} home{'' if self.homes == 1 else 's'}"
        return (f"The homes' disk is fully reserved: {format_human(self.promised)} of "
                f"{format_human(self.share)} {'is' if self.homes == 1 else 'are'} promised "
                f"to {homes}; this role's home needs {format_human(self.need)}.")


def disk_shortfall(capacity: DiskCapacity, promised: Mapping[str, int], name: str,
                   size: int) -> DiskShortfall | None:
    """None when home ``name`` may be made or brought to ``size`` bytes beside the homes
    ``promised`` (home name -> bytes, ``name``'s own included if it exists); else what
    is full. A home that keeps or lowers its promise always may."""
    if size <= promised.get(name, 0):
        return None
    others = {home: held for home, held in promised.items() if home != name and held > 0}
    total = sum(others.values())
    if total + size <= capacity.share:
        return None
    return DiskShortfall(total, len(others), capacity.share, size)
