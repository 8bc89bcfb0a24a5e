"""The hub object: what one hub process holds for its quota spawners, on any backend.

JupyterHub makes a spawner per user server; what belongs to the hub process is one
``QuotaHub`` per key (``HUBS``, a spawner/common/registry.py ``Registry``; in practice
one). It is made cheaply, without waiting, by whoever asks first (the hub as it starts,
or a spawner: ``QuotaHub.of``), and built once (again after a failure), the same way
on Docker and on Kubernetes, in this order:

1. what the backend reads first (Docker: the engine's client and ``docker info``, and
   the GPU inventory);
2. the usage ledger, created or upgraded in a thread before any part below writes to
   it, and its writer (``LedgerWriter``; without a ledger, no session is recorded and
   no budget enforced);
3. the event log (the ledger's ``events`` table; a file without a ledger, or when
   ``events_file`` names one) and the documents the processes share
   (``shared_documents``: the ledger's rows, else the state folder's files);
4. the backend's own parts (Docker: the GPU pool, the host's capacity, the notebooks'
   parent cgroup, the reconciler and the evictor);
5. the duties on the ledger, made in a thread (they read what the budgets told):
   Docker's ``UsageDuties`` (lost sessions, retention, budgets), Kubernetes'
   ``BudgetDuties`` on their own timer (spawner/usage/duties.py);
6. the backend's last step (Docker: the NVIDIA runtime probe) and the log line that
   says what was built.

``ready`` then starts what runs (Docker: the first sync with the running containers,
and the duties; Kubernetes: the budget duties, once the hub has started). Each
spawner reaches its hub through ``quota_hub`` (spawner/policy/choices.py) and claims
its server in it, so that ``stop_server`` stops that server the hub's way
(spawner/policy/stopping.py) for preemption and spent budgets. ``build_at_hub_start``,
which hub_config/jupyterhub_config.py calls, builds the hub of the configured spawner
as the hub starts; ``hub_started`` is the one place that reads JupyterHub's private
``_start_future`` (docs/architecture.md, what we rely on in our dependencies).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from sqlalchemy.engine import make_url

from spawner.common.registry import Registry
from spawner.policy.stopping import HubServer
from spawner.quota.model import GpuCapacity, QuotaTable
from spawner.quota.store import QuotaStore
from spawner.usage import event_store
from spawner.usage.documents import DatabaseDocuments, Documents, FolderDocuments
from spawner.usage.duties import Periodic
from spawner.usage.event_log import EventLog, events_path
from spawner.usage.ledger import Ledger, LedgerWriter, default_url
from spawner.usage.table_versions import table_store

Log = logging.Logger | logging.LoggerAdapter


@dataclass(frozen=True)
class HubSettings:
    """The settings every quota spawner has (``QuotaConfig``, spawner/policy/config.py)
    that its hub is built from, as a spawner reads them; a backend adds its own."""

    hub_id: str
    quota_file: str
    quota_source: str  # "file", or "database": the ledger's newest version of the table
    quota_table_name: str
    state_dir: str
    usage_db: str
    events_file: str
    usage_check_interval: float

    @classmethod
    def of(cls, spawner: object) -> Self:
        return cls(**{f.name: getattr(spawner, f.name) for f in fields(cls)})

    @property
    def key(self) -> str:
        """One hub per hub id and ledger."""
        return json.dumps([self.hub_id, self.ledger_url])

    @property
    def ledger_url(self) -> str:
        """The usage ledger's URL, resolved; "none": no ledger."""
        return self.usage_db or default_url(self.folder)

    @property
    def folder(self) -> str:
        """The hub's state folder."""
        return self.state_dir or "."

    def path(self, name: str) -> str:
        """A file of the hub's in its state folder."""
        return os.path.join(self.folder, name)


class QuotaHub(ABC):
    """What the quota spawners of one hub process share (the module's docstring lists
    the parts and their order). The parts exist once ``built`` has returned; a backend
    adds its own in the build's steps (``_build_first``, ``_build_parts``,
    ``_make_duties``, ``_build_last``) and in ``_ready``."""

    settings_class: ClassVar[type[HubSettings]] = HubSettings
    # logged when the ledger cannot be opened, with %(url)s and %(error)s
    ledger_lost: ClassVar[str] = (
        "The usage ledger %(url)s cannot be opened (%(error)s): sessions are not recorded "
        "and budgets not enforced until the hub restarts with it fixed")
    # logged when the hub built at hub start cannot get ready, with the error
    ready_failed: ClassVar[str] = "The hub could not get ready: %s"

    events: EventLog
    documents: Documents  # what the processes share: the ledger's rows, or files

    def __init__(self, settings: HubSettings, log: Log):
        self.settings = settings
        self.hub_id = settings.hub_id
        self.log = log
        # server (container or pod) name -> its spawner, claimed by the spawner; weak:
        # a stopped server's spawner goes
        self.spawners: weakref.WeakValueDictionary[str, HubServer] = \
            weakref.WeakValueDictionary()
        self.ledger: Ledger | None = None
        self.usage: LedgerWriter | None = None  # the ledger's writer; None without one
        self.duties: Periodic | None = None  # on the ledger's timer; None without one
        self._building: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, spawner: Any) -> Self:
        """The hub for ``spawner``'s settings, made the first time and not built yet:
        cheap and synchronous."""
        settings = cls.settings_class.of(spawner)
        found = HUBS.get((cls.__name__, settings.key),
                         lambda: cls(settings, spawner.log))
        assert isinstance(found, cls)
        return found

    # --- building -------------------------------------------------------------------------

    async def built(self, source: Any, why: str = "") -> Self:
        """Built once, from ``source`` (a spawner: Docker takes its engine client); a build
        that failed is tried again by the next caller. ``why``: for the log line."""
        task = self._building
        if task is None or (task.done() and (task.cancelled() or task.exception())):
            task = self._building = asyncio.ensure_future(self._build(source, why))
        await asyncio.shield(task)  # one caller giving up does not stop the build
        return self

    async def ready(self, source: Any, why: str = "") -> Self:
        """Built, and what runs started: awaited before any spawn, form or poll is
        served."""
        await self.built(source, why)
        await self._ready()
        return self

    @property
    def is_built(self) -> bool:
        task = self._building
        return task is not None and task.done() and not task.cancelled() and \
            task.exception() is None

    async def _build(self, source: Any, why: str) -> None:
        settings, log = self.settings, self.log
        await self._build_first(source)
        ledger = self.ledger = await self._open_ledger()
        self.usage = LedgerWriter(ledger, log) if ledger is not None else None
        # with a ledger, its table only; without one (none, or one that could not be
        # opened) the state folder's file, so no event is lost
        self.events = EventLog(
            events_path(settings.folder, settings.events_file, ledger is not None), log,
            store=(functools.partial(event_store.append_one, ledger.engine)
                   if ledger is not None else None))
        self.documents = shared_documents(ledger, self.hub_id, settings.folder)
        await self._build_parts(source)
        self.duties = None if ledger is None else await asyncio.to_thread(
            self._make_duties, ledger)
        await self._build_last(why)

    # each backend's part of the build, and of ``ready``

    @abstractmethod
    async def _build_first(self, source: Any) -> None:
        """The backend's parts that come before the ledger (``source``: the spawner)."""

    @abstractmethod
    async def _build_parts(self, source: Any) -> None:
        """The backend's parts that use the ledger's writer, the event log and the
        documents."""

    @abstractmethod
    def _make_duties(self, ledger: Ledger) -> Periodic | None:
        """The backend's duties on the ledger (in a thread: they read it as they start)."""

    @abstractmethod
    async def _build_last(self, why: str) -> None:
        """The backend's last step, and its log line of what was built."""

    @abstractmethod
    async def _ready(self) -> None:
        """Start what runs, once the hub is built (called by every ``ready``)."""

    async def _open_ledger(self) -> Ledger | None:
        """The usage ledger, created or upgraded now; None without one, or (logged) when
        it cannot be opened."""
        url = self.settings.ledger_url
        if url == "none":
            return None
        try:
            return await asyncio.to_thread(Ledger, url, self.log)
        except Exception as e:
            self.log.error(self.ledger_lost, {
                "url": make_url(url).render_as_string(hide_password=True), "error": e})
            return None

    # --- the table --------------------------------------------------------------------------

    @property
    def capacity(self) -> GpuCapacity | None:
        """The GPUs the table's roles are checked against; None: not checked (a cluster's
        GPUs are the scheduler's)."""
        return None

    def table_store(self) -> QuotaStore:
        """The store of the table this hub reads: the file, or the ledger's newest version
        (quota_source); the same as its spawners' (RoleChoicesMixin.table_store)."""
        s = self.settings
        return table_store(s.quota_source, s.quota_file, s.ledger_url, s.quota_table_name,
                           self.log)

    async def table(self) -> QuotaTable:
        """The quota table as it is now, checked against ``capacity`` (raises
        QuotaTableError when there never was a good one)."""
        capacity = self.capacity
        return await asyncio.to_thread(lambda: self.table_store().get(self.log, capacity))

    # --- the servers of this hub ------------------------------------------------------------

    def claim(self, name: str, spawner: HubServer) -> None:
        """``spawner`` runs the server in ``name`` (its container or pod): stopped through
        it when preempted or over its budget."""
        self.spawners[name] = spawner

    @abstractmethod
    async def stop_server(self, name: str, why: str) -> bool:
        """Stop the server in ``name`` the way the hub stops any (spawner/policy/stopping.py):
        for preemption and spent budgets. False when it was not stopped; the next check
        tries again."""

    def close(self) -> None:
        """Stop the timers and background tasks (a test's end; a hub's end stops them
        with its event loop)."""
        if self.duties is not None:
            self.duties.close()


HUBS: Registry[tuple[str, str], QuotaHub] = Registry()  # the hub process's, by class and key


def shared_documents(ledger: Ledger | None, hub_id: str, state_dir: str) -> Documents:
    """Where the hub keeps the documents other processes read (spawner/usage/documents.py):
    its ledger's database, reading the state folder's files of before the upgrade once; the
    folder alone without a ledger."""
    folder = FolderDocuments(state_dir)
    return folder if ledger is None else DatabaseDocuments(ledger.engine, hub_id,
                                                           fallback=folder)


# --- at hub start -------------------------------------------------------------------------


async def hub_started(app: Any = None) -> bool:
    """Wait until JupyterHub (``app``, else the one starting in this process) has started:
    by then each running server's spawner has claimed its container or pod. At once
    where no hub starts (a test, a tool); False when the hub's start failed.

    The only use of JupyterHub's private ``_start_future``: it has no public sign that
    its start has finished (tests/unit/test_dependency_names.py guards it)."""
    if app is None:
        try:
            from jupyterhub.app import JupyterHub
        except ImportError:
            return True
        if not JupyterHub.initialized():
            return True
        app = JupyterHub.instance()
    started = getattr(app, "_start_future", None)
    if isinstance(started, asyncio.Future) and \
            started.get_loop() is asyncio.get_running_loop():
        try:
            await asyncio.shield(started)
        except Exception:  # a hub that failed to start ends; nothing to do here
            return False
    return True


_at_start: set[asyncio.Task[None]] = set()  # held: the event loop keeps weak references


def build_at_hub_start(log: Log) -> None:
    """Build the hub object as the hub starts (hub_config/jupyterhub_config.py calls this
    while JupyterHub loads it, on the hub's running event loop), so the hub's log says at
    once what it has: on Docker, which GPUs and whether the engine can give them.

    The build is scheduled, never awaited: the hub's start never waits for it, and a
    failure is logged (the first spawn then tries again). It reads the settings from a
    spawner of the configured class, made with the hub's config and cookie secret, so it
    builds the very hub object the spawners use. Outside a starting hub (no running
    loop: a test reading the config) it does nothing."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(_build_at_hub_start(log))
    _at_start.add(task)
    task.add_done_callback(_at_start.discard)


class _HubUser:
    """The user of a spawner made only to read the hub's settings: the hub id's default
    comes from the cookie secret in the user's settings (KubeSpawner names its pod from
    the name and id as it is made)."""

    name = ""
    id = 0

    def __init__(self, cookie_secret: bytes):
        self.settings = {"cookie_secret": cookie_secret}


async def _build_at_hub_start(log: Log) -> None:
    from jupyterhub.app import JupyterHub  # only where a hub runs

    if not JupyterHub.initialized():
        return
    app = JupyterHub.instance()
    # runs at the hub's first await after loading its config, which it follows with
    # its cookie secret; a subcommand (upgrade-db, --show-config) starts no hub
    if app.subapp is not None or app.show_config or app.show_config_json or \
            not app.cookie_secret:
        return
    try:
        spawner_class = app.spawner_class
        hub_class = getattr(spawner_class, "hub_class", None)
        if hub_class is None:
            return  # not a quota spawner: no hub object to build
        source = spawner_class(config=app.config, hub=app.hub, orm_spawner=None,
                               user=_HubUser(app.cookie_secret), log=app.log)
        hub = await hub_class.of(source).built(source, "at hub start")
    except Exception as e:  # never the hub's end: its spawns try again
        log.error("Could not build the hub runtime at hub start (%s: %s); the first spawn "
                  "tries again", type(e).__name__, e)
        return
    # what runs (on Docker the first sync, zombies included) waits until the hub is up
    if not await hub_started(app):
        return
    try:
        await hub.ready(source)
    except Exception as e:  # the next poll, spawn form or start tries again
        log.error(hub.ready_failed, e)
