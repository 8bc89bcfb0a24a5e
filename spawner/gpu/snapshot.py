"""The GPU pool and the host's room as a JSON document, for the admins' host map in
another process.

The hub holds the GPUs, the host's reservations and the queue in memory; the usage
service that draws the map is another process. So the pool publishes ``pool_snapshot`` as
the hub's ``GPUS`` document (spawner/usage/documents.py: a row of the ledger's database, or
``quota-spawner-gpus.json`` in the state folder of a hub without a ledger) whenever its
holdings or its queue change, at most once a second (``SnapshotWriter``). Its one shape
is ``PoolSnapshot``, below, which its readers (the host map, the table editor's
``hub_room``) read it back as.

Format (``"version": 1``, ``PoolSnapshot.VERSION``; fields are only ever added; times are
epoch seconds, memory in bytes, CPUs as numbers of CPUs):

- ``version``, ``time`` (when it was taken), ``hub`` (the hub id);
- ``inventory``: ``source`` ("nvml", "declared", "none") and ``reason``;
- ``usage``: counts of GPUs ``total``, ``exclusive``, ``shared``, ``free``;
- ``gpus``: one object per GPU of the pool, in inventory order: ``uuid``,
  ``index``, ``name``, ``memory`` (None: unknown), ``parent`` (a MIG
  instance's GPU), ``state`` ("free", "exclusive" or "shared"), ``free_slots``
  (how many more shared holders it takes; None when free, 0 when exclusive),
  ``reserved_for`` (the owner a preemption keeps it for, or None) and
  ``holders``: ``owner`` (container name), ``user``, ``role``, ``mode``
  ("exclusive" or "shared:N"), ``memory_cap`` (a shared role's soft cap, or
  None), ``since`` (the server's start, None when unknown), ``evicting_for``
  (the owner whose preemption stops it, or None);
- ``queue_strategy``: the queue's strategy ("BestEffortFIFO" or "StrictFIFO"; none from a
  hub older than the strategies) and
  ``queue_fair``: true, the queue serves a user's first server before anyone's second
  (docs/preemption.md#the-queues-strategies);
- ``queue``: the waiting tickets in order: ``position`` (1-based), ``owner``,
  ``user``, ``role``, ``priority``, ``since``, ``gpus`` (how many asked; 0 for a
  CPU-only start, which waits for host room only), ``mode`` ("" for none),
  ``preempting`` (a preemption is under way for it), ``victims`` (the owners being
  stopped for it), ``reserved`` (the GPUs kept for it), ``cpus`` and ``memory`` (the
  host room it asks for; None when host admission is off), ``waiting_for`` (why it
  waits for room on the host, as a sentence with its own figures, or whom it is held
  behind; else None), ``behind`` (the owner of the older start it is held behind while
  it fits, or None) and ``user_servers`` (the servers its user has before it, held or
  asked for earlier: its place among equal priorities);
- ``host``: None when host admission is off (none at all from a hub older than the host
  figures), else the host's room
  (docs/deployment.md#host-capacity): ``cpus`` and ``memory`` (what the hub counts of
  the engine), ``kept_cpus`` and ``kept_memory`` (kept back for the hub, the proxy and
  the system), ``cpu_ratio`` and ``memory_ratio`` (the overcommit), ``share``
  (``cpus``, ``memory``: what the notebooks together may reserve), ``reserved``
  (``cpus``, ``memory``: what the servers hold now) and ``servers``: one per holder,
  by owner: ``owner``, ``user`` and ``role`` (None when the pool does not know them),
  ``cpus``, ``memory``.

A reader learns from it what the hub checks the quota table against (``hub_room``): its
GPU inventory, as ``GpuPool.capacity``, and its host's share, as ``HostCapacity``, so
that the table editor checks a table as this hub would, like ``quota-spawner validate
--gpus N --gpu-memory SIZE --engine``. The hub publishes it as soon as its runtime is
built (``GpuPool.set_host``), before any server starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from spawner.gpu.allocator import GpuAllocator, GpuRequest, Slot, Usage
from spawner.gpu.inventory import Inventory
from spawner.gpu.queue import GpuQueue
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.model import GpuCapacity
from spawner.usage.documents import (
    GPUS,
    SharedDocument,
    number,
    number_or_none,
    text_or_none,
)

WRITE_INTERVAL = 1.0  # seconds: the most often the file is written


# --- the document -------------------------------------------------------------------------


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _objects(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _index(value: Any) -> str | int | None:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Holder:
    """A server holding a GPU of the pool."""

    owner: str | None  # the container's name
    user: str | None = None  # None: the pool does not know it
    role: str | None = None
    mode: str | None = None  # "exclusive" or "shared:N"
    memory_cap: int | None = None  # a shared role's soft cap, bytes
    since: float | None = None  # the server's start; None: unknown
    evicting_for: str | None = None  # the owner whose preemption stops it

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "user": self.user, "role": self.role,
                "mode": self.mode, "memory_cap": self.memory_cap, "since": self.since,
                "evicting_for": self.evicting_for}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Holder:
        text = {k: text_or_none(data.get(k)) for k in ("owner", "user", "role", "mode",
                                                        "evicting_for")}
        return cls(**text, memory_cap=number_or_none(data.get("memory_cap")),
                   since=number_or_none(data.get("since")))


@dataclass(frozen=True)
class PoolGpu:
    """A GPU of the pool (a whole GPU or a MIG instance), in inventory order."""

    uuid: str | None
    index: str | int | None = None  # "0", or "0:1" for MIG instance 1 on GPU 0
    name: str | None = None
    memory: int | None = None  # bytes; None: unknown
    parent: str | None = None  # a MIG instance's GPU
    state: str | None = None  # "free", "exclusive" or "shared"
    free_slots: int | None = None  # shared holders it takes more; None free, 0 exclusive
    reserved_for: str | None = None  # the owner a preemption keeps it for
    holders: tuple[Holder, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.index, "name": self.name,
                "memory": self.memory, "parent": self.parent, "state": self.state,
                "free_slots": self.free_slots, "reserved_for": self.reserved_for,
                "holders": [h.to_json() for h in self.holders]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PoolGpu:
        text = {k: text_or_none(data.get(k)) for k in ("uuid", "name", "parent", "state",
                                                        "reserved_for")}
        return cls(**text, index=_index(data.get("index")),
                   memory=number_or_none(data.get("memory")),
                   free_slots=number_or_none(data.get("free_slots")),
                   holders=tuple(Holder.from_json(h) for h in _objects(data.get("holders"))))


@dataclass(frozen=True)
class Waiting:
    """A start in the wait queue (``queue``, in order); the module's format says each."""

    position: int | None
    owner: str | None
    user: str | None = None
    role: str | None = None
    priority: int | None = None
    since: float | None = None
    gpus: int | None = None  # how many it asks for; 0: a CPU-only start
    mode: str | None = None  # "" for none
    preempting: bool = False
    victims: tuple[str, ...] = ()
    reserved: tuple[str, ...] = ()
    user_servers: int | None = None
    cpus: float | None = None  # None: host admission is off
    memory: int | None = None
    waiting_for: str | None = None
    behind: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "owner": self.owner, "user": self.user,
                "role": self.role, "priority": self.priority, "since": self.since,
                "gpus": self.gpus, "mode": self.mode, "preempting": self.preempting,
                "victims": list(self.victims), "reserved": list(self.reserved),
                "user_servers": self.user_servers, "cpus": self.cpus, "memory": self.memory,
                "waiting_for": self.waiting_for, "behind": self.behind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Waiting:
        text = {k: text_or_none(data.get(k)) for k in ("owner", "user", "role", "mode",
                                                        "waiting_for", "behind")}
        numbers = {k: number_or_none(data.get(k)) for k in (
            "position", "priority", "since", "gpus", "user_servers", "cpus", "memory")}
        return cls(**text, **numbers, preempting=data.get("preempting") is True,
                   victims=_texts(data.get("victims")), reserved=_texts(data.get("reserved")))


@dataclass(frozen=True)
class Room:
    """CPUs and memory (bytes); each None when unknown."""

    cpus: float | None
    memory: int | None

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory": self.memory}

    @classmethod
    def from_json(cls, data: Any) -> Room | None:
        if not isinstance(data, dict):
            return None
        return cls(number_or_none(data.get("cpus")), number_or_none(data.get("memory")))


@dataclass(frozen=True)
class RoomServer:
    """A server's room on the host, by owner."""

    owner: str | None
    user: str | None  # None when the pool does not know them
    role: str | None
    cpus: float | None
    memory: int | None

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "user": self.user, "role": self.role,
                "cpus": self.cpus, "memory": self.memory}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoomServer:
        return cls(text_or_none(data.get("owner")), text_or_none(data.get("user")),
                   text_or_none(data.get("role")), number_or_none(data.get("cpus")),
                   number_or_none(data.get("memory")))


@dataclass(frozen=True)
class HostRoom:
    """The host's room, as the hub counts it (docs/deployment.md#host-capacity)."""

    cpus: float | None = None  # what the hub counts of the engine
    memory: int | None = None
    kept_cpus: float | None = None  # kept back for the hub, the proxy and the system
    kept_memory: int | None = None
    cpu_ratio: float | None = None  # the overcommit
    memory_ratio: float | None = None
    share: Room | None = None  # what the notebooks together may reserve
    reserved: Room | None = None  # what the servers hold now
    servers: tuple[RoomServer, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory": self.memory, "kept_cpus": self.kept_cpus,
                "kept_memory": self.kept_memory, "cpu_ratio": self.cpu_ratio,
                "memory_ratio": self.memory_ratio,
                "share": self.share.to_json() if self.share else None,
                "reserved": self.reserved.to_json() if self.reserved else None,
                "servers": [s.to_json() for s in self.servers]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostRoom:
        numbers = {k: number_or_none(data.get(k)) for k in (
            "cpus", "memory", "kept_cpus", "kept_memory", "cpu_ratio", "memory_ratio")}
        return cls(**numbers, share=Room.from_json(data.get("share")),
                   reserved=Room.from_json(data.get("reserved")),
                   servers=tuple(RoomServer.from_json(s) for s in _objects(data.get("servers"))))


ON, OFF, MISSING = "on", "off", "missing"  # host admission, as a snapshot says it


@dataclass(frozen=True)
class PoolSnapshot(SharedDocument):
    """``GPUS``: the hub's pool, its host's room and its queue (the module's format).
    ``host_state`` says what the document says of the host: ``on`` (``host``), ``off``
    (host admission is off) or ``missing`` (a hub older than the host figures)."""

    KIND = GPUS
    VERSION = 1

    time: float | None  # when it was taken; None: the document does not say
    hub: str | None = None  # the hub's id
    source: str | None = None  # the inventory's: "nvml", "declared", "none"
    reason: str | None = None  # ... and why it is what it is
    usage: Usage | None = None  # how many GPUs are held how
    gpus: tuple[PoolGpu, ...] | None = ()  # None: the document lists none, not even []
    queue_strategy: str | None = None  # None: a hub older than the strategies
    queue_fair: bool = False
    queue: tuple[Waiting, ...] = ()
    host: HostRoom | None = None
    host_state: str = MISSING

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "version": self.VERSION, "time": self.time, "hub": self.hub,
            "inventory": {"source": self.source, "reason": self.reason},
            "usage": {"total": self.usage.total, "exclusive": self.usage.exclusive,
                      "shared": self.usage.shared, "free": self.usage.free}
            if self.usage is not None else None,
            "gpus": [g.to_json() for g in self.gpus] if self.gpus is not None else None,
            "queue_strategy": self.queue_strategy, "queue_fair": self.queue_fair,
            "queue": [t.to_json() for t in self.queue]}
        if self.host_state != MISSING:
            found["host"] = self.host.to_json() if self.host is not None else None
        return found

    @classmethod
    def from_json(cls, data: Any) -> PoolSnapshot | None:
        """The pool in ``data``; None when it is not this version's. Its parts that are
        not what they should be read as unknown, or as none."""
        if isinstance(data, PoolSnapshot):
            return data
        if not isinstance(data, dict) or data.get("version") != cls.VERSION:
            return None
        inventory = data.get("inventory") if isinstance(data.get("inventory"), dict) else {}
        counts = data.get("usage")
        counts = [counts.get(k) for k in ("total", "exclusive", "shared", "free")] \
            if isinstance(counts, dict) else []
        host = data.get("host", "")  # an older hub writes none
        strategy = data.get("queue_strategy")
        return cls(
            time=number_or_none(data.get("time")), hub=text_or_none(data.get("hub")),
            source=text_or_none(inventory.get("source")),
            reason=text_or_none(inventory.get("reason")),
            usage=Usage(*counts) if counts and all(map(number, counts)) else None,
            gpus=tuple(PoolGpu.from_json(g) for g in _objects(data["gpus"]))
            if isinstance(data.get("gpus"), list) else None,
            queue_strategy=text_or_none(strategy),
            queue_fair=data.get("queue_fair") is True,
            queue=tuple(Waiting.from_json(t) for t in _objects(data.get("queue"))),
            host=HostRoom.from_json(host) if isinstance(host, dict) else None,
            host_state=ON if isinstance(host, dict) else OFF if host is None else MISSING)


# --- the writer -----------------------------------------------------------------------------


class PoolView(Protocol):
    """What a snapshot reads of a GpuPool."""

    inventory: Inventory
    allocator: GpuAllocator
    queue: GpuQueue
    servers: Mapping[str, Any]  # owner -> pool.Server (user, role, started)
    hub_id: str
    host: HostBook | None  # None: host admission is off


def _mode(request: GpuRequest | None) -> str:
    if request is None:
        return ""
    return f"shared:{request.share}" if request.shared else "exclusive"


def _cpus(value: float) -> float:
    return round(value, 3)  # sums of fractions of CPUs: no float noise in the file


def pool_snapshot(pool: PoolView, now: float, monotonic_now: float | None = None
                  ) -> dict[str, Any]:
    """The pool's GPUs, holders and queue at ``now`` (epoch), as the ``PoolSnapshot``'s
    JSON that is published.

    ``monotonic_now``: the queue's clock at ``now``, to turn its arrival times
    into epoch seconds (default: ``time.monotonic()``).
    """
    mono = time.monotonic() if monotonic_now is None else monotonic_now
    holders, reserved = pool.allocator.snapshot()
    evicting = dict(pool.queue.evicting)
    gpus = []
    for device in pool.inventory.devices:
        held = holders.get(device.uuid, {})
        slot = Slot.of(held.values())
        if not held:
            state, free_slots = "free", None
        elif slot.exclusive:
            state, free_slots = "exclusive", 0
        else:
            state, free_slots = "shared", max(0, slot.share - slot.count)
        rows = []
        for owner, request in sorted(held.items()):
            server = pool.servers.get(owner)
            rows.append(Holder(
                owner, user=getattr(server, "user", None), role=getattr(server, "role", None),
                mode=_mode(request), memory_cap=request.memory if request.shared else None,
                since=getattr(server, "started", None) or None,
                evicting_for=evicting.get(owner)))
        gpus.append(PoolGpu(
            device.uuid, device.index, device.name, device.memory, device.parent, state,
            free_slots, reserved.get(device.uuid), tuple(rows)))
    queue = []
    for position, ticket in enumerate(pool.queue.waiting(), 1):
        victims = ([v for v in ticket.plan.victims if evicting.get(v) == ticket.owner]
                   if ticket.plan is not None else [])
        room = ticket.host
        queue.append(Waiting(
            position, ticket.owner, ticket.user, ticket.role, ticket.priority,
            since=round(now - (mono - ticket.arrived), 1),
            gpus=ticket.request.count if ticket.request is not None else 0,
            mode=_mode(ticket.request), preempting=ticket.plan is not None,
            victims=tuple(victims),
            reserved=tuple(sorted(u for u, o in reserved.items() if o == ticket.owner)),
            user_servers=ticket.servers,
            cpus=_cpus(room.cpus) if room is not None else None,
            memory=room.memory if room is not None else None,
            waiting_for=ticket.room_sentence(),
            behind=ticket.behind.owner if ticket.behind is not None else None))
    return PoolSnapshot(
        time=round(now, 3), hub=pool.hub_id, source=pool.inventory.source,
        reason=pool.inventory.reason, usage=pool.allocator.usage(), gpus=tuple(gpus),
        queue_strategy=pool.queue.strategy, queue_fair=True, queue=tuple(queue),
        host=_host(pool.host, pool.servers) if pool.host is not None else None,
        host_state=ON if pool.host is not None else OFF).to_json()


def _host(book: HostBook, servers: Mapping[str, Any]) -> HostRoom:
    capacity, share, reserved = book.capacity, book.capacity.share, book.reserved
    rows = []
    for owner in sorted(book.owners()):
        room = book.holding(owner)
        assert room is not None
        server = servers.get(owner)
        rows.append(RoomServer(owner, getattr(server, "user", None),
                               getattr(server, "role", None), _cpus(room.cpus), room.memory))
    return HostRoom(
        _cpus(capacity.cpus), capacity.memory, _cpus(capacity.kept_cpus),
        capacity.kept_memory, capacity.cpu_ratio, capacity.memory_ratio,
        Room(_cpus(share.cpus), share.memory), Room(_cpus(reserved.cpus), reserved.memory),
        tuple(rows))


class SnapshotWriter:
    """Publishes a pool's snapshot after changes, at most every ``interval``.

    ``changed`` only marks the snapshot dirty and, on a running event loop,
    schedules one write; the write goes through ``publish`` (the runtime's: the
    ``GPUS`` document, saved on the event log's thread). Without it nothing is written.
    """

    def __init__(self, pool: PoolView, publish: Callable[[str], None] | None,
                 interval: float = WRITE_INTERVAL):
        self.pool = pool
        self._publish = publish  # the snapshot's JSON -> None, never blocking
        self.interval = interval
        self.dirty = False
        self.written = 0  # how many times it was published
        self._last = -float("inf")  # monotonic time of the last write
        self._timer: asyncio.TimerHandle | None = None
        self._body: dict | None = None  # the last written, less its time

    def changed(self) -> None:
        if self._publish is None:
            return
        self.dirty = True
        if self._timer is not None:
            return  # a write is already due: this change goes with it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test, a sync call): the next change on the loop writes
        delay = max(0.0, self._last + self.interval - time.monotonic())
        self._timer = loop.call_later(delay, self.write)

    def write(self) -> None:
        """Write now if dirty (the timer's call)."""
        self._timer = None
        if not self.dirty or self._publish is None:
            return
        self.dirty = False
        self._last = time.monotonic()
        snapshot = pool_snapshot(self.pool, time.time(), self._last)
        body = {k: v for k, v in snapshot.items() if k != "time"}
        if body == self._body:
            return  # nothing but the time moved
        self._body = body
        self.written += 1
        self._publish(json.dumps(snapshot, sort_keys=True))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None



# --- what a reader learns of the hub's room -----------------------------------------------


@dataclass(frozen=True)
class HubRoom:
    """What the hub checks the quota table against, as its snapshot tells it."""

    gpus: GpuCapacity  # the inventory: how many GPUs, and the smallest's memory
    host: HostCapacity | None  # the host's share; None when host admission is off
    time: float  # when the hub published it (epoch seconds)


def _count(value: Any) -> bool:
    return number(value) and value >= 0


def hub_room(snapshot: PoolSnapshot | Mapping[str, Any] | None) -> HubRoom | None:
    """The hub's room in ``snapshot`` (a ``PoolSnapshot``, or its JSON as read back); None
    when there is none, or it is of another version, lists no GPUs or has no time (a
    reader never fails on an odd document). A host part that cannot be read is taken as
    none."""
    pool = PoolSnapshot.from_json(snapshot)
    if pool is None or pool.gpus is None or not _count(pool.time):
        return None
    memories = [g.memory for g in pool.gpus]
    # as Inventory.smallest_memory: unknown when any GPU's memory is
    smallest = (min(memories) if memories and all(_count(m) for m in memories) else None)
    return HubRoom(GpuCapacity(len(pool.gpus), smallest), _host_of(pool.host),
                   float(pool.time))


def _host_of(host: HostRoom | None) -> HostCapacity | None:
    if host is None:
        return None
    values = [host.cpus, host.memory, host.kept_cpus, host.kept_memory, host.cpu_ratio,
              host.memory_ratio]
    if not all(_count(v) for v in values):
        return None
    cpus, memory, kept_cpus, kept_memory, cpu_ratio, memory_ratio = values
    try:
        return HostCapacity(float(cpus), int(memory), reserve_cpus=float(kept_cpus),
                            reserve_memory=int(kept_memory), cpu_ratio=float(cpu_ratio),
                            memory_ratio=float(memory_ratio))
    except ValueError:
        return None
