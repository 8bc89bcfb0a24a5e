"""The hub's runtime on Docker: the hub object (spawner/policy/hub.py ``QuotaHub``) with
what only Docker has, shared by every QuotaSpawner of one hub process.

One ``HubRuntime`` per GPU inventory and hub id. It is made cheaply, without waiting,
by whoever asks first (the hub as it starts, or a spawner's ``load_state``, which
claims its container in it), and built once, as every hub object is, in this order:

1. the engine's client and ``docker info``, in threads (docker-py asks the
   engine for its API version; the info warns of quotas the engine cannot
   enforce, and caps the start CPU boost);
2. the GPU inventory, declared or found with NVML in a thread, logged as
   ``GPU inventory: …``;
3. the usage ledger, created or upgraded in a thread before any part below
   writes to it (without one, no session is recorded and no budget enforced),
   and its writer;
4. the event log (the ledger's ``events`` table; a file without a ledger, or when
   ``events_file`` names one) and the shared documents, then the GPU pool
   (allocation and the wait queue), the host's capacity (admission) and the
   notebooks' parent cgroup, in a thread (docker/parent_cgroup.py; the log says whether
   it is in effect), and the users' homes (spawner/homes, opened in a thread; the log
   says in one sentence which mechanism keeps them at their size, or why disk is not
   enforced);
5. the reconciler (the pool in step with the containers' labels, zombies) and
   the evictor (preemptions, and stopping a server the hub's way), which first
   calls off the preemptions a previous hub process left in their grace;
6. the usage duties (lost sessions, retention, GPU-hour budgets);
7. the NVIDIA runtime probe, in the background, when there are GPUs.

``ready`` then rebuilds the holdings from the running containers and starts
the periodic sync and the usage duties. Every spawner's poll, form and start
awaits it; the hub itself does once it runs (``build_at_hub_start`` in
spawner/policy/hub.py, which hub_config/jupyterhub_config.py calls), so the
inventory and the probe's finding are in the hub's log before anyone spawns.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import threading
from dataclasses import dataclass
from typing import Any

from spawner.docker.engine import (
    FrameworkLabels,
    NvidiaRuntime,
    RunningContainers,
    check_engine_info,
)
from spawner.docker.evictor import Evictor
from spawner.docker.hub_homes import open_hub_homes
from spawner.docker.parent_cgroup import ParentCgroup, ParentCgroupError, is_local, set_up
from spawner.docker.reconcile import Claims, Reconciler
from spawner.gpu.inventory import Inventory
from spawner.gpu.pool import GpuPool, hub_inventory
from spawner.homes.base import HomeStore
from spawner.homes.errors import HomeError
from spawner.host.admission import HostBook, HostCapacity
from spawner.host.disk import DISK_RATIO
from spawner.policy.hub import HubSettings, Log, QuotaHub
from spawner.policy.stopping import HubServer
from spawner.quota.model import GpuCapacity, QuotaTableError
from spawner.quota.store import QuotaStore
from spawner.quota.units import parse_size
from spawner.usage.documents import GPUS
from spawner.usage.duties import UsageDuties
from spawner.usage.ledger import Ledger


@dataclass(frozen=True)
class Settings(HubSettings):
    """The ``c.QuotaSpawner`` settings a runtime is built from, as a spawner reads them:
    the hub object's (HubSettings) and Docker's own."""

    gpu_inventory: list[dict[str, Any]]
    gpu_discovery: bool
    gpu_sync_interval: float
    zombie_grace_period: float
    usage_retention_days: float
    host_admission: bool
    queue_strategy: str
    host_cpus: float
    host_memory: str
    host_reserve_cpus: float | None
    host_reserve_memory: str
    cpu_overcommit: float
    memory_overcommit: float
    notebooks_cgroup: bool
    home_root: str = ""
    home_mechanism: str = "auto"
    home_image_dir: str = ""
    disk_ratio: float = DISK_RATIO
    disk_reserve: str = ""

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

    @property
    def key(self) -> str:
        """One runtime per inventory and hub id."""
        return json.dumps([self.gpu_inventory, self.gpu_discovery, self.hub_id], default=str)


def probe_images(store: QuotaStore, log: Log, capacity: GpuCapacity) -> list[str]:
    """The images the NVIDIA runtime probe may use: the quota table's, those of its GPU
    roles first (the probe never pulls: it takes the first the engine has). Blocks."""
    try:
        table = store.get(log, capacity)
    except QuotaTableError:
        return []
    keys = [k for r in table.roles.values() if r.gpus for k in r.images] + list(table.images)
    return list(dict.fromkeys(table.images[k].image for k in keys if k in table.images))


class HubRuntime(QuotaHub):
    """Everything the Docker spawners of one hub process share (the module's docstring
    lists the parts and their order). The parts exist once ``built`` has returned."""

    settings_class = Settings
    ready_failed = "GPU sync with Docker failed: %s"

    settings: Settings
    docker_client: Any  # a docker APIClient: its methods block, call them in threads
    engine_info: dict[str, Any] | None  # docker info, None when it could not be read
    inventory: Inventory
    pool: GpuPool
    reconciler: Reconciler
    evictor: Evictor
    nvidia: NvidiaRuntime | None  # whether the engine can give GPUs; None without GPUs
    parent_cgroup: ParentCgroup | None  # the notebooks'; None where it could not be set up
    # the users' homes (spawner/homes); None where they could not be opened, and then
    # homes_problem says why (a start of a role with disk is refused)
    homes: HomeStore | None
    homes_problem: str

    def __init__(self, settings: Settings, log: Log):
        super().__init__(settings, log)
        self.homes, self.homes_problem = None, ""
        # admission of homes: one decision at a time; the sizes being made meanwhile
        self.disk_lock = threading.Lock()
        self.disk_pending: dict[str, int] = {}
        # the servers of this hub: from each spawner's load_state on, before the build
        self.claims = Claims()
        self.frameworks = FrameworkLabels()  # the images' contents, for the form and caps
        self.running = RunningContainers()  # the polls' one listing (QuotaSpawner.poll)
        self.engine_info = None
        self.parent_cgroup = None  # set by the build (docker/parent_cgroup.py)

    # --- building: the hub object's steps (spawner/policy/hub.py) -----------------------------

    async def _build_first(self, source: Any) -> None:
        settings, log = self.settings, self.log
        self.docker_client = await asyncio.to_thread(lambda: source.client)
        self.engine_info = await self._engine_info()
        self.inventory = await asyncio.to_thread(hub_inventory, settings.gpu_inventory,
                                                 settings.gpu_discovery)
        (log.info if self.inventory.devices else log.warning)(
            "GPU inventory: %s", self.inventory.describe())

    async def _build_parts(self, source: Any) -> None:
        settings, log = self.settings, self.log
        self.pool = GpuPool(self.inventory, self.hub_id, log, events=self.events,
                            publish=functools.partial(self.events.save, self.documents, GPUS),
                            strategy=settings.queue_strategy)
        capacity = self._host_capacity()
        self.pool.set_host(HostBook(capacity) if capacity and settings.host_admission
                           else None)
        self.parent_cgroup = await self._parent_cgroup(capacity)
        await self._open_homes(source)
        self.reconciler = Reconciler(
            self.pool, self.docker_client, log, sync_interval=settings.gpu_sync_interval,
            zombie_grace=settings.zombie_grace_period, claims=self.claims, usage=self.usage)
        self.evictor = Evictor(self.pool, self.docker_client, self.documents, log,
                               spawners=self.spawners, usage=self.usage)
        self.pool.evictions = self.evictor
        await self.evictor.recover()

    def _make_duties(self, ledger: Ledger) -> UsageDuties:
        s = self.settings
        return UsageDuties(ledger, self, s.usage_retention_days, self.log, table=self.table,
                           budget_memory=self.documents, interval=s.usage_check_interval)

    async def _build_last(self, why: str) -> None:
        log = self.log
        self.nvidia = None
        if self.inventory.devices:  # can the engine give them? Said in the log at once
            self.nvidia = NvidiaRuntime(self.docker_client, log, self.inventory.uuids[0],
                                        self._probe_images, self.hub_id)
            self.nvidia.start()
        log.info("Hub runtime of hub %s built%s: %d GPUs (%s), usage ledger %s, event "
                 "log %s%s", self.hub_id, f" {why}" if why else "",
                 len(self.inventory.devices), self.inventory.source,
                 self.ledger.url_text if self.ledger is not None else "none",
                 self.events.where,
                 "; the NVIDIA runtime probe is under way" if self.nvidia else "")
        log.info("Queue: %s (docs/preemption.md#the-queues-strategies)",
                 self.pool.queue.policy)

    async def _ready(self) -> None:
        """In step with the running containers: the first sync, then the periodic one and
        the usage duties."""
        await self.reconciler.ready()
        if self.duties is not None:
            self.duties.start()

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

    async def _open_homes(self, source: Any) -> None:
        """The users' homes, opened in a thread; the one sentence in the log says which
        mechanism keeps them at their size, or why disk is not enforced."""
        s = self.settings
        opened = await asyncio.to_thread(
            open_hub_homes, s.home_root, s.home_mechanism, s.home_image_dir, s.disk_ratio,
            s.disk_reserve, getattr(source, "escape", None))
        self.log.log(opened.level, "%s", opened.sentence)
        self.homes = opened.homes
        self.homes_problem = opened.sentence if opened.homes is None else ""
        if opened.homes is not None and opened.homes.mechanism == "image":
            atexit.register(self._release_homes, opened.homes)  # the hub mounted them

    def _release_homes(self, homes: HomeStore) -> None:
        try:
            homes.release()
        except HomeError as e:
            self.log.warning("At the hub's end: %s", e)

    async def _engine_info(self) -> dict[str, Any] | None:
        try:
            info = await asyncio.to_thread(self.docker_client.info)
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)
            return None
        check_engine_info(info, self.log)
        return info

    async def _probe_images(self) -> list[str]:
        return await asyncio.to_thread(probe_images, self.table_store(), self.log,
                                       self.pool.capacity)

    # --- the servers of this hub ------------------------------------------------------------

    def claim(self, name: str, spawner: HubServer) -> None:
        """A server of this hub runs in container ``name``: never a zombie, and stopped
        through ``spawner`` when preempted or over its budget."""
        self.claims.claim(name)
        super().claim(name, spawner)

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
        if not self.is_built:
            return
        self.reconciler.close()
        self.pool.close()
        super().close()
        if self.nvidia is not None:
            self.nvidia.close()


def __getattr__(name: str) -> Any:
    """``build_at_hub_start`` was here until 0.2.0 (spawner/common/moved.py)."""
    from spawner.common.moved import moved_name

    return moved_name(__name__, name)
