"""The hub's periodic work on the ledger, on a timer of its own.

- A session whose container vanished while no hub watched (the hub crashed,
  the machine rebooted) is closed as ``lost`` at its last sample: seen
  missing twice, a minute apart, so a start or stop under way is never taken
  for one.
- Sessions older than the retention are deleted, once a day.
- GPU-hour budgets are checked (budgets.py), when the table has any: the
  notices go to the event log (the watchdog tells the people), and a server
  whose budget is spent is stopped when the budget says ``stop: true``.

How a session ended is read from the engine through the client the hub's
runtime passes in (``record_end``, ``container_end``); nothing here imports the
Docker SDK.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from spawner.contract import HUB_LABEL
from spawner.quota.model import QuotaTable
from spawner.usage.budgets import BudgetWatch, running_gpu_sessions
from spawner.usage.ledger import BUDGET, Ledger, ended

INTERVAL = 60.0
PRUNE_EVERY = 24 * 3600.0


class UsageDuties:
    """``hub``: the hub's runtime (spawner/docker/runtime.py: its ``hub_id``, engine
    client ``docker_client``, ``events``, ``starting`` servers and ``stop_server``);
    ``table``: the quota table as it is now (awaited; raises when broken)."""

    def __init__(self, ledger: Ledger, hub: Any, retention_days: float,
                 log: logging.Logger | logging.LoggerAdapter,
                 table: Callable[[], Awaitable[QuotaTable]] | None = None,
                 budget_memory: str | None = None, interval: float = INTERVAL):
        self.ledger = ledger
        self.hub = hub
        self.hub_id = hub.hub_id
        self.retention_days = retention_days
        self.log = log
        self.table = table
        self.interval = interval
        self.watch = BudgetWatch(budget_memory, log)
        self._missing: set[str] = set()
        self._pruned = 0.0
        self._stopping: set[str] = set()  # servers stopped for their budget, not yet gone
        self._stops: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick(time.time())
            except Exception:
                self.log.exception("Usage ledger: the periodic check failed")
            await asyncio.sleep(self.interval)

    async def tick(self, now: float) -> None:
        await asyncio.to_thread(self.close_lost)
        if self.retention_days > 0 and now - self._pruned >= PRUNE_EVERY:
            gone = await asyncio.to_thread(self.ledger.prune,
                                           now - self.retention_days * 86400)
            self._pruned = now
            if gone:
                self.log.info("Usage ledger: %d sessions older than %g days deleted", gone,
                              self.retention_days)
        if self.table is not None:
            await self.check_budgets(now)

    async def check_budgets(self, now: float) -> None:
        """Tell of budgets passing their warn_at or spent; stop the servers of spent
        budgets that say ``stop: true``."""
        try:
            table = await self.table()
        except Exception:
            return  # a broken table is logged where it is read; the last check stands
        if not table.budgets:
            return
        engine = self.ledger.engine

        def check() -> Any:  # budgets count every hub's sessions; this hub stops its own
            running = running_gpu_sessions(engine, hub=self.hub_id)
            return self.watch.check(engine, table, running, now)

        found = await asyncio.to_thread(check)
        for notice in found.notices:
            self.hub.events.append(notice.event, **notice.fields())
            self.log.info("GPU-hour budget: %s", notice.text)
        for stop in found.stops:
            name = stop.session.container
            if name in self._stopping:
                continue
            self._stopping.add(name)
            self.log.warning("Stopping %s: %s", name, stop.text)
            await asyncio.to_thread(self.ledger.hint, self.hub_id, name, BUDGET)
            task = asyncio.ensure_future(self._stop(name))
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)

    async def _stop(self, name: str) -> None:
        try:
            await self.hub.stop_server(name, "its GPU-hour budget is spent")
            await asyncio.to_thread(record_end, self.ledger, self.hub.docker_client,
                                    self.hub_id, name, None, self.log)
        except Exception:
            self.log.exception("Could not stop %s for its spent GPU-hour budget", name)
        finally:
            self._stopping.discard(name)

    def close_lost(self) -> list[str]:
        """Close the open sessions whose container was missing at this check and the
        last (blocking: the engine and the ledger)."""
        open_ = self.ledger.open_containers(self.hub_id)
        if not open_:
            self._missing = set()
            return []
        present = {name.lstrip("/") for c in self.hub.docker_client.containers(
            all=True, filters={"label": f"{HUB_LABEL}={self.hub_id}"})
            for name in c.get("Names") or []}
        missing = {name for name in open_
                   if name not in present and name not in self.hub.starting}
        lost = sorted(missing & self._missing)
        self._missing = missing - set(lost)
        for name in lost:
            reason = record_end(self.ledger, self.hub.docker_client, self.hub_id, name,
                                log=self.log)
            self.log.warning("Usage ledger: the session of %s closed (%s): its container is "
                             "gone and no hub server stopped it", name, reason)
        return lost


def record_end(ledger: Ledger, docker: Any, hub: str, container: str,
               inspected: dict[str, Any] | None = None,
               log: logging.Logger | logging.LoggerAdapter | None = None) -> str | None:
    """Close ``container``'s open session with why it ended (blocking): from
    ``inspected`` (the container as the engine shows it), else from the engine's record
    of its end. Returns the reason; None when it had no open session."""
    if inspected is None:
        session = ledger.open_session(hub, container)
        if session is None:
            return None
        end = None
        if session["container_id"]:
            try:
                end = container_end(docker, session["container_id"],
                                    session["started"] or session["requested"])
            except Exception as e:  # the end is then unknown: closed as lost
                (log or logging.getLogger(__name__)).warning(
                    "Could not read how %s ended from the engine: %s", container, e)
        reason, detail, when = ended(None, end)
    else:
        reason, detail, when = ended(inspected)
    ledger.close(hub, container, reason, detail, when)
    return reason


def container_end(client: Any, container_id: str, since: float) -> dict[str, Any] | None:
    """How a container that is gone ended, from the engine's event history (blocking):
    {"oom": killed for memory, "exit_code", "finished": epoch seconds}; None when the
    engine has no record of its end (it was restarted since, say).

    The engine removes our containers when they exit (AutoRemove), so their state,
    OOMKilled included, is gone by the time the hub polls; its events stay.
    """
    end: dict[str, Any] | None = None
    oom = False
    for event in client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                               filters={"type": "container", "container": container_id}):
        action = event.get("Action") or event.get("status")
        if action == "oom":
            oom = True
        elif action == "die":
            attributes = (event.get("Actor") or {}).get("Attributes") or {}
            code = attributes.get("exitCode")
            end = {"exit_code": int(code) if str(code).lstrip("-").isdigit() else None,
                   "finished": (event.get("timeNano") or 0) / 1e9 or event.get("time")}
    if end is not None:
        end["oom"] = oom
    return end
