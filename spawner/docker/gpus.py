"""The GPUs and host room of one start: held at once, after a wait in the queue, or refused.

``GpuStart`` is what QuotaSpawner delegates its GPUs, and its room on the host
(its role's CPUs and memory, when host admission is on), to. It joins the
pool's queue (gpu/queue.py), and while the start waits it tells the progress
page where it stands and whom or what it waits for; a preemption planned for it
is carried out by the evictor (docker/evictor.py), which this only reads. It
refuses, with a 503 and one plain sentence (policy/refusals.py), a role the hub could
never serve (more GPUs than it has, more than the host's share), an engine
without the NVIDIA runtime, and a wait past the role's ``queue_timeout``
(docs/preemption.md#the-wait-queue, docs/deployment.md#host-capacity).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from docker.errors import APIError, NotFound
from tornado import web

from spawner.docker.engine import no_nvidia_runtime
from spawner.docker.evictor import preemption_time
from spawner.docker.runtime import HubRuntime, Log
from spawner.gpu.allocator import GpuRequest, NoGpuFree
from spawner.gpu.pool import GpuPool, Server, mode_label, request_for
from spawner.gpu.queue import ORDER, Ticket
from spawner.host.fit import never_fits
from spawner.policy import refusals
from spawner.quota.model import Choice, Role
from spawner.quota.units import human_duration
from spawner.usage.events import Queued, QueueEvent, QueueGranted, QueueLeft, QueueTimeout

Progress = Callable[[str, int], None]  # a step for the progress page: (message, percent)
T = TypeVar("T")


def start_time_for(role: Role, runtime: HubRuntime) -> int:
    """The seconds a start of ``role`` may wait for GPUs, on top of the configured
    start_timeout: its queue_timeout, and a preemption's longest course if it may
    preempt. 0 for a role without GPUs."""
    if request_for(role) is None:
        return int(role.queue_timeout) if runtime.pool.host is not None else 0
    extra = role.queue_timeout
    if role.may_preempt:
        extra += preemption_time(runtime.pool.roles)
    return int(extra)


def beyond_host(pool: GpuPool, role: Role) -> str | None:
    """Why no wait can serve ``role`` on this host, with host admission on: "one server's
    32 GiB of memory is more than the notebooks' 21.2 GiB" (host/fit.py, as validate
    --engine and the table editor say it); None when one server fits."""
    return None if pool.host is None else never_fits(role, pool.host.capacity)


def never_starts(pool: GpuPool, role: Role) -> str | None:
    """What ``role`` needs more of than this hub could ever give, so that no wait can
    serve it: "GPUs" (more than the inventory), else ``beyond_host``'s sentence; None
    when it can start, now or after a wait. The spawn form disables such a role (choices.py)."""
    request = request_for(role)
    if request is not None and request.count > len(pool.inventory.devices):
        return "GPUs"
    return beyond_host(pool, role)


class GpuStart:
    """The GPUs of one start of ``user``'s server (``who``: its name in the log)."""

    def __init__(self, runtime: HubRuntime, user: str, who: str, log: Log,
                 progress: Progress):
        self.runtime = runtime
        self.pool = runtime.pool
        self.user = user
        self.who = who
        self.log = log
        self.progress = progress

    async def assign(self, owner: str, role: Role,
                     choices: list[Choice]) -> tuple[tuple[str, ...], int | None]:
        """Hold ``role``'s GPUs for container ``owner``: the UUIDs, and the smallest one's
        memory. ((), None) for a role without GPUs; a 503 when refused."""
        pool = self.pool
        request = request_for(role)
        if request is None and pool.host is None:
            return (), None
        self.refuse_never(role, choices)
        if request is not None:
            # an engine that cannot give GPUs: refused before it waits in the queue for one
            nvidia = self.runtime.nvidia
            said = await nvidia.missing_now() if nvidia is not None else None
            if said is not None:
                self.refuse_no_runtime(said, choices)
        ticket = pool.join(owner, Server(self.user, role.name, time.time()), role)
        try:
            if not ticket.grant.done():
                await self._wait(ticket, role, choices)
            uuids = ticket.grant.result()
            # its age (min_runtime, the estimates) counts from the grant, not the wait
            pool.servers[owner] = Server(self.user, role.name, time.time())
        except asyncio.CancelledError:  # the start was stopped while it waited
            self._event(QueueLeft, ticket, role,
                        waited=round(time.monotonic() - ticket.arrived, 1))
            self.log.info("%s left the GPU queue: its start was stopped", self.who)
            raise
        finally:
            pool.leave(owner, f"the start of {self.user}'s server no longer waits "
                              "(stopped, refused or served)")
        if request is None:  # host room only
            return (), None
        memory = pool.inventory.smallest_memory(uuids)
        text = f"GPU {','.join(uuids)} assigned ({mode_label(request)})"
        self.log.info("%s: %s", self.who, text)
        self.progress(text, 30)
        return uuids, memory  # the spawner's session records them (usage/sessions.py)

    def _event(self, event: type[QueueEvent], ticket: Ticket, role: Role,
               **fields: Any) -> None:
        self.pool.events.append(event(hub=self.runtime.hub_id, user=self.user,
                                      role=role.name, priority=role.priority,
                                      container=ticket.owner, **fields))

    async def _wait(self, ticket: Ticket, role: Role, choices: list[Choice]) -> None:
        """Wait for ``ticket``'s grant, saying where it stands; a 503 when the wait ends."""
        pool = self.pool
        arrived = time.monotonic()
        if role.queue_timeout <= 0 and ticket.plan is None:
            room = ticket.room_sentence()
            if room is not None:
                self._refuse(refusals.host_full(role, room, None, 1))
            assert ticket.request is not None
            self.refuse_no_gpu(ticket.request, role, choices)
        self._event(Queued, ticket, role, position=pool.queue.position(ticket.owner)[0])
        said: tuple[Any, ...] = ()
        said_at, place = 0.0, 0
        while not ticket.grant.done():
            now = time.monotonic()
            deadline = arrived + role.queue_timeout
            if ticket.plan is not None:  # a preemption under way is waited for to its end
                stops_by = self.runtime.evictor.stops_by(ticket.owner)
                if stops_by is not None:
                    deadline = max(deadline, now + stops_by - time.time())
            if now >= deadline:
                waited = now - arrived
                self._event(QueueTimeout, ticket, role, waited=round(waited, 1))
                room = ticket.room_sentence()
                message = (refusals.host_full(role, room, waited, place) if room is not None
                           else refusals.queue_timeout(role, waited, place,
                                                       pool.allocator.usage(), choices))
                self.log.warning("Refused %s after %s in the queue: %s", self.who,
                                 human_duration(waited), message)
                raise web.HTTPError(503, message)
            place = pool.queue.position(ticket.owner)[0] or place
            standing, text = self._standing(ticket, role)
            # a message when the standing changes; the countdown only every 15 s
            if standing != said or now - said_at >= 15:
                if standing != said:
                    self.log.info("%s: %s", self.who, text)
                self.progress(text, 20)
                said, said_at = standing, now
            try:
                await asyncio.wait_for(asyncio.shield(ticket.grant), min(1.0, deadline - now))
            except TimeoutError:
                pass
        waited = time.monotonic() - arrived
        self._event(QueueGranted, ticket, role, waited=round(waited, 1),
                    preempted=bool(ticket.plan))
        what = "A GPU is" if ticket.request is not None else "Room on the host is"
        self.progress(f"{what} yours after {human_duration(waited)} in the queue", 25)

    def _standing(self, ticket: Ticket, role: Role) -> tuple[tuple[Any, ...], str]:
        """Where this start stands (comparable) and, for the spawn page, whom it waits
        for and how long."""
        pending = self.runtime.evictor.waiting_on(ticket.owner)
        if pending:
            whom = ", ".join(f"{r['user']}'s server (role '{r['role']}')" for r in pending)
            left = max(0.0, max(r["deadline"] for r in pending) - time.time())
            kept = "Its room on the host" if ticket.short is not None else "Its GPU"
            return (("preempting", whom), f"Waiting for {whom} to save its work and stop: it "
                    f"was preempted for you and stops in {human_duration(left)}. {kept} is "
                    "kept for you.")
        place, total = self.pool.queue.position(ticket.owner)
        where = f"{place} of {total} in the queue ({self.pool.queue.policy}: {ORDER})"
        room = ticket.room_sentence()
        if room is not None:
            short, behind = ticket.short, ticket.behind
            if behind is None:
                when = "a server stops"
            elif behind.short is not None:
                when = "that start is served or leaves the queue"
            else:
                when = "its preemption is over and room is left"
            return (("host", short.resource if short else None,
                     behind.owner if behind else None, place, total),
                    f"Waiting for room on the host for the role '{role.name}': {room}. "
                    f"Number {where}; you start when {when}.")
        wanted = f"{role.gpus} {role.gpu_mode} GPU{'s' if role.gpus != 1 else ''}"
        text = f"Waiting for {wanted} for the role '{role.name}': number {where}."
        due = self.pool.next_release(ticket)
        if due is not None:
            left = human_duration(due[0] - time.time())
            text += f" The next GPU may come free in about {left}, when {due[1]}."
        return ("in-queue", place, total, due[1] if due else ""), text

    def refuse_never(self, role: Role, choices: list[Choice]) -> None:
        """The immediate 503 for a role that can never start on this hub
        (``never_starts``); nothing for one that can."""
        never = never_starts(self.pool, role)
        if never == "GPUs":
            request = request_for(role)
            assert request is not None
            self.refuse_no_gpu(request, role, choices)
        if never is not None:
            assert self.pool.host is not None
            share = self.pool.host.capacity.share
            self._refuse(refusals.host_never_fits(role, share.cpus, share.memory))

    def refuse_no_gpu(self, request: GpuRequest, role: Role, choices: list[Choice]) -> NoReturn:
        """The immediate 503: the role's GPUs are not free and it does not queue, or the
        hub could never serve them."""
        pool = self.pool
        error = NoGpuFree(request, pool.allocator.usage(), pool.allocator.available(request))
        message = refusals.no_gpu(role, error, pool.inventory.plain_reason, choices)
        if pool.inventory.devices:
            self.log.warning("Refused %s: %s", self.who, message)
        else:  # the user reads why in plain words; the admin the technical reason
            self.log.warning("Refused %s: %s (GPU inventory: %s)", self.who, message,
                             pool.inventory.describe())
        raise web.HTTPError(503, message)

    def _refuse(self, message: str) -> NoReturn:
        self.log.warning("Refused %s: %s", self.who, message)
        raise web.HTTPError(503, message)

    def refuse_no_runtime(self, said: str, choices: list[Choice]) -> NoReturn:
        """A GPU start on an engine without the NVIDIA runtime (``said``: its words)."""
        message = refusals.no_nvidia_runtime(choices)
        self.log.warning("Refused %s: the Docker engine has no NVIDIA runtime (%s)",
                         self.who, said)
        raise web.HTTPError(503, message)

    async def start_container(self, start: Callable[[], Awaitable[T]], uuids: tuple[str, ...],
                              container: str, choices: list[Choice]) -> T:
        """``start()`` (DockerSpawner's start of ``container``, given ``uuids``), with the
        engine's refusal of the GPUs for want of the NVIDIA runtime turned into the plain
        503: recorded (the next GPU starts are refused before they queue), and the
        container removed; the caller releases the GPUs. A GPU container that starts
        tells the runtime is there."""
        try:
            started = await start()
        except APIError as e:
            said = no_nvidia_runtime(e)
            if said is None or not uuids:
                raise
            if self.runtime.nvidia is not None:
                self.runtime.nvidia.saw(said, f"the start of {container} (GPU "
                                              f"{','.join(uuids)})")
            await self._remove(container)
            self.refuse_no_runtime(said, choices)
        if uuids and self.runtime.nvidia is not None:
            self.runtime.nvidia.worked()
        return started

    async def _remove(self, container: str) -> None:
        try:
            await asyncio.to_thread(self.runtime.docker_client.remove_container, container,
                                    force=True)
        except NotFound:
            pass
        except Exception as e:
            self.log.error("Could not remove %s: %s", container, e)
