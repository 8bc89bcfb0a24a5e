"""The class dashboard's scheduled pre-warms, run when nobody is there.

An instructor schedules a class's servers to start at a time (``POST
api/classes/<g>/prewarm`` with ``at``, classes.py); the schedules are in the ledger
(spawner/usage/schedules.py). The ``Prewarmer`` looks for due ones every
``QuotaWebApp.prewarm_interval`` seconds (QUOTA_SPAWNER_PREWARM_INTERVAL, 30) and starts
every stopped server of the class with the service's own token, whose role holds
``servers!group=G`` for the hub config's classes (spawner/hubconfig/rbac.py's
``class_service_scopes``); then it marks the schedule done (every member's server started
or running) or failed, with a line per member.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tornado.ioloop import PeriodicCallback

from spawner.common.hub_client import HubRefused
from spawner.usage import schedules
from spawner.webapp.hub_api import HubApi, members, summary
from spawner.webapp.reader import LedgerReader, NotReady

log = logging.getLogger("quota_spawner.usage")


class Prewarmer:
    """Runs the due pre-warm schedules with the service's own token, every ``interval``
    seconds once started (``start()``, on the service's IOLoop)."""

    def __init__(self, hub: HubApi, reader: LedgerReader, interval: float = 30.0):
        self.hub = hub
        self.reader = reader
        self.interval = interval
        self._busy = False
        self._callback: PeriodicCallback | None = None

    def start(self) -> None:
        self._callback = PeriodicCallback(self._tick, self.interval * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback:
            self._callback.stop()

    async def _tick(self) -> None:
        if self._busy:  # the last round is still starting servers
            return
        self._busy = True
        try:
            await self.run_due()
        except Exception:
            log.exception("Pre-warm: the due schedules could not be run")
        finally:
            self._busy = False

    async def run_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """Runs each due schedule and marks it done (every member's server started or
        running) or failed; returns them as they ended."""
        try:
            found = await self.reader.run(schedules.due, time.time() if now is None else now)
        except NotReady:
            return []
        ended = []
        for planned in found:
            state, result = await self.run_one(planned)
            if await self.reader.run(schedules.finish, planned["id"], state, result):
                log.info("Pre-warm %s of %s (%s, %s) %s:\n%s", planned["id"], planned["group"],
                         planned["role"], planned["image"], state, result)
            ended.append(await self.reader.run(schedules.get, planned["id"]))
        return ended

    async def run_one(self, planned: dict[str, Any]) -> tuple[str, str]:
        """One schedule's outcome: (DONE or FAILED, a line per member or why not)."""
        if not self.hub.url:
            return schedules.FAILED, "The service has no hub API (JUPYTERHUB_API_URL)."
        token = self.hub.service_token
        if not token:
            return schedules.FAILED, "The service has no hub token (JUPYTERHUB_API_TOKEN)."
        try:
            users = await self.hub.users(token)
        except HubRefused as e:
            return schedules.FAILED, (f"The hub refused to list the users (HTTP {e.status})"
                                      + (f": {e.message}" if e.message else "."))
        found = members(users, planned["group"])
        if not found:
            return schedules.FAILED, f"{planned['group']} has no members."
        results = await self.hub.start_servers(
            token, found, {"profile": planned["role"], "image": planned["image"]})
        ok = all(r["outcome"] in ("started", "starting", "skipped") for r in results)
        return (schedules.DONE if ok else schedules.FAILED), summary(results)
