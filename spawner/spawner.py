"""QuotaSpawner: DockerSpawner sized from the role-based quota table."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default

from .allocator import GpuRequest, NoGpuFree
from .engine import check_engine_info
from .form import options_from_form, render_form
from .gpu_env import gpu_environment
from .gpu_pool import GPU_MODE_LABEL, GPUS_LABEL, HUB_LABEL, LABEL_PREFIX, GpuPool, mode_label
from .inventory import Inventory, declared_inventory, discover_nvml
from .network import HostNetworkMixin, wait_for_port
from .options import OptionsError, resolve_choice
from .quota import Choice, GpuCapacity, QuotaTable, QuotaTableError, Role
from .store import QuotaStore

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def literal(text: str) -> str:
    """Protect user-named text from DockerSpawner's ``str.format`` templating."""
    return text.replace("{", "{{").replace("}", "}}")


class QuotaSpawner(HostNetworkMixin, DockerSpawner):
    """Spawns notebook containers whose size comes from the quota table.

    Every start reads the table afresh (hot reload), checks ``user_options``
    against the roles the user holds, and sets every limit from the role, so
    nothing carries over from an earlier spawn.
    """

    quota_file = Unicode(
        "quotas.yaml",
        config=True,
        help="Path of the quota table (YAML). Edits take effect at the next spawn.",
    )
    pids_limit = Integer(
        2048,
        config=True,
        help="Most processes and threads in one container, for roles that set no 'pids'.",
    )
    notebook_user = Unicode(
        "1000",
        config=True,
        help="The user (uid or uid:gid) the notebook runs as; never root.",
    )
    home_dir = Unicode("/home/jovyan", config=True, help="Where the home volume is mounted.")
    extra_labels = Dict(
        config=True, help="More container labels. The quota-spawner.* labels cannot be overridden."
    )
    gpu_inventory = List(
        Dict(),
        config=True,
        help="""The GPUs this hub hands out, declared: for a hub that cannot see them
        (a hub in a container, say). A list of {"uuid": "GPU-…", "name": "…",
        "memory": "80G"}; name and memory are optional. When empty, the GPUs are
        discovered with NVML on the hub host.""",
    )
    gpu_discovery = Bool(
        True, config=True, help="Discover GPUs with NVML when no gpu_inventory is declared."
    )
    hub_id = Unicode(
        config=True,
        help="""Names this hub in the quota-spawner.hub label of its containers. Containers
        with this hub's label that no server of the hub claims are stopped after
        zombie_grace_period. Defaults to the container name prefix.""",
    )
    gpu_sync_interval = Float(
        30.0, config=True,
        help="Seconds between checks of the running containers against the GPU holdings.",
    )
    zombie_grace_period = Float(
        300.0, config=True,
        help="Seconds an unclaimed container of this hub may run before it is stopped.",
    )

    _engine_checked: ClassVar[bool] = False
    _pools: ClassVar[dict[str, GpuPool]] = {}
    _pool_lock: ClassVar[asyncio.Lock | None] = None
    # Container names the servers of this hub process claim (state loaded or started).
    _claimed: ClassVar[set[str]] = set()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.choice: Choice | None = None
        self.gpu_uuids: tuple[str, ...] = ()
        self._gpu_memory: int | None = None  # the smallest assigned GPU's memory
        self._events: list[dict[str, Any]] = []
        # The admin's own extra config stays; the quota settings go on top of it.
        self._admin_host_config = self.extra_host_config
        self._admin_create_kwargs = self.extra_create_kwargs
        self.extra_host_config = QuotaSpawner._quota_host_config
        self.extra_create_kwargs = QuotaSpawner._quota_create_kwargs

    # --- defaults ---------------------------------------------------------

    @default("remove")
    def _remove_default(self) -> bool:
        return True  # a fresh container per spawn; the home volume keeps the work

    @default("prefix")
    def _prefix_default(self) -> str:
        return "quota"

    @default("volumes")
    def _volumes_default(self) -> dict[str, str]:
        return {"quota-home-{username}": self.home_dir}

    @default("options_form")
    def _options_form_default(self) -> Any:
        return QuotaSpawner._render_options_form

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return options_from_form

    @default("cmd")
    def _cmd_default(self) -> list[str]:
        return ["jupyterhub-singleuser"]

    @default("hub_id")
    def _hub_id_default(self) -> str:
        return self.prefix

    # --- GPUs ---------------------------------------------------------------

    def _inventory(self) -> Inventory:
        if self.gpu_inventory:
            try:
                return declared_inventory(self.gpu_inventory)
            except ValueError as e:
                return Inventory((), "none", f"QuotaSpawner.gpu_inventory is invalid: {e}")
        if not self.gpu_discovery:
            return Inventory((), "none", "no gpu_inventory is declared and discovery is off")
        return discover_nvml()

    async def gpu_pool(self) -> GpuPool:
        """This hub's GPU pool, in step with the running containers."""
        key = json.dumps([self.gpu_inventory, self.gpu_discovery, self.hub_id], default=str)
        pool = QuotaSpawner._pools.get(key)
        if pool is None:
            if QuotaSpawner._pool_lock is None:
                QuotaSpawner._pool_lock = asyncio.Lock()
            async with QuotaSpawner._pool_lock:
                pool = QuotaSpawner._pools.get(key)
                if pool is None:
                    inventory = await asyncio.to_thread(self._inventory)
                    log = self.log.info if inventory.devices else self.log.warning
                    log("GPU inventory: %s", inventory.describe())
                    pool = GpuPool(
                        inventory, self.hub_id, self.client, self.log,
                        sync_interval=self.gpu_sync_interval,
                        zombie_grace=self.zombie_grace_period,
                        known=QuotaSpawner._claimed,
                    )
                    QuotaSpawner._pools[key] = pool
        await pool.ready()
        return pool

    @staticmethod
    def gpu_capacity(pool: GpuPool) -> GpuCapacity:
        inventory = pool.inventory
        return GpuCapacity(len(inventory.devices), inventory.smallest_memory())

    @staticmethod
    def gpu_request(role: Role) -> GpuRequest | None:
        if not role.gpus:
            return None
        return GpuRequest(role.gpus, role.gpu_mode, role.gpu_share, role.gpu_memory)

    def _no_gpu_message(self, role: Role, error: NoGpuFree, pool: GpuPool,
                        choices: list[Choice]) -> str:
        usage = error.usage
        wanted = f"{role.gpus} GPU{'s' if role.gpus != 1 else ''}"
        if usage.total == 0:
            reason = pool.inventory.reason or "none were found"
            text = f"The role '{role.name}' needs {wanted}, but this hub has no GPUs ({reason})."
        elif role.gpus > usage.total:
            text = (f"The role '{role.name}' needs {wanted}, but this hub has only "
                    f"{usage.total}; an admin must fix the quota table.")
        else:
            held = usage.total - usage.free
            text = (
                f"No GPU is free for the role '{role.name}', which needs {wanted} "
                f"({role.gpu_mode}): this hub has {usage.total} GPU"
                f"{'s' if usage.total != 1 else ''} and {held} "
                f"{'is' if held == 1 else 'are'} held ({usage.exclusive} exclusively, "
                f"{usage.shared} shared)."
            )
        cpu_roles = list(dict.fromkeys(c.role.name for c in choices if not c.role.gpus))
        if cpu_roles:
            text += f" You can start a CPU-only server now with the role '{cpu_roles[0]}'."
        else:
            text += " You have no CPU-only role; try again when a GPU is released."
        return text

    # --- the quota table --------------------------------------------------

    @property
    def store(self) -> QuotaStore:
        return QuotaStore.for_path(self.quota_file)

    async def load_table(self, pool: GpuPool | None = None) -> QuotaTable:
        pool = pool or await self.gpu_pool()
        try:
            return await asyncio.to_thread(self.store.get, self.log, self.gpu_capacity(pool))
        except QuotaTableError as e:
            raise web.HTTPError(
                500,
                "The quota table has errors, so no server can start. "
                "An admin must fix it: " + "; ".join(str(p) for p in e.problems[:3]),
            ) from None

    def group_names(self) -> list[str]:
        return [g.name for g in self.user.groups]

    async def choices(self, pool: GpuPool | None = None) -> list[Choice]:
        table = await self.load_table(pool)
        return table.choices_for(self.user.name, self.group_names())

    async def _render_options_form(self) -> str:
        pool = await self.gpu_pool()
        choices = await self.choices(pool)
        free = {
            c.role.name: pool.allocator.available(request)
            for c in choices if (request := self.gpu_request(c.role))
        }
        gpus = (free, len(pool.inventory.devices))
        saved = self.orm_spawner.user_options if self.orm_spawner else None
        if not saved:
            return render_form(choices, gpus=gpus)
        try:
            selected = resolve_choice(choices, saved).key
        except OptionsError:
            # The saved choice is gone: show the form even for one choice,
            # or every Start would reuse it and fail.
            return render_form(choices, always=True, gpus=gpus)
        return render_form(choices, selected, gpus=gpus)

    async def resolve(self, choices: list[Choice]) -> Choice:
        """The user's choice for this start, checked against the table."""
        try:
            return resolve_choice(choices, self.user_options)
        except OptionsError as e:
            raise web.HTTPError(e.status, e.message) from None

    # --- the container ----------------------------------------------------

    def _apply_choice(self, choice: Choice) -> None:
        role = choice.role
        self.choice = choice
        self.image = choice.image.image
        self.cpu_limit = role.cpus
        self.mem_limit = role.memory

    async def _admin_value(self, value: Any) -> dict[str, Any]:
        value = self._eval_if_callable(value)
        if inspect.isawaitable(value):
            value = await value
        return dict(value or {})

    async def _quota_host_config(self) -> dict[str, Any]:
        assert self.choice is not None
        role = self.choice.role
        config = await self._admin_value(self._admin_host_config)
        self._check_no_docker_socket(config)
        config.update(
            memswap_limit=role.memory,  # equal to memory: no swap at all
            pids_limit=role.pids or self.pids_limit,
            privileged=False,
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
        )
        if role.shm:
            config["shm_size"] = role.shm
        # Exact UUIDs, never a Count (Docker would take GPUs 0..N-1 for everyone);
        # always set, so an admin's extra config cannot add GPUs.
        config["device_requests"] = [
            {"driver": "nvidia", "device_ids": list(self.gpu_uuids), "capabilities": [["gpu"]]}
        ] if self.gpu_uuids else []
        return config

    def labels(self) -> dict[str, str]:
        assert self.choice is not None
        return {
            LABEL_PREFIX + "user": self.user.name,
            LABEL_PREFIX + "role": self.choice.role.name,
            LABEL_PREFIX + "image": self.choice.image.key,
            GPUS_LABEL: ",".join(self.gpu_uuids),
            GPU_MODE_LABEL: mode_label(self.gpu_request(self.choice.role))
            if self.gpu_uuids else "",
            HUB_LABEL: self.hub_id,
        }

    async def _quota_create_kwargs(self) -> dict[str, Any]:
        kwargs = await self._admin_value(self._admin_create_kwargs)
        # Only our labels hold user-named text; the admin's may use {username}.
        ours = {literal(k): literal(v) for k, v in self.labels().items()}
        kwargs["labels"] = {**kwargs.get("labels", {}), **self.extra_labels, **ours}
        kwargs["user"] = self.notebook_user
        return kwargs

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.choice is not None:
            role = self.choice.role
            threads = str(max(1, int(role.cpus)))
            env.update({name: threads for name in THREAD_ENV})
            env["QUOTA_ROLE"] = role.name
            env["CPU_LIMIT"] = f"{role.cpus:g}"
            env["MEM_LIMIT"] = str(role.memory)
        # CUDA images default to NVIDIA_VISIBLE_DEVICES=all: without GPUs, "void".
        env.update(gpu_environment(self.gpu_uuids, self._gpu_cap(), self._gpu_memory))
        return env

    def _gpu_cap(self) -> int | None:
        if self.choice is None or not self.gpu_uuids:
            return None
        role = self.choice.role
        return role.gpu_memory if role.gpu_mode == "shared" else None

    def _check_no_docker_socket(self, host_config: dict[str, Any] | None = None) -> None:
        host_config = host_config or {}
        binds = host_config.get("binds") or []  # a list of "src:dst[:mode]", or a dict
        sources = [
            *self.volumes,
            *(m.get("source", "") for m in self.mounts),
            *(str(b).split(":", 1)[0] for b in binds),
            *(m.get("Source", "") for m in host_config.get("mounts") or [] if isinstance(m, dict)),
        ]
        for source in sources:
            source = str(source).rstrip("/")
            if source.endswith("docker.sock") or os.path.exists(f"{source}/docker.sock"):
                raise web.HTTPError(
                    500, "Refusing to start: the Docker socket must never be mounted into a "
                         "notebook container (check DockerSpawner.volumes and mounts)."
                )

    async def check_allowed(self, image: str) -> str:
        # user_options["image"] is an image key, already checked in resolve()
        return self.image

    # --- lifecycle --------------------------------------------------------

    async def _check_engine_once(self) -> None:
        if QuotaSpawner._engine_checked:
            return
        QuotaSpawner._engine_checked = True
        try:
            check_engine_info(await self.docker("info"), self.log)
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)

    def _progress(self, message: str, progress: int) -> None:
        self._events.append({"message": message, "progress": progress})

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Spawn steps for the hub's progress page; it stops reading when the spawn ends."""
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            await asyncio.sleep(0.1)

    def _assign_gpus(self, pool: GpuPool, owner: str, choices: list[Choice]) -> None:
        assert self.choice is not None
        role = self.choice.role
        self.gpu_uuids, self._gpu_memory = (), None
        request = self.gpu_request(role)
        if request is None:
            return
        try:
            self.gpu_uuids = pool.acquire(owner, request)
        except NoGpuFree as e:
            message = self._no_gpu_message(role, e, pool, choices)
            self.log.warning("Refused %s: %s", self._log_name, message)
            raise web.HTTPError(503, message) from None
        self._gpu_memory = pool.inventory.smallest_memory(self.gpu_uuids)
        text = f"GPU {','.join(self.gpu_uuids)} assigned ({mode_label(request)})"
        self.log.info("%s: %s", self._log_name, text)
        self._progress(text, 30)

    async def start(self) -> tuple[str, int]:
        self._events = []
        await self._check_engine_once()
        pool = await self.gpu_pool()
        choices = await self.choices(pool)
        choice = await self.resolve(choices)
        self._check_no_docker_socket()
        self._apply_choice(choice)
        # The resolved choice, for the REST API's server model (the culler reads
        # the role there); not saved as the user's default options.
        self.user_options = {**(self.user_options or {}),
                             "profile": choice.role.name, "image": choice.image.key}
        owner = self.object_name
        self.log.info(
            "Starting %s as role %s with image %s (%g CPUs, %d bytes memory, %d GPUs)",
            self._log_name, choice.role.name, choice.image.key,
            choice.role.cpus, choice.role.memory, choice.role.gpus,
        )
        self._progress(f"Role {choice.role.name} with {choice.image.display_name}", 10)
        pool.starting.add(owner)
        try:
            self._assign_gpus(pool, owner, choices)
            self._progress("Starting the container", 40)
            ip, port = await super().start()
            pool.claim(owner)
            self._progress("Container started; waiting for the notebook server", 60)
            # The hub's own readiness check backs off to seconds; polling here is faster.
            await wait_for_port(ip, port, self.poll)
        except BaseException:
            self.release_port()
            pool.release(owner, "the start failed")
            raise
        finally:
            pool.starting.discard(owner)
        return ip, port

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.object_id and self.choice is not None:
            state["quota_choice"] = {"profile": self.choice.role.name,
                                     "image": self.choice.image.key}
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        if self.object_id:
            # after a hub restart: this container is ours, not a zombie
            QuotaSpawner._claimed.add(self.object_name)
            # and it runs as the role it was started with, whatever was saved
            self.user_options = {**(self.user_options or {}), **state.get("quota_choice", {})}

    async def poll(self) -> int | str | None:
        # The hub polls every running server at startup: the pool (and its
        # zombie check) starts then, not only at the first spawn.
        pool = await self.gpu_pool()
        status = await super().poll()
        if status is not None and self.object_name not in pool.starting:
            pool.forget(self.object_name, f"the container stopped ({status})")
        return status

    async def stop(self, now: bool = False) -> None:
        pool = await self.gpu_pool()
        if not self.object_id:
            # a start refused before any container was made, or one removed behind our back
            await self.get_object()
            if not self.object_id:
                self.release_port()
                pool.forget(self.object_name, "the server stopped")
                return
        await super().stop(now=now)
        pool.forget(self.object_name, "the server stopped")
