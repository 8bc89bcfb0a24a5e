"""QuotaSpawner: DockerSpawner sized from the role-based quota table."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, NoReturn

from docker.errors import APIError, DockerException
from docker.utils import decode_json_header
from dockerspawner import DockerSpawner
from dockerspawner.dockerspawner import _deep_merge
from tornado import web
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate

from .container import (
    CPU_PERIOD,
    USER_MESSAGE,
    ContainerSpec,
    apply_quota,
    check_admin_create_kwargs,
    check_admin_environment,
    check_admin_host_config,
    check_admin_labels,
    violations,
)
from .contract import FRAMEWORKS_LABEL, HUB_LABEL
from .engine import check_engine_info, warn_oversized_roles
from .gpu.allocator import GpuRequest, NoGpuFree
from .gpu.env import torch_reads_fraction
from .gpu.inventory import Inventory, declared_inventory, discover_nvml
from .gpu.pool import GpuPool, mode_label
from .mounts import bind_sources, is_socket, named_volumes, probe_paths
from .network import HostNetworkMixin, wait_for_port, warn_host_network
from .quota.form import options_from_form, render_form
from .quota.model import Choice, GpuCapacity, QuotaTable, QuotaTableError, Role
from .quota.options import OptionsError, resolve_choice
from .quota.store import QuotaStore

CPU_LIMIT_FAILED = (
    "Your server started but could not be given its CPU limit, so it was stopped. "
    "Please try again; if this happens again, tell an admin."
)
TABLE_BROKEN = (
    "The hub's quota table has a mistake, so no server can start until an admin fixes it. "
    "The details are in the hub's log."
)


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
        config=True, help="More container labels. The quota-spawner.* labels are refused."
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
        zombie_grace_period; other hubs' containers are never touched. The default,
        "<prefix>-<12 hex digits>", is derived from the hub's cookie secret: the same
        across restarts, different for every hub. Set it when the cookie secret is
        not kept (docs/deployment.md).""",
    )
    gpu_sync_interval = Float(
        30.0, config=True,
        help="Seconds between checks of the running containers against the GPU holdings.",
    )
    zombie_grace_period = Float(
        300.0, config=True,
        help="Seconds an unclaimed container of this hub may run before it is stopped.",
    )

    cpu_boost = Bool(
        True,
        config=True,
        help="""Start each server with more CPUs than its role (cpu_boost_cpus), and set
        the role's CPU quota with the engine's update call as soon as the server answers,
        before the user is handed the server. Python's imports are single-threaded, so a
        role below one CPU otherwise starts about twice as slowly. If the update fails,
        the server is stopped, never left unlimited.""",
    )
    cpu_boost_cpus = Float(
        0.0,
        config=True,
        help="CPUs a server gets while it starts (cpu_boost); 0 means all of the engine's CPUs.",
    )

    _engine_checked: ClassVar[bool] = False
    _engine_info: ClassVar[dict[str, Any] | None] = None
    _pools: ClassVar[dict[str, GpuPool]] = {}
    _pool_lock: ClassVar[asyncio.Lock | None] = None
    # Container names the servers of this hub process claim (state loaded or started).
    _claimed: ClassVar[set[str]] = set()
    # image reference -> (when read, what its frameworks label says)
    _contents: ClassVar[dict[str, tuple[float, str]]] = {}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.choice: Choice | None = None
        self.gpu_uuids: tuple[str, ...] = ()
        self._gpu_memory: int | None = None  # the smallest assigned GPU's memory
        self._events: list[dict[str, Any]] = []
        self._started_options: dict[str, str] = {}  # the last options that started
        self._spec: ContainerSpec | None = None  # this start's, until the boost ends
        # The hub's network, as its config set it; an override or hook may not move one server.
        self._hub_network = self.network_name
        if self.network_name == "host":
            warn_host_network(self.log)

    # --- defaults ---------------------------------------------------------

    @default("remove")
    def _remove_default(self) -> bool:
        return True  # a fresh container per spawn; the home volume keeps the work

    @validate("remove")
    def _always_remove(self, proposal: Any) -> bool:
        # A kept container would come back with the last role's limits and GPUs.
        if not proposal.value:
            self.log.warning("QuotaSpawner.remove=False is ignored: every start gets a fresh "
                             "container, sized from the quota table")
        return True

    @default("prefix")
    def _prefix_default(self) -> str:
        return "quota"

    @default("volumes")
    def _volumes_default(self) -> dict[str, str]:
        return {f"{self.prefix}-home-{{username}}": self.home_dir}

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
        # Stable across restarts, different per hub: two hubs on one engine never
        # take each other's containers for zombies.
        secret = (self.user.settings if self.user else {}).get("cookie_secret")
        if not secret:
            self.log.warning("No cookie secret to derive a hub id from; using the prefix %r. "
                             "Set QuotaSpawner.hub_id if another hub shares this engine.",
                             self.prefix)
            return self.prefix
        if isinstance(secret, str):
            secret = secret.encode()
        digest = hashlib.sha256(b"quota-spawner hub id\0" + secret).hexdigest()[:12]
        return f"{self.prefix}-{digest}"

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
            table = await asyncio.to_thread(self.store.get, self.log, self.gpu_capacity(pool))
        except QuotaTableError:
            # The store has logged every problem with its file and line.
            raise web.HTTPError(500, TABLE_BROKEN) from None
        warn_oversized_roles(table, QuotaSpawner._engine_info, self.log)
        return table

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
        contents = await self._image_contents({c.image.image for c in choices})
        saved = self.orm_spawner.user_options if self.orm_spawner else None
        if not saved:
            return render_form(choices, gpus=gpus, contents=contents)
        try:
            selected = resolve_choice(choices, saved).key
        except OptionsError:
            # The saved choice is gone: show the form even for one choice,
            # or every Start would reuse it and fail.
            return render_form(choices, always=True, gpus=gpus, contents=contents)
        return render_form(choices, selected, gpus=gpus, contents=contents)

    async def _image_contents(self, images: set[str]) -> dict[str, str]:
        """What each image holds, from its quota-spawner.frameworks label (cached a minute)."""
        now = time.monotonic()
        found = {}
        for image in sorted(images):
            cached = QuotaSpawner._contents.get(image)
            if cached is None or now - cached[0] > 60:
                try:
                    info = await self.docker("inspect_image", image)
                    text = ((info.get("Config") or {}).get("Labels") or {}).get(FRAMEWORKS_LABEL)
                except Exception as e:  # a missing image is reported when it is started
                    self.log.debug("No contents label for %s: %s", image, e)
                    text = None
                cached = QuotaSpawner._contents[image] = (now, text or "")
            if cached[1]:
                found[image] = cached[1]
        return found

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
        # For JupyterHub's own use of them; the container is sized from the role.
        self.cpu_limit = role.cpus
        self.mem_limit = role.memory

    def container_spec(self, frameworks: str = "") -> ContainerSpec:
        """What the quota decides about this start's container.

        ``frameworks`` is the image's quota-spawner.frameworks label.
        """
        assert self.choice is not None
        role = self.choice.role
        return ContainerSpec(
            role=role,
            image_key=self.choice.image.key,
            image=self.choice.image.image,
            user_name=self.user.name,
            hub_id=self.hub_id,
            notebook_user=self.notebook_user,
            network_mode=self._hub_network,
            pids_default=self.pids_limit,
            gpu_uuids=self.gpu_uuids,
            gpu_mode=mode_label(self.gpu_request(role)) if self.gpu_uuids else "",
            gpu_device_memory=self._gpu_memory,
            extra_labels=dict(self.extra_labels),
            start_cpus=self._start_cpus(),
            torch_reads_fraction=torch_reads_fraction(frameworks),
        )

    def _start_cpus(self) -> float | None:
        if not self.cpu_boost:
            return None
        engine_cpus = float((QuotaSpawner._engine_info or {}).get("NCPU") or 0)
        cpus = self.cpu_boost_cpus or engine_cpus
        return min(cpus, engine_cpus) if engine_cpus else cpus or None

    async def _admin_value(self, value: Any) -> dict[str, Any]:
        value = self._eval_if_callable(value)
        if inspect.isawaitable(value):
            value = await value
        return self._render_templates(dict(value or {}))

    def _refuse(self, problems: list[str]) -> NoReturn:
        self.log.error("Refused to create a container for %s; each setting below is not "
                       "allowed (docs/security.md):\n  %s", self._log_name, "\n  ".join(problems))
        raise web.HTTPError(500, USER_MESSAGE)

    async def _create_body(self, spec: ContainerSpec, admin_create: dict[str, Any],
                           admin_host: dict[str, Any]) -> dict[str, Any]:
        """DockerSpawner's create request with the admin's additions, then the quota on top."""
        kwargs: dict[str, Any] = dict(
            image=spec.image,
            command=await self.get_command(),
            environment=self.get_env(),
            volumes=self.volume_mount_points,
            ports={f"{self.port}/tcp": None},
        )
        _deep_merge(kwargs, admin_create)
        host: dict[str, Any] = dict(binds=self.volume_binds, links=self.links,
                                    mounts=self.mount_binds, network_mode=self.network_name)
        if not self.use_internal_ip:
            host["port_bindings"] = {self.port: (self.host_ip,)}
        _deep_merge(host, admin_host)
        try:
            body = self.client.create_container_config(
                host_config=self.client.create_host_config(**host), **kwargs
            )
        except (DockerException, TypeError, ValueError) as e:
            self._refuse([f"the container settings cannot be read: {e}"])
        return apply_quota(dict(body), spec)

    async def _volume_info(self, host: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The engine's view of the named volumes: a local volume may bind a host folder."""
        info = {}
        for name in named_volumes(host):
            try:
                info[name] = await self.docker("inspect_volume", name)
            except APIError as e:
                if e.status_code != 404:  # a missing volume is created empty
                    raise
        return info

    def _stat_in_container(self, container_id: str, path: str) -> dict[str, Any] | None:
        """The engine's stat of a path inside a created container (HEAD .../archive)."""
        client = self.client
        response = client.head(client._url("/containers/{0}/archive", container_id),
                               params={"path": path})
        if response.status_code == 404:
            return None
        client._raise_for_status(response)
        header = response.headers.get("X-Docker-Container-Path-Stat")
        return decode_json_header(header) if header else None

    async def _probe_binds(self, container_id: str, binds: list[Any]) -> list[str]:
        """Ask the engine what each bind really is: it sees through symlinks."""
        problems = []
        for bind in binds:
            for path in probe_paths(bind.target):
                stat = await asyncio.to_thread(self._stat_in_container, container_id, path)
                if stat and is_socket(stat):
                    problems.append(f"{bind.setting} mounts {bind.source!r} at {bind.target!r}, "
                                    f"and the engine finds a socket at {path!r} in it; an "
                                    "engine socket must never reach a notebook")
                    break
        return problems

    async def create_object(self) -> dict[str, Any]:
        """Create the container: the last step before the engine, whatever config did earlier."""
        frameworks = (await self._image_contents({self.image})).get(self.image, "")
        spec = self._spec = self.container_spec(frameworks)
        admin_host = await self._admin_value(self.extra_host_config)
        admin_create = await self._admin_value(self.extra_create_kwargs)
        problems = [
            *check_admin_host_config(admin_host, spec),
            *check_admin_create_kwargs(admin_create),
            *check_admin_environment(self.environment, "environment"),
            *check_admin_labels(self.extra_labels, "extra_labels"),
        ]
        if self.network_name != self._hub_network:
            problems.append(f"network_name = {self.network_name!r} is refused: the hub's config "
                            f"sets {self._hub_network!r} for every server, and an override or "
                            "hook may not move one server to another network")
        if problems:
            self._refuse(problems)
        body = await self._create_body(spec, admin_create, admin_host)
        host = body["HostConfig"]
        binds = list(bind_sources(host, await self._volume_info(host)))
        problems = violations(body, spec, binds)
        if problems:
            self._refuse(problems)
        created = await self.docker("create_container_from_config", body, self.container_name)
        try:
            problems = await self._probe_binds(created["Id"], binds)
        except BaseException:
            await self.docker("remove_container", created["Id"], force=True)
            raise
        if problems:
            await self.docker("remove_container", created["Id"], force=True)
            self._refuse(problems)
        return created

    async def check_allowed(self, image: str) -> str:
        # user_options["image"] is an image key, already checked in resolve()
        return self.image

    # --- lifecycle --------------------------------------------------------

    async def _check_engine_once(self) -> None:
        if QuotaSpawner._engine_checked:
            return
        QuotaSpawner._engine_checked = True
        try:
            QuotaSpawner._engine_info = await self.docker("info")
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)
        else:
            check_engine_info(QuotaSpawner._engine_info, self.log)

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

    def _forget_refused_options(self, choices: list[Choice]) -> None:
        # JupyterHub saved these options as the user's default before the start;
        # a plain start after a refused or failed one gets the last choice that
        # started, if the user still holds it, else their first choice.
        if self.orm_spawner is None:
            return
        kept = dict(self._started_options)
        try:
            resolve_choice(choices, kept)
        except OptionsError:
            kept = {}
        self.orm_spawner.user_options = kept
        if self.db is not None:
            self.db.commit()

    async def _our_container(self) -> dict[str, Any] | None:
        """The container with this server's name, if this hub made it; others are left alone.

        Containers made before hub ids were unique carry the prefix as their
        hub id, and count as this hub's.
        """
        existing = await self.get_object()
        if not existing:
            return None
        owner = (existing.get("Config", {}).get("Labels") or {}).get(HUB_LABEL)
        if owner in (self.hub_id, self.prefix):
            return existing
        self.object_id = ""
        self.log.error(
            "Container %s belongs to hub %r, not to this hub (%r); it is left alone. Give "
            "each hub on one engine its own QuotaSpawner.prefix.",
            self.object_name, owner, self.hub_id)
        raise web.HTTPError(500, "Your server cannot start: a container with its name "
                                 "belongs to another hub on this machine. An admin has "
                                 "to fix the hub's configuration.")

    async def start(self) -> tuple[str, int]:
        self._events = []
        self._spec = None
        self.remove = True  # whatever a hook or override said (the validator warns)
        await self._check_engine_once()
        pool = await self.gpu_pool()
        choices = await self.choices(pool)
        try:
            choice = await self.resolve(choices)
            self._apply_choice(choice)
            await self._our_container()
            ip, port = await self._start_choice(pool, choice, choices)
        except BaseException:
            self._forget_refused_options(choices)
            raise
        self._started_options = {"profile": choice.role.name, "image": choice.image.key}
        return ip, port

    async def _start_choice(
        self, pool: GpuPool, choice: Choice, choices: list[Choice]
    ) -> tuple[str, int]:
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
            await self._end_cpu_boost()
        except BaseException:
            self.release_port()
            pool.release(owner, "the start failed")
            raise
        finally:
            pool.starting.discard(owner)
        return ip, port

    async def _end_cpu_boost(self) -> None:
        """Set the role's CPU quota once the server answers, or stop the server."""
        spec, self._spec = self._spec, None
        if spec is None or spec.start_cpu_quota == spec.cpu_quota:
            return
        cpus = spec.cpu_quota / CPU_PERIOD
        try:
            await self.docker("update_container", self.container_id,
                              cpu_period=CPU_PERIOD, cpu_quota=spec.cpu_quota)
            info = await self.docker("inspect_container", self.container_id)
            got = (info.get("HostConfig") or {}).get("CpuQuota")
            if got != spec.cpu_quota:
                raise RuntimeError(f"the engine reports CpuQuota {got!r} after the update")
        except Exception as e:
            self.log.error("Could not set %s to its role's %g CPUs after the start boost (%s); "
                           "stopping it", self._log_name, cpus, e)
            try:
                await self.docker("remove_container", self.container_id, force=True)
            except Exception as remove_error:
                self.log.error("Could not remove %s: %s", self.object_name, remove_error)
            raise web.HTTPError(500, CPU_LIMIT_FAILED) from None
        self.log.info("%s answered; CPU quota set from the start boost (%g CPUs) to the "
                      "role's %g", self._log_name, spec.start_cpu_quota / CPU_PERIOD, cpus)
        self._progress(f"CPU limit set to the role's {cpus:g} CPUs", 80)

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
            self._started_options = dict(state.get("quota_choice", {}))

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
        try:
            # by name, always: DockerSpawner's poll() sets object_id from any
            # container with this name, another hub's too
            ours = await self._our_container()
        except web.HTTPError:
            ours = None  # another hub's container with this name: never stopped here
        if ours is None:
            # a start refused before any container was made, or one removed behind our back
            self.release_port()
            pool.forget(self.object_name, "the server stopped")
            return
        await super().stop(now=now)
        pool.forget(self.object_name, "the server stopped")
