"""The users' homes on this host, as the watchdog reads and publishes them each cycle
(docs/disk.md): what each home holds against its size, for the rules, the gauges, the
containers and the pages.

- ``HomeWatch`` opens the ``HomeStore`` under the homes' root (spawner/homes) once, at the
  first cycle that can (a failure is said once and tried again each cycle), and each
  cycle asks it for every home's use in one quota query (``usage()``) and for the
  filesystem's size and free room (``space()``): a ``DiskReading`` (model.py). A server's
  home is named from its user as the hub names it (``home_of``).
- ``HomeUseFiles`` writes what a container sees of its own home: ``home.json`` in
  ``<state dir>/home-use/<home name>/`` (the contract's ``HOME_USE_*``), which the hub
  bind-mounts read-only into the container, since btrfs's statfs does not show a qgroup's
  limit. Atomically, when it changed and at least every ``REFRESH`` seconds, only into
  the folders the hub made, and nothing else there.
- ``disk_document``: this node's ``homes`` document (``DiskUsage``, usage/documents.py),
  for the host map and the class dashboard.

Blocking (commands, statvfs, files): the watchdog calls these in threads.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from spawner.common.outages import OutageLog
from spawner.contract import HOME_USE_NAME, HOME_USE_VERSION, home_is_full
from spawner.homes.base import HomeStore
from spawner.homes.detect import open_homes
from spawner.homes.errors import HomeError, HomesUnavailable
from spawner.usage.documents import DiskUsage, Filesystem, HomeReading, write_atomically
from spawner.watchdog.model import DiskReading, Snapshot, home_size, homes_of

Log = logging.Logger | logging.LoggerAdapter
REFRESH = 60.0  # a home.json that says the same is written again after this many seconds


class HomeWatch:
    """The homes under ``root``, kept by ``mechanism`` (spawner.homes.detect's CHOICES)."""

    def __init__(self, root: str, mechanism: str, log: Log):
        self.root, self.mechanism, self.log = root, mechanism, log
        self.store: HomeStore | None = None
        self._opening = OutageLog()  # the store cannot be opened
        self._reading = OutageLog()  # the homes' use cannot be read

    def open(self) -> HomeStore | None:
        """The store, opened at the first call that can; None while it cannot be (said
        once, until it can)."""
        if self.store is None:
            try:
                self.store = open_homes(self.root, self.mechanism)
            except (HomeError, HomesUnavailable, OSError, ValueError) as error:
                self._opening.failed(self.log, error, "Cannot open the homes under %s (%s); "
                                     "trying again each cycle", self.root, error)
                return None
            self._opening.works(self.log, "The homes under %s can be opened again", self.root)
            self.log.info("Homes: %s", self.store.describe())
        return self.store

    def read(self) -> DiskReading:
        """This cycle's homes: every home's use (one query) and the filesystem's room."""
        store = self.open()
        if store is None:
            return DiskReading(self.mechanism, None, error=self._opening.error,
                               sentence=f"The homes under {self.root} cannot be opened "
                                        f"({self._opening.error}); the watchdog tries again "
                                        "each cycle.")
        sentence = store.describe()
        try:
            homes = store.usage() if store.enforced else {}
            space = store.space()
        except (HomeError, OSError) as error:
            self._reading.failed(self.log, error, "Cannot read the homes' use under %s (%s); "
                                 "trying again each cycle", self.root, error)
            return DiskReading(store.mechanism, store.enforced, sentence, error=str(error),
                               space=None)
        self._reading.works(self.log, "The homes' use under %s can be read again", self.root)
        return DiskReading(store.mechanism, store.enforced, sentence, homes, space)

    def home_of(self, user: str) -> str | None:
        """The name of ``user``'s home, as the hub names it; None before the store opens,
        or for a name no home can have."""
        if self.store is None:
            return None
        try:
            return self.store.home_name(user)
        except HomeError:
            return None


class HomeUseFiles:
    """``home.json`` of each running server's home, in ``folder`` (``<state dir>/home-use``):
    ``{"version", "used", "limit", "at", "mechanism", "full"}``, bytes and epoch seconds."""

    def __init__(self, folder: str | os.PathLike[str], log: Log, refresh: float = REFRESH):
        self.folder, self.log, self.refresh = Path(folder), log, refresh
        self._written: dict[str, tuple[str, float]] = {}  # home -> (what it said, when)
        self._missing: set[str] = set()  # homes whose folder the hub has not made, as told

    def write(self, snapshot: Snapshot) -> list[str]:
        """Write the files that changed or are due; the homes written. Raises OSError."""
        disk = snapshot.disk
        if disk is None or not disk.enforced or disk.homes is None:
            return []
        written, kept, missing = [], {}, set()
        for home, server in homes_of(snapshot).items():
            use = disk.homes.get(home)
            size = home_size(server, use)
            if use is None or not size:
                continue  # a home without a size: nothing to show against
            facts = {"version": HOME_USE_VERSION, "used": use.used, "limit": size,
                     "mechanism": disk.mechanism, "full": home_is_full(use.used, size)}
            said = json.dumps(facts, sort_keys=True)
            last = self._written.get(home)
            if last is not None and last[0] == said and snapshot.time - last[1] < self.refresh:
                kept[home] = last
                continue
            folder = self.folder / home
            if not folder.is_dir():  # the hub makes it when it mounts the home: not here
                missing.add(home)
                if home not in self._missing:
                    self.log.info("No folder %s for the use of %s's home: the hub makes it "
                                  "when it mounts the home into the server; nothing written",
                                  folder, server.user)
                continue
            write_atomically(folder / HOME_USE_NAME,
                             json.dumps({**facts, "at": snapshot.time}, sort_keys=True),
                             mode=0o644)  # read by the notebook's user
            kept[home] = (said, snapshot.time)
            written.append(home)
        self._written, self._missing = kept, missing
        return written


def disk_document(snapshot: Snapshot, interval: float, node: str) -> DiskUsage | None:
    """This node's ``homes`` document from the cycle's reading; None without one. Every
    home the query found, each with the user of a running server that uses it (None
    where none runs here) and its size as the rules judge it."""
    disk = snapshot.disk
    if disk is None:
        return None
    users = homes_of(snapshot)
    homes = []
    for home, use in sorted((disk.homes or {}).items()):
        server = users.get(home)
        homes.append(HomeReading(
            home, use.used, home_size(server, use) if server is not None else use.limit,
            server.user if server is not None else None))
    space = disk.space
    filesystem = None if space is None else Filesystem(
        str(space.path), space.size, space.used, space.free,
        disk.reserved if disk.enforced else None)
    sentence = disk.sentence
    if disk.homes is None and disk.error and disk.enforced is not None:
        sentence += f"; their use cannot be read now ({disk.error})"
    return DiskUsage(node=node, at=snapshot.time, interval=interval,
                     mechanism=disk.mechanism, enforced=bool(disk.enforced),
                     sentence=sentence, filesystem=filesystem, homes=tuple(homes))
