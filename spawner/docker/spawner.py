"""QuotaSpawner: DockerSpawner sized from the role-based quota table.

The lifecycle only: what a start, a poll and a stop do, in order. Beside it: the
settings (config.py), what the user may start (choices.py), the container (container.py,
pure), this start's GPUs (gpus.py), what the hub process shares (runtime.py), the
engine's reads (engine.py); docs/architecture.md follows one spawn through them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dockerspawner import DockerSpawner
from jupyterhub.utils import maybe_future
from tornado import web

from spawner.contract import HUB_LABEL
from spawner.docker.choices import ChoicesMixin
from spawner.docker.config import QuotaSpawnerConfig
from spawner.docker.container import (
    CPU_PERIOD,
    ContainerPolicyError,
    ContainerSpec,
    admin_problems,
    create_body,
    refuse_any,
    violations,
)
from spawner.docker.engine import (
    engine_pool,
    set_cpu_quota,
    socket_probe_problems,
    volume_info,
)
from spawner.docker.gpus import GpuStart, start_time_for
from spawner.docker.home_body import HomeBind
from spawner.docker.homes import HomeStart
from spawner.docker.mounts import bind_sources
from spawner.docker.network import HostNetworkMixin, wait_for_port, warn_host_network
from spawner.docker.runtime import HubRuntime
from spawner.gpu.pool import mode_label, request_for
from spawner.policy import refusals
from spawner.policy.choices import shown
from spawner.policy.gpu import torch_reads_fraction
from spawner.quota.model import Choice
from spawner.usage.duties import record_end
from spawner.usage.sessions import ServerSession


class QuotaSpawner(HostNetworkMixin, ChoicesMixin, QuotaSpawnerConfig, DockerSpawner):
    """Spawns notebook containers whose size comes from the quota table.

    Every start reads the table afresh (hot reload), checks ``user_options``
    against the roles the user holds, and sets every limit from the role, so
    nothing carries over from an earlier spawn.
    """

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
        # Where the home is mounted, as the hub's config set it: the home of a size goes
        # there, and nothing else may (docker/home_body.py).
        self._hub_home_dir = self.home_dir
        self._home: HomeBind | None = None  # this start's home of a size, if it has one
        self._start_timeout = self.start_timeout  # as configured; a queued start gets more
        # the start task, and the container its first lookup found (get_object)
        self._looked_up: tuple[asyncio.Task[Any] | None, dict[str, Any] | None] = (None, None)
        if self.network_name == "host":
            warn_host_network(self.log)

    # --- the container -------------------------------------------------------

    def _apply_choice(self, choice: Choice) -> None:
        self.choice = choice
        self.image = choice.image.image

    def container_spec(self, frameworks: str = "") -> ContainerSpec:
        """What the quota decides about this start's container (``frameworks``: the
        image's label); the engine's CPUs (docker info) cap the start boost's."""
        assert self.choice is not None
        role = self.choice.role
        runtime = HubRuntime.of(self)
        engine_cpus = float((runtime.engine_info or {}).get("NCPU") or 0)
        return ContainerSpec(
            role=role, image_key=self.choice.image.key, image=self.choice.image.image,
            user_name=self.user.name, hub_id=self.hub_id, notebook_user=self.notebook_user,
            network_mode=self._hub_network, pids_default=self.pids_limit,
            gpu_uuids=self.gpu_uuids,
            gpu_mode=mode_label(request_for(role)) if self.gpu_uuids else "",
            gpu_device_memory=self._gpu_memory, extra_labels=dict(self.extra_labels),
            start_cpus=self.start_cpus(engine_cpus),
            torch_reads_fraction=torch_reads_fraction(frameworks),
            cgroup_parent=runtime.parent_cgroup.parent if runtime.parent_cgroup is not None else "",
            home=self._home, home_dir=self._hub_home_dir,
        )

    async def create_object(self) -> dict[str, Any]:
        """Create the container: the last step before the engine, whatever config did earlier."""
        labels = await HubRuntime.of(self).frameworks.get([self.image], self.docker, self.log)
        spec = self._spec = self.container_spec(labels.get(self.image, ""))
        admin_host = await self.admin_value(self.extra_host_config)
        admin_create = await self.admin_value(self.extra_create_kwargs)
        create = dict(image=spec.image, command=await self.get_command(),
                      environment=self.get_env(), volumes=self.volume_mount_points,
                      ports={f"{self.port}/tcp": None})
        host: dict[str, Any] = dict(binds=self.volume_binds, links=self.links,
                                    mounts=self.mount_binds, network_mode=self.network_name)
        if not self.use_internal_ip:
            host["port_bindings"] = {self.port: (self.host_ip,)}
        try:
            refuse_any(admin_problems(spec, host=admin_host, create=admin_create,
                                      environment=self.environment,
                                      extra_labels=self.extra_labels, network=self.network_name))
            body = create_body(self.client, spec, create, host, admin_create, admin_host)
            binds = list(bind_sources(body["HostConfig"],
                                      await volume_info(self.docker, body["HostConfig"])))
            refuse_any(violations(body, spec, binds))
            created = await self.docker("create_container_from_config", body, self.container_name)
            problems = None
            try:
                problems = await socket_probe_problems(self.client, created["Id"], binds,
                                                       self.executor)
            finally:
                if problems is None or problems:  # the probe failed, or found a socket
                    await self.docker("remove_container", created["Id"], force=True)
            refuse_any(problems)
        except ContainerPolicyError as e:
            self.log.error("Refused to create a container for %s; each setting below is not "
                           "allowed (docs/security.md):\n  %s", self.log_name,
                           "\n  ".join(e.problems))
            raise web.HTTPError(500, refusals.SETTING_REFUSED) from None
        return created

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The engine's threads for ``self.docker`` (``engine_threads`` of them, shared by
        every server), in place of DockerSpawner's single one."""
        return engine_pool(self.engine_threads)

    async def check_allowed(self, image: str) -> str:
        return self.image  # user_options["image"] is an image key, already checked in resolve()

    # --- the lifecycle -------------------------------------------------------

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

    async def _our_container(self) -> dict[str, Any] | None:
        """The container with this server's name, if this hub made it; others are left
        alone. Containers made before hub ids were unique carry the prefix as their hub id."""
        existing = await self.get_object()
        if not existing:
            return None
        owner = (existing.get("Config", {}).get("Labels") or {}).get(HUB_LABEL)
        if owner in (self.hub_id, self.prefix):
            return existing
        self.object_id = ""
        self.log.error("Container %s belongs to hub %r, not to this hub (%r); it is left "
                       "alone. Give each hub on one engine its own QuotaSpawner.prefix.",
                       self.object_name, owner, self.hub_id)
        raise web.HTTPError(500, refusals.OTHER_HUB)

    async def run_pre_spawn_hook(self) -> None:
        """Give a start that may wait for a GPU the time to wait, on top of the
        configured start_timeout, which the hub reads just after this."""
        await maybe_future(super().run_pre_spawn_hook())  # the config's hook may be sync
        self.start_timeout = self._start_timeout
        try:
            runtime = await self.quota_hub()
            role = (await self.resolve(await self.choices(runtime))).role
        except Exception:
            return  # start() refuses the same, with its message
        self.start_timeout = self._start_timeout + start_time_for(role, runtime)

    async def start(self) -> tuple[str, int]:
        self._events, self._spec = [], None
        self.remove = True  # whatever a hook or override said (the validator warns)
        runtime = await self.quota_hub()
        choices = await self.choices(runtime)
        try:
            choice = await self.resolve(choices)
            self._apply_choice(choice)
            refusal = await self.budget_refusal(runtime, choice.role)
            if refusal:
                self.log.warning("Refused %s: %s", self.log_name, refusal)
                raise web.HTTPError(403, refusal)
            existing = await self._our_container()
            ip, port = await self._start_choice(runtime, choice, choices, existing)
        except BaseException as e:
            self._forget_refused_options(choices)
            shown(e)
            raise
        self._started_options = {"profile": choice.role.name, "image": choice.image.key}
        return ip, port

    async def get_object(self) -> dict[str, Any] | None:
        """DockerSpawner's lookup by name; in this start's own call to DockerSpawner's
        start, the answer ``_our_container`` found moments before, without asking the
        engine again: nothing else makes a container of this name while its start is
        pending, and one made by another hub meanwhile fails the create (the name is taken)."""
        task, found = self._looked_up
        if task is not None and task is asyncio.current_task():
            self._looked_up = (None, None)
            return found
        return await super().get_object()

    async def _start_container(self, gpus: GpuStart, existing: dict[str, Any] | None,
                               choices: list[Choice]) -> tuple[str, int]:
        """DockerSpawner's start, told what the lookup at this start's beginning found."""
        self._looked_up = (asyncio.current_task(), existing)
        try:
            return await gpus.start_container(super().start, self.gpu_uuids,
                                              self.object_name, choices)
        finally:
            self._looked_up = (None, None)

    async def _start_choice(self, runtime: HubRuntime, choice: Choice,
                            choices: list[Choice],
                            existing: dict[str, Any] | None) -> tuple[str, int]:
        role = choice.role
        requested = time.time()
        # The resolved choice, for the REST API's server model (the culler reads the
        # role there); not saved as the user's default options.
        self.user_options = {**(self.user_options or {}),
                             "profile": role.name, "image": choice.image.key}
        owner = self.object_name
        self.log.info("Starting %s as role %s with image %s (%g CPUs, %d bytes memory, %d GPUs)",
                      self.log_name, role.name, choice.image.key, role.cpus, role.memory,
                      role.gpus)
        self._progress(f"Role {role.name} with {choice.image.display_name}", 10)
        runtime.pool.starting.add(owner)
        session = ServerSession(runtime.usage, self.hub_id, owner)
        await session.open(choice, self.user.name, self.name,
                           [g.name for g in self.user.groups], requested=requested)
        gpus = GpuStart(runtime, self.user.name, self.log_name, self.log, self._progress)
        self.gpu_uuids, self._gpu_memory, self._home = (), None, None
        try:
            # the home of the role's size, admitted and made ready before anything else
            self._home = await HomeStart(runtime, self.user.name, self.log_name, self.log,
                                         self._progress).prepare(role)
            # at once, after a wait in the queue or a preemption; else refused (gpus.py)
            self.gpu_uuids, self._gpu_memory = await gpus.assign(owner, role, choices)
            await session.gpus(role, self.gpu_uuids, self._gpu_memory)
            self._progress("Starting the container", 40)
            ip, port = await self._start_container(gpus, existing, choices)
            # the home's size where the hub keeps it (the disk label's); else no limit
            await session.started(self.container_id,
                                  self._home.size if self._home is not None else None)
            runtime.claim(owner, self)
            self._progress("Container started; waiting for the notebook server", 60)
            # The hub's own readiness check backs off to seconds; polling here is faster.
            await wait_for_port(ip, port, self.poll)
            await self._end_cpu_boost()
            await session.ready()
        except BaseException as e:
            self.release_port()
            runtime.pool.release(owner, "the start failed")
            await session.failed(e)
            raise
        finally:
            runtime.pool.starting.discard(owner)
        return ip, port

    async def _end_cpu_boost(self) -> None:
        """Set the role's CPU quota once the server answers, or stop the server."""
        spec, self._spec = self._spec, None
        if spec is None or spec.start_cpu_quota == spec.cpu_quota:
            return
        cpus = spec.cpu_quota / CPU_PERIOD
        try:
            await set_cpu_quota(self.docker, self.container_id, spec.cpu_quota, CPU_PERIOD)
        except Exception as e:
            self.log.error("Could not set %s to its role's %g CPUs after the start boost (%s); "
                           "stopping it", self.log_name, cpus, e)
            try:
                await self.docker("remove_container", self.container_id, force=True)
            except Exception as remove_error:
                self.log.error("Could not remove %s: %s", self.object_name, remove_error)
            raise web.HTTPError(500, refusals.CPU_LIMIT_FAILED) from None
        self.log.info("%s answered; CPU quota set from the start boost (%g CPUs) to the "
                      "role's %g", self.log_name, spec.start_cpu_quota / CPU_PERIOD, cpus)
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
            # after a hub restart: this container is ours, not a zombie (claimed before
            # the runtime's first sync), and it runs as the role it was started with
            HubRuntime.of(self).claim(self.object_name, self)
            self.user_options = {**(self.user_options or {}), **state.get("quota_choice", {})}
            self._started_options = dict(state.get("quota_choice", {}))

    async def poll(self) -> int | str | None:
        # The hub polls every running server at startup: the runtime's first sync (and
        # its zombie check) then runs, if the hub's start has not run it yet.
        runtime = await self.quota_hub()
        if await self._listed_running(runtime):
            return None
        status = await super().poll()
        if status is not None and self.object_name not in runtime.starting:
            runtime.forget(self.object_name, f"the container stopped ({status})")
            # the hub does not call stop() for a server that ended by itself
            await self._record_end(runtime, None)
        return status

    async def _listed_running(self, runtime: HubRuntime) -> bool:
        """Whether this server's container runs, from the listing the polls of this moment
        share (engine.py ``RunningContainers``); False sends the poll to DockerSpawner's
        own inspect, which says why it stopped, or finds a container it did not know."""
        if not self.object_id:
            return False
        try:
            return await runtime.running.running(self.object_id, self.docker)
        except Exception as e:
            self.log.debug("Listing the running containers failed (%s); inspecting %s", e,
                           self.object_name)
            return False

    async def stop(self, now: bool = False) -> None:
        runtime = await self.quota_hub()
        try:
            # by name, always: DockerSpawner's poll() sets object_id from any container
            # with this name, another hub's too
            ours = await self._our_container()
        except web.HTTPError:
            ours = None  # another hub's container with this name: never stopped here
        if ours is None:
            # a start refused before any container was made, or one removed behind our back
            self.release_port()
        else:
            await super().stop(now=now)
        runtime.forget(self.object_name, "the server stopped")
        await self._record_end(runtime, ours)

    async def _record_end(self, runtime: HubRuntime, container: dict[str, Any] | None) -> None:
        """Close this server's session in the ledger with why it ended."""
        if runtime.usage is not None:
            await runtime.usage.call(record_end, runtime.usage.ledger, runtime.docker_client,
                                     self.hub_id, self.object_name, container, self.log)
