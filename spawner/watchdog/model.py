"""What one watchdog cycle sees: the notebook servers of this host and their usage, the
host's GPUs, each a ``GpuSample`` (spawner/usage/gpu_readings.py, the one shape of a
GPU reading, which the cycle's ``gpu-usage`` document carries to the host map), and the
users' homes (``DiskReading``, homes.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spawner.contract import (
    GPU_MODE_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
    labelled_disk,
    labelled_gpus,
)
from spawner.homes.base import HomeUse, Space
from spawner.usage.gpu_readings import GpuSample


@dataclass(frozen=True)
class Server:
    """A notebook container of a hub, as its labels, host config and environment say."""

    container_id: str  # the engine's full id
    name: str  # the container name, e.g. "quota-alice"
    user: str  # quota-spawner.user
    role: str  # quota-spawner.role
    image: str  # quota-spawner.image (the table's image key)
    hub_id: str  # quota-spawner.hub
    gpus: tuple[str, ...] = ()  # quota-spawner.gpus
    gpu_mode: str = ""  # quota-spawner.gpu-mode: "exclusive", "shared:N" or ""
    memory_limit: int | None = None  # HostConfig.Memory, bytes
    cpus: float | None = None  # HostConfig.CpuQuota / CpuPeriod
    # what it reserves of the host: the role's CPUs (CPU_LIMIT), which the quota above
    # exceeds during the start boost; else its CPU limit
    cpus_reserved: float | None = None
    gpu_memory_limit: int | None = None  # GPU_MEMORY_LIMIT (shared roles), bytes
    pid: int = 0  # the main process's PID on the host
    started: float | None = None  # when the container started, epoch seconds
    disk: int | None = None  # quota-spawner.disk: its home's size at its start, bytes

    @classmethod
    def from_labels(cls, labels: Mapping[str, str], **found: Any) -> Server:
        """Who, which role, image, hub, GPU mode and home size from the contract's labels (a
        container's, or a pod's annotations), and ``found``: what the engine or the node
        says. The GPUs the labels name, else ``found["gpus"]``."""
        fallback = tuple(found.pop("gpus", ()))
        return cls(user=labels[USER_LABEL], role=labels.get(ROLE_LABEL, ""),
                   image=labels.get(IMAGE_LABEL, ""), hub_id=labels.get(HUB_LABEL, ""),
                   gpu_mode=labels.get(GPU_MODE_LABEL, ""),
                   gpus=labelled_gpus(labels) or fallback, disk=labelled_disk(labels),
                   **found)

    @property
    def shared_gpu(self) -> bool:
        return self.gpu_mode.startswith("shared")


@dataclass
class ServerSample:
    """One server's usage in this cycle."""

    server: Server
    gpu_memory: dict[str, int] = field(default_factory=dict)  # its own processes, per GPU
    memory_working_set: int | None = None  # usage minus inactive file cache, bytes
    cpu_used: float | None = None  # CPUs (cores) used over the cycle
    oom_kills: int = 0  # the cgroup's OOM-kill counter, cumulative
    home_used: int | None = None  # bytes in its home (the cycle's one quota query)
    home: str | None = None  # its user's home's name, when the watchdog reads the homes


@dataclass(frozen=True)
class DiskReading:
    """The users' homes on this host in one cycle (homes.py): the mechanism that keeps
    them (its sentence, as the hub logs it), every home's use by name (one quota query;
    empty where disk is not enforced, None when it could not be read this cycle) and
    the filesystem that holds them (None where unknown). ``enforced`` None: the homes
    could not be opened (``error`` says why)."""

    mechanism: str
    enforced: bool | None
    sentence: str = ""
    homes: dict[str, HomeUse] | None = None
    space: Space | None = None
    error: str = ""

    @property
    def reserved(self) -> int | None:
        """What the homes' sizes reserve of the filesystem together: their limits' sum."""
        if self.homes is None:
            return None
        return sum(h.limit for h in self.homes.values() if h.limit is not None)


def home_size(server: Server, use: HomeUse | None) -> int | None:
    """A home's size: what its server's quota-spawner.disk label says it started with, else
    the limit its quota enforces; None: no size."""
    return server.disk or (use.limit if use is not None else None)


def homes_of(snapshot: Snapshot) -> dict[str, Server]:
    """Each home a running server uses, by name, with one of its servers (the first by
    container name: a user's several servers share one home)."""
    found: dict[str, Server] = {}
    for sample in sorted(snapshot.servers.values(), key=lambda s: s.server.name):
        if sample.home is not None:
            found.setdefault(sample.home, sample.server)
    return found


@dataclass
class Snapshot:
    time: float  # epoch seconds
    host: str
    gpus: dict[str, GpuSample] = field(default_factory=dict)  # by UUID
    servers: dict[str, ServerSample] = field(default_factory=dict)  # by container id
    # Containers of this hub that hold GPUs but that no running hub server claims.
    zombies: list[Server] = field(default_factory=list)
    engine_cpus: float | None = None  # the engine's CPUs (docker info NCPU); None: unknown
    engine_memory: int | None = None  # the engine's memory in bytes (docker info MemTotal)
    # GPUs left to the other nodes' watchdogs that hold them (UUID -> node): not in
    # ``gpus``, as this host's NVML does not list them
    elsewhere: dict[str, str] = field(default_factory=dict)
    disk: DiskReading | None = None  # the homes; None when the watchdog does not read them


@dataclass(frozen=True)
class HostFigures:
    """The hub's servers on this host, together: what they reserve (the sum of their
    limits) and what they used this cycle (the sum of what was measured)."""

    servers: int
    cpus_reserved: float
    memory_reserved: int
    cpu_used: float | None  # None: servers, but none measured yet (a CPU rate needs two)
    memory_used: int | None

    @classmethod
    def of(cls, snapshot: Snapshot) -> HostFigures:
        samples = list(snapshot.servers.values())
        cpus = [s.cpu_used for s in samples if s.cpu_used is not None]
        memory = [s.memory_working_set for s in samples if s.memory_working_set is not None]
        return cls(
            servers=len(samples),
            cpus_reserved=round(sum(s.server.cpus_reserved or 0.0 for s in samples), 3),
            memory_reserved=sum(s.server.memory_limit or 0 for s in samples),
            cpu_used=round(sum(cpus), 3) if cpus or not samples else None,
            memory_used=sum(memory) if memory or not samples else None)
