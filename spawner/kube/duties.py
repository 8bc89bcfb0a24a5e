"""What the Kubernetes hub process keeps besides its spawners: its event log and the
GPU-hour budget duties, as the Docker hub's runtime does (spawner/docker/runtime.py).

JupyterHub makes a spawner per user server; these belong to the hub process: one
``KubeHub`` per usage ledger, made with the ledger by the first spawner that opens it
(``QuotaKubeSpawner.usage_ledger``: JupyterHub's poll of each running server as it
starts, a spawn form, a start) and kept with it. Without a ledger there is none: no
session is recorded, so no budget counts, and nothing else writes the log yet.

- The event log: the ledger's ``events`` table, which the watchdog pods read (and a
  file too when ``events_file`` names one, as on Docker: ``events.events_path``).
- ``BudgetDuties`` (spawner/usage/duties.py), every ``usage_check_interval`` seconds
  from the hub's start on: the notices go to the event log, what was told is
  remembered in the ledger's ``budget-memory`` row (``DatabaseDocuments``), so a
  restarted hub tells nothing twice, and the servers of a spent budget that says
  ``stop: true`` are stopped the hub's way (``stop_server``); the spawner's stop then
  closes the session with the reason the duty hinted, ``budget``.

Which pod is whose server: each spawner claims its pod when its start succeeds and at
every poll (JupyterHub polls each running server as it starts, so a restarted hub
knows them all before its first check).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from dataclasses import dataclass
from typing import Any

from spawner.policy.stopping import stop_through_hub
from spawner.quota.model import QuotaTable
from spawner.usage import event_store
from spawner.usage.documents import DatabaseDocuments
from spawner.usage.duties import BudgetDuties
from spawner.usage.event_log import EventLog, events_path
from spawner.usage.ledger import Ledger
from spawner.usage.table_versions import table_store

Log = logging.Logger | logging.LoggerAdapter
STOP_TIMEOUT = 60.0  # waited for a stop through the hub; it goes on after that


@dataclass(frozen=True)
class HubSettings:
    """The ``c.QuotaKubeSpawner`` settings the hub's duties use, as a spawner reads them."""

    hub_id: str
    usage_db: str  # the ledger's URL, resolved
    state_dir: str
    events_file: str
    usage_check_interval: float
    quota_source: str
    quota_file: str
    quota_table_name: str

    @classmethod
    def of(cls, spawner: Any, usage_db: str) -> HubSettings:
        return cls(hub_id=spawner.hub_id, usage_db=usage_db, state_dir=spawner.state_dir,
                   events_file=spawner.events_file,
                   usage_check_interval=spawner.usage_check_interval,
                   quota_source=spawner.quota_source, quota_file=spawner.quota_file,
                   quota_table_name=spawner.quota_table_name)


class KubeHub:
    """The event log and budget duties of one hub process (the module's docstring).
    Made in a thread: it reads what the budgets told from the ledger."""

    def __init__(self, settings: HubSettings, ledger: Ledger, log: Log):
        self.settings = settings
        self.hub_id = settings.hub_id
        self.log = log
        # the ledger's table; a file only when an admin names one
        self.events = EventLog(
            events_path(settings.state_dir or ".", settings.events_file, True), log,
            store=functools.partial(event_store.append_one, ledger.engine))
        self.memory = DatabaseDocuments(ledger.engine, self.hub_id)
        self.budgets = BudgetDuties(ledger, self.hub_id, self.events, self.table,
                                    self.memory, self.stop_server, log,
                                    settings.usage_check_interval)
        # pod name -> the spawner that runs it; weak: a stopped server's spawner goes
        self.servers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._unknown: set[str] = set()  # pods told of once as no server of this hub's
        self._starting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the budget checks once the hub has started (on the running loop)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
            self.log.info("Hub %s: event log %s; GPU-hour budgets checked every %gs",
                          self.hub_id, self.events.where, self.budgets.interval)

    async def _start(self) -> None:
        # JupyterHub polls the servers it had before it is started: all are claimed by
        # the first check
        await hub_started()
        self.budgets.start()

    def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        self.budgets.close()

    def claim(self, pod: str, spawner: Any) -> None:
        """``spawner`` runs ``pod``: a spent budget stops it through the hub."""
        self.servers[pod] = spawner
        self._unknown.discard(pod)

    async def table(self) -> QuotaTable:
        """The table as the spawners read it (no GPU capacity: the scheduler's)."""
        s = self.settings

        def read() -> QuotaTable:
            store = table_store(s.quota_source, s.quota_file, s.usage_db,
                                s.quota_table_name, self.log)
            return store.get(self.log, None)

        return await asyncio.to_thread(read)

    async def stop_server(self, pod: str, why: str) -> bool:
        """Stop the server in ``pod`` the way the hub stops any server
        (spawner/policy/stopping.py). False when no server of this hub runs it now, or the stop
        failed; the next check tries again."""
        spawner = self.servers.get(pod)
        if spawner is None or spawner.pod_name != pod:
            if pod not in self._unknown:  # said once: every check finds it again
                self._unknown.add(pod)
                self.log.warning("Could not stop pod %s (%s): no server of this hub runs "
                                 "it", pod, why)
            return False
        if spawner.pending or spawner.server is None:
            self.log.info("Not stopping %s (%s) now: its server is %s", pod, why,
                          spawner.pending or "not running")
            return False
        try:
            stopping = asyncio.ensure_future(stop_through_hub(spawner))
            # shielded: a slow stop goes on (pending "stop"), never cut off halfway
            await asyncio.wait_for(asyncio.shield(stopping), STOP_TIMEOUT)
        except TimeoutError:
            self.log.warning("Stopping %s (%s) takes more than %gs; it goes on", pod, why,
                             STOP_TIMEOUT)
            stopping.add_done_callback(functools.partial(self._stopped_late, pod))
            return False
        except Exception as e:
            self.log.error("Could not stop %s (%s) through the hub: %s", pod, why, e)
            return False
        return True

    def _stopped_late(self, pod: str, stopping: asyncio.Future[Any]) -> None:
        if not stopping.cancelled() and stopping.exception() is not None:
            self.log.error("Could not stop %s through the hub: %s", pod, stopping.exception())


async def hub_started() -> None:
    """Wait until JupyterHub has started, where one is starting in this process (else
    at once: a test, a tool)."""
    try:
        from jupyterhub.app import JupyterHub
    except ImportError:
        return
    if not JupyterHub.initialized():
        return
    started = getattr(JupyterHub.instance(), "_start_future", None)
    if isinstance(started, asyncio.Future) and \
            started.get_loop() is asyncio.get_running_loop():
        try:
            await asyncio.shield(started)
        except Exception:  # a hub that failed to start ends; nothing to do here
            return
