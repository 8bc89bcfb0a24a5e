"""The hub's periodic work on the ledger, on a timer of its own.

- A session whose container vanished while no hub watched (the hub crashed,
  the machine rebooted) is closed as ``lost`` at its last sample: seen
  missing twice, a minute apart, so a start or stop under way is never taken
  for one.
- Sessions older than the retention are deleted, once a day.
- GPU-hour budgets are checked (budgets.py), when the table has any: the
  notices go to the event log (the watchdog tells the people), and a server
  whose budget is spent is stopped when the budget says ``stop: true``.

The budgets are ``BudgetDuties``, which needs no engine: the Docker hub's
``UsageDuties`` checks them at each of its ticks, and the Kubernetes hub runs
them on their own timer (spawner/kube/duties.py). The rest is the Docker hub's:
how a session ended is read from the engine through the client the hub's
runtime passes in (``record_end``, ``container_end``); nothing here imports the
Docker SDK.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from spawner.common.outages import OutageLog
from spawner.contract import HUB_LABEL
from spawner.quota.model import QuotaTable
from spawner.usage import event_store
from spawner.usage.budgets import BudgetWatch, running_gpu_sessions
from spawner.usage.documents import Documents
from spawner.usage.events import HubEvent
from spawner.usage.ledger import BUDGET, Ledger, ended

INTERVAL = 60.0
PRUNE_EVERY = 24 * 3600.0
Log = logging.Logger | logging.LoggerAdapter
SPENT_WHY = "its GPU-hour budget is spent"  # for the stop's log line


class EventSink(Protocol):
    """Where the notices go: the hub's event log (spawner/usage/event_log.py ``EventLog``)."""

    def append(self, event: HubEvent) -> Any: ...


class Periodic(ABC):
    """A duty that ``start`` runs every ``interval`` seconds on the running loop
    (``run``); a run that fails is logged once, until one works again."""

    what = "the periodic check"  # in the log
    interval: float
    log: Log
    _task: asyncio.Task[None] | None = None
    _outage: OutageLog | None = None  # made at the first run: a failing run is told once

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @abstractmethod
    async def run(self, now: float) -> None:
        """One round of the duty at ``now`` (epoch seconds); raises when it failed."""

    async def _loop(self) -> None:
        outage = self._outage = OutageLog(logging.ERROR)
        while True:
            try:
                await self.run(time.time())
            except Exception as e:  # the ledger is down, say: the next run tries again
                outage.failed(self.log, e, "%s failed (%s: %s); trying again every %gs",
                             self.what, type(e).__name__, e, self.interval)
            else:
                outage.works(self.log, "%s works again", self.what)
            await asyncio.sleep(self.interval)


class BudgetDuties(Periodic):
    """The GPU-hour budgets of one hub's running servers, on any backend: tells of
    budgets passing their warn_at or spent (``events``), and stops the servers of spent
    budgets that say ``stop: true`` through ``stop(container, why)``, after hinting the
    reason ``budget`` to the ledger. ``table``: the quota table as it is now (awaited;
    raises when broken); ``memory``: where what was told is kept (``BudgetWatch``).

    Making one reads ``memory`` (blocking). ``start`` runs ``check`` every ``interval``
    seconds on the running loop; the Docker hub calls ``check`` from its own duties."""

    what = "GPU-hour budgets: the check"

    def __init__(self, ledger: Ledger, hub_id: str, events: EventSink,
                 table: Callable[[], Awaitable[QuotaTable]] | None,
                 memory: Documents | None, stop: Callable[[str, str], Awaitable[Any]],
                 log: Log, interval: float = INTERVAL):
        self.ledger = ledger
        self.hub_id = hub_id
        self.events = events
        self.table = table
        self.stop = stop
        self.log = log
        self.interval = interval
        self.watch = BudgetWatch(memory, log)
        self._stopping: set[str] = set()  # servers stopped for their budget, not yet gone
        self._stops: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references

    async def run(self, now: float) -> None:
        await self.check(now)

    async def check(self, now: float) -> None:
        """Tell of budgets passing their warn_at or spent; stop the servers of spent
        budgets that say ``stop: true``. Raises when the ledger cannot be read."""
        if self.table is None:
            return
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
            self.events.append(notice.payload())
            self.log.info("GPU-hour budget: %s", notice.text)
        for stop in found.stops:
            name = stop.session.container
            if name in self._stopping:
                continue
            self._stopping.add(name)
            self.log.warning("Stopping %s: %s", name, stop.text)
            try:  # the stop records this reason; without it, a plain stop
                await asyncio.to_thread(self.ledger.hint, self.hub_id, name, BUDGET)
            except Exception as e:
                self.log.error("Usage ledger: could not record why %s is stopped: %s", name, e)
            task = asyncio.ensure_future(self._stop(name))
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)

    async def _stop(self, name: str) -> None:
        try:
            await self.stop(name, SPENT_WHY)
        except Exception:
            self.log.exception("Could not stop %s for its spent GPU-hour budget", name)
        finally:
            self._stopping.discard(name)


class UsageDuties(Periodic):
    """``hub``: the hub's runtime (spawner/docker/runtime.py: its ``hub_id``, engine
    client ``docker_client``, ``events``, ``starting`` servers and ``stop_server``);
    ``table``: the quota table as it is now (awaited; raises when broken)."""

    what = "Usage ledger: the periodic check"

    def __init__(self, ledger: Ledger, hub: Any, retention_days: float,
                 log: Log, table: Callable[[], Awaitable[QuotaTable]] | None = None,
                 budget_memory: Documents | None = None, interval: float = INTERVAL):
        self.ledger = ledger
        self.hub = hub
        self.hub_id = hub.hub_id
        self.retention_days = retention_days
        self.log = log
        self.table = table
        self.interval = interval
        self.budgets = BudgetDuties(ledger, self.hub_id, hub.events, table, budget_memory,
                                    self._stop_for_budget, log, interval)
        self.watch = self.budgets.watch
        self._missing: set[str] = set()
        self._pruned = 0.0

    async def run(self, now: float) -> None:
        await self.tick(now)

    async def tick(self, now: float) -> None:
        await asyncio.to_thread(self.close_lost)
        if self.retention_days > 0 and now - self._pruned >= PRUNE_EVERY:
            cut = now - self.retention_days * 86400
            gone = await asyncio.to_thread(self.ledger.prune, cut)
            events = await asyncio.to_thread(event_store.prune, self.ledger.engine, cut)
            self._pruned = now
            if gone:
                self.log.info("Usage ledger: %d sessions older than %g days deleted", gone,
                              self.retention_days)
            if events:
                self.log.info("Usage ledger: %d events older than %g days deleted", events,
                              self.retention_days)
        if self.table is not None:
            await self.check_budgets(now)

    async def check_budgets(self, now: float) -> None:
        """``BudgetDuties.check``: its stops go the hub's way, then the session is closed
        from the engine's record."""
        await self.budgets.check(now)

    async def _stop_for_budget(self, name: str, why: str) -> None:
        await self.hub.stop_server(name, why)
        await asyncio.to_thread(record_end, self.ledger, self.hub.docker_client,
                                self.hub_id, name, None, self.log)

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
