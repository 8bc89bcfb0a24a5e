"""The hub's runtime on Docker: what every QuotaSpawner of one hub process shares.

JupyterHub makes a spawner per user server; what belongs to the hub process
is one ``HubRuntime`` per GPU inventory and hub id (``RUNTIMES``; in practice
one). It is made cheaply, without waiting, by whoever asks first (the hub as it
starts, or a spawner's ``load_state``, which claims its container in it), and
built once, in this order:

1. the engine's client and ``docker info``, in threads (docker-py asks the
   engine for its API version; the info warns of quotas the engine cannot
   enforce, and caps the start CPU boost);
2. the GPU inventory, declared or found with NVML in a thread, logged as
   ``GPU inventory: …``;
3. the usage ledger, created or upgraded in a thread before any part below
   writes to it (without one, no session is recorded and no budget enforced);
4. the event log (the ledger's ``events`` table; a file without a ledger, or when
   ``events_file`` names one), the GPU pool
   (allocation and the wait queue), the host's capacity (admission), the
   notebooks' parent cgroup, in a thread (docker/parent_cgroup.py; the log says whether
   it is in effect), and the ledger's writer;
5. the reconciler (the pool in step with the containers' labels, zombies) and
   the evictor (preemptions, and stopping a server the hub's way), which first
   calls off the preemptions a previous hub process left in their grace;
6. the usage duties (lost sessions, retention, GPU-hour budgets);
7. the NVIDIA runtime probe, in the background, when there are GPUs.

``ready`` then rebuilds the holdings from the running containers and starts
the periodic sync and the usage duties. Every spawner's poll, form and start
awaits it; the hub itself does once it runs (``build_at_hub_start``, which
hub_config/jupyterhub_config.py calls), so the inventory and the probe's
finding are in the hub's log before anyone spawns.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import weakref
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy.engine import make_url

from spawner.common.registry import Registry
from spawner.docker.engine import FrameworkLabels, NvidiaRuntime, check_engine_info
from spawner.docker.evictor import Evictor
from spawner.docker.parent_cgroup import ParentCgroup, ParentCgroupError, is_local, set_up
from spawner.docker.reconcile import Claims, Reconciler
from spawner.gpu.inventory import Inventory
from spawner.gpu.pool import GpuPool, hub_inventory
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.model import GpuCapacity, QuotaTable, QuotaTableError
from spawner.quota.store import QuotaStore
from spawner.quota.units import parse_size
from spawner.usage import event_store
from spawner.usage.documents import GPUS, DatabaseDocuments, Documents, FolderDocuments
from spawner.usage.duties import UsageDuties
from spawner.usage.event_log import EventLog, events_path
from spawner.usage.ledger import Ledger, LedgerWriter, default_url
from spawner.usage.table_versions import table_store

Log = logging.Logger | logging.LoggerAdapter


@dataclass(frozen=True)
class Settings:
    """The ``c.QuotaSpawner`` settings a runtime is built from, as a spawner reads them."""

    hub_id: str
    gpu_inventory: list[dict[str, Any]]
    gpu_discovery: bool
    quota_file: str
    state_dir: str
    usage_db: str
    events_file: str
    gpu_sync_interval: float
    zombie_grace_period: float
    usage_retention_days: float
    usage_check_interval: float
    host_admission: bool
    queue_strategy: str
    host_cpus: float
    host_memory: str
    host_reserve_cpus: float | None
    host_reserve_memory: str
    cpu_overcommit: float
    memory_overcommit: float
    notebooks_cgroup: bool
    quota_source: str  # "file", or "database": the ledger's newest version of the table
    quota_table_name: str

    def host_capacity(self, info: dict[str, Any]) -> HostCapacity:
        """The notebooks' share of the engine's host, from ``docker info`` and these
        settings (raises ValueError for one that cannot be used)."""
        return HostCapacity.from_engine(
            info, self.host_cpus or None,
            parse_size(self.host_memory) if self.host_memory else None,
            reserve_cpus=self.host_reserve_cpus,
            reserve_memory=parse_size(self.host_reserve_memory) if self.host_reserve_memory
            else None,
            cpu_ratio=self.cpu_overcommit, memory_ratio=self.memory_overcommit)

    @classmethod
    def of(cls, spawner: Any) -> Settings:
        return cls(**{f.name: getattr(spawner, f.name) for f in fields(cls)})

    @property
    def key(self) -> str:
        """One runtime per inventory and hub id."""
        return json.dumps([self.gpu_inventory, self.gpu_discovery, self.hub_id], default=str)

    def path(self, name: str) -> str:
        """A file of the hub's in its state folder."""
        return os.path.join(self.state_dir or ".", name)


def probe_images(store: QuotaStore, log: Log, capacity: GpuCapacity) -> list[str]:
    """The images the NVIDIA runtime probe may use: the quota table's, those of its GPU
    roles first (the probe never pulls: it takes the first the engine has). Blocks."""
    try:
        table = store.get(log, capacity)
    except QuotaTableError:
        return []
    keys = [k for r in table.roles.values() if r.gpus for k in r.images] + list(table.images)
    return list(dict.fromkeys(table.images[k].image for k in keys if k in table.images))


class HubRuntime:
    """Everything the Docker spawners of one hub process share (the module's docstring
    lists the parts and their order). The parts exist once ``built`` has returned."""

    docker_client: Any  # a docker APIClient: its methods block, call them in threads
    engine_info: dict[str, Any] | None  # docker info, None when it could not be read
    inventory: Inventory
    events: EventLog
    pool: GpuPool
    usage: LedgerWriter | None  # None without a ledger
    reconciler: Reconciler
    evictor: Evictor
    duties: UsageDuties | None
    nvidia: NvidiaRuntime | None  # whether the engine can give GPUs; None without GPUs
    parent_cgroup: ParentCgroup | None  # the notebooks'; None where it could not be set up

    def __init__(self, settings: Settings, log: Log):
        self.settings = settings
        self.hub_id = settings.hub_id
        self.log = log
        # the servers of this hub: from each spawner's load_state on, before the build
        self.claims = Claims()
        # container name -> its spawner, so a server is stopped the hub's way
        self.spawners: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self.frameworks = FrameworkLabels()  # the images' contents, for the form and caps
        self.engine_info = None
        self.parent_cgroup = None  # set by the build (docker/parent_cgroup.py)
        self._building: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, spawner: Any) -> HubRuntime:
        """The runtime for ``spawner``'s settings (QuotaSpawnerConfig's traits), made the
        first time and not built yet: cheap and synchronous."""
        settings = Settings.of(spawner)
        return RUNTIMES.get(settings.key, lambda: cls(settings, spawner.log))

    # --- building -------------------------------------------------------------------------

    async def built(self, source: Any, why: str = "") -> HubRuntime:
        """Built once, with ``source``'s engine client (a spawner); a build that failed
        is tried again by the next caller. ``why``: for the log line that says so."""
        task = self._building
        if task is None or (task.done() and (task.cancelled() or task.exception())):
            task = self._building = asyncio.ensure_future(self._build(source, why))
        await asyncio.shield(task)  # one caller giving up does not stop the build
        return self

    async def ready(self, source: Any, why: str = "") -> HubRuntime:
        """Built, and in step with the running containers: awaited before any spawn,
        form or poll is served. Starts the periodic sync and the usage duties."""
        await self.built(source, why)
        await self.reconciler.ready()
        if self.duties is not None:
            self.duties.start()
        return self

    async def _build(self, source: Any, why: str) -> None:
        settings, log = self.settings, self.log
        self.docker_client = await asyncio.to_thread(lambda: source.client)
        self.engine_info = await self._engine_info()
        self.inventory = await asyncio.to_thread(hub_inventory, settings.gpu_inventory,
                                                 settings.gpu_discovery)
        (log.info if self.inventory.devices else log.warning)(
            "GPU inventory: %s", self.inventory.describe())
        ledger = await self._open_ledger()
        # with a ledger, its table only; without one (none, or one that could not be
        # opened) the state folder's file, so no event is lost
        self.events = EventLog(
            events_path(settings.state_dir or ".", settings.events_file, ledger is not None),
            log, store=(functools.partial(event_store.append_one, ledger.engine)
                        if ledger else None))
        # the state the other processes read: the ledger's rows, else the folder's files
        documents = shared_documents(ledger, self.hub_id, settings.state_dir or ".")
        self.pool = GpuPool(self.inventory, self.hub_id, log, events=self.events,
                            publish=functools.partial(self.events.save, documents, GPUS),
                            strategy=settings.queue_strategy)
        capacity = self._host_capacity()
        self.pool.set_host(HostBook(capacity) if capacity and settings.host_admission
                           else None)
        self.parent_cgroup = await self._parent_cgroup(capacity)
        self.usage = LedgerWriter(ledger, log) if ledger is not None else None
        self.reconciler = Reconciler(
            self.pool, self.docker_client, log, sync_interval=settings.gpu_sync_interval,
            zombie_grace=settings.zombie_grace_period, claims=self.claims, usage=self.usage)
        self.evictor = Evictor(self.pool, self.docker_client, documents, log,
                               spawners=self.spawners, usage=self.usage)
        self.pool.evictions = self.evictor
        await self.evictor.recover()
        # in a thread: the duties read their budget memory from the database as they start
        self.duties = None if ledger is None else await asyncio.to_thread(
            UsageDuties, ledger, self, settings.usage_retention_days, log, table=self.table,
            budget_memory=documents, interval=settings.usage_check_interval)
        self.nvidia = None
        if self.inventory.devices:  # can the engine give them? Said in the log at once
            self.nvidia = NvidiaRuntime(self.docker_client, log, self.inventory.uuids[0],
                                        self._probe_images, self.hub_id)
            self.nvidia.start()
        log.info("Hub runtime of hub %s built%s: %d GPUs (%s), usage ledger %s, event "
                 "log %s%s", self.hub_id, f" {why}" if why else "",
                 len(self.inventory.devices), self.inventory.source,
                 ledger.url_text if ledger is not None else "none", self.events.where,
                 "; the NVIDIA runtime probe is under way" if self.nvidia else "")
        log.info("Queue: %s (docs/preemption.md#the-queues-strategies)",
                 self.pool.queue.policy)

    def _host_capacity(self) -> HostCapacity | None:
        """The host's CPUs and memory as this hub counts them; None when the engine's size
        is unknown or a setting cannot be used (said in the log), which turns host
        admission off."""
        admission = self.settings.host_admission
        if not self.engine_info:
            if admission:
                self.log.warning("Host admission is off: the engine's size is unknown")
            return None
        try:
            capacity = self.settings.host_capacity(self.engine_info)
        except ValueError as e:
            self.log.error("%s: %s (c.QuotaSpawner.host_* and *_overcommit)",
                           "Host admission is off" if admission else "The host's size is "
                           "unknown", e)
            return None
        if admission:
            self.log.info("Host capacity: %s", capacity.describe())
        return capacity

    async def _parent_cgroup(self, capacity: HostCapacity | None) -> ParentCgroup | None:
        """The notebooks' parent cgroup, set up now (docker/parent_cgroup.py); None, said in the
        log, where it cannot be."""
        if not self.settings.notebooks_cgroup:
            return None
        if capacity is None:
            self.log.warning("The notebooks' memory is not fenced: the host's size is "
                             "unknown (docs/deployment.md#the-notebooks-cgroup)")
            return None
        limit = capacity.memory - capacity.kept_memory
        local = is_local(str(getattr(self.docker_client, "base_url", "")))
        try:
            cgroup = await asyncio.to_thread(set_up, self.engine_info or {}, self.hub_id,
                                             limit, local=local)
        except ParentCgroupError as e:
            self.log.warning("The notebooks' memory is not fenced: %s. Nothing keeps the "
                             "notebooks together from taking the hub's and the proxy's "
                             "memory beyond admission (docs/deployment.md#the-notebooks-"
                             "cgroup)", e)
            return None
        self.log.info("Notebooks' memory fenced: %s", cgroup.describe())
        return cgroup

    async def _engine_info(self) -> dict[str, Any] | None:
        try:
            info = await asyncio.to_thread(self.docker_client.info)
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)
            return None
        check_engine_info(info, self.log)
        return info

    async def _open_ledger(self) -> Ledger | None:
        """The usage ledger at ``usage_db``, created or upgraded now; None without one,
        or (logged) when it cannot be opened."""
        url = self.settings.usage_db or default_url(self.settings.state_dir or ".")
        if url == "none":
            return None
        try:
            return await asyncio.to_thread(Ledger, url, self.log)
        except Exception as e:
            self.log.error("The usage ledger %s cannot be opened (%s): sessions are not "
                           "recorded and budgets not enforced until the hub restarts with "
                           "it fixed",
                           make_url(url).render_as_string(hide_password=True), e)
            return None

    def table_store(self) -> QuotaStore:
        """The store of the table this hub reads: the file, or the ledger's newest version
        (quota_source); the same as its spawners' (RoleChoicesMixin.table_store)."""
        s = self.settings
        return table_store(s.quota_source, s.quota_file,
                           s.usage_db or default_url(s.state_dir or "."),
                           s.quota_table_name, self.log)

    async def table(self) -> QuotaTable:
        """The quota table as it is now, checked against this hub's GPUs (raises
        QuotaTableError when there never was a good one)."""
        return await asyncio.to_thread(self.table_store().get, self.log, self.pool.capacity)

    async def _probe_images(self) -> list[str]:
        return await asyncio.to_thread(probe_images, self.table_store(), self.log,
                                       self.pool.capacity)

    # --- the servers of this hub ------------------------------------------------------------

    def claim(self, name: str, spawner: Any = None) -> None:
        """A server of this hub runs in container ``name``: never a zombie, and stopped
        through ``spawner`` when preempted or over its budget."""
        self.claims.claim(name)
        if spawner is not None:
            self.spawners[name] = spawner

    def forget(self, name: str, why: str) -> None:
        """The server in ``name`` has ended: its GPUs are released."""
        self.claims.forget(name)
        self.pool.release(name, why)

    @property
    def starting(self) -> set[str]:
        """The containers whose start is under way (usage duties: never lost)."""
        return self.pool.starting

    async def stop_server(self, name: str, why: str) -> bool:
        """Stop ``name`` the hub's way (``Evictor.stop_server``): for the usage duties."""
        return await self.evictor.stop_server(name, why)

    def close(self) -> None:
        """Stop the timers and background tasks (a test's end; a hub's end stops them
        with its event loop)."""
        if self._building is None or not self._building.done() or \
                self._building.cancelled() or self._building.exception():
            return
        self.reconciler.close()
        self.pool.close()
        for part in (self.duties, self.nvidia):
            if part is not None:
                part.close()


RUNTIMES: Registry[str, HubRuntime] = Registry()  # the hub process's, by Settings.key


# --- at hub start -------------------------------------------------------------------------

_at_start: set[asyncio.Task[None]] = set()  # held: the event loop keeps weak references


def build_at_hub_start(log: Log) -> None:
    """Build the hub's runtime as the hub starts (hub_config/jupyterhub_config.py calls
    this while JupyterHub loads it, on the hub's running event loop), so the hub's log
    says at once which GPUs it has and whether the engine can give them.

    The build is scheduled, never awaited: the hub's start never waits for Docker or
    NVML, and a failure is logged (the first spawn then tries again). It reads the
    settings from a spawner of the configured class, made with the hub's config and
    cookie secret, so it builds the very runtime the spawners use. Outside a starting
    hub (no running loop: a test reading the config) it does nothing."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(_build_at_hub_start(log))
    _at_start.add(task)
    task.add_done_callback(_at_start.discard)


class _HubUser:
    """The user of a spawner made only to read the hub's settings: the hub id's default
    comes from the cookie secret in the user's settings."""

    name = ""

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
        if not hasattr(spawner_class, "hub_runtime"):
            return  # not a QuotaSpawner: no runtime to build
        source = spawner_class(config=app.config, hub=app.hub, orm_spawner=None,
                               user=_HubUser(app.cookie_secret), log=app.log)
        runtime = await HubRuntime.of(source).built(source, "at hub start")
    except Exception as e:  # never the hub's end: its spawns try again
        log.error("Could not build the hub runtime at hub start (%s: %s); the first spawn "
                  "tries again", type(e).__name__, e)
        return
    # The first sync, zombies included, waits until the hub is up: by then each running
    # server's spawner has claimed its container (JupyterHub's own future).
    started = getattr(app, "_start_future", None)
    if isinstance(started, asyncio.Future):
        await asyncio.shield(started)
    try:
        await runtime.ready(source)
    except Exception as e:  # the next poll, spawn form or start tries again
        log.error("GPU sync with Docker failed: %s", e)


def shared_documents(ledger: Ledger | None, hub_id: str, state_dir: str) -> Documents:
    """Where the hub keeps the documents other processes read (spawner/usage/documents.py): its
    ledger's database, reading the state folder's files of before the upgrade once; the
    folder alone without a ledger."""
    folder = FolderDocuments(state_dir)
    return folder if ledger is None else DatabaseDocuments(ledger.engine, hub_id,
                                                           fallback=folder)
