"""The host's CPUs and memory as a resource, as the Kubernetes scheduler counts a node's.

A server reserves its role's ``cpus`` and ``memory`` (its container's limits). The
notebooks' share of the host is what the engine has (or less, if an admin says so),
minus a reserve for the hub, the proxy and the system, times an overcommit ratio per
resource:

    share = (capacity - reserve) * ratio

A start is admitted while the reservations of the running servers plus its own stay
within the share of each resource. ``HostBook`` keeps the reservations by owner with
running sums, so a check costs the same with 2 servers as with 2,000 (bench/
admission_bench.py). Pure bookkeeping: no engine, no clock; docs/deployment.md#host-capacity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spawner.quota.model import Role
from spawner.quota.units import format_human

GiB = 2**30
# The documented defaults (docs/deployment.md#host-capacity).
# for the hub, the proxy, the engine and the system: a tenth of each, at most 1 CPU (CPU
# time is shared anyway) and at least 1 GiB of memory (what a hub and its proxy take)
RESERVE_SHARE = 0.10
RESERVE_CPUS_MAX = 1.0
RESERVE_MEMORY_MIN = 1 * GiB
# CPU is compressible: a busy host slows notebooks down, it kills none of them. Memory
# is not: past the share the kernel's OOM killer chooses what dies.
CPU_RATIO = 4.0
MEMORY_RATIO = 1.0


@dataclass(frozen=True)
class Reservation:
    """What one server holds of the host: CPUs and bytes of memory."""

    cpus: float = 0.0
    memory: int = 0

    @classmethod
    def of(cls, role: Role) -> Reservation:
        return cls(role.cpus, role.memory)

    def __add__(self, other: Reservation) -> Reservation:
        return Reservation(self.cpus + other.cpus, self.memory + other.memory)

    def __sub__(self, other: Reservation) -> Reservation:
        return Reservation(self.cpus - other.cpus, self.memory - other.memory)


NOTHING = Reservation()


def default_reserve_cpus(cpus: float) -> float:
    """The CPUs kept back for the hub, the proxy and the system on a host of ``cpus``:
    a tenth, at most 1."""
    return min(RESERVE_CPUS_MAX, round(cpus * RESERVE_SHARE, 3))


def default_reserve_memory(memory: int) -> int:
    """The memory kept back for the hub, the proxy and the system on a host of
    ``memory`` bytes: a tenth, at least 1 GiB, never more than the host."""
    return min(memory, max(RESERVE_MEMORY_MIN, int(memory * RESERVE_SHARE)))


@dataclass(frozen=True)
class HostCapacity:
    """The notebooks' share of one engine's host."""

    cpus: float  # the engine's CPUs (docker info NCPU), or fewer
    memory: int  # the engine's memory in bytes (docker info MemTotal), or less
    reserve_cpus: float | None = None  # None: default_reserve_cpus(cpus)
    reserve_memory: int | None = None  # None: default_reserve_memory(memory)
    cpu_ratio: float = CPU_RATIO
    memory_ratio: float = MEMORY_RATIO

    def __post_init__(self) -> None:
        for name in ("cpus", "reserve_cpus", "cpu_ratio", "memory_ratio"):
            value = getattr(self, name)
            if value is None:
                continue
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number, 0 or more (got {value!r})")
        if self.memory < 0 or (self.reserve_memory or 0) < 0:
            raise ValueError("memory sizes must be 0 or more")
        if self.cpu_ratio < 1 or self.memory_ratio < 1:
            # below 1 would keep back more: that is what the reserve is for
            raise ValueError("an overcommit ratio is at least 1")

    @classmethod
    def from_engine(cls, info: Mapping[str, Any], cpus: float | None = None,
                    memory: int | None = None, **settings: Any) -> HostCapacity:
        """From ``docker info``; ``cpus`` and ``memory`` lower it (an admin's figure
        above the engine's is not taken: the engine cannot give more than it has)."""
        engine_cpus = float(info.get("NCPU") or 0)
        engine_memory = int(info.get("MemTotal") or 0)
        found_cpus = min(engine_cpus, cpus) if cpus is not None else engine_cpus
        found_memory = min(engine_memory, memory) if memory is not None else engine_memory
        return cls(found_cpus, found_memory, **settings)

    @property
    def kept_cpus(self) -> float:
        return (default_reserve_cpus(self.cpus) if self.reserve_cpus is None
                else min(self.cpus, self.reserve_cpus))

    @property
    def kept_memory(self) -> int:
        return (default_reserve_memory(self.memory) if self.reserve_memory is None
                else min(self.memory, self.reserve_memory))

    @property
    def share(self) -> Reservation:
        """What the notebooks together may reserve."""
        cpus = (self.cpus - self.kept_cpus) * self.cpu_ratio
        memory = int((self.memory - self.kept_memory) * self.memory_ratio)
        return Reservation(cpus, memory)

    def servers_that_fit(self, role: Role) -> tuple[int, str]:
        """How many servers of ``role`` fit on an empty host, and what runs out first
        ("CPUs" or "memory")."""
        share = self.share
        by_cpus = math.floor(share.cpus / role.cpus + 1e-9) if role.cpus > 0 else math.inf
        by_memory = share.memory // role.memory if role.memory > 0 else math.inf
        if by_cpus < by_memory:  # a tie names memory, as a refusal does
            return int(min(by_cpus, 10**9)), "CPUs"
        return int(by_memory), "memory"

    def describe(self) -> str:
        """'2 CPUs and 23.5 GiB; 0.2 CPUs and 2.35 GiB kept back for the hub, the proxy
        and the system; notebooks may reserve 7.2 CPUs (4x) and 21.2 GiB (1x)'."""
        share = self.share
        return (f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''} and "
                f"{format_human(self.memory)}; {self.kept_cpus:g} "
                f"CPU{'s' if self.kept_cpus != 1 else ''} and "
                f"{format_human(self.kept_memory)} kept back for the hub, the proxy and "
                f"the system; notebooks may reserve {share.cpus:g} CPUs "
                f"({self.cpu_ratio:g}x) and {format_human(share.memory)} "
                f"({self.memory_ratio:g}x)")


@dataclass(frozen=True)
class Shortfall:
    """Why a start does not fit: the resource, what would be reserved with it, the share."""

    resource: str  # "CPUs" or "memory"
    wanted: float
    share: float

    def sentence(self) -> str:
        """'the host's memory is fully reserved: 30 GiB of 22 GiB'."""
        if self.resource == "memory":
            return (f"the host's memory is fully reserved: {format_human(self.wanted)} "
                    f"of {format_human(self.share)}")
        return f"the host's CPUs are fully reserved: {self.wanted:g} of {self.share:g}"


class HostBook:
    """The reservations of the running servers of one engine, by owner (the container)."""

    def __init__(self, capacity: HostCapacity):
        self.capacity = capacity
        self._held: dict[str, Reservation] = {}
        self._cpus = 0.0
        self._memory = 0
        self.version = 0  # changes with every hold and release
        self.released = 0  # how many holdings were released: room may have come free

    @property
    def reserved(self) -> Reservation:
        return Reservation(self._cpus, self._memory)

    def holding(self, owner: str) -> Reservation | None:
        return self._held.get(owner)

    def owners(self) -> Iterable[str]:
        return self._held.keys()

    def shortfall(self, want: Reservation, owner: str | None = None,
                  freed: Reservation = NOTHING) -> Shortfall | None:
        """None when ``want`` fits beside what is held (``owner``'s own holding, if
        any, counts as free: a restart replaces it; so does ``freed``, what servers
        about to stop hold); else what is full. Memory is named first: it is what the
        kernel cannot take back."""
        mine = self._held.get(owner) if owner is not None else None
        cpus = self._cpus - (mine.cpus if mine else 0.0) - freed.cpus + want.cpus
        memory = self._memory - (mine.memory if mine else 0) - freed.memory + want.memory
        share = self.capacity.share
        if want.memory and memory > share.memory:
            return Shortfall("memory", memory, share.memory)
        if want.cpus and cpus > share.cpus + 1e-9:
            return Shortfall("CPUs", cpus, share.cpus)
        return None

    def hold(self, owner: str, reservation: Reservation) -> None:
        """Record ``owner``'s reservation (replacing one it had). Never refuses: a
        container found running is counted as it is."""
        self.release(owner)
        self.version += 1
        self._held[owner] = reservation
        self._cpus += reservation.cpus
        self._memory += reservation.memory

    def release(self, owner: str) -> Reservation | None:
        found = self._held.pop(owner, None)
        if found is not None:
            self.version += 1
            self.released += 1
            self._cpus -= found.cpus
            self._memory -= found.memory
            if not self._held:  # no float drift once the host is empty
                self._cpus, self._memory = 0.0, 0
        return found
