"""Homes without a size: today's behaviour, and what a host without a usable quota gets.

Without a homes' root the backend keeps its own homes (Docker volumes), and ``prepare``
returns no path. With a root on a filesystem none of the mechanisms can limit, homes are
plain folders under it. Either way no limit is set and no use is read (reading it would
mean walking every file, which is what this product does not do), and ``describe`` says
why, in the sentence the hub logs at its start.
"""

from __future__ import annotations

import os
from pathlib import Path

from spawner.homes.base import DOCS, HOME_MODE, Home, HomeStore, HomeUse, Space


class UnenforcedHomes(HomeStore):
    mechanism = "none"
    enforced = False

    def __init__(self, root: str | Path | None, *, reason: str, **kwargs):
        if root is None:
            super().__init__("/", **kwargs)
            self.root = None  # type: ignore[assignment]
        else:
            super().__init__(root, **kwargs)
        self.reason = reason

    def describe(self) -> str:
        return f"Disk is not enforced: {self.reason}; see {DOCS}"

    def check(self) -> None:
        if self.root is not None:
            super().check()

    def home_path(self, user: str) -> Path | None:
        return None if self.root is None else super().home_path(user)

    def _prepare(self, user: str, name: str, size: int) -> Home:
        if self.root is None:
            return Home(user=user, name=name, path=None, size=size, limit=None, used=None)
        path = self.root / name
        change = ""
        if self._existing(path) is None:
            os.mkdir(path, HOME_MODE)
            self._own(path)
            change = "created"
        return Home(user=user, name=name, path=path, size=size, limit=None, used=None,
                    change=change)

    def usage(self) -> dict[str, HomeUse]:
        return {}

    def space(self) -> Space | None:
        return None if self.root is None else super().space()
