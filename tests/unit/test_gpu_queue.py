"""The GPU wait queue (spawner/gpu/queue.py) and the pool around it (spawner/gpu/pool.py),
without Docker: order, backfill, preemption plans and their reservations, call-offs, a
seeded storm with invariants checked after every step, and the pool's join, release,
estimates and evictions."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest

from spawner.gpu.allocator import GpuAllocator, GpuRequest, NoGpuFree, fits
from spawner.gpu.inventory import GpuDevice, declared_inventory
from spawner.gpu.pool import GpuPool, Server
from spawner.gpu.preemption import Running
from spawner.gpu.queue import BEST_EFFORT_FIFO, STRICT_FIFO, Dispatched, GpuQueue, Ticket
from spawner.quota.model import Role

EX = GpuRequest(1)


def shared(share: int, count: int = 1) -> GpuRequest:
    return GpuRequest(count, "shared", share)


@dataclass(frozen=True)
class Call:
    """One acquire the queue made, with the state it was made in."""

    owner: str
    request: GpuRequest
    exclude: frozenset[str]
    holders: dict[str, dict[str, GpuRequest]]
    reserved: dict[str, str]
    got: tuple[str, ...] | None  # None: NoGpuFree


class RecordingAllocator(GpuAllocator):
    """A GpuAllocator that records each acquire, so a test can check what the queue
    decided against the state it decided in, not the state after."""

    def __init__(self, devices: list[GpuDevice]):
        super().__init__(devices)
        self.calls: list[Call] = []

    def try_acquire(self, owner: str, request: GpuRequest, exclude: Collection[str] = ()
                    ) -> tuple[tuple[str, ...] | None, list[str]]:
        holders, reserved = self.snapshot()
        got, could = super().try_acquire(owner, request, exclude)
        self.calls.append(Call(owner, request, frozenset(exclude), holders, reserved, got))
        return got, could


def gpus(n: int) -> list[GpuDevice]:
    return [GpuDevice(str(i), "ABCDEFGH"[i]) for i in range(n)]


def make_queue(n: int = 2, strategy: str = BEST_EFFORT_FIFO,
               users: dict[str, str] | None = None) -> tuple[GpuQueue, RecordingAllocator]:
    """A queue on ``n`` GPUs; ``users``: holder -> user, for fairness."""
    alloc = RecordingAllocator(gpus(n))
    return GpuQueue(alloc, strategy=strategy, user_of=(users or {}).get), alloc


def join(q: GpuQueue, owner: str, priority: int = 0, request: GpuRequest = EX,
         may_preempt: bool = False, user: str | None = None) -> Ticket:
    return q.join(owner, user or f"user-{owner}", "role", priority, may_preempt, request, 0.0)


def old(owner: str, priority: int, age: float = 1000.0, protected: bool = False) -> Running:
    return Running(owner, priority, age, 0.0, protected)


def granted(done: Dispatched) -> list[str]:
    return [t.owner for t in done.granted]


# --- order -----------------------------------------------------------------------------


async def test_waiting_is_ordered_by_priority_then_arrival():
    q, alloc = make_queue(1)
    alloc.acquire("x", EX)
    for owner, priority in (("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1)):
        join(q, owner, priority)
    assert q.dispatch({}).granted == []
    assert [t.owner for t in q.waiting()] == ["b", "d", "a", "c", "e"]
    assert q.position("a") == (3, 5)
    assert q.position("nobody") == (0, 5)


async def test_a_freed_gpu_goes_to_the_head_not_to_a_later_newcomer():
    q, alloc = make_queue(1)
    alloc.acquire("x", EX)
    a = join(q, "a")
    q.dispatch({})
    alloc.release("x")
    join(q, "late")  # arrives after the GPU came free, with the same priority
    done = q.dispatch({})
    assert granted(done) == ["a"] and a.grant.result() == ("A",)
    assert q.position("late") == (1, 1)


async def test_a_higher_priority_newcomer_goes_ahead():
    q, alloc = make_queue(1)
    alloc.acquire("x", EX)
    join(q, "a", 0)
    q.dispatch({})
    join(q, "urgent", 3)
    alloc.release("x")
    assert granted(q.dispatch({})) == ["urgent"]
    assert q.position("a") == (1, 1)


async def test_a_request_served_at_once_when_nobody_waits_ahead():
    q, _ = make_queue(2)
    t = join(q, "a", request=GpuRequest(2))
    assert granted(q.dispatch({})) == ["a"] and t.grant.result() == ("A", "B")
    assert q.ticket("a") is None and q.waiting() == []


# --- backfill --------------------------------------------------------------------------


async def test_backfill_takes_a_shared_slot_the_blocked_exclusive_head_cannot_use():
    q, alloc = make_queue(3)
    alloc.acquire("x", EX)  # A
    alloc.acquire("s0", shared(4))  # B: shared, with room
    big = join(q, "big", request=GpuRequest(2))  # C is free, but one is not two
    small = join(q, "small", request=shared(4))
    done = q.dispatch({})
    assert granted(done) == ["small"] and small.grant.result() == ("B",)
    assert not big.grant.done()
    assert alloc.holders("C") == []  # the free GPU the head wants is left alone


async def test_strict_fifo_never_takes_a_free_gpu_the_head_wants():
    q, alloc = make_queue(3, STRICT_FIFO)
    alloc.acquire("x", EX)  # A
    alloc.acquire("s0", shared(1))  # B: shared, full
    join(q, "big", request=GpuRequest(2))
    small = join(q, "small", request=shared(4))
    assert q.dispatch({}).granted == []
    assert not small.grant.done() and alloc.holders("C") == []
    # once the head is served, the one behind it goes on
    alloc.release("x")
    done = q.dispatch({})
    assert granted(done) == ["big"] and not small.grant.done()
    alloc.release("s0")
    assert granted(q.dispatch({})) == ["small"] and small.grant.result() == ("B",)


async def test_best_effort_fifo_serves_a_start_that_fits_before_an_older_one_that_does_not():
    q, alloc = make_queue(3)  # BestEffortFIFO, the default
    alloc.acquire("x", EX)  # A
    alloc.acquire("s0", shared(1))  # B: shared, full
    big = join(q, "big", request=GpuRequest(2))  # only C is free: one is not two
    small = join(q, "small", request=shared(4))
    assert granted(q.dispatch({})) == ["small"] and small.grant.result() == ("C",)
    assert q.position("big") == (1, 1)
    # the older one keeps its place: served first as soon as it fits
    join(q, "later", request=EX)
    alloc.release("x")
    alloc.release("small")
    assert granted(q.dispatch({})) == ["big"] and big.grant.result() == ("A", "C")
    assert q.position("later") == (1, 1)


async def test_best_effort_fifo_keeps_the_gpus_a_preemption_reserves_for_an_older_start():
    q, alloc = make_queue(2)
    alloc.acquire("v", EX)  # A: a victim
    big = join(q, "big", 5, request=GpuRequest(2), may_preempt=True)
    done = q.dispatch({"v": old("v", 0)})
    assert [t.owner for t in done.planned] == ["big"] and set(big.plan.uuids) == {"A", "B"}
    small = join(q, "small", request=EX)
    assert q.dispatch({"v": old("v", 0)}).granted == []  # B is kept for big
    assert not small.grant.done() and alloc.holders("B") == []


async def test_a_later_request_may_take_what_nobody_ahead_can_use():
    q, alloc = make_queue(2)
    alloc.acquire("x", EX)  # A
    alloc.acquire("s0", shared(2))  # B: one slot left, but only for a share of 2 or more
    head = join(q, "head", priority=5, request=shared(1))
    later = join(q, "later", request=shared(2))
    done = q.dispatch({})
    assert granted(done) == ["later"] and later.grant.result() == ("B",)
    assert not head.grant.done()


# --- fairness between users ---------------------------------------------------------------


async def test_a_users_first_server_goes_before_another_users_second():
    q, alloc = make_queue(2, users={"alice-1": "alice"})
    alloc.acquire("alice-1", EX)  # A: alice's first server runs
    alloc.acquire("x", EX)  # B
    second = join(q, "alice-2", user="alice")  # her second, asked for first
    first = join(q, "bob-1", user="bob")  # bob's first, later
    q.dispatch({})
    assert [t.owner for t in q.waiting()] == ["bob-1", "alice-2"]
    assert (second.servers, first.servers) == (1, 0)
    assert q.position("bob-1") == (1, 2) and q.position("alice-2") == (2, 2)
    alloc.release("x")
    assert granted(q.dispatch({})) == ["bob-1"] and not second.grant.done()


async def test_a_users_waiting_starts_count_towards_their_place():
    q, alloc = make_queue(1, users={"alice-1": "alice"})
    alloc.acquire("x", EX)
    join(q, "alice-1", user="alice")
    join(q, "alice-2", user="alice")
    join(q, "alice-3", user="alice")
    join(q, "bob-1", user="bob")
    join(q, "bob-2", user="bob")
    assert [t.owner for t in q.waiting()] == ["alice-1", "bob-1", "alice-2", "bob-2",
                                              "alice-3"]
    # her first served: the others keep their places (she now holds one, asked one less)
    alloc.release("x")
    assert granted(q.dispatch({})) == ["alice-1"]
    assert [t.owner for t in q.waiting()] == ["bob-1", "alice-2", "bob-2", "alice-3"]


async def test_priority_goes_before_fairness():
    q, alloc = make_queue(1, users={"alice-1": "alice"})
    alloc.acquire("alice-1", EX)
    join(q, "bob-1", 0, user="bob")
    join(q, "alice-2", 5, user="alice")
    assert [t.owner for t in q.waiting()] == ["alice-2", "bob-1"]


# --- leaving ---------------------------------------------------------------------------


async def test_leave_cancels_the_grant_drops_reservations_and_calls_off_victims():
    q, alloc = make_queue(1)
    alloc.acquire("v", EX)
    t = join(q, "t", 5, may_preempt=True)
    done = q.dispatch({"v": old("v", 0)})
    assert done.planned == [t] and t.plan.victims == ("v",) and t.plan.uuids == ("A",)
    assert alloc.reserved() == {"A": "t"} and q.evicting == {"v": "t"}
    left, victims = q.leave("t")
    assert left is t and victims == ("v",)
    assert t.grant.cancelled()
    assert alloc.reserved() == {} and q.evicting == {}
    assert q.leave("t") == (None, ())  # twice is harmless


async def test_leave_without_a_plan_calls_off_nothing():
    q, alloc = make_queue(1)
    alloc.acquire("x", EX)
    t = join(q, "t")
    q.dispatch({})
    assert q.leave("t") == (t, ())
    assert t.grant.cancelled() and q.waiting() == []


async def test_joining_twice_replaces_the_first_ticket():
    q, alloc = make_queue(1)
    alloc.acquire("x", EX)
    first = join(q, "t")
    second = join(q, "t", 2)
    assert first.grant.cancelled() and q.ticket("t") is second


# --- preemption plans ------------------------------------------------------------------


async def test_no_plan_for_a_role_that_may_not_preempt():
    q, alloc = make_queue(1)
    alloc.acquire("v", EX)
    join(q, "t", 5, may_preempt=False)
    done = q.dispatch({"v": old("v", 0)})
    assert done.planned == [] and q.evicting == {} and alloc.reserved() == {}


async def test_reserved_gpus_are_kept_for_the_planned_ticket_while_victims_run():
    q, alloc = make_queue(2)
    alloc.acquire("v", EX)  # A: the victim; B stays free but one is not two
    t = join(q, "t", 5, request=GpuRequest(2), may_preempt=True)
    done = q.dispatch({"v": old("v", 0)})
    assert done.planned == [t] and t.plan.uuids == ("A", "B")
    assert alloc.reserved() == {"A": "t", "B": "t"}
    # nobody else gets the free B meanwhile: not a higher-priority newcomer, not a
    # spawn outside the queue
    urgent = join(q, "urgent", 9)
    assert q.dispatch({"v": old("v", 0)}).granted == []
    assert not urgent.grant.done()
    with pytest.raises(NoGpuFree):
        alloc.acquire("outside", EX)
    # the victim goes: the ticket gets both GPUs, and its reservations end
    alloc.release("v")
    q.victim_gone("v")
    done = q.dispatch({})
    assert granted(done) == ["t"] and set(t.grant.result()) == {"A", "B"}
    assert done.called_off == [] and alloc.reserved() == {}


async def test_a_planned_ticket_served_by_another_freed_gpu_calls_off_its_victims():
    q, alloc = make_queue(2)
    alloc.acquire("v", EX)  # A
    alloc.acquire("x", EX)  # B: not a victim (same priority)
    t = join(q, "t", 5, may_preempt=True)
    running = {"v": old("v", 0), "x": old("x", 5)}
    assert q.dispatch(running).planned == [t] and t.plan.victims == ("v",)
    alloc.release("x")  # stops on its own during v's grace
    done = q.dispatch({"v": old("v", 0)})
    assert granted(done) == ["t"] and t.grant.result() == ("B",)
    assert done.called_off == [(t, ("v",))]
    assert q.evicting == {} and alloc.reserved() == {}


async def test_a_plan_part_done_is_finished_by_a_freed_gpu_and_the_rest_called_off():
    q, alloc = make_queue(4)
    for owner in ("v", "w", "x", "y"):
        alloc.acquire(owner, EX)  # A, B, C, D
    t = join(q, "t", 5, request=GpuRequest(2), may_preempt=True)
    running = {"v": old("v", 0), "w": old("w", 0), "x": old("x", 5), "y": old("y", 5)}
    q.dispatch(running)
    assert t.plan.victims == ("v", "w")
    alloc.release("v")
    q.victim_gone("v")
    assert q.dispatch(running).granted == []  # A is t's, but w still runs on B
    assert alloc.holders("A") == [] and alloc.reserved()["A"] == "t"
    alloc.release("y")
    done = q.dispatch(running)
    assert granted(done) == ["t"] and set(t.grant.result()) == {"A", "D"}
    assert done.called_off == [(t, ("w",))]


async def test_victims_are_strictly_lower_and_never_planned_twice():
    q, alloc = make_queue(2)
    alloc.acquire("v", EX)
    alloc.acquire("same", EX)
    a = join(q, "a", 5, may_preempt=True)
    b = join(q, "b", 5, may_preempt=True)
    done = q.dispatch({"v": old("v", 0), "same": old("same", 5)})
    assert done.planned == [a] and a.plan.victims == ("v",)
    assert b.plan is None  # v is taken, and equal priority is never a victim
    assert q.evicting == {"v": "a"}


async def test_a_plan_whose_victims_went_elsewhere_is_made_afresh():
    q, alloc = make_queue(2)
    alloc.acquire("v", EX)
    alloc.acquire("u", EX)
    t = join(q, "t", 5, may_preempt=True)
    q.dispatch({"v": old("v", 0), "u": old("u", 1)})
    assert t.plan.victims == ("v",)
    # v is gone but someone adopted (reality wins) its GPU first
    alloc.release("v")
    q.victim_gone("v")
    alloc.adopt("squatter", ("A",), EX)
    done = q.dispatch({"u": old("u", 1), "squatter": old("squatter", 9)})
    assert done.planned == [t] and t.plan.victims == ("u",) and alloc.reserved() == {"B": "t"}


async def test_a_gpu_freed_during_a_multi_gpu_plan_is_not_taken_by_a_later_ticket():
    q, alloc = make_queue(4)
    for owner in ("v", "w", "x", "y"):
        alloc.acquire(owner, EX)  # A, B, C, D
    running = {"v": old("v", 0), "w": old("w", 0), "x": old("x", 5), "y": old("y", 5)}
    t = join(q, "t", 5, request=GpuRequest(2), may_preempt=True)
    later = join(q, "later", 5)
    q.dispatch(running)
    assert t.plan.victims == ("v", "w") and set(t.plan.uuids) == {"A", "B"}
    alloc.release("y")  # D comes free while v and w are in their grace
    done = q.dispatch(running)
    # t, ahead, could use D (with one of its two planned GPUs): later must not take it,
    # and the victim t no longer needs is called off (the cheaper one is kept)
    assert "later" not in granted(done), f"later got {later.grant.result()}"
    assert [(ticket.owner, len(off)) for ticket, off in done.called_off] == [("t", 1)]
    assert len(t.plan.victims) == 1 and "D" in t.plan.uuids
    assert set(alloc.reserved()) == {"D", *t.plan.uuids} and set(alloc.reserved().values()) == {"t"}


async def test_a_slot_left_when_a_reservation_ends_goes_to_the_ticket_ahead_at_once():
    q, alloc = make_queue(2)
    alloc.acquire("v", shared(3))  # A: v's share of 3 keeps A full with three holders
    alloc.acquire("s1", shared(4))
    alloc.acquire("s2", shared(4))
    alloc.acquire("x", EX)  # B
    running = {"v": old("v", 0), "s1": old("s1", 5), "s2": old("s2", 5), "x": old("x", 5)}
    planned = join(q, "planned", 1, request=shared(4), may_preempt=True)
    assert q.dispatch(running).planned == [planned] and planned.plan.victims == ("v",)
    join(q, "ahead", 3, request=shared(4))  # higher priority, arrives later
    q.dispatch(running)
    alloc.release("v")
    q.victim_gone("v")  # A now has room for two: one for planned, one more
    done = q.dispatch(running)  # passes repeat: ahead gets the slot in the same dispatch
    assert sorted(granted(done)) == ["ahead", "planned"]


# --- a storm ---------------------------------------------------------------------------


REQUESTS = (EX, EX, GpuRequest(2), GpuRequest(3), shared(2), shared(4), shared(4), shared(3),
            shared(2, 2))


@dataclass
class Storm:
    """A queue on 4 GPUs and the servers holding them, driven at random."""

    rng: random.Random
    strategy: str = BEST_EFFORT_FIFO
    alloc: RecordingAllocator = field(default_factory=lambda: RecordingAllocator(gpus(4)))
    servers: dict[str, tuple[int, int, float, bool]] = field(default_factory=dict)
    clock: int = 0
    seq: int = 0
    # (GPU, reserver) -> the holders it had when reserved: it may only lose some
    at_reserve: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.q = GpuQueue(self.alloc, strategy=self.strategy)

    def count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    def running(self) -> dict[str, Running]:
        """Every holder (priority, started, min_runtime, protected), aged by the clock."""
        return {o: Running(o, p, float(self.clock - started), min_runtime, protected)
                for o, (p, started, min_runtime, protected) in self.servers.items()
                if self.alloc.holding(o) is not None}

    def hold(self, owner: str, priority: int) -> None:
        self.servers[owner] = (priority, self.clock, self.rng.choice((0.0, 3.0, 10.0)),
                               self.rng.random() < 0.15)

    def step(self) -> None:
        rng, q = self.rng, self.q
        self.clock += 1
        roll = rng.random()
        waiting = q.waiting()
        if roll < 0.35:
            self.seq += 1
            priority = rng.choice((0, 1, 2, 3))
            join(q, f"t{self.seq}", priority, rng.choice(REQUESTS),
                 may_preempt=priority > 0 and rng.random() < 0.8)
            self.count("joined")
        elif roll < 0.42 and waiting:
            ticket = rng.choice(waiting)
            mine = {v for v, o in q.evicting.items() if o == ticket.owner}
            left, victims = q.leave(ticket.owner)
            assert left is ticket and set(victims) == mine and ticket.grant.cancelled()
            assert ticket.owner not in self.alloc.reserved().values()
            self.count("left")
            self.count("called off at leave", len(victims))
        elif roll < 0.75 and self.alloc.holdings():
            # an eviction finishing, most often; else a server stopping on its own
            if q.evicting and rng.random() < 0.7:
                owner = rng.choice(sorted(q.evicting))
                self.count("victims gone")
            else:
                owner = rng.choice(sorted(self.alloc.holdings()))
            self.alloc.release(owner)
            q.victim_gone(owner)
            self.servers.pop(owner, None)
        self.dispatch()

    def dispatch(self) -> None:
        running = self.running()
        self.alloc.calls.clear()
        done = self.q.dispatch(running)
        for ticket in done.granted:
            self.hold(ticket.owner, ticket.priority)
            assert ticket.grant.result() == self.alloc.holding(ticket.owner).uuids
        for ticket in done.planned:
            for victim in ticket.plan.victims:
                server = running[victim]
                assert server.priority < ticket.priority, (ticket, server)
                assert server.eligible(ticket.priority)
                assert self.q.evicting[victim] == ticket.owner
            for uuid in ticket.plan.uuids:
                self.at_reserve[(uuid, ticket.owner)] = set(self.alloc.holders(uuid))
        for ticket, _ in done.called_off:  # a plan trimmed in its grace keeps fewer GPUs
            if ticket.plan is not None and not ticket.grant.done():
                for uuid in ticket.plan.uuids:
                    self.at_reserve.setdefault((uuid, ticket.owner),
                                               set(self.alloc.holders(uuid)))
        self.count("granted", len(done.granted))
        self.count("planned", len(done.planned))
        self.count("called off at grant", sum(len(v) for _, v in done.called_off))
        self.check_order(done)
        self.check()

    def check_order(self, done: Dispatched) -> None:
        """None took a GPU planned for a ticket ahead; and, StrictFIFO, no ticket took or
        planned on a GPU that a ticket ahead of it, still waiting and without a plan,
        could use when its own acquire failed (in the state the queue saw then)."""
        waiting = {t.owner: t for t in self.q.waiting()}
        new_plans = {t.owner: set(t.plan.uuids) for t in done.planned}
        ahead: list[Call] = []  # failed acquires of tickets still waiting
        seen: set[str] = set()
        for call in self.alloc.calls:
            if call.owner in seen:  # the dispatch's next pass, in the state it left
                ahead, seen = [], set()
            seen.add(call.owner)
            taken = set(call.got or ()) | new_plans.get(call.owner, set())
            for before in ahead:
                plan = waiting[before.owner].plan
                if plan is not None:
                    assert not set(plan.uuids) & set(call.got or ()), (call, before)
                    continue
                if self.strategy != STRICT_FIFO:
                    continue  # BestEffortFIFO: what fits is served
                usable = {u for u, on in before.holders.items()
                          if before.reserved.get(u, before.owner) == before.owner
                          and fits(before.request, on)}
                assert not usable & taken, (call, before, usable)
            if call.got is None and call.owner in waiting:
                ahead.append(call)

    def check(self) -> None:
        alloc, q = self.alloc, self.q
        holders, reserved = alloc.snapshot()
        # never double-booked, never over a share
        for uuid, on in holders.items():
            requests = list(on.values())
            if any(not r.shared for r in requests):
                assert len(requests) == 1, (uuid, on)
            elif requests:
                assert len(requests) <= min(r.share for r in requests), (uuid, on)
        for holding in alloc.holdings().values():
            assert len(set(holding.uuids)) == holding.request.count
        # a planned ticket's GPUs are kept: reserved for it and nobody else, and nobody
        # joins them after the plan was made (its holders then may only leave)
        waiting = {t.owner: t for t in q.waiting()}
        kept = {(u, t.owner) for t in waiting.values() if t.plan for u in t.plan.uuids}
        assert {(u, o) for u, o in reserved.items()} == kept
        for uuid, owner in kept:
            assert set(holders[uuid]) <= self.at_reserve[(uuid, owner)], (uuid, owner)
        self.at_reserve = {k: v for k, v in self.at_reserve.items() if k in kept}
        # a plan lives only while one of its victims is under way
        for ticket in waiting.values():
            if ticket.plan is not None:
                assert any(q.evicting.get(v) == ticket.owner for v in ticket.plan.victims)
        # every victim under way is a holder, for a waiting ticket that planned it
        for victim, owner in q.evicting.items():
            assert alloc.holding(victim) is not None
            assert victim in waiting[owner].plan.victims
            assert self.servers[victim][0] < waiting[owner].priority
        # the dispatch was complete: no waiting ticket could be served from GPUs that
        # the tickets ahead of it do not keep (StrictFIFO: do not want), so no plan was
        # made that was not needed.
        # Except a GPU still reserved for a ticket behind when this one's turn came: its
        # reservation ended later in the same dispatch (see the fixpoint test above)
        tried = {c.owner: c for c in alloc.calls}
        blocked: set[str] = set()
        for ticket in q.waiting():
            then = tried[ticket.owner].reserved
            free = [u for u in alloc.candidates(ticket.request, ticket.owner, exclude=blocked)
                    if then.get(u, ticket.owner) == ticket.owner]
            assert len(free) < ticket.request.count, (ticket, free, blocked)
            if self.strategy == STRICT_FIFO:
                blocked |= set(alloc.candidates(ticket.request, ticket.owner))
            if ticket.plan is not None:
                blocked |= set(ticket.plan.uuids)


@pytest.mark.parametrize("strategy", [BEST_EFFORT_FIFO, STRICT_FIFO])
@pytest.mark.parametrize("seed", range(6))
async def test_storm_of_mixed_tickets_keeps_every_invariant(seed: int, strategy: str):
    storm = Storm(random.Random(seed), strategy)
    for owner, request in (("x0", EX), ("x1", GpuRequest(2)), ("s0", shared(4))):
        storm.alloc.acquire(owner, request)
        storm.hold(owner, storm.rng.choice((0, 1)))
    storm.check()
    for _ in range(600):
        storm.step()
    # the storm did what it is for: plans made, served, and called off
    stats = storm.stats
    assert stats["granted"] > 50 and stats["planned"] > 5 and stats["victims gone"] > 5, stats
    assert stats.get("called off at leave", 0) + stats.get("called off at grant", 0) > 0, stats


# --- the pool ---------------------------------------------------------------------------


HUB = "hub-1"
G = 2**30


def role(name: str, priority: int = 0, **kw: Any) -> Role:
    return Role(name, 1, G, ("pytorch",), gpus=1, priority=priority, **kw)


class FakeEvictions:
    """Records what the pool asks of the Evictor."""

    def __init__(self) -> None:
        self.started: list[tuple[str, tuple[str, ...]]] = []
        self.called_off: list[tuple[str, tuple[str, ...], str]] = []

    def start(self, ticket: Ticket) -> None:
        assert ticket.plan is not None
        self.started.append((ticket.owner, ticket.plan.victims))

    def call_off(self, ticket: Ticket, victims: tuple[str, ...], why: str) -> None:
        self.called_off.append((ticket.owner, victims, why))


@pytest.fixture
async def pools() -> AsyncIterator[list[GpuPool]]:
    made: list[GpuPool] = []
    yield made
    for pool in made:  # the queue's once-a-second loop, started by a join that waits
        if pool._queue_task is not None:
            pool._queue_task.cancel()
            await asyncio.gather(pool._queue_task, return_exceptions=True)


def make_pool(made: list[GpuPool], n: int = 2, *roles: Role) -> GpuPool:
    inv = declared_inventory([{"uuid": f"GPU-{i}"} for i in range(n)])
    pool = GpuPool(inv, HUB, log=logging.getLogger("test.gpu_queue"))
    pool.roles = {r.name: r for r in roles}
    made.append(pool)
    return pool


def server(user: str, role_name: str, age: float = 0.0) -> Server:
    return Server(user, role_name, time.time() - age)


async def test_pool_join_is_served_at_once_when_a_gpu_is_free(pools):
    lab = role("lab")
    pool = make_pool(pools, 2, lab)
    ticket = pool.join("c-alice", server("alice", "lab"), lab)
    assert ticket.grant.done() and ticket.grant.result() == ("GPU-0",)
    assert pool._queue_task is None  # nothing waits: no loop
    pool.leave("c-alice", "served")
    assert pool.allocator.holding("c-alice").uuids == ("GPU-0",)  # leaving keeps the GPUs
    assert "c-alice" in pool.servers


async def test_pool_join_waits_and_is_granted_when_a_gpu_is_released(pools):
    lab = role("lab")
    pool = make_pool(pools, 1, lab)
    pool.join("c-alice", server("alice", "lab"), lab)
    ticket = pool.join("c-bob", server("bob", "lab"), lab)
    assert not ticket.grant.done() and pool.queue.position("c-bob") == (1, 1)
    assert pool._queue_task is not None
    assert pool.release("c-alice", "stopped") == ("GPU-0",)
    assert ticket.grant.result() == ("GPU-0",)
    assert "c-alice" not in pool.servers


async def test_pool_leave_of_a_waiting_start_forgets_it(pools):
    lab = role("lab")
    pool = make_pool(pools, 1, lab)
    pool.join("c-alice", server("alice", "lab"), lab)
    ticket = pool.join("c-bob", server("bob", "lab"), lab)
    pool.leave("c-bob", "cancelled")
    assert ticket.grant.cancelled() and "c-bob" not in pool.servers
    assert pool.queue.waiting() == []


async def test_pool_running_skips_holders_it_knows_no_role_for(pools):
    lab = role("lab", 2, min_runtime=60, preemptible=False, reclaim_after=100)
    pool = make_pool(pools, 4, lab)
    for owner, srv in (("known", server("a", "lab", age=90)),
                       ("old", server("b", "lab", age=500)),
                       ("gone-role", server("c", "removed-from-table"))):
        pool.acquire(owner, EX)
        pool.servers[owner] = srv
    pool.acquire("adopted", EX)  # no Server at all (another hub's, say)
    found = pool.running()
    assert set(found) == {"known", "old"}
    known = found["known"]
    assert (known.priority, known.min_runtime, known.protected) == (2, 60, True)
    assert 89 <= known.age <= 92
    assert found["old"].protected is False  # past reclaim_after


async def test_pool_hands_plans_and_call_offs_to_the_evictions(pools):
    low, high = role("low", 0, min_runtime=0), role("high", 10)
    pool = make_pool(pools, 2, low, high)
    pool.evictions = evictions = FakeEvictions()
    for owner, age in (("c-low", 100), ("c-other", 500)):
        pool.join(owner, server(owner, "low", age=age), low)
        pool.leave(owner, "served")
    ticket = pool.join("c-high", server("boss", "high"), high)
    assert evictions.started == [("c-high", ("c-low",))]  # the younger: less work lost
    assert not ticket.grant.done()
    # the victim is still in its grace when the start stops waiting
    pool.leave("c-high", "the start was stopped")
    assert evictions.called_off == [("c-high", ("c-low",), "the start was stopped")]
    assert pool.allocator.reserved() == {}


async def test_pool_calls_off_victims_when_a_planned_start_gets_another_gpu(pools):
    low, high = role("low", 0, min_runtime=0), role("high", 10)
    pool = make_pool(pools, 2, low, high)
    pool.evictions = evictions = FakeEvictions()
    pool.join("c-v", server("v", "low", age=100), low)
    pool.join("c-x", server("x", "high", age=100), high)  # not a victim: same priority
    ticket = pool.join("c-high", server("boss", "high"), high)
    assert evictions.started == [("c-high", ("c-v",))]
    pool.release("c-x", "stopped by its user")
    assert ticket.grant.result() == ("GPU-1",)
    assert evictions.called_off == [
        ("c-high", ("c-v",), "boss got GPUs without needing this server's")]


# --- next_release ------------------------------------------------------------------------


async def estimate(pools: list[GpuPool], holder: Role, age: float, wants: Role,
                   ) -> tuple[float, str] | None:
    """When a GPU may come free for a start of ``wants``, with one server of ``holder``,
    ``age`` seconds old, holding the only GPU: (seconds from now, why), or None."""
    pool = make_pool(pools, 1, holder, wants)
    pool.acquire("c-h", EX)
    pool.servers["c-h"] = server("hana", holder.name, age)
    ticket = pool.queue.join("c-w", "wen", wants.name, wants.priority, wants.may_preempt,
                             EX, time.monotonic())
    due = pool.next_release(ticket)
    return None if due is None else (round(due[0] - time.time()), due[1])


async def test_next_release_is_the_max_age_for_anyone(pools):
    holder = role("lab", 5, max_age=3600)
    assert await estimate(pools, holder, 600, role("w", 0)) == (
        3000, "hana's server reaches its max_age")
    assert await estimate(pools, holder, 4000, role("w", 0)) is None  # already past


async def test_next_release_is_the_min_runtime_for_a_start_that_may_preempt(pools):
    holder = role("lab", 0, min_runtime=600)
    assert await estimate(pools, holder, 100, role("boss", 10)) == (
        500, "hana's server passes its min_runtime and may be preempted")
    # not for a start that may not preempt, nor one of equal priority
    assert await estimate(pools, holder, 100, role("w", 10, preempts="never")) is None
    assert await estimate(pools, holder, 100, role("peer", 0, preempts="lower")) is None
    # the soonest of max_age and min_runtime
    both = role("lab", 0, min_runtime=600, max_age=300)
    assert await estimate(pools, both, 100, role("boss", 10)) == (
        200, "hana's server reaches its max_age")


async def test_next_release_is_the_reclaim_after_of_a_protected_role(pools):
    holder = role("lab", 0, preemptible=False, reclaim_after=7200, min_runtime=600)
    assert await estimate(pools, holder, 200, role("boss", 10)) == (
        7000, "hana's server passes its reclaim_after and may be preempted")


async def test_next_release_never_names_a_protected_role_without_reclaim_after(pools):
    holder = role("lab", 0, preemptible=False, min_runtime=600)
    assert await estimate(pools, holder, 100, role("boss", 10)) is None


async def test_next_release_of_a_protected_role_waits_for_min_runtime_too(pools):
    holder = role("lab", 0, preemptible=False, reclaim_after=300, min_runtime=900)
    due = await estimate(pools, holder, 100, role("boss", 10))
    assert due is not None and due[0] == 800


async def test_next_release_ignores_holders_it_knows_no_role_for(pools):
    pool = make_pool(pools, 2, role("lab", max_age=60))
    pool.acquire("c-a", EX)
    pool.servers["c-a"] = server("a", "removed", 0)
    pool.acquire("c-b", EX)  # no server
    ticket = pool.queue.join("c-w", "w", "lab", 0, False, EX, time.monotonic())
    assert pool.next_release(ticket) is None
