"""The GPU wait queue: requests that cannot be met now wait in order.

Order is by priority, then arrival. A GPU that is freed goes to the first
request in that order that it can serve; a request further back may take a
GPU only if no request ahead of it could use that GPU (so nobody jumps the
queue, and a small shared request is not held up by a large exclusive one
for GPUs the large one cannot use anyway).

A request whose role may preempt, and that cannot be met from free GPUs,
gets a preemption plan (gpu/preemption.py): the GPUs it will get are
reserved for it at once, so nobody else takes them during the victims'
grace period. If it is served some other way first, or leaves, the victims
still in their grace are called off.

Pure bookkeeping on the hub's event loop: no Docker, no sleeping. The pool
calls ``dispatch`` whenever something changes; the spawner awaits its
ticket's ``grant`` future.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from .allocator import GpuAllocator, GpuRequest, NoGpuFree
from .preemption import Plan, Running, choose_victims


@dataclass(eq=False)
class Ticket:
    """One GPU request, from its arrival until it is served or leaves."""

    owner: str  # the container name the GPUs are for
    user: str
    role: str
    priority: int
    may_preempt: bool
    request: GpuRequest
    seq: int
    arrived: float  # the queue's clock
    grant: asyncio.Future[tuple[str, ...]] = field(repr=False)
    plan: Plan | None = None  # the preemption under way for it

    @property
    def order(self) -> tuple[int, int]:
        return (-self.priority, self.seq)


@dataclass
class Dispatched:
    """What a dispatch decided, for the caller to carry out."""

    granted: list[Ticket] = field(default_factory=list)
    planned: list[Ticket] = field(default_factory=list)  # new preemption plans
    called_off: list[tuple[Ticket, tuple[str, ...]]] = field(default_factory=list)


class GpuQueue:
    def __init__(self, allocator: GpuAllocator):
        self.allocator = allocator
        self._tickets: dict[str, Ticket] = {}
        self._seq = itertools.count()
        self.evicting: dict[str, str] = {}  # victim owner -> the owner it is preempted for

    # --- reading ---------------------------------------------------------------

    def waiting(self) -> list[Ticket]:
        return sorted((t for t in self._tickets.values() if not t.grant.done()),
                      key=lambda t: t.order)

    def ticket(self, owner: str) -> Ticket | None:
        return self._tickets.get(owner)

    def position(self, owner: str) -> tuple[int, int]:
        """(1-based place, how many wait); (0, n) when ``owner`` is not waiting."""
        waiting = self.waiting()
        for i, t in enumerate(waiting):
            if t.owner == owner:
                return i + 1, len(waiting)
        return 0, len(waiting)

    # --- changing --------------------------------------------------------------

    def join(self, owner: str, user: str, role: str, priority: int, may_preempt: bool,
             request: GpuRequest, now: float) -> Ticket:
        if owner in self._tickets:
            self.leave(owner)
        ticket = Ticket(owner, user, role, priority, may_preempt, request, next(self._seq),
                        now, asyncio.get_running_loop().create_future())
        self._tickets[owner] = ticket
        return ticket

    def leave(self, owner: str) -> tuple[Ticket | None, tuple[str, ...]]:
        """Take ``owner``'s ticket out; returns it and the victims to call off."""
        ticket = self._tickets.pop(owner, None)
        if ticket is None:
            return None, ()
        self.allocator.unreserve(owner)
        if not ticket.grant.done():
            ticket.grant.cancel()
        return ticket, self._call_off(ticket)

    def victim_gone(self, victim: str) -> None:
        self.evicting.pop(victim, None)

    def _call_off(self, ticket: Ticket) -> tuple[str, ...]:
        if ticket.plan is None:
            return ()
        victims = tuple(v for v in ticket.plan.victims if self.evicting.get(v) == ticket.owner)
        for victim in victims:
            del self.evicting[victim]
        return victims

    def dispatch(self, running: Mapping[str, Running]) -> Dispatched:
        """Serve what can be served, in order, and plan preemptions for the rest.

        ``running``: what is known of each GPU holder, for choosing victims.
        """
        done = Dispatched()
        blocked: set[str] = set()  # GPUs someone ahead is waiting for
        for ticket in self.waiting():
            if ticket.plan is not None and not any(
                    self.evicting.get(v) == ticket.owner for v in ticket.plan.victims):
                self.allocator.unreserve(ticket.owner)  # its victims are gone: plan afresh
                ticket.plan = None
            try:
                uuids = self.allocator.acquire(ticket.owner, ticket.request, exclude=blocked)
            except NoGpuFree:
                pass
            else:
                ticket.grant.set_result(uuids)
                self._tickets.pop(ticket.owner, None)
                done.granted.append(ticket)
                called_off = self._call_off(ticket)  # served without needing them all
                if called_off:
                    done.called_off.append((ticket, called_off))
                continue
            if ticket.plan is None and ticket.may_preempt:
                self._plan(ticket, running, blocked)
                if ticket.plan is not None:
                    done.planned.append(ticket)
            if ticket.plan is not None:
                blocked.update(ticket.plan.uuids)
            else:
                blocked.update(self.allocator.candidates(ticket.request, ticket.owner))
        return done

    def _plan(self, ticket: Ticket, running: Mapping[str, Running], blocked: set[str]) -> None:
        holders, reserved = self.allocator.snapshot()
        unavailable = blocked | {u for u, o in reserved.items() if o != ticket.owner}
        candidates = {o: r for o, r in running.items() if o not in self.evicting}
        plan = choose_victims(ticket.request, ticket.priority, holders, candidates, unavailable)
        if plan is None:
            return
        ticket.plan = plan
        self.allocator.reserve(ticket.owner, plan.uuids)
        for victim in plan.victims:
            self.evicting[victim] = ticket.owner
