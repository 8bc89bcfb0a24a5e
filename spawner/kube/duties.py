"""The hub object on Kubernetes (spawner/policy/hub.py ``QuotaHub``), with what only this
backend has: the GPU-hour budget duties on their own timer, and their stop through the
hub.

JupyterHub makes a spawner per user server; this belongs to the hub process: one
``KubeHub`` per hub id and usage ledger, made and built, as every hub object is, by the
first spawner that asks (``QuotaKubeSpawner.quota_hub``: JupyterHub's poll of each
running server as it starts, a spawn form, a start). Its ledger, ledger writer, event
log and shared documents are the hub object's. Without a ledger there are no duties:
no session is recorded, so no budget counts, and nothing else writes the log yet.

- The event log: the ledger's ``events`` table, which the watchdog pods read (and a
  file too when ``events_file`` names one, as on Docker: ``events.events_path``).
- ``BudgetDuties`` (spawner/usage/duties.py), every ``usage_check_interval`` seconds
  from the hub's start on: the notices go to the event log, what was told is
  remembered in the ledger's ``budget-memory`` row (``DatabaseDocuments``), so a
  restarted hub tells nothing twice, and the servers of a spent budget that says
  ``stop: true`` are stopped the hub's way (``stop_server``); the spawner's stop then
  closes the session with the reason the duty hinted, ``budget``.

As it is built it logs what a home is here (``claims.homes_sentence``): a claim of
which storage class, sized by the role's disk, and what the storage class, not the hub,
decides about it.

Which pod is whose server: each spawner claims its pod when its start succeeds and at
every poll (JupyterHub polls each running server as it starts, so a restarted hub
knows them all before its first check).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from tornado import web

from spawner.kube.claims import homes_sentence
from spawner.policy.hub import HubSettings, Log, QuotaHub, hub_started
from spawner.policy.stopping import HubServer, stop_through_hub
from spawner.usage.duties import BudgetDuties
from spawner.usage.ledger import Ledger, default_url

STOP_TIMEOUT = 60.0  # waited for a stop through the hub; it goes on after that


@dataclass(frozen=True)
class KubeSettings(HubSettings):
    """The ``c.QuotaKubeSpawner`` settings the hub object is built from."""

    @property
    def ledger_url(self) -> str:
        # without a state folder, the environment's (QUOTA_SPAWNER_STATE_DIR), as
        # QuotaKubeSpawner has always opened its ledger
        return self.usage_db or default_url(self.state_dir)


class KubeHub(QuotaHub):
    """The hub object of a Kubernetes hub process, with its budget duties (the module's
    docstring)."""

    settings_class = KubeSettings
    ledger_lost = ("The usage ledger cannot be opened (%(error)s): sessions are not "
                   "recorded, budgets not enforced and approved role requests grant "
                   "nothing until the hub restarts with it fixed")

    def __init__(self, settings: HubSettings, log: Log):
        super().__init__(settings, log)
        self._unknown: set[str] = set()  # pods told of once as no server of this hub's
        self._starting: asyncio.Task[None] | None = None

    @property
    def budgets(self) -> BudgetDuties | None:
        """The budget duties, on their own timer; None without a ledger."""
        assert self.duties is None or isinstance(self.duties, BudgetDuties)
        return self.duties

    # --- building: the hub object's steps (spawner/policy/hub.py) ---------------------------

    async def _build_first(self, source: Any) -> None:
        """Nothing to build before the ledger (the cluster is KubeSpawner's); the log says
        what a home is here, as the Docker hub says its mechanism."""
        try:
            options = source.options  # the spawner's kube_options, checked
        except web.HTTPError:  # wrong: logged, and every start is refused until fixed
            return
        self.log.info("%s", homes_sentence(options))

    async def _build_parts(self, source: Any) -> None:
        """No parts of its own: the scheduler places the pods, with no GPU pool here."""

    def _make_duties(self, ledger: Ledger) -> BudgetDuties | None:
        try:
            return BudgetDuties(ledger, self.hub_id, self.events, self.table, self.documents,
                                self.stop_server, self.log,
                                self.settings.usage_check_interval)
        except Exception as e:  # the sessions are still recorded
            self.log.error("The hub's event log and GPU-hour budget duties cannot be "
                           "set up (%s: %s): running servers are not warned or stopped "
                           "for their budgets", type(e).__name__, e)
            return None

    async def _build_last(self, why: str) -> None:
        if self.budgets is not None:
            self.log.info("Hub %s: event log %s; GPU-hour budgets checked every %gs",
                          self.hub_id, self.events.where, self.budgets.interval)

    async def _ready(self) -> None:
        """Start the budget checks once the hub has started (JupyterHub polls the servers
        it had before it is started: all are claimed by the first check)."""
        if self.budgets is not None and self._starting is None:
            self._starting = asyncio.ensure_future(self._start(self.budgets))

    async def _start(self, budgets: BudgetDuties) -> None:
        if await hub_started():
            budgets.start()

    def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        super().close()

    # --- the servers of this hub ------------------------------------------------------------

    def claim(self, name: str, spawner: HubServer) -> None:
        """``spawner`` runs pod ``name``: a spent budget stops it through the hub."""
        super().claim(name, spawner)
        self._unknown.discard(name)

    async def stop_server(self, name: str, why: str) -> bool:
        """Stop the server in pod ``name`` the way the hub stops any server
        (spawner/policy/stopping.py). False when no server of this hub runs it now, or the
        stop failed; the next check tries again."""
        spawner = self.spawners.get(name)
        if spawner is None or getattr(spawner, "pod_name", name) != name:
            if name not in self._unknown:  # said once: every check finds it again
                self._unknown.add(name)
                self.log.warning("Could not stop pod %s (%s): no server of this hub runs "
                                 "it", name, why)
            return False
        if spawner.pending or spawner.server is None:
            self.log.info("Not stopping %s (%s) now: its server is %s", name, why,
                          spawner.pending or "not running")
            return False
        try:
            stopping = asyncio.ensure_future(stop_through_hub(spawner))
            # shielded: a slow stop goes on (pending "stop"), never cut off halfway
            await asyncio.wait_for(asyncio.shield(stopping), STOP_TIMEOUT)
        except TimeoutError:
            self.log.warning("Stopping %s (%s) takes more than %gs; it goes on", name, why,
                             STOP_TIMEOUT)
            stopping.add_done_callback(functools.partial(self._stopped_late, name))
            return False
        except Exception as e:
            self.log.error("Could not stop %s (%s) through the hub: %s", name, why, e)
            return False
        return True

    def _stopped_late(self, pod: str, stopping: asyncio.Future[Any]) -> None:
        if not stopping.cancelled() and stopping.exception() is not None:
            self.log.error("Could not stop %s through the hub: %s", pod, stopping.exception())
