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

docs/preemption.md#how-victims-are-chosen says the same for admins.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .allocator import GpuRequest, fits


@dataclass(frozen=True)
class Running:
    """A server holding GPUs, as preemption sees it."""

    owner: str  # the container name
    priority: int
    age: float  # seconds since it started
    min_runtime: float = 0.0
    protected: bool = False  # preemptible: false, and younger than reclaim_after

    def eligible(self, priority: int) -> bool:
        """Whether a request of ``priority`` may preempt this server now."""
        return self.priority < priority and not self.protected and self.age >= self.min_runtime


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


def _victims_on(request: GpuRequest, holders: Mapping[str, GpuRequest],
                removable: list[Running]) -> list[Running] | None:
    """The fewest, cheapest holders of one GPU to remove so the request fits, or None."""
    if fits(request, holders):
        return []
    out = {s.owner for s in removable}
    kept = {o: r for o, r in holders.items() if o not in out}
    if not fits(request, kept):
        return None
    victims = []
    for server in sorted(removable, key=_importance):
        kept[server.owner] = holders[server.owner]
        if not fits(request, kept):
            del kept[server.owner]
            victims.append(server)
    return victims


def choose_victims(
    request: GpuRequest,
    priority: int,
    holders: Mapping[str, Mapping[str, GpuRequest]],
    running: Mapping[str, Running],
    unavailable: Collection[str] = (),
) -> Plan | None:
    """The cheapest minimal set of servers to preempt so ``request`` fits; None if
    no such set exists. ``holders``: each GPU's holders; ``running``: what is known
    of each holder (a holder not in it is never a victim); ``unavailable``: GPUs
    that may not be used (reserved for someone else, wanted ahead in the queue)."""
    eligible = {o: s for o, s in running.items() if s.eligible(priority)}
    per_gpu: list[tuple[tuple[float, float, int, float], str, list[Running]]] = []
    for uuid, on_gpu in holders.items():
        if uuid in unavailable:
            continue
        removable = [eligible[o] for o in on_gpu if o in eligible]
        found = _victims_on(request, on_gpu, removable)
        if found is not None:
            per_gpu.append((cost(found), uuid, found))
    if len(per_gpu) < request.count:
        return None
    # the lowest possible highest victim priority, then the cheapest GPUs under it
    ceiling = sorted(c[0] for c, _, _ in per_gpu)[request.count - 1]
    within = sorted((c[1:], uuid, found) for c, uuid, found in per_gpu if c[0] <= ceiling)
    chosen = within[: request.count]
    victims = {v.owner: v for _, _, found in chosen for v in found}
    victims = _spare(request, holders, victims, unavailable)
    uuids = _fitting(request, holders, set(victims), unavailable)[: request.count]
    if not victims or len(uuids) < request.count:
        return None  # it fits without preemption, or the plan is wrong: never preempt then
    return Plan(tuple(sorted(victims)), tuple(uuids), cost(victims.values()))


def _fitting(request: GpuRequest, holders: Mapping[str, Mapping[str, GpuRequest]],
             gone: set[str], unavailable: Collection[str]) -> list[str]:
    """GPUs the request fits on once ``gone`` are removed; freed ones before ones
    that were free anyway, so the victims' GPUs are the ones used."""
    found = []
    for uuid, on_gpu in holders.items():
        if uuid in unavailable:
            continue
        left = {o: r for o, r in on_gpu.items() if o not in gone}
        if fits(request, left):
            found.append((0 if len(left) < len(on_gpu) else 1, uuid))
    return [uuid for _, uuid in sorted(found, key=lambda f: f[0])]


def _spare(request: GpuRequest, holders: Mapping[str, Mapping[str, GpuRequest]],
           victims: dict[str, Running], unavailable: Collection[str]) -> dict[str, Running]:
    """Spare every victim the request does not need, the most important first."""
    for server in sorted(victims.values(), key=_importance):
        rest = set(victims) - {server.owner}
        if len(_fitting(request, holders, rest, unavailable)) >= request.count:
            del victims[server.owner]
    return victims
