"""The GPU wait queue: requests that cannot be met now wait in order.

Order is by priority, then fairness between users (a user's first server before
anyone's second: the servers the user holds, plus their starts that joined
earlier), then arrival. Whatever comes free goes to the first request in that
order that it can serve. What a request further back may take depends on the
strategy, with Kueue's names (docs/preemption.md#the-queues-strategies):

- ``BestEffortFIFO`` (the default): a request that fits now is served, whatever
  waits ahead of it that does not fit; only what a preemption under way keeps
  for a request ahead (its reserved GPUs, the room its victims free on the host)
  is out of reach. The older request keeps its place and is served first as soon
  as it fits. A large request can starve behind a stream of small ones that fit;
  preemption is the remedy, as in Kueue.
- ``StrictFIFO``: nobody behind takes room on the host while a request ahead
  waits for room, and nobody behind takes a GPU that a request ahead could use
  (a small shared request may still take a slot on a shared GPU that a large
  exclusive one cannot use anyway).

A request whose role may preempt, and that cannot be met from free GPUs,
gets a preemption plan (gpu/preemption.py): the GPUs it will get are
reserved for it at once, so nobody else takes them during the victims'
grace period. With host admission, the first request waiting for room on
the host (CPUs and memory) may likewise preempt servers that hold room; the
room they free is kept for it (nobody behind takes room it would need once its
victims have stopped). If it is served some other way first, or leaves, the
victims still in their grace are called off.

Pure bookkeeping on the hub's event loop: no Docker, no sleeping. The pool
calls ``dispatch`` whenever something changes; the start waiting for GPUs
(spawner/docker/gpus.py) awaits its ticket's ``grant`` future, and shows
``next_release``, the queue's estimate of when a GPU may come free.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from spawner.gpu.allocator import GpuAllocator, GpuRequest
from spawner.gpu.preemption import Plan, Running, choose_host_victims, choose_victims
from spawner.host.admission import NOTHING, HostBook, Reservation, Shortfall
from spawner.quota.model import Role

# The longest a ticket that found no victims goes without looking again, in case
# a server started since (and so unknown to its last look) is already preemptible.
RETRY = 5.0

# The strategies, with Kueue's names (c.QuotaSpawner.queue_strategy)
BEST_EFFORT_FIFO = "BestEffortFIFO"
STRICT_FIFO = "StrictFIFO"
STRATEGIES = (BEST_EFFORT_FIFO, STRICT_FIFO)
# The order, in the words the spawn page and the host map use
ORDER = "by priority, then a user's first server before anyone's second, then arrival"


@dataclass(frozen=True)
class Behind:
    """The older start a start that fits is held behind: one that waits for room
    (StrictFIFO), or one whose preemption keeps the room that is free (``short`` None)."""

    owner: str
    user: str
    role: str
    short: Shortfall | None

    def sentence(self) -> str:
        whose = f"{self.user}'s (role '{self.role}')"
        if self.short is not None:
            return (f"this start would fit, but the queue is {STRICT_FIFO} and an older start "
                    f"waits ahead of it for room: {whose}, for which "
                    f"{self.short.sentence()}")
        return (f"the room that is free is kept for an older start, {whose}, while servers "
                "are preempted for it")


@dataclass(eq=False)
class Ticket:
    """One start's request, from its arrival until it is served or leaves."""

    owner: str  # the container name the GPUs are for
    user: str
    role: str
    priority: int
    may_preempt: bool
    request: GpuRequest | None  # None: a CPU-only role, which waits for host room only
    seq: int
    arrived: float  # the queue's clock
    grant: asyncio.Future[tuple[str, ...]] = field(repr=False)
    plan: Plan | None = None  # the preemption under way for it
    plan_released: int = -1  # the allocator's release count when the plan was made
    # after a plan found no victims: try again after a release, or at this time (the
    # queue's clock): when a holder passes min_runtime or reclaim_after, or RETRY later
    retry: tuple[int, float] | None = None
    host: Reservation | None = None  # the CPUs and memory it reserves, when admission is on
    short: Shortfall | None = None  # what is full on the host for it, while it does not fit
    behind: Behind | None = None  # the older start it is held behind, while it fits
    # the servers its user has before this one: held (running or granted), and their
    # starts that joined earlier and still wait (set by GpuQueue.waiting)
    servers: int = 0

    @property
    def order(self) -> tuple[int, int, int]:
        return (-self.priority, self.servers, self.seq)

    @property
    def waits_for_room(self) -> bool:
        return self.short is not None or self.behind is not None

    def room_sentence(self) -> str | None:
        """Why it waits for room on the host, with its own figures: 'the host's memory
        is fully reserved: 2.25 GiB of 2 GiB', or whom it is held behind; None when it
        does not wait for room."""
        if self.short is not None:
            return self.short.sentence()
        return self.behind.sentence() if self.behind is not None else None


@dataclass
class Dispatched:
    """What a dispatch decided, for the caller to carry out."""

    granted: list[Ticket] = field(default_factory=list)
    planned: list[Ticket] = field(default_factory=list)  # new preemption plans
    called_off: list[tuple[Ticket, tuple[str, ...]]] = field(default_factory=list)


class GpuQueue:
    def __init__(self, allocator: GpuAllocator, host: HostBook | None = None,
                 strategy: str = BEST_EFFORT_FIFO,
                 user_of: Callable[[str], str | None] | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"the queue's strategy is one of {', '.join(STRATEGIES)} "
                             f"(got {strategy!r})")
        self.allocator = allocator
        self.host = host  # the host's CPUs and memory; None: not counted
        self.strategy = strategy
        # whose server a holder (an owner) is, for fairness; None: unknown
        self.user_of = user_of or (lambda owner: None)
        self._tickets: dict[str, Ticket] = {}  # in order of arrival
        self._users: tuple[tuple[int, int], dict[str, set[str]]] | None = None  # _held's
        self._seq = itertools.count()
        self.evicting: dict[str, str] = {}  # victim owner -> the owner it is preempted for

    @property
    def policy(self) -> str:
        """'BestEffortFIFO, fair between users'."""
        return f"{self.strategy}, fair between users"

    # --- reading ---------------------------------------------------------------

    def any_waiting(self) -> bool:
        return any(not t.grant.done() for t in self._tickets.values())

    def waiting(self) -> list[Ticket]:
        """The waiting tickets in the order they are served: by priority, then how many
        servers the user has before each (held, or asked for earlier), then arrival."""
        tickets = [t for t in self._tickets.values() if not t.grant.done()]
        if not tickets:
            return tickets
        held = self._held()
        earlier: Counter[str] = Counter()  # the tickets are in order of arrival
        for t in tickets:
            mine = held.get(t.user)
            t.servers = (len(mine) - (t.owner in mine) if mine else 0) + earlier[t.user]
            earlier[t.user] += 1
        return sorted(tickets, key=lambda t: t.order)

    def _held(self) -> dict[str, set[str]]:
        """user -> the owners that hold GPUs or room on the host for them; counted again
        only when the holdings change (a holder's user is known before it holds)."""
        key = (self.allocator.version, self.host.version if self.host is not None else 0)
        if self._users is not None and self._users[0] == key:
            return self._users[1]
        owners = set(self.allocator.holdings())
        if self.host is not None:
            owners.update(self.host.owners())
        found: dict[str, set[str]] = {}
        for owner in owners:
            user = self.user_of(owner)
            if user is not None:
                found.setdefault(user, set()).add(owner)
        self._users = (key, found)
        return found

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
             request: GpuRequest | None, now: float,
             host: Reservation | None = None) -> Ticket:
        if owner in self._tickets:
            self.leave(owner)
        ticket = Ticket(owner, user, role, priority, may_preempt, request, next(self._seq),
                        now, asyncio.get_running_loop().create_future(), host=host)
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

    def dispatch(self, running: Mapping[str, Running] | Callable[[], Mapping[str, Running]],
                 now: float = 0.0) -> Dispatched:
        """Serve what can be served, in order, and plan preemptions for the rest.

        ``running``: what is known of each GPU holder, for choosing victims, or a
        function that builds it (called only if a victim is looked for);
        ``now``: the queue's clock. Passes repeat while one changes something
        (a grant or a call-off can free what a ticket ahead wants).
        """
        done = Dispatched()
        view = _Lazy(running)
        for _ in range(4):
            if not self._pass(view, now, done):
                break
        return done

    def _pass(self, running: _Lazy, now: float, done: Dispatched) -> bool:
        changed = False
        strict = self.strategy == STRICT_FIFO
        # GPUs a start ahead keeps: those its preemption frees (reserved for it), and,
        # StrictFIFO, every GPU it could use
        blocked: set[str] = set()
        first: Ticket | None = None  # the first start that does not fit on the host: the
        # one that may preempt for room, and (StrictFIFO) the one everyone behind waits for
        keeper: Ticket | None = None  # the first start ahead whose preemption frees room
        kept = NOTHING  # the room such starts ahead will take once their victims stop
        freeing = NOTHING  # what those victims hold now
        for ticket in self.waiting():
            if ticket.plan is not None and not self._victims_of(ticket):
                self.allocator.unreserve(ticket.owner)  # its victims are gone: plan afresh
                ticket.plan = None
            if self.host is not None and ticket.host is not None:
                own = self.host.shortfall(ticket.host, ticket.owner)
                if own is None and ticket.plan is not None and not ticket.plan.uuids:
                    spared = self._call_off(ticket)  # room came free another way
                    ticket.plan = None
                    if spared:
                        done.called_off.append((ticket, spared))
                        changed = True
                ticket.short, ticket.behind = own, None
                if own is None and strict and first is not None:
                    ticket.behind = Behind(first.owner, first.user, first.role, first.short)
                elif own is None and keeper is not None and self.host.shortfall(
                        ticket.host + kept, ticket.owner, freeing) is not None:
                    # it fits now, but not beside what the preemption ahead frees room for
                    ticket.behind = Behind(keeper.owner, keeper.user, keeper.role, None)
                if ticket.waits_for_room:
                    if first is None and own is not None:  # only the first may preempt
                        first = ticket
                        changed |= self._make_room(ticket, running, now, done)
                    if ticket.plan is not None and not ticket.plan.uuids:
                        keeper = keeper or ticket
                        kept += ticket.host
                        for victim in self._victims_of(ticket):
                            freeing += self.host.holding(victim) or NOTHING
                    continue
            if ticket.request is None:
                uuids, could = (), []
            else:
                uuids, could = self.allocator.try_acquire(ticket.owner, ticket.request, blocked)
            if uuids is not None:
                if self.host is not None and ticket.host is not None:
                    self.host.hold(ticket.owner, ticket.host)
                ticket.grant.set_result(uuids)
                self._tickets.pop(ticket.owner, None)
                done.granted.append(ticket)
                called_off = self._call_off(ticket)  # served without needing them all
                if called_off:
                    done.called_off.append((ticket, called_off))
                changed = True
                continue
            if ticket.plan is not None:
                if ticket.plan.uuids and ticket.plan_released != self._released():
                    changed |= self._trim(ticket, running, blocked, done)
            elif ticket.may_preempt and ticket.request is not None and self._due(ticket, now):
                self._plan(ticket, running, blocked, now)
                if ticket.plan is not None:
                    done.planned.append(ticket)
            if strict:
                blocked.update(could)
            if ticket.plan is not None:
                blocked.update(ticket.plan.uuids)
        return changed

    def _victims_of(self, ticket: Ticket) -> list[str]:
        if ticket.plan is None:
            return []
        return [v for v in ticket.plan.victims if self.evicting.get(v) == ticket.owner]

    def _released(self) -> int:
        """Grows whenever GPUs or host room come free."""
        return self.allocator.released + (self.host.released if self.host else 0)

    def _due(self, ticket: Ticket, now: float) -> bool:
        return (ticket.retry is None or ticket.retry[0] != self._released()
                or now >= ticket.retry[1])

    def _wait_for_victims(self, ticket: Ticket, candidates: Mapping[str, Running],
                          now: float) -> None:
        """No victims now: look again after a release, when a candidate becomes
        preemptible, or RETRY seconds on."""
        soonest = min((r.eligible_in for r in candidates.values()
                       if r.priority < ticket.priority and r.eligible_in > 0), default=RETRY)
        ticket.retry = (self._released(), now + min(soonest, RETRY))

    def _make_room(self, ticket: Ticket, running: _Lazy, now: float,
                   done: Dispatched) -> bool:
        """For the first start waiting for host room: plan a preemption that frees it, or
        call off the victims it no longer needs once room came free another way.
        Whether any was called off."""
        assert self.host is not None and ticket.host is not None
        if ticket.plan is None:
            if not ticket.may_preempt or not self._due(ticket, now):
                return False
            candidates = {o: r for o, r in running.get().items() if o not in self.evicting}
            plan = choose_host_victims(ticket.host, ticket.owner, ticket.priority, self.host,
                                       candidates)
            if plan is None or not plan.victims:
                self._wait_for_victims(ticket, candidates, now)
                return False
            ticket.plan, ticket.plan_released, ticket.retry = plan, self._released(), None
            for victim in plan.victims:
                self.evicting[victim] = ticket.owner
            done.planned.append(ticket)
            return False
        if ticket.plan.uuids or ticket.plan_released == self._released():
            return False  # a GPU plan, or nothing came free since the plan
        ticket.plan_released = self._released()
        victims = self._victims_of(ticket)
        known = running.get()
        still = choose_host_victims(ticket.host, ticket.owner, ticket.priority, self.host,
                                    {v: known[v] for v in victims if v in known})
        spared = tuple(v for v in victims if still is not None and v not in still.victims)
        if not spared:
            return False
        for victim in spared:
            del self.evicting[victim]
        ticket.plan = still
        done.called_off.append((ticket, spared))
        return True

    def _unavailable(self, ticket: Ticket, blocked: set[str]) -> set[str]:
        reserved = self.allocator.reserved()
        return blocked | {u for u, o in reserved.items() if o != ticket.owner}

    def _plan(self, ticket: Ticket, running: _Lazy, blocked: set[str], now: float) -> None:
        holders, _ = self.allocator.snapshot()
        candidates = {o: r for o, r in running.get().items() if o not in self.evicting}
        plan = choose_victims(ticket.request, ticket.priority, holders, candidates,
                              self._unavailable(ticket, blocked))
        if plan is None:
            self._wait_for_victims(ticket, candidates, now)
            return
        ticket.plan, ticket.plan_released, ticket.retry = plan, self._released(), None
        self.allocator.reserve(ticket.owner, plan.uuids)
        for victim in plan.victims:
            self.evicting[victim] = ticket.owner

    def _trim(self, ticket: Ticket, running: _Lazy, blocked: set[str],
              done: Dispatched) -> bool:
        """After the holdings changed in a grace: call off the victims the ticket no
        longer needs (a GPU came free another way). Whether any was called off."""
        assert ticket.plan is not None
        ticket.plan_released = self._released()
        victims = self._victims_of(ticket)
        holders, _ = self.allocator.snapshot()
        still = choose_victims(ticket.request, ticket.priority, holders,
                               {v: running.get()[v] for v in victims if v in running.get()},
                               self._unavailable(ticket, blocked))
        if still is None:
            return False  # cannot be judged now (a victim's role is unknown): keep them all
        spared = tuple(v for v in victims if v not in still.victims)
        if not spared:
            return False
        for victim in spared:
            del self.evicting[victim]
        self.allocator.unreserve(ticket.owner)
        ticket.plan = still
        self.allocator.reserve(ticket.owner, still.uuids)
        done.called_off.append((ticket, spared))
        return True


def next_release(ticket: Ticket, holders: Iterable[tuple[str, str, Role, float]],
                 now: float) -> tuple[float, str] | None:
    """When a GPU may next come free for ``ticket`` without anyone stopping: the
    soonest max_age due, or (for a role that may preempt this holder) the soonest
    min_runtime or reclaim_after passed. ``holders``: (owner, user, role, started) of
    each holder. (epoch seconds, why); None if none is due."""
    due: list[tuple[float, str]] = []
    for _, user, role, started in holders:
        whose = f"{user}'s server"
        if role.max_age:
            due.append((started + role.max_age, f"{whose} reaches its max_age"))
        if ticket.may_preempt and role.priority < ticket.priority:
            if not role.preemptible:
                if role.reclaim_after:  # else never preemptible
                    due.append((started + max(role.reclaim_after, role.min_runtime),
                                f"{whose} passes its reclaim_after and may be preempted"))
            elif role.min_runtime:
                due.append((started + role.min_runtime,
                            f"{whose} passes its min_runtime and may be preempted"))
    future = [d for d in due if d[0] > now]
    return min(future) if future else None


class _Lazy:
    """The running view for one dispatch, built at most once, and only if needed."""

    def __init__(self, source: Mapping[str, Running] | Callable[[], Mapping[str, Running]]):
        self._source = source
        self._view: Mapping[str, Running] | None = None

    def get(self) -> Mapping[str, Running]:
        if self._view is None:
            self._view = self._source() if callable(self._source) else self._source
        return self._view
