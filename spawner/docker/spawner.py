"""QuotaSpawner: DockerSpawner sized from the role-based quota table.

The lifecycle only: what a start, a poll and a stop do, in order. The
settings are in config.py, what the user may start in choices.py, the
container in container.py (pure), the GPUs in gpu/, the table in quota/, the
engine's reads in engine.py, and what users are told in refusals.py.
docs/architecture.md follows one spawn through them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from docker.errors import APIError, NotFound
from dockerspawner import DockerSpawner
from jupyterhub.utils import maybe_future
from tornado import web

from spawner import refusals
from spawner.contract import HUB_LABEL
from spawner.docker.container import (
    CPU_PERIOD,
    ContainerPolicyError,
    ContainerSpec,
    admin_problems,
    create_body,
    refuse_any,
    violations,
)
from spawner.docker.engine import no_nvidia_runtime, socket_probe_problems, volume_info
from spawner.docker.mounts import bind_sources
from spawner.docker.network import HostNetworkMixin, wait_for_port, warn_host_network
from spawner.gpu.allocator import GpuRequest, NoGpuFree
from spawner.gpu.pool import STOP_TIMEOUT, GpuPool, Server, mode_label, request_for
from spawner.gpu.queue import Ticket
from spawner.policy.choices import ChoicesMixin
from spawner.policy.config import QuotaSpawnerConfig
from spawner.policy.gpu import torch_reads_fraction
from spawner.quota.model import Choice, Role
from spawner.quota.units import human_duration
from spawner.usage.duties import record_end
from spawner.usage.ledger import FAILED, NO_LEDGER, failure


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
        self._start_timeout = self.start_timeout  # as configured; a queued start gets more
        if self.network_name == "host":
            warn_host_network(self.log)

    # --- the container -------------------------------------------------------

    def _apply_choice(self, choice: Choice) -> None:
        self.choice = choice
        self.image = choice.image.image

    def container_spec(self, frameworks: str = "") -> ContainerSpec:
        """What the quota decides about this start's container (``frameworks``: the
        image's label)."""
        assert self.choice is not None
        role = self.choice.role
        engine_cpus = float((ChoicesMixin._engine_info or {}).get("NCPU") or 0)
        return ContainerSpec(
            role=role, image_key=self.choice.image.key, image=self.choice.image.image,
            user_name=self.user.name, hub_id=self.hub_id, notebook_user=self.notebook_user,
            network_mode=self._hub_network, pids_default=self.pids_limit,
            gpu_uuids=self.gpu_uuids,
            gpu_mode=mode_label(request_for(role)) if self.gpu_uuids else "",
            gpu_device_memory=self._gpu_memory, extra_labels=dict(self.extra_labels),
            start_cpus=self.start_cpus(engine_cpus),
            torch_reads_fraction=torch_reads_fraction(frameworks),
        )

    async def create_object(self) -> dict[str, Any]:
        """Create the container: the last step before the engine, whatever config did earlier."""
        labels = await ChoicesMixin._frameworks.get([self.image], self.docker, self.log)
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
                problems = await socket_probe_problems(self.client, created["Id"], binds)
            finally:
                if problems is None or problems:  # the probe failed, or found a socket
                    await self.docker("remove_container", created["Id"], force=True)
            refuse_any(problems)
        except ContainerPolicyError as e:
            self.log.error("Refused to create a container for %s; each setting below is not "
                           "allowed (docs/security.md):\n  %s", self._log_name,
                           "\n  ".join(e.problems))
            raise web.HTTPError(500, refusals.SETTING_REFUSED) from None
        return created

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

    async def _assign_gpus(self, pool: GpuPool, owner: str, choices: list[Choice]) -> None:
        """Hold the role's GPUs: at once, after a wait in the queue, or after a preemption."""
        assert self.choice is not None
        role = self.choice.role
        self.gpu_uuids, self._gpu_memory = (), None
        request = request_for(role)
        if request is None:
            return
        if request.count > len(pool.inventory.devices):  # no wait can ever serve it
            self._refuse_no_gpu(pool, request, role, choices)
        # an engine that cannot give GPUs: refused before it waits in the queue for one
        said = await pool.nvidia.missing_now() if pool.nvidia else None
        if said is not None:
            self._refuse_no_runtime(said, choices)
        ticket = pool.join(owner, Server(self.user.name, role.name, time.time()), role)
        try:
            if not ticket.grant.done():
                await self._wait_in_queue(pool, ticket, role, choices)
            self.gpu_uuids = ticket.grant.result()
            # its age (min_runtime, the estimates) counts from the grant, not the wait
            pool.servers[owner] = Server(self.user.name, role.name, time.time())
        except asyncio.CancelledError:  # the start was stopped while it waited
            pool.events.append("queue-left", hub=self.hub_id, user=self.user.name,
                               role=role.name, priority=role.priority, container=owner,
                               waited=round(time.monotonic() - ticket.arrived, 1))
            self.log.info("%s left the GPU queue: its start was stopped", self._log_name)
            raise
        finally:
            pool.leave(owner, f"the start of {self.user.name}'s server no longer waits "
                              "(stopped, refused or served)")
        self._gpu_memory = pool.inventory.smallest_memory(self.gpu_uuids)
        text = f"GPU {','.join(self.gpu_uuids)} assigned ({mode_label(request)})"
        self.log.info("%s: %s", self._log_name, text)
        self._progress(text, 30)

    async def _wait_in_queue(self, pool: GpuPool, ticket: Ticket, role: Role,
                             choices: list[Choice]) -> None:
        """Wait for ``ticket``'s grant, saying where it stands; a 503 when the wait ends."""
        arrived = time.monotonic()
        if role.queue_timeout <= 0 and ticket.plan is None:
            self._refuse_no_gpu(pool, ticket.request, role, choices)
        pool.events.append("queued", hub=self.hub_id, user=self.user.name, role=role.name,
                           priority=role.priority, container=ticket.owner,
                           position=pool.queue.position(ticket.owner)[0])
        said: tuple[Any, ...] = ()
        said_at, place = 0.0, 0
        while not ticket.grant.done():
            now = time.monotonic()
            deadline = arrived + role.queue_timeout
            if ticket.plan is not None:  # a preemption under way is waited for to its end
                ends = [r["deadline"] for r in pool.evictions.waiting_on(ticket.owner)] \
                    if pool.evictions else []
                if ends:
                    deadline = max(deadline, now + max(ends) - time.time() + STOP_TIMEOUT)
            if now >= deadline:
                waited = now - arrived
                pool.events.append("queue-timeout", hub=self.hub_id, user=self.user.name,
                                   role=role.name, priority=role.priority,
                                   container=ticket.owner, waited=round(waited, 1))
                message = refusals.queue_timeout(role, waited, place, pool.allocator.usage(),
                                                 choices)
                self.log.warning("Refused %s after %s in the GPU queue: %s", self._log_name,
                                 human_duration(waited), message)
                raise web.HTTPError(503, message)
            place = pool.queue.position(ticket.owner)[0] or place
            standing, text = self._queue_message(pool, ticket, role)
            # a message when the standing changes; the countdown only every 15 s
            if standing != said or now - said_at >= 15:
                if standing != said:
                    self.log.info("%s: %s", self._log_name, text)
                self._progress(text, 20)
                said, said_at = standing, now
            try:
                await asyncio.wait_for(asyncio.shield(ticket.grant), min(1.0, deadline - now))
            except TimeoutError:
                pass
        waited = time.monotonic() - arrived
        pool.events.append("queue-granted", hub=self.hub_id, user=self.user.name,
                           role=role.name, priority=role.priority, container=ticket.owner,
                           waited=round(waited, 1), preempted=bool(ticket.plan))
        self._progress(f"A GPU is yours after {human_duration(waited)} in the queue", 25)

    def _refuse_no_gpu(self, pool: GpuPool, request: GpuRequest, role: Role,
                       choices: list[Choice]) -> None:
        """Today's immediate 503: the role's GPUs are not free and it does not queue,
        or the hub could never serve them."""
        error = NoGpuFree(request, pool.allocator.usage(), pool.allocator.available(request))
        message = refusals.no_gpu(role, error, pool.inventory.plain_reason, choices)
        if pool.inventory.devices:
            self.log.warning("Refused %s: %s", self._log_name, message)
        else:  # the user reads why in plain words; the admin the technical reason
            self.log.warning("Refused %s: %s (GPU inventory: %s)", self._log_name, message,
                             pool.inventory.describe())
        raise web.HTTPError(503, message)

    def _refuse_no_runtime(self, said: str, choices: list[Choice]) -> None:
        """A GPU start on an engine without the NVIDIA runtime (``said``: its words)."""
        message = refusals.no_nvidia_runtime(choices)
        self.log.warning("Refused %s: the Docker engine has no NVIDIA runtime (%s)",
                         self._log_name, said)
        raise web.HTTPError(503, message)

    async def _refuse_if_no_runtime(self, pool: GpuPool, error: APIError,
                                    choices: list[Choice]) -> None:
        """The engine's refusal of this start's GPUs, turned into the plain refusal:
        its container removed (the caller releases the GPUs). Returns for any other error."""
        said = no_nvidia_runtime(error)
        if said is None or not self.gpu_uuids:
            return
        if pool.nvidia is not None:
            pool.nvidia.saw(said, f"the start of {self.object_name} (GPU "
                                  f"{','.join(self.gpu_uuids)})")
        try:
            await self.docker("remove_container", self.object_id or self.object_name,
                              force=True)
        except NotFound:
            pass
        except Exception as e:
            self.log.error("Could not remove %s: %s", self.object_name, e)
        self.object_id = ""
        self._refuse_no_runtime(said, choices)

    def _queue_message(self, pool: GpuPool, ticket: Ticket,
                       role: Role) -> tuple[tuple[Any, ...], str]:
        """Where this start stands (comparable) and, for the spawn page, whom it waits
        for and how long."""
        wanted = f"{role.gpus} {role.gpu_mode} GPU{'s' if role.gpus != 1 else ''}"
        pending = pool.evictions.waiting_on(ticket.owner) if pool.evictions else []
        if pending:
            whom = ", ".join(f"{r['user']}'s server (role '{r['role']}')" for r in pending)
            left = max(0.0, max(r["deadline"] for r in pending) - time.time())
            return (("preempting", whom), f"Waiting for {whom} to save its work and stop: it "
                    f"was preempted for you and stops in {human_duration(left)}. Its GPU is "
                    "kept for you.")
        place, total = pool.queue.position(ticket.owner)
        text = (f"Waiting for {wanted} for the role '{role.name}': number {place} of {total} "
                f"in the queue (by priority, then arrival).")
        due = pool.next_release(ticket)
        if due is not None:
            left = human_duration(due[0] - time.time())
            text += f" The next GPU may come free in about {left}, when {due[1]}."
        return ("queued", place, total, due[1] if due else ""), text

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
            pool = await self.gpu_pool()
            choices = await self.choices(pool)
            role = (await self.resolve(choices)).role
        except Exception:
            return  # start() refuses the same, with its message
        if request_for(role) is None:
            return
        extra = role.queue_timeout
        if role.may_preempt:
            extra += max((r.grace_period for r in pool.roles.values()), default=0) + STOP_TIMEOUT
        self.start_timeout = self._start_timeout + int(extra)

    async def start(self) -> tuple[str, int]:
        self._events, self._spec = [], None
        self.remove = True  # whatever a hook or override said (the validator warns)
        await self._check_engine_once()
        pool = await self.gpu_pool()
        choices = await self.choices(pool)
        try:
            choice = await self.resolve(choices)
            self._apply_choice(choice)
            refusal = await self.budget_refusal(pool, choice.role)
            if refusal:
                self.log.warning("Refused %s: %s", self._log_name, refusal)
                raise web.HTTPError(403, refusal)
            await self._our_container()
            ip, port = await self._start_choice(pool, choice, choices)
        except BaseException:
            self._forget_refused_options(choices)
            raise
        self._started_options = {"profile": choice.role.name, "image": choice.image.key}
        return ip, port

    async def _start_choice(self, pool: GpuPool, choice: Choice,
                            choices: list[Choice]) -> tuple[str, int]:
        role = choice.role
        requested = time.time()
        # The resolved choice, for the REST API's server model (the culler reads the
        # role there); not saved as the user's default options.
        self.user_options = {**(self.user_options or {}),
                             "profile": role.name, "image": choice.image.key}
        owner = self.object_name
        self.log.info("Starting %s as role %s with image %s (%g CPUs, %d bytes memory, %d GPUs)",
                      self._log_name, role.name, choice.image.key, role.cpus, role.memory,
                      role.gpus)
        self._progress(f"Role {role.name} with {choice.image.display_name}", 10)
        pool.starting.add(owner)
        usage = pool.usage or NO_LEDGER
        await usage.open(hub=self.hub_id, user=self.user.name, server=self.name,
                         container=owner, role=role.name, image=choice.image.key,
                         cpu_limit=role.cpus, mem_limit=role.memory, requested=requested,
                         groups=[g.name for g in self.user.groups])
        try:
            await self._assign_gpus(pool, owner, choices)
            if self.gpu_uuids:
                request = request_for(role)
                assert request is not None
                await usage.set_gpus(self.hub_id, owner, self.gpu_uuids, mode_label(request),
                                     role.gpu_memory if request.shared else self._gpu_memory)
            self._progress("Starting the container", 40)
            try:
                ip, port = await super().start()
            except APIError as e:
                await self._refuse_if_no_runtime(pool, e, choices)
                raise
            if self.gpu_uuids and pool.nvidia is not None:
                pool.nvidia.worked()
            await usage.started(self.hub_id, owner, self.container_id)
            pool.claim(owner, self)
            self._progress("Container started; waiting for the notebook server", 60)
            # The hub's own readiness check backs off to seconds; polling here is faster.
            await wait_for_port(ip, port, self.poll)
            await self._end_cpu_boost()
            await usage.ready(self.hub_id, owner)
        except BaseException as e:
            self.release_port()
            pool.release(owner, "the start failed")
            await usage.close(self.hub_id, owner, FAILED, detail=failure(e))
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
            raise web.HTTPError(500, refusals.CPU_LIMIT_FAILED) from None
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
            # after a hub restart: this container is ours, not a zombie, and it runs
            # as the role it was started with, whatever was saved
            ChoicesMixin._claimed.add(self.object_name)
            ChoicesMixin._spawners[self.object_name] = self
            self.user_options = {**(self.user_options or {}), **state.get("quota_choice", {})}
            self._started_options = dict(state.get("quota_choice", {}))

    async def poll(self) -> int | str | None:
        # The hub polls every running server at startup: the pool (and its zombie
        # check) starts then, not only at the first spawn.
        pool = await self.gpu_pool()
        status = await super().poll()
        if status is not None and self.object_name not in pool.starting:
            pool.forget(self.object_name, f"the container stopped ({status})")
            # the hub does not call stop() for a server that ended by itself
            await self._record_end(pool, None)
        return status

    async def stop(self, now: bool = False) -> None:
        pool = await self.gpu_pool()
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
        pool.forget(self.object_name, "the server stopped")
        await self._record_end(pool, ours)

    async def _record_end(self, pool: GpuPool, container: dict[str, Any] | None) -> None:
        """Close this server's session in the ledger with why it ended."""
        if pool.usage is not None:
            await pool.usage.call(record_end, pool.usage.ledger, self.client, self.hub_id,
                                  self.object_name, container, self.log)
