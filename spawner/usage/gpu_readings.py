"""The watchdogs' ``gpu-usage`` documents (one per node, written by spawner/watchdog/app.py;
kept as spawner/usage/documents.py keeps every shared document), the one shape of a GPU
reading from NVML to the page, and how their readers judge them: how fresh a node's
readings are, which of several nodes' readings of one GPU is shown, their merge for the
host map and the class dashboard, and which GPUs another node's watchdog holds, so that
a watchdog does not call those lost.

- ``GpuSample``: one GPU as a watchdog reads it (its view of gpu/nvml.py's
  ``NvmlDevice``); the same object is judged by the watchdog's rules, written into the
  document, merged here and read by the host map;
- ``GpuUsage``: one node's document (``GPU_USAGE``): its GPUs, the servers it sees, the
  GPUs held idle and the host's figures; ``GpuUsage.state`` is the one place that says
  how fresh it is;
- ``merge_usage`` and ``read_usage``: every node's documents as one, as the pages read
  them; ``held_elsewhere``: the GPUs the other nodes' watchdogs hold.

Pure, but for ``read_usage``, which reads the documents (blocking).

Format of ``GpuUsage`` (``"version": 1``, fields are only ever added; epoch seconds,
bytes, CPUs, 0 to 1): ``time`` (the cycle's start), ``host`` (the host's name), ``node``
(the node whose watchdog wrote it; older documents name only their ``host``),
``interval`` (seconds between cycles, to judge freshness); ``gpus``: by UUID, ``index``
(None: never listed by this node's NVML), ``name``, ``utilization``, ``memory_used``,
``memory_total``, ``lost`` (NVML's reason, or None); ``servers``: by container name,
``user``, ``role``, ``gpus`` (held), ``gpu_memory`` (its own processes' memory, by UUID),
``cpus`` and ``memory`` (what it reserves: its role's CPUs and its memory limit),
``cpu_used`` and ``memory_used`` (this cycle's CPUs and memory working set; None when
not measured); ``idle``: the open ``gpu_idle`` incidents (a GPU reserved and idle):
``uuid``, ``server``, ``user``, ``since``, ``opened``; ``host_totals`` (none from a
watchdog older than the host figures): the servers together, ``servers`` (how many),
``cpus`` and ``memory`` (reserved), ``cpu_used`` and ``memory_used``, and the engine's
``engine_cpus`` and ``engine_memory`` (None when unknown).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from spawner.usage.documents import (
    DEFAULT_INTERVAL,
    GPU_USAGE,
    Documents,
    SharedDocument,
    number,
    number_or_none,
    stale_after,
    text_or_none,
)


def _index(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else -1


@dataclass
class GpuSample:
    """One GPU on a host (a whole GPU or a MIG instance) as its node's watchdog reads it
    from NVML: the one shape of a GPU reading, from the watchdog's cycle to the host map.

    ``lost`` is NVML's reason when it cannot read the GPU; its values are then None.
    ``processes`` and ``xids`` are the watchdog's alone, never written into the
    document: the host PIDs on the GPU say which container uses how much of it.
    """

    uuid: str
    index: int  # the GPU's index on the host; -1: never listed by this node's NVML
    name: str | None = "GPU"
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    utilization: float | None = None  # 0 to 1
    lost: str | None = None  # why NVML cannot read it (e.g. "GPU is lost"); None when fine
    # NVML's processes on it (gpu/nvml.py HostProcess: the host PID, its memory or None)
    processes: list[Any] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)  # XID errors since the last cycle

    @property
    def held(self) -> bool:
        """Whether the node that read this GPU holds it: its NVML reads it (not lost),
        or listed it and now cannot read it (lost, with an index). A lost reading
        without an index is of a GPU its NVML never listed: one that a container on its
        engine holds, which may be another node's."""
        return self.lost is None or self.index >= 0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index if self.index >= 0 else None, "name": self.name,
                "utilization": self.utilization, "memory_used": self.memory_used,
                "memory_total": self.memory_total, "lost": self.lost}

    @classmethod
    def from_json(cls, data: Any, uuid: str = "") -> GpuSample | None:
        """The reading of GPU ``uuid`` in a document's ``gpus``; None when it is not one."""
        if isinstance(data, GpuSample):
            return data
        if not isinstance(data, dict):
            return None
        lost = data.get("lost")
        return cls(uuid, _index(data.get("index")), name=text_or_none(data.get("name")),
                   memory_used=number_or_none(data.get("memory_used")),
                   memory_total=number_or_none(data.get("memory_total")),
                   utilization=number_or_none(data.get("utilization")),
                   lost=None if lost is None else str(lost))


@dataclass(frozen=True)
class ServerReading:
    """A notebook server as one node's watchdog saw it in a cycle."""

    user: str | None = None
    role: str | None = None
    gpus: tuple[str, ...] = ()  # the GPUs it holds (its labels)
    gpu_memory: dict[str, int] = field(default_factory=dict)  # its processes', by UUID
    cpus: float | None = None  # what it reserves: its role's CPUs
    memory: int | None = None  # ... and its memory limit, bytes
    cpu_used: float | None = None  # CPUs used over the cycle; None: not measured
    memory_used: int | None = None  # memory working set, bytes

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "role": self.role, "gpus": list(self.gpus),
                "gpu_memory": dict(sorted(self.gpu_memory.items())), "cpus": self.cpus,
                "memory": self.memory, "cpu_used": self.cpu_used,
                "memory_used": self.memory_used}

    @classmethod
    def from_json(cls, data: Any) -> ServerReading | None:
        if not isinstance(data, dict):
            return None
        gpus, memory = data.get("gpus"), data.get("gpu_memory")
        return cls(
            user=text_or_none(data.get("user")), role=text_or_none(data.get("role")),
            gpus=tuple(u for u in gpus if isinstance(u, str)) if isinstance(gpus, list)
            else (),
            gpu_memory={u: m for u, m in memory.items() if isinstance(u, str) and number(m)}
            if isinstance(memory, dict) else {},
            cpus=number_or_none(data.get("cpus")), memory=number_or_none(data.get("memory")),
            cpu_used=number_or_none(data.get("cpu_used")),
            memory_used=number_or_none(data.get("memory_used")))


@dataclass(frozen=True)
class IdleGpu:
    """An open ``gpu_idle`` incident: a GPU that a server reserves and does not use."""

    uuid: str
    server: str | None  # the container's name
    user: str | None
    since: float | None  # idle since (epoch seconds)
    opened: float | None  # when the incident was opened

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "server": self.server, "user": self.user,
                "since": self.since, "opened": self.opened}

    @classmethod
    def from_json(cls, data: Any) -> IdleGpu | None:
        if not isinstance(data, dict) or not isinstance(data.get("uuid"), str) \
                or not data["uuid"]:
            return None
        return cls(data["uuid"], text_or_none(data.get("server")),
                   text_or_none(data.get("user")), number_or_none(data.get("since")),
                   number_or_none(data.get("opened")))


@dataclass(frozen=True)
class HostTotals:
    """The hub's servers on a host, together: what they reserve and what they used this
    cycle (watchdog/model.py ``HostFigures``), and what the engine has."""

    servers: int | None = None
    cpus: float | None = None  # reserved
    memory: int | None = None  # reserved, bytes
    cpu_used: float | None = None
    memory_used: int | None = None
    engine_cpus: float | None = None  # None: unknown
    engine_memory: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"servers": self.servers, "cpus": self.cpus, "memory": self.memory,
                "cpu_used": self.cpu_used, "memory_used": self.memory_used,
                "engine_cpus": self.engine_cpus, "engine_memory": self.engine_memory}

    @classmethod
    def from_json(cls, data: Any) -> HostTotals:
        """The totals in ``data``; each that is not a number is unknown."""
        found = data if isinstance(data, dict) else {}
        return cls(**{k: number_or_none(found.get(k)) for k in (
            "servers", "cpus", "memory", "cpu_used", "memory_used", "engine_cpus",
            "engine_memory")})


@dataclass(frozen=True)
class NodeState:
    """How fresh one node's readings are, in a merge."""

    node: str
    time: float
    state: str  # "fresh" or "stale"


@dataclass
class GpuUsage(SharedDocument):
    """``GPU_USAGE``: one node's readings in one watchdog cycle (the module's format);
    or, from ``merge_usage``, every node's as one, with ``nodes``."""

    KIND = GPU_USAGE
    VERSION = 1

    time: float  # the cycle's start, epoch seconds
    host: str | None = None  # the host's name, as the watchdog's messages say it
    node: str = ""  # the node whose watchdog wrote it (older documents: their host)
    interval: float = DEFAULT_INTERVAL  # seconds between the watchdog's cycles
    gpus: dict[str, GpuSample] = field(default_factory=dict)  # by UUID
    servers: dict[str, ServerReading] = field(default_factory=dict)  # by container name
    idle: list[IdleGpu] = field(default_factory=list)
    host_totals: HostTotals | None = None  # None: a watchdog older than the host figures
    nodes: list[NodeState] = field(default_factory=list)  # a merge's, never written

    def state(self, now: float) -> str:
        """"fresh" or "stale": how far the watchdog's numbers can be trusted at ``now``."""
        return "fresh" if now - self.time < stale_after(self.interval) else "stale"

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "version": self.VERSION, "time": self.time, "host": self.host,
            "node": self.node, "interval": self.interval,
            "gpus": {u: g.to_json() for u, g in sorted(self.gpus.items())},
            "servers": {n: s.to_json() for n, s in sorted(self.servers.items())},
            "idle": [i.to_json() for i in self.idle]}
        if self.host_totals is not None:
            found["host_totals"] = self.host_totals.to_json()
        return found

    @classmethod
    def from_json(cls, data: Any) -> GpuUsage | None:
        """The readings in ``data``; None when they are not this version's or have no
        time. Their parts that are not what they should be read as none."""
        if isinstance(data, GpuUsage):
            return data
        if not isinstance(data, dict) or data.get("version") != cls.VERSION \
                or not number(data.get("time")):
            return None
        gpus, servers, idle = (data.get(k) for k in ("gpus", "servers", "idle"))
        interval = data.get("interval")
        host = text_or_none(data.get("host"))
        readings = {u: GpuSample.from_json(g, u) for u, g in gpus.items()
                    if isinstance(u, str)} if isinstance(gpus, dict) else {}
        seen = {n: ServerReading.from_json(s) for n, s in servers.items()
                if isinstance(n, str)} if isinstance(servers, dict) else {}
        incidents = [IdleGpu.from_json(i) for i in idle] if isinstance(idle, list) else []
        return cls(
            time=data["time"], host=host,
            node=str(data.get("node") or host or ""),
            interval=interval if number(interval) and interval > 0 else DEFAULT_INTERVAL,
            gpus={u: g for u, g in readings.items() if g is not None},
            servers={n: s for n, s in seen.items() if s is not None},
            idle=[i for i in incidents if i is not None],
            host_totals=HostTotals.from_json(data["host_totals"])
            if "host_totals" in data else None)


def usage_state(usage: GpuUsage | dict[str, Any] | None, now: float) -> str:
    """"fresh", "stale" or "missing": how far a watchdog's numbers (the document, or its
    JSON) can be trusted at ``now``."""
    found = GpuUsage.from_json(usage)
    return found.state(now) if found is not None else "missing"


# --- one GPU, several readings ----------------------------------------------------------------


def reading_rank(gpu: GpuSample | dict[str, Any], time: float,
                 node: str) -> tuple[int, float, str]:
    """How one fresh node's reading of a GPU ranks among the readings of the same GPU
    (by UUID) by every fresh node; the highest is the one shown:

    1. a live reading (not lost: utilisation, memory, processes) over a lost one;
    2. a lost reading of a node that holds the GPU (``GpuSample.held``) over an unseen one;
    3. of two readings of the same kind, the fresher (its document's ``time``);
    4. at the same time, the node whose name sorts last.

    So a GPU read on its own node is never replaced by "lost" from a node that merely
    sees a container holding it, and the choice never depends on the order in which the
    documents were read or written."""
    reading = GpuSample.from_json(gpu)
    if reading is None:
        return -1, time, node
    kind = 2 if reading.lost is None else 1 if reading.held else 0
    return kind, time, node


def merge_usage(readings: Iterable[GpuUsage | dict[str, Any]],
                now: float) -> GpuUsage | None:
    """The watchdogs' readings as one, as the pages read a single watchdog's: from every
    fresh node, each GPU's best reading (``reading_rank``), servers by name (each the
    freshest node's, with its GPU memory on each GPU from the node whose reading of that
    GPU is shown, where that node sees the server too), their idle incidents together;
    the time, interval, host and host totals of the freshest. ``nodes``: every node's
    ``node``, ``time`` and ``state``, by node name, for the freshness line. None when
    there are no readings."""
    valid = [u for u in map(GpuUsage.from_json, readings) if u is not None]
    if not valid:
        return None
    # by node name, then time: nothing below depends on the order the rows were read
    valid.sort(key=lambda u: (u.node, u.time))
    freshest = max(valid, key=lambda u: (u.time, u.node))
    merged = replace(freshest, nodes=[NodeState(u.node, u.time, u.state(now)) for u in valid])
    fresh = [u for u in valid if u.state(now) == "fresh"]
    if not fresh:
        return merged
    best: dict[str, tuple[tuple[int, float, str], GpuSample, GpuUsage]] = {}
    for usage in fresh:
        for uuid, gpu in usage.gpus.items():
            rank = reading_rank(gpu, usage.time, usage.node)
            if uuid not in best or rank > best[uuid][0]:
                best[uuid] = (rank, gpu, usage)
    servers: dict[str, ServerReading] = {}
    for usage in sorted(fresh, key=lambda u: (u.time, u.node)):
        servers.update(usage.servers)  # the freshest last: it wins
    merged.gpus = {u: best[u][1] for u in sorted(best)}
    merged.servers = {name: _gpu_memory_of_shown(name, server, best)
                      for name, server in servers.items()}
    merged.idle = [i for u in fresh for i in u.idle]
    return merged


def _gpu_memory_of_shown(name: str, server: ServerReading,
                         best: dict[str, tuple[Any, GpuSample, GpuUsage]]) -> ServerReading:
    """The server with its memory on each GPU from the node whose reading of the GPU is
    shown (its processes are in that node's NVML), when that node sees the server."""
    memory = dict(server.gpu_memory)
    for uuid, (_, _, usage) in best.items():
        theirs = usage.servers.get(name)
        if theirs is not None:
            value = theirs.gpu_memory.get(uuid)
            if value is None:
                memory.pop(uuid, None)
            else:
                memory[uuid] = value
    return server if memory == server.gpu_memory else replace(server, gpu_memory=memory)


def read_usage(documents: Documents | None, now: float) -> GpuUsage | None:
    """Every watchdog's readings (``GPU_USAGE``) merged into one (``merge_usage``);
    blocking."""
    return merge_usage(GpuUsage.read_all(documents), now)


def held_elsewhere(readings: Iterable[GpuUsage | dict[str, Any]], node: str, now: float,
                   any_age: bool = False) -> dict[str, str]:
    """GPU UUID -> the other node whose fresh readings (of any age with ``any_age``) show
    it holds the GPU (``GpuSample.held``): the GPUs that ``node``'s watchdog leaves to
    that node's when its own NVML does not list them. The first such node by name, where
    several do."""
    found: dict[str, str] = {}
    for usage in sorted((u for u in map(GpuUsage.from_json, readings) if u is not None),
                        key=lambda u: u.node):
        if usage.node == node or (usage.state(now) == "stale" and not any_age):
            continue
        for uuid, gpu in usage.gpus.items():
            if gpu.held:
                found.setdefault(uuid, usage.node)
    return found
