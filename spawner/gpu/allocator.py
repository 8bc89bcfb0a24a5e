"""Which GPUs a spawn gets: exclusive or shared, least-loaded, never double-booked.

Every decision is made under one lock, so concurrent spawns (a whole class
logging in at once) cannot pick the same free GPU. The allocator is pure
bookkeeping: it never calls Docker or NVML, and a decision for 64 GPUs takes
microseconds (bench/gpu_bench.py).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from spawner.gpu.inventory import GpuDevice


@dataclass(frozen=True)
class GpuRequest:
    count: int
    mode: str = "exclusive"  # or "shared"
    share: int = 1  # most holders of one GPU, in shared mode
    memory: int | None = None  # the soft cap each holder gets, in shared mode

    @property
    def shared(self) -> bool:
        return self.mode == "shared"


@dataclass(frozen=True)
class Holding:
    owner: str  # the container name
    uuids: tuple[str, ...]
    request: GpuRequest


@dataclass(frozen=True)
class Usage:
    """A snapshot of the pool, for messages and the spawn form."""

    total: int
    exclusive: int  # GPUs held by one exclusive user
    shared: int  # GPUs with shared holders
    free: int  # GPUs nobody holds


class NoGpuFree(Exception):
    """Not enough GPUs for a request; ``usage`` says how the pool stands."""

    def __init__(self, request: GpuRequest, usage: Usage, available: int):
        self.request = request
        self.usage = usage
        self.available = available
        super().__init__(
            f"{request.count} {request.mode} GPU(s) wanted, {available} available"
        )


class GpuAllocator:
    """Holdings of one hub's GPUs, keyed by owner (the container name)."""

    def __init__(self, devices: Sequence[GpuDevice] = ()):
        self._lock = threading.Lock()
        self._devices: dict[str, GpuDevice] = {d.uuid: d for d in devices}
        self._order = {d.uuid: i for i, d in enumerate(devices)}
        self._holders: dict[str, dict[str, GpuRequest]] = {d.uuid: {} for d in devices}
        self._holdings: dict[str, Holding] = {}
        self._free_memory: dict[str, int] = {}
        # GPU -> the owner it is kept for (a preemption's grace): nobody else takes it
        self._reserved: dict[str, str] = {}
        self._slots: dict[str, Slot] = {d.uuid: Slot() for d in devices}  # kept in step
        self.released = 0  # counts releases: only a release can make room
        self.version = 0  # counts every change of the holdings

    # --- reading ----------------------------------------------------------

    @property
    def devices(self) -> tuple[GpuDevice, ...]:
        return tuple(self._devices.values())

    def holding(self, owner: str) -> Holding | None:
        with self._lock:
            return self._holdings.get(owner)

    def holdings(self) -> dict[str, Holding]:
        with self._lock:
            return dict(self._holdings)

    def holders(self, uuid: str) -> list[str]:
        with self._lock:
            return list(self._holders.get(uuid, {}))

    def usage(self) -> Usage:
        with self._lock:
            return self._usage()

    def available(self, request: GpuRequest) -> int:
        """How many GPUs this request could take a place on right now."""
        with self._lock:
            return len(self._candidates(request))

    def candidates(self, request: GpuRequest, owner: str = "",
                   exclude: Collection[str] = ()) -> list[str]:
        """The GPUs ``owner`` could take for ``request`` now, best first."""
        with self._lock:
            return self._candidates(request, owner, exclude)

    def snapshot(self) -> tuple[dict[str, dict[str, GpuRequest]], dict[str, str]]:
        """Every GPU's holders, and the reservations, as copies (for preemption)."""
        with self._lock:
            return {u: dict(h) for u, h in self._holders.items()}, dict(self._reserved)

    def reserve(self, owner: str, uuids: Iterable[str]) -> None:
        """Keep ``uuids`` for ``owner``: no other owner's acquire gets them."""
        with self._lock:
            for uuid in uuids:
                if uuid in self._devices:
                    self._reserved[uuid] = owner

    def unreserve(self, owner: str) -> tuple[str, ...]:
        """End ``owner``'s reservations; returns the GPUs that were kept for it."""
        with self._lock:
            mine = tuple(u for u, o in self._reserved.items() if o == owner)
            for uuid in mine:
                del self._reserved[uuid]
            return mine

    def reserved(self) -> dict[str, str]:
        with self._lock:
            return dict(self._reserved)

    # --- deciding ---------------------------------------------------------

    def set_free_memory(self, free: Mapping[str, int]) -> None:
        """Free memory per GPU, sampled elsewhere (NVML); breaks ties between GPUs."""
        with self._lock:
            self._free_memory = dict(free)

    def acquire(self, owner: str, request: GpuRequest,
                exclude: Collection[str] = ()) -> tuple[str, ...]:
        """Pick and hold ``request.count`` GPUs for ``owner``, or raise NoGpuFree.

        GPUs reserved for ``owner`` are taken first, and its reservations end;
        GPUs in ``exclude`` (wanted by someone ahead in the queue) are not taken.
        An owner holds one set at a time: what it held before is released first.
        """
        if request.count < 1:
            raise ValueError("a GPU request needs a count of at least 1")
        with self._lock:
            self._release(owner)
            candidates = self._candidates(request, owner, exclude)
            if len(candidates) < request.count:
                raise NoGpuFree(request, self._usage(), len(candidates))
            return self._take(owner, request, candidates)

    def try_acquire(self, owner: str, request: GpuRequest,
                    exclude: Collection[str] = ()) -> tuple[tuple[str, ...] | None, list[str]]:
        """For the queue: (the GPUs now held, or None), and every GPU the request could
        use now ``exclude`` aside, best first; a refusal costs one scan."""
        with self._lock:
            self._release(owner)
            candidates = self._candidates(request, owner)
            allowed = [u for u in candidates if u not in exclude]
            if len(allowed) < request.count:
                return None, candidates
            return self._take(owner, request, allowed), candidates

    def _take(self, owner: str, request: GpuRequest, candidates: list[str]) -> tuple[str, ...]:
        uuids = tuple(candidates[: request.count])
        self._hold(Holding(owner, uuids, request))
        for uuid in [u for u, o in self._reserved.items() if o == owner]:
            del self._reserved[uuid]
        return uuids

    def adopt(self, owner: str, uuids: Iterable[str], request: GpuRequest) -> list[str]:
        """Record a holding that already exists (a running container's label).

        Reality wins: the holding is recorded even when it conflicts. Returns
        the conflicts found, as sentences, so the caller can log them.
        """
        with self._lock:
            self._release(owner)
            known = tuple(u for u in uuids if u in self._devices)
            conflicts = []
            for uuid in known:
                others = self._holders[uuid]
                if not fits(request, others):
                    conflicts.append(f"{uuid} is held by {owner} and by {', '.join(others)}")
            if known:
                self._hold(Holding(owner, known, request))
            return conflicts

    def release(self, owner: str) -> tuple[str, ...]:
        """Free whatever ``owner`` holds; returns those UUIDs (empty if nothing)."""
        with self._lock:
            return self._release(owner)

    # --- inside the lock ----------------------------------------------------

    def _hold(self, holding: Holding) -> None:
        self._holdings[holding.owner] = holding
        for uuid in holding.uuids:
            self._holders[uuid][holding.owner] = holding.request
            self._slots[uuid] = self._slots[uuid].plus(holding.request)
        self.version += 1

    def _release(self, owner: str) -> tuple[str, ...]:
        holding = self._holdings.pop(owner, None)
        if holding is None:
            return ()
        for uuid in holding.uuids:
            self._holders[uuid].pop(owner, None)
            self._slots[uuid] = Slot.of(self._holders[uuid].values())
        self.released += 1
        self.version += 1
        return holding.uuids

    def _usage(self) -> Usage:
        exclusive = shared = free = 0
        for holders in self._holders.values():
            if not holders:
                free += 1
            elif any(not r.shared for r in holders.values()):
                exclusive += 1
            else:
                shared += 1
        return Usage(len(self._holders), exclusive, shared, free)

    def _candidates(self, request: GpuRequest, owner: str = "",
                    exclude: Collection[str] = ()) -> list[str]:
        """GPUs the request may take, best first.

        Exclusive: only GPUs nobody holds. Shared: GPUs with no exclusive
        holder and room under every holder's gpu_share. Never a GPU reserved for
        another owner, nor one in ``exclude``. GPUs reserved for ``owner`` come
        first; then shared requests fill GPUs already being shared before
        opening an empty one, so whole GPUs stay free for exclusive roles. Then
        fewest holders, then most free memory (when NVML tells), then inventory
        order.
        """
        found = [uuid for uuid, slot in self._slots.items()
                 if slot.fits(request) and uuid not in exclude
                 and self._reserved.get(uuid, owner) == owner]

        def rank(uuid: str) -> tuple[int, int, int, int, int]:
            n = len(self._holders[uuid])
            mine = 0 if owner and self._reserved.get(uuid) == owner else 1
            opens_empty = 1 if request.shared and n == 0 else 0
            return (mine, opens_empty, n, -self._free_memory.get(uuid, 0), self._order[uuid])

        found.sort(key=rank)
        return found


@dataclass(frozen=True)
class Slot:
    """What joining a GPU depends on: its holders' count, whether one is exclusive,
    and the smallest gpu_share among them (allocator.fits, incrementally)."""

    count: int = 0
    exclusive: bool = False
    share: int = 1 << 30

    @classmethod
    def of(cls, requests: Iterable[GpuRequest]) -> Slot:
        count, exclusive, share = 0, False, cls.share
        for r in requests:  # one pass, no Slot per holder: preemption calls this a lot
            count += 1
            exclusive = exclusive or r.mode != "shared"
            share = r.share if r.share < share else share
        return cls(count, exclusive, share)

    def plus(self, r: GpuRequest) -> Slot:
        return Slot(self.count + 1, self.exclusive or r.mode != "shared",
                    r.share if r.share < self.share else self.share)

    def fits(self, request: GpuRequest) -> bool:
        if self.count == 0:
            return True
        return (request.shared and not self.exclusive
                and self.count + 1 <= min(request.share, self.share))


def fits(request: GpuRequest, holders: Mapping[str, GpuRequest]) -> bool:
    """Whether one more holder with ``request`` may join a GPU held by ``holders``."""
    return Slot.of(holders.values()).fits(request)
