"""Which servers to preempt for a GPU request: pure, no Docker, no clock.

The choice follows the Kubernetes scheduler's (pkg/scheduler/framework/
preemption), with each GPU in the place of a node:

- only servers of strictly lower priority are candidates, and only those
  past their role's ``min_runtime`` and not protected (``preemptible: false``
  until ``reclaim_after``);
- on each GPU, all candidates are removed, then as many as possible are
  spared again, the most important first (higher priority, then older), so
  no victim is taken that is not needed;
- among GPUs, those whose victims cost least are taken: the lowest highest
  victim priority first, then the smallest sum of priorities, then the
  fewest victims, then the least work lost (the smallest sum of the victims'
  ages, i.e. the youngest);
- a last pass over the victims of a multi-GPU request spares any that the
  request turns out not to need.

A start waiting for room on the host (its CPUs and memory) is the scheduler's
single node: every candidate holding room is removed, then as many as possible
are spared again, the most important first (``choose_host_victims``).

docs/preemption.md#how-victims-are-chosen says the same for admins.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from spawner.gpu.allocator import GpuRequest, Slot
from spawner.host.admission import NOTHING, HostBook, Reservation
from spawner.quota.model import Role


@dataclass(frozen=True)
class Running:
    """A server holding GPUs, as preemption sees it."""

    owner: str  # the container name
    priority: int
    age: float  # seconds since it started
    min_runtime: float = 0.0
    protected: bool = False  # preemptible: false, and younger than reclaim_after
    protected_for: float = float("inf")  # seconds until reclaim_after, when protected

    @classmethod
    def of(cls, owner: str, role: Role, started: float, now: float) -> Running:
        """A server of ``role`` started at ``started`` (epoch), as it stands at ``now``."""
        age = max(0.0, now - started)
        return cls(owner, role.priority, age, role.min_runtime, role.protected_at(age),
                   role.reclaim_after - age if role.reclaim_after else float("inf"))

    def eligible(self, priority: int) -> bool:
        """Whether a request of ``priority`` may preempt this server now."""
        return self.priority < priority and not self.protected and self.age >= self.min_runtime

    @property
    def eligible_in(self) -> float:
        """Seconds until a higher priority may preempt it (0: now; inf: never)."""
        return max(self.protected_for if self.protected else 0.0, self.min_runtime - self.age,
                   0.0)


@dataclass(frozen=True)
class Plan:
    """Victims to stop, and the GPUs the request gets once they are gone."""

    victims: tuple[str, ...]
    uuids: tuple[str, ...]  # count of them: freed by the victims, or free already
    key: tuple[float, ...]  # the cost, compared as the scheduler does (see cost())


NO_VICTIM = float("-inf")
# Added to each priority in the sum, as the Kubernetes scheduler does, so every
# term is positive and a negative-priority victim never makes a set look cheaper.
PRIORITY_OFFSET = 2**31


def cost(victims: Iterable[Running]) -> tuple[float, float, int, float]:
    """(highest priority, sum of offset priorities, count, sum of ages): smaller is
    cheaper."""
    chosen = list(victims)
    if not chosen:
        return (NO_VICTIM, 0.0, 0, 0.0)
    return (max(v.priority for v in chosen),
            float(sum(v.priority + PRIORITY_OFFSET for v in chosen)),
            len(chosen), sum(v.age for v in chosen))


def _importance(server: Running) -> tuple[int, float]:
    return (-server.priority, -server.age)  # sorted first: the most important to keep


def _victims_on(request: GpuRequest, on_gpu: Mapping[str, GpuRequest],
                eligible: Mapping[str, Running]) -> list[Running] | None:
    """The fewest, cheapest holders of one GPU to remove so the request fits, or None."""
    removable = [eligible[o] for o in on_gpu if o in eligible]
    kept = Slot.of(r for o, r in on_gpu.items() if o not in eligible)
    if not kept.fits(request):
        return None
    if not removable:
        return []
    if request.mode != "shared":
        return removable  # an exclusive request needs the GPU empty: every holder goes
    # Spare the most important first while the request still fits; plain ints, as
    # Slot.plus would be, since this runs for every holder of every GPU.
    count, exclusive, share = kept.count, kept.exclusive, kept.share
    victims: list[Running] = []
    ordered = sorted(removable, key=_importance)
    for i, server in enumerate(ordered):
        r = on_gpu[server.owner]
        if r.mode != "shared" or exclusive:
            victims.append(server)
            continue
        least = r.share if r.share < share else share
        if count + 2 <= min(request.share, least):
            count, share = count + 1, least
        else:
            victims.append(server)
            if count + 1 >= min(request.share, share):  # full: nobody else fits back
                victims.extend(ordered[i + 1:])
                break
    return victims


def choose_victims(
    request: GpuRequest,
    priority: int,
    holders: Mapping[str, Mapping[str, GpuRequest]],
    running: Mapping[str, Running],
    unavailable: Collection[str] = (),
) -> Plan | None:
    """The cheapest minimal set of servers to preempt so ``request`` fits; None if
    no such set exists, or if it fits without one. ``holders``: each GPU's holders;
    ``running``: what is known of each holder (a holder not in it is never a victim);
    ``unavailable``: GPUs that may not be used (reserved for someone else, wanted
    ahead in the queue)."""
    # Running.eligible, inlined: this runs over every server at each decision
    eligible = {o: s for o, s in running.items()
                if s.priority < priority and not s.protected and s.age >= s.min_runtime}
    per_gpu: list[tuple[tuple[float, float, int, float], str, list[Running]]] = []
    for uuid, on_gpu in holders.items():
        if uuid in unavailable:
            continue
        found = _victims_on(request, on_gpu, eligible)
        if found is not None:
            per_gpu.append((cost(found), uuid, found))
    if len(per_gpu) < request.count or sum(1 for c in per_gpu if not c[2]) >= request.count:
        return None  # impossible, or no preemption is needed
    # the lowest possible highest victim priority, then the cheapest GPUs under it
    ceiling = sorted(c[0] for c, _, _ in per_gpu)[request.count - 1]
    within = sorted((c[1:], uuid, found) for c, uuid, found in per_gpu if c[0] <= ceiling)
    victims = {v.owner: v for _, _, found in within[: request.count] for v in found}
    fit_now = [uuid for c, uuid, found in per_gpu if not found]
    uuids = _spare(request, holders, victims, fit_now, unavailable)
    return Plan(tuple(sorted(victims)), uuids, cost(victims.values()))


def _spare(request: GpuRequest, holders: Mapping[str, Mapping[str, GpuRequest]],
           victims: dict[str, Running], fit_now: list[str],
           unavailable: Collection[str]) -> tuple[str, ...]:
    """Spare every victim the request does not need, the most important first; the
    GPUs it gets, freed ones before ones that were free anyway (``fit_now``: the
    usable GPUs it fits on without preemption)."""
    touched: dict[str, Slot] = {}  # the victims' GPUs -> what stays on them
    on: dict[str, list[str]] = {}  # victim -> its GPUs
    for uuid, on_gpu in holders.items():
        if uuid in unavailable:
            continue
        mine = [o for o in on_gpu if o in victims]
        if mine:
            touched[uuid] = Slot.of(r for o, r in on_gpu.items() if o not in victims)
            for o in mine:
                on.setdefault(o, []).append(uuid)
    untouched_fit = [u for u in fit_now if u not in touched]
    fitting = len(untouched_fit) + sum(1 for slot in touched.values() if slot.fits(request))
    for server in sorted(victims.values(), key=_importance):
        back = {u: touched[u].plus(holders[u][server.owner]) for u in on.get(server.owner, ())}
        lost = sum(1 for u, slot in back.items() if touched[u].fits(request)
                   and not slot.fits(request))
        if fitting - lost >= request.count:
            touched.update(back)
            fitting -= lost
            del victims[server.owner]
    freed = [u for u, slot in touched.items() if slot.fits(request)]
    return tuple((freed + untouched_fit)[: request.count])


def choose_host_victims(want: Reservation, owner: str, priority: int, book: HostBook,
                        running: Mapping[str, Running]) -> Plan | None:
    """The servers to preempt so ``owner``'s ``want`` fits on the host: the fewest and
    least important, as the Kubernetes scheduler picks on a node (all candidates out,
    then each spared again while the request still fits, the most important first).
    A plan without victims when it fits already; None when even every candidate's
    room would not do. ``running``: what is known of each server holding room (one
    not in it is never a victim)."""
    if book.shortfall(want, owner) is None:
        return Plan((), (), cost(()))
    candidates: list[tuple[Running, Reservation]] = []
    for o, server in running.items():
        room = book.holding(o)
        if room is not None and o != owner and server.eligible(priority):
            candidates.append((server, room))
    freed = NOTHING
    for _, room in candidates:
        freed = freed + room
    if book.shortfall(want, owner, freed) is not None:
        return None
    victims = []
    for server, room in sorted(candidates, key=lambda c: _importance(c[0])):
        if book.shortfall(want, owner, freed - room) is None:
            freed = freed - room  # spared: the request fits with it running
        else:
            victims.append(server)
    return Plan(tuple(sorted(v.owner for v in victims)), (), cost(victims))
