"""One start's home of its role's size: admitted, made or brought to its size, or refused.

For a role with ``disk`` on a hub that enforces disk (the runtime's ``homes``,
spawner/homes), before anything else of the start is made:

1. admission (spawner/host/disk.py): making the home, or growing it, must fit in what
   the homes' filesystem may promise beside every other home's size; else the start is
   refused with 503 and a sentence that says what is full, and nothing is created;
2. ``prepare``: the home made, or brought to the role's size (a smaller size deletes
   nothing: the home stays over it, writes are refused, and the user is told here, on
   the progress page, and in the server's environment, HOME_OVER_SIZE);
3. the folder of its use file, ``<state dir>/home-use/<home name>/``, made, with a first
   ``home.json`` (the watchdog keeps it current).

The result is the container's ``HomeBind`` (docker/home_body.py). A role without disk,
or a hub that does not enforce disk, keeps the Docker volume: None. Every step that
touches the filesystem runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tornado import web

from spawner.contract import HOME_USE_NAME, HOME_USE_STATE, HOME_USE_VERSION, home_is_full
from spawner.docker.home_body import HomeBind
from spawner.docker.hub_homes import disk_capacity
from spawner.homes.base import Home, HomeStore
from spawner.homes.errors import HomeError
from spawner.host.disk import DiskShortfall, disk_shortfall
from spawner.policy import refusals
from spawner.policy.hub import Log
from spawner.quota.model import Role
from spawner.quota.units import format_human
from spawner.usage.documents import write_atomically

if TYPE_CHECKING:
    from spawner.docker.runtime import HubRuntime

FOLDER_MODE = 0o755  # root's; the container's user reads it through the read-only bind


class DiskFull(Exception):
    def __init__(self, shortfall: DiskShortfall):
        self.shortfall = shortfall
        super().__init__(shortfall.sentence())


def _changed(home: Home) -> str:
    """The progress page's words for what ``prepare`` did."""
    size = format_human(home.size)
    if home.change == "created":
        return f"Home made: {size}"
    if home.change in ("grown", "shrunk") and home.previous_limit is not None:
        return f"Home {home.change} from {format_human(home.previous_limit)} to {size}"
    if home.change == "limited":
        return f"Home limited to {size}"
    return f"Home: {size}"


class HomeStart:
    """The home of one start (the module's docstring lists the steps)."""

    def __init__(self, runtime: HubRuntime, user: str, log_name: str, log: Log,
                 progress: Callable[[str, int], None]):
        self.runtime, self.user, self.log_name, self.log = runtime, user, log_name, log
        self.progress = progress

    async def prepare(self, role: Role) -> HomeBind | None:
        """This start's home, or None for the Docker volume; refusals as HTTPError."""
        if role.disk is None:
            return None
        runtime = self.runtime
        homes = runtime.homes
        if homes is None:
            self.log.error("Refused %s: the role %s has disk, and the homes could not be "
                           "opened at the hub's start: %s", self.log_name, role.name,
                           runtime.homes_problem)
            raise web.HTTPError(503, refusals.HOMES_UNAVAILABLE)
        if not homes.enforced:
            return None
        try:
            home = await asyncio.to_thread(self._admit_and_prepare, homes, role.disk)
        except DiskFull as e:
            self.log.warning("Refused %s: %s (c.QuotaSpawner.disk_ratio, disk_reserve)",
                             self.log_name, e)
            raise web.HTTPError(503, refusals.homes_full(str(e))) from None
        except (HomeError, OSError) as e:
            self.log.error("The home of %s could not be made ready for role %s: %s",
                           self.log_name, role.name, e)
            raise web.HTTPError(500, refusals.HOME_FAILED) from None
        over = home.over_size_message()
        if home.change or over:
            self.log.info("Home of %s (%s): %s%s", self.log_name, home.name,
                          _changed(home), f". {over}" if over else "")
        self.progress(_changed(home), 20)
        if over:
            self.log.warning("%s", over)
            self.progress(over, 20)
        folder = await asyncio.to_thread(self._use_folder, homes, home)
        assert home.path is not None  # an enforcing store gives the folder to bind
        return HomeBind(path=str(home.path), size=home.size, use_folder=str(folder),
                        over_size=over)

    def _admit_and_prepare(self, homes: HomeStore, size: int) -> Home:
        """Admission, then the home made or sized (blocks). The decision holds the
        runtime's lock for one quota query; the homes being made meanwhile count as
        promised, so two starts never take the same room."""
        runtime = self.runtime
        name = homes.home_name(self.user)
        with runtime.disk_lock:
            promised = {**homes.promised(), **runtime.disk_pending}
            space = homes.space()
            if space is not None:
                settings = runtime.settings
                short = disk_shortfall(disk_capacity(space.size, settings.disk_reserve,
                                                     settings.disk_ratio), promised, name, size)
                if short is not None:
                    raise DiskFull(short)
            runtime.disk_pending[name] = max(size, promised.get(name, 0))
        try:
            return homes.prepare(self.user, size)
        finally:
            with runtime.disk_lock:
                runtime.disk_pending.pop(name, None)

    def _use_folder(self, homes: HomeStore, home: Home) -> str:
        """The home's use folder, ``<state dir>/home-use/<home name>/``, made readable by
        the container, with a first home.json, as the watchdog then writes it (blocks)."""
        folder = os.path.join(os.path.abspath(self.runtime.settings.folder), HOME_USE_STATE,
                              home.name)
        for path in (os.path.dirname(folder), folder):
            os.makedirs(path, FOLDER_MODE, exist_ok=True)
            os.chmod(path, FOLDER_MODE)  # whatever the umask made of it
        used = home.used if home.used is not None else 0
        facts = {"version": HOME_USE_VERSION, "used": used, "limit": home.limit,
                 "mechanism": homes.mechanism, "at": time.time(),
                 "full": home.limit is not None and home_is_full(used, home.limit)}
        write_atomically(os.path.join(folder, HOME_USE_NAME),
                         json.dumps(facts, sort_keys=True), mode=0o644)
        return folder
